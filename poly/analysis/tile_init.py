"""Whether a reduction's init fills exactly the accumulators of its register tile.

`decompose_reduction` places a reduction's init right before its outermost reduction
loop, inside the loops around it. When, in every iteration of those loops, the init
writes exactly the elements the reduction then accumulates into, codegen can start the
register accumulators from the init's values (a bias vector, a constant) instead of
storing them and loading them back (for accumulators whose lanes lie rows apart: a
masked store per row, then rows and a transpose per tile). The check is exact (isl):
the map from the loops' values to the elements written is the same for both statements.
"""

from __future__ import annotations

import islpy as isl

from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.schedule import Schedule


def _written_per_iteration(schedule: Schedule, stmt: str, loop: str) -> isl.Map | isl.Set | None:
    """`{ [values of the loops around loop] -> T[element] }` for one statement (the set of
    elements when no loop is around), None when the statement is not below those loops."""
    s = schedule.kernel.statement[stmt]
    outer = schedule.enclosing(loop)
    if not outer:
        return s.write_map().range()
    if any(stmt not in lp.exprs for lp in outer):
        return None
    domain = s.domain_set()
    values = ih.loop_value_map(outer[0].exprs[stmt], domain)
    for lp in outer[1:]:
        values = values.flat_range_product(ih.loop_value_map(lp.exprs[stmt], domain))
    return values.reverse().apply_range(s.write_map())


def init_fills_tile(schedule: Schedule, init: str, main: str, loop: str) -> bool:
    """Whether `init` (the init of reduction `main`) writes, in each iteration of the
    loops around `loop`, exactly the elements `main` writes there."""
    mine = _written_per_iteration(schedule, init, loop)
    theirs = _written_per_iteration(schedule, main, loop)
    if mine is None or theirs is None or type(mine) is not type(theirs):
        return False
    return bool(mine.is_equal(theirs))
