"""The whole frontend on every zoo model: import, every pass and partitioning keep the
model's meaning (onnxruntime on the original vs. on the optimized graph), and the
structural results are what the passes promise."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from polytile import zoo
from polytile.frontend import export_model, import_model, optimize, partition
from polytile.frontend.ops import OPS, OpKind

BIG = {"alexnet", "vgg19", "zfnet512"}
#: the modern zoo's models are compiled and compared end to end in test_modern_zoo.py
CLASSIC = [i.name for i in zoo.list_models() if i.source != "modern"]
NAMES = [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in CLASSIC]


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)


@pytest.mark.parametrize("name", NAMES)
def test_optimized_zoo_model_matches_onnxruntime(name: str, zoo_model) -> None:
    model = zoo.build(name) if name in BIG else zoo_model(name)
    graph = optimize(import_model(model, name=name))
    feeds = zoo.random_inputs(model)
    want = run(model, feeds)
    got = run(export_model(graph), feeds)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(w))))

    counts = graph.op_counts()
    for gone in ("BatchNormalization", "Sum", "Dropout", "Identity", "ConstantOfShape"):
        assert gone not in counts, f"{name}: {gone} survived the passes"
    for node in graph.nodes:  # nothing computable at compile time is left
        assert OPS[node.op_type].kind is not OpKind.SHAPE
        assert not all(i in graph.constants for i in node.inputs if i), node.label

    parts = partition(graph)
    assert parts.dag.number_of_nodes() == len(parts.groups)
    convs = sum(1 for n in graph.nodes if n.op_type in ("Conv", "Gemm", "MatMul"))
    anchors = sum(1 for g in parts.groups if g.anchor is not None)
    assert anchors >= convs, "each conv / gemm / matmul anchors its own group"


def test_resnet50_structure() -> None:
    """ResNet-50: all 53 BNs fold into convs; every residual Add and ReLU joins a conv."""
    model = zoo.load("resnet50")
    graph = optimize(import_model(model))
    assert graph.op_counts().get("Conv") == 53
    parts = partition(graph)
    kinds = [g.kind for g in parts.groups]
    assert kinds.count("Conv") == 53
    assert "elementwise" not in kinds, "residual Adds and ReLUs fuse into their conv"
    fused_adds = sum(
        1
        for g in parts.groups
        if g.kind == "Conv" and any(graph.node_by_name[n].op_type == "Add" for n in g.nodes)
    )
    assert fused_adds == 16
