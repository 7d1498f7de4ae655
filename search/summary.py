"""What a tune reports: per task, its kind, weight, trials and the default's and best
latencies, and for the model the estimate they add up to (and the validation's table),
and where the tune's time went (`Clock`); when the search stops early (`EarlyStop`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .validate import Validation

#: the parts of a tune's time, in the order they are reported: building candidates (and
#: their feature rows), ranking them with the cost model, measuring them (of which
#: compiling — LLVM — and verifying them, and timing them, as the measuring workers
#: report), refitting the cost model, a task's reference outputs and workers' task
#: switch, appending the records, and validation inside the model
PARTS = ("build", "rank", "measure", "model", "reference", "records", "validate")
#: the measurement's own parts (within "measure")
MEASURE_PARTS = ("compile", "run")


@dataclass
class Clock:
    """Seconds spent per part of the tune; parts never nest, so they add up to at most the
    wall time, and what they leave is the search's own bookkeeping."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def time_table(seconds: Mapping[str, float], wall: float, trials: int) -> str:
    """Where the time went: each part's seconds, share of the wall time and ms per trial."""
    per = max(trials, 1)
    lines = [f"time per trial: {wall / per * 1e3:.0f} ms ({wall:.1f} s, {trials} trials)"]
    accounted = sum(seconds.get(p, 0.0) for p in PARTS)
    order = [q for p in PARTS for q in ((p, *MEASURE_PARTS) if p == "measure" else (p,))]
    named = [(p, seconds[p]) for p in order if seconds.get(p)]
    for name, s in [*named, ("other", max(wall - accounted, 0.0))]:
        indent = "    " if name in MEASURE_PARTS else "  "
        share = s / wall * 100 if wall > 0 else 0.0
        label = f"{indent}{name}"
        lines.append(f"{label:<13} {s:8.2f} s {share:5.1f} % {s / per * 1e3:8.1f} ms/trial")
    return "\n".join(lines)


@dataclass(frozen=True)
class TaskSummary:
    index: int
    kind: str
    flops: int
    weight: int
    trials: int
    default_ms: float
    best_ms: float

    @property
    def gflops(self) -> float:
        return self.flops / (self.best_ms / 1e3) / 1e9 if self.best_ms > 0 else 0.0


@dataclass(frozen=True)
class TuneResult:
    tasks: tuple[TaskSummary, ...]
    trials: int
    seconds: float
    #: the in-model re-ranking after the search (None when it did not run)
    validation: Validation | None = None
    #: whether the search ended early: the estimate stopped improving (`EarlyStop`)
    stopped_early: bool = False
    #: seconds per part of the tune (`PARTS`, `MEASURE_PARTS`), within `seconds`
    time: Mapping[str, float] = field(default_factory=dict)
    #: seconds before the search: extracting the tasks, their default schedules and spaces
    setup: float = 0.0

    def estimated_ms(self, tuned: bool) -> float:
        """Σ weight × kernel latency: the model's latency as the tasks add it up."""
        return sum(t.weight * (t.best_ms if tuned else t.default_ms) for t in self.tasks)

    def table(self) -> str:
        if not self.tasks:  # validation only
            return self.validation.table() if self.validation is not None else "no tasks tuned"
        head = (
            f"{'ID':>3} | {'kind':<18} | {'FLOPs':>12} | {'weight':>6} | {'GFLOPS':>8} | "
            f"{'default ms':>10} | {'best ms':>9} | {'trials':>6}"
        )
        lines = [head, "-" * len(head)]
        for t in self.tasks:
            lines.append(
                f"{t.index:>3} | {t.kind:<18.18} | {t.flops:>12} | {t.weight:>6} | "
                f"{t.gflops:>8.2f} | {t.default_ms:>10.4f} | {t.best_ms:>9.4f} | {t.trials:>6}"
            )
        lines.append(
            f"estimated model latency: default {self.estimated_ms(False):.3f} ms → "
            f"tuned {self.estimated_ms(True):.3f} ms ({self.trials} trials, {self.seconds:.0f} s"
            + (", stopped early: no progress" if self.stopped_early else "")
            + ")"
        )
        if self.validation is not None and self.validation.tasks:
            lines.append(self.validation.table())
        if self.time:
            lines.append(f"setup (tasks, default schedules): {self.setup:.1f} s")
            lines.append(time_table(self.time, self.seconds, self.trials))
        return "\n".join(lines)


#: the relative fall of the estimated model latency that counts as progress for early
#: stopping: timing noise alone should not keep a tune alive
MIN_GAIN = 0.002


@dataclass
class EarlyStop:
    """tvmc's `--early-stopping N`: the tune ends once the model's estimated latency
    (Σ weight × each task's best) has not fallen by `MIN_GAIN` during the last `trials`
    trials. Until every task has its baseline the estimate is unknown and nothing stops."""

    trials: int
    best: float = float("inf")
    at: int = 0

    def stop(self, estimate: float, used: int) -> bool:
        if estimate == float("inf"):
            self.at = used
            return False
        if estimate < self.best * (1 - MIN_GAIN):
            self.best, self.at = estimate, used
            return False
        return used - self.at >= self.trials
