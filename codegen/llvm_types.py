"""LLVM types of tensor dtypes, and the module-wide declarations kernels share
(intrinsics, libm functions, the threading runtime)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

from polytile.errors import CodegenError
from polytile.frontend.narrow import NARROW_DTYPES

from .target import Target

#: AST iterator → its value in the code being emitted
Env = dict[str, ir.Value]
#: the environment entry of the end of the parallel loop's chunk a thread is running
STOP = "%stop"
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()
#: the module global that holds the thread count parallel loops use
NUM_THREADS = "polytile_num_threads"
#: the bytes a kernel's parallel iterations ask the cache for while they run (the next
#: kernel's weights, set by the model's entry before each call; none outside a model)
PREFETCH_AT = "polytile_prefetch_at"
PREFETCH_LINES = "polytile_prefetch_lines"
PREFETCH_IDLE = "polytile_prefetch_idle"

#: LLVM reads `splat (<element>)` vector constants from version 19 on
_SPLAT = llvm.llvm_version_info >= (19,)


def constant(ty: ir.Type, value: object = None) -> ir.Constant:
    """A constant of a scalar or vector type. A vector's `value` is its elements or one
    value for all of them (None: zeros); vector constants are made once and written as
    `zeroinitializer` or `splat (...)` where they can be, because llvmlite formats a
    vector literal anew at every use and unrolled code uses the same ones thousands of
    times."""
    if not isinstance(ty, ir.VectorType):
        return ir.Constant(ty, value)
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * ty.count
    return _vector(ty, tuple(map(repr, values)), values)


class _Formatted(ir.Constant):
    """A vector constant with its text worked out once."""

    def __init__(self, ty: ir.VectorType, values: list[object], text: str) -> None:
        super().__init__(ty, values)
        self._text = text

    def _get_reference(self) -> str:
        return self._text


@functools.lru_cache(maxsize=4096)
def _vector(ty: ir.VectorType, reprs: tuple[str, ...], values: tuple[object, ...]) -> ir.Constant:
    # `reprs` keeps -0.0 apart from 0.0 and True from 1 (equal as Python values)
    zero = 0.0 if isinstance(ty.element, (ir.HalfType, ir.FloatType, ir.DoubleType)) else 0
    items = [zero if v is None else v for v in values]
    if all(v == 0 and math.copysign(1.0, float(v)) > 0 for v in items):  # type: ignore[arg-type]
        return _Formatted(ty, items, "zeroinitializer")
    if _SPLAT and len(set(reprs)) == 1:
        return _Formatted(ty, items, f"splat ({ir.Constant(ty.element, items[0])})")
    plain = ir.Constant(ty, items)
    return _Formatted(ty, items, plain.get_reference())


BF16 = "bfloat16"
_FLOATS = {2: ir.HalfType(), 4: ir.FloatType(), 8: ir.DoubleType()}


def kind(dtype: str) -> str:
    """'f' float, 'i' signed, 'u' unsigned, 'b' bool, 'V' bfloat16 and the narrow types
    (bits, no arithmetic; numpy calls float8_e5m2 kind 'f')."""
    if dtype in NARROW_DTYPES:
        return "V"
    return np.dtype(dtype).kind


def value_type(dtype: str) -> ir.Type:
    """The type of a value in registers (bool is i1; bfloat16 is its bits, an i16, which
    only loads, stores, selects and conversions see: codegen/bfloat16.py)."""
    if dtype == BF16:
        return ir.IntType(16)
    if dtype in NARROW_DTYPES:  # one element per byte (codegen/narrow.py)
        return I8
    d = np.dtype(dtype)
    if d.kind == "b":
        return I1
    if d.kind == "f" and d.itemsize in _FLOATS:
        return _FLOATS[d.itemsize]
    if d.kind in "iu":
        return ir.IntType(8 * d.itemsize)
    raise CodegenError(f"dtype {dtype} has no LLVM code generation")


def memory_type(dtype: str) -> ir.Type:
    """The type of an element in memory (bool is a byte, as in numpy)."""
    return I8 if kind(dtype) == "b" else value_type(dtype)


def suffix(ty: ir.Type) -> str:
    """LLVM's overload suffix of a type: f32, v16f32, i64."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{suffix(ty.element)}"
    if isinstance(ty, ir.HalfType):
        return "f16"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    raise CodegenError(f"no overload suffix for {ty}")


#: `ModuleContext.runtime_trips`: the loop option, and the placeholder's first operand
RUNTIME_UNROLL_OFF = "llvm.loop.unroll.runtime.disable"
LOOP_MARKER = "polytile.loop."


@dataclass
class ModuleContext:
    """One LLVM module under construction, with the declarations its kernels share."""

    module: ir.Module
    target: Target
    threading: bool
    #: whether this module defines the runtime's globals (the others declare them)
    defines_runtime: bool = True
    _outlined: int = field(default=0)
    _loops: int = field(default=0)

    def function(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """A declared function (intrinsic, libm or runtime), created once."""
        found = self.module.globals.get(name)
        if found is None:
            found = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return found

    def intrinsic(self, name: str, ty: ir.Type, arity: int = 1) -> ir.Function:
        return self.function(f"llvm.{name}.{suffix(ty)}", ty, [ty] * arity)

    def runtime_trips(self) -> ir.MDValue:
        """Loop metadata for a loop whose trip count is a run-time value: LLVM may not
        unroll it (it would with a remainder loop, tripling a symbolic kernel's code);
        loops with constant trip counts stay LLVM's to unroll. A placeholder that
        `jit.finalize` turns into a distinct loop ID, one a loop as LLVM requires."""
        self._loops += 1
        disable = self.module.add_metadata([ir.MetaDataString(self.module, RUNTIME_UNROLL_OFF)])
        marker = ir.MetaDataString(self.module, f"{LOOP_MARKER}{self._loops}")
        return self.module.add_metadata([marker, disable])

    def outlined_name(self, base: str) -> str:
        self._outlined += 1
        return f"{base}_par{self._outlined}"

    def num_threads(self) -> ir.GlobalVariable:
        found = self.module.globals.get(NUM_THREADS)
        if found is None:
            found = ir.GlobalVariable(self.module, I32, name=NUM_THREADS)
            if self.defines_runtime:
                found.initializer = ir.Constant(I32, 1)
        return found

    def prefetch_window(self) -> tuple[ir.GlobalVariable, ir.GlobalVariable]:
        """The start and the cache lines of what parallel iterations prefetch. An empty
        window starts at a line of its own (the kernels keep asking for its start)."""
        at = self.module.globals.get(PREFETCH_AT)
        if at is None:
            at = ir.GlobalVariable(self.module, PTR, name=PREFETCH_AT)
            if self.defines_runtime:
                idle = ir.GlobalVariable(self.module, ir.ArrayType(I64, 8), PREFETCH_IDLE)
                idle.initializer = ir.Constant(idle.value_type, None)
                idle.align = 64
                at.initializer = idle
        lines = self.module.globals.get(PREFETCH_LINES)
        if lines is None:
            lines = ir.GlobalVariable(self.module, I64, name=PREFETCH_LINES)
            if self.defines_runtime:
                lines.initializer = ir.Constant(I64, 0)
        return at, lines

    def run_parallel(
        self, b: ir.IRBuilder, body: ir.Function, data: ir.Value, several: ir.Value | None = None
    ) -> None:
        """Run body(data) on the configured threads through libgomp's `GOMP_parallel`
        (each call of body takes its share by thread number), or call it directly when
        one thread is configured or the loop has one iteration (`several` false: a loop
        over a symbolic size of 1 costs no thread team)."""
        gomp = self.function("GOMP_parallel", VOID, [PTR, PTR, I32, I32])
        threads = b.load(self.num_threads(), typ=I32)
        many = b.icmp_signed(">", threads, ir.Constant(I32, 1))
        if several is not None:
            many = b.and_(many, several)
        with b.if_else(many) as (then, otherwise):
            with then:
                b.call(gomp, [body, data, threads, ir.Constant(I32, 0)])
            with otherwise:
                b.call(body, [data])
