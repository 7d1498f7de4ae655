"""Cost models rank candidates before measurement. The interface is two methods: `fit` on
(candidate, normalized throughput) pairs and `predict` scores (higher is faster).

- `RandomModel`: random scores (the trivial model, for tests).
- `GBModel`: scikit-learn gradient boosting on features of the schedule, trained on
  throughput normalized per task (MetaSchedule's formulation: best latency / latency,
  so every task's best is 1).

Features (one row per candidate; all from the schedule's loop tree and the kernel):

| feature | meaning |
|---|---|
| `log_vec` | log2 of the vectorized loop's extent (0 without one) |
| `log_par` | log2 of the parallel loop's extent |
| `log_unroll` | log2 of the unrolled loops' total extent |
| `log_tile` | log2 of the spatial iterations below the main statement's first reduction loop |
| `log_rinner` | log2 of the reduction iterations below that loop (the cache tile) |
| `depth` | number of loops around the main statement |
| `packed` | number of packed constant tensors |
| `log_work`, `log_elems` (per depth d ≤ 8) | one tile at depth d (instances sharing |
| | loops 0..d): its instances, the elements it touches (isl bounding boxes) |
| `log_written`, `log_intensity` (per depth) | elements it writes; instances per element touched |
| `epilogue_depth` | loops shared by the epilogue with the main statement |

Features come from the schedule alone (not from the sampler's decisions), so any record's
trace can be replayed and featurized: the model pre-trains from existing records.
"""

from __future__ import annotations

import math
import os
import pickle
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from polytile.errors import TuningError
from polytile.poly import transform as T
from polytile.poly.footprint import footprints
from polytile.poly.kernel import mentions
from polytile.poly.schedule import Schedule

Rows = Sequence[Sequence[float]]
#: the saved model's format (features and their order); bump when they change
MODEL_FORMAT = 1


class CostModel(Protocol):
    """Scores candidates from their feature rows (higher is faster)."""

    def fit_rows(self, rows: Rows, scores: Sequence[float]) -> None: ...

    def predict_rows(self, rows: Rows) -> np.ndarray: ...


class RandomModel:
    """The trivial model: seeded random scores."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def fit_rows(self, rows: Rows, scores: Sequence[float]) -> None:
        del rows, scores

    def predict_rows(self, rows: Rows) -> np.ndarray:
        return self.rng.random(len(rows))


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


def schedule_features(schedule: Schedule, main: str) -> list[float]:
    vec = par = unroll = 1.0
    for loop, _ in schedule.loops():
        if loop.annotation:
            extent = T.loop_extent(schedule, loop.name)
            if loop.annotation == "vector":
                vec = max(vec, extent)
            elif loop.annotation == "parallel":
                par = max(par, extent)
            else:
                unroll *= extent
    loops = schedule.loops_of(main)
    stmt = schedule.kernel.statement[main]
    tile = rinner = 1.0
    seen_reduce = False
    for loop in loops:
        extent = T.loop_extent(schedule, loop.name)
        value = loop.exprs[main].split("->", 1)[1]
        is_reduce = any(mentions(value, d) for d in stmt.reduction_dims)
        if seen_reduce:
            tile *= extent if not is_reduce else 1
            rinner *= extent if is_reduce else 1
        seen_reduce = seen_reduce or is_reduce
    packed = sum(1 for t in schedule.kernel.tensors if t.endswith("_packed"))
    return [_log2(vec), _log2(par), _log2(unroll), _log2(tile), _log2(rinner), len(loops), packed]


#: tile levels (loop depths) described by footprint features
LEVELS = 8


def footprint_features(schedule: Schedule, main: str) -> list[float]:
    """Per loop depth: log2 of the tile's work, footprint, written footprint and
    arithmetic intensity (see `poly.footprint`), padded to LEVELS depths."""
    row: list[float] = []
    for tile in footprints(schedule, main)[:LEVELS]:
        work, elements = max(tile.work, 1), max(tile.elements, 1)
        row += [_log2(work), _log2(elements), _log2(max(tile.written, 1)), _log2(work / elements)]
    return row + [0.0] * (4 * LEVELS - len(row))


def trace_features(schedule: Schedule, main: str) -> list[float]:
    return schedule_features(schedule, main) + footprint_features(schedule, main)


class GBModel:
    """Gradient-boosted trees on `trace_features`, retrained by the tuner as records
    arrive; `save` / `load` keep a trained model for another tuning run."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._model: Any = None
        self._rng = random.Random(seed)

    def fit_rows(self, rows: Rows, scores: Sequence[float]) -> None:
        """Fit normalized throughputs; with fewer than 8 samples, predict at random."""
        from sklearn.ensemble import GradientBoostingRegressor

        if len(rows) < 8:
            self._model = None
            return
        width = max(len(r) for r in rows)
        x = np.array([list(r) + [0.0] * (width - len(r)) for r in rows])
        model = GradientBoostingRegressor(
            n_estimators=80, max_depth=4, learning_rate=0.1, random_state=self.seed
        )
        model.fit(x, np.asarray(scores))
        self._model = (model, width)

    def predict_rows(self, rows: Rows) -> np.ndarray:
        if self._model is None:
            return np.array([self._rng.random() for _ in rows])
        model, width = self._model
        x = np.array([(list(r) + [0.0] * width)[:width] for r in rows])
        return model.predict(x)

    @property
    def trained(self) -> bool:
        return self._model is not None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Pickle the model (written to a temporary file, then renamed: never torn)."""
        target = Path(path)
        tmp = target.with_name(f"{target.name}.tmp")
        tmp.write_bytes(
            pickle.dumps({"format": MODEL_FORMAT, "seed": self.seed, "model": self._model})
        )
        os.replace(tmp, target)

    @staticmethod
    def load(path: str | os.PathLike[str]) -> GBModel:
        try:
            data = pickle.loads(Path(path).read_bytes())
            if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
                raise ValueError("not a polytile cost model")
        except (OSError, pickle.UnpicklingError, ValueError, EOFError) as err:
            raise TuningError(f"cost model '{path}' cannot be loaded: {err}") from None
        model = GBModel(int(data["seed"]))
        model._model = data["model"]
        return model
