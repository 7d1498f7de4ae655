"""Conversions of the narrow types (float8 E4M3FN / E4M3FNUZ / E5M2 / E5M2FNUZ / E8M0,
float4 E2M1, 4- and 2-bit integers) in native code (codegen/narrow.py) and in the
program-order reference, against onnx's reference Cast (`cast_to`) and ml_dtypes: every
bit pattern widened; float32 special values, the values halfway between two neighbours
(and one float32 ulp either side), the largest finite and the overflow threshold
narrowed, with and without `saturate`; float8e8m0 in each round_mode. Where ml_dtypes
and the ONNX spec differ (saturation), the spec's table is checked. Kernels run at vector
width 16 over rows with a tail, so both the vector and the scalar code convert."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polytile.frontend.narrow import FLOAT_FORMATS, INT_FORMATS, cast_array

from casts import cast_both_ways

OPSET = 25
FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]
NARROW_FLOATS = sorted(FLOAT_FORMATS)
NARROW_INTS = sorted(INT_FORMATS)


def cast(x: np.ndarray, to: str, **attrs: object) -> tuple[np.ndarray, np.ndarray]:
    """Cast of `x` to `to` (with Cast's attributes), compiled and in program order."""
    return cast_both_ways(x, to, OPSET, **attrs)


def with_tail(x: np.ndarray) -> np.ndarray:
    """`x` with 5 more values, so that a row has a scalar tail after whole vectors."""
    return np.concatenate([x, x[:5]])


def every_pattern(dtype: str) -> np.ndarray:
    """Every value of a narrow type (16 patterns for the 4-bit, 4 for the 2-bit types)."""
    width = 8 if dtype.startswith("float8") else (2 if dtype.endswith("int2") else 4)
    return with_tail(np.arange(2**width, dtype=np.uint8).view(dtype))


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype and bits, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    np.testing.assert_array_equal(got.view(width)[~nan], want.view(width)[~nan])


def neighbours_and_halfways(dtype: str) -> np.ndarray:
    """float32 values at each finite value of a narrow float, halfway between neighbours
    and one float32 ulp either side of the halfway points, both signs; then past the
    largest finite (the overflow threshold and beyond), the specials and random floats."""
    values = every_pattern(dtype)[:-5].astype(np.float32)
    finite = np.unique(np.abs(values[np.isfinite(values)]))
    half = (finite[:-1] + finite[1:]) / 2  # exact in float32
    top = finite[-1]
    gap = top - finite[-2]
    beyond = np.array([top + gap / 2, top + gap, 2 * top, 1e30], dtype=np.float32)
    points = np.concatenate([finite, half, beyond])
    around = np.concatenate(
        [points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(0))]
    )
    specials = np.array([0.0, np.inf, np.nan, 1e-45, 1e-38], dtype=np.float32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 2**32, size=200, dtype=np.uint64).astype(np.uint32).view(np.float32)
    one_sign = np.concatenate([around, specials]).astype(np.float32)
    return with_tail(np.concatenate([one_sign, -one_sign, random]))


@pytest.mark.parametrize("dtype", NARROW_FLOATS)
@pytest.mark.parametrize("to", ["float32", "float16", "float64", "bfloat16"])
def test_every_narrow_float_widens_exactly(dtype: str, to: str) -> None:
    x = every_pattern(dtype)
    want = cast_array(x, to)
    if to in ("float32", "float64"):  # exact: ml_dtypes agrees with the reference
        assert_same(want, x.astype(to))
    for got in cast(x, to):
        assert_same(got, want)


@pytest.mark.parametrize("dtype", [*FLOAT8, "float4_e2m1fn"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_float32_narrows_to_nearest_even(dtype: str, saturate: int) -> None:
    x = neighbours_and_halfways(dtype)
    want = cast_array(x, dtype, saturate=bool(saturate))
    for got in cast(x, dtype, saturate=saturate):
        assert_same(got, want)


@pytest.mark.parametrize("dtype", FLOAT8)
def test_wider_sources_round_once(dtype: str) -> None:
    """float64 values a hair off a halfway point (lost in float32) and float16 values
    narrow in one rounding, as the reference's direct conversion does."""
    points = neighbours_and_halfways(dtype)
    points = points[np.isfinite(points) & (np.abs(points) < 1e30)]
    halfway = points.astype(np.float64)
    x = np.concatenate([halfway * (1 + 2.0**-40), halfway * (1 - 2.0**-40), halfway])
    # at the exact halfway points, a hair off rounds as the float32 one ulp off does
    finite = np.unique(np.abs(every_pattern(dtype).astype(np.float32)))
    finite = finite[np.isfinite(finite)]
    half = np.concatenate([(finite[:-1] + finite[1:]) / 2, -(finite[:-1] + finite[1:]) / 2])
    off = half.astype(np.float64)
    hair = np.concatenate([off * (1 + 2.0**-40), off * (1 - 2.0**-40)])
    ulp = np.concatenate(
        [np.nextafter(half, np.copysign(np.float32(np.inf), half)), np.nextafter(half, 0)]
    )
    for saturate in (1, 0):
        want = cast_array(x, dtype, saturate=bool(saturate))
        assert_same(
            cast_array(hair, dtype, saturate=bool(saturate)),
            cast_array(ulp.astype(np.float32), dtype, saturate=bool(saturate)),
        )
        for got in cast(x, dtype, saturate=saturate):
            assert_same(got, want)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    for got in cast(h, dtype):
        assert_same(got, cast_array(h, dtype))


SPEC_SATURATED = {  # the spec's table for saturate=1: ±inf and out of range → ±FLT_MAX
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
}
SPEC_OVERFLOW = {  # saturate=0: what +inf and a too large value become
    "float8_e4m3fn": np.nan,
    "float8_e4m3fnuz": np.nan,
    "float8_e5m2": np.inf,
    "float8_e5m2fnuz": np.nan,
}


@pytest.mark.parametrize("dtype", FLOAT8)
def test_saturation_follows_the_spec_table(dtype: str) -> None:
    """ml_dtypes' astype never saturates; the spec's Cast does by default."""
    x = with_tail(np.array([np.inf, -np.inf, 1e6, -1e6, np.nan, 0.0, -0.0] * 3, np.float32))
    top = SPEC_SATURATED[dtype]
    fnuz = dtype.endswith("fnuz")
    for got in cast(x, dtype):
        y = got.astype(np.float32)[:7]
        np.testing.assert_array_equal(y[:4], [top, -top, top, -top])
        assert np.isnan(y[4]) and y[5] == 0 and y[6] == 0
        assert np.signbit(y[6]) != fnuz  # FNUZ has no negative zero
    assert not np.array_equal(x.astype(dtype).astype(np.float32)[:1], [top])  # ml_dtypes
    over = SPEC_OVERFLOW[dtype]
    for got in cast(x, dtype, saturate=0):
        y = got.astype(np.float32)
        np.testing.assert_array_equal(y[[0, 2]], [over, over])
        if over == np.inf:
            np.testing.assert_array_equal(y[[1, 3]], [-np.inf, -np.inf])
        else:
            assert np.isnan(y[[1, 3]]).all()


def test_float4_saturates_always() -> None:
    x = with_tail(np.array([6.0, 6.5, 7.0, 100.0, np.inf, -np.inf, -7.0] * 3, np.float32))
    for saturate in (1, 0):
        for got in cast(x, "float4_e2m1fn", saturate=saturate):
            np.testing.assert_array_equal(got.astype(np.float32)[:7], [6, 6, 6, 6, 6, -6, -6])


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_float8e8m0_rounds_the_exponent(round_mode: str, saturate: int) -> None:
    """onnx's to_float8e8m0: the sign ignored, NaN and infinity NaN, 0 the smallest."""
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    mantissas = np.array([1.0, 1.25, 1.5, 1.5000001, 1.75, 1.9999999], np.float32)
    x = (powers[:, None] * mantissas[None, :]).ravel()
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.0], np.float32)
    x = with_tail(np.concatenate([x[np.isfinite(x)], specials]))
    want = cast_array(x, "float8_e8m0fnu", saturate=bool(saturate), round_mode=round_mode)
    for got in cast(x, "float8_e8m0fnu", saturate=saturate, round_mode=round_mode):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    if round_mode == "up":  # from float16 and float64 too (through float32, as onnx)
        for source in (np.float16, np.float64):
            with np.errstate(over="ignore"):
                y = x.astype(source)
            for got in cast(y, "float8_e8m0fnu", saturate=saturate):
                want = cast_array(y, "float8_e8m0fnu", saturate=bool(saturate))
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", NARROW_INTS)
@pytest.mark.parametrize("to", ["int8", "uint8", "int32", "int64", "float32", "float16", "bool"])
def test_every_narrow_integer_widens(dtype: str, to: str) -> None:
    x = every_pattern(dtype)
    want = cast_array(x, to)
    np.testing.assert_array_equal(want, x.astype(to))  # ml_dtypes agrees
    for got in cast(x, to):
        assert_same(got, want)


@pytest.mark.parametrize("dtype", NARROW_INTS)
@pytest.mark.parametrize("source", ["int8", "uint8", "int32", "int64", "uint64", "bool"])
def test_integers_wrap_into_narrow_integers(dtype: str, source: str) -> None:
    values = np.concatenate([np.arange(-300, 300), [2**31 - 1, -(2**31), 2**40 + 7]])
    x = with_tail(values.astype(source))
    want = cast_array(x, dtype)
    for got in cast(x, dtype):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", NARROW_INTS)
@pytest.mark.parametrize("source", ["float32", "float16", "float64"])
def test_floats_truncate_into_narrow_integers(dtype: str, source: str) -> None:
    """Truncated toward zero and wrapped; NaN, infinity and values past int32 give 0, as
    ml_dtypes (the spec leaves out of range undefined)."""
    steps = np.arange(-40, 40) / 4
    odd = [np.nan, np.inf, -np.inf, 1e10, -1e10, 2.0**31, -(2.0**31), 65504.0]
    with np.errstate(over="ignore"):
        x = with_tail(np.concatenate([steps, odd]).astype(source))
    want = cast_array(x, dtype)
    for got in cast(x, dtype):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("float8_e4m3fn", "float8_e5m2"),
        ("float8_e5m2", "float8_e4m3fn"),
        ("float8_e5m2", "float8_e4m3fnuz"),
        ("float8_e4m3fnuz", "float4_e2m1fn"),
        ("float8_e5m2fnuz", "float8_e8m0fnu"),
        ("float8_e4m3fn", "int4"),
        ("int4", "uint4"),
        ("uint4", "int2"),
        ("int4", "float8_e4m3fn"),
        ("uint2", "float4_e2m1fn"),
    ],
)
def test_narrow_to_narrow(src: str, dst: str) -> None:
    x = every_pattern(src)
    for saturate in (1, 0):
        want = cast_array(x, dst, saturate=bool(saturate))
        for got in cast(x, dst, saturate=saturate):
            assert_same(got, want)


def test_narrow_arrays_are_one_byte_per_element() -> None:
    """ml_dtypes stores every narrow type in a byte, the layout the kernels read."""
    for dtype in (*NARROW_FLOATS, *NARROW_INTS):
        assert np.dtype(dtype).itemsize == 1
    assert np.array([-1], ml_dtypes.int4).view(np.uint8)[0] == 0x0F  # the low bits only
