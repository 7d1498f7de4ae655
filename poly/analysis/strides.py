"""Lane strides for vector code: how far an address (or a dimension's value) moves when a
vector loop advances by one, decided exactly with isl.

For a statement under loop `L`, the pairs of instances that differ only by one step of
`L` (all other loops equal) form a relation; applying an affine expression to both sides
and taking the differences gives every stride that occurs. One value means the
expression moves uniformly: 0 is a broadcast, 1 a contiguous vector access, anything
else a strided access. Several values (piecewise maps, e.g. padding borders) mean no
uniform stride: codegen then computes each lane on its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from polytile.poly.ast.quasi import flat_terms
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.schedule import Schedule


def loop_map(schedule: Schedule, stmt: str) -> isl.Map:
    """Instances of `stmt` → the values of its loops, outermost first."""
    s = schedule.kernel.statement[stmt]
    affs = [ih.parse_pw_aff(loop.exprs[stmt]) for loop in schedule.loops_of(stmt)]
    mpa = isl.PwMultiAff.from_pw_aff(affs[0])
    for aff in affs[1:]:
        mpa = mpa.flat_range_product(isl.PwMultiAff.from_pw_aff(aff))
    return isl.Map.from_pw_multi_aff(mpa).intersect_domain(s.domain_set())


def next_lane(schedule: Schedule, stmt: str, loop: str) -> isl.Map:
    """Instance → the instance one step further along `loop`, every other loop equal."""
    loops = [lp.name for lp in schedule.loops_of(stmt)]
    position = loops.index(loop)
    names = [f"l{i}" for i in range(len(loops))]
    moved = [f"{n} + 1" if i == position else n for i, n in enumerate(names)]
    shift = ih.parse_map(f"{{ [{', '.join(names)}] -> [{', '.join(moved)}] }}")
    values = loop_map(schedule, stmt)
    return values.apply_range(shift).apply_range(values.reverse())


def lane_strides(
    schedule: Schedule, stmt: str, loop: str, exprs: Mapping[str, str]
) -> dict[str, int | None]:
    """For each quasi-affine expression over the statement's dims: its uniform stride
    along `loop`, or None when it has none. Expressions of a loop that never takes two
    consecutive values get stride 0 (no vector iteration will run)."""
    s = schedule.kernel.statement[stmt]
    lane = next_lane(schedule, stmt, loop)
    params = schedule.kernel.params
    prefix = f"[{', '.join(params)}] -> " if params else ""

    def stride(text: str) -> int | None:
        value = ih.parse_map(f"{prefix}{{ {stmt}[{', '.join(s.dims)}] -> [({text})] }}")
        value = value.intersect_domain(s.domain_set())
        deltas = lane.apply_domain(value).apply_range(value).deltas()
        if deltas.is_empty():
            return 0
        if deltas.is_singleton():
            point = deltas.sample_point()
            return int(point.get_coordinate_val(isl.dim_type.set, 0).to_python())
        return None

    found: dict[str, int | None] = {}
    for key, text in exprs.items():
        terms = flat_terms(text) if params else None
        if terms is None or not any(symbolic for _, _, symbolic in terms):
            found[key] = stride(text)
            continue
        # a symbolic layout's offset is not affine: its entries are, and the stride is
        # known when no entry that moves has a symbolic stride
        total: int | None = 0
        for entry, factor, symbolic in terms:
            moved = stride(entry)
            if moved is None or (moved and symbolic):
                total = None
                break
            total += moved * factor
        found[key] = total
    return found
