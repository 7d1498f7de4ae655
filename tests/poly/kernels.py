"""Small hand-built kernels for the schedule tests (no dependence on the DSL parser), and
the check that a schedule computes what its kernel computes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from polytile.codegen.native import NativeKernel
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Expr, Load, binary, const, unary
from polytile.poly.ir.kernel import Kernel, Role, Statement, Tensor
from polytile.poly.ir.schedule import Schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order

F32 = "float32"


def conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A valid (unpadded) NCHW convolution with stride 1, in float64."""
    kh, kw = w.shape[2:]
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (kh, kw), (2, 3))
    assert windows.shape[2:4] == (oh, ow)
    return np.einsum("nchwij,mcij->nmhw", windows, w.astype(np.float64))


def boxed(
    name: str,
    dims: tuple[str, ...],
    extents: list[int],
    tensor: str,
    index: tuple[str, ...],
    expr: Expr,
    where: str = "",
    reduction: str | None = None,
) -> Statement:
    """Statement `name` over the box `0 <= dims < extents` (and `where`), writing
    `tensor[index] = expr` (or combining into it by `reduction`)."""
    return Statement(name, dims, ih.box(name, dims, extents, where), tensor, index, expr, reduction)


def init(tensor: str, dims: tuple[str, ...], extents: list[int], value: float) -> Statement:
    """The init statement `{tensor}_init` of the reduction into `tensor[dims]`."""
    name = f"{tensor}_init"
    return Statement(
        name, dims, ih.box(name, dims, extents), tensor, dims, const(value, F32), init_of=tensor
    )


def mm_relu(n: int = 8, m: int = 8, k: int = 8) -> Kernel:
    """TVM's mm_relu: Y = A @ B; C = max(Y, 0)."""
    a, b = Load("A", ("i", "k"), F32), Load("B", ("k", "j"), F32)
    ij = ("i", "j")
    stmts = (
        init("Y", ij, [n, m], 0),
        boxed("Y", ("i", "j", "k"), [n, m, k], "Y", ij, binary("mul", a, b), reduction="sum"),
        boxed("C", ij, [n, m], "C", ij, binary("max", Load("Y", ij, F32), const(0, F32))),
    )
    tensors = {
        "A": Tensor("A", (n, k), F32, Role.INPUT),
        "B": Tensor("B", (k, m), F32, Role.INPUT),
        "Y": Tensor("Y", (n, m), F32, Role.TEMP),
        "C": Tensor("C", (n, m), F32, Role.OUTPUT),
    }
    return Kernel("mm_relu", tensors, stmts)


def random_inputs(kernel: Kernel, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in kernel.inputs()}


def assert_equivalent(
    schedule: Schedule,
    inputs: dict[str, np.ndarray] | None = None,
    original: Kernel | None = None,
    atol: float = 1e-6,
) -> None:
    """The schedule (AST interpreter) computes what the untransformed kernel (`original`,
    by default the schedule's own) computes in program order, on `inputs` (seeded random
    ones by default)."""
    kernel = original if original is not None else schedule.kernel
    inputs = inputs if inputs is not None else random_inputs(kernel)
    want = run_program_order(kernel, inputs)
    got = run_schedule(schedule, inputs)
    for t in kernel.outputs():
        assert got[t.name].shape == want[t.name].shape
        assert got[t.name].dtype == want[t.name].dtype
        np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-5, atol=atol)


def check_mm_relu(schedule: Schedule, atol: float = 1e-5) -> None:
    """A schedule of `mm_relu` computes max(A @ B, 0), interpreted and compiled, and so
    does its kernel in program order."""
    inputs = random_inputs(schedule.kernel)
    want = np.maximum(inputs["A"] @ inputs["B"], 0)
    outputs = (
        run_schedule(schedule, inputs)["C"],
        NativeKernel(schedule)(inputs)["C"],
        run_program_order(schedule.kernel, inputs)["C"],
    )
    for got in outputs:
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)


def softmax_rows(n: int = 4, m: int = 12) -> Kernel:
    """Row softmax: max-reduce, exp-sum-reduce, divide (three dependent stages)."""
    ij = ("i", "j")
    x, mx, e = Load("X", ij, F32), Load("M", ("i",), F32), Load("E", ij, F32)
    stmts = (
        init("M", ("i",), [n], -np.inf),
        boxed("M", ij, [n, m], "M", ("i",), x, reduction="max"),
        boxed("E", ij, [n, m], "E", ij, unary("exp", binary("sub", x, mx))),
        init("S", ("i",), [n], 0),
        boxed("S", ij, [n, m], "S", ("i",), e, reduction="sum"),
        boxed("Y", ij, [n, m], "Y", ij, binary("div", e, Load("S", ("i",), F32))),
    )
    tensors = {
        "X": Tensor("X", (n, m), F32, Role.INPUT),
        "M": Tensor("M", (n,), F32, Role.TEMP),
        "E": Tensor("E", (n, m), F32, Role.TEMP),
        "S": Tensor("S", (n,), F32, Role.TEMP),
        "Y": Tensor("Y", (n, m), F32, Role.OUTPUT),
    }
    return Kernel("softmax", tensors, stmts)


def stencil(n: int = 16) -> Kernel:
    """B[i] = A[i-1] + A[i] + A[i+1] on the interior: a non-rectangular domain."""
    a = [Load("A", (f"i + {d}",), F32) for d in (-1, 0, 1)]
    expr = binary("add", binary("add", a[0], a[1]), a[2])
    s = boxed("B", ("i",), [n], "B", ("i",), expr, where=f"i >= 1 and i < {n - 1}")
    tensors = {
        "A": Tensor("A", (n,), F32, Role.INPUT),
        "B": Tensor("B", (n,), F32, Role.OUTPUT),
    }
    return Kernel("stencil", tensors, (s,))


def prefix_sum(n: int = 10) -> Kernel:
    """P[i] = P[i-1] + A[i]: a loop-carried flow dependence, so no parallel / vector."""
    a = Load("A", ("i",), F32)
    s0 = boxed("P0", ("i",), [1], "P", ("i",), a)
    s1 = boxed(
        "P", ("i",), [n], "P", ("i",), binary("add", Load("P", ("i - 1",), F32), a), "i >= 1"
    )
    tensors = {
        "A": Tensor("A", (n,), F32, Role.INPUT),
        "P": Tensor("P", (n,), F32, Role.OUTPUT),
    }
    return Kernel("prefix_sum", tensors, (s0, s1))


def float_model(nodes: list, inputs: dict, constants: dict) -> onnx.ModelProto:
    """A float32 ONNX model of `nodes` (inputs by shape, constants by value) whose last
    node's output is the graph output, for `kernel_from_node`."""
    graph = helper.make_graph(
        nodes,
        "model",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
