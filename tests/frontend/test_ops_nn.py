"""Op families nn, matmul and reduce: old opset versions are canonicalized to the same
meaning, window shapes agree with onnx.shape_inference and onnxruntime, and numpy folding
agrees with onnx's reference evaluator (errors: test_ops_errors.py)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polytile.frontend.graph import Graph, Node, TensorType
from polytile.frontend.importer import import_model
from polytile.frontend.onnx_io import attribute_value, dtype_to_onnx, export_model
from polytile.frontend.ops import OPS, InferContext

from graphs import run_ort

F32 = np.float32

# --- helpers ---------------------------------------------------------------------------------


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    outputs: dict[str, int] | Sequence[str],
    opset: int,
    initializers: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """A model whose inputs have the shapes and dtypes of the given example arrays; outputs
    are typed (FLOAT unless given) with unknown shape, so polytile's inference decides."""
    if not isinstance(outputs, dict):
        outputs = dict.fromkeys(outputs, TensorProto.FLOAT)
    graph = helper.make_graph(
        list(nodes),
        "nn",
        [
            helper.make_tensor_value_info(k, dtype_to_onnx(v.dtype.name), list(v.shape))
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info(k, t, None) for k, t in outputs.items()],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = max(helper.find_min_ir_version_for(opsets), 7)
    return model


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"dtype {g.dtype} != {w.dtype}"
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
        else:
            np.testing.assert_array_equal(g, w)


def roundtrip(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    reference: bool = True,
    ort_original: bool = True,
) -> Graph:
    """Import and export the model; the export computes what onnxruntime computes on the
    original (and, if `reference`, so does onnx's reference evaluator on the export).
    `ort_original=False` runs the original with the reference evaluator instead."""
    graph = import_model(model)
    exported = export_model(graph)
    onnx.checker.check_model(exported)
    want = run_ort(model, feeds) if ort_original else run_reference(model, feeds)
    for name, w in zip(graph.outputs, want, strict=True):
        assert graph.types[name] == TensorType(w.shape, w.dtype.name), name
    assert_close(run_ort(exported, feeds), want)
    if reference:
        assert_close(run_reference(exported, feeds), want)
    return graph


def onnx_shape(model: onnx.ModelProto, output: str = "y") -> tuple[int, ...]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    value = next(v for v in inferred.graph.output if v.name == output)
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def ops_of(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.nodes]


# --- (1) old opset versions --------------------------------------------------------------------


def _softmax_2d(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Softmax before opset 13: over the flattened dims from `axis` on."""
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    s = e / e.sum(axis=1, keepdims=True)
    return (np.log(s) if log else s).reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 1, 2, -1, 0])
def test_softmax_opset11_coerces_to_2d(op: str, axis: int | None) -> None:
    x = rand(2, 3, 4, 5)
    attrs = {} if axis is None else {"axis": axis}
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"], opset=11)
    graph = roundtrip(m, {"x": x})
    effective = 1 if axis is None else axis % 4
    if effective == 3:
        assert ops_of(graph) == [op]
    else:
        assert ops_of(graph) == ["Reshape", op, "Reshape"]
        flat = graph.nodes[0].outputs[0]
        rows, cols = np.prod(x.shape[:effective]), np.prod(x.shape[effective:])
        assert graph.types[flat].shape == (rows, cols)
    softmax = next(n for n in graph.nodes if n.op_type == op)
    assert softmax.attrs["axis"] == -1
    assert graph.nodes[-1].outputs == ("y",)
    got = run_reference(export_model(graph), {"x": x})[0]
    np.testing.assert_allclose(got, _softmax_2d(x, effective, op == "LogSoftmax"), rtol=1e-5)


def test_softmax_opset11_axis1_differs_from_opset13() -> None:
    """The coercion matters: the same node at opset 13 normalizes one axis only."""
    x = rand(2, 3, 4, 5)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    old = run_reference(
        export_model(import_model(make_model([node], {"x": x}, ["y"], 11))), {"x": x}
    )
    new = run_reference(
        export_model(import_model(make_model([node], {"x": x}, ["y"], 13))), {"x": x}
    )
    np.testing.assert_allclose(old[0].reshape(2, -1).sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(new[0].sum(axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(old[0], new[0])


def test_softmax_opset11_with_empty_dimension() -> None:
    x = np.zeros((2, 0, 3), dtype=F32)
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": x}, ["y"], 11)
    graph = import_model(m)
    assert graph.types["y"] == TensorType((2, 0, 3), "float32")
    got = run_reference(export_model(graph), {"x": x})[0]
    assert got.shape == (2, 0, 3)


def _bn_params(channels: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "s": rng.uniform(0.5, 1.5, channels).astype(F32),
        "b": rng.standard_normal(channels).astype(F32),
        "m": rng.standard_normal(channels).astype(F32),
        "v": rng.uniform(0.5, 1.5, channels).astype(F32),
    }


@pytest.mark.parametrize(
    ("opset", "attrs", "outputs", "x_shape"),
    [
        (7, {"spatial": 1}, ["y"], (2, 3, 4, 5)),
        (7, {"spatial": 0}, ["y"], (4, 3)),  # (N, C): per-activation is per-channel
        (7, {"epsilon": 1e-3, "momentum": 0.8}, ["y", "", "", "", ""], (2, 3, 4)),
        (9, {}, ["y"], (2, 3, 4, 5)),
        (9, {"epsilon": 0.01}, ["y", "", "", "", ""], (2, 3, 2, 2, 2)),
        (14, {"training_mode": 0}, ["y"], (2, 3, 4, 5)),
        (15, {}, ["y", "", ""], (2, 3)),
    ],
)
def test_batchnorm_versions(
    opset: int, attrs: dict, outputs: list[str], x_shape: tuple[int, ...]
) -> None:
    x = rand(*x_shape)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outputs, **attrs)
    m = make_model([node], {"x": x}, ["y"], opset, _bn_params(3))
    # onnxruntime and the reference evaluator fail on the original with empty outputs
    graph = roundtrip(m, {"x": x}) if len(outputs) == 1 else import_model(m)
    (bn,) = graph.nodes
    assert bn.outputs == ("y",)
    assert "spatial" not in bn.attrs
    p = _bn_params(3)
    shape = (1, 3) + (1,) * (x.ndim - 2)
    eps = attrs.get("epsilon", 1e-5)
    want = (x - p["m"].reshape(shape)) / np.sqrt(p["v"].reshape(shape) + eps)
    want = want * p["s"].reshape(shape) + p["b"].reshape(shape)
    exported = export_model(graph)
    for got in (run_reference(exported, {"x": x})[0], run_ort(exported, {"x": x})[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _reduce_model(
    op: str, opset: int, x: np.ndarray, axes: list[int] | None, **attrs: int
) -> onnx.ModelProto:
    if axes is not None:
        attrs["axes"] = axes
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    out = TensorProto.INT64 if op == "ArgMax" else dtype_to_onnx(x.dtype.name)
    return make_model([node], {"x": x}, {"y": out}, opset)


@pytest.mark.parametrize(
    ("op", "opset", "axes", "keepdims"),
    [
        ("ReduceSum", 11, [1], 1),
        ("ReduceSum", 11, [0, -1], 0),
        ("ReduceSum", 11, None, 1),
        ("ReduceSum", 12, [-2], 0),
        ("ReduceMean", 13, [1, 2], 1),
        ("ReduceMean", 13, [-1], 0),
        ("ReduceMean", 11, None, 0),
        ("ReduceMax", 13, [2], 0),
        ("ReduceMax", 11, None, 1),
        ("ReduceL2", 11, [0, 2], 1),
        ("ReduceL2", 13, [1], 0),
    ],
)
def test_reduce_attribute_axes_become_an_input(
    op: str, opset: int, axes: list[int] | None, keepdims: int
) -> None:
    x = rand(3, 4, 5)
    graph = roundtrip(_reduce_model(op, opset, x, axes, keepdims=keepdims), {"x": x})
    (node,) = graph.nodes
    assert "axes" not in node.attrs
    if axes is None:
        assert node.inputs == ("x",)
    else:
        assert len(node.inputs) == 2
        value = graph.constants[node.inputs[1]]
        assert value.dtype == np.int64
        assert value.tolist() == axes


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_reduce_sum_opset13_axes_input_and_noop(dtype: str) -> None:
    x = (rand(3, 4, 5) * 10).astype(dtype)
    for axes, noop, keep in [([1], 0, 0), ([], 1, 1), ([], 0, 0), ([-1, 0], 0, 1)]:
        node = helper.make_node(
            "ReduceSum", ["x", "axes"], ["y"], keepdims=keep, noop_with_empty_axes=noop
        )
        m = make_model(
            [node],
            {"x": x},
            {"y": dtype_to_onnx(dtype)},
            13,
            {"axes": np.array(axes, dtype=np.int64)},
        )
        graph = roundtrip(m, {"x": x})
        if noop and not axes:
            assert graph.types["y"].shape == x.shape


@pytest.mark.parametrize(
    ("opset", "attrs"),
    [
        (11, {}),
        (11, {"axis": -1, "keepdims": 0}),
        (11, {"axis": 1}),
        (12, {"axis": 2, "select_last_index": 1}),
        (13, {"axis": -2, "keepdims": 0, "select_last_index": 1}),
    ],
)
def test_argmax_versions(opset: int, attrs: dict) -> None:
    x = np.random.default_rng(0).integers(0, 3, (3, 4, 5)).astype(F32)  # ties
    m = make_model(
        [helper.make_node("ArgMax", ["x"], ["y"], **attrs)],
        {"x": x},
        {"y": TensorProto.INT64},
        opset,
    )
    graph = roundtrip(m, {"x": x})
    assert graph.types["y"].dtype == "int64"


# --- (2) windows: Conv, ConvTranspose, pooling --------------------------------------------------

CONV_MATRIX = list(
    itertools.product(
        ["NOTSET", "PADS", "SAME_UPPER", "SAME_LOWER", "VALID"],
        [(1, 1), (2, 3)],
        [(1, 1), (2, 1)],
        [1, 2, 4],  # 4 = depthwise (C = group = 4)
    )
)


@pytest.mark.parametrize(("auto_pad", "strides", "dilations", "group"), CONV_MATRIX)
def test_conv_shape_matrix(
    auto_pad: str, strides: tuple[int, int], dilations: tuple[int, int], group: int
) -> None:
    x = rand(2, 4, 9, 8)
    w = rand(8, 4 // group, 3, 2, seed=1)
    b = rand(8, seed=2)
    attrs: dict = {"strides": list(strides), "dilations": list(dilations), "group": group}
    if auto_pad == "PADS":
        attrs["pads"] = [1, 0, 2, 1]
    else:
        attrs["auto_pad"] = auto_pad
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    m = make_model([node], {"x": x}, ["y"], 17, {"w": w, "b": b})
    # onnxruntime rejects dilations with SAME padding: the reference evaluator stands in
    same_dilated = auto_pad.startswith("SAME") and dilations != (1, 1)
    graph = roundtrip(m, {"x": x}, ort_original=not same_dilated)
    assert graph.types["y"].shape == onnx_shape(m)
    (conv,) = graph.nodes
    assert "auto_pad" not in conv.attrs
    assert conv.attrs["kernel_shape"] == (3, 2)
    assert len(conv.attrs["pads"]) == 4


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 2, 11), (3, 2, 4), {"strides": [2], "pads": [1, 2]}),
        ((1, 2, 11), (4, 1, 3), {"group": 2, "auto_pad": "SAME_UPPER", "dilations": [3]}),
        ((1, 2, 5, 6, 7), (4, 2, 3, 2, 3), {"strides": [1, 2, 2], "auto_pad": "SAME_LOWER"}),
        ((1, 4, 5, 6, 7), (4, 1, 2, 2, 2), {"group": 4, "pads": [0, 1, 0, 1, 0, 1]}),
        ((1, 3, 6, 6), (5, 3, 3, 3), {"kernel_shape": [3, 3]}),
    ],
)
def test_conv_1d_3d_and_kernel_shape(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict
) -> None:
    x = rand(*x_shape)
    m = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)],
        {"x": x},
        ["y"],
        17,
        {"w": rand(*w_shape, seed=1)},
    )
    same_dilated = "SAME" in attrs.get("auto_pad", "") and "dilations" in attrs
    graph = roundtrip(m, {"x": x}, ort_original=not same_dilated)
    assert graph.types["y"].shape == onnx_shape(m)


CONV_TRANSPOSE_CASES = [
    ({"strides": [2, 2]}, (2, 3, 3, 3)),
    ({"strides": [2, 3], "output_padding": [1, 2]}, (2, 3, 3, 3)),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (2, 3, 3, 3)),
    ({"strides": [2, 2], "auto_pad": "SAME_LOWER"}, (2, 3, 3, 3)),
    ({"strides": [4, 4], "auto_pad": "SAME_UPPER"}, (2, 3, 3, 3)),  # kernel < stride
    ({"strides": [2, 2], "output_shape": [10, 12]}, (2, 3, 3, 3)),  # odd total padding
    ({"strides": [2, 2], "output_shape": [9, 11]}, (2, 3, 3, 3)),
    ({"strides": [2, 2], "output_shape": [12, 14]}, (2, 3, 3, 3)),  # larger than natural
    ({"strides": [2, 2], "output_shape": [10, 12], "auto_pad": "SAME_UPPER"}, (2, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 0, 2, 1]}, (2, 3, 3, 3)),
    ({"strides": [2, 2], "dilations": [2, 1], "pads": [1, 0, 2, 1]}, (2, 3, 3, 3)),
    ({"auto_pad": "VALID"}, (2, 3, 3, 3)),
    ({"group": 2, "strides": [2, 1]}, (2, 2, 3, 3)),
    ({"group": 2, "strides": [1, 2], "kernel_shape": [3, 3]}, (2, 1, 3, 3)),  # depthwise
]


@pytest.mark.parametrize(("attrs", "w_shape"), CONV_TRANSPOSE_CASES)
def test_conv_transpose(attrs: dict, w_shape: tuple[int, ...]) -> None:
    x = rand(1, 2, 5, 6)
    m = make_model(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)],
        {"x": x},
        ["y"],
        17,
        {"w": rand(*w_shape, seed=1), "b": rand(w_shape[1] * attrs.get("group", 1), seed=2)},
    )
    # onnx's reference evaluator mishandles group > 1 with several channels per group
    graph = roundtrip(m, {"x": x}, reference=attrs.get("group", 1) == 1)
    assert graph.types["y"].shape == onnx_shape(m)
    (node,) = graph.nodes
    assert "auto_pad" not in node.attrs and "output_shape" not in node.attrs


def test_conv_transpose_same_with_output_padding_follows_onnxruntime() -> None:
    """SAME means output = input * stride (the spec and onnxruntime); onnx.shape_inference
    adds output_padding on top, which onnxruntime does not produce."""
    x = rand(1, 2, 5, 6)
    attrs = {"strides": [3, 3], "auto_pad": "SAME_UPPER", "output_padding": [1, 1]}
    m = make_model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)],
        {"x": x},
        ["y"],
        17,
        {"w": rand(2, 3, 3, 3, seed=1)},
    )
    graph = roundtrip(m, {"x": x})
    assert graph.types["y"].shape == (1, 3, 15, 18)


POOL_CASES = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [3, 3], "pads": [1, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [3, 2], "ceil_mode": 1},  # last window would start outside
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 2, 1, 0], "count_include_pad": 1},
    {
        "kernel_shape": [3, 3],
        "strides": [2, 2],
        "pads": [1, 1, 1, 1],
        "ceil_mode": 1,
        "count_include_pad": 1,
    },
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2], "count_include_pad": 1},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1},
]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", POOL_CASES)
def test_pool_shapes_and_values(op: str, attrs: dict) -> None:
    if op == "MaxPool":
        attrs = {k: v for k, v in attrs.items() if k != "count_include_pad"}
    x = rand(1, 2, 7, 8)
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"], 21)
    # the reference evaluator's MaxPool gets SAME_LOWER with strides wrong (floor(in / s))
    buggy = op == "MaxPool" and attrs.get("auto_pad") == "SAME_LOWER" and "strides" in attrs
    graph = roundtrip(m, {"x": x}, reference=not buggy)
    if not attrs.get("ceil_mode"):  # onnx 1.23's inference lacks the ceil_mode correction
        assert graph.types["y"].shape == onnx_shape(m)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_1d_and_3d(op: str) -> None:
    for x, attrs in [
        (rand(1, 3, 10), {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}),
        # ceil mode: the only window starts in the input and hangs over the end
        (rand(1, 3, 2), {"kernel_shape": [4], "strides": [3], "pads": [1, 0], "ceil_mode": 1}),
        (rand(1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    ]:
        m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"], 21)
        # the reference evaluator's padded 3-D MaxPool indexes out of bounds
        graph = roundtrip(m, {"x": x}, reference=not (op == "MaxPool" and x.ndim == 5))
        assert graph.types["y"].shape == onnx_shape(m)


def test_maxpool_unused_indices_output_is_dropped() -> None:
    x = rand(1, 2, 6, 6)
    node = helper.make_node("MaxPool", ["x"], ["y", ""], kernel_shape=[2, 2], storage_order=1)
    graph = roundtrip(make_model([node], {"x": x}, ["y"], 12), {"x": x})
    assert graph.nodes[0].outputs == ("y",)
    assert "storage_order" not in graph.nodes[0].attrs


def test_maxpool_indices_output_is_int64_and_keeps_storage_order() -> None:
    x = rand(2, 3, 7, 6)
    node = helper.make_node(
        "MaxPool", ["x"], ["y", "idx"], kernel_shape=[3, 2], strides=[2, 2], storage_order=1
    )
    outputs = {"y": TensorProto.FLOAT, "idx": TensorProto.INT64}
    graph = import_model(make_model([node], {"x": x}, outputs, 12))
    assert graph.types["idx"] == TensorType((2, 3, 3, 3), "int64")
    assert graph.nodes[0].outputs == ("y", "idx")
    assert graph.nodes[0].attrs["storage_order"] == 1


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op: str) -> None:
    for x in (rand(2, 3, 4), rand(2, 3, 4, 5), rand(1, 2, 3, 4, 5)):
        m = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"], 17)
        # the reference evaluator's GlobalMaxPool is right for 4-D inputs only
        graph = roundtrip(m, {"x": x}, reference=op == "GlobalAveragePool" or x.ndim == 4)
        assert graph.types["y"].shape == onnx_shape(m)


def test_normalizations_and_lrn() -> None:
    x = rand(2, 3, 4, 5)
    p = _bn_params(3)
    nodes = [
        helper.make_node("InstanceNormalization", ["x", "s", "b"], ["i"], epsilon=1e-3),
        helper.make_node("LRN", ["i"], ["l"], size=3, alpha=1e-3, beta=0.6, bias=1.5),
        helper.make_node("LayerNormalization", ["l", "g", "t"], ["n", "", ""], axis=2),
        helper.make_node("LayerNormalization", ["n", "g1"], ["y"]),
    ]
    inits = {
        "s": p["s"],
        "b": p["b"],
        "g": rand(4, 5, seed=3),
        "t": rand(1, 5, seed=4),
        "g1": rand(5, seed=5),
    }
    # the reference evaluator's LRN loops over the batch instead of the channels
    graph = roundtrip(make_model(nodes, {"x": x}, ["y"], 17, inits), {"x": x}, reference=False)
    assert [n.outputs for n in graph.nodes][2] == ("n",)


def test_layer_norm_statistics_outputs() -> None:
    """Mean and InvStdDev are float32, X's shape with the normalized axes kept as 1."""
    inputs = {"x": np.zeros((2, 3, 4), F32), "s": np.zeros((3, 4), F32)}
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], axis=1)
    graph = import_model(make_model([node], inputs, ["y", "mean", "inv"], 17))
    assert graph.types["mean"].shape == (2, 1, 1) and graph.types["mean"].dtype == "float32"
    assert graph.types["inv"].shape == (2, 1, 1)


# --- Gemm, MatMul, Einsum ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "c", "attrs"),
    [
        ((3, 4), (4, 5), None, {}),
        ((4, 3), (4, 5), (5,), {"transA": 1}),
        ((3, 4), (5, 4), (3, 1), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
        ((4, 3), (5, 4), (), {"transA": 1, "transB": 1}),
        ((3, 4), (4, 5), (3, 5), {"beta": -1.0}),
        ((3, 4), (4, 5), (1,), {}),
    ],
)
def test_gemm(a: tuple, b: tuple, c: tuple | None, attrs: dict) -> None:
    feeds = {"a": rand(*a), "b": rand(*b, seed=1)}
    inputs = ["a", "b"]
    if c is not None:
        feeds["c"] = rand(*c, seed=2) if c else np.array(0.7, dtype=F32)
        inputs.append("c")
    m = make_model([helper.make_node("Gemm", inputs, ["y"], **attrs)], feeds, ["y"], 13)
    graph = roundtrip(m, feeds)
    assert graph.types["y"].shape == onnx_shape(m)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((3, 4), (4, 5)),
        ((4,), (4,)),
        ((4,), (2, 4, 5)),
        ((2, 3, 4), (4,)),
        ((2, 1, 3, 4), (5, 4, 6)),
        ((1, 3, 4), (2, 4, 6)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_matmul(a: tuple, b: tuple, dtype: str) -> None:
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(-5, 5, a).astype(dtype), "b": rng.integers(-5, 5, b).astype(dtype)}
    m = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], feeds, {"y": dtype_to_onnx(dtype)}, 13
    )
    graph = roundtrip(m, feeds, reference=True)
    assert graph.types["y"].shape == np.matmul(feeds["a"], feeds["b"]).shape


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("ij,jk", [(3, 4), (4, 5)]),  # implicit output: ik
        ("ba,ac", [(3, 4), (4, 5)]),  # implicit output is sorted: bc
        ("ij->ji", [(3, 4)]),
        ("ii->i", [(4, 4)]),
        ("ii", [(4, 4)]),  # trace
        ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
        ("...ij,...jk", [(2, 1, 3, 4), (2, 5, 4, 6)]),  # implicit with broadcast ellipsis
        ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),  # spaces
        ("Ab,bA->A", [(3, 4), (4, 3)]),  # upper case
        ("i,i", [(5,), (5,)]),
        ("i,j->ij", [(3,), (4,)]),
        ("...ii->...i", [(2, 3, 3)]),
        ("ij...,jk...->ik...", [(3, 4, 2), (4, 5, 2)]),
        ("abc->", [(2, 3, 4)]),
    ],
)
def test_einsum(equation: str, shapes: list[tuple[int, ...]]) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    feeds = {n: rand(*s, seed=i) for i, (n, s) in enumerate(zip(names, shapes, strict=True))}
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    m = make_model([node], feeds, ["y"], 12)
    graph = roundtrip(m, feeds)
    want = np.einsum(equation.replace(" ", ""), *feeds.values())
    assert graph.types["y"].shape == want.shape


# --- numpy folding agrees with the reference evaluator -------------------------------------------

FOLD_CASES = [
    ("MatMul", [(2, 3, 4), (4, 5)], {}),
    ("Gemm", [(3, 4), (5, 4), (5,)], {"transB": 1, "alpha": 0.3, "beta": 1.7}),
    ("Softmax", [(2, 3, 4)], {"axis": 1}),
    ("LogSoftmax", [(2, 3, 4)], {}),
    ("BatchNormalization", [(2, 3, 4), (3,), (3,), (3,), (3,)], {"epsilon": 0.1}),
    ("Einsum", [(2, 3, 4), (2, 4, 5)], {"equation": "bij,bjk->bki"}),
    ("ReduceSum", [(3, 4, 5)], {"keepdims": 0}),
    ("ReduceMean", [(3, 4, 5)], {}),
    ("ReduceMax", [(3, 4, 5)], {"keepdims": 0}),
    ("ReduceL2", [(3, 4, 5)], {}),
    ("ArgMax", [(3, 4, 5)], {"axis": 1, "select_last_index": 1}),
    ("ArgMax", [(3, 4, 5)], {"axis": -1, "keepdims": 0}),
]


@pytest.mark.parametrize(("op", "shapes", "attrs"), FOLD_CASES)
def test_numpy_evaluate_matches_reference(op: str, shapes: list, attrs: dict) -> None:
    rng = np.random.default_rng(0)
    values = [rng.uniform(0.1, 2.0, s).astype(F32) for s in shapes]
    names = [f"x{i}" for i in range(len(values))]
    extra: list[tuple[str, np.ndarray]] = []
    if op.startswith("Reduce"):
        extra = [("axes", np.array([0, -1], dtype=np.int64))]
    proto = helper.make_node(op, names + [n for n, _ in extra], ["y"], **attrs)
    node_values = values + [v for _, v in extra]
    node = Node(
        "n",
        op,
        tuple(proto.input),
        ("y",),
        {a.name: attribute_value(a, "n") for a in proto.attribute},
    )
    ctx = InferContext(
        node,
        [TensorType(v.shape, v.dtype.name) for v in node_values],
        node_values,
        21,
    )
    (out_type,) = OPS[op].infer(ctx)
    (got,) = OPS[op].evaluate(ctx, node_values)
    feeds = dict(zip(names, values, strict=True)) | dict(extra)
    out = TensorProto.INT64 if op == "ArgMax" else TensorProto.FLOAT
    m = make_model([proto], feeds, {"y": out}, 21)
    (want,) = run_reference(m, feeds)
    assert got.shape == out_type.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
