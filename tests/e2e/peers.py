"""The references the end-to-end op tests compare with (onnxruntime and onnx's own
reference evaluator, each run once on a model and its feeds) and the one-node models
they build."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx's reference evaluator (it warns on some ops' numpy casts: silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)


def one_node_model(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    outputs: dict[str, int],
    consts: dict[str, np.ndarray] | None = None,
    opset: int = 19,
    ir_version: int = 9,
) -> onnx.ModelProto:
    """A model of one node: graph inputs typed like `inputs`' arrays, outputs of the
    given element types (shapes left to inference), `consts` as initializers."""
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info(o, t, None) for o, t in outputs.items()],
        initializer=[numpy_helper.from_array(v, k) for k, v in (consts or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model
