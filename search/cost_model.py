"""Cost models rank candidates before measurement. The interface is two methods: `fit` on
(candidate, normalized throughput) pairs and `predict` scores (higher is faster).

- `RandomModel`: random scores (the trivial model, for tests).
- `GBModel`: scikit-learn gradient boosting on features of the schedule, trained on
  throughput normalized per task (MetaSchedule's formulation: best latency / latency,
  so every task's best is 1).
- `RankModel`: the pairwise ranking formulation (which of two candidates of a task is
  faster), also boosted trees. `benchmarks/tune_bench.py` measures both on held-out
  records (pairwise accuracy, top-k recall).
- `PretrainedModel` (the tuner's default): the regression fit on measured candidates of
  the zoos' tasks shipped with polytile (`search/data/cost_model_rows.npz`, made by
  `benchmarks/train_cost_model.py`) plus the tune's own measurements, refit every round.
  Rows are shipped rather than a fitted model: a pickle of scikit-learn's trees does not
  load across its versions, and fitting the rows takes about a second.

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

import json
import math
import os
import pickle
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from polytile.codegen.target import l2_bytes, machine_defaults
from polytile.errors import TuningError
from polytile.poly.analysis.footprint import footprints, innermost_strides
from polytile.poly.default.schedule import main_statement
from polytile.poly.ir.schedule import Schedule, loop_dims
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
        is_reduce = bool(loop_dims(loop, main, stmt.reduction_dims))
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


#: the shipped rows of the pre-trained model (`benchmarks/train_cost_model.py` writes them)
SHIPPED = Path(__file__).resolve().parent / "data" / "cost_model_rows.npz"
#: how many times a row measured in this tune counts against a shipped row's once (see
#: `PretrainedModel`)
ONLINE_WEIGHT = 4


@dataclass(frozen=True)
class ShippedRows:
    """Measured candidates of other tasks: feature rows, per-task normalized throughput,
    task ids, and where they were measured (the sidecar JSON)."""

    features: np.ndarray
    targets: np.ndarray
    groups: np.ndarray
    meta: Mapping[str, Any]


def load_shipped(path: str | os.PathLike[str] = SHIPPED) -> ShippedRows:
    """The rows of `path` and its sidecar (`.json` beside it); a TuningError naming the
    file when either is missing or unreadable, or its feature format is not MODEL_FORMAT."""
    data, sidecar = Path(path), Path(path).with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text())
        with np.load(data, allow_pickle=False) as npz:
            features = np.asarray(npz["features"], dtype=np.float64)
            targets = np.asarray(npz["targets"], dtype=np.float64)
            groups = np.asarray(npz["groups"])
    except (OSError, ValueError, KeyError) as err:
        raise TuningError(f"cost model rows '{data}' cannot be loaded: {err}") from None
    if meta.get("format") != MODEL_FORMAT:
        raise TuningError(
            f"cost model rows '{data}' have feature format {meta.get('format')}, this "
            f"polytile computes format {MODEL_FORMAT}: regenerate them "
            "(benchmarks/train_cost_model.py)"
        )
    if features.ndim != 2 or not len(features) == len(targets) == len(groups):
        raise TuningError(f"cost model rows '{data}': features, targets and groups disagree")
    return ShippedRows(features, targets, groups, meta)


def _regressor(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    """The pre-trained model's boosted trees (histogram-based: thousands of rows fit in a
    fraction of a second), on one thread: the measurer's workers own the other cores.
    Small leaves of at least 40 rows: the rows come from other tasks, and a tree that
    fits one task's few candidates closely ranks an unseen task's worse (`evaluate` in
    `benchmarks/train_cost_model.py` compared the settings)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    model = HistGradientBoostingRegressor(
        max_iter=100, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=40,
        early_stopping=False, random_state=seed,
    )  # fmt: skip
    with threadpool_limits(1, user_api="openmp"):
        model.fit(x, y)
    return model


def _predict(model: Any, x: np.ndarray) -> np.ndarray:
    """`model`'s predictions, on one thread (OpenMP's spinning threads would compete with
    the measurer's)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="openmp"):
        return model.predict(x)


#: the fit on the shipped rows alone, per (file, its mtime, seed): fit once per process
_BASE: dict[tuple[str, float, int], Any] = {}


class PretrainedModel(GBModel):
    """Regression on normalized throughput (as `GBModel`) fit on the shipped rows (other
    tasks, measured where the sidecar says) plus this tune's measurements. The shipped
    rows are thousands and a tune's rows dozens: each of the latter counts ONLINE_WEIGHT
    times (it describes the very tasks being ranked, whose own measurements should move
    the fit within a few rounds; `train_cost_model.py evaluate` compares weights on
    held-out tasks). The first fit, on the shipped rows alone, is cached in
    the process. Without usable shipped rows (missing file, other feature format) it
    warns, naming the file, and is the from-scratch `GBModel`."""

    kind = "pretrained"
    #: how many times each of this tune's rows counts (a shipped row once)
    online_weight = ONLINE_WEIGHT

    def __init__(self, seed: int = 0, data: str | os.PathLike[str] | None = None) -> None:
        super().__init__(seed)
        self.data = Path(data) if data is not None else SHIPPED
        self._shipped: ShippedRows | None = None
        self._fallback = False
        #: rows of the last fit: shipped + measured in this tune
        self.fitted_rows = 0

    def shipped(self) -> ShippedRows | None:
        """The shipped rows, loaded once; None (after one warning) when unusable."""
        if self._shipped is None and not self._fallback:
            try:
                self._shipped = load_shipped(self.data)
            except TuningError as err:
                warnings.warn(f"{err}; tuning with a cost model trained from scratch", stacklevel=3)
                self._fallback = True
        return self._shipped

    def fit_rows(
        self, rows: Rows, scores: Sequence[float], groups: Sequence[str] | None = None
    ) -> None:
        shipped = self.shipped()
        if shipped is None:
            super().fit_rows(rows, scores, groups)
            self.fitted_rows = len(rows) if self._model is not None else 0
            return
        if len(rows) == 0:
            key = (str(self.data.resolve()), self.data.stat().st_mtime, self.seed)
            if key not in _BASE:
                _BASE[key] = _regressor(shipped.features, shipped.targets, self.seed)
            self._model = _BASE[key]
        else:
            # weighed by repetition: the trees fit several times faster than with weights
            repeat = self.online_weight
            x = np.concatenate([shipped.features, np.repeat(_matrix(rows), repeat, axis=0)])
            new = np.repeat(np.asarray(scores, dtype=np.float64), repeat)
            self._model = _regressor(x, np.concatenate([shipped.targets, new]), self.seed)
        self.fitted_rows = len(shipped.targets) + len(rows)

    def predict_rows(self, rows: Rows) -> np.ndarray:
        if self._model is None and self.shipped() is not None:
            self.fit_rows([], [])
        if self._model is None or self._fallback:
            return super().predict_rows(rows)
        return _predict(self._model, _matrix(rows))


MODELS: dict[str, type[GBModel]] = {
    "pretrained": PretrainedModel,
    "regression": GBModel,
    "ranking": RankModel,
}


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
