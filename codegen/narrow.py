"""Conversions of the narrow types (frontend/narrow.py) in LLVM IR, on their bits: each is
one byte in memory and an i8 in registers, in ml_dtypes' layout (the value in the low
bits, the bits above clear).

A narrow float widens to float32 exactly, with integer arithmetic on its fields (works
lane by lane in vectors, unlike a table). float32 narrows rounding to nearest even on the
bits in the normal range, and through `roundeven` of the value scaled to units of the
smallest subnormal below it; overflow saturates or gives infinity / NaN as Cast's
`saturate` says. Wider sources reach float32 rounded to odd (codegen/bfloat16.py), so
the rounding is done once. float8e8m0 follows onnx's `to_float8e8m0` (round_mode up,
down or nearest, on the exponent). The 4- and 2-bit integers widen by sign or zero
extension and narrow by wrapping; a float converts to them as x86's cvttss2si does
(truncated, out of range gives INT_MIN) and then wraps, as ml_dtypes does.
"""

from __future__ import annotations

from llvmlite import ir

from polytile.frontend.narrow import FLOAT_FORMATS, INT_FORMATS

from .llvm_types import I1, I8, I32, ModuleContext, constant

F32 = ir.FloatType()
_QUIET_NAN = 0x7FC00000


def _like(shape_of: ir.Type, element: ir.Type) -> ir.Type:
    if isinstance(shape_of, ir.VectorType):
        return ir.VectorType(element, shape_of.count)
    return element


def _c(ty: ir.Type, value: int | float) -> ir.Constant:
    """A scalar or splat constant of type `ty`."""
    element = ty.element if isinstance(ty, ir.VectorType) else ty
    scalar = int(value) if isinstance(element, ir.IntType) else float(value)
    if isinstance(ty, ir.VectorType):
        return constant(ty, [scalar] * ty.count)
    return ir.Constant(ty, scalar)


def to_float32(b: ir.IRBuilder, bits: ir.Value, dtype: str) -> ir.Value:
    """Narrow float bits (i8) → the float32 of the same value (exact)."""
    fmt = FLOAT_FORMATS[dtype]
    i32 = _like(bits.type, I32)
    f32 = _like(bits.type, F32)
    v = b.zext(bits, i32)
    if fmt.specials == "e8m0":  # 2^(v - 127); 0 is 2^-127, a float32 subnormal; 255 NaN
        zero = b.icmp_unsigned("==", v, _c(i32, 0))
        power = b.select(zero, _c(i32, 0x400000), b.shl(v, _c(i32, 23)))
        nan = b.icmp_unsigned("==", v, _c(i32, 0xFF))
        return b.bitcast(b.select(nan, _c(i32, _QUIET_NAN), power), f32)
    m = fmt.mantissa
    sign = b.and_(b.lshr(v, _c(i32, fmt.width - 1)), _c(i32, 1))
    e = b.and_(b.lshr(v, _c(i32, m)), _c(i32, (1 << fmt.exponent) - 1))
    f = b.and_(v, _c(i32, (1 << m) - 1))
    subnormal = b.icmp_unsigned("==", e, _c(i32, 0))
    mant = b.select(subnormal, f, b.or_(f, _c(i32, 1 << m)))
    unit = b.add(b.select(subnormal, _c(i32, 1), e), _c(i32, 127 - fmt.bias - m))
    mag = b.fmul(b.uitofp(mant, f32), b.bitcast(b.shl(unit, _c(i32, 23)), f32))
    negative = b.icmp_unsigned("!=", sign, _c(i32, 0))
    value = b.select(negative, b.fneg(mag), mag)
    signed_nan = b.bitcast(b.or_(b.shl(sign, _c(i32, 31)), _c(i32, _QUIET_NAN)), f32)
    if fmt.specials == "fn":  # S.1111.111
        nan = b.icmp_unsigned("==", b.and_(v, _c(i32, 0x7F)), _c(i32, 0x7F))
        return b.select(nan, signed_nan, value)
    if fmt.specials == "ieee":  # exponent all ones: infinity, or NaN
        top = b.icmp_unsigned("==", e, _c(i32, (1 << fmt.exponent) - 1))
        inf = b.bitcast(b.or_(b.shl(sign, _c(i32, 31)), _c(i32, 0x7F800000)), f32)
        special = b.select(b.icmp_unsigned("==", f, _c(i32, 0)), inf, signed_nan)
        return b.select(top, special, value)
    if fmt.specials == "fnuz":  # the negative zero pattern (a negative NaN, as ml_dtypes)
        nan = b.icmp_unsigned("==", v, _c(i32, 0x80))
        return b.select(nan, b.bitcast(_c(i32, -(2**31) | _QUIET_NAN), f32), value)
    return value


def from_float32(
    mc: ModuleContext, b: ir.IRBuilder, x: ir.Value, dtype: str, saturate: bool, round_mode: str
) -> ir.Value:
    """float32 → narrow float bits (i8), rounded to nearest even (float8e8m0: `round_mode`);
    out of range saturates to the largest finite, or (saturate off) gives infinity where
    the type has one, else NaN. float4e2m1 has neither and always saturates."""
    fmt = FLOAT_FORMATS[dtype]
    i32 = _like(x.type, I32)
    bits = b.bitcast(x, i32)
    if fmt.specials == "e8m0":
        return b.trunc(_to_e8m0(b, bits, saturate, round_mode), _like(x.type, I8))
    m = fmt.mantissa
    sign = b.lshr(bits, _c(i32, 31))
    a = b.and_(bits, _c(i32, 0x7FFFFFFF))
    ax = b.bitcast(a, x.type)
    # normal range: drop 23 - m bits, ties to even, then rebias the exponent
    shift = 23 - m
    lsb = b.and_(b.lshr(a, _c(i32, shift)), _c(i32, 1))
    rounded = b.add(a, b.add(lsb, _c(i32, (1 << (shift - 1)) - 1)))
    normal = b.sub(b.lshr(rounded, _c(i32, shift)), _c(i32, (127 - fmt.bias) << m))
    # below the smallest normal: the count of smallest subnormals, rounded to even (2^m
    # when it rounds up to the smallest normal, whose bits are that count)
    roundeven = mc.intrinsic("roundeven", x.type)
    scaled = b.fmul(ax, _c(x.type, 2.0 ** (fmt.bias - 1 + m)))
    subnormal = b.fptoui(b.call(roundeven, [scaled]), i32)
    tiny = b.fcmp_ordered("<", ax, _c(x.type, 2.0 ** (1 - fmt.bias)))
    mag = b.select(tiny, subnormal, normal)
    over = b.icmp_signed(">", mag, _c(i32, fmt.max_bits))  # infinity included
    if saturate or fmt.specials == "none":
        too_big = fmt.max_bits
    else:
        too_big = {"fn": 0x7F, "ieee": 0x7C, "fnuz": 0x80}[fmt.specials]
    mag = b.select(over, _c(i32, too_big), mag)
    result = b.or_(b.shl(sign, _c(i32, fmt.width - 1)), mag)
    if fmt.specials == "fn":
        nan_bits = b.or_(b.shl(sign, _c(i32, 7)), _c(i32, 0x7F))
    elif fmt.specials == "ieee":
        nan_bits = b.or_(b.shl(sign, _c(i32, 7)), _c(i32, 0x7E))
    elif fmt.specials == "fnuz":  # no negative zero; NaN (and overflow) is 0x80 either sign
        result = b.select(b.icmp_unsigned("==", mag, _c(i32, 0)), _c(i32, 0), result)
        nan_bits = _c(i32, 0x80)
    else:  # no NaN: ml_dtypes gives a zero of the opposite sign
        nan_bits = b.shl(b.xor(sign, _c(i32, 1)), _c(i32, fmt.width - 1))
    nan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(nan, nan_bits, result), _like(x.type, I8))


def _to_e8m0(b: ir.IRBuilder, bits: ir.Value, saturate: bool, round_mode: str) -> ir.Value:
    """float32 bits → float8e8m0's exponent (i32), as onnx.numpy_helper.to_float8e8m0: the
    sign is ignored, NaN and infinity give NaN, rounding moves the exponent up by one."""
    i32 = bits.type
    i1 = _like(i32, I1)
    exponent = b.and_(b.lshr(bits, _c(i32, 23)), _c(i32, 0xFF))

    def nonzero(mask: int) -> ir.Value:
        return b.icmp_unsigned("!=", b.and_(bits, _c(i32, mask)), _c(i32, 0))

    if round_mode == "nearest":
        guard, rest = nonzero(0x400000), nonzero(0x3FFFFF)
        up = b.and_(guard, b.or_(rest, b.icmp_unsigned("!=", exponent, _c(i32, 0))))
    elif round_mode == "up":
        up = nonzero(0x7FFFFF)
    else:
        up = _c(i1, 0)
    if saturate:
        up = b.and_(up, b.icmp_unsigned("!=", exponent, _c(i32, 0xFE)))
    out = b.add(exponent, b.zext(up, i32))
    special = b.icmp_unsigned("==", exponent, _c(i32, 0xFF))
    return b.select(special, _c(i32, 0xFF), out)


def int_value(b: ir.IRBuilder, bits: ir.Value, dtype: str) -> ir.Value:
    """4- or 2-bit integer bits → its value as an int8 (signed) or uint8."""
    width, signed = INT_FORMATS[dtype]
    if signed:
        up = _c(bits.type, 8 - width)
        return b.ashr(b.shl(bits, up), up)
    return b.and_(bits, _c(bits.type, (1 << width) - 1))


def int_bits(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """An int8 → the 4- or 2-bit integer that wraps it (its low bits)."""
    width, _ = INT_FORMATS[dtype]
    return b.and_(value, _c(value.type, (1 << width) - 1))


def float_to_int32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A float (float32 or float64) truncated to int32 as x86's cvttss2si: NaN and out of
    range give INT_MIN (never LLVM's poison)."""
    i32 = _like(x.type, I32)
    low = b.fcmp_ordered(">=", x, _c(x.type, -(2.0**31)))
    high = b.fcmp_ordered("<", x, _c(x.type, 2.0**31))
    return b.select(b.and_(low, high), b.fptosi(x, i32), _c(i32, -(2**31)))
