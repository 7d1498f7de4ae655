"""`check_vectorizable` against the dependences it reads: a vector loop may carry only a
reduction into an element all its iterations share, and a refusal reads as
`check_not_carried`'s (the two share their work on the loop's instance pairs)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from polytile.errors import IllegalSchedule
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import (
    carried,
    check_not_carried,
    check_vectorizable,
    initial_schedule,
)

from kernels import mm_relu, prefix_sum, softmax_rows, stencil


def _refusal(check: Callable[..., object], *args: object) -> str | None:
    try:
        check(*args)
    except IllegalSchedule as err:
        return str(err)
    return None


@pytest.mark.parametrize("kernel", [mm_relu(), softmax_rows(), stencil(), prefix_sum()])
def test_vector_refusals_follow_the_carried_dependences(kernel: Kernel) -> None:
    schedule = initial_schedule(kernel)
    for loop, _ in schedule.loops():
        refused = _refusal(check_vectorizable, schedule, loop.name, "vectorize")
        if not carried(schedule, loop.name, include_reductions=False).is_empty():
            assert refused is not None, loop.name
        if refused is not None:
            assert refused == _refusal(check_not_carried, schedule, loop.name, "vectorize")
        elif carried(schedule, loop.name).is_empty():
            assert _refusal(check_not_carried, schedule, loop.name, "vectorize") is None


def test_a_shared_accumulator_vectorizes_and_a_running_sum_does_not() -> None:
    matmul = initial_schedule(mm_relu())
    (k,) = [lp.name for lp in matmul.loops_of("Y") if lp.name not in ("i", "j")]
    assert not carried(matmul, k).is_empty()  # the reduction into Y[i, j] along k
    check_vectorizable(matmul, k, "vectorize")
    scan = initial_schedule(prefix_sum())
    (loop,) = [lp.name for lp in scan.loops_of("P")]
    with pytest.raises(IllegalSchedule, match="carries the dependence"):
        check_vectorizable(scan, loop, "vectorize")
