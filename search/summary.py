"""What a tune reports: per task, its kind, weight, trials and the default's and best
latencies, and for the model the estimate they add up to (and the validation's table)."""

from __future__ import annotations

from dataclasses import dataclass

from .validate import Validation


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
        return "\n".join(lines)
