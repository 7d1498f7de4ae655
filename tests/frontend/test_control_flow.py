"""If and Loop nodes expanded at import: the taken branch of an If with a known condition,
one body copy per iteration of a Loop with a known trip count. Each model is compiled and
compared with onnxruntime; a condition or exit only known at run time is refused naming
the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.errors import ModelError, UnsupportedOpError
from polytile.frontend.importer import import_model

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    onnx.checker.check_model(model)
    expected = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    got = pt.compile(model).run(feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def _branch(name: str, op: str, out: str) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node(op, ["x"], [out])],
        name,
        [],
        [helper.make_tensor_value_info(out, F, None)],
    )


def _if_model(cond_nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    node = helper.make_node(
        "If",
        ["cond"],
        ["y"],
        name="the_if",
        then_branch=_branch("then", "Relu", "t"),
        else_branch=_branch("else", "Neg", "e"),
    )
    graph = helper.make_graph(
        [*cond_nodes, node],
        "g",
        [helper.make_tensor_value_info("x", F, [2, 5])],
        [helper.make_tensor_value_info("y", F, [2, 5])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("taken", [True, False])
def test_if_with_a_constant_condition_is_its_branch(taken: bool) -> None:
    model = _if_model([], [numpy_helper.from_array(np.array(taken), "cond")])
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    _run_both(model, {"x": x})
    ops = [n.op_type for n in import_model(model).nodes]
    assert "If" not in ops and ("Relu" if taken else "Neg") in ops


def test_if_on_a_static_size_folds() -> None:
    """The exporters' pattern: a branch on a dimension that is static once shapes are."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["width"], axis=0),
        helper.make_node("Equal", ["width", "five"], ["cond"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(5, np.int64), "five"),
    ]
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    _run_both(_if_model(nodes, inits), {"x": x})


def test_if_on_a_run_time_value_is_refused_naming_the_node() -> None:
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)]
    nodes.append(helper.make_node("Greater", ["s", "zero"], ["cond"]))
    model = _if_model(nodes, [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    with pytest.raises(
        UnsupportedOpError,
        match=r"node 'the_if' \(If\) in model 'g': its condition is only known at run time",
    ):
        import_model(model)


def _loop_body(
    nodes: list[onnx.NodeProto], scan: bool, initializer: list[onnx.TensorProto] = ()
) -> onnx.GraphProto:
    """A Loop body over (i, cond_in, acc_in) giving (cond_out, acc_out[, scan])."""
    outputs = [
        helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
        helper.make_tensor_value_info("acc_out", F, [3]),
    ]
    if scan:
        outputs.append(helper.make_tensor_value_info("scan", F, [3]))
    return helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [3]),
        ],
        outputs,
        initializer=list(initializer),
    )


def _loop_model(trips: int, exit_on_data: bool = False) -> onnx.ModelProto:
    """acc <- acc * 0.5 + x * i each iteration; scan output: acc after each step."""
    body_nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=F),
        helper.make_node("Mul", ["x", "i_f"], ["xi"]),
        helper.make_node("Mul", ["acc_in", "half"], ["halved"]),
        helper.make_node("Add", ["halved", "xi"], ["acc_out"]),
        helper.make_node("Identity", ["acc_out"], ["scan"]),
    ]
    if exit_on_data:
        body_nodes.append(helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0))
        body_nodes.append(helper.make_node("Less", ["total", "limit"], ["cond_out"]))
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    body = _loop_body(body_nodes, scan=True, initializer=[half])
    loop = helper.make_node(
        "Loop", ["trips", "go", "acc0"], ["acc", "steps"], name="the_loop", body=body
    )
    graph = helper.make_graph(
        [loop],
        "g",
        [
            helper.make_tensor_value_info("x", F, [3]),
            helper.make_tensor_value_info("acc0", F, [3]),
        ],
        [
            helper.make_tensor_value_info("acc", F, [3]),
            helper.make_tensor_value_info("steps", F, [trips, 3]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(trips, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "go"),
            numpy_helper.from_array(np.array(1e9, np.float32), "limit"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("trips", [1, 4])
def test_loop_with_a_constant_trip_count_is_unrolled(trips: int) -> None:
    feeds = {"x": np.array([1.0, -2.0, 3.0], np.float32), "acc0": np.ones(3, np.float32)}
    model = _loop_model(trips)
    _run_both(model, feeds)
    ops = [n.op_type for n in import_model(model).nodes]
    assert "Loop" not in ops and ops.count("Add") == trips


def test_loop_with_a_data_dependent_exit_is_refused_naming_the_node() -> None:
    with pytest.raises(
        UnsupportedOpError,
        match=r"node 'the_loop' \(Loop\).*: its exit condition is only known at run time",
    ):
        import_model(_loop_model(3, exit_on_data=True))


def test_parameter_inputs_follow_the_reads_of_if_branches() -> None:
    """An If branch that returns a graph input which sets a shape makes that input a
    parameter, though the If node does not list it among its inputs."""
    from polytile.frontend.importer import parameter_inputs

    branch = helper.make_graph(
        [helper.make_node("Identity", ["shape"], ["s"])],
        "b",
        [],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
    )
    nodes = [
        helper.make_node("If", ["go"], ["target"], then_branch=branch, else_branch=branch),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", F, [2, 6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[numpy_helper.from_array(np.array(True), "go")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert parameter_inputs(model) == {"shape"}
    bound = import_model(model, bind={"shape": np.array([3, 4], np.int64)})
    assert bound.types["y"].shape == (3, 4)


def _counting_loop(trips: int, stop_after: int | None, inner_if: bool = False) -> onnx.ModelProto:
    """acc <- acc + x each iteration (or acc - x, through an If on a constant, when
    `inner_if`); the body's condition is `i + 1 < stop_after` (known at import: the
    iteration counter is a constant of each copy), or passed on unchanged."""
    body_nodes = []
    if inner_if:
        branch = helper.make_graph(
            [helper.make_node("Sub", ["acc_in", "x"], ["b"])],
            "minus",
            [],
            [helper.make_tensor_value_info("b", F, [3])],
        )
        other = helper.make_graph(
            [helper.make_node("Add", ["acc_in", "x"], ["c"])],
            "plus",
            [],
            [helper.make_tensor_value_info("c", F, [3])],
        )
        body_nodes.append(
            helper.make_node("If", ["yes"], ["acc_out"], then_branch=branch, else_branch=other)
        )
    else:
        body_nodes.append(helper.make_node("Add", ["acc_in", "x"], ["acc_out"]))
    if stop_after is None:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        body_nodes += [
            helper.make_node("Add", ["i", "one"], ["next"]),
            helper.make_node("Less", ["next", "stop"], ["cond_out"]),
        ]
    body = _loop_body(body_nodes, scan=False)
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "acc0"], ["acc"], name="the_loop", body=body)],
        "g",
        [
            helper.make_tensor_value_info("x", F, [3]),
            helper.make_tensor_value_info("acc0", F, [3]),
        ],
        [helper.make_tensor_value_info("acc", F, [3])],
        initializer=[
            numpy_helper.from_array(np.array(trips, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "go"),
            numpy_helper.from_array(np.array(True), "yes"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array(stop_after or 0, np.int64), "stop"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"x": np.array([1.0, -2.0, 0.5], np.float32), "acc0": np.zeros(3, np.float32)}


def test_a_loop_exits_when_its_condition_folds_false() -> None:
    """Exporters give a while-loop a huge trip count and a condition: the copies stop at
    the first iteration whose condition is false."""
    model = _counting_loop(np.iinfo(np.int64).max, stop_after=3)
    _run_both(model, FEEDS)
    assert [n.op_type for n in import_model(model).nodes].count("Less") == 3  # one a copy


def test_an_if_inside_a_loop_body_is_expanded_in_each_copy() -> None:
    model = _counting_loop(4, stop_after=None, inner_if=True)
    _run_both(model, FEEDS)
    ops = [n.op_type for n in import_model(model).nodes]
    assert "If" not in ops and ops.count("Sub") == 4


def test_a_loop_past_the_unrolling_limit_is_refused_at_once() -> None:
    from polytile.frontend.importer import MAX_UNROLL

    with pytest.raises(UnsupportedOpError, match=f"the_loop.*more than the {MAX_UNROLL}"):
        import_model(_counting_loop(np.iinfo(np.int64).max, stop_after=None))


def test_an_empty_condition_names_the_node() -> None:
    model = _if_model([], [numpy_helper.from_array(np.zeros(0, bool), "cond")])
    with pytest.raises(ModelError, match=r"the_if.*condition 'cond' holds 0 values"):
        import_model(model)
