"""DepthToSpace and SpaceToDepth compiled to native code on cases the ONNX node tests miss
(block size 3, non-square images, integer and bool tensors, a round trip), against numpy
and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import polytile as pt

from peers import ort_run

RNG = np.random.default_rng(5)


def model(nodes: list[onnx.NodeProto], x: np.ndarray, opset: int = 13) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, x.shape)],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def numpy_depth_to_space(x: np.ndarray, b: int, mode: str) -> np.ndarray:
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("dtype", ["float32", "int8", "float16"])
def test_depth_to_space_block_3(mode: str, dtype: str) -> None:
    x = (RNG.standard_normal((2, 18, 3, 4)) * 10).astype(dtype)
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=3, mode=mode)
    m = model([node], x)
    (got,) = pt.compile(m).run({"x": x})
    np.testing.assert_array_equal(got, numpy_depth_to_space(x, 3, mode))
    if dtype == "float32":
        np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])


def test_space_to_depth_against_onnxruntime() -> None:
    x = RNG.standard_normal((1, 3, 4, 6)).astype(np.float32)
    m = model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)], x)
    (got,) = pt.compile(m).run({"x": x})
    assert got.shape == (1, 12, 2, 3)
    np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(mode: str) -> None:
    """SpaceToDepth (with `mode` since opset 28) undoes DepthToSpace of the same mode."""
    x = RNG.integers(0, 2, size=(2, 8, 3, 5)).astype(bool)
    nodes = [
        helper.make_node("DepthToSpace", ["x"], ["t"], blocksize=2, mode=mode),
        helper.make_node("SpaceToDepth", ["t"], ["y"], blocksize=2, mode=mode),
    ]
    (got,) = pt.compile(model(nodes, x, opset=28)).run({"x": x})
    np.testing.assert_array_equal(got, x)
