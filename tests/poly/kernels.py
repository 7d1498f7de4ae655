"""Small hand-built kernels for the schedule tests (no dependence on the DSL parser)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Load, binary, const, unary
from polytile.poly.ir.kernel import Kernel, Role, Statement, Tensor


def conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A valid (unpadded) NCHW convolution with stride 1, in float64."""
    kh, kw = w.shape[2:]
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (kh, kw), (2, 3))
    assert windows.shape[2:4] == (oh, ow)
    return np.einsum("nchwij,mcij->nmhw", windows, w.astype(np.float64))


def mm_relu(n: int = 8, m: int = 8, k: int = 8) -> Kernel:
    """TVM's mm_relu: Y = A @ B; C = max(Y, 0)."""
    a, b = Load("A", ("i", "k"), "float32"), Load("B", ("k", "j"), "float32")
    init = Statement(
        "Y_init",
        ("i", "j"),
        ih.box("Y_init", ["i", "j"], [n, m]),
        "Y",
        ("i", "j"),
        const(0, "float32"),
        init_of="Y",
    )
    mm = Statement(
        "Y",
        ("i", "j", "k"),
        ih.box("Y", ["i", "j", "k"], [n, m, k]),
        "Y",
        ("i", "j"),
        binary("mul", a, b),
        reduction="sum",
    )
    relu = Statement(
        "C",
        ("i", "j"),
        ih.box("C", ["i", "j"], [n, m]),
        "C",
        ("i", "j"),
        binary("max", Load("Y", ("i", "j"), "float32"), const(0, "float32")),
    )
    tensors = {
        "A": Tensor("A", (n, k), "float32", Role.INPUT),
        "B": Tensor("B", (k, m), "float32", Role.INPUT),
        "Y": Tensor("Y", (n, m), "float32", Role.TEMP),
        "C": Tensor("C", (n, m), "float32", Role.OUTPUT),
    }
    return Kernel("mm_relu", tensors, (init, mm, relu))


def random_inputs(kernel: Kernel, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in kernel.inputs()}


def softmax_rows(n: int = 4, m: int = 12) -> Kernel:
    """Row softmax: max-reduce, exp-sum-reduce, divide (three dependent stages)."""
    x = Load("X", ("i", "j"), "float32")
    mx = Load("M", ("i",), "float32")
    stmts = (
        Statement(
            "M_init",
            ("i",),
            ih.box("M_init", ["i"], [n]),
            "M",
            ("i",),
            const(-np.inf, "float32"),
            init_of="M",
        ),
        Statement(
            "M", ("i", "j"), ih.box("M", ["i", "j"], [n, m]), "M", ("i",), x, reduction="max"
        ),
        Statement(
            "E",
            ("i", "j"),
            ih.box("E", ["i", "j"], [n, m]),
            "E",
            ("i", "j"),
            unary("exp", binary("sub", x, mx)),
        ),
        Statement(
            "S_init",
            ("i",),
            ih.box("S_init", ["i"], [n]),
            "S",
            ("i",),
            const(0, "float32"),
            init_of="S",
        ),
        Statement(
            "S",
            ("i", "j"),
            ih.box("S", ["i", "j"], [n, m]),
            "S",
            ("i",),
            Load("E", ("i", "j"), "float32"),
            reduction="sum",
        ),
        Statement(
            "Y",
            ("i", "j"),
            ih.box("Y", ["i", "j"], [n, m]),
            "Y",
            ("i", "j"),
            binary("div", Load("E", ("i", "j"), "float32"), Load("S", ("i",), "float32")),
        ),
    )
    tensors = {
        "X": Tensor("X", (n, m), "float32", Role.INPUT),
        "M": Tensor("M", (n,), "float32", Role.TEMP),
        "E": Tensor("E", (n, m), "float32", Role.TEMP),
        "S": Tensor("S", (n,), "float32", Role.TEMP),
        "Y": Tensor("Y", (n, m), "float32", Role.OUTPUT),
    }
    return Kernel("softmax", tensors, stmts)


def stencil(n: int = 16) -> Kernel:
    """B[i] = A[i-1] + A[i] + A[i+1] on the interior: a non-rectangular domain."""
    a = [Load("A", (f"i + {d}",), "float32") for d in (-1, 0, 1)]
    s = Statement(
        "B",
        ("i",),
        ih.box("B", ["i"], [n], "i >= 1 and i < " + str(n - 1)),
        "B",
        ("i",),
        binary("add", binary("add", a[0], a[1]), a[2]),
    )
    tensors = {
        "A": Tensor("A", (n,), "float32", Role.INPUT),
        "B": Tensor("B", (n,), "float32", Role.OUTPUT),
    }
    return Kernel("stencil", tensors, (s,))


def prefix_sum(n: int = 10) -> Kernel:
    """P[i] = P[i-1] + A[i]: a loop-carried flow dependence, so no parallel / vector."""
    s0 = Statement(
        "P0", ("i",), ih.box("P0", ["i"], [1]), "P", ("i",), Load("A", ("i",), "float32")
    )
    s1 = Statement(
        "P",
        ("i",),
        ih.box("P", ["i"], [n], "i >= 1"),
        "P",
        ("i",),
        binary("add", Load("P", ("i - 1",), "float32"), Load("A", ("i",), "float32")),
    )
    tensors = {
        "A": Tensor("A", (n,), "float32", Role.INPUT),
        "P": Tensor("P", (n,), "float32", Role.OUTPUT),
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
