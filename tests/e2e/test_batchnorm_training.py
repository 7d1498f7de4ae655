"""BatchNormalization with training_mode=1 normalizes by the batch's own statistics. On a
constant (the weight standardization of BiT / NFNet convs: Reshape(W) → BN → Reshape) it
is computed at compile time; on a run-time input it is refused naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.errors import UnsupportedOpError

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)
W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32) * 3 + 1
X = RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)
EPS = 1e-4


def _params(c: int) -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.ones(c, np.float32), "s"),
        numpy_helper.from_array(np.zeros(c, np.float32), "b"),
        numpy_helper.from_array(np.zeros(c, np.float32), "m"),
        numpy_helper.from_array(np.ones(c, np.float32), "v"),
    ]


def _conv_model(weight_nodes: list[onnx.NodeProto], weight: str, inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        [*weight_nodes, helper.make_node("Conv", ["x", weight], ["y"], pads=[1, 1, 1, 1])],
        "ws",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def test_weight_standardization_is_computed_at_compile_time() -> None:
    nodes = [
        helper.make_node("Reshape", ["w", "rows"], ["w_rows"]),
        helper.make_node(
            "BatchNormalization",
            ["w_rows", "s", "b", "m", "v"],
            ["w_std_rows"],
            training_mode=1,
            epsilon=EPS,
        ),
        helper.make_node("Reshape", ["w_std_rows", "shape"], ["w_std"]),
    ]
    inits = [
        numpy_helper.from_array(W, "w"),
        numpy_helper.from_array(np.array([1, 8, 36], np.int64), "rows"),
        numpy_helper.from_array(np.array(W.shape, np.int64), "shape"),
        *_params(8),
    ]
    model = _conv_model(nodes, "w_std", inits)
    rows = W.reshape(8, 36).astype(np.float64)
    standardized = (rows - rows.mean(1, keepdims=True)) / np.sqrt(rows.var(1, keepdims=True) + EPS)
    reference = _conv_model(
        [], "w", [numpy_helper.from_array(standardized.reshape(W.shape).astype(np.float32), "w")]
    )
    (want,) = ort.InferenceSession(reference.SerializeToString()).run(None, {"x": X})
    (got,) = pt.compile(model).run({"x": X})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_training_mode_on_a_run_time_input_is_refused_naming_the_node() -> None:
    graph = helper.make_graph(
        [
            helper.make_node(
                "BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1
            )
        ],
        "train",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=_params(4),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    with pytest.raises(
        UnsupportedOpError, match=r"node 'bn' \(BatchNormalization\).*training_mode"
    ):
        pt.compile(model)
