"""Models with narrow tensors (float8, float4, 4- and 2-bit integers) end to end: as graph
inputs and outputs, initializers (4-bit ones packed two to a byte in the file) and
Constant values, through views and Cast / CastLike with saturate and round_mode, against
onnx's ReferenceEvaluator. Any op that computes on a narrow type is refused by name."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polytile as pt
from polytile.errors import InputError, ModelError, UnsupportedOpError

OPSET = 25
RNG = np.random.default_rng(0)


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "narrow", inputs, outputs, initializer=inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype, and the same values as float64 (exact for these types; NaN == NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def _run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want = ReferenceEvaluator(model).run(None, feeds)
    got = pt.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        _same(g, np.asarray(w))


def test_float8_input_through_views_and_casts() -> None:
    """A float8 input reshaped, transposed by a view chain, widened, computed on in
    float32, narrowed back without saturation, and returned as is (Identity)."""
    x = RNG.standard_normal((4, 6)).astype(np.float32) * 300
    x[0, :4] = [np.inf, -np.inf, np.nan, 1e6]
    x8 = x.astype(ml_dtypes.float8_e5m2)
    model = _model(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Cast", ["r"], ["wide"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["wide", "two"], ["twice"]),
            helper.make_node("Cast", ["twice"], ["y"], to=TensorProto.FLOAT8E4M3FN, saturate=0),
            helper.make_node("Cast", ["twice"], ["s"], to=TensorProto.FLOAT8E4M3FNUZ),
            helper.make_node("Identity", ["x"], ["same"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E5M2, [4, 6])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2, 12]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT8E4M3FNUZ, [2, 12]),
            helper.make_tensor_value_info("same", TensorProto.FLOAT8E5M2, [4, 6]),
        ],
        [
            numpy_helper.from_array(np.array([2, 12], np.int64), "shape"),
            numpy_helper.from_array(np.float32(2.0), "two"),
        ],
    )
    _run_both(model, {"x": x8})


def test_narrow_weights_initializers_and_constants() -> None:
    """int4 and float4 initializers (packed in the file), a float8 Constant, dequantized
    by casts and combined with a float32 input; the casts of constants fold."""
    w4 = RNG.integers(-8, 8, (5, 7)).astype(ml_dtypes.int4)
    f4 = RNG.standard_normal(7).astype(np.float32).astype(ml_dtypes.float4_e2m1fn)
    c8 = (RNG.standard_normal(7) * 10).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    packed = numpy_helper.from_array(w4, "w")
    assert len(packed.raw_data) == 18  # two 4-bit values a byte in the file
    model = _model(
        [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c8)),
            helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["f"], ["ff"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["c"], ["cf"], to=TensorProto.FLOAT),
            helper.make_node("MatMul", ["x", "wf"], ["mm"]),
            helper.make_node("Mul", ["mm", "ff"], ["scaled"]),
            helper.make_node("Add", ["scaled", "cf"], ["y"]),
            helper.make_node("CastLike", ["y", "f"], ["y4"]),
            helper.make_node("CastLike", ["y", "w"], ["yi"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7]),
            helper.make_tensor_value_info("y4", TensorProto.FLOAT4E2M1, [3, 7]),
            helper.make_tensor_value_info("yi", TensorProto.INT4, [3, 7]),
        ],
        [packed, numpy_helper.from_array(f4, "f")],
    )
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = pt.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    _same(got[1], want[1])
    _same(got[2], want[2])


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_float8e8m0_round_mode_and_folding(round_mode: str) -> None:
    """A scale in float8e8m0 from a run-time input and from a folded constant."""
    x = np.abs(RNG.standard_normal(20)).astype(np.float16) * 100
    model = _model(
        [
            helper.make_node(
                "Cast", ["x"], ["e"], to=TensorProto.FLOAT8E8M0, round_mode=round_mode
            ),
            helper.make_node(
                "Cast", ["k"], ["ke"], to=TensorProto.FLOAT8E8M0, round_mode=round_mode
            ),
            helper.make_node("Cast", ["e"], ["y"], to=TensorProto.FLOAT),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [20])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [20]),
            helper.make_tensor_value_info("ke", TensorProto.FLOAT8E8M0, [20]),
        ],
        [numpy_helper.from_array(x.astype(np.float32) * 3, "k")],
    )
    _run_both(model, {"x": x})


def test_narrow_inputs_are_checked_and_described() -> None:
    model = _model(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
    )
    sess = pt.InferenceSession(model.SerializeToString())
    assert sess.get_inputs()[0].type == "tensor(float8e4m3fn)"
    with pytest.raises(InputError, match="float8_e4m3fn"):
        sess.run(None, {"x": np.zeros(8, np.float32)})
    x = np.linspace(-500, 500, 8).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x.astype(np.float32))
    compiled = pt.compile(model.SerializeToString())
    feeds = compiled.random_inputs(0)
    assert feeds["x"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(compiled.run(feeds)[0], feeds["x"].astype(np.float32))


@pytest.mark.parametrize(
    ("op", "out_type", "shape"),
    [
        ("Transpose", TensorProto.FLOAT8E4M3FN, [2, 2]),
        ("Pad", TensorProto.FLOAT8E4M3FN, [2, 4]),
        ("IsNaN", TensorProto.BOOL, [2, 2]),
    ],
)
def test_an_op_other_than_cast_on_a_narrow_type_is_refused_by_name(
    op: str, out_type: int, shape: list[int]
) -> None:
    """Ops the spec allows on float8 besides casts and views are refused, by name."""
    inputs = ["x", "pads"] if op == "Pad" else ["x"]
    model = _model(
        [helper.make_node(op, inputs, ["y"], name="the_node")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2, 2])],
        [helper.make_tensor_value_info("y", out_type, shape)],
        [numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")],
    )
    with pytest.raises(UnsupportedOpError, match=r"the_node.*float8_e4m3fn"):
        pt.compile(model.SerializeToString())


def test_an_unknown_round_mode_is_a_model_error_naming_the_node() -> None:
    model = _model(
        [
            helper.make_node(
                "Cast", ["x"], ["y"], name="c", to=TensorProto.FLOAT8E8M0, round_mode="odd"
            )
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, [3])],
    )
    with pytest.raises(ModelError, match=r"'c'.*round_mode 'odd'"):
        pt.compile(model.SerializeToString())
