"""The indexing ops compiled to native code under their default schedules (tiled,
vectorized, parallel on two threads) on shapes large enough for those schedules to
apply, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt

RNG = np.random.default_rng(11)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    constants: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "ops",
        [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)
            )
            for n, v in inputs.items()
        ],
        [helper.make_empty_tensor_value_info(n) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in (constants or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for threads in (1, 2):
        got = pt.compile(model, num_threads=threads).run(feeds)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-5)


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_gather_rows_of_a_table() -> None:
    ids = RNG.integers(-1000, 1000, (4, 33))
    node = helper.make_node("Gather", ["table", "ids"], ["y"])
    model = _model(node, {"ids": ids}, ["y"], {"table": _floats(1000, 96)})
    _compare(model, {"ids": ids})


def test_gather_elements_large() -> None:
    feeds = {"x": _floats(8, 64, 40), "i": RNG.integers(-64, 64, (8, 50, 40))}
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    _compare(_model(node, feeds, ["y"]), feeds)


def test_gather_nd_rows() -> None:
    feeds = {"x": _floats(16, 24, 64), "i": RNG.integers(-16, 16, (5, 7, 2)) % [16, 24]}
    node = helper.make_node("GatherND", ["x", "i"], ["y"])
    _compare(_model(node, feeds, ["y"]), feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_rows(reduction: str) -> None:
    rows = RNG.permutation(48)[:12] if reduction == "none" else RNG.integers(0, 48, 12)
    feeds = {
        "x": _floats(48, 40),
        "i": (rows - 48 * RNG.integers(0, 2, 12)).reshape(12, 1),
        "u": _floats(12, 40),
    }
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    _compare(_model(node, feeds, ["y"]), feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "min"])
def test_scatter_elements_columns(reduction: str) -> None:
    if reduction == "none":
        indices = np.argsort(RNG.random((20, 64)), axis=1)[:, :30]
    else:
        indices = RNG.integers(-64, 64, (20, 30))
    feeds = {"x": _floats(20, 64), "i": indices, "u": _floats(20, 30)}
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)
    _compare(_model(node, feeds, ["y"]), feeds, rtol=1e-4)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_rows(largest: int) -> None:
    x = RNG.integers(-20, 20, (24, 100)).astype(np.float32)  # ties: lower positions first
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)
    model = _model(node, {"x": x}, ["v", "i"], {"k": np.array([17])})
    _compare(model, {"x": x})


def test_topk_of_a_vocabulary_row() -> None:
    """Sampling's TopK over a GPT-2-sized row: k passes over 50 257 logits, not a rank
    per element (ties and NaNs in it, checked against onnxruntime)."""
    x = np.round(RNG.standard_normal((2, 50257)) * 8).astype(np.float32)
    x[0, RNG.integers(0, 50257, 5)] = np.nan
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"])
    model = _model(node, {"x": x}, ["v", "i"], {"k": np.array([50])})
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    values, positions = pt.compile(model, num_threads=2).run({"x": x})
    np.testing.assert_array_equal(positions, want[1])
    np.testing.assert_array_equal(values, want[0])


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "uint8", "int8"])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_dtypes(dtype: str, largest: int) -> None:
    """Every dtype against numpy's stable sort (ties by the lower position); uint8 and int8
    hold values near their limits, which the 64-bit accumulators keep exact."""
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        x = RNG.integers(info.min, int(info.max) + 1, (3, 7, 40)).astype(dtype)
    else:
        x = np.round(RNG.standard_normal((3, 7, 40)) * 3).astype(dtype)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)
    model = _model(node, {"x": x}, ["v", "i"], {"k": np.array([5])})
    order = np.argsort(-x.astype(np.float64) if largest else x, axis=1, kind="stable")[:, :5]
    values, positions = pt.compile(model, num_threads=2).run({"x": x})
    np.testing.assert_array_equal(positions, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))


def test_onehot_and_trilu() -> None:
    indices = RNG.integers(-40, 40, (6, 70))
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=1)
    consts = {"d": np.array(32, np.int64), "v": np.array([0.0, 1.0], np.float32)}
    _compare(_model(node, {"i": indices}, ["y"], consts), {"i": indices})
    x = _floats(3, 70, 90)
    node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=0)
    _compare(_model(node, {"x": x}, ["y"], {"k": np.array(5)}), {"x": x})


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_orders_nan_above_every_number(largest: int) -> None:
    """onnxruntime's order: NaN first when largest, last when smallest, NaNs by position."""
    x = RNG.integers(-4, 4, (5, 12)).astype(np.float32)
    x[RNG.random((5, 12)) < 0.3] = np.nan
    x[0, :3] = [np.inf, -np.inf, np.nan]
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)
    model = _model(node, {"x": x}, ["v", "i"], {"k": np.array([9])})
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for threads in (1, 2):
        values, positions = pt.compile(model, num_threads=threads).run({"x": x})
        np.testing.assert_array_equal(positions, want[1])
        np.testing.assert_array_equal(values, want[0])
