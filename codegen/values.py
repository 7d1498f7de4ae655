"""Values of one statement instance as LLVM IR: loads and stores (scalar, vector,
broadcast, strided or gathered lane by lane, as the lane strides say), constants, conversions and
the arithmetic of every expression node in every dtype. `kernel.py` drives it from the
loop structure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from llvmlite import ir

from polytile.errors import CodegenError
from polytile.frontend.narrow import FLOAT_FORMATS, INT_FORMATS, NARROW_DTYPES, cast_array
from polytile.poly.ast.quasi import flat_index, parse_index
from polytile.poly.ir.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    Iter,
    Load,
    Select,
    Unary,
    identity,
    walk,
)
from polytile.poly.ir.kernel import Statement

from . import bfloat16 as bf16
from . import fastmath
from . import narrow as nw
from .llvm_types import BF16, I1, I8, I32, I64, PTR, constant, kind, memory_type, suffix, value_type
from .transpose import load_row, store_row
from .vecmath import vector_call

#: unary ops computed by a libm function of the same name (libmvec's for whole vectors)
LIBM = frozenset(
    {"erf", "tanh", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh"}
    | {"asinh", "acosh", "atanh"}
)
#: constant exponents `constant_power` raises to without pow
ROOT_POWERS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, -0.5, -1.0)
#: the only floating-point liberty taken: fusing a multiply and an add (FMA)
FAST = ("contract",)
#: the largest lane stride loaded as one wide vector and shuffled (wider strides waste
#: more of the load than a gather of single lanes costs)
MAX_SHUFFLED_STRIDE = 4


def address_texts(expr: Expr, shape: Callable[[str], tuple[int, ...]]) -> list[str] | None:
    """The flat address of every load in an expression and the name of every iterator
    it uses (the texts `Lanes.strides` holds), in the layouts `shape` gives; None when a
    load's index is indirect (it has no stride)."""
    texts = []
    for e in walk(expr):
        if isinstance(e, Load):
            if not all(isinstance(i, str) for i in e.index):
                return None
            texts.append(flat_index(shape(e.tensor), e.index))  # type: ignore[arg-type]
        elif isinstance(e, Iter):
            texts.append(e.name)
    return texts


@dataclass(frozen=True)
class Lanes:
    count: int
    #: stride along the vector loop of every address and dimension text
    strides: Mapping[str, int | None]
    #: the leading lanes in use (a short loop's or a loop's last vector, masked); None:
    #: all. The others compute undefined values that nothing stores, and no load of
    #: theirs touches memory.
    active: int | None = None

    @property
    def used(self) -> int:
        return self.count if self.active is None else self.active


class Instance:
    """Code for one statement instance: scalars, or `lanes.count` consecutive instances
    as vectors. A value is a scalar (uniform across lanes) until it meets a vector."""

    def __init__(
        self, em: Any, stmt: Statement, dims: Mapping[str, ir.Value], lanes: Lanes | None
    ) -> None:
        self.em = em
        self.b = em.b
        self.mc = em.mc
        self.stmt = stmt
        self.dims = dims
        self.lanes = lanes
        self.offsets: dict[str, ir.Value] = {}

    # --- memory -----------------------------------------------------------------------
    def offset(self, text: str) -> ir.Value:
        if text not in self.offsets:
            self.offsets[text] = self.em.int(parse_index(text), self.scope())
        return self.offsets[text]

    def scope(self) -> Mapping[str, ir.Value]:
        """The values an index may use: the dims, and the symbolic sizes of a layout."""
        return {**self.em.sizes, **self.dims} if self.em.sizes else self.dims

    def stride(self, text: str) -> int:
        if self.lanes is None:
            return 0
        stride = self.lanes.strides[text]
        assert stride is not None
        return stride

    def address(self, tensor: str, dtype: str, offset: ir.Value) -> ir.Value:
        shift = self.em.shift.get(tensor)
        if shift is not None:
            offset = self.em.ints.add(offset, shift)
        return self.b.gep(
            self.em.ptrs[tensor], [offset], inbounds=True, source_etype=memory_type(dtype)
        )

    def load(self, tensor: str, dtype: str, text: str) -> ir.Value:
        b = self.b
        mem = memory_type(dtype)
        align = _align(dtype)
        base = self.offset(text)
        stride = self.stride(text)
        if stride == 0:
            value = b.load(self.address(tensor, dtype, base), typ=mem, align=align)
        elif stride == 1:
            assert self.lanes is not None
            vty = ir.VectorType(mem, self.lanes.count)
            address = self.address(tensor, dtype, base)
            value = load_row(self.mc, b, address, vty, self.lanes.used, align)
        elif 2 <= stride <= MAX_SHUFFLED_STRIDE:
            value = self.strided_load(tensor, dtype, base, stride)
        else:
            assert self.lanes is not None
            value = constant(ir.VectorType(mem, self.lanes.count), None)
            for lane in range(self.lanes.used):
                at = self.em.ints.add(base, ir.Constant(I64, stride * lane))
                item = b.load(self.address(tensor, dtype, at), typ=mem, align=align)
                value = b.insert_element(value, item, ir.Constant(I32, lane))
        if kind(dtype) == "b":
            zero = constant(value.type, None)
            value = b.icmp_unsigned("!=", value, zero)
        return value

    def strided_load(self, tensor: str, dtype: str, base: ir.Value, stride: int) -> ir.Value:
        """Lanes `stride` elements apart (a pooling window or convolution with strides) as
        one wide load and a shuffle instead of a load per lane. The load is masked past
        the last lane's element: it never touches memory the lanes do not span."""
        assert self.lanes is not None
        b = self.b
        count = self.lanes.count
        mem = memory_type(dtype)
        wide = ir.VectorType(mem, stride * count)
        span = stride * (self.lanes.used - 1) + 1
        mask = constant(ir.VectorType(I1, wide.count), [j < span for j in range(wide.count)])
        fn = self.mc.function(
            f"llvm.masked.load.{suffix(wide)}.p0", wide, [PTR, I32, mask.type, wide]
        )
        loaded = b.call(
            fn,
            [
                self.address(tensor, dtype, base),
                ir.Constant(I32, _align(dtype)),
                mask,
                constant(wide, None),
            ],
        )
        picks = constant(ir.VectorType(I32, count), [stride * lane for lane in range(count)])
        return b.shuffle_vector(loaded, constant(wide, None), picks)

    def load_rows(
        self, tensor: str, dtype: str, text: str, count: int, width: int
    ) -> list[ir.Value]:
        """Each lane's row: the `count` elements from its address on, as one vector of
        `width` (the rest undefined; nothing past them is read)."""
        assert self.lanes is not None
        vty = ir.VectorType(memory_type(dtype), width)
        return [
            load_row(
                self.mc, self.b, self.row_address(tensor, dtype, text, r), vty, count, _align(dtype)
            )
            for r in range(self.lanes.count)
        ]

    def store_rows(
        self, tensor: str, dtype: str, text: str, rows: list[ir.Value], count: int
    ) -> None:
        """Store the first `count` elements of each lane's row from its address on."""
        for r, row in enumerate(rows):
            address = self.row_address(tensor, dtype, text, r)
            store_row(self.mc, self.b, row, address, count, _align(dtype))

    def row_address(self, tensor: str, dtype: str, text: str, lane: int) -> ir.Value:
        at = self.em.ints.add(self.offset(text), ir.Constant(I64, self.stride(text) * lane))
        return self.address(tensor, dtype, at)

    def store(self, tensor: str, dtype: str, text: str, value: ir.Value) -> None:
        b = self.b
        align = _align(dtype)
        if kind(dtype) == "b":
            value = b.zext(value, _like(value.type, I8))
        base = self.offset(text)
        stride = self.stride(text)
        if self.lanes is None:
            b.store(value, self.address(tensor, dtype, base), align=align)
            return
        value = self.splat(value)
        if stride == 1:
            address = self.address(tensor, dtype, base)
            store_row(self.mc, b, value, address, self.lanes.used, align)
            return
        for lane in range(self.lanes.used):
            at = self.em.ints.add(base, ir.Constant(I64, stride * lane))
            item = b.extract_element(value, ir.Constant(I32, lane))
            b.store(item, self.address(tensor, dtype, at), align=align)

    # --- values -----------------------------------------------------------------------
    def splat(self, value: ir.Value) -> ir.Value:
        if self.lanes is None or isinstance(value.type, ir.VectorType):
            return value
        n = self.lanes.count
        vty = ir.VectorType(value.type, n)
        if isinstance(value, ir.Constant) and isinstance(value.constant, (int, float)):
            return constant(vty, [value.constant] * n)
        one = self.b.insert_element(constant(vty, None), value, ir.Constant(I32, 0))
        mask = constant(ir.VectorType(I32, n), [0] * n)
        return self.b.shuffle_vector(one, constant(vty, None), mask)

    def same_shape(self, *values: ir.Value) -> list[ir.Value]:
        if any(isinstance(v.type, ir.VectorType) for v in values):
            return [self.splat(v) for v in values]
        return list(values)

    def value(self, e: Expr) -> ir.Value:
        b = self.b
        if isinstance(e, Const):
            return _constant(e.value, e.dtype)
        if isinstance(e, Load):
            t = self.em.kernel.tensors[e.tensor]
            if all(isinstance(i, str) for i in e.index):
                return self.load(t.name, e.dtype, flat_index(self.em.shape(t.name), e.index))  # type: ignore[arg-type]
            return self.indirect_load(e)
        if isinstance(e, Iter):
            value = self.dims.get(e.name)
            if value is None:  # a symbolic size (isl text over the kernel's parameters)
                value = self.em.int(parse_index(e.name), self.scope())
            stride = self.stride(e.name)
            if stride != 0:
                assert self.lanes is not None
                steps = constant(
                    ir.VectorType(I64, self.lanes.count),
                    [stride * lane for lane in range(self.lanes.count)],
                )
                value = b.add(self.splat(value), steps)
            return self.convert(value, "int64", e.dtype)
        if isinstance(e, Cast):
            if e.x.dtype in NARROW_DTYPES or e.dtype in NARROW_DTYPES:
                value = self.value(e.x)
                return self.narrow_convert(value, e.x.dtype, e.dtype, e.saturate, e.round_mode)
            return self.convert(self.value(e.x), e.x.dtype, e.dtype)
        if isinstance(e, Unary):
            return self.unary(e.op, self.value(e.x), e.x.dtype)
        if isinstance(e, Binary):
            exponent = _constant_value(e.b) if e.op == "pow" else None
            if exponent is not None:
                power = self.constant_power(self.value(e.a), exponent, e.a.dtype)
                if power is not None:
                    return power
            a, c = self.same_shape(self.value(e.a), self.value(e.b))
            return self.binary(e.op, a, c, e.a.dtype)
        if isinstance(e, Select):
            cond, a, c = self.same_shape(self.value(e.cond), self.value(e.a), self.value(e.b))
            return b.select(cond, a, c)
        raise CodegenError(f"statement {self.stmt.name}: unknown expression {e!r}")

    def indirect_load(self, e: Load) -> ir.Value:
        """A load whose index includes run-time values (Gather): scalar code only."""
        b = self.b
        t = self.em.kernel.tensors[e.tensor]
        offset: ir.Value = ir.Constant(I64, 0)
        stride: int | ir.Value = 1
        for size, entry in zip(reversed(self.em.shape(t.name)), reversed(e.index), strict=True):
            if isinstance(entry, str):
                part = self.em.int(parse_index(entry), self.scope())
            else:
                part = self.convert(self.value(entry), entry.dtype, "int64")
            step = ir.Constant(I64, stride) if isinstance(stride, int) else stride
            offset = b.add(offset, b.mul(part, step))
            if isinstance(size, str):  # a symbolic layout: strides known at run time
                stride = b.mul(step, self.em.sizes[size])
            elif isinstance(stride, int):
                stride *= size
            else:
                stride = b.mul(stride, ir.Constant(I64, size))
        value = b.load(
            self.address(t.name, e.dtype, offset), typ=memory_type(e.dtype), align=_align(e.dtype)
        )
        if kind(e.dtype) == "b":
            value = b.icmp_unsigned("!=", value, ir.Constant(I8, 0))
        return value

    def convert(self, value: ir.Value, src: str, dst: str) -> ir.Value:
        b = self.b
        target = _like(value.type, value_type(dst))
        if value.type == target and kind(src) == kind(dst):
            return value
        if src == BF16:
            return self.convert(bf16.widen(b, value), "float32", dst)
        if dst == BF16:
            return bf16.narrow(b, self.float32_for_bf16(value, src))
        ks, kd = kind(src), kind(dst)
        if kd == "b":
            zero = constant(value.type, None)
            if ks == "f":
                return b.fcmp_unordered("!=", value, zero)
            return b.icmp_unsigned("!=", value, zero)
        if ks == "f" and kd == "f":
            wider = _width(value.type) < _width(target)
            return b.fpext(value, target) if wider else b.fptrunc(value, target)
        if ks == "f":
            return b.fptosi(value, target) if kd == "i" else b.fptoui(value, target)
        if kd == "f":
            return b.sitofp(value, target) if ks == "i" else b.uitofp(value, target)
        if _width(value.type) > _width(target):
            return b.trunc(value, target)
        if _width(value.type) < _width(target):
            return b.sext(value, target) if ks == "i" else b.zext(value, target)
        return value

    def narrow_convert(
        self, value: ir.Value, src: str, dst: str, saturate: bool = True, round_mode: str = "up"
    ) -> ir.Value:
        """A conversion from or to a narrow type (codegen/narrow.py): narrow floats go
        through float32 (exact), narrow integers through int8 / uint8."""
        b = self.b
        if src == dst:
            return value
        if src in FLOAT_FORMATS:
            wide = nw.to_float32(b, value, src)
            return self.narrow_convert(wide, "float32", dst, saturate, round_mode)
        if src in INT_FORMATS:
            wide = nw.int_value(b, value, src)
            wide_type = "int8" if INT_FORMATS[src][1] else "uint8"
            return self.narrow_convert(wide, wide_type, dst, saturate, round_mode)
        if dst not in NARROW_DTYPES:
            return self.convert(value, src, dst)
        if dst in INT_FORMATS:
            if kind(src) == "f" or src == BF16:
                wide_float = "float64" if src == "float64" else "float32"
                value = nw.float_to_int32(b, self.convert(value, src, wide_float))
                src = "int32"
            small = self.convert(value, src, "int8")
            return nw.int_bits(b, small, dst)
        x = self.float32_for_bf16(value, src)  # exact, or rounded to odd: one rounding
        return nw.from_float32(self.mc, b, x, dst, saturate, round_mode)

    def float32_for_bf16(self, value: ir.Value, src: str) -> ir.Value:
        """A float32 whose rounding to bfloat16 is the value's: exact for narrow sources,
        rounded to odd from float64 (32-bit integers pass through float64 exactly)."""
        if src in ("float16", "float32") or np.dtype(src).itemsize <= 2:
            return self.convert(value, src, "float32")
        if kind(src) != "f":
            value = self.convert(value, src, "float64")
        return bf16.float32_round_to_odd(self.mc, self.b, value)

    def libm(self, name: str, x: ir.Value, dtype: str) -> ir.Value:
        """A libm function: of a whole vector through libmvec where the target has it,
        else lane by lane (float or double; half goes through float)."""
        b = self.b
        whole = vector_call(b, self.mc, name, [x])
        if whole is not None:
            return whole
        if isinstance(x.type, ir.VectorType):
            out = constant(x.type, None)
            for lane in range(x.type.count):
                item = self.libm(name, b.extract_element(x, ir.Constant(I32, lane)), dtype)
                out = b.insert_element(out, item, ir.Constant(I32, lane))
            return out
        if isinstance(x.type, ir.HalfType):
            wide = self.libm(name, b.fpext(x, ir.FloatType()), "float32")
            return b.fptrunc(wide, x.type)
        double = isinstance(x.type, ir.DoubleType)
        fn = self.mc.function(name if double else f"{name}f", x.type, [x.type])
        return b.call(fn, [x])

    def unary(self, op: str, x: ir.Value, dtype: str) -> ir.Value:
        b = self.b
        k = kind(dtype)
        self.no_bf16_arithmetic(op, dtype)
        zero = constant(x.type, None)
        if op == "not" or (op == "bitnot" and k in "iu"):
            return b.not_(x)
        if k == "f":
            if op == "neg":
                return b.fneg(x)
            if fastmath.applies(op, x.type):
                return fastmath.call(b, op, x)
            if op in ("exp", "log"):  # the others of LIBM: `libm` tries libmvec first
                whole = vector_call(b, self.mc, op, [x])
                if whole is not None:
                    return whole
            if op in ("abs", "exp", "log", "sqrt", "floor", "ceil", "round"):
                name = {"abs": "fabs", "round": "roundeven"}.get(op, op)
                return b.call(self.mc.intrinsic(name, x.type), [x])
            if op in LIBM:
                return self.libm(op, x, dtype)
            one = _constant_like(x.type, 1.0)
            if op == "recip":
                return b.fdiv(one, x)
            if op == "sigmoid":
                e = self.unary("exp", b.fneg(x), dtype)
                return b.fdiv(one, b.fadd(one, e))
            if op == "relu":
                return b.select(b.fcmp_ordered("<", x, zero), zero, x)
        else:
            signed = k == "i"
            if op == "neg":
                return b.sub(zero, x)
            if op == "abs":
                return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if signed else x
            if op in ("floor", "ceil", "round"):
                return x
            if op == "relu":
                return b.select(b.icmp_signed("<", x, zero), zero, x) if signed else x
        raise CodegenError(f"statement {self.stmt.name}: {op} of {dtype} has no code generation")

    def binary(self, op: str, a: ir.Value, c: ir.Value, dtype: str) -> ir.Value:
        b = self.b
        k = kind(dtype)
        self.no_bf16_arithmetic(op, dtype)
        compare = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
        if op in compare:
            if k == "f":
                fcmp = b.fcmp_unordered if op == "ne" else b.fcmp_ordered
                return fcmp(compare[op], a, c)
            icmp = b.icmp_signed if k == "i" else b.icmp_unsigned
            return icmp(compare[op], a, c)
        bitwise = {"and": b.and_, "or": b.or_, "xor": b.xor}
        if op in bitwise:  # of bools
            return bitwise[op](a, c)
        if op.startswith("bit") and op[3:] in bitwise and k in "iu":
            return bitwise[op[3:]](a, c)
        if k == "b":
            if op in ("max", "add"):
                return b.or_(a, c)
            if op in ("min", "mul"):
                return b.and_(a, c)
            raise CodegenError(f"statement {self.stmt.name}: {op} of bool has no code generation")
        if k == "f":
            simple = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv, "mod": b.frem}
            if op in simple:
                return simple[op](a, c, flags=FAST)
            if op in ("max", "min"):
                return self.float_extremum(op, a, c)
            if op == "pow":
                whole = vector_call(b, self.mc, "pow", [a, c])
                if whole is not None:
                    return whole
                return b.call(self.mc.intrinsic("pow", a.type, 2), [a, c])
        else:
            signed = k == "i"
            simple = {"add": b.add, "sub": b.sub, "mul": b.mul}
            if op in simple:
                return simple[op](a, c)
            if op in ("max", "min"):
                name = ("s" if signed else "u") + op
                return b.call(self.mc.intrinsic(name, a.type, 2), [a, c])
            if op in ("div", "mod"):
                return self.int_division(op, a, c, signed)
            if op == "pow":
                wide = _like(a.type, ir.DoubleType())
                to = b.sitofp if signed else b.uitofp
                r = b.call(self.mc.intrinsic("pow", wide, 2), [to(a, wide), to(c, wide)])
                return b.fptosi(r, a.type) if signed else b.fptoui(r, a.type)
        raise CodegenError(f"statement {self.stmt.name}: {op} of {dtype} has no code generation")

    def no_bf16_arithmetic(self, op: str, dtype: str) -> None:
        """bfloat16 arithmetic is float32 arithmetic between casts (the frontend pass
        `widen_low_precision` puts them in): here it would compute on bits. The narrow
        types have no arithmetic at all (the frontend refuses it)."""
        if dtype in NARROW_DTYPES:
            raise CodegenError(
                f"statement {self.stmt.name}: {op} of {dtype} has no code generation"
            )
        if dtype == BF16:
            raise CodegenError(
                f"statement {self.stmt.name}: {op} of bfloat16 has no code generation "
                "(the frontend pass widen_low_precision computes it in float32)"
            )

    def constant_power(self, x: ir.Value, exponent: float, dtype: str) -> ir.Value | None:
        """x to a constant power from products and square roots, where one of
        `ROOT_POWERS` (LRN's beta of 0.75: sqrt(x) · sqrt(sqrt(x)); a GELU's x³: x·x·x),
        within 2 ulp, where pow is within 4 and costs several times more; None for any
        other power. Special values as C's pow: a root of -0 is +0, of -inf +inf (0
        for a negative power), of a negative base NaN."""
        if dtype not in ("float32", "float64") or exponent not in ROOT_POWERS:
            return None
        b = self.b
        one = _constant_like(x.type, 1.0)
        if exponent in (1.0, 2.0, 3.0, -1.0):
            if exponent == -1.0:
                return b.fdiv(one, x)
            power = x
            for _ in range(int(exponent) - 1):
                power = b.fmul(power, x)
            return power
        sqrt = self.mc.intrinsic("sqrt", x.type)
        root = b.call(sqrt, [x])
        if exponent in (0.25, 0.75):
            fourth = b.call(sqrt, [root])
            power = fourth if exponent == 0.25 else b.fmul(root, fourth)
        elif exponent == 0.5:
            power = root
        elif exponent == 1.5:
            power = b.fmul(x, root)
        else:
            power = b.fdiv(one, root)
        power = b.call(self.mc.intrinsic("fabs", x.type), [power])
        edge = _constant_like(x.type, float("inf") if exponent > 0 else 0.0)
        minus_infinity = _constant_like(x.type, float("-inf"))
        return b.select(b.fcmp_ordered("==", x, minus_infinity), edge, power)

    def float_extremum(self, op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        """max / min that return NaN when either operand is NaN. x86's `vmaxps` / `vminps`
        give the second operand when the pair is unordered: taken both ways round, one of
        the two results is the NaN, and OR-ing their bits keeps it (its exponent is all
        ones, its mantissa nonzero) while equal results OR to themselves: three
        instructions off any mask register, where a compare, a NaN check, a mask OR and
        a blend took four and lengthened a `max=` chain (the MaxPool kernels of ResNet-50
        and Inception v2 gain alone; whole models little, where their input comes from
        memory). A constant operand that is not NaN needs one select. LLVM's
        `maximum` also orders -0 below +0, which costs a sign test and two blends per
        call; here max(-0, +0) may give -0 (equal to +0)."""
        b = self.b
        if _never_nan(c) and not _never_nan(a):
            a, c = c, a
        compare = ">" if op == "max" else "<"
        picked = b.select(b.fcmp_ordered(compare, a, c), a, c)
        if _never_nan(a):
            return picked
        other = b.select(b.fcmp_ordered(compare, c, a), c, a)
        bits = _like(a.type, ir.IntType(_width(a.type)))
        both = b.or_(b.bitcast(picked, bits), b.bitcast(other, bits))
        return b.bitcast(both, a.type)

    def int_division(self, op: str, a: ir.Value, c: ir.Value, signed: bool) -> ir.Value:
        """C's truncating division / remainder, with x/0 = x%0 = 0 and no overflow trap."""
        b = self.b
        zero = constant(c.type, None)
        one = _constant_like(c.type, 1)
        by_zero = b.icmp_unsigned("==", c, zero)
        if signed:
            minus_one = b.icmp_signed("==", c, _constant_like(c.type, -1))
            safe = b.select(b.or_(by_zero, minus_one), one, c)
            if op == "div":
                result = b.select(minus_one, b.sub(zero, a), b.sdiv(a, safe))
            else:
                result = b.select(minus_one, zero, b.srem(a, safe))
        else:
            safe = b.select(by_zero, one, c)
            result = b.udiv(a, safe) if op == "div" else b.urem(a, safe)
        return b.select(by_zero, zero, result)

    def combine(self, combiner: str, old: ir.Value, new: ir.Value, dtype: str) -> ir.Value:
        op = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}[combiner]
        old, new = self.same_shape(old, new)
        return self.binary(op, old, new, dtype)

    def unused_lanes_idle(self, combiner: str, value: ir.Value, dtype: str) -> ir.Value:
        """The value as a vector whose lanes past those in use hold the combiner's
        identity (a masked vector's other lanes compute undefined values)."""
        assert self.lanes is not None
        value = self.splat(value)
        count = self.lanes.count
        if self.lanes.used < count:
            fill = self.splat(_constant(np.asarray(identity(combiner, dtype)).item(), dtype))
            used = constant(ir.VectorType(I1, count), [j < self.lanes.used for j in range(count)])
            value = self.b.select(used, value, fill)
        return value

    def reduce_lanes(self, combiner: str, value: ir.Value, dtype: str) -> ir.Value:
        """The lanes in use combined into one value (the others count as the combiner's
        identity), halving the vector at each step: a reduction along the vector loop
        (`shares_write`)."""
        assert self.lanes is not None
        b = self.b
        value = self.unused_lanes_idle(combiner, value, dtype)
        count = self.lanes.count
        while count > 1:
            count //= 2
            low, high = (
                b.shuffle_vector(value, value, constant(ir.VectorType(I32, count), list(picks)))
                for picks in (range(count), range(count, 2 * count))
            )
            value = self.combine(combiner, low, high, dtype)
        return b.extract_element(value, ir.Constant(I32, 0))


def lane_accumulator(inst: Instance, combiner: str, first: ir.Value | None, dtype: str) -> ir.Value:
    """A vector of the combiner's identity, with `first` in lane 0: the lanes of a
    reduction along the vector loop kept apart until `reduce_lanes` combines them."""
    value = inst.splat(_constant(np.asarray(identity(combiner, dtype)).item(), dtype))
    if first is None:
        return value
    return inst.b.insert_element(value, first, ir.Constant(I32, 0))


def shares_write(stmt: Statement, lanes: Lanes | None, text: str) -> bool:
    """Whether every lane of a reduction writes one element (its write address `text`
    does not move along the vector loop): the lanes are combined before it is written."""
    return lanes is not None and stmt.reduction is not None and lanes.strides.get(text) == 0


def _align(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _like(shape_of: ir.Type, element: ir.Type) -> ir.Type:
    """`element`, as a vector when `shape_of` is one."""
    if isinstance(shape_of, ir.VectorType):
        return ir.VectorType(element, shape_of.count)
    return element


def _width(ty: ir.Type) -> int:
    if isinstance(ty, ir.VectorType):
        ty = ty.element
    if isinstance(ty, ir.IntType):
        return ty.width
    return {ir.HalfType: 16, ir.FloatType: 32, ir.DoubleType: 64}[type(ty)]


def _constant(value: float | int | bool, dtype: str) -> ir.Constant:
    ty = value_type(dtype)
    if dtype == BF16:  # its bits, rounded to nearest even as numpy's ml_dtypes does
        return ir.Constant(ty, int(np.array(value, dtype=BF16).view(np.uint16)))
    if dtype in NARROW_DTYPES:  # its bits, converted as ONNX's Cast
        return ir.Constant(ty, int(cast_array(np.array(value), dtype).view(np.uint8)))
    if kind(dtype) == "f":
        return ir.Constant(ty, float(value))
    if kind(dtype) == "b":
        return ir.Constant(I1, int(bool(value)))
    return ir.Constant(ty, int(value))


def _constant_value(e: Expr) -> float | None:
    """The value of a constant expression (a constant, negated or converted), else None."""
    if isinstance(e, Const) and not isinstance(e.value, bool):
        return float(e.value)
    if isinstance(e, Cast) and e.dtype.startswith("float") and e.dtype not in NARROW_DTYPES:
        return _constant_value(e.x)
    if isinstance(e, Unary) and e.op == "neg":
        inner = _constant_value(e.x)
        return None if inner is None else -inner
    return None


def _constant_like(ty: ir.Type, value: float | int) -> ir.Constant:
    element = ty.element if isinstance(ty, ir.VectorType) else ty
    scalar = float(value) if not isinstance(element, ir.IntType) else int(value)
    if isinstance(ty, ir.VectorType):
        return constant(ty, [scalar] * ty.count)
    return ir.Constant(ty, scalar)


def _never_nan(value: ir.Value) -> bool:
    """A constant (scalar or splat) that is not NaN."""
    if isinstance(value, ir.Constant):
        items = value.constant if isinstance(value.constant, list) else [value.constant]
        items = [i.constant if isinstance(i, ir.Constant) else i for i in items]
        return all(isinstance(v, (int, float)) and v == v for v in items)
    return False
