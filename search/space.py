"""The search space of a kernel: its sketch (`poly.default.sketch`, the template the
default schedule is built from too) with its decisions sampled and mutated.

A candidate is the sketch with its *decisions* (see `poly.default.sketch`), and for a
register-tiled reduction the prefetch choices codegen makes for it, named as
`poly.ir.schedule.HINTS`, by default the target's. It is sampled at random with a
structural hint (the conv plan of `poly.default`: channels in vectors, rows in
registers; for a 1×1 conv whose pixels stream, that or the pixels in vectors, half and
half) or mutated from a parent; building it applies the sketch and records the trace. A
decision that would be illegal is dropped (that step is skipped), so every candidate is
a legal, replayable trace before anything is measured. `default_decisions` are the
default schedule's (`poly.default.decide`): built, they give `default_schedule`'s trace,
and the evolutionary search starts from them.

A prefetch choice other than the target's becomes one `hint` step, last: under the
default choices the trace is the default schedule's, as before those decisions existed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polytile.codegen.target import MachineChoices, machine_defaults
from polytile.poly.default.decide import default_decisions
from polytile.poly.default.sketch import (
    BANDS,
    BLOCKS,
    INLINE,
    MAX_BLOCK,
    OUTER_TILES,
    REDUCTION_TILES,
    RFACTORS,
    ROW_TILES,
    SECOND_BLOCKS,
    VECTOR_WIDTHS,
    Decisions,
    Sketch,
)
from polytile.poly.default.steps import DefaultConfig
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import HINTS, Schedule, initial_schedule
from polytile.poly.transform import steps as T

from .budget import candidate_budget
from .hints import hint_choices

#: the choice sets, named here for the search's other modules
__all__ = [
    "ABSENT",
    "BANDS",
    "BLOCKS",
    "HINT",
    "INLINE",
    "MAX_BLOCK",
    "OUTER_TILES",
    "REDUCTION_TILES",
    "RFACTORS",
    "ROW_TILES",
    "SECOND_BLOCKS",
    "VECTOR_WIDTHS",
    "Candidate",
    "Decisions",
    "SearchSpace",
]

#: what a decision that a record of an older space lacks meant there
ABSENT = {"row_tile": 0, "band": 0}
#: probability that a sample follows the kernel's structural hint
HINT = 0.7


@dataclass(frozen=True)
class Candidate:
    decisions: Mapping[str, Any]
    schedule: Schedule

    @property
    def trace(self) -> list[dict[str, Any]]:
        return self.schedule.trace_json()


class SearchSpace(Sketch):
    """Decisions of one kernel: sample, mutate, build."""

    def __init__(
        self,
        kernel: Kernel,
        lanes: int = 16,
        threads: int = 2,
        config: DefaultConfig | None = None,
        machine: MachineChoices | None = None,
    ) -> None:
        """`config`: the default schedules' settings on the target (its lanes, threads
        and L2), which the sketch's default decisions follow; else built from `lanes`
        and `threads`. `machine`: the target's prefetch choices, the defaults of the
        `HINTS` decisions; else those of its L2 (`codegen.target.machine_defaults`)."""
        super().__init__(kernel, config or DefaultConfig(vector_width=lanes, threads=threads))
        self.machine = machine or machine_defaults(self.config.cache_bytes)
        hints = hint_choices(
            kernel, self.main, self.spatial, self.reduce, self.config, self.machine
        )
        default = {
            **default_decisions(self),
            **{k: getattr(self.machine, k) for k in HINTS if k in hints},
        }
        choices = {**self.structure_choices(), **hints}
        # the default's values are options too (a row that runs once, a block of 7)
        for k, v in default.items():
            if v not in choices[k]:
                choices[k] = (*choices[k], v)
        self._choices = choices
        self._default = default

    # --- decisions --------------------------------------------------------------------
    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Every decision's options (loops that cannot be split are left out)."""
        return dict(self._choices)

    def sample(self, rng: random.Random) -> Decisions:
        decisions = {k: rng.choice(v) for k, v in self._choices.items()}
        if rng.random() < HINT:
            plan = self.channels
            # the default vectorizes the innermost output dim (a 1×1 conv's contiguous
            # pixels, where there are enough of them): that hint too, half the time
            streams = self.plan is None or self.plan.streams
            innermost = streams and bool(self.spatial)
            if plan is not None and not (innermost and rng.random() < 0.5):
                # channels in vectors, rows in registers
                widths = [w for w in self._choices["vec"] if w <= plan.lanes]
                decisions.update(vec_loop=plan.channel, block_loop=plan.row, vec=rng.choice(widths))
                decisions["low_reduce"] = True
            elif innermost:
                decisions["vec_loop"] = self.spatial[-1]
        return decisions

    def mutate(self, decisions: Mapping[str, Any], rng: random.Random) -> Decisions:
        key = rng.choice(sorted(self._choices))
        mutated = dict(decisions)
        mutated[key] = rng.choice(self._choices[key])
        return mutated

    def complete(self, decisions: Mapping[str, Any]) -> Decisions:
        """Decisions from elsewhere (a record of an older search space) made whole: an
        unknown key is dropped, a missing one what its absence meant there (`ABSENT`) or
        else the default's, an impossible one the default's."""
        completed = {}
        for k, options in self._choices.items():
            if k in decisions and decisions[k] in options:
                completed[k] = decisions[k]
            elif k not in decisions and k in ABSENT and ABSENT[k] in options:
                completed[k] = ABSENT[k]
            else:
                completed[k] = self._default[k]
        return completed

    def default_decisions(self) -> Decisions:
        """The default schedule's decisions (`poly.default.decide`), with the target's
        prefetch choices: built, `poly.default.default_schedule`."""
        return dict(self._default)

    # --- building ---------------------------------------------------------------------
    def build(self, decisions: Mapping[str, Any]) -> Candidate:
        """The candidate, under the build budget (`search.budget`): past it,
        `BudgetExceeded` with the trace built by its last checkpoint."""
        with candidate_budget(initial_schedule(self.kernel)) as progress:
            schedule = self.apply(decisions, progress.at)
            return Candidate(dict(decisions), self._hint(schedule, decisions))

    def _hint(self, schedule: Schedule, d: Mapping[str, Any]) -> Schedule:
        """The prefetch decisions other than the target's, as one `hint` step."""
        hints = {k: d[k] for k in HINTS if k in self._choices and d[k] != self._default[k]}
        return T.hint(schedule, **hints) if hints else schedule
