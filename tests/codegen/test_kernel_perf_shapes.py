"""The shapes the default schedules special-case for speed (channel-vectorized convs with
row blocks, padding, strides, widths that need no partial tile; matmuls with two vectors
per row; accumulators promoted to registers): native code against onnxruntime on the same
model (convs; the point-by-point reference would take seconds per shape) or numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from polytile.codegen.native import NativeKernel
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.oracle.reference import run_program_order


def _inputs(k: Kernel) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        t.name: rng.standard_normal(t.shape).astype(t.dtype)
        for t in k.tensors.values()
        if t.role is Role.INPUT
    }


def _run(k: Kernel, width: int, want: dict[str, np.ndarray] | None = None) -> None:
    """`want` maps output tensor names to expected values (default: the reference)."""
    inputs = _inputs(k)
    schedule = default_schedule(k, DefaultConfig(vector_width=width))
    want = want if want is not None else run_program_order(k, inputs)
    got = NativeKernel(schedule)(inputs)
    for t in k.outputs():
        assert got[t.name].shape == want[t.name].shape
        np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-4, atol=1e-4)


def _run_model(model: onnx.ModelProto, width: int) -> None:
    """A one-group model: onnxruntime computes the expected outputs."""
    k = kernel_from_node(model)
    inputs = _inputs(k)
    feeds = {t.source: v for t in k.tensors.values() for n, v in inputs.items() if t.name == n}
    model.ir_version = min(model.ir_version, 10)
    outputs = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    names = [o.name for o in model.graph.output]
    want = {k.by_source(n).name: v for n, v in zip(names, outputs, strict=True)}
    _run(k, width, want)


def _conv(
    c: int, m: int, size: int, kernel_size: int, stride: int, pad: int, group: int = 1
) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((m, c // group, kernel_size, kernel_size)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    conv = helper.make_node(
        "Conv",
        ["x", "w", "b"],
        ["y"],
        kernel_shape=[kernel_size] * 2,
        strides=[stride] * 2,
        pads=[pad] * 4,
        group=group,
    )
    graph = helper.make_graph(
        [conv],
        "conv",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("c", "m", "size", "kernel_size", "stride", "pad"),
    [
        (8, 32, 14, 3, 1, 1),  # padded 3×3, one row block per row
        (8, 64, 16, 3, 1, 1),  # padded, two blocks per row, two vectors of channels
        (4, 16, 9, 3, 2, 1),  # stride 2, odd width
        (16, 32, 7, 1, 1, 0),  # 1×1 on a 7×7 image
        (3, 16, 23, 7, 2, 3),  # 7×7 stride-2 stem, a width with no good divisor
        (8, 48, 10, 1, 2, 0),  # 1×1 stride 2, channels not a multiple of two vectors
    ],
)
@pytest.mark.parametrize("width", [8, 16])
def test_conv_shapes(
    c: int, m: int, size: int, kernel_size: int, stride: int, pad: int, width: int
) -> None:
    _run_model(_conv(c, m, size, kernel_size, stride, pad), width)


@pytest.mark.parametrize(
    ("c", "m", "group"),
    [(16, 64, 2), (8, 32, 4), (8, 24, 1)],  # grouped (a vector stays in one group); 24 → 8 lanes
)
@pytest.mark.parametrize("width", [8, 16])
def test_grouped_and_odd_channel_convs(c: int, m: int, group: int, width: int) -> None:
    _run_model(_conv(c, m, 9, 3, 1, 1, group), width)


@pytest.mark.parametrize("n", [16, 64, 72])
@pytest.mark.parametrize("width", [8, 16])
def test_matmul_relu(n: int, width: int) -> None:
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(n, 24), B=(24, n))
    inputs = _inputs(k)
    _run(k, width, {"C": np.maximum(inputs["A"] @ inputs["B"], 0)})


def test_conv_relu_residual() -> None:
    """A fused epilogue (residual add, ReLU) on the channel-vectorized tile."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 12, 12]),
            helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [1, 32, 12, 12]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _run_model(model, 16)


@pytest.mark.parametrize(("m", "k", "n"), [(24, 512, 512), (20, 700, 640)])
def test_cache_tiled_matmul_relu(m: int, k: int, n: int) -> None:
    """A long reduction under many vector tiles: k and the vector tiles are cache-tiled
    (S R S S R S: the few row blocks walk over each tile), with a partial last k tile in
    the second shape; the ReLU epilogue
    still runs once per output tile. (A's few rows would rather stay cached with the
    vector tiles outermost, `weights_first`, which is off here; rows of two vectors
    leave enough vector tiles to group, `wide_rows` off.)"""
    kern = kernel("Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(m, k), B=(k, n))
    config = DefaultConfig(vector_width=16, stream_weights=False, wide_rows=False)
    schedule = default_schedule(kern, config)
    loops = [lp.name for lp in schedule.loops_of("Y")]
    assert loops[-6:] == ["k0", "i0", "j01", "k1", "i1", "j1"]
    inputs = _inputs(kern)
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    _run(kern, 16, {"C": np.maximum(a @ b, 0).astype(np.float32)})
