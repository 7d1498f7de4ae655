"""Variants of supported ops compiled to native code against onnxruntime and onnx's
reference evaluator: Resize with antialias=1 (linear and cubic filters widened when
downsampling) and MaxPool's Indices output (the flat index of the first maximum, in
row-major or, with storage_order=1, column-major order), and strided depthwise convs over
phase-split padded copies."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import polytile as pt

from peers import one_node_model, ort_run, reference

RNG = np.random.default_rng(24)


# --- Resize antialias -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize(
    "coordinates", ["half_pixel", "half_pixel_symmetric", "align_corners", "asymmetric"]
)
def test_resize_antialias_against_onnxruntime(mode: str, coordinates: str) -> None:
    """onnxruntime's antialias windows differ from onnx's reference (the spec's
    definition) with align_corners: that mode is compared with the reference only."""
    feeds = {"x": RNG.standard_normal((2, 3, 13, 10)).astype(np.float32)}
    scales = np.array([1, 1, 0.4, 0.6], np.float32)
    node = helper.make_node(
        "Resize",
        ["x", "", "scales"],
        ["y"],
        mode=mode,
        antialias=1,
        coordinate_transformation_mode=coordinates,
    )
    m = one_node_model(node, feeds, {"y": onnx.TensorProto.FLOAT}, {"scales": scales})
    (got,) = pt.compile(m).run(feeds)
    (want,) = reference(m, feeds)
    assert got.shape == want.shape == (2, 3, 5, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if coordinates != "align_corners":
        np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)


def test_resize_antialias_sizes_differs_from_plain_linear() -> None:
    """Antialiasing changes the result when downsampling (the plain filter reads 2 taps)."""
    feeds = {"x": RNG.standard_normal((1, 1, 16, 16)).astype(np.float32)}
    sizes = np.array([1, 1, 5, 6], np.int64)
    outputs = []
    for antialias in (0, 1):
        node = helper.make_node(
            "Resize", ["x", "", "", "sizes"], ["y"], mode="linear", antialias=antialias
        )
        m = one_node_model(node, feeds, {"y": onnx.TensorProto.FLOAT}, {"sizes": sizes})
        (got,) = pt.compile(m).run(feeds)
        np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)
        outputs.append(got)
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-2


# --- MaxPool Indices ------------------------------------------------------------------------

POOLS = {
    "2d_pads_strides": (
        (2, 3, 9, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    "2d_dilated_ceil": (
        (1, 2, 10, 9),
        {"kernel_shape": [2, 3], "dilations": [2, 1], "ceil_mode": 1, "strides": [3, 2]},
    ),
    "1d": ((2, 2, 11), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
    "3d": ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1]}),
    "2d_stride_one_long_rows": ((1, 2, 6, 12), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("case", POOLS, ids=list(POOLS))
def test_maxpool_indices_against_onnxruntime(case: str, storage_order: int) -> None:
    """Small integers make ties: the first maximum in the window's scan wins."""
    shape, attrs = POOLS[case]
    x = RNG.integers(-3, 4, shape).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], storage_order=storage_order, **attrs)
    m = one_node_model(node, {"x": x}, {"y": 1, "idx": onnx.TensorProto.INT64}, opset=12)
    got = pt.compile(m).run({"x": x})
    want = ort_run(m, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[1], want[1])
    if storage_order == 0:  # a row-major flat index into X
        np.testing.assert_array_equal(x.reshape(-1)[got[1]], got[0])


def test_maxpool_indices_int8() -> None:
    x = RNG.integers(-128, 128, (2, 3, 7, 7)).astype(np.int8)
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[3, 3], strides=[2, 2])
    m = one_node_model(
        node, {"x": x}, {"y": onnx.TensorProto.INT8, "idx": onnx.TensorProto.INT64}, opset=12
    )
    got = pt.compile(m).run({"x": x})
    want = ort_run(m, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


# --- Depthwise convs over phase-split padded copies ------------------------------------------

STRIDED_DEPTHWISE = {
    "5x5_stride_2_odd_rows": ((1, 37, 15, 15), (5, 5), [2, 2], [2, 2, 2, 2]),
    "3x3_stride_2_even_rows": ((2, 24, 14, 20), (3, 3), [2, 2], [1, 1, 1, 1]),
    "7x7_stride_3_asymmetric": ((1, 5, 17, 29), (7, 7), [1, 3], [3, 2, 1, 3]),
}


@pytest.mark.parametrize("case", STRIDED_DEPTHWISE, ids=list(STRIDED_DEPTHWISE))
def test_strided_depthwise_conv_with_a_phased_copy_against_onnxruntime(case: str) -> None:
    """A depthwise conv sliding by s > 1 along its rows reads a padded copy whose rows are
    split into s phases (`poly.lower.window.phases`); compiled with the default schedule
    (channel tiles, masked short rows), with a fused activation, as onnxruntime."""
    shape, kernel, strides, pads = STRIDED_DEPTHWISE[case]
    c = shape[1]
    w = (RNG.standard_normal((c, 1, *kernel)) / kernel[1]).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    x = RNG.standard_normal(shape).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, strides=strides, pads=pads)
    swish = helper.make_node("HardSwish", ["y"], ["z"])
    graph = helper.make_graph(
        [conv, swish],
        "dw",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    got = pt.compile(m).run({"x": x})[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
