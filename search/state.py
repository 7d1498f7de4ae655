"""The tuner's state of one task: its search space, default schedule, what was measured
(the population and the best), what not to try again, and its built candidates."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.errors import BudgetExceeded
from polytile.poly.ir.schedule import Schedule

from .builder import Built
from .records import Record, trace_key
from .space import SearchSpace
from .tasks import Task


@dataclass(frozen=True)
class Measured:
    """One measured candidate as the strategy keeps it."""

    decisions: Mapping[str, Any] | None
    latency: float
    row: tuple[float, ...] | None


@dataclass
class TaskState:
    task: Task
    space: SearchSpace
    #: the default schedule: the baseline and, run natively, the verification oracle
    default: Schedule
    seen: set[str] = field(default_factory=set)
    best: Record | None = None
    baseline: Record | None = None
    trials: int = 0
    #: the best latency after each trial (the task scheduler's curve)
    history: list[float] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)
    rounds: int = 0
    done: bool = False
    #: random inputs and the default schedule's outputs on them (the verification oracle)
    reference: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None
    #: built candidates (traces and feature rows) by their decisions (mutations often
    #: revisit them; a borrowed candidate is ranked again every round until measured)
    built: dict[str, Built] = field(default_factory=dict)
    #: decisions whose build went over budget: never built again
    refused: set[str] = field(default_factory=set)
    #: builds over budget not recorded yet (a round that had no trial left for them)
    held: dict[str, tuple[Mapping[str, Any], BudgetExceeded]] = field(default_factory=dict)
    #: this round's builds over budget (their records, written already): trials too
    over: list[Record] = field(default_factory=list)
    #: rounds in a row that found nothing to measure
    idle: int = 0

    @property
    def latency(self) -> float:
        return self.best.latency if self.best is not None else float("inf")

    @property
    def default_trace(self) -> list[dict[str, Any]]:
        return self.default.trace_json()

    @functools.cached_property
    def default_key(self) -> str:
        return trace_key(self.default_trace)

    def add(self, record: Record, decisions: Mapping[str, Any] | None, row: Any) -> None:
        """Count one trial: best, curve, population (a build over budget: its decisions
        refused; its trace, where it stopped, may still be another's whole one)."""
        if record.error == "budget":
            if decisions is not None:
                self.refused.add(decisions_key(decisions))
        else:
            self.seen.add(record.trace_key())
        self.trials += 1
        if record.ok and (self.best is None or record.latency < self.best.latency):
            self.best = record
        if record.ok and record.trace_key() == self.default_key:
            self.baseline = record
        self.history.append(self.latency)
        self.measured.append(Measured(decisions, record.latency, row))


def decisions_key(decisions: Mapping[str, Any]) -> str:
    return json.dumps(dict(decisions), sort_keys=True)
