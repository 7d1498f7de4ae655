"""Rows reduced along their contiguous dim (softmax, norms, ReduceMax over the last
axis): the default schedule vectorizes the row and reduces its lanes into the row's
element, computes each row's statements inside one row loop (a reduction moved there
takes its init along), computes softmax's exponentials once, and streams an
elementwise prologue read once per point (x² of an RMS norm) into the sum. Each schedule
is checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from polytile.codegen.native import NativeKernel
from polytile.poly.default.decide import default_decisions
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.default.sketch import Sketch
from polytile.poly.default.steps import default_inlines, main_statement
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.expr import walk
from polytile.poly.ir.kernel import Role
from polytile.poly.ir.schedule import initial_schedule, loop_dims, statements_below
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.transform import steps as T

CONFIG = DefaultConfig(vector_width=16, threads=2)


def test_a_reduction_moved_into_a_loop_takes_its_init_along() -> None:
    """S's init is a nest of its own after M's: moved alone, S would run before it."""
    k = kernel("M[i] max= X[i, j]", "S[i] += exp(X[i, j] - M[i])", X=(8, 40))
    schedule = T.reverse_compute_at(initial_schedule(k), "S", "i")
    row = schedule.loop("i")
    assert statements_below(row) == ["M", "S_init", "S"]
    assert [s.kind for s in schedule.trace] == ["reverse_compute_at"]
    x = np.random.default_rng(0).standard_normal((8, 40)).astype(np.float32)
    got = run_schedule(schedule, {"X": x})["S"]
    np.testing.assert_allclose(got, np.exp(x - x.max(1, keepdims=True)).sum(1), rtol=1e-5)
    replayed = T.replay(k, schedule.trace)
    assert statements_below(replayed.loop("i")) == ["M", "S_init", "S"]


@pytest.mark.parametrize(
    ("op", "reference"),
    [
        ("ReduceMax", lambda x: x.max(-1, keepdims=True)),
        ("ReduceSum", lambda x: x.sum(-1, keepdims=True)),
        ("ReduceMean", lambda x: x.mean(-1, keepdims=True)),
    ],
)
@pytest.mark.parametrize("columns", [16, 37, 384])
def test_a_row_reduction_vectorizes_its_row(op: str, reference, columns: int) -> None:
    inputs = ["x", "a"] if op == "ReduceSum" else ["x"]
    attrs = {} if op == "ReduceSum" else {"axes": [-1]}
    consts = {"a": np.array([-1], np.int64)} if op == "ReduceSum" else None
    node = helper.make_node(op, inputs, ["y"], **attrs)
    k = kernel_from_node(node, {"x": (3, 5, columns)}, initializers=consts)
    schedule = default_schedule(k, CONFIG)
    main = main_statement(schedule.kernel)
    (vector,) = [lp for lp in schedule.loops_of(main.name) if lp.annotation == "vector"]
    assert set(loop_dims(vector, main.name, main.dims)) <= set(main.reduction_dims)
    x = np.random.default_rng(columns).standard_normal((3, 5, columns)).astype(np.float32)
    (got,) = NativeKernel(schedule).outputs({"x": x}).values()
    np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-6)


def test_a_column_reduction_keeps_its_vectors_along_the_row() -> None:
    """Reduced down its columns, the contiguous dim is an output dim: its vectors stay."""
    k = kernel("Y[j] += X[i, j]", X=(40, 64))
    schedule = default_schedule(k, CONFIG)
    (vector,) = [lp for lp in schedule.loops_of("Y") if lp.annotation == "vector"]
    assert vector.name.startswith("j")


def test_a_matrix_product_with_a_transposed_operand_keeps_its_register_tile() -> None:
    """A·Bᵀ reads both rows contiguously along k, but reuses each row for many outputs:
    no lane reduction, the output's columns in vectors."""
    k = kernel("C[i, j] += A[i, k] * B[j, k]", A=(40, 64), B=(48, 64))
    schedule = default_schedule(k, CONFIG)
    (vector,) = [lp for lp in schedule.loops_of("C") if lp.annotation == "vector"]
    assert vector.name.startswith("j")


def test_softmax_computes_each_exponential_once_in_one_row_loop() -> None:
    k = kernel_from_node(helper.make_node("Softmax", ["x"], ["y"], axis=-1), {"x": (64, 100)})
    schedule = default_schedule(k, DefaultConfig(vector_width=16, threads=2, min_parallel_work=0))
    exprs = [e for s in schedule.kernel.statements for e in walk(s.expr)]
    exps = [e for e in exprs if getattr(e, "op", None) == "exp"]
    assert len(exps) == 1
    (nest,) = schedule.body  # one parallel row loop holds every statement
    assert nest.annotation == "parallel"
    x = (np.random.default_rng(1).standard_normal((64, 100)) * 3).astype(np.float32)
    (got,) = NativeKernel(schedule).outputs({"x": x}).values()
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=2e-6, atol=1e-9)


def test_a_prologue_read_once_per_point_streams_into_the_sum() -> None:
    """x² summed along the row is inlined into the sum; exp(A) read by a matrix product
    (once per output column) is not: it would be computed again for each."""
    rms = kernel("Q[i, j] = X[i, j] * X[i, j]", "S[i] += Q[i, j]", X=(8, 40))
    assert default_inlines(rms, rms.statement["S"]) == ["Q"]
    mm = kernel("P[i, k] = exp(A[i, k])", "C[i, j] += P[i, k] * B[k, j]", A=(8, 16), B=(16, 32))
    assert default_inlines(mm, mm.statement["C"]) == []
    schedule = default_schedule(rms, CONFIG)
    x = np.random.default_rng(2).standard_normal((8, 40)).astype(np.float32)
    got = NativeKernel(schedule).outputs({"X": x})["S"]
    np.testing.assert_allclose(got, (x * x).sum(1), rtol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "ReduceMean"])
def test_random_decisions_with_the_lane_loop_build_legal_schedules(op: str) -> None:
    """The search may pick the row's reduction loop as the vector loop with any other
    decision: each set builds a schedule (illegal steps skipped) that computes the
    kernel's results."""
    attrs = {"axis": -1} if op == "Softmax" else {"axes": [-1]}
    k = kernel_from_node(helper.make_node(op, ["x"], ["y"], **attrs), {"x": (6, 40)})
    sketch = Sketch(k, CONFIG)
    assert sketch.lane_loop is not None
    choices = sketch.structure_choices()
    assert sketch.lane_loop in choices["vec_loop"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 40)).astype(np.float32)
    want = run_schedule(initial_schedule(k), {"x": x})
    for _ in range(12):
        d = default_decisions(sketch)
        d.update({name: options[rng.integers(len(options))] for name, options in choices.items()})
        d["vec_loop"] = sketch.lane_loop
        schedule = sketch.apply(d)
        got = run_schedule(schedule, {"x": x})
        for name, t in k.tensors.items():
            if t.role is Role.OUTPUT:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
