"""Evicting a buffer's cache lines (x86 `clflush`, from every level of every core).

The tuner times a kernel with its weights evicted and its activations where its last run
left them (`search.measure`, `MeasureConfig.cold`), as a model's kernel meets them: the
weights unread since the last inference, the input just written by the kernel before.
Overwriting the whole cache instead made ResNet-50's kernels slower in all than in the
model, and ranked their schedules by how they meet a cold input, a state the model never
has.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from .jit import JitModule, compile_part, finalize
from .llvm_types import I64, PTR, VOID
from .target import Target

NAME = "polytile_flush_lines"
#: bytes of a cache line
LINE = 64


def _module() -> ir.Module:
    """`void flush(ptr start, i64 bytes)`: clflush every line from start (line-aligned)
    on, then a fence, so the next loads find the lines gone."""
    module = ir.Module(name="flush")
    clflush = ir.Function(module, ir.FunctionType(VOID, [PTR]), "llvm.x86.sse2.clflush")
    mfence = ir.Function(module, ir.FunctionType(VOID, []), "llvm.x86.sse2.mfence")
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, I64]), NAME)
    start, size = fn.args
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_unsigned(">", size, ir.Constant(I64, 0)), loop, done)
    b.position_at_end(loop)
    offset = b.phi(I64)
    offset.add_incoming(ir.Constant(I64, 0), entry)
    b.call(clflush, [b.gep(start, [offset], source_etype=ir.IntType(8))])
    following = b.add(offset, ir.Constant(I64, LINE))
    offset.add_incoming(following, loop)
    b.cbranch(b.icmp_unsigned("<", following, size), loop, done)
    b.position_at_end(done)
    b.call(mfence, [])
    b.ret_void()
    return module


class LineFlusher:
    """Evicts the cache lines of numpy buffers (each call: every line any byte of each
    buffer lies in)."""

    def __init__(self, target: Target) -> None:
        self._jit = JitModule([compile_part(finalize(_module(), target), target)], target)
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(self._jit.address(NAME))

    def __call__(self, *buffers: np.ndarray) -> None:
        for buffer in buffers:
            address = buffer.ctypes.data
            first = address - address % LINE
            self._fn(first, address + buffer.nbytes - first)


@functools.cache
def line_flusher(target: Target) -> Callable[..., None] | None:
    """A `LineFlusher` for the target's machine, None where it has no `clflush` (not x86)."""
    if not target.triple.startswith(("x86_64", "i386", "i686")):
        return None
    return LineFlusher(target)
