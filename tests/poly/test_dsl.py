"""Hand-written kernels in the tensor-expression notation (`poly.dsl.kernel`) and kernels
of single ONNX nodes (`kernel_from_node`), run with the program-order executor and the
AST interpreter against numpy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polytile.errors import InputError, UnsupportedOpError
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.expr import Load
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order

from kernels import mm_relu, random_inputs

MM_RELU = ("Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)")


def _run(k: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Program order and the interpreter agree bit for bit; returns the buffers."""
    want = run_program_order(k, inputs)
    got = run_schedule(initial_schedule(k), inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    return want


def _close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


def test_mm_relu() -> None:
    k = kernel(*MM_RELU, A=(4, 5), B=(5, 3), name="mm_relu")
    assert k.name == "mm_relu"
    assert [s.name for s in k.statements] == ["Y_init", "Y", "C"]
    init, red, relu = k.statements
    assert init.init_of == "Y" and init.dims == ("i", "j") and init.expr.value == 0
    assert red.reduction == "sum" and red.dims == ("i", "j", "k") and red.reduction_dims == ("k",)
    assert relu.reduction is None and relu.dims == ("i", "j")
    roles = {n: (t.shape, t.role) for n, t in k.tensors.items()}
    assert roles == {
        "A": ((4, 5), Role.INPUT),
        "B": ((5, 3), Role.INPUT),
        "Y": ((4, 3), Role.TEMP),
        "C": ((4, 3), Role.OUTPUT),
    }
    inputs = random_inputs(k)
    out = _run(k, inputs)["C"]
    _close(out, np.maximum(inputs["A"] @ inputs["B"], 0))


def test_mm_relu_is_the_hand_built_kernel() -> None:
    """The notation builds exactly the kernel written out by hand in tests/poly/kernels.py."""
    k = kernel(*MM_RELU, A=(8, 8), B=(8, 8), name="mm_relu")
    hand = mm_relu(8, 8, 8)
    assert k.statements == hand.statements
    assert k.workload_key() == hand.workload_key()


def test_elementwise_broadcasting_and_dtype() -> None:
    k = kernel("C[i, j] = A[i, j] * 2 + b[j] - 1", A=(3, 4), b=(4,), dtype="float64")
    assert k.tensors["C"].dtype == "float64"
    assert k.statements[0].expr.dtype == "float64"
    x = random_inputs(k)
    _close(_run(k, x)["C"], x["A"] * 2 + x["b"] - 1)


def test_max_and_min_reductions() -> None:
    k = kernel("M[i] max= X[i, j]", "N[i] min= X[i, j]", X=(3, 5))
    assert [s.name for s in k.statements] == ["M_init", "M", "N_init", "N"]
    assert k.statements[0].expr.value == -np.inf and k.statements[2].expr.value == np.inf
    assert k.statements[1].reduction == "max" and k.statements[3].reduction == "min"
    x = random_inputs(k)
    out = _run(k, x)
    _close(out["M"], x["X"].max(axis=1))
    _close(out["N"], x["X"].min(axis=1))


def test_max_reduction_over_a_window_with_extents() -> None:
    """2-wide max pooling: r has no tensor to take its extent from, so it is given."""
    k = kernel("P[i] max= X[2*i + r]", X=(8,), P=(4,), extents={"r": 2})
    assert k.statements[1].dims == ("i", "r")
    x = random_inputs(k)
    _close(_run(k, x)["P"], x["X"].reshape(4, 2).max(axis=1))


def test_softmax_three_stages() -> None:
    k = kernel(
        "M[i] max= X[i, j]",
        "S[i] += exp(X[i, j] - M[i])",
        "Y[i, j] = exp(X[i, j] - M[i]) / S[i]",
        X=(3, 6),
    )
    assert [t.role for t in k.tensors.values()] == [Role.INPUT, Role.TEMP, Role.TEMP, Role.OUTPUT]
    x = random_inputs(k)["X"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    _close(_run(k, {"X": x})["Y"], e / e.sum(axis=1, keepdims=True))


@pytest.mark.parametrize(
    ("text", "shapes", "fn"),
    [
        ("U[i, j] = X[i, j // 2]", {"X": (3, 4), "U": (3, 8)}, lambda x: np.repeat(x, 2, axis=1)),
        ("D[i // 2] += X[i]", {"X": (8,), "D": (4,)}, lambda x: x.reshape(4, 2).sum(axis=1)),
        ("R[i] = X[i % 3]", {"X": (3,), "R": (7,)}, lambda x: np.tile(x, 3)[:7]),
        (
            "R[i] = X[(i + 1) // 2 - i // 2]",
            {"X": (2,), "R": (5,)},
            lambda x: x[[0, 1, 0, 1, 0]],
        ),
        ("T[j, i] = X[i, j]", {"X": (2, 3)}, lambda x: x.T),
        ("F[i] = X[-i + 4]", {"X": (5,), "F": (5,)}, lambda x: x[::-1]),
    ],
)
def test_affine_indices(text: str, shapes: dict, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    k = kernel(text, **shapes)
    x = random_inputs(k)["X"]
    out = [t for t in k.tensors.values() if t.role is Role.OUTPUT]
    assert len(out) == 1
    _close(_run(k, {"X": x})[out[0].name], fn(x))


def test_floor_division_index_text() -> None:
    k = kernel("D[i // 2, j] += X[i, j % 3 + 3 * (j // 3)]", X=(4, 6), D=(2, 6))
    red = k.statements[1]
    assert red.index == ("floor(i/2)", "j")
    assert red.expr.index == ("i", "j - 3*floor(j/3) + 3*floor(j/3)")
    x = random_inputs(k)["X"]
    _close(_run(k, {"X": x})["D"], x.reshape(2, 2, 6).sum(axis=1))


def test_extents_are_inferred_from_bare_indices() -> None:
    k = kernel("Y[j, i] += A[i, k, j] * w[k]", A=(2, 3, 4), w=(3,))
    (init, red) = k.statements
    assert init.dims == ("j", "i") and red.dims == ("j", "i", "k")
    assert red.domain == "{ Y[j, i, k] : 0 <= j < 4 and 0 <= i < 2 and 0 <= k < 3 }"
    assert k.tensors["Y"].shape == (4, 2)
    x = random_inputs(k)
    _close(_run(k, x)["Y"], np.einsum("ikj,k->ji", x["A"], x["w"]))


def test_a_condition_restricts_the_domain() -> None:
    """A stencil on the interior and a triangle: non-rectangular domains."""
    st = kernel("B[i] = A[i - 1] + A[i] + A[i + 1] if 1 <= i < 8", A=(9,))
    assert st.statements[0].domain == "{ B[i] : 0 <= i < 9 and (1 <= i < 8) }"
    a = random_inputs(st)["A"]
    want = np.zeros_like(a)
    want[1:-1] = a[:-2] + a[1:-1] + a[2:]
    _close(_run(st, {"A": a})["B"], want)

    tri = kernel("R[i] += A[i, j] if j <= i and i >= 1", A=(4, 4))
    init = tri.statements[0]
    assert init.domain == "{ R_init[i] : 0 <= i < 4 and ((i >= 1)) }"  # i-only conjuncts
    a = random_inputs(tri)["A"]
    want = np.tril(a).sum(axis=1)
    want[0] = 0
    _close(_run(tri, {"A": a})["R"], want)


def test_stencil_with_explicit_extent() -> None:
    k = kernel("B[i] = A[i] + A[i + 1] + A[i + 2]", A=(7,), B=(5,), extents={"i": 5})
    a = random_inputs(k)["A"]
    _close(_run(k, {"A": a})["B"], a[:-2] + a[1:-1] + a[2:])


def test_expressions_select_iterators_and_literals() -> None:
    k = kernel(
        "L[i, j] = where(j <= i, A[i, j], 0)",
        "E[i, j] = A[i, j] if A[i, j] > 0 else -A[i, j] * 0.5",
        "I[i, j] = i * 10 + j",
        "G[i, j] = sigmoid(A[i, j]) + tanh(A[i, j]) ** 2 + abs(floor(A[i, j]))"
        " - min(A[i, j], 1, 2)",
        "Z[i, j] = (A[i, j] >= 0) and not (A[i, j] > 1)",
        A=(3, 3),
        I=(3, 3),
        dtypes={"I": "int32", "Z": "bool"},
    )
    assert k.tensors["I"].dtype == "int32" and k.tensors["Z"].dtype == "bool"
    a = random_inputs(k)["A"]
    out = _run(k, {"A": a})
    _close(out["L"], np.tril(a))
    _close(out["E"], np.where(a > 0, a, -a * 0.5).astype(np.float32))
    np.testing.assert_array_equal(
        out["I"], (np.arange(3)[:, None] * 10 + np.arange(3)).astype(np.int32)
    )
    sig = 1 / (1 + np.exp(-a))
    g = sig + np.tanh(a) ** 2 + np.abs(np.floor(a)) - np.minimum(a, 1)
    _close(out["G"], g.astype(np.float32), rtol=1e-5)
    np.testing.assert_array_equal(out["Z"], (a >= 0) & ~(a > 1))


def test_integer_kernel_and_true_division() -> None:
    k = kernel(
        "Q[i] = A[i] / 2", "S[i] = A[i] * 3 + i", A=(4,), dtype="int64", dtypes={"Q": "float32"}
    )
    a = np.array([1, 2, -3, 7], dtype=np.int64)
    out = _run(k, {"A": a})
    _close(out["Q"], (a / 2).astype(np.float32))
    np.testing.assert_array_equal(out["S"], a * 3 + np.arange(4))


def test_roles_and_outputs_override() -> None:
    k = kernel("Y[i] = A[i] + 1", "Y[i] = Y[i] * 2", "Z[i] = Y[i] - A[i]", A=(3,))
    # Y is read after its last write (by Z): temporary; Z: output
    assert k.tensors["Y"].role is Role.TEMP and k.tensors["Z"].role is Role.OUTPUT
    assert [s.name for s in k.statements] == ["Y", "Y_1", "Z"]
    k2 = kernel("Y[i] = A[i] + 1", "Y[i] = Y[i] * 2", A=(3,))
    assert k2.tensors["Y"].role is Role.OUTPUT  # rewritten in place, not read afterwards
    k3 = kernel(*MM_RELU, A=(2, 2), B=(2, 2), outputs=["Y", "C"])
    assert k3.tensors["Y"].role is Role.OUTPUT and k3.tensors["C"].role is Role.OUTPUT


def test_a_reduction_into_a_written_tensor_accumulates() -> None:
    k = kernel("Y[i] = A[i]", "Y[i] += B[i, k]", A=(3,), B=(3, 4))
    assert [s.name for s in k.statements] == ["Y", "Y_1"]  # no init
    x = random_inputs(k)
    _close(_run(k, x)["Y"], x["A"] + x["B"].sum(axis=1), rtol=1e-5)


def test_constants_and_scalar_results() -> None:
    w = np.arange(4, dtype=np.float32)
    k = kernel("S[0] += A[i] * W[i]", A=(4,), W=w, S=(1,))
    assert k.tensors["W"].role is Role.CONSTANT and k.tensors["S"].role is Role.OUTPUT
    assert k.statements[0].dims == ()
    a = random_inputs(k)["A"]
    _close(_run(k, {"A": a})["S"], np.array([a @ w], dtype=np.float32))


def test_shapes_keyword_for_clashing_names() -> None:
    k = kernel("out[i] = name[i] + dtype[i]", shapes={"name": (2,), "dtype": (2,)})
    assert set(k.tensors) == {"name", "dtype", "out"}


# --- errors name the statement ---------------------------------------------------------------

ERRORS = [
    (("Y[i] = A[i] +",), {"A": (3,)}, "syntax error"),
    (("Y[i] = foo(A[i])",), {"A": (3,)}, "unknown function 'foo'"),
    (("Y[i] = Z[i]",), {"A": (3,)}, "reads tensor 'Z', which has no shape"),
    (
        ("Y[i] = A[i] + B[i]",),
        {"A": (3,), "B": (4,)},
        r"conflicting extents for 'i': A\[0\] = 3, B\[0\] = 4",
    ),
    (("Y[i] = A[i] * j",), {"A": (3,)}, "cannot infer the extent of 'j'"),
    (("Y[i] = A[i * i]",), {"A": (3,)}, "not affine"),
    (("Y[i] = A[i, i]",), {"A": (3,)}, "has rank 1"),
    (
        ("Y[i] = A[i] + A[i + 1]",),
        {"A": (3,)},
        r"reads A\[i \+ 1\] outside its shape \[3\] \(at i = 2\)",
    ),
    (("Y[i] -= A[i]",), {"A": (3,)}, "unsupported assignment '-='"),
    (("Y[i] = A + 1",), {"A": (3,)}, "tensor 'A' is used without an index"),
    (("Y[i] = A[i] // 2",), {"A": (3,)}, "'//' is for indices"),
    (("Y[i] = A[i // 0]",), {"A": (3,)}, "positive constant divisor"),
    (("Y[i + 1] = A[i]",), {"A": (3,)}, "cannot infer the shape of 'Y'"),
    (("W[i] = A[i]",), {"A": (3,), "W": np.ones(3)}, "writes 'W', which is a constant"),
    (("Y[i] = A[i]", "A[i] = 1"), {"A": (3,)}, "earlier statement reads as an input"),
    (("Y[i] = A[i] if i * i < 2",), {"A": (3,)}, "not affine"),
    (("Y[i] = A[i] if A[i] > 0",), {"A": (3,)}, "not an affine"),
    (("Y[i]",), {"A": (3,)}, "expected `T"),
    (("Y[i] = where(A[i])",), {"A": (3,)}, "takes 3 arguments"),
    (("Y[i] = A[i] + max",), {"A": (3,)}, "'max' is a function"),
]


@pytest.mark.parametrize(("statements", "shapes", "message"), ERRORS)
def test_errors_name_the_statement(statements: tuple, shapes: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        kernel(*statements, **shapes)
    assert f"statement '{statements[-1]}'" in str(info.value)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "at least one statement"),
        (("Y[i] = A[i]",), {"A": (3,), "B": (2,)}, "'B' is declared but never used"),
        (("Y[i] = A[i]",), {"A": (3,), "outputs": ["Q"]}, "outputs names 'Q'"),
        (("Y[i] = A[i]",), {"A": (None,)}, "must be given a shape"),
        (("Y[i] = A[i]",), {"A": ("2n",)}, "'2n' cannot name a symbolic size"),
        (("Y[i] = A[i] * n",), {"A": ("n",)}, "symbolic size 'n' is used as a value"),
        (("Y[i] = A[i + 1]",), {"A": ("n",), "extents": {"i": "n"}}, "outside its shape"),
        (("Y[i] = A[i]",), {"A": (3,), "dtypes": {"Q": "float32"}}, "dtypes names 'Q'"),
        (("Y[i] = A[i]",), {"A": (3,), "dtype": "float99"}, "unknown dtype"),
    ],
)
def test_kernel_level_errors(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        kernel(*args, **kwargs)


# --- single ONNX nodes ---------------------------------------------------------------------


def _from_node(*args, **kwargs) -> Kernel:  # noqa: ANN002, ANN003
    try:
        return kernel_from_node(*args, **kwargs)
    except UnsupportedOpError as exc:  # a lowering someone is still writing
        pytest.skip(str(exc))


def _feed(k: Kernel, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k.by_source(name).name: v for name, v in values.items()}


def test_relu_node() -> None:
    k = _from_node(helper.make_node("Relu", ["x"], ["y"]), {"x": (2, 3)})
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    out = _run(k, _feed(k, {"x": x}))[k.by_source("y").name]
    _close(out, np.maximum(x, 0))


def test_add_node_broadcasts() -> None:
    k = _from_node(helper.make_node("Add", ["x", "b"], ["y"]), {"x": (2, 3), "b": (3,)})
    rng = np.random.default_rng(1)
    x, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    out = _run(k, _feed(k, {"x": x, "b": b}))[k.by_source("y").name]
    _close(out, x + b)


def test_matmul_node_with_a_constant_weight() -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    k = _from_node(
        helper.make_node("MatMul", ["x", "w"], ["y"]), {"x": (2, 3)}, initializers={"w": w}
    )
    assert k.by_source("w").role is Role.CONSTANT
    assert any(s.reduction == "sum" for s in k.statements)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = _run(k, _feed(k, {"x": x}))[k.by_source("y").name]
    _close(out, x @ w)


def test_conv_node_matches_the_onnx_reference() -> None:
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1])
    k = _from_node(node, {"x": (1, 2, 5, 4)}, initializers={"w": w})
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    out = _run(k, _feed(k, {"x": x}))[k.by_source("y").name]
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    _close(out, want, rtol=1e-4)
    # a whole (one-node) model works too
    assert _from_node(model).statements == k.statements


def test_node_errors() -> None:
    with pytest.raises(InputError, match="shape of input 'b'"):
        kernel_from_node(helper.make_node("Add", ["x", "b"], ["y"]), {"x": (2,)})
    with pytest.raises(InputError, match="input_shapes names 'z'"):
        kernel_from_node(helper.make_node("Relu", ["x"], ["y"]), {"x": (2,), "z": (1,)})
    with pytest.raises(InputError, match="NodeProto or ModelProto"):
        kernel_from_node("Relu")


def test_indirect_load_gathers_rows() -> None:
    k = kernel("Y[i, j] = E[I[i], j]", E=(5, 3), I=(4,), dtypes={"I": "int64"})
    assert isinstance(k.statements[0].expr.index[0], Load)
    e = np.arange(15, dtype=np.float32).reshape(5, 3)
    idx = np.array([4, 0, 2, 2])
    _close(_run(k, {"E": e, "I": idx})["Y"], e[idx])
