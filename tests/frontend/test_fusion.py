"""Fusion partitioning: the fusion rules on crafted graphs, and invariants (cover, DAG,
single consumers inside a group, groups run in order reproduce the model) on random
graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from polytile.frontend import Graph, Partition, export_model, import_model, optimize, partition
from polytile.frontend.ops import OPS, OpKind

from graphs import model, random_feeds, run_ort, weights


def groups_by_ops(parts: Partition) -> list[list[str]]:
    g = parts.graph
    return [[g.node_by_name[n].op_type for n in group.nodes] for group in parts.groups]


def check_invariants(parts: Partition) -> None:
    g = parts.graph
    compute = [n.name for n in g.nodes if n.outputs[0] not in g.aliases]
    covered = [n for group in parts.groups for n in group.nodes]
    assert sorted(covered) == sorted(compute), "every compute node in exactly one group"
    dag = parts.dag
    assert all(a < b for a, b in dag.edges), "groups are listed in a topological order"
    for group in parts.groups:
        inside = set(group.nodes)
        anchors = [
            n
            for n in group.nodes
            if OPS[g.node_by_name[n].op_type].kind in (OpKind.ANCHOR, OpKind.REDUCTION)
        ]
        assert len(anchors) <= 1, f"group {group.index} has several anchors {anchors}"
        for name in group.nodes:
            for out in g.node_by_name[name].outputs:
                if out in group.outputs:
                    continue
                users = g.consumers.get(out, ())
                assert len(users) == 1 and users[0].name in inside, (
                    f"internal tensor '{out}' of group {group.index} escapes or is shared"
                )


def run_groups(parts: Partition, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute the groups one by one, each as its own model, in the partition's order."""
    g = parts.graph
    env = dict(feeds)
    for group in parts.groups:
        sub = group.subgraph(g)
        sub_feeds = {}
        for name in sub.inputs:
            source = g.aliases.get(name)
            sub_feeds[name] = (
                env[name] if source is None else env[source].reshape(g.types[name].shape)
            )
        outs = run_ort(export_model(sub), sub_feeds)
        env.update(zip(sub.outputs, outs, strict=True))
        for view, source in g.aliases.items():
            if source in env:
                env[view] = env[source].reshape(g.types[view].shape)
    return env


def partitioned(m: onnx.ModelProto) -> Partition:
    parts = partition(optimize(import_model(m)))
    check_invariants(parts)
    feeds = random_feeds(parts.graph)
    env = run_groups(parts, feeds)
    for name, want in zip(parts.graph.outputs, run_ort(m, feeds), strict=True):
        np.testing.assert_allclose(env[name], want, rtol=1e-4, atol=1e-5)
    return parts


def test_conv_epilogue_and_residual() -> None:
    w1, w2 = weights(0, (4, 4, 3, 3), (4, 4, 3, 3))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    parts = partitioned(model(nodes, {"x": (1, 4, 6, 6)}, {"y": None}, {"w1": w1, "w2": w2}))
    assert groups_by_ops(parts) == [["Conv", "Relu"], ["Conv", "Add", "Relu"]]
    assert [g.kind for g in parts.groups] == ["Conv", "Conv"]


def test_shared_tensor_stops_fusion() -> None:
    (w,) = weights(0, (4, 4, 1, 1))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Exp", ["r"], ["e"]),
        helper.make_node("Sigmoid", ["r"], ["s"]),
        helper.make_node("Mul", ["e", "s"], ["y"]),
    ]
    parts = partitioned(model(nodes, {"x": (1, 4, 3, 3)}, {"y": None}, {"w": w}))
    assert groups_by_ops(parts)[0] == ["Conv", "Relu"]
    assert groups_by_ops(parts)[1] == ["Exp", "Sigmoid", "Mul"]  # r is shared: no group holds it


def test_prologue_pad_and_transpose_fuse_into_anchor() -> None:
    w, b = weights(0, (4, 3, 3, 3), (5, 7))
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        helper.make_node("Conv", ["p", "w"], ["c"]),
        helper.make_node("Transpose", ["a"], ["at"], perm=[1, 0]),
        helper.make_node("MatMul", ["at", "b"], ["m"]),
        helper.make_node("Tanh", ["m"], ["z"]),
    ]
    inits = {"w": w, "b": b, "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}
    parts = partitioned(
        model(nodes, {"x": (1, 3, 5, 5), "a": (5, 2)}, {"c": None, "z": None}, inits)
    )
    assert groups_by_ops(parts) == [["Pad", "Conv"], ["Transpose", "MatMul", "Tanh"]]


def test_epilogue_must_keep_the_output_shape() -> None:
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["y"]),
    ]
    inits = {"axes": np.array([-1], np.int64)}
    parts = partitioned(model(nodes, {"x": (2, 8)}, {"y": None}, inits, opset=18))
    assert groups_by_ops(parts) == [["ReduceMean"], ["Sub", "Mul"]]


def test_views_belong_to_no_group() -> None:
    (w,) = weights(0, (10, 48))
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "w"], ["y"], transB=1),
    ]
    parts = partitioned(model(nodes, {"x": (2, 3, 4, 4)}, {"y": None}, {"w": w}))
    assert groups_by_ops(parts) == [["Relu"], ["Gemm"]]
    assert parts.dag.has_edge(0, 1)


UNARY = ["Relu", "Exp", "Tanh", "Sigmoid", "Neg"]


def random_model(seed: int) -> onnx.ModelProto:
    """A random DAG of convs, elementwise ops and transposes with shared tensors."""
    rng = np.random.default_rng(seed)
    channels = 3
    tensors = ["x"]
    nodes, inits = [], {}
    for i in range(int(rng.integers(4, 14))):
        kind = rng.choice(["conv", "unary", "binary", "transpose"], p=[0.25, 0.35, 0.3, 0.1])
        a = tensors[int(rng.integers(len(tensors)))]
        out = f"t{i}"
        if kind == "conv":
            inits[f"w{i}"] = rng.standard_normal((channels, channels, 1, 1)).astype(np.float32)
            nodes.append(helper.make_node("Conv", [a, f"w{i}"], [out]))
        elif kind == "unary":
            nodes.append(helper.make_node(str(rng.choice(UNARY)), [a], [out]))
        elif kind == "binary":
            b = tensors[int(rng.integers(len(tensors)))]
            nodes.append(helper.make_node(str(rng.choice(["Add", "Mul", "Max"])), [a, b], [out]))
        else:
            nodes.append(helper.make_node("Transpose", [a], [out], perm=[0, 1, 3, 2]))
        tensors.append(out)
    outputs = {t: None for t in tensors[-2:] if t != "x"}
    return model(nodes, {"x": (1, channels, 4, 4)}, outputs, inits)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_partition_soundly(seed: int) -> None:
    partitioned(random_model(seed))


def test_group_subgraph_is_a_graph() -> None:
    parts = partitioned(random_model(7))
    for group in parts.groups:
        sub = group.subgraph(parts.graph)
        assert isinstance(sub, Graph)
        assert set(sub.outputs) == set(group.outputs)


def test_multi_output_producer_does_not_hide_a_shared_tensor() -> None:
    """Split's second output is read twice: the Split cannot join its consumer's group."""
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=1, num_outputs=2),
        helper.make_node("Mul", ["a", "b"], ["m"]),
        helper.make_node("Concat", ["m", "b"], ["y"], axis=1),
    ]
    parts = partitioned(model(nodes, {"x": (1, 4)}, {"y": (1, 4)}, opset=18))
    assert groups_by_ops(parts)[0] == ["Split"]
