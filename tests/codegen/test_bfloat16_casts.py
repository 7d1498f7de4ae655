"""bfloat16 conversions in native code (codegen/bfloat16.py: shifts and integer rounding
on the bits) and in the program-order reference, against ml_dtypes, onnxruntime and an
exact rounding: every bfloat16 bit pattern widened, the special values (NaN with any
payload, infinities, signed zeros, the largest finite, subnormals) and the values halfway
between two bfloat16s narrowed. Kernels run at vector width 16 over rows with a tail, so
both the vector and the scalar code convert."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.oracle.reference import bfloat16_of, run_program_order

from casts import cast_both_ways

BF16 = np.dtype(ml_dtypes.bfloat16)
OPSET = 21


def cast(x: np.ndarray, to: str) -> tuple[np.ndarray, np.ndarray]:
    """Cast of `x` to `to`, compiled and in program order."""
    return cast_both_ways(x, to, OPSET)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16)


def f32(words: list[int]) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


def assert_same_bf16(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except that any NaN matches any NaN."""
    assert got.dtype == BF16 and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])


#: float32 bit patterns around every rounding case of float32 → bfloat16
SPECIAL_F32 = [
    0x00000000, 0x80000000,  # ±0
    0x7F800000, 0xFF800000,  # ±inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7F80FFFF,  # NaNs
    0x7F7FFFFF, 0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000,  # near the largest
    0x00000001, 0x00008000, 0x00008001, 0x00010000, 0x00018000, 0x007FFFFF, 0x80000001,
    0x00800000, 0x3F800000, 0x3F808000, 0x3F808001, 0x3F818000, 0x3F80FFFF, 0xBF808000,
    0xBF818000, 0x3FFF8000, 0x4B7F8000, 0x3F7FFFFF,
]  # fmt: skip


def special_f32() -> np.ndarray:
    """The special values, then random floats of every magnitude: 75 values, a tail."""
    rng = np.random.default_rng(0)
    random = rng.integers(0, 2**32, size=75 - len(SPECIAL_F32), dtype=np.uint64)
    return f32([*SPECIAL_F32, *map(int, random)])


def test_float32_to_bfloat16_rounds_to_nearest_even() -> None:
    x = special_f32()
    with np.errstate(invalid="ignore"):
        want = x.astype(BF16)
    for got in cast(x, "bfloat16"):
        assert_same_bf16(got, want)
    # the halfway cases go to the even neighbour, the largest finite's upper half to inf
    y = dict(zip(SPECIAL_F32, bits(cast(x, "bfloat16")[0]).tolist(), strict=False))
    assert (y[0x3F808000], y[0x3F818000], y[0x3F808001], y[0xBF808000]) == (
        0x3F80,
        0x3F82,
        0x3F81,
        0xBF80,
    )
    assert (y[0x7F7F7FFF], y[0x7F7F8000], y[0x7F7FFFFF], y[0x80000000]) == (
        0x7F7F,
        0x7F80,
        0x7F80,
        0x8000,
    )
    assert (y[0x00008000], y[0x00008001], y[0x00018000]) == (0x0000, 0x0001, 0x0002)


def test_signalling_nan_stays_nan() -> None:
    """A NaN whose payload lies in the low half only would truncate to infinity."""
    got, _ = cast(f32([0x7F800001, 0xFF800001, 0x7F80FFFF] * 6), "bfloat16")
    assert np.isnan(got.astype(np.float32)).all()
    assert (np.signbit(got.astype(np.float32)) == [False, True, False] * 6).all()


def test_float32_to_bfloat16_as_onnxruntime() -> None:
    """onnxruntime's Cast (CPU) rounds to the same bfloat16s, NaNs aside (its Python API
    returns no bfloat16 arrays: they are widened back to float32 in the model)."""
    x = special_f32()
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
            helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT),
        ],
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    got = cast(x, "bfloat16")[0].astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def every_bfloat16() -> np.ndarray:
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)


@pytest.mark.parametrize("to", ["float32", "float64", "float16"])
def test_every_bfloat16_widens_exactly(to: str) -> None:
    x = every_bfloat16()
    with np.errstate(all="ignore"):
        want = x.astype(np.float32).astype(to)
    for got in cast(x, to):
        assert got.dtype == np.dtype(to)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan], want[~nan])
        np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


@pytest.mark.parametrize("to", ["int8", "uint8", "int32", "int64", "bool"])
def test_bfloat16_to_integers_and_bool(to: str) -> None:
    """Truncated toward zero where the value fits (ONNX leaves the rest undefined);
    NaN is True as a bool."""
    values = np.array([0.0, -0.0, 1.5, -1.5, 2.75, -7.9, 100.0, 126.5, 0.0078125, np.nan] * 4)
    x = values.astype(BF16)
    if to == "bool":
        want = x.astype(np.float32) != 0
    else:
        x = x[~np.isnan(values)]
        if np.dtype(to).kind == "u":
            x = x[x.astype(np.float32) >= 0]
        want = np.trunc(x.astype(np.float32)).astype(to)
    for got in cast(x, to):
        assert got.dtype == np.dtype(to)
        np.testing.assert_array_equal(got, want)


def test_float64_to_bfloat16_rounds_once() -> None:
    """Through float32 rounded to odd: 1 + 2^-8 + 2^-40 is above the halfway point
    between 1 and 1 + 2^-7, so it rounds up (two roundings, as ml_dtypes does, give 1)."""
    tricky = [1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 1 + 2**-8, 1 + 3 * 2**-8, 3.5e38]
    specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-300, -1e-300, 2.0**-133, 1e39]
    x = np.array((tricky + specials) * 3 + [0.1 * i for i in range(20)])
    want = np.array([bfloat16_of(v) for v in x], dtype=BF16)
    assert bits(want)[0] == 0x3F81 and bits(x[:1].astype(BF16))[0] == 0x3F80
    for got in cast(x, "bfloat16"):
        assert_same_bf16(got, want)
    finite = np.isfinite(x) & (np.abs(x) < 3e38)
    np.testing.assert_allclose(
        want[finite].astype(np.float64), x[finite], rtol=2**-8, atol=2.0**-134
    )


@pytest.mark.parametrize("source", ["int8", "uint8", "int16", "int32", "int64", "bool"])
def test_integers_to_bfloat16(source: str) -> None:
    rng = np.random.default_rng(1)
    if source == "bool":
        x = rng.integers(0, 2, 37).astype(bool)
    else:
        info = np.iinfo(source)
        x = rng.integers(info.min, info.max, 37, dtype=source, endpoint=True)
        x[:4] = [info.min, info.max, 0, 1]
        if source in ("int32", "int64"):  # halfway between two bfloat16s, and just above
            x[4:6] = [(1 << 24) + (1 << 16), (1 << 24) + (1 << 16) + 1]
    want = np.array([bfloat16_of(v) for v in x], dtype=BF16)
    for got in cast(x, "bfloat16"):
        assert_same_bf16(got, want)
    if source in ("int32", "int64"):
        assert bits(want)[4:6].tolist() == [0x4B80, 0x4B81]


def test_float16_to_bfloat16() -> None:
    x = np.array([65504.0, -65504.0, 6e-8, -6e-8, 1.0009765625, np.inf, np.nan, -0.0] * 5)
    x = x.astype(np.float16)
    want = x.astype(np.float32).astype(BF16)
    for got in cast(x, "bfloat16"):
        assert_same_bf16(got, want)


def test_bfloat16_to_bfloat16_keeps_every_bit_pattern() -> None:
    x = every_bfloat16()
    got, reference = cast(x, "bfloat16")
    assert_same_bf16(reference, x)
    np.testing.assert_array_equal(bits(got), bits(x))  # NaN payloads untouched too


def test_arithmetic_on_bfloat16_bits_is_refused() -> None:
    """Without the widening pass a bfloat16 kernel could only compute on bits: the code
    generator refuses it, naming the statement."""
    from polytile.errors import CodegenError
    from polytile.poly.dsl import kernel

    k = kernel("Y[i] = A[i] + A[i]", A=(8,), dtype="bfloat16")
    with pytest.raises(CodegenError, match=r"add of bfloat16 .*widen_low_precision"):
        NativeKernel(default_schedule(k, DefaultConfig(vector_width=16)), host())


def test_program_order_computes_bfloat16_in_float32() -> None:
    """The reference rounds each bfloat16 operation's float32 result once."""
    x = np.array([1.0, 3.0, 255.0, -1e-3], dtype=BF16)
    from polytile.poly.dsl import kernel

    k = kernel("Y[i] = A[i] * A[i] + 1", A=(4,), dtype="bfloat16")
    y = run_program_order(k, {"A": x})["Y"]
    wide = x.astype(np.float32)
    want = ((wide * wide).astype(BF16).astype(np.float32) + 1).astype(BF16)
    np.testing.assert_array_equal(bits(y), bits(want))
