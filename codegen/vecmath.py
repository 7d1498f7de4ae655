"""glibc's vector math library (libmvec): exp, log, pow, tanh, erf and the trigonometric
and hyperbolic functions and their inverses (sin ... atanh) of whole vectors.

LLVM expands `llvm.exp.v16f32` (and `llvm.pow`, and a libm call per lane) into one
scalar libm call per lane. libmvec has the same functions for a whole SSE, AVX2 or
AVX-512 register, named by the x86 vector function ABI (`_ZGVeN16v_expf`: AVX-512, no
mask, 16 lanes, one vector argument), within 4 ulp of numpy's float64 results here
(libm lane by lane: within 2.1), special values alike (`tests/codegen/test_vecmath.py`).
A vector whose lane count is no variant's is cut into the widest variant's pieces, the
last padded with copies of its last lane. What that gains over libm lane by lane:
benchmarks/results/elementwise-*.md (`benchmarks/elementwise_bench.py`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llvmlite import ir

I32 = ir.IntType(32)

if TYPE_CHECKING:
    from .llvm_types import ModuleContext
    from .target import Target

#: libm functions with vector variants, and their arguments
FUNCTIONS = {
    "exp": 1,
    "log": 1,
    "pow": 2,
    "tanh": 1,
    "erf": 1,
    "sin": 1,
    "cos": 1,
    "tan": 1,
    "asin": 1,
    "acos": 1,
    "atan": 1,
    "sinh": 1,
    "cosh": 1,
    "asinh": 1,
    "acosh": 1,
    "atanh": 1,
}
#: the vector ABI's ISA letters, the register bits of each and the CPU feature it
#: needs, widest first (AVX without AVX2, letter `c`, adds no width)
ISAS = (("e", 512, "avx512f"), ("d", 256, "avx2"), ("b", 128, "sse2"))


@functools.cache
def library_path() -> str | None:
    """libmvec's name for the dynamic loader, None where the C library has none."""
    return ctypes.util.find_library("mvec")


@functools.cache
def _library() -> ctypes.CDLL | None:
    path = library_path()
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def symbol(isa: str, lanes: int, name: str, double: bool) -> str:
    """The vector function ABI's name of a libm function's variant."""
    return f"_ZGV{isa}N{lanes}{'v' * FUNCTIONS[name]}_{name}{'' if double else 'f'}"


@functools.cache
def has(name: str) -> bool:
    """Whether libmvec defines this symbol (sin and cos came in glibc 2.22; tan, the
    inverse and hyperbolic functions, tanh and erf in 2.35)."""
    lib = _library()
    return lib is not None and hasattr(lib, name)


def available(triple: str) -> bool:
    """Whether code for this target triple may call libmvec: x86-64, on a machine that
    has it."""
    return triple.startswith("x86_64") and _library() is not None


def runs_on(name: str, target: Target) -> bool:
    """Whether a declared function can be called on this target: anything but a libmvec
    variant, or one whose ISA the target has and whose symbol libmvec defines."""
    if not name.startswith("_ZGV"):
        return True
    needs = {isa: feature for isa, _, feature in ISAS}.get(name[4:5])
    return target.vector_math and needs in target.enabled() and has(name)


def _variants(target: Target, name: str, double: bool) -> list[tuple[str, int]]:
    """(ISA letter, lanes) of the variants this target can run, widest first."""
    enabled = target.enabled()
    bits = 64 if double else 32
    found = []
    for isa, width, feature in ISAS:
        lanes = width // bits
        fits = feature in enabled and width <= max(target.vector_bits, 128)
        if fits and has(symbol(isa, lanes, name, double)):
            found.append((isa, lanes))
    return found


def vector_call(
    b: ir.IRBuilder, mc: ModuleContext, name: str, args: Sequence[ir.Value]
) -> ir.Value | None:
    """`name` of float or double vectors through libmvec; None where the target does not
    use it or has no variant (the caller goes lane by lane)."""
    ty = args[0].type
    if not mc.target.vector_math or name not in FUNCTIONS or not isinstance(ty, ir.VectorType):
        return None
    element = ty.element
    if not isinstance(element, (ir.FloatType, ir.DoubleType)):
        return None
    double = isinstance(element, ir.DoubleType)
    variants = _variants(mc.target, name, double)
    if not variants:
        return None
    widest = variants[0][1]
    pieces: list[tuple[ir.Value, int]] = []
    for start in range(0, ty.count, widest):
        used = min(widest, ty.count - start)
        isa, lanes = next((v for v in reversed(variants) if v[1] >= used), variants[0])
        vty = ir.VectorType(element, lanes)
        if lanes == ty.count and start == 0:
            inputs = list(args)
        else:
            # lanes [start, start + used), padded with copies of the last one
            mask = ir.Constant(
                ir.VectorType(I32, lanes), [start + min(k, used - 1) for k in range(lanes)]
            )
            inputs = [b.shuffle_vector(a, ir.Constant(ty, None), mask) for a in args]
        fn = mc.function(symbol(isa, lanes, name, double), vty, [vty] * len(args))
        pieces.append((b.call(fn, inputs), used))
    if len(pieces) == 1 and pieces[0][0].type == ty:
        return pieces[0][0]
    out = ir.Constant(ty, None)
    at = 0
    for value, used in pieces:
        for lane in range(used):
            item = b.extract_element(value, ir.Constant(I32, lane))
            out = b.insert_element(out, item, ir.Constant(I32, at))
            at += 1
    return out
