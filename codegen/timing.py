"""`Timing`: seconds per run of repeated measurements, as a built kernel (`native`) and a
compiled model (`polytile.runtime`) report them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per run over `repeat` measurements of `number` runs each."""

    results: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        return statistics.median(self.results)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.results)

    @property
    def min(self) -> float:
        return min(self.results)

    def __str__(self) -> str:
        ms = 1e3
        return (
            f"mean {self.mean * ms:.3f} ms, median {self.median * ms:.3f} ms, "
            f"std {self.std * ms:.3f} ms, min {self.min * ms:.3f} ms ({len(self.results)} repeats)"
        )
