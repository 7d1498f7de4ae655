"""bfloat16 models end to end: inputs, weights (initializers and Constant values),
intermediate values and outputs in bfloat16, each op computed in float32 and rounded to
bfloat16 as the ONNX spec says. onnxruntime has no CPU kernels for bfloat16 arithmetic
(MatMul, Add, Relu, Softmax), so the reference is numpy computing each op in float32 and
rounding its result with ml_dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.errors import InputError
from polytile.frontend import import_model
from polytile.frontend.passes import optimize

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(0)
OPSET = 21


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(BF16)


def wide(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def dense_softmax(batch: int = 5, k: int = 24, n: int = 37) -> tuple[onnx.ModelProto, dict]:
    """softmax(relu(x @ w + b) * s): w an initializer, b a Constant node, all bfloat16."""
    w = bf16(RNG.standard_normal((k, n)) / np.sqrt(k))
    b = bf16(RNG.standard_normal(n) * 0.5)
    nodes = [
        helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(b)),
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["biased"]),
        helper.make_node("Relu", ["biased"], ["act"]),
        helper.make_node("Mul", ["act", "s"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "dense_softmax_bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [batch, k])],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [batch, n]),
            helper.make_tensor_value_info("act", TensorProto.BFLOAT16, [batch, n]),
        ],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(bf16(3.0), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model, full_check=True)
    return model, {"w": w, "b": b, "s": bf16(3.0)}


def reference(x: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each op in float32, its result rounded to bfloat16."""
    mm = bf16(wide(x) @ wide(p["w"]))
    act = bf16(np.maximum(wide(bf16(wide(mm) + wide(p["b"]))), 0))
    scaled = wide(bf16(wide(act) * wide(p["s"])))
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    return bf16(e / e.sum(axis=-1, keepdims=True)), act


def assert_close_bf16(got: np.ndarray, want: np.ndarray, ulps: int = 1) -> None:
    """Within `ulps` bfloat16 units in the last place: float32 sums in another order and
    another exp can land a result on the other side of a rounding boundary."""
    assert got.dtype == BF16 and got.shape == want.shape
    np.testing.assert_allclose(wide(got), wide(want), rtol=ulps * 2.0**-7, atol=1e-30)


def test_dense_softmax_against_float32_steps_rounded() -> None:
    model, params = dense_softmax()
    compiled = pt.compile(model)
    for seed in range(3):
        x = bf16(np.random.default_rng(seed).standard_normal((5, 24)) * 2)
        y, act = compiled.run({"x": x})
        want_y, want_act = reference(x, params)
        assert_close_bf16(act, want_act)
        assert_close_bf16(y, want_y)
        # most values agree to the bit: the float32 steps in between are the same
        assert np.mean(act.view(np.uint16) == want_act.view(np.uint16)) > 0.9


def test_session_takes_and_returns_bfloat16_arrays() -> None:
    model, params = dense_softmax(batch=2)
    sess = pt.InferenceSession(model.SerializeToString())
    assert sess.get_inputs()[0].type == "tensor(bfloat16)"
    assert [o.type for o in sess.get_outputs()] == ["tensor(bfloat16)"] * 2
    x = bf16(RNG.standard_normal((2, 24)))
    y, act = sess.run(None, {"x": x})
    assert y.dtype == BF16 and act.dtype == BF16
    assert_close_bf16(y, reference(x, params)[0])
    with pytest.raises(InputError, match=r"input 'x' must be bfloat16, got float32"):
        sess.run(None, {"x": wide(x)})


def test_random_inputs_are_normal_floats() -> None:
    """`polytile run --fill random` feeds a bfloat16 input normal values, not integers."""
    model, _ = dense_softmax(batch=4)
    (x,) = pt.compile(model).random_inputs(seed=1).values()
    assert x.dtype == BF16 and (wide(x) != np.round(wide(x))).any() and (wide(x) < 0).any()


def test_each_op_rounds_inside_a_fused_kernel() -> None:
    """(x + d) - x with d below half of x's bfloat16 ulp: x + d rounds back to x, so 0;
    a kernel keeping the float32 sum would give d. Max, Mul and Div chain as well."""
    x = bf16(np.linspace(1, 2, 40, endpoint=False))
    d = bf16(np.full(40, 2.0**-10))
    nodes = [
        helper.make_node("Add", ["x", "d"], ["s"]),
        helper.make_node("Sub", ["s", "x"], ["diff"]),
        helper.make_node("Div", ["x", "three"], ["third"]),
        helper.make_node("Mul", ["third", "three"], ["back"]),
        helper.make_node("Max", ["back", "diff"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rounding",
        [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [40]) for n in ("x", "d")],
        [
            helper.make_tensor_value_info("diff", TensorProto.BFLOAT16, [40]),
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [40]),
        ],
        initializer=[numpy_helper.from_array(bf16(3.0), "three")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    diff, y = pt.compile(model).run({"x": x, "d": d})
    assert not wide(diff).any()
    want = bf16(wide(bf16(wide(x) / 3)) * 3)
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    assert (y != x).any()  # the rounding of x / 3 shows: the test can tell


def test_only_casts_and_copies_see_bfloat16_after_the_passes() -> None:
    """The widening pass leaves bfloat16 only to Cast (and views); the weight folds to a
    float32 constant (exact), so no kernel widens it at run time."""
    model, params = dense_softmax()
    graph = optimize(import_model(model))
    for node in graph.nodes:
        if node.op_type != "Cast":
            assert all(graph.types[t].dtype != "bfloat16" for t in node.inputs if t), node
            assert all(graph.types[t].dtype != "bfloat16" for t in node.outputs if t), node
    weights = [v for v in graph.constants.values() if v.shape == params["w"].shape]
    assert len(weights) == 1 and weights[0].dtype == np.float32
    np.testing.assert_array_equal(weights[0], wide(params["w"]))


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("ReduceSum", {"keepdims": 0}),
        ("ReduceMean", {"keepdims": 1}),
        ("Transpose", {"perm": [1, 0]}),
        ("Sigmoid", {}),
        ("Erf", {}),
        ("Sqrt", {}),
    ],
)
def test_more_ops_compute_in_float32(op: str, attrs: dict) -> None:
    """Reductions, data movement and math functions on bfloat16, against the same op in
    float32 on onnxruntime, rounded."""
    import onnxruntime as ort

    x = bf16(np.abs(RNG.standard_normal((6, 19))) + 0.1)

    def model_of(elem: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node(op, ["x"], ["y"], **attrs)],
            "one_op",
            [helper.make_tensor_value_info("x", elem, [6, 19])],
            [helper.make_tensor_value_info("y", elem, None)],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])

    sess = ort.InferenceSession(
        model_of(TensorProto.FLOAT).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (want,) = sess.run(None, {"x": wide(x)})
    (got,) = pt.compile(model_of(TensorProto.BFLOAT16)).run({"x": x})
    assert_close_bf16(got, bf16(want))


def test_data_movement_and_comparisons_of_bfloat16() -> None:
    """Views, copies, Concat, Where, Gather, Equal and a bfloat16 Constant output."""
    c = bf16([1.5, -2.0, np.nan])
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
        helper.make_node("Concat", ["r", "r"], ["cat"], axis=0),
        helper.make_node("Where", ["m", "x", "x2"], ["w"]),
        helper.make_node("Equal", ["x", "x2"], ["eq"]),
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
    ]
    outs = {"r": (3, 2), "c": (3,), "cat": (6, 2), "w": (2, 3), "eq": (2, 3), "g": (2, 2)}
    graph = helper.make_graph(
        nodes,
        "movement",
        [
            helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3]),
            helper.make_tensor_value_info("x2", TensorProto.BFLOAT16, [2, 3]),
            helper.make_tensor_value_info("m", TensorProto.BOOL, [2, 3]),
        ],
        [
            helper.make_tensor_value_info(
                n, TensorProto.BOOL if n == "eq" else TensorProto.BFLOAT16, list(shape)
            )
            for n, shape in outs.items()
        ],
        initializer=[
            numpy_helper.from_array(np.array([3, 2], dtype=np.int64), "shape"),
            numpy_helper.from_array(np.array([2, 0], dtype=np.int64), "idx"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    x = bf16([[1, 2, 3], [4, 5, np.inf]])
    x2 = bf16([[1, 0, 3], [0, 5, -0.0]])
    m = np.array([[1, 0, 1], [0, 1, 0]], dtype=bool)
    got = dict(zip(outs, pt.compile(model).run({"x": x, "x2": x2, "m": m}), strict=True))
    want = {
        "r": x.reshape(3, 2),
        "c": c,
        "cat": np.concatenate([x.reshape(3, 2)] * 2),
        "w": np.where(m, x, x2),
        "eq": wide(x) == wide(x2),
        "g": x[:, [2, 0]],
    }
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        bits = [np.ascontiguousarray(v).view(np.uint8) for v in (got[name], value)]
        np.testing.assert_array_equal(*bits, err_msg=name)


FLOAT16_OPS = [
    ("Elu", {}),
    ("Selu", {}),
    ("Softplus", {}),
    ("HardSigmoid", {}),
    ("Sigmoid", {}),
    ("Softmax", {"axis": -1}),
    ("LogSoftmax", {"axis": -1}),
    ("ReduceMean", {"keepdims": 1}),
]


@pytest.mark.parametrize(("op", "attrs"), FLOAT16_OPS, ids=[op for op, _ in FLOAT16_OPS])
def test_float16_ops_as_onnxruntime(op: str, attrs: dict) -> None:
    """float16 is computed in float32 and rounded once per op, as onnxruntime computes
    it: within one float16 ulp of its results and mostly equal to the bit. (Computed in
    float16 step by step, Elu's exp(x) - 1 and Selu were 3-5 ulps off near 0.)"""
    import onnxruntime as ort

    x = (np.random.default_rng(3).standard_normal((8, 67)) * 2).astype(np.float16)
    x[0, :8] = [-1e-3, -2e-2, -0.1, 1e-4, 0, -0.0, 6e-5, -6e-5]
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)],
        "one_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    (got,) = pt.compile(model).run({"x": x})
    assert got.dtype == np.float16 and got.shape == want.shape
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    assert (np.abs(got.astype(np.float32) - want.astype(np.float32)) <= ulp).all()
    assert np.mean(got == want) > 0.99
