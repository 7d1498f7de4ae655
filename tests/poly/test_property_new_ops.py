"""Random legal transformation traces on the kernels of CumSum (a running sum: a dependence
carried along the scanned axis, forward or reversed), ReduceLogSumExp, ArgMin,
GroupNormalization (group-indexed statistics), RMSNormalization, Hardmax, DepthToSpace and
RotaryEmbedding (pieces cut by quasi-affine constraints) keep their results: the AST
interpreter against program order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper
from test_property import SETTINGS, check_random_trace, one_node_kernel

from polytile.errors import IllegalSchedule
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.transform import steps as T

RNG = np.random.default_rng(3)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def kernels() -> dict[str, Kernel]:
    node = helper.make_node
    specs = {
        "cumsum": (
            node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1),
            {"x": (5, 3)},
            {"axis": np.array(0, np.int64)},
            17,
        ),
        "cumsum_inner": (
            node("CumSum", ["x", "axis"], ["y"]),
            {"x": (2, 3, 5)},
            {"axis": np.array(-1, np.int64)},
            17,
        ),
        "logsumexp": (
            node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0),
            {"x": (3, 4, 5)},
            {"axes": np.array([0, 2], np.int64)},
            18,
        ),
        "argmin": (
            node("ArgMin", ["x"], ["y"], axis=1, select_last_index=1),
            {"x": (4, 6)},
            {},
            17,
        ),
        "groupnorm": (
            node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2),
            {"x": (2, 4, 3)},
            {"s": _f32(4), "b": _f32(4)},
            21,
        ),
        "rmsnorm": (
            node("RMSNormalization", ["x", "s"], ["y"], axis=1),
            {"x": (3, 2, 4)},
            {"s": _f32(2, 4)},
            23,
        ),
        "hardmax": (node("Hardmax", ["x"], ["y"], axis=0), {"x": (5, 3)}, {}, 17),
        "depthtospace": (
            node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD"),
            {"x": (1, 8, 2, 3)},
            {},
            17,
        ),
        "rotary": (
            node("RotaryEmbedding", ["x", "c", "s"], ["y"], interleaved=1),
            {"x": (1, 2, 3, 4)},
            {"c": _f32(1, 3, 2), "s": _f32(1, 3, 2)},
            23,
        ),
    }
    return {
        name: one_node_kernel(n, inputs, inits, opset)
        for name, (n, inputs, inits, opset) in specs.items()
    }


KERNELS = kernels()


@pytest.mark.parametrize("name", sorted(KERNELS))
@SETTINGS
@given(data=st.data())
def test_random_traces_on_new_op_kernels(name: str, data: st.DataObject) -> None:
    check_random_trace(data, KERNELS[name])


@pytest.mark.parametrize("name", ["cumsum", "cumsum_inner"])
def test_the_scan_step_loop_stays_sequential(name: str) -> None:
    """The running sum reads the element it wrote one step before: neither a parallel nor
    a vector mark may go on its step loop, while its other loops may run in parallel."""
    kernel = KERNELS[name]
    scan = next(s for s in kernel.statements if any(ld.tensor == s.tensor for ld in loads(s.expr)))
    schedule = initial_schedule(kernel)
    loops = [lp.name for lp in schedule.loops_of(scan.name)]
    step = next(lp for lp in loops if lp.startswith("s"))
    with pytest.raises(IllegalSchedule, match="carries the dependence"):
        T.parallel(schedule, step)
    innermost = T.reorder(schedule, *[lp for lp in loops if lp != step], step)
    with pytest.raises(IllegalSchedule, match="carries the dependence"):
        T.vectorize(innermost, step)
    for other in loops:
        if other != step:
            T.parallel(schedule, other)
