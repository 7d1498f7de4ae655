"""Tensor ops (frontend/ops/tensor.py): older op versions canonicalize to the opset-21 form
and compute what the original model computes; shape chains give static shapes; bad
parameters give errors naming the node; the numpy folding agrees with the ONNX node tests."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polytile.errors import ShapeError, UnsupportedOpError
from polytile.frontend.graph import Graph
from polytile.frontend.importer import import_model
from polytile.frontend.onnx_io import export_model
from polytile.frontend.passes import fold_constants

from graphs import batch_flatten_chain
from node_cases import cases_for, feeds_of

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
INT_MAX = 2**63 - 1


def make(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, tuple[Sequence[int], int]],
    outputs: dict[str, int | tuple[Sequence[int], int]],
    opset: int,
    initializers: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """A model at `opset` (with the IR version that goes with it, for onnxruntime); output
    types given as a bare dtype are left to onnx's shape inference."""
    graph = helper.make_graph(
        list(nodes),
        "tensor_ops",
        [helper.make_tensor_value_info(k, t, list(s)) for k, (s, t) in inputs.items()],
        [
            helper.make_tensor_value_info(k, t[1], list(t[0]))
            if isinstance(t, tuple)
            else helper.make_empty_tensor_value_info(k)
            for k, t in outputs.items()
        ],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    model = helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", opset)])
    if not all(isinstance(t, tuple) for t in outputs.values()):
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for value in model.graph.output:
        declared = outputs[value.name]
        assert value.type.tensor_type.elem_type == (
            declared[1] if isinstance(declared, tuple) else declared
        )
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle: str) -> list[np.ndarray]:
    if oracle == "ort":
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return [np.asarray(v) for v in session.run(None, feeds)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def assert_same(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        assert g.dtype == e.dtype
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, e)


def roundtrip(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle: str = "reference"
) -> Graph:
    """Import, export at the canonical opset, and compare with the original model."""
    expected = run(model, feeds, oracle)
    graph = import_model(model)
    assert graph.opset == max(model.opset_import[0].version, 21)
    exported = export_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    got = run(exported, feeds, oracle)
    for name, value in zip(graph.outputs, expected, strict=True):
        assert graph.types[name].shape == value.shape
        assert graph.types[name].dtype == value.dtype.name
    assert_same(got, expected)
    return graph


def data(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=dtype).reshape(shape) + 1


def nodes_of(graph: Graph, op_type: str) -> list:
    return [n for n in graph.nodes if n.op_type == op_type]


# --- old opset versions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("axes", "shape"),
    [((1, -1), (3, 1, 4, 1)), (None, (1, 3, 1, 4)), ((0,), (1, 2))],
)
def test_squeeze_11_axes_attribute(axes: tuple[int, ...] | None, shape: tuple[int, ...]) -> None:
    kwargs = {} if axes is None else {"axes": list(axes)}
    m = make(
        [helper.make_node("Squeeze", ["x"], ["y"], **kwargs)], {"x": (shape, F32)}, {"y": F32}, 11
    )
    graph = roundtrip(m, {"x": data(*shape)})
    (node,) = nodes_of(graph, "Squeeze")
    assert not node.attrs
    assert len(node.inputs) == (1 if axes is None else 2)


def test_squeeze_11_empty_axes_squeezes_every_unit_axis() -> None:
    node = helper.make_node("Squeeze", ["x"], ["y"])
    node.attribute.append(helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS))
    m = make([node], {"x": ((1, 3, 1), F32)}, {"y": ((3,), F32)}, 11)
    graph = roundtrip(m, {"x": data(1, 3, 1)})
    assert graph.types["y"].shape == (3,)


@pytest.mark.parametrize("axes", [(0,), (0, -1), (3, 1)])
def test_unsqueeze_11_axes_attribute(axes: tuple[int, ...]) -> None:
    m = make(
        [helper.make_node("Unsqueeze", ["x"], ["y"], axes=list(axes))],
        {"x": ((2, 3), F32)},
        {"y": F32},
        11,
    )
    # the reference evaluator's Unsqueeze-11 inserts axes one by one (wrong for unsorted)
    graph = roundtrip(m, {"x": data(2, 3)}, oracle="ort")
    (node,) = nodes_of(graph, "Unsqueeze")
    assert not node.attrs and len(node.inputs) == 2
    assert graph.constants[node.inputs[1]].dtype == np.int64


@pytest.mark.parametrize(
    ("attrs", "shape", "outputs"),
    [
        ({"axis": 1, "split": [1, 3]}, (2, 4, 6), 2),
        ({"axis": -1}, (2, 4, 6), 3),
        ({"split": [2, 0, 4]}, (6, 4), 3),
    ],
)
def test_split_11(attrs: dict, shape: tuple[int, ...], outputs: int) -> None:
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node("Split", ["x"], names, **attrs)
    m = make([node], {"x": (shape, F32)}, dict.fromkeys(names, F32), 11)
    graph = roundtrip(m, {"x": data(*shape)})
    (split,) = nodes_of(graph, "Split")
    assert "split" not in split.attrs


def test_split_13_without_sizes_becomes_num_outputs() -> None:
    m = make(
        [helper.make_node("Split", ["x"], ["a", "b"], axis=0)],
        {"x": ((4, 3), F32)},
        {"a": F32, "b": F32},
        13,
    )
    graph = roundtrip(m, {"x": data(4, 3)})
    assert nodes_of(graph, "Split")[0].attrs["num_outputs"] == 2


def test_split_18_uneven_last_chunk() -> None:
    m = make(
        [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)],
        {"x": ((2, 7), F32)},
        {"a": F32, "b": F32, "c": F32},
        18,
    )
    graph = roundtrip(m, {"x": data(2, 7)})
    assert [graph.types[o].shape for o in graph.outputs] == [(2, 3), (2, 3), (2, 1)]


def test_split_13_uneven_equal_split_is_an_error() -> None:
    m = make(
        [helper.make_node("Split", ["x"], ["a", "b"], name="halve")],
        {"x": ((5,), F32)},
        {"a": ((3,), F32), "b": ((2,), F32)},
        13,
    )
    with pytest.raises(ShapeError, match=r"node 'halve' \(Split\).*equal parts"):
        import_model(m)


@pytest.mark.parametrize(
    "attrs",
    [
        {"starts": [1, 0], "ends": [3, INT_MAX], "axes": [0, 2]},
        {"starts": [-2], "ends": [INT_MAX], "axes": [-1]},
        {"starts": [0, 1], "ends": [-1, 100]},
        {"starts": [-100], "ends": [2], "axes": [1]},
    ],
)
def test_slice_9_attributes(attrs: dict) -> None:
    m = make(
        [helper.make_node("Slice", ["x"], ["y"], **attrs)], {"x": ((4, 5, 6), F32)}, {"y": F32}, 9
    )
    graph = roundtrip(m, {"x": data(4, 5, 6)})
    (node,) = nodes_of(graph, "Slice")
    assert not node.attrs and len(node.inputs) == (4 if "axes" in attrs else 3)


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([-1], [-INT_MAX], [1], [-1]),
        ([10], [-10], [0], [-2]),
        ([4, -1], [0, 0], [0, 2], [-3, -2]),
        ([-(2**63)], [INT_MAX], [2], [4]),
        ([3], [1], [0], [1]),
    ],
)
def test_slice_negative_and_clamped(starts: list, ends: list, axes: list, steps: list) -> None:
    inits = {
        "starts": np.array(starts, np.int64),
        "ends": np.array(ends, np.int64),
        "axes": np.array(axes, np.int64),
        "steps": np.array(steps, np.int64),
    }
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    m = make([node], {"x": ((5, 4, 6), F32)}, {"y": F32}, 13, inits)
    roundtrip(m, {"x": data(5, 4, 6)})


@pytest.mark.parametrize("opset", [7, 10])
@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 0, 2, 0, 3, 1]},
        {"pads": [0, 2, 1, 1, 0, 3], "value": 1.5},
        {"pads": [0, 2, 1, 0, 1, 2], "mode": "reflect"},
        {"pads": [1, 1, 0, 2, 0, 1], "mode": "edge"},
    ],
)
def test_pad_2_attributes(opset: int, attrs: dict) -> None:
    m = make(
        [helper.make_node("Pad", ["x"], ["y"], **attrs)], {"x": ((2, 3, 4), F32)}, {"y": F32}, opset
    )
    graph = roundtrip(m, {"x": data(2, 3, 4)})
    (node,) = nodes_of(graph, "Pad")
    assert set(node.attrs) <= {"mode"}
    assert graph.constants[node.inputs[1]].dtype == np.int64


def test_pad_negative_pads_crop() -> None:
    m = make(
        [helper.make_node("Pad", ["x", "pads", "v"], ["y"])],
        {"x": ((3, 4), F32)},
        {"y": F32},
        13,
        {"pads": np.array([-1, 2, 1, -2], np.int64), "v": np.array(7.0, np.float32)},
    )
    roundtrip(m, {"x": data(3, 4)}, oracle="ort")


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_18_axes(mode: str) -> None:
    m = make(
        [helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode=mode)],
        {"x": ((2, 3, 4), F32)},
        {"y": F32},
        19,
        {"pads": np.array([1, 2, 2, 3], np.int64), "axes": np.array([-1, 1], np.int64)},
    )
    roundtrip(m, {"x": data(2, 3, 4)})


@pytest.mark.parametrize("opset", [7, 10])
@pytest.mark.parametrize("mask", [False, True])
def test_dropout_ratio_attribute(opset: int, mask: bool) -> None:
    mask_type = ((2, 5), F32 if opset < 10 else TensorProto.BOOL)
    outputs = {"y": ((2, 5), F32), "m": mask_type} if mask else {"y": ((2, 5), F32)}
    node = helper.make_node("Dropout", ["x"], list(outputs), ratio=0.3)
    m = make([node], {"x": ((2, 5), F32)}, outputs, opset)
    x = data(2, 5)
    graph = import_model(m)
    dropouts = nodes_of(graph, "Dropout")
    assert len(dropouts) == 1 and not dropouts[0].attrs
    got = run(export_model(graph), {"x": x}, "reference")
    np.testing.assert_array_equal(got[0], x)
    if mask:
        # the mask keeps every element; Dropout-7's mask has the data's type, later bool
        want = np.ones(x.shape, dtype=np.float32 if opset < 10 else bool)
        assert graph.types["m"].dtype == want.dtype.name
        assert_same(got[1:], [want])
    if opset == 10 or not mask:
        roundtrip(m, {"x": x})


def test_dropout_training_mode() -> None:
    def dropout(ratio: float) -> onnx.ModelProto:
        inits = {"r": np.array(ratio, np.float32), "t": np.array(True)}
        node = helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")
        return make([node], {"x": ((3,), F32)}, {"y": F32}, 13, inits)

    roundtrip(dropout(0.0), {"x": data(3)})
    with pytest.raises(UnsupportedOpError, match=r"node 'drop' \(Dropout\).*training"):
        import_model(dropout(0.5))


RESIZE10_SCALES = [(1, 1, 2, 1.5), (1, 1, 0.6, 0.6), (1, 1, 0.5, 2.5), (1, 1, 3, 1)]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", RESIZE10_SCALES)
def test_resize_10(mode: str, scales: tuple[float, ...]) -> None:
    """Resize-10 (onnxruntime's reading: asymmetric coordinates; nearest rounds down when
    upsampling an axis and up when downsampling it)."""
    m = make(
        [helper.make_node("Resize", ["x", "scales"], ["y"], mode=mode)],
        {"x": ((1, 2, 4, 5), F32)},
        {"y": F32},
        10,
        {"scales": np.array(scales, np.float32)},
    )
    graph = roundtrip(m, {"x": data(1, 2, 4, 5)}, oracle="ort")
    for node in nodes_of(graph, "Resize"):
        assert node.attrs["coordinate_transformation_mode"] == "asymmetric"


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "tf_half_pixel_for_nn",
            "nearest_mode": "floor",
        },
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        {"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "ceil"},
    ],
)
@pytest.mark.parametrize("sizes", [False, True])
def test_resize_11(attrs: dict, sizes: bool) -> None:
    """Resize-11 needs roi and scales inputs; with sizes they are empty tensors."""
    inits = {"roi": np.zeros((0,), np.float32)}
    if sizes:
        inits |= {"scales": np.zeros((0,), np.float32), "sizes": np.array([1, 2, 7, 3], np.int64)}
    else:
        inits |= {"scales": np.array([1, 1, 1.75, 0.6], np.float32)}
    m = make(
        [helper.make_node("Resize", ["x", *inits], ["y"], **attrs)],
        {"x": ((1, 2, 4, 5), F32)},
        {"y": F32},
        11,
        inits,
    )
    graph = roundtrip(m, {"x": data(1, 2, 4, 5)}, oracle="ort")
    (node,) = nodes_of(graph, "Resize")
    assert node.inputs[1] == "" and ("" if sizes else "scales") == node.inputs[2]
    assert node.attrs["coordinate_transformation_mode"] != "tf_half_pixel_for_nn"


def test_resize_tf_half_pixel_for_nn_without_equivalent_is_unsupported() -> None:
    node = helper.make_node(
        "Resize",
        ["x", "roi", "scales"],
        ["y"],
        name="up",
        mode="linear",
        coordinate_transformation_mode="tf_half_pixel_for_nn",
    )
    inits = {"roi": np.zeros((0,), np.float32), "scales": np.array([1, 2], np.float32)}
    m = make([node], {"x": ((2, 3), F32)}, {"y": F32}, 11, inits)
    with pytest.raises(UnsupportedOpError, match=r"node 'up' \(Resize\)"):
        import_model(m)


@pytest.mark.parametrize(
    ("x_shape", "shape", "allowzero"),
    [
        ((0, 4), (0, 2, 2), 1),
        ((2, 0, 6), (2, 0, 6), 0),
        ((2, 3, 4), (0, -1), 0),
        ((2, 3, 4), (4, 0, 2), 0),
        ((4, 3), (3, 4), 1),
        ((4, 3), (-1,), 1),
    ],
)
def test_reshape_14_allowzero(
    x_shape: tuple[int, ...], shape: tuple[int, ...], allowzero: int
) -> None:
    m = make(
        [helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=allowzero)],
        {"x": (x_shape, F32)},
        {"y": F32},
        14,
        {"s": np.array(shape, np.int64)},
    )
    roundtrip(m, {"x": np.arange(np.prod(x_shape), dtype=np.float32).reshape(x_shape)})


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"start": 1},
        {"end": -1},
        {"start": -10},
        {"end": 10},
        {"start": 3, "end": 1},
        {"start": -2, "end": 3},
    ],
)
def test_shape_15_start_end(attrs: dict) -> None:
    m = make(
        [helper.make_node("Shape", ["x"], ["y"], **attrs)], {"x": ((2, 3, 4), F32)}, {"y": I64}, 15
    )
    roundtrip(m, {"x": data(2, 3, 4)})


def test_constant_attribute_forms() -> None:
    values = {
        "a": {"value_float": 1.5},
        "b": {"value_floats": [1.0, 2.0]},
        "c": {"value_int": 3},
        "d": {"value_ints": [4, 5, 6]},
        "e": {"value": numpy_helper.from_array(np.array([[1, 2]], np.int32))},
    }
    nodes = [helper.make_node("Constant", [], [k], **v) for k, v in values.items()]
    outputs = {"a": F32, "b": F32, "c": I64, "d": I64, "e": TensorProto.INT32}
    graph = roundtrip(make(nodes, {}, outputs, 13), {})
    assert graph.types["e"].shape == (1, 2) and graph.types["a"].shape == ()


def test_constant_string_is_unsupported() -> None:
    node = helper.make_node("Constant", [], ["s"], name="text", value_string="hi")
    m = make([node], {}, {"s": TensorProto.STRING}, 13)
    with pytest.raises(UnsupportedOpError, match=r"node 'text' \(Constant\).*string"):
        import_model(m)


# --- shape chains ------------------------------------------------------------------------


def test_shape_chain_gives_reshape_a_static_shape() -> None:
    """Shape → Gather → Unsqueeze → Concat of a graph input's shape feeds a Reshape."""
    nodes, inits = batch_flatten_chain("x", "y")
    m = make(nodes, {"x": ((3, 4, 5), F32)}, {"y": F32}, 17, inits)
    graph = roundtrip(m, {"x": data(3, 4, 5)})
    assert graph.types["y"].shape == (3, 20)
    assert graph.types["batch"].shape == ()


def test_shape_chain_with_dynamic_input_dims() -> None:
    """A model with a symbolic batch dim gets static shapes once the input shape is given."""
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], end=1),
        helper.make_node("Concat", ["x_shape", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph_proto = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", F32, ["batch", 4, 5])],
        [helper.make_tensor_value_info("y", F32, None)],
        initializer=[numpy_helper.from_array(np.array([-1], np.int64), "minus1")],
    )
    m = helper.make_model_gen_version(graph_proto, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ShapeError, match="dynamic dimension"):
        import_model(m)
    graph = import_model(m, input_shapes={"x": (2, 4, 5)})
    assert graph.types["y"].shape == (2, 20)
    x = data(2, 4, 5)
    assert_same(run(export_model(graph), {"x": x}, "reference"), [x.reshape(2, 20)])


# --- errors naming the node --------------------------------------------------------------


def test_reshape_with_runtime_shape_is_a_shape_error() -> None:
    m = make(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="flatten_it")],
        {"x": ((2, 3), F32), "s": ((2,), I64)},
        {"y": ((3, 2), F32)},
        13,
    )
    with pytest.raises(ShapeError, match=r"node 'flatten_it' \(Reshape\).*input 1 \('s'"):
        import_model(m)


BAD = [
    (
        "Concat",
        [helper.make_node("Concat", ["x", "w"], ["y"], name="bad", axis=0)],
        {"x": ((2, 3), F32), "w": ((2, 4), F32)},
        {},
        "does not match",
    ),
    (
        "Reshape",
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad")],
        {"x": ((2, 3), F32)},
        {"s": np.array([4, -1], np.int64)},
        "cannot reshape",
    ),
    (
        "Squeeze",
        [helper.make_node("Squeeze", ["x", "a"], ["y"], name="bad")],
        {"x": ((2, 3), F32)},
        {"a": np.array([0], np.int64)},
        "cannot squeeze axis 0",
    ),
    (
        "Gather",
        [helper.make_node("Gather", ["x", "i"], ["y"], name="bad", axis=1)],
        {"x": ((2, 3), F32)},
        {"i": np.array([0, -4], np.int64)},
        "index -4 is out of range",
    ),
    (
        "Split",
        [helper.make_node("Split", ["x", "s"], ["y", "z"], name="bad")],
        {"x": ((5, 3), F32)},
        {"s": np.array([2, 2], np.int64)},
        "split sizes",
    ),
    (
        "Slice",
        [helper.make_node("Slice", ["x", "a", "b", "c", "d"], ["y"], name="bad")],
        {"x": ((5, 3), F32)},
        {k: np.array([v], np.int64) for k, v in {"a": 0, "b": 2, "c": 0, "d": 0}.items()},
        "step for axis 0 is 0",
    ),
    (
        "Tile",
        [helper.make_node("Tile", ["x", "r"], ["y"], name="bad")],
        {"x": ((5, 3), F32)},
        {"r": np.array([2], np.int64)},
        "repeats",
    ),
    (
        "Transpose",
        [helper.make_node("Transpose", ["x"], ["y"], name="bad", perm=[0, 0])],
        {"x": ((5, 3), F32)},
        {},
        "not a permutation",
    ),
    (
        "Unsqueeze",
        [helper.make_node("Unsqueeze", ["x", "a"], ["y"], name="bad")],
        {"x": ((5, 3), F32)},
        {"a": np.array([1, -3], np.int64)},
        "repeat an axis",
    ),
    (
        "Expand",
        [helper.make_node("Expand", ["x", "s"], ["y"], name="bad")],
        {"x": ((5, 3), F32)},
        {"s": np.array([4, 3], np.int64)},
        "do not broadcast",
    ),
    (
        "Pad",
        [helper.make_node("Pad", ["x", "p"], ["y"], name="bad")],
        {"x": ((5, 3), F32)},
        {"p": np.array([1, 1, 1], np.int64)},
        "pads",
    ),
    (
        "Resize",
        [helper.make_node("Resize", ["x", "", "sc", "sz"], ["y"], name="bad")],
        {"x": ((5, 3), F32)},
        {"sc": np.array([1, 2], np.float32), "sz": np.array([5, 6], np.int64)},
        "exactly one of the scales and sizes",
    ),
    (
        "Flatten",
        [helper.make_node("Flatten", ["x"], ["y"], name="bad", axis=3)],
        {"x": ((5, 3), F32)},
        {},
        "axis 3 is out of range",
    ),
    (
        "Range",
        [helper.make_node("Range", ["a", "b", "c"], ["y"], name="bad")],
        {},
        {k: np.array(v, np.int64) for k, v in {"a": 0, "b": 5, "c": 0}.items()},
        "delta is 0",
    ),
]


@pytest.mark.parametrize(
    ("op_type", "nodes", "inputs", "inits", "message"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_parameters_name_the_node(
    op_type: str, nodes: list, inputs: dict, inits: dict, message: str
) -> None:
    graph = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info(k, t, list(s)) for k, (s, t) in inputs.items()],
        [helper.make_tensor_value_info("y", F32 if op_type != "Range" else I64, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ShapeError, match=rf"node 'bad' \({op_type}\) in model .*{message}"):
        import_model(m)


def test_resize_nearest_antialias_is_unsupported() -> None:
    """antialias filters linear and cubic only; with nearest it has no meaning."""
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], name="aa", mode="nearest", antialias=1)
    m = make([node], {"x": ((4, 4), F32)}, {"y": F32}, 18, {"s": np.array([0.5, 0.5], np.float32)})
    with pytest.raises(UnsupportedOpError, match=r"node 'aa' \(Resize\).*antialias"):
        import_model(m)


# --- numpy folding agrees with the ONNX node tests ---------------------------------------

FOLDED = {
    "Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Reshape", "ConstantOfShape",
    "Constant", "Range", "Expand", "Tile", "Transpose", "Flatten", "Identity", "Split", "Pad",
    "Dropout",
}  # fmt: skip
FOLD_CASES = [
    c
    for c in cases_for(FOLDED)
    if {n.op_type for n in c.model.graph.node} <= FOLDED and not c.name.startswith("test_training")
]


@pytest.mark.parametrize("case", FOLD_CASES, ids=[c.name for c in FOLD_CASES])
def test_numpy_folding_matches_node_tests(case) -> None:
    """With every input bound, import + fold_constants computes the outputs through the ops'
    numpy `evaluate`; they must equal the expected outputs."""
    feeds, expected = feeds_of(case)
    try:
        graph = fold_constants(import_model(case.model, bind=feeds, name=case.name))
    except UnsupportedOpError as exc:
        pytest.skip(f"unsupported variant: {exc}")
    assert not graph.nodes
    assert_same([graph.constants[o] for o in graph.outputs], expected)


CENTER_CROP = [c for c in cases_for({"Pad"}) if c.name.startswith("test_center_crop_pad")]


@pytest.mark.parametrize("case", CENTER_CROP, ids=[c.name for c in CENTER_CROP])
def test_center_crop_pad_shape_chain(case) -> None:
    """CenterCropPad's expansion computes Pad's pads and Slice's starts / ends from the
    target-shape input through Max / Sub / Div / Concat: once that input is bound, the
    chain folds and Pad and Slice get static shapes."""
    feeds, expected = feeds_of(case)
    graph = import_model(case.model, bind={"shape": feeds.pop("shape")}, name=case.name)
    assert_same(run(export_model(graph), feeds, "reference"), expected)
