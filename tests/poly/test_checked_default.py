"""`checked_default`: the default schedule with one AST check for the whole kernel instead
of one per fused nest, the same schedule as `default_schedule`'s, and its fallbacks when
the whole AST fails the check (isl's AST generator can drop a fused nest's instances)."""

from __future__ import annotations

import islpy as isl
import pytest

import polytile.poly.default.schedule as D
from polytile.errors import IllegalSchedule
from polytile.poly.ast.build import build_ast
from polytile.poly.default.schedule import DefaultConfig, checked_default, default_schedule
from polytile.poly.dsl import kernel
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import (
    Schedule,
    initial_schedule,
    reversed_dependences,
    schedule_map,
)
from polytile.poly.transform import steps as T

from kernels import mm_relu

CONFIG = DefaultConfig(vector_width=8)
#: a static kernel and a symbolic one (its default replayed from an instance), each with a
#: fuse in its default schedule
KERNELS = {
    "batched": kernel(
        "S[b, h, i, j] += Q[b, h, i, e] * K[b, h, j, e]", Q=(1, 4, 32, 16), K=(1, 4, 32, 16)
    ),
    "attention": kernel(
        "S[b, h, i, j] += Q[b, h, i, e] * K[b, h, j, e]",
        Q=("n", 4, "s", 16),
        K=("n", 4, "s", 16),
    ),
}


def _fuses(schedule: Schedule) -> int:
    return sum(step.kind == "fuse" for step in schedule.trace)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_checked_default_is_the_default_schedule_and_its_ast(name: str) -> None:
    k: Kernel = KERNELS[name]
    want = default_schedule(k, CONFIG)
    assert _fuses(want) >= 1
    got, ast = checked_default(k, CONFIG)
    assert got.trace == want.trace
    assert ast == build_ast(want)


def test_unchecked_fuse_skips_only_the_ast_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unchecked, a fuse gives the same schedule without building its nest's AST, and
    its other checks stay."""
    plain = initial_schedule(mm_relu(16, 16, 16))
    first, second = (lp.name for lp in plain.loops_of("C")[:2])
    built: list[object] = []
    monkeypatch.setattr(T, "verify_ast", lambda s, ast=None: built.append(s))
    assert T.fuse(plain, first, second, check_ast=False).trace == T.fuse(plain, first, second).trace
    assert len(built) == 1  # the checked fuse's only
    with pytest.raises(IllegalSchedule, match="consecutive"):
        T.fuse(plain, second, first, check_ast=False)


def test_a_whole_ast_that_fails_its_check_takes_checked_fuses_then_the_initial_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the whole AST fails (here: a check that rejects its first schedule, as isl's
    bug would a long fuse), the default is made again with each fuse checked; where that
    fails too (here: every schedule with a fuse), the initial schedule, with a warning."""
    k = KERNELS["batched"]
    want = default_schedule(k, CONFIG)
    real = D.verify_ast
    seen: list[Schedule] = []

    def first_fails(schedule: Schedule, ast: object = None) -> object:
        seen.append(schedule)
        if len(seen) == 1:
            raise IllegalSchedule("isl dropped instances")
        return real(schedule)

    monkeypatch.setattr(D, "verify_ast", first_fails)
    got, _ = checked_default(k, CONFIG)
    assert len(seen) == 2 and got.trace == want.trace

    def fused_fail(schedule: Schedule, ast: object = None) -> object:
        if _fuses(schedule):
            raise IllegalSchedule("isl dropped instances")
        return real(schedule)

    monkeypatch.setattr(D, "verify_ast", fused_fail)
    with pytest.warns(UserWarning, match="initial schedule"):
        got, ast = checked_default(k, CONFIG)
    assert got.trace == initial_schedule(k).trace and ast == build_ast(got)


def _precedes(schedule: Schedule) -> isl.UnionMap:
    """Instance → the instances the schedule runs after it."""
    timed = schedule_map(schedule).intersect_domain(schedule.kernel.domain())
    spaces: list[isl.Set] = []
    timed.range().foreach_set(spaces.append)
    later = isl.UnionMap.from_map(isl.Map.lex_lt(spaces[0].get_space()))
    return timed.apply_range(later).apply_range(timed.reverse())


def _fuse_cases() -> list[tuple[Schedule, tuple[str, ...]]]:
    plain = initial_schedule(mm_relu(12, 8, 4))
    nested = T.reverse_compute_at(plain, "C", "j")  # Y's k loop and C under i, j
    tiled, (i0, i1) = T.split_named(plain, "i_1", (None, 4))
    symbolic = initial_schedule(kernel("Y[b, i, j] = X[b, i, j] * 2.0", X=("n", 3, 5)))
    return [
        (nested, ("i", "j")),
        (plain, ("j", "k")),  # through the reduction loop
        (tiled, (i0, i1)),  # a tile loop and its floor / modulo
        (tiled, (i0, i1, "j_1")),
        (symbolic, tuple(lp.name for lp in symbolic.loops_of("Y")[:2])),
    ]


@pytest.mark.parametrize("case", range(5))
def test_fuse_keeps_the_order_of_every_pair_of_instances(case: int) -> None:
    """Why a fuse checks no dependence and no mark again: the fused value of each
    instance orders all pairs of instances as the loops it replaces did."""
    schedule, loops = _fuse_cases()[case]
    fused = T.fuse(schedule, *loops)
    assert [s.kind for s in fused.trace][-1] == "fuse"
    assert _precedes(fused).is_equal(_precedes(schedule))
    assert reversed_dependences(fused).is_empty()
