"""Inlining of elementwise / injective producers: the inlined kernel computes what numpy
and the materialized kernel compute (in program order, under the AST interpreter and as
native code), its step replays from JSON, and illegal requests name the statement."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from onnx import helper

from polytile.codegen.native import NativeKernel
from polytile.errors import IllegalSchedule
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.expr import Select, loads, walk
from polytile.poly.ir.kernel import Kernel, Role, Tensor
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T
from polytile.poly.transform.inline import inline, inline_statement

from kernels import conv2d, float_model

RNG = np.random.default_rng(0)


def producers(k: Kernel, tensor: str) -> list[str]:
    return [s.name for s in k.statements if s.tensor == tensor]


def check(original: Kernel, inlined: Kernel, inputs: dict, want: np.ndarray) -> None:
    """The inlined kernel against numpy and the materialized kernel: in program order, under
    the interpreter (its default schedule) and natively; shape and dtype before values."""
    (out,) = [t.name for t in original.outputs()]
    materialized = run_program_order(original, inputs)[out]
    schedule = default_schedule(inlined, DefaultConfig(vector_width=8))
    runs = {
        "program order": run_program_order(inlined, inputs)[out],
        "interpreter": run_schedule(schedule, inputs, order="shuffle")[out],
        "native": NativeKernel(schedule)(inputs)[out],
        "native materialized": NativeKernel(default_schedule(original))(inputs)[out],
    }
    for name, got in runs.items():
        assert got.shape == want.shape, name
        assert got.dtype == np.float32, name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    np.testing.assert_array_equal(runs["program order"], materialized)


def pad_conv(value: float) -> tuple[Kernel, dict, np.ndarray, np.ndarray]:
    x = RNG.standard_normal((1, 3, 6, 7)).astype(np.float32)
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    pads = np.array([0, 0, 1, 2, 0, 0, 1, 0], dtype=np.int64)  # top 1, left 2, bottom 1
    constants = {"pads": pads, "w": w, "v": np.array(value, dtype=np.float32)}
    nodes = [
        helper.make_node("Pad", ["x", "pads", "v"], ["p"]),
        helper.make_node("Conv", ["p", "w"], ["y"]),
    ]
    k = kernel_from_node(float_model(nodes, {"x": x.shape}, constants))
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 0)), constant_values=value)
    return k, {"x": x}, w, padded


@pytest.mark.parametrize("value", [0.0, 1.5])
def test_pad_into_conv(value: float) -> None:
    k, inputs, w, padded = pad_conv(value)
    pieces = producers(k, "p")
    assert len(pieces) == 2  # the interior copy and the border
    inlined = inline(k, pieces[0])
    assert "p" not in inlined.tensors
    assert not set(pieces) & set(inlined.statement)
    (conv,) = [s for s in inlined.statements if s.reduction]
    assert any(isinstance(e, Select) for e in walk(conv.expr))
    assert {ld.tensor for ld in loads(conv.expr)} >= {"x"}
    check(k, inlined, inputs, conv2d(padded, w))


def test_pad_into_conv_gives_the_pad_value_at_the_border() -> None:
    """A weight that picks the window's top-left tap copies the padded input: the border
    rows and columns hold exactly the pad value, the rest exactly x."""
    k, inputs, _, padded = pad_conv(2.5)
    delta = np.zeros((8, 3, 3, 3), dtype=np.float32)
    delta[:, 0, 0, 0] = 1.0
    weight = next(t.name for t in k.tensors.values() if t.source == "w")
    tensors = dict(k.tensors)
    tensors[weight] = Tensor(weight, delta.shape, "float32", Role.CONSTANT, delta, source="w")
    k = Kernel(k.name, tensors, k.statements)
    inlined = inline(k, producers(k, "p")[0])
    got = NativeKernel(default_schedule(inlined))(inputs)["y"]
    assert got.shape == (1, 8, 6, 7) and got.dtype == np.float32
    np.testing.assert_array_equal(got[:, :, 0, :], 2.5)
    np.testing.assert_array_equal(got[:, :, :, :2], 2.5)
    np.testing.assert_array_equal(got, np.repeat(padded[:, :1, :6, :7], 8, axis=1))


def test_transpose_into_matmul() -> None:
    a = RNG.standard_normal((6, 5)).astype(np.float32)
    b = RNG.standard_normal((6, 7)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["a"], ["at"], perm=[1, 0]),
        helper.make_node("MatMul", ["at", "b"], ["y"]),
    ]
    k = kernel_from_node(float_model(nodes, {"a": a.shape}, {"b": b}))
    inlined = inline(k, producers(k, "at")[0])
    (mm,) = [s for s in inlined.statements if s.reduction]
    assert [ld.tensor for ld in loads(mm.expr)] == ["a", "b"]
    assert not any(isinstance(e, Select) for e in walk(mm.expr))  # one piece: no guard
    check(k, inlined, {"a": a}, (a.T.astype(np.float64) @ b).astype(np.float32))


def test_sub_mul_chain_into_matmul() -> None:
    a = RNG.standard_normal((5, 9)).astype(np.float32)
    mean = RNG.standard_normal((9,)).astype(np.float32)
    scale = RNG.standard_normal((9,)).astype(np.float32)
    b = RNG.standard_normal((9, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Sub", ["a", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "scale"], ["s"]),
        helper.make_node("MatMul", ["s", "b"], ["y"]),
    ]
    k = kernel_from_node(float_model(nodes, {"a": a.shape}, {"mean": mean, "scale": scale, "b": b}))
    first, second = producers(k, "d")[0], producers(k, "s")[0]
    want = ((a - mean) * scale).astype(np.float64) @ b
    for order in ((first, second), (second, first)):
        inlined = k
        for stmt in order:
            inlined = inline(inlined, stmt)
        assert len(inlined.statements) == 2  # the matmul and its init
        check(k, inlined, {"a": a}, want.astype(np.float32))


@pytest.mark.parametrize("which", ["mul", "relu", "both"])
def test_elementwise_chain_into_padded_conv(which: str) -> None:
    """BN-like scale, ReLU, then a conv with its own padding: one or both inlined."""
    x = RNG.standard_normal((1, 4, 5, 6)).astype(np.float32)
    s = RNG.standard_normal((4, 1, 1)).astype(np.float32)
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["f"]),
        helper.make_node("Relu", ["f"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    k = kernel_from_node(float_model(nodes, {"x": x.shape}, {"s": s, "w": w}))
    chosen = {"mul": ["f"], "relu": ["r"], "both": ["f", "r"]}[which]
    inlined = k
    for tensor in chosen:
        inlined = inline(inlined, producers(k, tensor)[0])
    assert not set(chosen) & set(inlined.tensors)
    r = np.maximum(x * s, 0)
    want = conv2d(np.pad(r, ((0, 0), (0, 0), (1, 1), (1, 1))), w).astype(np.float32)
    check(k, inlined, {"x": x}, want)


def test_reversed_and_shifted_index_inverts_exactly() -> None:
    k = kernel(
        "T[3 - i, j + 2] = A[i, j] * 2",
        "Y[i, j] = T[i, j + 2] + 1",
        A=(4, 3),
        shapes={"T": (4, 5)},
        extents={"j": 3},
    )
    inlined = inline(k, "T")
    assert [ld.tensor for s in inlined.statements for ld in loads(s.expr)] == ["A"]
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    got = run_program_order(inlined, {"A": a})["Y"]
    assert got.shape == (4, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, a[::-1] * 2 + 1)
    np.testing.assert_array_equal(got, run_program_order(k, {"A": a})["Y"])


def test_step_keeps_the_other_loops_and_replays_from_json() -> None:
    k, inputs, w, padded = pad_conv(0.0)
    base = initial_schedule(k)
    conv = next(s.name for s in k.statements if s.reduction)
    loops = [lp.name for lp in base.loops_of(conv)]
    schedule = inline_statement(base, producers(k, "p")[0])
    assert [lp.name for lp in schedule.loops_of(conv)] == loops
    schedule = T.split(schedule, loops[1], [None, 4])
    schedule = T.parallel(schedule, f"{loops[1]}0")
    trace = json.loads(json.dumps(schedule.trace_json()))
    assert trace[0] == {"kind": "inline", "args": {"stmt": producers(k, "p")[0]}}
    replayed = T.replay(k, trace)
    assert replayed.body == schedule.body
    assert replayed.kernel.workload_key() == schedule.kernel.workload_key()
    got = run_schedule(replayed, inputs, order="shuffle")["y"]
    assert got.shape == (1, 8, 6, 7) and got.dtype == np.float32
    np.testing.assert_allclose(got, conv2d(padded, w), rtol=1e-4, atol=1e-4)


def test_step_after_loop_transformations() -> None:
    """A producer computed inside its consumer's loop is inlined from there."""
    k = kernel("T[i, j] = A[j, i] * 2", "Y[i] += T[i, k] + 1", A=(6, 4))
    schedule = T.compute_at(initial_schedule(k), "T", "i_1")
    schedule = inline_statement(schedule, "T")
    assert set(schedule.kernel.statement) == {"Y_init", "Y"}
    a = RNG.standard_normal((6, 4)).astype(np.float32)
    got = run_schedule(schedule, {"A": a})["Y"]
    assert got.shape == (4,) and got.dtype == np.float32
    np.testing.assert_allclose(got, (a.T * 2 + 1).sum(axis=1), rtol=1e-5)


TEMP8 = {"shapes": {"T": (8,)}}


@pytest.mark.parametrize(
    ("statements", "tensors", "stmt", "message"),
    [
        (["S[i] += A[i, k]", "Y[i] = S[i] * 2"], {"A": (3, 4)}, "S", "is a reduction"),
        (["S[i] += A[i, k]", "Y[i] = S[i] * 2"], {"A": (3, 4)}, "S_init", "is an init"),
        (["T[i] = A[i] * 2 if i < 4", "Y[i] = T[i] + 1"], {"A": (8,), **TEMP8}, "T", "outside"),
        (["T[2 * i] = A[i]", "Y[i] = T[i] + 1"], {"A": (4,), **TEMP8}, "T", "does not invert"),
        (["T[i] = A[i, j]", "Y[i] = T[i] + 1"], {"A": (3, 4)}, "T", "not in its index"),
        (["T[i] = A[i] * 2", "Y[i] = T[i] + 1"], {"A": (4,)}, "Y", "not a temporary"),
        (["T[i] = A[i] * 2", "Y[i] = T[i] + 1"], {"A": (4,)}, "Z", "no statement"),
    ],
    ids=["reduction", "init", "outside", "not-invertible", "dim-dropped", "output", "unknown"],
)
def test_refusals_name_the_statement(
    statements: list[str], tensors: dict, stmt: str, message: str
) -> None:
    k = kernel(*statements, **tensors)
    with pytest.raises(IllegalSchedule, match=rf"kernel {k.name}: inline\({stmt}\): .*{message}"):
        inline(k, stmt)
    with pytest.raises(IllegalSchedule, match=rf"inline\({stmt}\)"):
        T.apply_step(initial_schedule(k), T.Step("inline", {"stmt": stmt}))


def test_default_schedule_inlines_an_elementwise_chain_before_a_matmul() -> None:
    """GELU's divide, erf, add and multiplies before a MatMul become one pass: each
    temporary read once by the next elementwise statement is inlined; the last one, which
    the MatMul reads, stays (inlined into the reduction it would be computed per column)."""
    a = RNG.standard_normal((6, 40)).astype(np.float32)
    b = RNG.standard_normal((40, 24)).astype(np.float32)
    consts = {n: np.array(v, np.float32) for n, v in (("c", 1.4142135), ("one", 1), ("h", 0.5))}
    nodes = [
        helper.make_node("Div", ["a", "c"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["f"]),
        helper.make_node("Mul", ["a", "f"], ["g"]),
        helper.make_node("Mul", ["g", "h"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "b"], ["y"]),
    ]
    k = kernel_from_node(float_model(nodes, {"a": a.shape}, {**consts, "b": b}))
    schedule = default_schedule(k, DefaultConfig(vector_width=8))
    inlined = {s.args["stmt"] for s in schedule.trace if s.kind == "inline"}
    assert inlined == {producers(k, t)[0] for t in ("d", "e", "f", "g")}
    assert "gelu" in schedule.kernel.tensors
    x = a.astype(np.float64)
    erf = np.vectorize(math.erf)
    want = (0.5 * x * (1 + erf(x / 1.4142135))) @ b
    got = NativeKernel(schedule)({"a": a})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_default_schedule_inlines_a_chain_into_an_elementwise_main_statement() -> None:
    """SiLU as its own kernel (its output also feeds a squeeze-excitation pool): the
    sigmoid's temporary, read once by the multiply over as many points, is inlined into
    it, one pass over memory instead of two, and the values match numpy."""
    k = kernel("S[i, j] = sigmoid(A[i, j])", "Y[i, j] = A[i, j] * S[i, j]", A=(6, 40))
    schedule = default_schedule(k, DefaultConfig(vector_width=8))
    assert [s.args["stmt"] for s in schedule.trace if s.kind == "inline"] == [
        producers(k, "S")[0]
    ]
    assert "S" not in schedule.kernel.tensors
    a = RNG.standard_normal((6, 40)).astype(np.float32)
    got = NativeKernel(schedule)({"A": a})["Y"]
    np.testing.assert_allclose(got, a / (1 + np.exp(-a)), rtol=1e-5, atol=1e-6)


def test_default_schedule_keeps_a_temporary_read_twice_or_broadcast() -> None:
    """Inlining a temporary read by two loads, or into a reader over more points, would
    compute it again for each: the default schedule keeps both."""
    k = kernel(
        "R[i, j] = A[i, j] * 3",
        "S[i] = A[i, 0] + 1",
        "Y[i, j] = R[i, j] * R[i, j] + S[i]",
        A=(5, 16),
    )
    assert {t.name for t in k.tensors.values() if t.role is Role.TEMP} == {"R", "S"}
    schedule = default_schedule(k, DefaultConfig(vector_width=8))
    assert not [s for s in schedule.trace if s.kind == "inline"]


def test_a_matmul_over_a_loop_that_runs_once_blocks_the_batch_rows() -> None:
    """[50, 1, 64] x [64, 48] (a sequence-first activation times weights): the register
    block is over the 50 batch rows, which share the weights, not over the single row."""
    a = RNG.standard_normal((50, 1, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 48)).astype(np.float32)
    k = kernel_from_node(
        float_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a.shape}, {"b": b})
    )
    schedule = default_schedule(k, DefaultConfig(vector_width=8))
    (mm,) = [s for s in k.statements if s.reduction]
    batch = schedule.kernel.statement[mm.name].dims[0]
    unrolled = [s.args["loop"] for s in schedule.trace if s.kind == "unroll"]
    assert unrolled and all(loop.startswith(batch) for loop in unrolled)
    got = NativeKernel(schedule)({"a": a})["y"]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
