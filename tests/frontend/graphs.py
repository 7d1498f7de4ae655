"""Small crafted ONNX models and a differential check: the graph after import + passes
must compute what onnxruntime computes on the original model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from polytile.frontend import Graph, export_model

F32 = TensorProto.FLOAT


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, Sequence[int]],
    outputs: dict[str, Sequence[int] | None],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    dtype: int = F32,
) -> onnx.ModelProto:
    """A checked model of `nodes` whose inputs and outputs (None: left to onnx's shape
    inference) have element type `dtype`."""
    graph = helper.make_graph(
        list(nodes),
        "crafted",
        [helper.make_tensor_value_info(k, dtype, list(v)) for k, v in inputs.items()],
        [
            helper.make_empty_tensor_value_info(k)
            if v is None
            else helper.make_tensor_value_info(k, dtype, list(v))
            for k, v in outputs.items()
        ],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if any(v is None for v in outputs.values()):  # let onnx fill in the output types
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.checker.check_model(m)
    return m


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(graph.types[name].shape).astype(graph.types[name].dtype)
        for name in graph.inputs
    }


def run_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), options).run(None, feeds)


def assert_same(original: onnx.ModelProto, graph: Graph, seed: int = 0, rtol: float = 1e-4) -> None:
    """The graph (exported) and the original model agree on random inputs."""
    feeds = random_feeds(graph, seed)
    want = run_ort(original, feeds)
    got = run_ort(export_model(graph), feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.max(np.abs(w))), 1e-6) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


def weights(seed: int, *shapes: Sequence[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def batch_norm(
    x: str, y: str, channels: int, seed: int = 1
) -> tuple[onnx.NodeProto, dict[str, np.ndarray]]:
    """A BatchNormalization of `x` into `y` and its random constants (scale 's', shift
    't', mean 'm', variance 'v', one value per channel)."""
    rng = np.random.default_rng(seed)
    params = {
        "s": rng.uniform(0.5, 1.5, channels).astype(np.float32),
        "t": rng.normal(0, 0.1, channels).astype(np.float32),
        "m": rng.normal(0, 0.1, channels).astype(np.float32),
        "v": rng.uniform(0.5, 1.5, channels).astype(np.float32),
    }
    return helper.make_node("BatchNormalization", [x, *params], [y]), params


def batch_flatten_chain(x: str, out: str) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """The nodes and constants of the shape chain exporters write to flatten `x` to
    (batch, -1) into `out`: Shape → Gather(0) 'batch' → Unsqueeze → Concat with -1 →
    Reshape."""
    nodes = [
        helper.make_node("Shape", [x], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", [x, "target"], [out]),
    ]
    inits = {
        "zero": np.array(0, np.int64),
        "axes": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    return nodes, inits
