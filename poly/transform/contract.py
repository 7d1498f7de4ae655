"""Temporaries private to one iteration of a loop, stored in one small slice per thread
instead of at full size (array contraction).

A conv's accumulator is written and read back within the parallel iteration that
computes its block of output channels, and within one row of it; so are the bias and
residual temporaries of an epilogue fused there. At full size, every iteration writes
lines no other iteration reads again, as many as the output has: they are fetched for
ownership, then written back to memory, for nothing. When each thread instead reuses one
slice of the buffer (what one iteration touches), those lines stay in the core's cache.

The analysis is exact (isl): a temporary qualifies for a loop L (with the loops around
it) when every statement touching it is below L, no element is written in two
iterations of the nest down to L, and every element an iteration reads is one it
writes. Then no value crosses iterations, and an iteration's elements lie in a box:
along each dimension, an extent starting at a quasi-affine function of the iterators.
The deepest such loop gives the smallest box. A slice holds one box in row-major order
(`shape`, `span` elements): codegen lays the tensor out as the box (its offsets use the
box's strides) and adds `slice * span - origin(iterators)`, the box's first element
moved to the thread's slice. A box, not the window of the tensor's own offsets, because
a loop over pixel tiles writes a column strip of every channel: the window spans nearly
the whole buffer, the box one strip per channel. The buffer keeps its size. Codegen
contracts only when the buffer has a slice for each of the target's threads; threads
added at run time past `slots` take no iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polytile.errors import IllegalSchedule
from polytile.poly.ast.build import AstExpr, AstNode, build_ast, marked_loops, parameter_expr
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Role, Statement, size_of
from polytile.poly.ir.schedule import Loop, Schedule, statements_below
from polytile.poly.transform.steps import loop_extent


@dataclass(frozen=True)
class Private:
    tensor: str
    #: the loop within one iteration of which its values live
    loop: str
    #: the offset, in the box's row-major layout, of an iteration's first box corner, in
    #: the iterators of `loop` and the loops around it
    origin: AstExpr
    #: elements of a slice: the product of `shape`
    span: int
    #: slices of `span` elements the buffer holds: the most threads that can share it
    slots: int
    #: the box of elements one iteration touches: the layout of the tensor in codegen
    shape: tuple[int, ...]
    #: the loops around `loop`, outermost first (`origin` may use their iterators)
    outer: tuple[str, ...] = ()


def private_temporaries(schedule: Schedule, tree: AstNode | None = None) -> tuple[Private, ...]:
    """Every temporary whose values live within one iteration of a loop, at the deepest
    such loop (the smallest box), when that saves at least half the buffer. Only loops
    that codegen emits as `for` loops with a body of their own qualify (`tree`: the
    schedule's AST, built when not given): not a loop isl emitted without a `for`
    somewhere (a piece that runs once: its iterator is not bound there), nor an unrolled
    or vector loop. A loop of a single iteration is looked through, not stopped at."""
    kernel = schedule.kernel
    unbound = marked_loops(build_ast(schedule) if tree is None else tree)
    found = []
    # a symbolic temporary's storage is counted at the smallest sizes, which its slices
    # must fit in
    smallest = dict.fromkeys(kernel.params, 1)
    for name, tensor in kernel.tensors.items():
        if tensor.role is not Role.TEMP:
            continue
        touching = [
            s
            for s in kernel.statements
            if s.tensor == name or any(ld.tensor == name for ld in loads(s.expr))
        ]
        path = _common_loops(schedule, {s.name for s in touching})
        # a loop of one iteration (a batch of 1) binds no iterator but separates nothing
        path = [lp for lp in path if _runs_more_than_once(schedule, lp.name)]
        path = path[: next((i for i, lp in enumerate(path) if lp.name in unbound), len(path))]
        size = math.prod(size_of(d, smallest) for d in tensor.shape)
        for depth in range(len(path), 0, -1):
            loops = path[:depth]
            if loops[-1].annotation not in ("", "parallel"):
                continue
            box = _box(loops, touching, name, len(tensor.shape))
            if box is None:
                continue
            lows, shape = box
            span = math.prod(shape)
            names = [lp.name for lp in loops]
            origin = parameter_expr(ih.row_major_offset(lows, shape), names)
            if origin is not None and 2 * span <= size:
                outer = tuple(names[:-1])
                found.append(Private(name, names[-1], origin, span, size // span, shape, outer))
                break
    return tuple(found)


def _runs_more_than_once(schedule: Schedule, loop: str) -> bool:
    """Whether the loop may take two values (a loop bounded only by a symbolic size may)."""
    try:
        return loop_extent(schedule, loop) > 1
    except IllegalSchedule:
        return True


def _common_loops(schedule: Schedule, stmts: set[str]) -> list[Loop]:
    """The loops that hold all of `stmts`, outermost first."""
    path: list[Loop] = []
    nodes = schedule.body
    while stmts:
        inner = next(
            (n for n in nodes if isinstance(n, Loop) and stmts <= set(statements_below(n))),
            None,
        )
        if inner is None:
            break
        path.append(inner)
        nodes = inner.body
    return path


def _box(
    loops: list[Loop], touching: list[Statement], tensor: str, rank: int
) -> tuple[list[isl.PwAff], tuple[int, ...]] | None:
    """Along each dimension, an iteration's first index and the widest extent, when the
    iterations of the innermost of `loops` (each within its outer loops' iteration) keep
    the tensor's values to themselves."""
    writes: isl.Map | None = None
    reads: isl.Map | None = None
    for s in touching:
        domain = s.domain_set()
        values = ih.loop_value_map(loops[0].exprs[s.name], domain)
        for loop in loops[1:]:
            values = values.flat_range_product(ih.loop_value_map(loop.exprs[s.name], domain))
        values = values.reverse()
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
