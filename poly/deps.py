"""Dependences of a kernel, from isl, under its program order (statements in sequence,
each over its domain in lexicographic order)."""

from __future__ import annotations

import islpy as isl

from . import isl_helpers as ih
from .kernel import Dependences, Kernel


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
