"""Cost models rank candidates before measurement. The interface is two methods: `fit` on
(candidate, normalized throughput) pairs and `predict` scores (higher is faster).

- `RandomModel`: random scores (the trivial model, for tests).
- `GBModel`: scikit-learn gradient boosting on features of the schedule, trained on
  throughput normalized per task (MetaSchedule's formulation: best latency / latency,
  so every task's best is 1).
- `RankModel`: the pairwise ranking formulation (which of two candidates of a task is
  faster), also boosted trees. `benchmarks/tune_bench.py` measures both on held-out
  records (pairwise accuracy, top-k recall).

Features (one row per candidate; all from the schedule's loop tree and the kernel):

| feature | meaning |
|---|---|
| `log_vec` | log2 of the vectorized loop's extent (0 without one) |
| `log_par` | log2 of the parallel loop's extent |
| `log_unroll` | log2 of the unrolled loops' total extent |
| `log_tile` | log2 of the spatial iterations below the main statement's first reduction loop |
| `log_rinner` | log2 of the reduction iterations below that loop (the cache tile) |
| `depth` | number of loops around the main statement |
| `packed` | number of packed constant tensors (blocked layouts) |
| `log_work[d]` | one tile at loop depth d (instances sharing loops 0..d, d < 8): its instances |
| `log_elems[d]` | elements the tile touches, all tensors (isl bounding boxes) |
| `log_written[d]` | elements of the written tensor it touches |
| `log_lines[d]` | 64-byte cache lines those boxes span (rows along the contiguous axis) |
| `log_intensity[d]` | instances per element touched (reuse at that level) |
| `stride0`, `stride1` | accesses still / moving one element along the innermost loop (isl) |
| `stride_small`, `stride_far` | accesses moving 2–16 elements / further or irregularly |
| `input_ahead` | reduction steps ahead input rows are asked for (codegen hints) |
| `log_panel` | log2 of the largest weight panel asked for ahead of the next iteration |
| `panel_ahead` | whether a stencil asks for its next weight panel (0 / 1) |

The main statement is the kernel's largest reduction (else its last statement).
Features come from the schedule alone (not from the sampler's decisions), so any record's
trace can be replayed and featurized: the model pre-trains from existing records. The
prefetch features are the schedule's hints over the target's defaults (the values codegen
uses), this machine's unless the caller names them.
"""

from __future__ import annotations

import math
import os
import pickle
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from polytile.codegen.target import l2_bytes, machine_defaults
from polytile.errors import TuningError
from polytile.poly.analysis.footprint import footprints, innermost_strides
from polytile.poly.default.schedule import main_statement
from polytile.poly.ir.kernel import mentions
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform import steps as T

Rows = Sequence[Sequence[float]]
#: the saved model's format (features and their order); bump when they change
MODEL_FORMAT = 3
#: fewer measured candidates than this: the models score at random
MIN_ROWS = 8
#: training pairs (within a task) and reference rows of the ranking model
MAX_PAIRS, REFERENCE_ROWS = 20000, 128


class CostModel(Protocol):
    """Scores candidates from their feature rows (higher is faster)."""

    def fit_rows(
        self, rows: Rows, scores: Sequence[float], groups: Sequence[str] | None = None
    ) -> None: ...

    def predict_rows(self, rows: Rows) -> np.ndarray: ...


class RandomModel:
    """The trivial model: seeded random scores."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def fit_rows(
        self, rows: Rows, scores: Sequence[float], groups: Sequence[str] | None = None
    ) -> None:
        del rows, scores, groups

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
#: per level: log2 of work, elements, written elements, cache lines, work / elements
PER_LEVEL = 5


def footprint_features(schedule: Schedule, main: str) -> list[float]:
    """Per loop depth: log2 of the tile's work, footprint, written footprint, cache lines
    and arithmetic intensity (see `poly.footprint`), padded to LEVELS depths."""
    row: list[float] = []
    for tile in footprints(schedule, main)[:LEVELS]:
        work, elements = max(tile.work, 1), max(tile.elements, 1)
        row += [
            _log2(work),
            _log2(elements),
            _log2(max(tile.written, 1)),
            _log2(max(tile.lines, 1)),
            _log2(work / elements),
        ]
    return row + [0.0] * (PER_LEVEL * LEVELS - len(row))


def stride_features(schedule: Schedule, main: str) -> list[float]:
    """How the innermost loop walks memory: accesses with stride 0 (reuse), 1
    (contiguous), 2–16 (strided within a few lines) and beyond or irregular."""
    counts = [0.0, 0.0, 0.0, 0.0]
    for stride in innermost_strides(schedule, main):
        if stride is None or abs(stride) > 16:
            counts[3] += 1
        else:
            counts[min(abs(stride), 2)] += 1
    return counts


def hint_features(schedule: Schedule, defaults: Mapping[str, Any] | None = None) -> list[float]:
    """The prefetch choices codegen makes for the schedule: its hints over `defaults`
    (a target's `MachineChoices` as a mapping; else this machine's)."""
    if defaults is None:
        defaults = asdict(machine_defaults(l2_bytes()))
    choices = {**defaults, **schedule.hints}
    return [
        float(choices["input_ahead"]),
        _log2(float(choices["prefetch_panel"])),
        float(bool(choices["panel_ahead"])),
    ]


def trace_features(schedule: Schedule, defaults: Mapping[str, Any] | None = None) -> list[float]:
    """The feature row of a schedule: its main statement (the largest reduction, as
    the poly layer picks it, so rfactored kernels are described by their partial
    results) seen through the loop tree, its tile footprints and its strides, and the
    prefetch choices codegen makes for it (`hint_features`, over `defaults`)."""
    main = main_statement(schedule.kernel).name
    return (
        schedule_features(schedule, main)
        + footprint_features(schedule, main)
        + stride_features(schedule, main)
        + hint_features(schedule, defaults)
    )


def _matrix(rows: Rows) -> np.ndarray:
    """Feature rows as one array (every row has the same width: levels are padded)."""
    return np.asarray(rows, dtype=np.float64)


class GBModel:
    """Gradient-boosted trees regressing normalized throughput on `trace_features`
    (MetaSchedule's formulation), retrained by the tuner as records arrive."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._model: Any = None
        self._rng = random.Random(seed)

    def fit_rows(
        self, rows: Rows, scores: Sequence[float], groups: Sequence[str] | None = None
    ) -> None:
        """Fit normalized throughputs; with fewer than 8 samples, predict at random."""
        from sklearn.ensemble import GradientBoostingRegressor

        del groups  # scores are already normalized per task
        if len(rows) < MIN_ROWS:
            self._model = None
            return
        x = _matrix(rows)
        model = GradientBoostingRegressor(
            n_estimators=80, max_depth=4, learning_rate=0.1, random_state=self.seed
        )
        model.fit(x, np.asarray(scores))
        self._model = model

    def predict_rows(self, rows: Rows) -> np.ndarray:
        if self._model is None:
            return np.array([self._rng.random() for _ in rows])
        return self._model.predict(_matrix(rows))

    @property
    def trained(self) -> bool:
        return self._model is not None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Pickle the model (written to a temporary file, then renamed: never torn)."""
        target = Path(path)
        tmp = target.with_name(f"{target.name}.tmp")
        data = {"format": MODEL_FORMAT, "kind": self.kind, "seed": self.seed, "model": self._model}
        tmp.write_bytes(pickle.dumps(data))
        os.replace(tmp, target)

    kind = "regression"


class RankModel(GBModel):
    """Pairwise ranking: a classifier on feature differences predicts which of two
    candidates of one task is faster; a candidate scores its mean win probability
    against a reference sample of the training rows (Ansor's rank loss, as boosted
    trees)."""

    kind = "ranking"

    def fit_rows(
        self, rows: Rows, scores: Sequence[float], groups: Sequence[str] | None = None
    ) -> None:
        from sklearn.ensemble import GradientBoostingClassifier

        if len(rows) < MIN_ROWS:
            self._model = None
            return
        x, y = _matrix(rows), np.asarray(scores, dtype=np.float64)
        keys = list(groups) if groups is not None else [""] * len(y)
        rng = np.random.default_rng(self.seed)
        pairs = []
        for key in sorted(set(keys)):
            members = np.array([i for i, k in enumerate(keys) if k == key])
            for a in range(len(members)):
                for b in range(a + 1, len(members)):
                    i, j = members[a], members[b]
                    if y[i] != y[j]:
                        pairs.append((i, j))
        if len(pairs) > MAX_PAIRS:
            pairs = [pairs[k] for k in rng.choice(len(pairs), MAX_PAIRS, replace=False)]
        if not pairs:
            self._model = None
            return
        first, second = np.array(pairs).T
        diffs = np.concatenate([x[first] - x[second], x[second] - x[first]])
        wins = y[first] > y[second]
        labels = np.concatenate([wins, ~wins])
        model = GradientBoostingClassifier(n_estimators=80, max_depth=3, random_state=self.seed)
        model.fit(diffs, labels)
        reference = x[rng.choice(len(x), min(len(x), REFERENCE_ROWS), replace=False)]
        self._model = (model, reference)

    def predict_rows(self, rows: Rows) -> np.ndarray:
        if self._model is None:
            return np.array([self._rng.random() for _ in rows])
        model, reference = self._model
        x = _matrix(rows)
        diffs = (x[:, None, :] - reference[None, :, :]).reshape(-1, x.shape[1])
        wins = model.predict_proba(diffs)[:, list(model.classes_).index(True)]
        return wins.reshape(len(x), len(reference)).mean(axis=1)


MODELS: dict[str, type[GBModel]] = {"regression": GBModel, "ranking": RankModel}


def load_model(path: str | os.PathLike[str]) -> GBModel:
    """A model `save` wrote (a pickle: load only your own files)."""
    try:
        data = pickle.loads(Path(path).read_bytes())
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise ValueError("not a polytile cost model of this version")
        cls = MODELS[data.get("kind", "regression")]
    except (OSError, pickle.UnpicklingError, ValueError, EOFError, KeyError) as err:
        raise TuningError(f"cost model '{path}' cannot be loaded: {err}") from None
    model = cls(int(data["seed"]))
    model._model = data["model"]
    return model
