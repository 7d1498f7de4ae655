"""Canonical names make identical groups one workload; a schedule transplanted onto an
identical kernel with other weights computes that kernel's result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile.frontend import import_model, optimize, partition
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.ir.kernel import Role
from polytile.poly.lower import lower
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform.canonical import canonicalize, transplant


def two_identical_convs() -> list:
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((4, 4, 3, 3)).astype(np.float32) for _ in range(2))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "twins",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = optimize(import_model(model))
    return [lower(g, group) for group in partition(g).groups]


def test_identical_groups_share_a_workload_key() -> None:
    first, second = two_identical_convs()
    assert first.workload_key() != second.workload_key()  # names differ
    (a, names), (b, _) = canonicalize(first), canonicalize(second)
    assert a.workload_key() == b.workload_key()
    assert set(names) == set(first.tensors) | {s.name for s in first.statements}
    assert [t.source for t in a.tensors.values()] == [t.source for t in first.tensors.values()]


def test_transplanted_schedule_computes_the_other_kernel() -> None:
    first, second = (canonicalize(k)[0] for k in two_identical_convs())
    schedule = default_schedule(first, DefaultConfig(vector_width=4))
    moved = transplant(schedule, second)
    assert moved.body == schedule.body and moved.trace == schedule.trace
    packed = [t for t in moved.kernel.tensors.values() if t.role is Role.CONSTANT]
    assert packed and all(t.value is not None for t in packed)
    rng = np.random.default_rng(1)
    inputs = {
        t.name: rng.standard_normal(t.shape).astype(t.dtype)
        for t in second.tensors.values()
        if t.role is Role.INPUT
    }
    got = run_schedule(moved, inputs)
    want = run_program_order(second, inputs)
    for t in second.outputs():
        np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-5, atol=1e-5)


def test_transplant_refuses_another_structure() -> None:
    first, _ = (canonicalize(k)[0] for k in two_identical_convs())
    from polytile.poly.dsl import kernel

    other, _ = canonicalize(kernel("Y[i] = A[i] * 2", A=(4,)))
    with pytest.raises(ValueError, match="another structure"):
        transplant(default_schedule(first), other)
