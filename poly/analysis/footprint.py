"""Data footprints of a statement's tiles, exactly from isl: what the cost model learns
cache and register behaviour from, instead of Ansor's approximations.

For each loop depth d around a statement, one *tile* is the set of instances that share
the values of the loops 0..d (taken at the first tile, the lexicographic minimum). Its
footprint is, per accessed tensor, the bounding box of the elements the tile touches
(an upper bound of the exact count, cheap to compute) and the 64-byte cache lines that
box spans (its rows along the last, contiguous dimension, each rounded up to whole
lines), and its work is the number of instances in the tile. Work / footprint is the
tile's arithmetic intensity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl
import numpy as np

from polytile.poly.analysis.strides import lane_strides, loop_map
from polytile.poly.ast.quasi import flat_index
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import loads
from polytile.poly.ir.schedule import Schedule

#: bytes of a cache line
LINE = 64


@dataclass(frozen=True)
class TileFootprint:
    depth: int
    loop: str
    #: statement instances in one tile
    work: int
    #: elements touched by one tile, summed over the accessed tensors (bounding boxes)
    elements: int
    #: of which in the written tensor
    written: int
    #: 64-byte cache lines the bounding boxes span, summed over the accessed tensors
    lines: int = 0


def footprints(schedule: Schedule, stmt: str) -> list[TileFootprint]:
    s = schedule.kernel.statement[stmt]
    loops = schedule.loops_of(stmt)
    if not loops:
        return []
    values = loop_map(schedule, stmt)
    first = values.range().lexmin()
    if first.is_empty():
        return []
    point = first.sample_point()
    coords = [
        int(point.get_coordinate_val(isl.dim_type.set, i).to_python()) for i in range(len(loops))
    ]
    reads = s.read_maps()[: len(s.read_maps()) - (1 if s.reduction else 0)]
    accesses = [s.write_map(), *reads]
    tensors = [a.get_tuple_name(isl.dim_type.out) for a in accesses]
    found = []
    for depth, loop in enumerate(loops):
        fixed = ", ".join(str(c) for c in coords[: depth + 1])
        free = ", ".join(f"f{i}" for i in range(depth + 1, len(loops)))
        tile_values = ih.parse_set(f"{{ [{fixed}{', ' if free else ''}{free}] }}")
        tile = values.intersect_range(tile_values).domain()
        work = ih.box_volume(tile) if not tile.is_empty() else 0
        boxes = [_extents(tile.apply(a)) for a in accesses]
        per_tensor = [math.prod(b) for b in boxes]
        lines = sum(
            _lines(b, np.dtype(schedule.kernel.tensors[t].dtype).itemsize)
            for b, t in zip(boxes, tensors, strict=True)
        )
        found.append(TileFootprint(depth, loop.name, work, sum(per_tensor), per_tensor[0], lines))
    return found


def _extents(touched: isl.Set) -> list[int]:
    """Bounding-box extents; zeros for an unbounded set (an indirect load's index)."""
    try:
        return ih.box_extents(touched)
    except (ValueError, TypeError, isl.Error):
        return [0]


def _lines(extents: list[int], itemsize: int) -> int:
    """Cache lines a box spans: its rows along the last dimension, each rounded up."""
    if not extents:
        return 1
    rows = math.prod(extents[:-1])
    return rows * -(-extents[-1] * itemsize // LINE)


def innermost_strides(schedule: Schedule, stmt: str) -> list[int | None]:
    """Per access of `stmt` (the write, then each load): its stride in elements along
    the innermost loop, exactly from isl (0: reused; 1: contiguous; None: no uniform
    stride, or an indirect index)."""
    s = schedule.kernel.statement[stmt]
    loops = schedule.loops_of(stmt)
    if not loops:
        return []
    accesses = [(s.tensor, s.index), *((ld.tensor, ld.index) for ld in loads(s.expr))]
    exprs: dict[str, str] = {}
    for n, (tensor, index) in enumerate(accesses):
        if all(isinstance(i, str) for i in index):
            exprs[str(n)] = flat_index(schedule.kernel.tensors[tensor].shape, index)
    found = lane_strides(schedule, stmt, loops[-1].name, exprs)
    return [found.get(str(n)) for n in range(len(accesses))]
