"""Tuning a kernel with symbolic sizes (isl parameters), which one record serves at every
size.

- The sizes (`TuneSizes`, from a `SizesConfig`): the search space samples its decisions
  on the kernel's static instance at `at` (by default where `compile` makes its default
  decisions, `poly.default.representative_sizes`: a batch at 1, the other sizes at
  `REPRESENTATIVE_SIZE`, within their bounds), and every candidate is
  measured at a few `measured` sizes, the user's or sampled within the bounds (seeded,
  log-uniform in as many bands as sizes: a small, a medium and a large one).
- A candidate is the instance's trace replayed on the symbolic kernel (in the measuring
  worker, which already replays every trace): a step that does not hold for all sizes
  makes it an `illegal` record, as an illegal trace of a static kernel is.
- A candidate is compiled once, verified against the default schedule at every measured
  size and timed at each; its latencies (one per repeat) are the geometric means over
  the sizes of that repeat's seconds, so `Record.latency` (the best repeat) is a
  geometric mean too. The record keeps the measured sizes (`Record.sizes`).
- The task's producers are not run before its timed runs (`MeasureConfig.cold=
  "producer"` starts them as "weights" does): the producers have sizes too, and the
  gain did not show for static kernels (`measure`'s docstring).
- The cost model's features are those of the instance's schedule at `at`: the sizes are
  not among them (the shipped model's rows have a fixed width).
- In-model validation (`validate`) runs the model at the same sizes, a candidate's time
  the geometric mean of its seconds per call at each.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from polytile.codegen.target import Target
from polytile.errors import InputError
from polytile.frontend.symbolic import MAX_DIM, Dim
from polytile.poly.default.schedule import REPRESENTATIVE_SIZE
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule

from . import measure as M
from .records import Record
from .tasks import Task

#: the largest size sampled for measuring, and for a size whose bounds leave it open
#: (a batch, [1, 2^34]): the cost of a timed run grows with the sizes
LIMIT, OPEN = 512, 8


@dataclass(frozen=True)
class SizesConfig:
    """Where a dynamic task is tuned: `at`, the sizes its search space samples decisions
    at (each missing size where `compile` makes its default decisions, `Task.at`: a
    model input's leading size 1, others `REPRESENTATIVE_SIZE`); `sizes`, those its
    candidates are timed at (each missing size its lower bound; None: `count` sizes
    sampled within the bounds, none above `limit`, nor above `open` for a size without
    an upper bound, seeded with the tune's seed)."""

    at: Mapping[str, int] | None = None
    sizes: Sequence[Mapping[str, int]] | None = None
    count: int = 3
    limit: int = LIMIT
    open: int = OPEN

    def __post_init__(self) -> None:
        if self.count < 1 or self.limit < 1 or self.open < 1:
            raise InputError("SizesConfig: count, limit and open must be at least 1")
        if self.sizes is not None and not self.sizes:
            raise InputError("SizesConfig: sizes must name at least one set of sizes")


@dataclass(frozen=True)
class TuneSizes:
    """The sizes of one tune: `at` (the search space's instance) and `measured`, over all
    the model's symbolic sizes (empty for a static model)."""

    at: Mapping[str, int]
    measured: tuple[Mapping[str, int], ...]
    #: the derived sizes of the tasks' kernels (`Task.derived`): computed from the named
    #: ones, never sampled
    derived: Mapping[str, Dim] = field(default_factory=dict)

    def values(self, named: Mapping[str, int], kernel: Kernel) -> dict[str, int]:
        """The kernel's parameters at these named sizes (its derived ones computed)."""
        return {
            p: int(self.derived[p].evaluate(named)) if p in self.derived else int(named[p])
            for p in kernel.params
        }

    def of(self, kernel: Kernel) -> tuple[dict[str, int], ...]:
        """The measured sizes of the kernel's parameters, distinct, in order (one empty
        mapping for a static kernel)."""
        found: dict[tuple, dict[str, int]] = {}
        for sizes in self.measured or ({},):
            mine = self.values(sizes, kernel)
            found.setdefault(tuple(mine.items()), mine)
        return tuple(found.values()) or ({},)

    def instance(self, kernel: Kernel) -> Kernel:
        """The static kernel the search space samples (the kernel itself when static)."""
        return kernel.at(self.values(self.at, kernel)) if kernel.params else kernel

    def task(self, task: Task) -> Task:
        """The task with its FLOPs at the measured sizes (their geometric mean), in the
        units of its latencies."""
        if not task.kernel.params:
            return task
        flops = [max(task.kernel.at(s).flops(), 1) for s in self.of(task.kernel)]
        return replace(task, flops=round(math.exp(np.mean(np.log(flops)))))

    def reference(self, schedule: Schedule, target: Target, seed: int) -> tuple:
        """What `Measurer.set_task` verifies candidates against: for a static kernel
        `measure.reference_outputs`; for a symbolic one, ((sizes, inputs) per measured
        size, the default schedule's outputs on each), compiled once."""
        kernel = schedule.kernel
        if not kernel.params:
            return M.reference_outputs(schedule, target, seed)
        from polytile.codegen.native import NativeKernel, random_inputs

        native = NativeKernel(schedule, target)
        inputs = tuple((s, random_inputs(kernel.at(s), seed)) for s in self.of(kernel))
        return inputs, tuple(native.outputs(i, sizes=s) for s, i in inputs)

    def measurer(self, target: Target, config: M.MeasureConfig | None) -> M.Measurer:
        """The measurer of the tune's tasks (`DynamicMeasurer` when some have sizes)."""
        return (DynamicMeasurer if self.measured else M.Measurer)(target, config)


def tune_sizes(tasks: Sequence[Task], config: SizesConfig | None, seed: int) -> TuneSizes:
    """The sizes of a tune of `tasks` (their bounds as `Task.bounds` holds them); an
    InputError names a given size outside its bounds or unknown."""
    bounds: dict[str, tuple[int, int]] = {}
    derived: dict[str, Dim] = {}
    for task in tasks:
        bounds.update((p, (int(lo), int(hi))) for p, (lo, hi) in task.bounds.items())
        derived.update(task.derived)
    if not bounds:
        return TuneSizes({}, ())
    config = config or SizesConfig()
    at = {p: min(max(REPRESENTATIVE_SIZE, lo), hi) for p, (lo, hi) in bounds.items()}
    for task in tasks:  # where compile makes its default decisions (batch 1, others 128)
        at.update((p, v) for p, v in task.at.items() if p in bounds)
    at.update(_checked(config.at or {}, bounds, "at"))
    if config.sizes is not None:
        given = [_checked(s, bounds, "sizes") for s in config.sizes]
        lows = {p: lo for p, (lo, _) in bounds.items()}
        return TuneSizes(at, tuple(lows | s for s in given), derived)
    # each size drawn by its own generator: a tune of some of the tasks (fewer sizes)
    # times the others' sizes where a tune of all of them does
    measured: list[dict[str, int]] = [{} for _ in range(config.count)]
    for p, (lo, hi) in sorted(bounds.items()):
        rng = random.Random(f"{seed}:{p}")
        top = max(min(hi, config.open if hi >= MAX_DIM else config.limit), lo)
        low, width = math.log(lo), (math.log(top) - math.log(lo)) / config.count
        for band, sizes in enumerate(measured):
            value = math.exp(rng.uniform(low + band * width, low + (band + 1) * width))
            sizes[p] = min(max(round(value), lo), top)
    return TuneSizes(at, tuple(measured), derived)


def check_resumed(
    previous: Mapping[str, Sequence[Record]], tasks: Sequence[Task], sizes: TuneSizes, path: Any
) -> None:
    """Warn when earlier records of a task were timed at other sizes than this tune's:
    their geometric means are compared with this run's as they are."""
    import warnings

    for task in tasks:
        want = [dict(s) for s in sizes.of(task.kernel)]
        if any(r.sizes and [dict(s) for s in r.sizes] != want for r in previous.get(task.key, ())):
            warnings.warn(
                f"tuning records {path}: task {task.index}'s candidates were timed at other "
                f"sizes than this run's ({want}); their latencies are compared as they are",
                stacklevel=3,
            )


def _checked(
    sizes: Mapping[str, int], bounds: Mapping[str, tuple[int, int]], option: str
) -> dict[str, int]:
    for p, value in sizes.items():
        if p not in bounds:
            raise InputError(
                f"tune sizes ({option}): '{p}' is not a symbolic size of the model's kernels "
                f"({', '.join(sorted(bounds))})"
            )
        lo, hi = bounds[p]
        if not lo <= int(value) <= hi:
            raise InputError(f"tune sizes ({option}): {p}={value} is outside [{lo}, {hi}]")
    return {p: int(v) for p, v in sizes.items()}


# --- the worker process ------------------------------------------------------------------


def _build(task: tuple, target: Target, config: M.MeasureConfig, trace: list) -> tuple:
    """`measure._build` of a symbolic kernel: replayed (each step checked for all sizes),
    compiled once, verified at every measured size."""
    return M._build(task, target, config, trace, _verify)


def _load(
    task: tuple, target: Target, config: M.MeasureConfig, part: Any, params: tuple, kernel: Kernel
) -> tuple:
    """`measure._load` of a symbolic kernel the cluster built."""
    return M._load(task, target, config, part, params, kernel, _verify)


def _verify(native: Any, task: tuple, config: M.MeasureConfig) -> tuple:
    """Run once at each measured size against the default schedule's outputs: (error,
    message, (native, the buffers of each size))."""
    _, inputs, expected, _ = task
    held = []
    for (sizes, given), want in zip(inputs, expected, strict=True):
        error, message, built = M._verify(native, (None, given, want, None), config, sizes)
        if built is None:
            return error, f"at sizes {sizes}: {message}", None
        held.append(built[1])
    return None, "", (native, held)


def _time_built(built: tuple, config: M.MeasureConfig, ready: Sequence = ()) -> tuple:
    """Time a built candidate at each size: per repeat, the geometric mean of the sizes'
    seconds (a size's `number` grows on its own, `MeasureConfig.min_repeat_ms`)."""
    native, held = built
    try:
        per_size = np.array([M._time(native, buffers, config) for buffers in held])
    except Exception:
        import traceback

        return "runtime", traceback.format_exc(limit=3), ()
    return None, "", tuple(float(x) for x in np.exp(np.log(per_size).mean(axis=0)))


def _functions(task: tuple) -> tuple:
    """`measure._worker`'s build, load and time functions for the task: those above for
    a symbolic kernel, measure's own for a static one."""
    if task[0] is not None and task[0].params:
        return _build, _load, _time_built
    return M._build, M._load, M._time_built


# --- the tuner's side --------------------------------------------------------------------


class _DynamicWorker(M._Worker):
    command = ("-m", "polytile.search.dynamic")


class DynamicMeasurer(M.Measurer):
    """A `Measurer` whose workers measure symbolic kernels too (`set_task` with the
    reference `TuneSizes.reference` made), each record keeping the measured sizes."""

    worker = _DynamicWorker

    def measure(
        self, workload: str, traces: Sequence[list[Mapping[str, Any]]], seed: int = 0
    ) -> list[Record]:
        records = super().measure(workload, traces, seed)
        if self._task is None or not self._task[0].params:
            return records
        sizes = tuple(dict(s) for s, _ in self._task[1])
        return [replace(r, sizes=sizes) for r in records]


if __name__ == "__main__":
    M._worker(Connection(int(sys.argv[1])), _functions)
