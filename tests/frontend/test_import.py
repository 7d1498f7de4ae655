"""Loading from every source kind, IR-3 weights, input shapes, and one clear error per
kind of bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile.errors import InputError, ModelError, ShapeError, UnsupportedOpError
from polytile.frontend import import_model
from polytile.frontend.importer import parameter_inputs

from graphs import assert_same, model


def relu_model() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, {"y": (2, 3)})


def reshape_by_input() -> onnx.ModelProto:
    """Reshape 'rs' of a float [2, 3] input 'x' to the shape in int64 [2] input 'shape'."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
        "rs",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sources_path_bytes_and_proto(tmp_path: Path) -> None:
    m = relu_model()
    path = tmp_path / "relu.onnx"
    onnx.save(m, path)
    graphs = [
        import_model(path),
        import_model(str(path)),
        import_model(m.SerializeToString()),
        import_model(m),
    ]
    for g in graphs:
        assert g.inputs == ("x",) and g.outputs == ("y",)
        assert g.types["y"].shape == (2, 3) and g.types["y"].dtype == "float32"
    assert graphs[0].name == "relu"


def test_ir3_weights_listed_as_inputs_are_constants() -> None:
    w = np.ones((3, 3), np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "ir3",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 3
    g = import_model(m)
    assert g.inputs == ("x",) and "w" in g.constants
    assert_same(m, g)


def test_missing_file() -> None:
    with pytest.raises(InputError, match="does not exist"):
        import_model("/nonexistent/model.onnx")


def test_truncated_file(tmp_path: Path) -> None:
    data = relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"cut\.onnx"):
        import_model(path)


def test_not_onnx(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("these are not the protobufs you are looking for\n" * 20)
    with pytest.raises(ModelError, match=r"notes\.onnx"):
        import_model(path)
    with pytest.raises(ModelError):
        import_model(b"\x00\x01garbage")


def test_wrong_argument_type() -> None:
    with pytest.raises(InputError, match="int"):
        import_model(42)  # type: ignore[arg-type]


def test_checker_failure_names_the_model() -> None:
    m = relu_model()
    m.graph.node[0].input[0] = "nowhere"
    with pytest.raises(ModelError, match="checker"):
        import_model(m, name="broken")


def test_unknown_domain_and_all_unsupported_ops_and_variants_listed_at_once() -> None:
    """Ops and variants of supported ops are reported together; an unsupported op is
    reported even after a refused node, but a supported node reading a refused node's
    output is not (its inputs have no type)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("Det", ["a"], ["b"], name="det1"),
        helper.make_node("Relu", ["b"], ["b2"], name="after_det"),
        helper.make_node("Det", ["b2"], ["b3"], name="det3"),
        helper.make_node("Det", ["x"], ["c"], name="det2"),
        helper.make_node("FancyOp", ["a"], ["d"], name="fancy", domain="com.example"),
        helper.make_node(
            "Resize", ["img", "", "scales"], ["e"], name="resize_aa", mode="nearest", antialias=1
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 4, 4]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["b3", "c", "d", "e"]],
        initializer=[numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    )
    with pytest.raises(UnsupportedOpError) as info:
        import_model(m, name="zoo-of-bad-ops")
    message = str(info.value)
    for part in ("zoo-of-bad-ops", "Det", "det1", "det2", "FancyOp", "com.example", "fancy"):
        assert part in message
    assert "resize_aa" in message and "antialias" in message
    assert "after_det" not in message
    assert sorted(n for n, _, _ in info.value.unsupported) == [
        "det1",
        "det2",
        "det3",
        "fancy",
        "resize_aa",
    ]


def test_quantized_model_is_refused_naming_its_quantization_ops() -> None:
    from polytile import zoo

    model = zoo.build("resnet34__qdq")
    with pytest.raises(UnsupportedOpError) as info:
        import_model(model, name="resnet34__qdq")
    first = str(info.value).splitlines()[0]
    assert "int8-quantized" in first
    assert "QuantizeLinear" in first and "DequantizeLinear" in first


def test_dynamic_shape_needs_input_shapes() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ShapeError, match=r"input 'x'.*'batch'.*input_shapes=\{'x': \(1, 3\)\}"):
        import_model(m)
    g = import_model(m, input_shapes={"x": (5, 3)})
    assert g.types["y"].shape == (5, 3)
    with pytest.raises(InputError, match="not an input"):
        import_model(m, input_shapes={"z": (5, 3)})
    with pytest.raises(InputError, match="axis 1"):
        import_model(m, input_shapes={"x": (5, 4)})
    with pytest.raises(InputError, match="rank"):
        import_model(m, input_shapes={"x": (5,)})


def test_unsupported_dtype_names_the_input() -> None:
    m = model(
        [helper.make_node("Identity", ["x"], ["y"])],
        {"x": [2]},
        {"y": [2]},
        dtype=TensorProto.STRING,
    )
    with pytest.raises(UnsupportedOpError, match="input 'x'"):
        import_model(m)


def test_opset_out_of_range() -> None:
    m = relu_model()
    m.opset_import[0].version = 99
    with pytest.raises(ModelError):
        import_model(m)


def test_old_opset_without_changes_is_accepted() -> None:
    """A model at opset 1 whose ops did not change by opset 7 is the same model at 7."""
    m = model(
        [helper.make_node("Not", ["x"], ["y"])],
        {"x": [4]},
        {"y": [4]},
        opset=1,
        dtype=TensorProto.BOOL,
    )
    assert import_model(m).types["y"].dtype == "bool"


def test_declared_output_shape_must_agree() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, {"y": (3, 2)})
    with pytest.raises(ShapeError, match="output 'y'"):
        import_model(m)


def test_runtime_parameter_is_reported_and_can_be_bound() -> None:
    m = reshape_by_input()
    with pytest.raises(ShapeError, match=r"node 'rs' \(Reshape\).*compile-time constant"):
        import_model(m)
    assert parameter_inputs(m) == {"shape"}
    g = import_model(m, bind={"shape": np.array([3, 2])})
    assert g.types["y"].shape == (3, 2) and g.inputs == ("x",)
    with pytest.raises(InputError, match="bind"):
        import_model(m, bind={"nope": np.array([3, 2])})


@pytest.mark.parametrize("shape", [5, "ab", (2.5, 3), (-2, 3), (True, 3)])
def test_bad_input_shapes_are_input_errors(shape) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match="input_shapes\\['x'\\]"):
        import_model(m, input_shapes={"x": shape})


def test_bad_bound_value_is_an_input_error() -> None:
    m = reshape_by_input()
    with pytest.raises(InputError, match="shape"):
        import_model(m, bind={"shape": "ab"})


def test_absurd_shapes_are_shape_errors() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Range", ["a", "b", "c"], ["r"], name="range"),
            helper.make_node("Cast", ["r"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["f"], ["s"], keepdims=0),
            helper.make_node("Add", ["x", "s"], ["y"]),
        ],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in (("a", 0), ("b", 10**12), ("c", 1))
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ShapeError, match="range"):
        import_model(m)


def test_one_op_refused_on_many_nodes_is_counted_once_and_the_message_stays_short() -> None:
    """Refusals whose reasons name each node's input (a run-time NonZero) group by op."""
    nodes, outputs, inputs = [], [], []
    for i in range(12):
        nodes += [
            helper.make_node("Greater", [f"x{i}", "zero"], [f"g{i}"]),
            helper.make_node("NonZero", [f"g{i}"], [f"nz{i}"], name=f"nonzero{i}"),
        ]
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [4]))
        outputs.append(helper.make_tensor_value_info(f"nz{i}", TensorProto.INT64, None))
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=[zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError) as info:
        import_model(model, name="many")
    message = str(info.value)
    assert "uses 1 unsupported op(s) or variant(s) in 12 node(s)" in message
    assert "nonzero0" in message and "(9 more)" in message and "'g0'" in message
    assert len(message) < 1500
    assert len(info.value.unsupported) == 12
