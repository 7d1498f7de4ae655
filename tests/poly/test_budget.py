"""Budgets of isl operations and seconds (`poly.ir.isl_helpers.operation_budget`): they
nest, an outer one stays in force and keeps counting inside inner ones, and running out
raises `BudgetExceeded`, an `IllegalSchedule` naming what ran out."""

from __future__ import annotations

import islpy as isl
import pytest

from polytile.errors import BudgetExceeded, IllegalSchedule
from polytile.poly.ir import isl_helpers as ih


def work(rounds: int) -> None:
    """Some isl work, the same operations every time (no cached parsing)."""
    for i in range(rounds):
        s = isl.Set(f"{{ [a, b] : 0 <= a < {40 + i} and 0 <= b <= a and (a + b) mod 3 = 1 }}")
        s.union(isl.Set("{ [a, b] : 0 <= a < 7 and 0 <= b < 9 }")).coalesce().lexmin()


def operations(rounds: int) -> int:
    """isl operations `work(rounds)` takes (counted under a budget too large to matter)."""
    with ih.operation_budget(10**12, "calibration"):
        before = ih._count()
        work(rounds)
        return ih._count() - before


def test_one_round_is_enough_operations_to_matter() -> None:
    assert operations(4) > 4 * 200  # a few dozen of probe operations are noise next to it


def test_an_outer_budget_stays_in_force_inside_an_inner_one() -> None:
    need = operations(4)
    with (
        pytest.raises(BudgetExceeded, match="outer refused") as caught,
        ih.operation_budget(need // 2, "outer refused", step="outer"),
        ih.operation_budget(10 * need, "inner refused", step="inner"),
    ):
        assert 0 < ih.CTX.get_max_operations() <= need // 2 + 50
        work(4)
    assert caught.value.resource == "isl operations"
    assert "inner" in caught.value.where  # where it ran out: inside the inner budget
    assert isinstance(caught.value, IllegalSchedule)
    assert ih.CTX.get_max_operations() == 0
    work(4)  # no limit is left behind


def test_the_outer_count_goes_on_across_inner_budgets() -> None:
    """Work before and inside inner budgets adds up: each part fits the outer budget
    alone, together they do not; and the limit is the outer's again after each inner."""
    need = operations(4)
    with (
        pytest.raises(BudgetExceeded, match="outer refused"),
        ih.operation_budget(need * 5 // 2, "outer refused"),
    ):
        outer_limit = ih.CTX.get_max_operations()
        work(4)
        for _ in range(2):
            with ih.operation_budget(2 * need, "inner refused"):
                work(4)
            assert ih.CTX.get_max_operations() == outer_limit
    assert ih.CTX.get_max_operations() == 0


def test_an_inner_budget_runs_out_alone_and_the_outer_goes_on() -> None:
    need = operations(4)
    with ih.operation_budget(100 * need, "outer refused"):
        with (
            pytest.raises(BudgetExceeded, match="inner refused") as caught,
            ih.operation_budget(need // 4, "inner refused", step="the inner step"),
        ):
            work(4)
        assert "the inner step" in str(caught.value)
        work(4)  # the outer budget still has room
    work(4)


def test_a_spent_outer_budget_raises_on_exit_even_when_its_refusal_was_caught() -> None:
    """A step that catches IllegalSchedule and goes on (as `attempt` does) cannot turn a
    block over budget into a result."""
    need = operations(4)
    with (
        pytest.raises(BudgetExceeded, match="outer refused"),
        ih.operation_budget(need // 2, "outer refused"),
    ):
        try:
            with ih.operation_budget(10 * need, "inner refused"):
                work(4)
        except IllegalSchedule:
            pass
    assert ih.CTX.get_max_operations() == 0


def test_a_deadline_raises_at_the_next_check_and_on_exit() -> None:
    with (
        pytest.raises(BudgetExceeded, match=r"slow build.*seconds.*between steps") as caught,
        ih.operation_budget(None, "slow build", seconds=0.0),
    ):
        ih.check_budget("between steps")
    assert caught.value.resource == "seconds"
    with (
        pytest.raises(BudgetExceeded, match="seconds"),
        ih.operation_budget(None, "slow build", seconds=0.0),
    ):
        pass
    ih.check_budget("outside")  # nothing in force
