"""Property tests: random traces of transformations (illegal draws are rejected by the poly
layer, as the search will see them) keep every kernel's results, checked with the AST
interpreter against the untransformed kernel and numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from polytile.errors import IllegalSchedule, UnsupportedOpError
from polytile.frontend import import_model, optimize, partition
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Loop, Schedule, initial_schedule, statements_below
from polytile.poly.lower import lower
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T

from kernels import mm_relu, random_inputs, softmax_rows, stencil


def draw_step(data: st.DataObject, schedule: Schedule) -> Schedule:
    """One random transformation; IllegalSchedule propagates (the caller skips it)."""
    loops = schedule.loop_names()
    stmts = [s.name for s in schedule.kernel.statements]
    kind = data.draw(
        st.sampled_from(
            [
                "split",
                "reorder",
                "compute_at",
                "reverse_compute_at",
                "decompose_reduction",
                "parallel",
                "vectorize",
                "unroll",
                "fuse",
            ]
        )
    )
    loop = data.draw(st.sampled_from(loops))
    if kind == "split":
        factor = data.draw(st.integers(2, 5))
        return T.split(schedule, loop, (None, factor))
    if kind in ("reorder", "fuse"):
        target = schedule.loop(loop)
        chain = [loop]
        while len(target.body) == 1 and isinstance(target.body[0], Loop):
            target = target.body[0]
            chain.append(target.name)
        if len(chain) < 2:
            raise IllegalSchedule("no chain")
        if kind == "fuse":
            return T.fuse(schedule, *chain[:2])
        order = data.draw(st.permutations(chain))
        return T.reorder(schedule, *order)
    if kind in ("compute_at", "reverse_compute_at"):
        stmt = data.draw(st.sampled_from(stmts))
        fn = T.compute_at if kind == "compute_at" else T.reverse_compute_at
        return fn(schedule, stmt, loop)
    if kind == "decompose_reduction":
        reductions = [s.name for s in schedule.kernel.statements if s.reduction]
        if not reductions:
            raise IllegalSchedule("no reduction")
        stmt = data.draw(st.sampled_from(reductions))
        inner = [lp.name for lp in schedule.loops_of(stmt)]
        return T.decompose_reduction(schedule, stmt, data.draw(st.sampled_from(inner)))
    return {"parallel": T.parallel, "vectorize": T.vectorize, "unroll": T.unroll}[kind](
        schedule, loop
    )


def check_random_trace(
    data: st.DataObject, kernel: Kernel, inputs: dict | None = None, want: dict | None = None
) -> None:
    """A random trace on `kernel` gives the outputs of its program order (`want`), on
    `inputs` (by default seeded random ones)."""
    if inputs is None:
        inputs = random_inputs(kernel)
    if want is None:
        want = run_program_order(kernel, inputs)
    schedule = initial_schedule(kernel)
    for _ in range(data.draw(st.integers(1, 6))):
        try:
            schedule = draw_step(data, schedule)
        except IllegalSchedule:
            continue
    assert sorted(s for n in schedule.body for s in statements_below(n)) == sorted(
        s.name for s in kernel.statements
    )
    replayed = T.replay(kernel, schedule.trace_json())
    assert replayed.body == schedule.body
    got = run_schedule(schedule, inputs)
    for t in kernel.outputs():
        assert got[t.name].shape == want[t.name].shape
        assert got[t.name].dtype == want[t.name].dtype
        np.testing.assert_allclose(
            got[t.name], want[t.name], rtol=1e-4, atol=1e-5, err_msg=str(schedule.trace_json())
        )


def one_node_kernel(
    node: onnx.NodeProto, inputs: dict[str, tuple], inits: dict, opset: int = 17
) -> Kernel:
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    g = optimize(import_model(model))
    (group,) = partition(g).groups
    return lower(g, group)


def onnx_kernels() -> dict[str, Kernel]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    specs = {
        "conv": (
            helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1]),
            {"x": (1, 2, 5, 6)},
            {"w": w},
        ),
        "maxpool": (
            helper.make_node(
                "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]
            ),
            {"x": (1, 2, 6, 6)},
            {},
        ),
        "layernorm": (
            helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"]),
            {"x": (3, 8)},
            {
                "s": rng.standard_normal(8).astype(np.float32),
                "b": rng.standard_normal(8).astype(np.float32),
            },
        ),
        "softmax": (helper.make_node("Softmax", ["x"], ["y"], axis=-1), {"x": (3, 7)}, {}),
        "matmul": (
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            {"x": (2, 5, 4)},
            {"w": rng.standard_normal((4, 6)).astype(np.float32)},
        ),
    }
    out = {}
    for name, (node, inputs, inits) in specs.items():
        try:
            out[name] = one_node_kernel(node, inputs, inits)
        except UnsupportedOpError:
            continue
    return out


HAND = {"mm_relu": mm_relu(6, 8, 4), "softmax": softmax_rows(3, 9), "stencil": stencil(13)}
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", sorted(HAND))
@SETTINGS
@given(data=st.data())
def test_random_traces_on_hand_kernels(name: str, data: st.DataObject) -> None:
    check_random_trace(data, HAND[name])


ONNX = onnx_kernels()


@pytest.mark.parametrize("name", sorted(ONNX))
@SETTINGS
@given(data=st.data())
def test_random_traces_on_lowered_onnx_kernels(name: str, data: st.DataObject) -> None:
    check_random_trace(data, ONNX[name])
