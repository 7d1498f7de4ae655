"""The budget of one candidate's build: sketch steps, legality checks, AST generation and
checks together. A candidate over it is not worth having (the search records it as a
`budget` error and goes on) rather than a hang of the whole tune."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from polytile.errors import BudgetExceeded
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.schedule import Schedule

#: isl operations one candidate's build may take: room for a few AST generations at their
#: own budget (`poly.ast.build.AST_OPERATIONS`), far above what the zoo's candidates take
BUILD_OPERATIONS = 40_000_000
#: seconds one candidate's build may take: the measurer's build timeout (`MeasureConfig`)
BUILD_SECONDS = 60.0


class Progress:
    """The schedule a build has reached by its last checkpoint, and the budget's check
    there (between steps: cheap)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def at(self, schedule: Schedule, where: str) -> Schedule:
        self.schedule = schedule
        ih.check_budget(where)
        return schedule


@contextlib.contextmanager
def candidate_budget(start: Schedule) -> Iterator[Progress]:
    """The block under the candidate budget, from schedule `start`; past it,
    `BudgetExceeded` carrying the trace of the last checkpoint's schedule."""
    progress = Progress(start)
    refusal = f"kernel {start.kernel.name}: building the candidate went over its budget"
    try:
        with ih.operation_budget(BUILD_OPERATIONS, refusal, BUILD_SECONDS, "candidate build"):
            yield progress
    except BudgetExceeded as err:
        trace = tuple(progress.schedule.trace_json())
        raise BudgetExceeded(str(err), err.resource, err.where, trace) from None
