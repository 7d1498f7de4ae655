"""bfloat16 conversions in LLVM IR, on its bits (llvmlite has no `bfloat` type, and x86
without AVX512-BF16 has no instruction for it): a bfloat16 is the upper half of a float32.

Widening is exact: the 16 bits shifted up. Narrowing rounds to nearest even with integer
arithmetic on the float32's bits (an overflow carries into the exponent and gives infinity);
a NaN stays a NaN (made quiet, sign kept). A float64 is first narrowed to float32 rounding
to odd, so that its second rounding to bfloat16 is exact (one rounding in effect; float32
keeps more than 8 + 2 bits beyond bfloat16's).
"""

from __future__ import annotations

from llvmlite import ir

from .llvm_types import I32, ModuleContext, constant

I16 = ir.IntType(16)
F32 = ir.FloatType()
F64 = ir.DoubleType()


def _like(shape_of: ir.Type, element: ir.Type) -> ir.Type:
    if isinstance(shape_of, ir.VectorType):
        return ir.VectorType(element, shape_of.count)
    return element


def _int(ty: ir.Type, value: int) -> ir.Constant:
    if isinstance(ty, ir.VectorType):
        return constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)


def widen(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """bfloat16 bits (i16) → the float32 of the same value."""
    wide = b.zext(bits, _like(bits.type, I32))
    return b.bitcast(b.shl(wide, _int(wide.type, 16)), _like(bits.type, F32))


def narrow(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """float32 → bfloat16 bits, rounded to nearest even; NaN stays NaN."""
    i32 = _like(x.type, I32)
    bits = b.bitcast(x, i32)
    lsb = b.and_(b.lshr(bits, _int(i32, 16)), _int(i32, 1))
    rounded = b.add(bits, b.add(lsb, _int(i32, 0x7FFF)))
    quiet = b.or_(bits, _int(i32, 0x00400000))
    nan = b.fcmp_unordered("uno", x, x)
    chosen = b.select(nan, quiet, rounded)
    return b.trunc(b.lshr(chosen, _int(i32, 16)), _like(x.type, I16))


def float32_round_to_odd(mc: ModuleContext, b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    """float64 → float32 rounded toward zero, with the last bit set when inexact (round to
    odd): a later rounding to a narrower format then equals one direct rounding."""
    f32 = _like(d.type, F32)
    i32 = _like(d.type, I32)
    nearest = b.fptrunc(d, f32)
    back = b.fpext(nearest, d.type)
    fabs = mc.intrinsic("fabs", d.type)
    away = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [d]))
    bits = b.bitcast(nearest, i32)
    toward_zero = b.select(away, b.sub(bits, _int(i32, 1)), bits)
    inexact = b.fcmp_ordered("!=", back, d)
    odd = b.select(inexact, b.or_(toward_zero, _int(i32, 1)), toward_zero)
    return b.bitcast(odd, f32)
