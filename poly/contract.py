"""Temporaries private to one iteration of a top-level loop, stored in one small slice
per thread instead of at full size (array contraction).

A conv's accumulator is written and read back within the parallel iteration that
computes its block of output channels; so are the bias and residual temporaries of an
epilogue fused there. At full size, every iteration writes lines no other iteration
reads again, as many as the output has: they are fetched for ownership, then written
back to memory, for nothing. When each thread instead reuses one slice of the buffer
(the span one iteration touches), those lines stay in the core's cache.

The analysis is exact (isl): a temporary qualifies for a top-level loop when every
statement touching it is below that loop, no element is written in two of its
iterations, and every element an iteration reads is one it writes. Then no value
crosses iterations, and an iteration's elements lie in a box: along each dimension, an
extent starting at a quasi-affine function of the loop's iterator `v`. A slice holds
one box in row-major order (`shape`, `span` elements): codegen lays the tensor out as
the box (its offsets use the box's strides) and adds `slice * span - origin(v)`, the
box's first element moved to the thread's slice. A box, not the window of the tensor's
own offsets, because a loop over pixel tiles writes a column strip of every channel:
the window spans nearly the whole buffer, the box one strip per channel. The buffer
keeps its size. Codegen contracts only when the buffer has a slice for each of the
target's threads; threads added at run time past `slots` take no iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from . import isl_helpers as ih
from .ast import AstExpr, parameter_expr
from .expr import loads
from .kernel import Role, Statement
from .schedule import Loop, Schedule, statements_below


@dataclass(frozen=True)
class Private:
    tensor: str
    #: the top-level loop within one iteration of which its values live
    loop: str
    #: the offset, in the box's row-major layout, of an iteration's first box corner
    origin: AstExpr
    #: elements of a slice: the product of `shape`
    span: int
    #: slices of `span` elements the buffer holds: the most threads that can share it
    slots: int
    #: the box of elements one iteration touches: the layout of the tensor in codegen
    shape: tuple[int, ...]


def private_temporaries(schedule: Schedule) -> tuple[Private, ...]:
    """Every temporary that a top-level loop's iterations keep to themselves, when it
    saves at least half the buffer."""
    kernel = schedule.kernel
    tops = [(top, set(statements_below(top))) for top in schedule.body if isinstance(top, Loop)]
    found = []
    for name, tensor in kernel.tensors.items():
        if tensor.role is not Role.TEMP:
            continue
        touching = [
            s
            for s in kernel.statements
            if s.tensor == name or any(ld.tensor == name for ld in loads(s.expr))
        ]
        top = next((t for t, below in tops if all(s.name in below for s in touching)), None)
        if top is None or not touching:
            continue
        box = _box(top, touching, name, len(tensor.shape))
        if box is None:
            continue
        lows, shape = box
        span = math.prod(shape)
        size = math.prod(tensor.shape)
        origin = parameter_expr(ih.row_major_offset(lows, shape), top.name)
        if origin is not None and 2 * span <= size:
            found.append(Private(name, top.name, origin, span, size // span, shape))
    return tuple(found)


def _box(
    top: Loop, touching: list[Statement], tensor: str, rank: int
) -> tuple[list[isl.PwAff], tuple[int, ...]] | None:
    """Along each dimension, an iteration's first index and the widest extent, when the
    iterations of `top` keep the tensor's values to themselves."""
    writes: isl.Map | None = None
    reads: isl.Map | None = None
    for s in touching:
        values = ih.loop_value_map(top.exprs[s.name], s.domain_set()).reverse()
        if s.tensor == tensor:
            part = values.apply_range(s.write_map())
            writes = part if writes is None else writes.union(part)
        for access in s.read_maps():
            if access.get_tuple_name(isl.dim_type.out) == tensor:
                part = values.apply_range(access)
                reads = part if reads is None else reads.union(part)
    if writes is None or not writes.reverse().is_single_valued():
        return None
    if reads is not None and not reads.is_subset(writes):
        return None
    lows, shape = [], []
    for d in range(rank):
        window = ih.offset_window(ih.output_dim(writes, d))
        if window is None:
            return None
        lows.append(window[0])
        shape.append(window[1])
    return lows, tuple(shape)
