"""The references the end-to-end op tests compare with: onnxruntime and onnx's own
reference evaluator, each run once on a model and its feeds."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
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
