"""Every pass keeps the graph's meaning (differential against onnxruntime on the original
model) and does its job (the structure it promises)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile.errors import InputError
from polytile.frontend import PASSES, OptimizeConfig, import_model, optimize
from polytile.frontend.passes import verify_graph

from graphs import assert_same, batch_flatten_chain, batch_norm, model, weights


def each_prefix(m):  # noqa: ANN201
    """The graph after each prefix of the pipeline, checked against the model each time."""
    graph = import_model(m)
    verify_graph(graph)
    assert_same(m, graph)
    for p in PASSES:
        graph = p.run(graph)
        verify_graph(graph)
        assert_same(m, graph)
    return graph


def conv_bn_relu():  # noqa: ANN201
    w, b = weights(0, (8, 3, 3, 3), (8,))
    bn, inits = batch_norm("c", "n", 8)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        bn,
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    inits |= {"w": w, "b": b}
    return model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 8, 8, 8)}, inits)


def test_batchnorm_folds_into_conv() -> None:
    graph = each_prefix(conv_bn_relu())
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu"]


@pytest.mark.parametrize("opset", [7, 9, 15])
def test_batchnorm_versions_fold(opset: int) -> None:
    m = conv_bn_relu()
    m.opset_import[0].version = opset
    graph = each_prefix(m)
    assert "BatchNormalization" not in graph.op_counts()


def test_scale_and_shift_chain_folds_into_conv() -> None:
    """Inception-v2's Conv → BN → Mul → Add (Caffe Scale) becomes one Conv."""
    (w,) = weights(0, (4, 2, 3, 3))
    bn, inits = batch_norm("c", "n", 4)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        bn,
        helper.make_node("Unsqueeze", ["g", "axes"], ["g3"]),
        helper.make_node("Mul", ["n", "g3"], ["p"]),
        helper.make_node("Unsqueeze", ["h", "axes"], ["h3"]),
        helper.make_node("Add", ["p", "h3"], ["q"]),
        helper.make_node("Relu", ["q"], ["y"]),
    ]
    inits |= {
        "w": w,
        "g": np.full(4, 1.5, np.float32),
        "h": np.arange(4, dtype=np.float32),
        "axes": np.array([1, 2], np.int64),
    }
    graph = each_prefix(model(nodes, {"x": (2, 2, 6, 6)}, {"y": None}, inits))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu"]


def test_batchnorm_on_shared_conv_output_is_not_folded() -> None:
    (w,) = weights(0, (4, 2, 1, 1))
    bn, inits = batch_norm("c", "n", 4)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        bn,
        helper.make_node("Add", ["n", "c"], ["y"]),
    ]
    inits["w"] = w
    graph = each_prefix(model(nodes, {"x": (1, 2, 4, 4)}, {"y": None}, inits))
    assert graph.op_counts() == {"Conv": 1, "Mul": 1, "Add": 2}


def test_batchnorm_folds_into_gemm() -> None:
    a, b = weights(0, (6, 16), (6,))
    bn, inits = batch_norm("g", "y", 6)
    nodes = [helper.make_node("Gemm", ["x", "a", "b"], ["g"], transB=1, alpha=0.5, beta=2.0), bn]
    inits |= {"a": a, "b": b}
    graph = each_prefix(model(nodes, {"x": (3, 16)}, {"y": None}, inits))
    assert graph.op_counts() == {"Gemm": 1}


def test_standalone_batchnorm_becomes_affine() -> None:
    bn, inits = batch_norm("x", "y", 3)
    graph = each_prefix(model([bn], {"x": (2, 3, 5)}, {"y": None}, inits))
    assert graph.op_counts() == {"Mul": 1, "Add": 1}


@pytest.mark.parametrize("arity", [1, 2, 3])
def test_sum_becomes_adds(arity: int) -> None:
    names = [f"x{i}" for i in range(arity)]
    nodes = [helper.make_node("Sum", names, ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = each_prefix(model(nodes, {n: (2, 3) for n in names}, {"y": None}))
    assert graph.op_counts() == ({"Add": arity - 1} if arity > 1 else {}) | {"Relu": 1}


def test_identity_and_dropout_removed_even_before_outputs() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["i"]),
        helper.make_node("Dropout", ["i"], ["d"], ratio=0.3),
        helper.make_node("Exp", ["d"], ["e"]),
        helper.make_node("Identity", ["e"], ["y"]),
        helper.make_node("Identity", ["x"], ["z"]),
    ]
    m = model(nodes, {"x": (2, 3)}, {"y": None, "z": None}, opset=10)
    graph = each_prefix(m)
    assert graph.op_counts() == {"Relu": 1, "Exp": 1, "Identity": 1}
    assert graph.outputs == ("y", "z")


def test_shape_chain_and_fills_fold() -> None:
    """Shape → Gather → Unsqueeze → Concat → Reshape, and ConstantOfShape weights."""
    nodes, inits = batch_flatten_chain("x", "flat")
    nodes += [
        helper.make_node(
            "ConstantOfShape", ["wshape"], ["w"], value=helper.make_tensor("v", 1, [1], [0.5])
        ),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    inits["wshape"] = np.array([12, 5], np.int64)
    graph = each_prefix(model(nodes, {"x": (2, 3, 4)}, {"y": (2, 5)}, inits))
    assert graph.op_counts() == {"Reshape": 1, "MatMul": 1}
    assert graph.types["flat"].shape == (2, 12)


def test_constant_subgraph_folds_completely() -> None:
    nodes = [
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Exp", ["ab"], ["e"]),
        helper.make_node("Mul", ["x", "e"], ["y"]),
    ]
    a, b = weights(3, (3,), (3,))
    graph = each_prefix(model(nodes, {"x": (2, 3)}, {"y": None}, {"a": a, "b": b}))
    assert graph.op_counts() == {"Mul": 1}
    folded = graph.constants[graph.nodes[0].inputs[1]]
    np.testing.assert_allclose(folded, np.exp(a + b), rtol=1e-6)


def test_dead_code_removed() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Exp", ["x"], ["unused"]),
        helper.make_node("Add", ["unused", "c"], ["unused2"]),
    ]
    graph = optimize(
        import_model(model(nodes, {"x": (4,)}, {"y": None}, {"c": np.ones(4, np.float32)}))
    )
    assert graph.op_counts() == {"Relu": 1}
    assert "c" not in graph.constants and "c" not in graph.types


def test_views_alias_their_input_unless_graph_output() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("Exp", ["f"], ["y"]),
        helper.make_node("Reshape", ["r", "shape"], ["z"]),
    ]
    inits = {"shape": np.array([-1], np.int64)}
    graph = each_prefix(model(nodes, {"x": (2, 3, 4)}, {"y": None, "z": None}, inits))
    assert dict(graph.aliases) == {"f": "r"}


def test_unknown_pass_in_config_is_an_error() -> None:
    graph = import_model(model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2,)}, {"y": None}))
    with pytest.raises(InputError, match="fold_constant"):
        optimize(graph, OptimizeConfig(disabled=frozenset({"fold_constant"})))
    kept = optimize(graph, OptimizeConfig(disabled=frozenset(p.name for p in PASSES)))
    assert kept == graph


def test_every_pass_has_a_reason() -> None:
    assert len({p.name for p in PASSES}) == len(PASSES)
    assert all(p.reason and len(p.reason.splitlines()) == 1 for p in PASSES)


def test_one_tensor_returned_under_two_names() -> None:
    """Two Identity copies of one tensor, both graph outputs: both survive."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["o1"]),
        helper.make_node("Identity", ["r"], ["o2"]),
    ]
    graph = each_prefix(model(nodes, {"x": (2, 3)}, {"o1": (2, 3), "o2": (2, 3)}))
    assert graph.outputs == ("o1", "o2")


def test_folding_does_not_grow_the_model_without_bound() -> None:
    """A constant Expand to 256 MiB followed by a reduction stays computed at run time."""
    nodes = [
        helper.make_node("Expand", ["one", "shape"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ]
    inits = {"one": np.ones(1, np.float32), "shape": np.array([1024, 1024, 64], np.int64)}
    graph = optimize(import_model(model(nodes, {"x": (2,)}, {"y": None}, inits, opset=13)))
    assert "Expand" in graph.op_counts()
    assert all(v.nbytes < 64 << 20 for v in graph.constants.values())


def test_failing_fallback_evaluator_leaves_the_node_unfolded() -> None:
    """onnx's reference evaluator cannot run a 5-D GlobalMaxPool: no fold, no crash."""
    value = np.random.default_rng(0).standard_normal((2, 3, 2, 2, 2)).astype(np.float32)
    nodes = [
        helper.make_node("GlobalMaxPool", ["c"], ["p"]),
        helper.make_node("Add", ["x", "p"], ["y"]),
    ]
    graph = each_prefix(model(nodes, {"x": (2, 3, 1, 1, 1)}, {"y": None}, {"c": value}, opset=13))
    assert graph.types["y"].shape == (2, 3, 1, 1, 1)


@pytest.mark.parametrize(
    ("x_shape", "attrs", "sampled"),
    [
        ((1, 8, 9, 7), {"strides": [2, 2]}, (1, 8, 5, 4)),
        ((1, 8, 9, 7), {"strides": [3, 1], "pads": [0, 0, 0, 0]}, (1, 8, 3, 7)),
        ((1, 8, 9, 7), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 8, 5, 4)),
        ((1, 8, 9, 7), {"strides": [2, 3], "group": 2, "dilations": [2, 2]}, (1, 8, 5, 3)),
        ((2, 8, 11), {"strides": [4]}, (2, 8, 3)),
        ((1, 8, 5, 4, 6), {"strides": [2, 1, 2]}, (1, 8, 3, 4, 3)),
    ],
)
def test_a_strided_1x1_conv_samples_its_input(
    x_shape: tuple[int, ...], attrs: dict, sampled: tuple[int, ...]
) -> None:
    """A Slice with the conv's strides as steps samples the input; the conv that reads
    it has unit strides, and the pair computes what the strided conv did."""
    group = attrs.get("group", 1)
    w, b = weights(0, (6, 8 // group, *(1,) * (len(x_shape) - 2)), (6,))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)]
    graph = each_prefix(model(nodes, {"x": x_shape}, {"y": None}, {"w": w, "b": b}))
    assert [n.op_type for n in graph.nodes] == ["Slice", "Conv"]
    slice_node, conv = graph.nodes
    assert conv.inputs[0] == slice_node.outputs[0]
    assert graph.types[conv.inputs[0]].shape == sampled
    assert "strides" not in conv.attrs and "auto_pad" not in conv.attrs
    assert conv.attrs.get("group", 1) == group


@pytest.mark.parametrize(
    ("kernel", "attrs"),
    [
        ((1, 1), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # padding is read too
        ((3, 3), {"strides": [2, 2]}),  # a wider window reads every pixel
        ((1, 1), {}),  # nothing to sample
    ],
)
def test_other_convs_keep_their_strides(kernel: tuple[int, int], attrs: dict) -> None:
    w, b = weights(0, (6, 8, *kernel), (6,))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)]
    graph = each_prefix(model(nodes, {"x": (1, 8, 9, 7)}, {"y": None}, {"w": w, "b": b}))
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    strides = graph.nodes[0].attrs.get("strides", (1, 1))
    assert tuple(strides) == tuple(attrs.get("strides", (1, 1)))


def test_folding_computes_ieee_results_without_warnings() -> None:
    """log(0) = -inf and the like are the model's own values (T5's position buckets):
    folding gives them as the compiled code would, without numpy's RuntimeWarnings."""
    import warnings

    nodes = [
        helper.make_node("Log", ["z"], ["l"]),
        helper.make_node("Cast", ["l"], ["i"], to=TensorProto.INT64),
        helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "l"], ["y"]),
        helper.make_node("Add", ["x", "f"], ["w"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, None),
        ],
        initializer=[numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = optimize(import_model(model))
    folded = [v for v in graph.constants.values() if v.dtype == np.float32 and v.shape == (2,)]
    assert any(np.isneginf(v[0]) and v[1] == 0 for v in folded)
