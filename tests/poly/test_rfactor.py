"""rfactor: partial results per lane of a split reduction dimension keep the result, make
the lane loop parallelizable (the reduction loop itself is not), and replay from traces."""

from __future__ import annotations

import numpy as np
import pytest

from polytile.errors import IllegalSchedule
from polytile.handle import ScheduleHandle
from polytile.poly.dsl import kernel
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.transform import steps as T

from kernels import assert_equivalent


@pytest.mark.parametrize(
    ("statement", "shapes", "dim", "factor"),
    [
        ("Y[i] += A[i, k] * 2", {"A": (3, 37)}, "k", 8),  # partial last block
        ("Y[i] max= A[i, k]", {"A": (2, 16)}, "k", 4),
        ("Y[i, j] += A[i, k] * B[k, j]", {"A": (2, 9), "B": (9, 3)}, "k", 3),
        ("S[0] += A[i, j]", {"A": (5, 6)}, "i", 2),  # a full reduction to one value
    ],
)
def test_rfactor_keeps_the_result(statement: str, shapes: dict, dim: str, factor: int) -> None:
    extra = {"shapes": {"S": (1,)}} if statement.startswith("S[") else {}
    k = kernel(statement, **extra, **shapes)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    stmt = next(s.name for s in k.statements if s.reduction)
    schedule = T.rfactor(initial_schedule(k), stmt, dim, factor)
    assert any(t.name.endswith("_rf") for t in schedule.kernel.tensors.values())
    assert_equivalent(schedule, inputs, original=k, atol=1e-5)


def test_rfactor_makes_the_lane_loop_parallel() -> None:
    k = kernel("S[0] += A[i]", A=(64,), shapes={"S": (1,)})
    plain = initial_schedule(k)
    reduce_loop = [lp.name for lp in plain.loops_of("S")][-1]
    with pytest.raises(IllegalSchedule):
        T.parallel(plain, reduce_loop)
    sch = ScheduleHandle(k)
    sch.rfactor("S", "i", 4)
    partial = next(
        s.name for s in sch.kernel.statements if s.tensor.endswith("_rf") and s.reduction
    )
    outer, lane = sch.get_loops(partial)[-2:]
    sch.reorder(lane, outer)
    sch.parallel(lane)
    a = np.arange(64, dtype=np.float32)
    got = run_schedule(sch.schedule, {"A": a}, order="shuffle")
    np.testing.assert_allclose(got["S"], [a.sum()], rtol=1e-6)
    replayed = T.replay(k, sch.trace)
    assert replayed.body == sch.schedule.body


@pytest.mark.parametrize(
    ("dim", "factor", "message"),
    [("i", 4, "not a reduction dimension"), ("k", 1, "at least 2"), ("z", 2, "not a reduction")],
)
def test_rfactor_rejects_bad_requests(dim: str, factor: int, message: str) -> None:
    k = kernel("Y[i] += A[i, k]", A=(4, 8))
    with pytest.raises(IllegalSchedule, match=message):
        T.rfactor(initial_schedule(k), "Y", dim, factor)


def test_rfactor_must_come_before_loop_transformations() -> None:
    k = kernel("Y[i] += A[i, k]", A=(4, 8))
    split = T.split(initial_schedule(k), "i", [None, 2])
    with pytest.raises(IllegalSchedule, match="before any loop transformation"):
        T.rfactor(split, "Y", "k", 2)
