"""The elementwise math ops (comparisons, logic, bitwise, Mod, Sign, Round, IsNaN / IsInf,
the trigonometric and hyperbolic functions, Shrink, ThresholdedRelu, Celu, CastLike,
Size) against numpy, where the ONNX node tests do not reach: broadcasting, every integer
width and signedness, NaN / infinities / signed zeros / out-of-domain values, and
vectors of 16 lanes over rows of 37 elements (a tail in every row).

Each single-node kernel runs twice, compiled (default schedule, vector width 16) and
point by point in program order (`poly.reference`), and both must give numpy's result.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_vecmath import CALLED, within_ulps

import polytile as pt
from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel_from_node
from polytile.poly.oracle.reference import run_program_order

OPSET = 18
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def run(node, feeds: dict[str, np.ndarray], vector_math: bool = True) -> list[np.ndarray]:
    """The node's output compiled and in program order (same dtype and shape each)."""
    k = kernel_from_node(
        node,
        {n: a.shape for n, a in feeds.items()},
        OPSET,
        dtypes={n: a.dtype.name for n, a in feeds.items()},
    )
    target = dataclasses.replace(host(), vector_math=vector_math)
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=16)), target)
    (compiled,) = native.outputs(feeds).values()
    out = k.outputs()[0].name
    with np.errstate(all="ignore"):  # numpy's warnings of x % 0, asin(2), ...
        reference = run_program_order(k, feeds)[out]
    return [compiled, reference]


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, dtype and shape; NaN where numpy has NaN; signed zeros alike."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def ints(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random values of the whole range with the extremes, 0, 1 and -1 among them."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    x = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    flat = x.reshape(-1)
    edges = [info.min, info.max, 0, 1, 2, 7] + ([-1, -7] if info.min < 0 else [])
    for i, edge in enumerate(edges):
        flat[i] = int(edge)
    small = rng.integers(max(info.min, -9), 10, size=flat.size // 2).astype(dtype)
    flat[len(edges) : len(edges) + small.size] = small
    return x


#: float values with every special one
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 1e-30]


def floats(dtype: str, shape: tuple[int, ...], seed: int, scale: float = 4.0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)
    x.reshape(-1)[: len(SPECIAL)] = SPECIAL
    return x


# --- comparisons, logic, bitwise ------------------------------------------------------

BINARY = {
    "GreaterOrEqual": np.greater_equal,
    "LessOrEqual": np.less_equal,
    "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
}


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_integer_binary_ops_broadcast_like_numpy(op: str, dtype: str) -> None:
    a = ints(dtype, (3, 1, 37), 0)
    b = ints(dtype, (5, 37), 1)
    b[0, :] = a[0, 0, :]  # equal pairs for the comparisons
    for got in run(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b}):
        assert_same(got, BINARY[op](a, b))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual"])
def test_float_comparisons_are_false_with_nan(op: str, dtype: str) -> None:
    a = floats(dtype, (2, 37), 2)
    b = floats(dtype, (37,), 3)
    b[len(SPECIAL) :] = a[0, len(SPECIAL) :]
    for got in run(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b}):
        assert_same(got, BINARY[op](a, b))


@pytest.mark.parametrize("op", ["Or", "Xor"])
def test_bool_logic_broadcasts(op: str) -> None:
    rng = np.random.default_rng(4)
    a = rng.random((4, 1, 37)) < 0.5
    b = rng.random((3, 37)) < 0.5
    want = np.logical_or(a, b) if op == "Or" else np.logical_xor(a, b)
    for got in run(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b}):
        assert_same(got, want)


@pytest.mark.parametrize("dtype", INTS)
def test_bitwise_not(dtype: str) -> None:
    x = ints(dtype, (2, 37), 5)
    for got in run(helper.make_node("BitwiseNot", ["x"], ["y"]), {"x": x}):
        assert_same(got, np.invert(x))


# --- Mod ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", INTS)
def test_integer_mod_takes_the_sign_numpy_gives_it(dtype: str, fmod: int) -> None:
    """fmod=0: the divisor's sign (np.mod), fmod=1: the dividend's (np.fmod); x % 0 is
    0 and the smallest integer % -1 does not trap."""
    a = ints(dtype, (3, 37), 6)
    b = ints(dtype, (37,), 7)
    b[-4:] = 0
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = (np.fmod if fmod else np.mod)(a, b)
    for got in run(node, {"a": a, "b": b}):
        assert_same(got, want)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_mod_special_values(dtype: str, fmod: int) -> None:
    """Every pair of special values (zeros of both signs, infinities, NaN) and random
    mixed-sign pairs: values and signs of zero as numpy's mod / fmod."""
    specials = np.array([*SPECIAL, 3.0, -3.0, 7.25], dtype)
    a = np.repeat(specials, specials.size)
    b = np.tile(specials, specials.size)
    rng = np.random.default_rng(8)
    n = -a.size % 37 + 37  # rows of 37
    a = np.concatenate([a, (rng.standard_normal(n) * 10).astype(dtype)]).reshape(-1, 37)
    b = np.concatenate([b, (rng.standard_normal(n) * 3).astype(dtype)]).reshape(-1, 37)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = (np.fmod if fmod else np.mod)(a, b)
    for got in run(node, {"a": a, "b": b}):
        assert_same(got, want)


# --- Sign, Round, IsNaN, IsInf --------------------------------------------------------


@pytest.mark.parametrize("dtype", [*INTS, "float16", "float32", "float64"])
def test_sign(dtype: str) -> None:
    x = floats(dtype, (3, 37), 9) if dtype.startswith("float") else ints(dtype, (3, 37), 9)
    for got in run(helper.make_node("Sign", ["x"], ["y"]), {"x": x}):
        assert_same(got, np.sign(x))  # numpy's sign of -0 is +0


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_round_halves_to_even(dtype: str) -> None:
    halves = np.arange(-6, 6) + 0.5
    x = floats(dtype, (3, 37), 10)
    x.reshape(-1)[len(SPECIAL) : len(SPECIAL) + halves.size] = halves
    x.reshape(-1)[-3:] = [2.0**60, -(2.0**52) - 0.5, 0.49999997]
    for got in run(helper.make_node("Round", ["x"], ["y"]), {"x": x}):
        assert_same(got, np.round(x))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_isnan(dtype: str) -> None:
    x = floats(dtype, (2, 37), 11)
    x[1, ::3] = np.nan
    for got in run(helper.make_node("IsNaN", ["x"], ["y"]), {"x": x}):
        assert_same(got, np.isnan(x))


@pytest.mark.parametrize("negative", [0, 1])
@pytest.mark.parametrize("positive", [0, 1])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_isinf_detects_the_infinities_asked_for(dtype: str, positive: int, negative: int) -> None:
    x = floats(dtype, (2, 37), 12)
    x[1, ::3] = np.inf
    x[1, 1::3] = -np.inf
    node = helper.make_node(
        "IsInf", ["x"], ["y"], detect_positive=positive, detect_negative=negative
    )
    want = (np.isposinf(x) & bool(positive)) | (np.isneginf(x) & bool(negative))
    for got in run(node, {"x": x}):
        assert_same(got, want)


# --- trigonometric and hyperbolic functions -------------------------------------------

TRIG = {
    "Sin": (np.sin, (-20.0, 20.0)),
    "Cos": (np.cos, (-20.0, 20.0)),
    "Tan": (np.tan, (-3.0, 3.0)),
    "Asin": (np.arcsin, (-1.0, 1.0)),
    "Acos": (np.arccos, (-1.0, 1.0)),
    "Atan": (np.arctan, (-50.0, 50.0)),
    "Sinh": (np.sinh, (-12.0, 12.0)),
    "Cosh": (np.cosh, (-12.0, 12.0)),
    "Asinh": (np.arcsinh, (-1e3, 1e3)),
    "Acosh": (np.arccosh, (1.0, 1e3)),
    "Atanh": (np.arctanh, (-1.0, 1.0)),
}
#: NaN, infinities, signed zeros, domain edges, values out of every domain, overflow
TRIG_SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1.0000001, -1.5, 0.999]
TRIG_SPECIAL += [2.0, 100.0, 1e-30, 1e30, -1e30, 89.5, 710.0]


def trig_input(op: str, dtype: str) -> np.ndarray:
    lo, hi = TRIG[op][1]
    x = np.random.default_rng(13).uniform(lo, hi, (3, 37))
    x.reshape(-1)[: len(TRIG_SPECIAL)] = TRIG_SPECIAL
    with np.errstate(over="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("vector_math", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(TRIG))
def test_trigonometric_within_4_ulp_of_numpy(op: str, dtype: str, vector_math: bool) -> None:
    """libmvec (whole vectors, where this machine has it) and libm (lane by lane) within
    4 ulp of numpy's float64 result; NaN, infinities and out-of-domain values exactly."""
    x = trig_input(op, dtype)
    fn = TRIG[op][0]
    with np.errstate(all="ignore"):
        want = fn(x.astype(np.float64))
    k = kernel_from_node(helper.make_node(op, ["x"], ["y"]), {"x": x.shape}, OPSET, dtype=dtype)
    target = dataclasses.replace(host(), vector_math=vector_math)
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=16)), target)
    called = CALLED.findall(native.ir)
    if vector_math and host().vector_math:
        name = fn.__name__.replace("arc", "a")
        assert called and all(
            s.endswith(f"_{name}{'f' if dtype == 'float32' else ''}") for s in called
        )
    else:
        assert not called
    (got,) = native.outputs({"x": x}).values()
    within_ulps(got, want, dtype)
    with np.errstate(all="ignore"):
        reference = run_program_order(k, {"x": x})[k.outputs()[0].name]
    assert_same(reference, fn(x))


@pytest.mark.parametrize("op", sorted(TRIG))
def test_trigonometric_float16_through_float(op: str) -> None:
    """float16 is computed in float and rounded: within one float16 ulp of numpy."""
    x = trig_input(op, "float16")
    with np.errstate(all="ignore"):
        want = TRIG[op][0](x.astype(np.float64))
    compiled, _ = run(helper.make_node(op, ["x"], ["y"]), {"x": x})
    within_ulps(compiled, want, "float16", 1.0)


# --- activations ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "int64"])
def test_shrink(dtype: str) -> None:
    """Floats compare and shift in their own type, integers in double (onnx's reference
    promotes them through the float attributes) and convert back."""
    node = helper.make_node("Shrink", ["x"], ["y"], lambd=1.5, bias=0.75)
    x = floats(dtype, (3, 37), 14) if dtype.startswith("float") else ints(dtype, (3, 37), 14)
    if not dtype.startswith("float"):
        x = np.clip(x, -100, 100).astype(dtype)
    with np.errstate(invalid="ignore"):
        want = np.where(x < -1.5, x + 0.75, np.where(x > 1.5, x - 0.75, 0)).astype(dtype)
    for got in run(node, {"x": x}):
        assert_same(got, want)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_thresholded_relu(dtype: str) -> None:
    x = floats(dtype, (3, 37), 15)
    node = helper.make_node("ThresholdedRelu", ["x"], ["y"], alpha=0.5)
    for got in run(node, {"x": x}):
        assert_same(got, np.where(x > np.array(0.5, dtype), x, np.array(0, dtype)))


@pytest.mark.parametrize("alpha", [1.0, 0.3, 2.5])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_celu(dtype: str, alpha: float) -> None:
    x = floats(dtype, (3, 37), 16)
    wide = x.astype(np.float64)
    want = np.maximum(wide, 0) + np.minimum(0, alpha * np.expm1(wide / alpha))
    for got in run(helper.make_node("Celu", ["x"], ["y"], alpha=alpha), {"x": x}):
        assert got.dtype == x.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-7)


# --- CastLike and Size ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst"), [("float32", "int32"), ("int64", "float16"), ("float64", "bool")]
)
def test_castlike_is_cast_to_the_second_inputs_dtype(src: str, dst: str) -> None:
    x = floats(src, (2, 37), 17) if src.startswith("float") else ints(src, (2, 37), 17)
    x[~np.isfinite(x)] = 3
    like = np.zeros((4, 5), dst)
    got = run(helper.make_node("CastLike", ["x", "like"], ["y"]), {"x": x, "like": like})
    for out in got:
        assert_same(out, x.astype(dst))


@pytest.mark.parametrize("shape", [(3, 37), (), (2, 0, 5)])
def test_size_folds_to_the_element_count(shape: tuple[int, ...]) -> None:
    """Size of a graph input: a constant of the compiled model (int64 scalar), next to a
    computed output of the same input."""
    nodes = [helper.make_node("Size", ["x"], ["n"]), helper.make_node("Neg", ["x"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "size",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    x = np.random.default_rng(18).standard_normal(shape).astype(np.float32)
    n, y = pt.compile(model).run({"x": x})
    assert n.dtype == np.int64 and n.shape == () and int(n) == x.size
    np.testing.assert_array_equal(y, -x)
