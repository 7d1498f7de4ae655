"""The narrow ONNX element types: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), float4
E2M1 and the 4- and 2-bit integers, and their conversions as ONNX's Cast defines them.

They are storage types: one element per byte, as ml_dtypes' numpy arrays hold them (ONNX
packs 4- and 2-bit values two or four to a byte only in its files, which
onnx.numpy_helper unpacks). The ONNX spec allows only casts and data movement on them, so
polytile converts them in Cast and moves them in views and copies; any other op on them is
refused (frontend/widen.py). `cast_array` is the numpy conversion constant folding and the
reference oracle use: onnx's reference Cast (`onnx.reference.ops.op_cast.cast_to`, which
saturates float8 as the spec says where ml_dtypes would overflow to NaN / infinity).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers numpy's names of the narrow dtypes)
import numpy as np
import onnx
from onnx.reference.ops.op_cast import cast_to


@dataclass(frozen=True)
class FloatFormat:
    """A narrow float: sign (none for E8M0), exponent and mantissa widths, bias, the
    encoding of its largest finite magnitude, and how it spells NaN and infinity."""

    exponent: int
    mantissa: int
    bias: int
    #: the bits (sign clear) of the largest finite magnitude
    max_bits: int
    #: "fn": NaN is all ones, no infinity (E4M3FN); "ieee": IEEE-like NaN and infinity
    #: (E5M2); "fnuz": NaN is the negative zero pattern, no -0, no infinity; "none": no
    #: NaN nor infinity (E2M1, which saturates always); "e8m0": unsigned powers of two
    specials: str

    @property
    def width(self) -> int:
        return self.exponent + self.mantissa + (0 if self.specials == "e8m0" else 1)


FLOAT_FORMATS: dict[str, FloatFormat] = {
    "float8_e4m3fn": FloatFormat(4, 3, 7, 0x7E, "fn"),
    "float8_e4m3fnuz": FloatFormat(4, 3, 8, 0x7F, "fnuz"),
    "float8_e5m2": FloatFormat(5, 2, 15, 0x7B, "ieee"),
    "float8_e5m2fnuz": FloatFormat(5, 2, 16, 0x7F, "fnuz"),
    "float8_e8m0fnu": FloatFormat(8, 0, 127, 0xFE, "e8m0"),
    "float4_e2m1fn": FloatFormat(2, 1, 1, 0x7, "none"),
}
#: narrow integer dtype → (bits, signed)
INT_FORMATS: dict[str, tuple[int, bool]] = {
    "int4": (4, True),
    "uint4": (4, False),
    "int2": (2, True),
    "uint2": (2, False),
}
NARROW_DTYPES = frozenset(FLOAT_FORMATS) | frozenset(INT_FORMATS)
#: Cast's round_mode values (they apply to float8e8m0 only)
ROUND_MODES = frozenset({"up", "down", "nearest"})


def is_narrow(dtype: str) -> bool:
    return dtype in NARROW_DTYPES


def float32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """`x` (float64, or an integer through float64) in float32 rounded toward zero with the
    last bit set when inexact: a second rounding to a type of at most 21 mantissa bits
    then equals one direct rounding (ml_dtypes and onnx's reference would round twice,
    the spec rounds once)."""
    wide = np.asarray(x).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = wide.astype(np.float32)
    bits = nearest.view(np.uint32).copy()
    back = nearest.astype(np.float64)
    away = np.abs(back) > np.abs(wide)
    bits[away] -= np.uint32(1)
    inexact = np.isfinite(wide) & (back != wide)
    bits[inexact] |= np.uint32(1)
    return bits.view(np.float32)


def cast_array(
    x: np.ndarray, dtype: str, saturate: bool = True, round_mode: str = "up"
) -> np.ndarray:
    """`x` converted to `dtype` as ONNX's Cast (its reference implementation) converts it,
    except that wider sources round once, as the spec says (float32 rounded to odd first).
    ml_dtypes has no conversion between two narrow integer types: they go through int8
    (the wrap-around of a fixed-point cast)."""
    x = np.asarray(x)
    if x.dtype.name in INT_FORMATS and dtype in INT_FORMATS:
        x = x.astype(np.int8)
    if dtype in FLOAT_FORMATS and x.dtype.name not in FLOAT_FORMATS and x.dtype.itemsize > 2:
        x = float32_round_to_odd(x)
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    with np.errstate(all="ignore"):  # (to_float8e8m0 fails on a 0-d array: made 1-d)
        out = cast_to(x.reshape(-1), to, bool(saturate), round_mode)
    return np.asarray(out).astype(dtype, copy=False).reshape(x.shape)
