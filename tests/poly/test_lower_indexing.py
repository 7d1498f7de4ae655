"""The indexing lowerings (GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
TopK, Trilu, EyeLike) on shapes and attributes the ONNX node tests miss: import →
optimize → partition → lower → program-order execution with every access checked
inside its tensor (`test_lower_injective.check`), compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from test_lower_injective import check
from test_property import SETTINGS, check_random_trace

from polytile.errors import ShapeError, UnsupportedOpError
from polytile.frontend import import_model, optimize, partition
from polytile.poly.lower import lower, lower_group
from polytile.poly.oracle.reference import run_program_order

from lowered import make

F32 = "float32"
I64 = "int64"
RNG = np.random.default_rng(7)


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --- gathers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "index_shape", "axis"),
    [((3, 4, 5), (3, 2, 5), 1), ((3, 4, 5), (2, 4, 3), -1), ((4, 3), (6, 2), 0)],
    ids=["middle", "negative_axis_smaller_box", "more_rows_than_data"],
)
def test_gather_elements(shape: tuple[int, ...], index_shape: tuple[int, ...], axis: int) -> None:
    n = shape[axis]
    inputs = {"x": (shape, F32), "i": (index_shape, I64)}
    feeds = {"x": _floats(*shape), "i": RNG.integers(-n, n, index_shape)}
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    check(make([node], inputs, ["y"]), inputs, feeds=feeds)


@pytest.mark.parametrize(
    ("shape", "index_shape", "batch_dims"),
    [((2, 3, 4, 5), (2, 3, 2, 2), 2), ((3, 4, 5), (2, 2, 3), 0), ((2, 4, 5), (2, 3, 1), 1)],
    ids=["batch2_pairs", "full_tuples", "batch1_rows"],
)
def test_gather_nd(shape: tuple[int, ...], index_shape: tuple[int, ...], batch_dims: int) -> None:
    m = index_shape[-1]
    sizes = np.array(shape[batch_dims : batch_dims + m])
    indices = (RNG.integers(0, 1 << 20, index_shape) % sizes) - sizes * RNG.integers(
        0, 2, index_shape
    )
    inputs = {"x": (shape, F32), "i": (index_shape, I64)}
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    check(make([node], inputs, ["y"]), inputs, feeds={"x": _floats(*shape), "i": indices})


# --- scatters -------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    ("shape", "index_shape", "axis"),
    [((4, 5), (2, 3), 1), ((3, 4, 2), (3, 2, 2), -3), ((3, 4), (6, 4), 0)],
    ids=["smaller_box", "negative_axis", "more_updates_than_rows"],
)
def test_scatter_elements(
    reduction: str, shape: tuple[int, ...], index_shape: tuple[int, ...], axis: int
) -> None:
    n = shape[axis]
    # distinct positions along the axis for 'none' (duplicates are undefined there)
    if reduction == "none":
        if index_shape[axis] > n:
            pytest.skip("more updates than positions: duplicates, undefined without reduction")
        other = [d for a, d in enumerate(index_shape) if a != axis % len(shape)]
        order = np.moveaxis(np.argsort(RNG.random((n, *other)), axis=0), 0, axis)
        indices = np.take(order, np.arange(index_shape[axis]), axis=axis) - n
    else:
        indices = RNG.integers(-n, n, index_shape)
    inputs = {"x": (shape, F32), "i": (index_shape, I64), "u": (index_shape, F32)}
    feeds = {"x": _floats(*shape), "i": indices, "u": _floats(*index_shape)}
    node = helper.make_node(
        "ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction
    )
    check(make([node], inputs, ["y"]), inputs, feeds=feeds, rtol=1e-5)


def test_scatter_elements_none_keeps_the_last_duplicate() -> None:
    inputs = {"x": ((1, 4), F32), "i": ((1, 3), I64), "u": ((1, 3), F32)}
    feeds = {
        "x": np.zeros((1, 4), np.float32),
        "i": np.array([[2, -2, 0]]),
        "u": np.array([[1.0, 2.0, 3.0]], np.float32),
    }
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)
    check(make([node], inputs, ["y"]), inputs, feeds=feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    ("shape", "index_shape"),
    [((4, 3, 2), (2, 3, 2)), ((5, 3), (2, 2, 1)), ((3, 4), (2,))],
    ids=["pairs_rows", "rows_2d_updates", "one_element"],
)
def test_scatter_nd(reduction: str, shape: tuple[int, ...], index_shape: tuple[int, ...]) -> None:
    m = index_shape[-1]
    positions = np.array(np.unravel_index(np.arange(int(np.prod(shape[:m]))), shape[:m])).T
    count = int(np.prod(index_shape[:-1]))
    if reduction == "none":
        chosen = RNG.permutation(len(positions))[:count]  # distinct: duplicates are undefined
    else:
        chosen = RNG.integers(0, len(positions), count)
    indices = (positions[chosen] - np.array(shape[:m]) * RNG.integers(0, 2, (count, m))).reshape(
        index_shape
    )
    update_shape = (*index_shape[:-1], *shape[m:])
    inputs = {"x": (shape, F32), "i": (index_shape, I64), "u": (update_shape, F32)}
    feeds = {"x": _floats(*shape), "i": indices, "u": _floats(*update_shape)}
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    check(make([node], inputs, ["y"]), inputs, feeds=feeds, rtol=1e-5)


def test_scatter_nd_none_keeps_the_last_duplicate() -> None:
    """onnxruntime applies the updates in order; polytile's 'none' does the same."""
    inputs = {"x": ((3, 2), F32), "i": ((3, 1), I64), "u": ((3, 2), F32)}
    feeds = {
        "x": np.zeros((3, 2), np.float32),
        "i": np.array([[1], [-2], [0]]),
        "u": np.arange(6, dtype=np.float32).reshape(3, 2),
    }
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"])
    check(make([node], inputs, ["y"]), inputs, feeds=feeds)


def test_scatter_of_int_data() -> None:
    inputs = {"x": ((4, 3), "int32"), "i": ((2, 1), I64), "u": ((2, 3), "int32")}
    feeds = {
        "x": RNG.integers(-5, 5, (4, 3)).astype(np.int32),
        "i": np.array([[3], [3]]),
        "u": RNG.integers(-5, 5, (2, 3)).astype(np.int32),
    }
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="max")
    check(make([node], inputs, ["y"]), inputs, feeds=feeds)


# --- OneHot, TopK, Trilu, EyeLike -------------------------------------------------------------


@pytest.mark.parametrize(
    ("index_dtype", "axis"), [(I64, 0), ("int32", 1), (F32, -1)], ids=["i64_first", "i32", "float"]
)
def test_onehot(index_dtype: str, axis: int) -> None:
    """Indices outside [-depth, depth-1] give an all-off row (onnx's reference evaluator:
    onnxruntime has no kernel for most of these type combinations)."""
    inputs = {"i": ((2, 3), index_dtype)}
    indices = np.array([[0, -1, 4], [-6, 9, 2]]).astype(index_dtype)  # 9, -6 are outside
    for value in (np.array([-7, 7], np.int32), np.array([0.5, 2.0], np.float32)):
        node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)
        consts = {"d": np.array(5, np.int64), "v": value}
        check(make([node], inputs, ["y"], consts), inputs, feeds={"i": indices}, oracle="ref")


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize(
    ("shape", "axis", "k"),
    [((3, 6), 1, 3), ((5, 2, 3), 0, 5), ((4, 7), -1, 0)],
    ids=["rows", "first_axis_all", "none"],
)
def test_topk(largest: int, shape: tuple[int, ...], axis: int, k: int) -> None:
    x = RNG.integers(-3, 3, shape).astype(np.float32)  # many ties: lower positions first
    inputs = {"x": (shape, F32)}
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    check(make([node], inputs, ["v", "i"], {"k": np.array([k])}), inputs, feeds={"x": x})


def test_topk_of_int64() -> None:
    x = np.array([[5, -2, 9, 9, 0]], np.int64)
    inputs = {"x": ((1, 5), I64)}
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"])
    check(make([node], inputs, ["v", "i"], {"k": np.array([4])}), inputs, feeds={"x": x})


@pytest.mark.parametrize("upper", [1, 0])
@pytest.mark.parametrize("k", [-2, 0, 3, 9])
def test_trilu(upper: int, k: int) -> None:
    inputs = {"x": ((2, 4, 6), F32)}
    node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)
    check(make([node], inputs, ["y"], {"k": np.array(k)}), inputs)


@pytest.mark.parametrize(("shape", "k"), [((3, 5), 2), ((5, 3), -1), ((2, 2), 4)])
def test_eyelike_lowered(shape: tuple[int, int], k: int) -> None:
    """EyeLike folds to a constant in models; its lowering is checked on its own."""
    inputs = {"x": (shape, F32)}
    node = helper.make_node("EyeLike", ["x"], ["y"], k=k, dtype=TensorProto.INT32)
    m = make([node], inputs, ["y"])
    graph = import_model(m)
    want = np.eye(*shape, k, np.int32)
    np.testing.assert_array_equal(optimize(graph).constants["y"], want)  # folded
    kernel = lower_group(graph, [graph.nodes[0].name], ["x"], ["y"])
    got = run_program_order(kernel, {kernel.by_source("x").name: _floats(*shape)})
    np.testing.assert_array_equal(got[kernel.by_source("y").name], want)


# --- compile-time faults ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "inputs", "consts", "attrs", "match"),
    [
        (
            "GatherElements",
            {"x": ((3, 4), F32)},
            {"i": np.array([[0, 4]])},
            {"axis": 1},
            r"index 4 is out of range for axis 1 of 'x' .*position \[0, 1\] of input 'i'",
        ),
        (
            "GatherND",
            {"x": ((3, 4), F32)},
            {"i": np.array([[2, -5]])},
            {},
            r"index -5 is out of range for axis 1 of 'x' \(size 4",
        ),
        (
            "ScatterND",
            {"x": ((3, 4), F32), "u": ((1, 4), F32)},
            {"i": np.array([[3]])},
            {},
            r"index 3 is out of range for axis 0 of 'x'",
        ),
    ],
    ids=["gather_elements", "gather_nd", "scatter_nd"],
)
def test_constant_indices_out_of_range_name_node_and_value(
    op: str, inputs: dict, consts: dict, attrs: dict, match: str
) -> None:
    names = ["x", "i", "u"][: len(inputs) + 1]
    node = helper.make_node(op, names, ["y"], name="bad", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s))
            for k, (s, _) in inputs.items()
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[
            helper.make_tensor("i", TensorProto.INT64, v.shape, v) for v in consts.values()
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ShapeError, match=rf"node 'bad' \({op}\).*{match}"):
        import_model(m)


def test_topk_k_out_of_range_is_a_shape_error() -> None:
    inputs = {"x": ((2, 3), F32)}
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top")
    m = make([node], {**inputs}, ["v", "i"], {"k": np.array([2])})
    m.graph.initializer[0].int64_data[:] = []
    m.graph.initializer[0].raw_data = np.array([4], np.int64).tobytes()
    with pytest.raises(ShapeError, match=r"node 'top' \(TopK\).*k = 4 is out of range"):
        import_model(m)


def test_nonzero_of_a_runtime_input_is_unsupported() -> None:
    inputs = {"x": ((2, 3), F32)}
    node = helper.make_node("NonZero", ["x"], ["y"], name="nz")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(UnsupportedOpError, match="depends on the values"):
        import_model(m)
    assert inputs


def test_nonzero_of_a_constant_folds() -> None:
    value = np.array([[0, 1.5, 0], [2, 0, 3]], np.float32)
    node = helper.make_node("NonZero", ["c"], ["y"])
    m = make([node], {}, ["y"], {"c": value})
    graph = optimize(import_model(m))
    np.testing.assert_array_equal(graph.constants["y"], np.array(np.nonzero(value)))


# --- random legal schedules -------------------------------------------------------------------


SCHEDULED = {
    # duplicate positions: the last update must win under every schedule
    "scatter_nd_none": (
        helper.make_node("ScatterND", ["x", "i", "u"], ["y"]),
        {"x": ((5, 3), F32), "i": ((4, 1), I64), "u": ((4, 3), F32)},
        {"i": np.array([[1], [-4], [3], [1]])},
    ),
    "scatter_elements_add": (
        helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction="add"),
        {"x": ((3, 5), F32), "i": ((3, 4), I64), "u": ((3, 4), F32)},
        {"i": np.array([[0, 0, 4, -1], [2, 2, 2, 1], [-5, 3, 0, 0]])},
    ),
    "topk": (
        helper.make_node("TopK", ["x", "k"], ["v", "j"], axis=0),
        {"x": ((6, 3), F32), "k": ((1,), I64)},
        {"k": np.array([3])},
    ),
    "gather_nd": (
        helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1),
        {"x": ((2, 4, 3), F32), "i": ((2, 3, 1), I64)},
        {"i": np.array([[[3], [-1], [0]], [[-4], [2], [2]]])},
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULED))
@SETTINGS
@given(data=st.data())
def test_random_traces_keep_results(name: str, data: st.DataObject) -> None:
    """Whatever legal steps the search draws (parallel, vectorize, reorder, ...), the
    scatter's updates, TopK's ranks and GatherND's loads give the program-order result."""
    node, inputs, values = SCHEDULED[name]
    runtime = {k: v for k, v in inputs.items() if k not in values or k == "i"}
    consts = {k: v for k, v in values.items() if k != "i"}  # TopK's k
    model = make([node], runtime, list(node.output), consts)
    graph = optimize(import_model(model))
    (group,) = partition(graph).groups
    kernel = lower(graph, group)
    feeds = {
        t.name: (
            values[t.source].astype(t.dtype)
            if t.source in values
            else np.round(RNG.standard_normal(t.shape) * 2).astype(t.dtype)  # ties for TopK
        )
        for t in kernel.inputs()
    }
    check_random_trace(data, kernel, feeds)


@pytest.mark.parametrize("largest", [1, 0])
@SETTINGS
@given(data=st.data())
def test_random_traces_keep_topk_passes_in_order(largest: int, data: st.DataObject) -> None:
    """TopK's passes read the previous pick and their earlier phases from the accumulator
    they reduce into: no legal schedule may reorder them. Rows with ties, NaNs and
    infinities; program order itself against onnxruntime's order (numpy's stable sort
    with NaN above every number)."""
    inputs = {"x": ((3, 7), F32)}
    node = helper.make_node("TopK", ["x", "k"], ["v", "j"], largest=largest)
    graph = optimize(import_model(make([node], inputs, ["v", "j"], {"k": np.array([4])})))
    (group,) = partition(graph).groups
    kernel = lower(graph, group)
    x = np.round(RNG.standard_normal((3, 7)) * 2).astype(np.float32)
    x[0, [1, 4]] = np.nan
    x[1, [0, 5]] = [np.inf, -np.inf]
    feeds = {t.name: x for t in kernel.inputs()}
    want = run_program_order(kernel, feeds)
    key = np.where(np.isnan(x), np.inf, x)
    key = np.where(np.isposinf(x), np.finfo(np.float64).max, key)
    key = np.where(np.isneginf(x), -np.finfo(np.float64).max, key)
    order = np.argsort(-key if largest else key, axis=1, kind="stable")[:, :4]
    found = want[kernel.by_source("j").name]
    np.testing.assert_array_equal(found, order)
    check_random_trace(data, kernel, feeds, want)


@pytest.mark.parametrize(
    ("op", "inputs", "words"),
    [
        (
            "ScatterND",
            {
                "x": ((1, 32, 2048, 128), F32),
                "i": ((1, 32, 2048, 3), I64),
                "u": ((1, 32, 2048, 128), F32),
            },
            "compares 65536 output positions with 65536 run-time updates each",
        ),
        (
            "ScatterElements",
            {"x": ((4, 50000), F32), "i": ((4, 1000), I64), "u": ((4, 1000), F32)},
            "compares 200000 output positions with 1000 run-time updates each",
        ),
    ],
    ids=["kv_cache_prefill", "elements"],
)
def test_a_quadratic_scatter_is_refused_by_name(op: str, inputs: dict, words: str) -> None:
    """Without writes through run-time indices a scatter compares every output position
    with every update: above SCATTER_COMPARISONS pairs it is refused, naming the node,
    the data and both counts."""
    axis = {"axis": 1} if op == "ScatterElements" else {}
    node = helper.make_node(op, ["x", "i", "u"], ["y"], name="cache", **axis)
    graph = optimize(import_model(make([node], inputs, ["y"])))
    (group,) = partition(graph).groups
    with pytest.raises(UnsupportedOpError, match=rf"'cache' \({op}\).*{words}"):
        lower(graph, group)
