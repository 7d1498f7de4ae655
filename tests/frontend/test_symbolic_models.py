"""Symbolic shape inference (`frontend/symbolic_import.py`) against onnxruntime: the
inferred shape of every tensor (graph outputs and every intermediate, exposed as extra
outputs) and every folded shape value, evaluated at concrete sizes, equal what
onnxruntime computes at those sizes; for the zoo's symbolic models and for small graphs of
each folded shape op."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import islpy as isl
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import polytile
from polytile import zoo
from polytile.errors import InputError, SymbolicShapeError
from polytile.frontend import import_model
from polytile.frontend.symbolic import Dim, evaluate_shape, same
from polytile.frontend.symbolic_import import SymbolicModel, import_symbolic

from graphs import model

I64 = TensorProto.INT64


def _with_every_output(m: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of the model whose outputs include every named intermediate tensor."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return m


def check_against_ort(
    m: onnx.ModelProto,
    sym: SymbolicModel,
    sizes: Sequence[Mapping[str, int]],
) -> int:
    """Every node output of the original model: inferred shape (and folded value) at each
    assignment of sizes equals onnxruntime's. Returns how many tensors were compared."""
    names = [o for n in m.graph.node for o in n.output if o and o in sym.graph.types]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(
        _with_every_output(m, names).SerializeToString(), options, ["CPUExecutionProvider"]
    )
    outputs = [o.name for o in session.get_outputs()]
    shapes = sym.shapes()
    for env in sizes:
        feeds = zoo.random_inputs(m, 0, dims=dict(env))
        for name, got in zip(outputs, session.run(None, feeds), strict=True):
            assert evaluate_shape(shapes[name], env) == got.shape, (name, shapes[name], env)
            if name in sym.values:
                folded = [
                    d.evaluate(env) if isinstance(d, Dim) else d for d in sym.values[name].flat
                ]
                assert folded == got.reshape(-1).tolist(), (name, sym.values[name], env)
    return len(outputs)


# --- the zoo's symbolic models -----------------------------------------------------------


@functools.cache
def _zoo(name: str) -> onnx.ModelProto:
    """zoo.build once per run (callers copy before changing it)."""
    return zoo.build(name)


ZOO = {
    # BERT slices its 512 position ids by seq: it is defined for seq <= 512 only
    "bert_small__dyn": ({"seq": (1, 512)}, [(1, 1), (2, 7), (4, 64)]),
    "gpt2_2l__dyn": ({}, [(1, 16), (2, 7)]),
    "llama_small__dyn": ({}, [(1, 7), (4, 16)]),
    "resnet34__dyn": ({}, [(1,), (2,)]),
}


@pytest.mark.parametrize("name", ZOO)
def test_zoo_symbolic_models_match_onnxruntime(name: str) -> None:
    bounds, grid = ZOO[name]
    m = _zoo(name)
    sym = import_symbolic(m, bounds=bounds)
    assert sym.params == zoo.model_info(name).symbolic
    sizes = [dict(zip(sym.params, point, strict=True)) for point in grid]
    assert check_against_ort(m, sym, sizes) > 100
    (output,) = sym.graph.outputs
    assert isinstance(sym.graph.types[output].shape[0], Dim)  # batch stays symbolic
    form = sym.isl_shape(output)
    isl.MultiPwAff(form.multi_pw_aff())
    assert "batch" in form.params and isl.Set(form.context).is_empty() is False


def test_resnet_over_symbolic_image_sizes() -> None:
    m = onnx.ModelProto.FromString(_zoo("resnet34__dyn").SerializeToString())
    for dim, name in zip(m.graph.input[0].type.tensor_type.shape.dim[2:], "hw", strict=True):
        dim.dim_param = name  # so that onnxruntime takes (and random_inputs makes) any size
    sym = import_symbolic(m)
    check_against_ort(m, sym, [{"batch": 1, "h": 97, "w": 131}, {"batch": 2, "h": 64, "w": 33}])
    (output,) = sym.graph.outputs
    assert str(sym.shapes()[output]) == "(batch, 1000)"


@pytest.mark.parametrize("name", ["bert_small__dyn", "gpt2_2l__dyn", "llama_small__dyn"])
def test_symbolic_shapes_agree_with_the_static_importer(name: str) -> None:
    """The static import at concrete sizes is a second oracle, tensor by tensor (the
    canonical nodes and constants included, which onnxruntime never sees)."""
    sym = import_symbolic(_zoo(name), bounds=ZOO[name][0])
    for batch, seq in [(1, 1), (3, 33)]:
        sizes = {"batch": batch, "seq": seq}
        static = sym.specialize(sizes)
        shapes = sym.evaluate(sizes)
        assert static.types.keys() == sym.graph.types.keys()
        assert all(static.types[t].shape == shapes[t] for t in static.types)


def test_bert_without_bounds_names_the_slice_and_the_bound_it_needs() -> None:
    with pytest.raises(SymbolicShapeError, match=r"Slice.*seq': \(1, 512\)") as info:
        import_symbolic(_zoo("bert_small__dyn"))
    assert info.value.dims == ("seq",) and "Slice" in info.value.node


# --- small graphs, one per folded shape op -----------------------------------------------

BATCH_SEQ = [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 7}, {"batch": 3, "seq": 16}]


def _const(name: str, values: Sequence[int]) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)
    return helper.make_node("Constant", [], [name], value=tensor)


def _seq_of(x: str, out: str) -> list[onnx.NodeProto]:
    """out = [size of x's axis 1] (Shape → Gather → Unsqueeze)."""
    return [
        helper.make_node("Shape", [x], [f"{out}_shape"]),
        _const(f"{out}_one", [1]),
        helper.make_node("Gather", [f"{out}_shape", f"{out}_one"], [out], axis=0),
    ]


def _check(
    m: onnx.ModelProto,
    sizes: Sequence[Mapping[str, int]] = BATCH_SEQ,
    bounds: Mapping[str, tuple[int, int]] | None = None,
) -> SymbolicModel:
    sym = import_symbolic(m, bounds=bounds)
    check_against_ort(m, sym, sizes)
    return sym


def test_reshape_with_zero_and_minus_one() -> None:
    nodes = [
        _const("s1", [0, -1, 2, 4]),
        helper.make_node("Reshape", ["x", "s1"], ["r1"]),  # [batch, seq, 2, 4]
        _const("s2", [-1, 8]),
        helper.make_node("Reshape", ["x", "s2"], ["r2"]),  # [batch*seq, 8]
        _const("s3", [0, -1]),
        helper.make_node("Reshape", ["r1", "s3"], ["r3"]),  # [batch, seq*8]
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Reshape", ["r3", "xs"], ["y"]),  # back to x's shape
    ]
    m = model(nodes, {"x": ["batch", "seq", 8]}, {"y": None})
    sym = _check(m)
    b, s = Dim.param("batch"), Dim.param("seq")
    shapes = sym.shapes()
    assert same(shapes["r2"][0], b * s) and same(shapes["r3"][1], s * 8)
    assert shapes["y"] == sym.shapes()["x"]


def test_concat_of_shape_slices_and_arithmetic() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["head"], start=0, end=1),  # [batch]
        helper.make_node("Shape", ["x"], ["tail"], start=-2),  # [seq, 8]
        _const("two", [2]),
        helper.make_node("Mul", ["tail", "two"], ["tail2"]),  # [2*seq, 16]
        helper.make_node("Div", ["tail2", "two"], ["tail1"]),  # [seq, 8]
        helper.make_node("Concat", ["head", "tail1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("ReduceProd", ["target"], ["count"], keepdims=1),
        helper.make_node("Reshape", ["x", "count"], ["flat"]),  # [batch*seq*8]
    ]
    m = model(nodes, {"x": ["batch", "seq", 8]}, {"y": None, "flat": None})
    sym = _check(m)
    assert same(sym.shapes()["flat"][0], Dim.param("batch") * Dim.param("seq") * 8)
    assert list(sym.values["target"]) == list(sym.shapes()["x"])


def test_expand_to_a_symbolic_shape() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Expand", ["bias", "xs"], ["y"]),  # [1, 1, 8] -> x's shape
        _const("minus", [-1]),
        helper.make_node("Equal", ["xs", "minus"], ["is_minus"]),  # HF's Where(Equal) guard
        _const("ones", [1, 1, 1]),
        helper.make_node("Where", ["is_minus", "ones", "xs"], ["guarded"]),
        helper.make_node("Expand", ["bias", "guarded"], ["z"]),
        helper.make_node("Add", ["y", "z"], ["w"]),
    ]
    bias = {"bias": np.ones((1, 1, 8), np.float32)}
    m = model(nodes, {"x": ["batch", "seq", 8]}, {"w": None}, initializers=bias)
    assert _check(m).shapes()["w"] == _check(m).shapes()["x"]


def test_range_constant_of_shape_and_slice_by_a_size() -> None:
    nodes = [
        *_seq_of("x", "n"),  # [seq]
        _const("axis0", [0]),
        helper.make_node("Squeeze", ["n", "axis0"], ["n0"]),
        _const("zero", 0),
        _const("one", 1),
        _const("two", 2),
        helper.make_node("Range", ["zero", "n0", "one"], ["positions"]),  # [seq]
        helper.make_node("Mul", ["n0", "two"], ["n2"]),
        helper.make_node("Range", ["n0", "n2", "two"], ["odd"]),  # [(seq + 1)//2]
        helper.make_node("Shape", ["x"], ["xs"], end=2),
        helper.make_node("ConstantOfShape", ["xs"], ["mask"]),  # [batch, seq]
        _const("start", [0]),
        helper.make_node("Slice", ["table", "start", "n"], ["rows"]),  # table[:seq]
    ]
    table = {"table": np.ones((16, 8), np.float32)}
    outs = {"positions": None, "odd": None, "mask": None, "rows": None}
    m = model(nodes, {"x": ["batch", "seq", 8]}, outs, initializers=table)
    sym = _check(m, bounds={"seq": (1, 16)})
    s = Dim.param("seq")
    assert same(sym.shapes()["odd"][0], (s + 1) // 2)
    assert same(sym.shapes()["rows"][0], s)
    with pytest.raises(SymbolicShapeError, match=r"Slice.*'seq': \(1, 16\)"):
        import_symbolic(m)  # table[:seq] is min(seq, 16) rows: undecided without bounds


def test_conv_and_pool_over_symbolic_image_sizes() -> None:
    w = np.ones((4, 3, 3, 3), np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("AveragePool", ["x"], ["z"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    m = model(nodes, {"x": ["n", 3, "h", "w"]}, {"y": None, "z": None}, initializers={"w": w})
    sizes = [{"n": 1, "h": h, "w": v} for h, v in [(7, 7), (8, 13), (20, 9)]]
    sym = import_symbolic(m, bounds={"h": (7, 64), "w": (7, 64)})
    check_against_ort(m, sym, sizes)
    h = Dim.param("h")
    assert same(sym.shapes()["c"][2], (h - 1) // 2 + 1)


def test_gather_from_a_symbolic_axis_and_resize_to_symbolic_sizes() -> None:
    nodes = [
        _const("first", 0),
        helper.make_node("Gather", ["x", "first"], ["cls"], axis=2),  # [n, c, w]
        _const("last", [-1]),
        helper.make_node("Gather", ["x", "last"], ["row"], axis=3),  # [n, c, h, 1]
        helper.make_node("Shape", ["x"], ["nc"], end=2),
        helper.make_node("Shape", ["y"], ["hw"], start=2),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["up"], mode="linear"),
        _const_float("scales", [1, 1, 2, 3]),
        helper.make_node("Resize", ["x", "", "scales"], ["twice"], mode="nearest"),
    ]
    ins = {"x": ["n", 2, "h", "w"], "y": ["n", 2, "h2", "w2"]}
    m = model(nodes, ins, {"cls": None, "row": None, "up": None, "twice": None})
    sizes = [{"n": 1, "h": 3, "w": 5, "h2": 6, "w2": 4}, {"n": 2, "h": 7, "w": 1, "h2": 2, "w2": 9}]
    sym = import_symbolic(m)
    check_against_ort(m, sym, sizes)
    assert str(sym.shapes()["twice"]) == "(n, 2, 2*h, 3*w)"


def test_pad_to_a_multiple_of_a_window_and_a_causal_trilu() -> None:
    nodes = [
        *_seq_of("x", "n"),  # [seq]
        _const("window", [4]),
        helper.make_node("Mod", ["n", "window"], ["rem"]),
        helper.make_node("Sub", ["window", "rem"], ["gap"]),
        helper.make_node("Mod", ["gap", "window"], ["fill"]),  # (4 - seq % 4) % 4
        _const("zeros", [0, 0]),
        _const("zero", [0]),
        helper.make_node("Concat", ["zeros", "zero", "zero", "fill", "zero"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"]),  # [batch, seq + fill, 8]
        helper.make_node("Squeeze", ["n", "zero"], ["k"]),
        helper.make_node("Trilu", ["padded", "k"], ["masked"]),
    ]
    m = model(nodes, {"x": ["batch", "seq", 8]}, {"padded": None, "masked": None})
    sizes = [{"batch": 1, "seq": s} for s in (1, 4, 7, 9)]
    sym = import_symbolic(m)
    check_against_ort(m, sym, sizes)
    s = Dim.param("seq")
    assert same(sym.shapes()["padded"][1], s + (4 - s % 4) % 4)


def test_topk_of_a_whole_axis_and_split_by_symbolic_sizes() -> None:
    nodes = [
        *_seq_of("x", "k"),  # [seq]
        helper.make_node("TopK", ["x", "k"], ["top", "where"], axis=1),
        _const("one", [1]),
        helper.make_node("Sub", ["k", "one"], ["rest"]),
        helper.make_node("Concat", ["one", "rest"], ["sizes"], axis=0),
        helper.make_node("Split", ["x", "sizes"], ["head", "tail"], axis=1),
    ]
    outs = {"top": None, "where": None, "head": None, "tail": None}
    m = model(nodes, {"x": ["batch", "seq", 6]}, outs)
    sym = _check(m, [{"batch": 2, "seq": 1}, {"batch": 1, "seq": 5}])
    s = Dim.param("seq")
    assert same(sym.shapes()["top"][1], s) and same(sym.shapes()["tail"][1], s - 1)


def _const_float(name: str, values: Sequence[float]) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)
    return helper.make_node("Constant", [], [name], value=tensor)


def test_user_named_sizes_and_the_public_entry_point() -> None:
    nodes = [_const("s", [0, -1]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    m = model(nodes, {"x": [2, 5, 8]}, {"y": [2, 40]})
    shapes = polytile.symbolic_shapes(m, input_shapes={"x": ("b", "t", 8)})
    assert str(shapes["y"][1]) == "8*t" and str(shapes["y"][0]) == "b"
    sym = import_symbolic(m, input_shapes={"x": ("b", "t", 8)})
    assert sym.evaluate({"b": 3, "t": 4})["y"] == (3, 32)


def test_unnamed_and_oddly_named_dims_become_identifiers() -> None:
    nodes = [helper.make_node("Concat", ["x", "y"], ["z"], axis=1)]
    m = model(nodes, {"x": ["batch size", "2d"], "y": ["batch size", "max"]}, {"z": None})
    sym = import_symbolic(m)
    assert sym.params == ("batch_size", "_2d", "max_")
    assert str(sym.shapes()["z"]) == "(batch_size, _2d + max_)"
    m = model(nodes, {"x": ["b", 2], "y": ["b", None]}, {"z": None})
    assert str(polytile.symbolic_shapes(m)["z"]) == "(b, y_1 + 2)"
    clash = model(nodes, {"x": ["a-b", 3], "y": ["a_b", 3]}, {"z": None})
    with pytest.raises(InputError, match="'a-b' and 'a_b' both become 'a_b'"):
        import_symbolic(clash)


def test_bind_reads_the_sizes_from_input_shapes() -> None:
    sym = import_symbolic(_zoo("bert_small__dyn"), bounds={"seq": (1, 512)})
    feeds = {"input_ids": (2, 7), "attention_mask": (2, 7)}
    assert sym.bind(feeds) == {"batch": 2, "seq": 7}
    mismatch = r"'attention_mask' has size 8, but axis 1 of input 'input_ids' gave seq = 7"
    with pytest.raises(InputError, match=mismatch):
        sym.bind({"input_ids": (2, 7), "attention_mask": (2, 8)})
    with pytest.raises(InputError, match="outside its bounds"):
        sym.bind({"input_ids": (2, 513), "attention_mask": (2, 513)})
    with pytest.raises(InputError, match="rank"):
        sym.bind({"input_ids": (2, 7, 1), "attention_mask": (2, 7)})


def test_bad_input_shapes_and_bounds_are_input_errors() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(nodes, {"x": ["batch", 4]}, {"y": None})
    for shapes, match in [
        ({"x": ("batch",)}, "rank 1"),
        ({"x": ("batch", 5)}, "declares 4"),
        ({"x": ("batch", -4)}, "non-negative"),
        ({"x": "batch"}, "sequence"),
        ({"z": ("batch", 4)}, "not an input"),
    ]:
        with pytest.raises(InputError, match=match):
            import_symbolic(m, input_shapes=shapes)
    with pytest.raises(InputError, match="bounds name seq"):
        import_symbolic(m, bounds={"seq": (1, 8)})
    with pytest.raises(InputError, match="1 <= lo <= hi"):
        import_symbolic(m, bounds={"batch": (0, 8)})
    bounded = import_symbolic(m, bounds={"batch": (1, 8)})
    with pytest.raises(InputError, match="outside its bounds"):
        bounded.evaluate({"batch": 9})
    batch = bounded.shapes()["y"][0]
    with pytest.raises(SymbolicShapeError):
        _ = batch <= 8
    with bounded.assumed():
        assert batch <= 8


def test_static_models_are_imported_exactly_as_before() -> None:
    m = _zoo("mlp")
    assert import_symbolic(m).graph.types == import_model(m).types
    nodes = [_const("s", [0, -1]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    m = model(nodes, {"x": ["batch", 5, 8]}, {"y": None})
    given = {"x": (3, 5, 8)}
    static = import_model(m, input_shapes=given)
    assert import_symbolic(m, input_shapes=given).graph.types == static.types


# --- what cannot be decided or expressed names the node --------------------------------


def test_squeeze_of_a_size_that_may_be_one_is_refused() -> None:
    m = model([helper.make_node("Squeeze", ["x"], ["y"])], {"x": ["batch", 1, 8]}, {"y": ["b", 8]})
    with pytest.raises(SymbolicShapeError, match=r"Squeeze.*batch == 1") as info:
        import_symbolic(m)
    assert info.value.dims == ("batch",)
    assert import_symbolic(m, bounds={"batch": (2, 64)}).shapes()["y"][1] == 8


def test_reshape_into_pairs_of_an_odd_count_is_refused() -> None:
    nodes = [_const("s", [-1, 2]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    m = model(nodes, {"x": ["batch", "seq"]}, {"y": None})
    with pytest.raises(SymbolicShapeError, match="Reshape") as info:
        import_symbolic(m)
    assert info.value.node and set(info.value.dims) == {"batch", "seq"}


def test_an_op_needing_a_static_value_names_node_and_op() -> None:
    nodes = [
        *_seq_of("x", "depth"),
        _const_float("values", [0, 1]),
        helper.make_node("OneHot", ["x", "depth", "values"], ["y"]),  # depth = seq
    ]
    m = model(nodes, {"x": [2, "seq"]}, {"y": None})
    with pytest.raises(SymbolicShapeError, match=r"OneHot.*symbolic value \[seq\]") as info:
        import_symbolic(m)
    assert info.value.node == "OneHot_4" and info.value.dims == ("seq",)


def test_a_size_through_floats_names_where_folding_stopped() -> None:
    nodes = [
        *_seq_of("x", "n"),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["nf"], ["root"]),
        helper.make_node("Cast", ["root"], ["k"], to=TensorProto.INT64),
        _const("rest", [-1]),
        helper.make_node("Concat", ["k", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    m = model(nodes, {"x": [1, "seq"]}, {"y": None})
    with pytest.raises(SymbolicShapeError, match=r"Reshape.*'target'.*cast to float32") as info:
        import_symbolic(m)
    assert info.value.node == "Reshape_8"


def test_sizes_that_may_differ_do_not_broadcast() -> None:
    m = model(
        [helper.make_node("Add", ["x", "y"], ["z"])], {"x": ["seq"], "y": ["batch"]}, {"z": None}
    )
    with pytest.raises(SymbolicShapeError, match=r"Add.*do not broadcast") as info:
        import_symbolic(m)
    assert info.value.dims == ("seq", "batch")


# --- random chains of shape ops ----------------------------------------------------------


@st.composite
def shape_programs(draw: st.DrawFn) -> onnx.ModelProto:
    """A random chain of ops valid at every size, on x: [batch, seq, 6]: each step knows
    only the rank, which axes are size 1, and which earlier tensors hold as many elements
    (for a Reshape to their Shape)."""
    nodes: list[onnx.NodeProto] = []
    cur, ones, volume = "x", [False, False, False], 0
    volumes: dict[int, list[str]] = {0: ["x"]}
    shapes_ones: dict[str, tuple[bool, ...]] = {"x": (False, False, False)}

    def emit(op: str, inputs: list[str], **attrs: object) -> str:
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(values: Sequence[int]) -> str:
        out = f"c{len(nodes)}"
        nodes.append(_const(out, values))
        return out

    for _ in range(draw(st.integers(1, 6))):
        rank = len(ones)
        step = draw(st.sampled_from(["transpose", "unsqueeze", "squeeze", "concat", "merge",
                                     "flatten", "back", "halve", "pad", "zeros", "expand",
                                     "range"]))  # fmt: skip
        if step == "transpose":
            perm = draw(st.permutations(range(rank)))
            cur, ones = emit("Transpose", [cur], perm=perm), [ones[p] for p in perm]
        elif step == "unsqueeze" and rank < 5:
            axis = draw(st.integers(0, rank))
            cur = emit("Unsqueeze", [cur, const([axis])])
            ones = [*ones[:axis], True, *ones[axis:]]
        elif step == "squeeze" and any(ones):
            axis = ones.index(True)
            cur, ones = emit("Squeeze", [cur, const([axis])]), ones[:axis] + ones[axis + 1 :]
        elif step == "concat":
            axis = draw(st.integers(0, rank - 1))
            cur, volume = emit("Concat", [cur, cur], axis=axis), volume + 100
            ones = [o and i != axis for i, o in enumerate(ones)]
        elif step == "merge" and rank >= 2:  # Reshape [0, ..., 0, -1]
            cur = emit("Reshape", [cur, const([0] * (rank - 2) + [-1])])
            ones = [*ones[:-2], ones[-2] and ones[-1]]
        elif step == "flatten":  # through Shape -> Gather -> Concat
            first = emit("Gather", [emit("Shape", [cur]), const([0])], axis=0)
            cur = emit("Reshape", [cur, emit("Concat", [first, const([-1])], axis=0)])
            ones = [ones[0], all(ones[1:])]
        elif step == "back" and len(volumes[volume]) > 1:  # Reshape to an earlier Shape
            earlier = draw(st.sampled_from(volumes[volume][:-1]))
            cur = emit("Reshape", [cur, emit("Shape", [earlier])])
            ones = list(shapes_ones[earlier])
        elif step == "halve":  # x[..., ::2, ...]: ceil(d / 2)
            axis = draw(st.integers(0, rank - 1))
            big = const([1 << 40])
            cur = emit("Slice", [cur, const([0]), big, const([axis]), const([2])])
            volume += 1000
        elif step == "pad":  # to a multiple of 4 on one axis, pads from the shape
            axis = draw(st.integers(0, rank - 1))
            four = const([4])
            size = emit("Gather", [emit("Shape", [cur]), const([axis])], axis=0)
            fill = emit("Mod", [emit("Sub", [four, emit("Mod", [size, four])]), four])
            before, after = const([0] * (rank + axis)), const([0] * (rank - axis - 1))
            pads = emit("Concat", [before, fill, after], axis=0)
            cur, volume = emit("Pad", [cur, pads]), volume + 10000
            ones[axis] = False
        elif step == "zeros":  # ConstantOfShape(Shape(x)) + x
            fill = numpy_helper.from_array(np.zeros(1, np.float32))
            cur = emit("Add", [cur, emit("ConstantOfShape", [emit("Shape", [cur])], value=fill)])
        elif step == "expand":  # a reduced axis broadcast back to the Shape before
            axis = draw(st.integers(0, rank - 1))
            summed = emit("ReduceSum", [cur, const([axis])], keepdims=1)
            cur = emit("Expand", [summed, emit("Shape", [cur])])
        elif step == "range":  # + Range(0, size of an axis) along that axis
            axis = draw(st.integers(0, rank - 1))
            size = emit("Gather", [emit("Shape", [cur]), const(axis)], axis=0)
            positions = emit("Range", [const(0), size, const(1)])
            column = emit("Cast", [positions], to=TensorProto.FLOAT)
            others = [a for a in range(rank) if a != axis]
            if others:
                column = emit("Unsqueeze", [column, const(others)])
            cur = emit("Add", [cur, column])
        shapes_ones[cur] = tuple(ones)
        volumes.setdefault(volume, []).append(cur)
    if cur == "x":
        cur = emit("Identity", [cur])
    return model(nodes, {"x": ["batch", "seq", 6]}, {cur: None})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape_programs())
def test_random_shape_programs_match_onnxruntime(m: onnx.ModelProto) -> None:
    sym = import_symbolic(m)
    check_against_ort(
        m, sym, [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 5}, {"batch": 3, "seq": 6}]
    )
