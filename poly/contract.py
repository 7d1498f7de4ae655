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
crosses iterations, and an iteration's elements lie in a window of `span` consecutive
offsets starting at `origin(v)`. Codegen adds `slice * span - origin(v)` to every
offset of the tensor inside the loop's body; the buffer keeps its size. Codegen
contracts only when the buffer has a slice for each of the target's threads; threads
added at run time past `slots` take no iterations of the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from . import isl_helpers as ih
from .ast import AstExpr, parameter_expr
from .expr import loads
from .kernel import Role, Statement
from .quasi import flat_index
from .schedule import Loop, Schedule, statements_below


@dataclass(frozen=True)
class Private:
    tensor: str
    #: the top-level loop within one iteration of which its values live
    loop: str
    #: the row-major offset of an iteration's first element, in the loop's iterator
    origin: AstExpr
    #: offsets from an iteration's first to its last element, inclusive
    span: int
    #: slices of `span` elements the buffer holds: the most threads that can share it
    slots: int


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
        window = _window(top, touching, name, tensor.shape)
        if window is None:
            continue
        low, span = window
        size = math.prod(tensor.shape)
        origin = parameter_expr(low, top.name)
        if origin is not None and 2 * span <= size:
            found.append(Private(name, top.name, origin, span, size // span))
    return tuple(found)


def _window(
    top: Loop, touching: list[Statement], tensor: str, shape: tuple[int, ...]
) -> tuple[isl.PwAff, int] | None:
    """The first offset of an iteration's elements and the widest span, when the
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
    dims = tuple(f"i{d}" for d in range(len(shape)))
    offsets = ih.parse_map(ih.access(tensor, dims, "", [flat_index(shape, dims)]))
    return ih.offset_window(writes.apply_range(offsets))
