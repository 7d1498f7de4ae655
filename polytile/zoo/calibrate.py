"""Data-dependent scaling of random weights: every layer's output of order 1 (LSUV).

Random weights drawn by role alone do not keep today's networks in range: residual
blocks whose batch norms the exporter folded into the convs double the trunk's variance
each block (ResNet-34's logits reach 1e3), and SiLU / hard-swish pass on less of their
input's power than ReLU, for which He's scale is made, so MobileNetV3's outputs fall to
1e-4. Trained weights do not do that. Layer-sequential unit-variance scaling (Mishkin and
Matas, "All you need is a good init", 2016) fixes both for any architecture: the graph
is run node by node on a few seeded inputs, and each weight layer's weights are scaled so
its output has unit standard deviation over them before the nodes after it run.

Nodes run one at a time through onnxruntime (a one-node model each). The scale factors
are rounded to powers of 2^(1/16), so the weights do not change with the last bits of
onnxruntime's arithmetic.
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from polytile.errors import ModelError

#: (op, slot of the weight) of the layers whose output is scaled to unit variance
_LAYERS = {"Conv": 1, "MatMul": 1, "Gemm": 1, "ConvTranspose": 1}
_STEP = 2.0 ** (1 / 16)


def _value_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    return helper.make_tensor_value_info(name, elem, value.shape)


class _NodeRunner:
    """Runs single nodes of a model through onnxruntime."""

    def __init__(self, model: onnx.ModelProto) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise ModelError(
                "building a modern zoo model scales its weights with onnxruntime: "
                "pip install onnxruntime (or polytile[bench])"
            ) from exc
        self._ort = onnxruntime
        self._opsets = list(model.opset_import)
        self._options = onnxruntime.SessionOptions()
        self._options.log_severity_level = 3
        self._options.intra_op_num_threads = 1

    def run(
        self, node: onnx.NodeProto, values: Sequence[Mapping[str, np.ndarray]]
    ) -> list[list[np.ndarray]]:
        """The node's outputs for each of the value sets (one session, several runs)."""
        inputs = [name for name in dict.fromkeys(node.input) if name]
        graph = helper.make_graph(
            [node],
            "node",
            [_value_info(name, values[0][name]) for name in inputs],
            [onnx.ValueInfoProto(name=name) for name in node.output if name],
        )
        model = helper.make_model(graph, opset_imports=self._opsets)
        model.ir_version = min(model.ir_version, 10)
        session = self._ort.InferenceSession(
            model.SerializeToString(), self._options, providers=["CPUExecutionProvider"]
        )
        return [session.run(None, {name: v[name] for name in inputs}) for v in values]


def _factor(output: np.ndarray) -> float | None:
    """The power of 2^(1/16) nearest to 1 / std(output); None for a constant output."""
    std = float(np.std(output.astype(np.float64)))
    if not math.isfinite(std) or std < 1e-12:
        return None
    return _STEP ** round(-math.log(std, _STEP))


def scale_layers(
    model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]
) -> onnx.ModelProto:
    """Scale each weight layer of `model` (in place) so its output over all `feeds` has
    unit standard deviation, in topological order, as LSUV does. Several feeds: a layer
    over few values (a squeeze-excitation's pooled vector) estimated on one input alone
    leaves the next inputs' activations growing block after block."""
    graph = model.graph
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for node in graph.node
        for a in node.attribute
    ):
        return model  # subgraphs read outer values: not run node by node; keep weights
    inits = {t.name: t for t in graph.initializer}
    weights: dict[str, np.ndarray] = {name: numpy_helper.to_array(t) for name, t in inits.items()}
    acts = [dict(feed) for feed in feeds]  # each feed's activations
    views = [ChainMap(a, weights) for a in acts]
    last_use = {name: i for i, node in enumerate(graph.node) for name in node.input}
    runner = _NodeRunner(model)
    scaled: set[str] = set()
    for i, node in enumerate(graph.node):
        outputs = runner.run(node, views)
        slot = _LAYERS.get(node.op_type)
        weight = node.input[slot] if slot is not None and len(node.input) > slot else ""
        if (
            weight in inits
            and weight not in scaled
            and weights[weight].dtype.kind == "f"
            and outputs[0][0].dtype.kind == "f"
        ):
            factor = _factor(np.concatenate([o[0].reshape(-1) for o in outputs]))
            if factor is not None:
                weights[weight] = (weights[weight] * factor).astype(weights[weight].dtype)
                scaled.add(weight)
                outputs = runner.run(node, views)
        for act, results in zip(acts, outputs, strict=True):
            act.update(
                (name, value) for name, value in zip(node.output, results, strict=False) if name
            )
            for name in node.input:  # intermediate values nothing reads later are dropped
                if last_use.get(name) == i and name not in inits and name not in feeds[0]:
                    act.pop(name, None)
    for name in scaled:
        inits[name].CopyFrom(numpy_helper.from_array(weights[name], name))
    return model
