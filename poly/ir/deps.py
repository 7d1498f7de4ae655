"""Dependences of a kernel, from isl, under its program order (statements in sequence,
each over its domain in lexicographic order)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import islpy as isl

from polytile.poly.ir import isl_helpers as ih

if TYPE_CHECKING:
    from polytile.poly.ir.kernel import Kernel


@dataclass(frozen=True)
class Dependences:
    """Memory-based dependences between statement instances, in program order.

    `reduction` holds the self-dependences of reduction statements through their
    accumulator: the combiner is associative, so they may be reordered, but a loop that
    carries one must not run in parallel.
    """

    flow: isl.UnionMap
    anti: isl.UnionMap
    output: isl.UnionMap
    reduction: isl.UnionMap

    def ordering(self) -> isl.UnionMap:
        """Every dependence a schedule must keep in order."""
        return self.flow.union(self.anti).union(self.output)


def program_order(kernel: Kernel) -> isl.UnionMap:
    """Statement instance → [position, dims..., 0 padding]: the order the kernel means."""
    depth = max((len(s.dims) for s in kernel.statements), default=0)
    maps = []
    for position, s in enumerate(kernel.statements):
        pad = ["0"] * (depth - len(s.dims))
        target = ", ".join([str(position), *s.dims, *pad])
        text = f"{{ {s.name}[{', '.join(s.dims)}] -> [{target}] }}"
        maps.append(ih.parse_map(text).intersect_domain(s.domain_set()))
    return ih.union_map(maps)


def _pairs(sources: isl.UnionMap, sinks: isl.UnionMap, before: isl.UnionMap) -> isl.UnionMap:
    """Instances s → t touching the same element, with s before t."""
    return sources.apply_range(sinks.reverse()).intersect(before)


def compute_dependences(kernel: Kernel) -> Dependences:
    order = program_order(kernel)
    before = order.lex_lt_union_map(order)
    reads, writes = kernel.reads(), kernel.writes()
    flow = _pairs(writes, reads, before)
    anti = _pairs(reads, writes, before)
    output = _pairs(writes, writes, before)
    reduction = ih.union_map([])
    for s in kernel.statements:
        if s.reduction is None:
            continue
        acc = isl.UnionMap.from_map(s.write_map())
        reduction = reduction.union(_pairs(acc, acc, before))
    return Dependences(
        flow=flow.subtract(reduction),
        anti=anti.subtract(reduction),
        output=output.subtract(reduction),
        reduction=reduction,
    )


def ordering_touching(kernel: Kernel, stmts: Collection[str]) -> isl.UnionMap:
    """`compute_dependences(kernel).ordering()`, only the dependences with an end in one
    of `stmts`: the pairs of those statements' accesses with everyone's, without the
    pairs of every other two statements (for a check where only `stmts` changed)."""
    mine = [s for s in kernel.statements if s.name in stmts]
    order = program_order(kernel)
    own = order.intersect_domain(ih.union_set([s.domain_set() for s in mine]))
    before = order.lex_lt_union_map(own).union(own.lex_lt_union_map(order))
    reads, writes = kernel.reads(), kernel.writes()
    my_reads = ih.union_map([m for s in mine for m in s.read_maps()])
    my_writes = ih.union_map([s.write_map() for s in mine])
    pairs = [
        (writes, my_reads),
        (my_writes, reads),
        (reads, my_writes),
        (my_reads, writes),
        (writes, my_writes),
        (my_writes, writes),
    ]
    found = ih.union_map([_pairs(a, b, before) for a, b in pairs])
    for s in mine:
        if s.reduction is not None:
            acc = isl.UnionMap.from_map(s.write_map())
            found = found.subtract(_pairs(acc, acc, before))
    return found


def may_share(kernel: Kernel, read: str, written: str) -> bool:
    """Whether `written` may take over `read`'s buffer (an input dead after this kernel):
    an element of `read` is overwritten only by an instance that read it itself or that
    depends on such a reader through a chain of at most `FLOW_HOPS` flow dependences.
    Either way the write depends on the read's value, so every legal schedule and every
    compiler keeps the read first. A residual `Add` fused into a convolution's epilogue
    passes; a convolution whose output rows mix several input rows does not."""
    src, dst = kernel.tensors[read], kernel.tensors[written]
    if src.shape != dst.shape or src.dtype != dst.dtype or written == read:
        return False
    if any(s.tensor == read for s in kernel.statements):
        return False
    reads = ih.union_map(
        [m for s in kernel.statements for m in s.read_maps() if m.get_tuple_name(_OUT) == read]
    )
    writes = ih.union_map(
        [s.write_map().set_tuple_name(_OUT, read) for s in kernel.statements if s.tensor == written]
    )
    conflicts = reads.apply_range(writes.reverse())
    if conflicts.is_empty():
        return True
    left = conflicts.subtract(conflicts.domain().identity())
    flow = kernel.dependences.flow
    reach = flow.intersect_domain(left.domain())
    for _ in range(FLOW_HOPS):
        left = left.subtract(reach)
        if left.is_empty():
            return True
        reach = reach.apply_range(flow)
    return False


_OUT = isl.dim_type.out
#: the longest chain of flow dependences `may_share` follows from a read to a write
FLOW_HOPS = 3
