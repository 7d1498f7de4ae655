"""Data footprints of a statement's tiles, exactly from isl: what the cost model learns
cache and register behaviour from, instead of Ansor's approximations.

For each loop depth d around a statement, one *tile* is the set of instances that share
the values of the loops 0..d (taken at the first tile, the lexicographic minimum). Its
footprint is, per accessed tensor, the bounding box of the elements the tile touches
(an upper bound of the exact count, cheap to compute), and its work is the number of
instances in the tile. Work / footprint is the tile's arithmetic intensity.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from . import isl_helpers as ih
from .schedule import Schedule
from .strides import loop_map


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
    accesses = [s.write_map(), *s.read_maps()[: len(s.read_maps()) - (1 if s.reduction else 0)]]
    found = []
    for depth, loop in enumerate(loops):
        fixed = ", ".join(str(c) for c in coords[: depth + 1])
        free = ", ".join(f"f{i}" for i in range(depth + 1, len(loops)))
        tile_values = ih.parse_set(f"{{ [{fixed}{', ' if free else ''}{free}] }}")
        tile = values.intersect_range(tile_values).domain()
        work = ih.box_volume(tile) if not tile.is_empty() else 0
        per_tensor = [_volume(tile.apply(a)) for a in accesses]
        found.append(TileFootprint(depth, loop.name, work, sum(per_tensor), per_tensor[0]))
    return found


def _volume(touched: isl.Set) -> int:
    """The bounding-box volume; 0 for an unbounded set (an indirect load's index)."""
    try:
        return ih.box_volume(touched)
    except (ValueError, TypeError, isl.Error):
        return 0
