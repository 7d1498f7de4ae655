"""The search space of a kernel, from its structure alone (no per-op templates).

A *sketch* is the structure Ansor uses on CPUs: the main reduction statement's spatial
loops split into outer / register-block / vector levels and its reduction loops into
outer / inner (cache) levels, ordered S R S R S; elementwise consumers computed inside the
output tile; the init placed before the reduction; outer loops fused and parallel;
constant operands packed. A candidate is the sketch with its *decisions* (which loop is
vectorized and how wide, register block, reduction tile, outer tile, where the epilogue
goes, unroll, how many outer loops run in parallel), sampled at random; building it
applies the transformations, each checked by the poly layer, and records the trace. A
decision that would be illegal is dropped (that step is skipped), so every candidate is
a legal, replayable trace before anything is measured.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polytile.errors import IllegalSchedule
from polytile.poly import transform as T
from polytile.poly.default import DefaultConfig, epilogue, main_statement, parallelize_outer
from polytile.poly.expr import loads
from polytile.poly.kernel import Kernel, Role
from polytile.poly.schedule import Loop, Schedule, initial_schedule, statements_below

Decisions = dict[str, Any]

VECTOR_WIDTHS = (4, 8, 16, 32)
BLOCKS = (1, 2, 3, 4, 6, 8)
REDUCTION_TILES = (0, 4, 8, 16, 32, 64)
OUTER_TILES = (0, 2, 4, 8, 16, 32)
#: how the sampled parallel loop is chosen (its depth is a decision; extent ≥ 2 to run)
_PARALLEL = DefaultConfig(min_parallel_extent=2)


@dataclass(frozen=True)
class Candidate:
    decisions: Mapping[str, Any]
    schedule: Schedule

    @property
    def trace(self) -> list[dict[str, Any]]:
        return self.schedule.trace_json()


def _try(schedule: Schedule, fn: Callable[[Schedule], Schedule]) -> Schedule:
    try:
        return fn(schedule)
    except IllegalSchedule:
        return schedule


class SearchSpace:
    """Decisions of one kernel: sample, mutate, build."""

    def __init__(self, kernel: Kernel, lanes: int = 16) -> None:
        self.kernel = kernel
        self.lanes = lanes
        self.main = main_statement(kernel)
        base = initial_schedule(kernel)
        loops = [lp.name for lp in base.loops_of(self.main.name)]
        dim_of = dict(zip(loops, self.main.dims, strict=True))
        self.dim_of = dim_of
        reduction = set(self.main.reduction_dims)
        self.spatial = [n for n in loops if dim_of[n] not in reduction]
        self.reduce = [n for n in loops if dim_of[n] in reduction]
        self.extent = {n: T.loop_extent(base, n) for n in loops}

    # --- decisions --------------------------------------------------------------------
    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Every decision's options (loops that cannot be split are left out)."""
        splittable = tuple(n for n in self.spatial if self.extent[n] > 2)
        reducible = tuple(n for n in self.reduce if self.extent[n] > 4)
        return {
            "vec_loop": splittable or (None,),
            "vec": tuple(w for w in VECTOR_WIDTHS if w <= 2 * self.lanes),
            "pack": (True, False),
            "block_loop": (None, *splittable),
            "block": BLOCKS,
            "rtile_loop": (None, *reducible),
            "rtile": REDUCTION_TILES,
            "otile_loop": (None, *splittable),
            "otile": OUTER_TILES,
            "epilogue_depth": (0, 1, 2, 3),
            "unroll": (True, False),
            "parallel_depth": (1, 2, 3),
        }

    def sample(self, rng: random.Random) -> Decisions:
        decisions = {k: rng.choice(v) for k, v in self.choices().items()}
        if self.spatial and rng.random() < 0.7:  # the innermost output dim usually wins
            decisions["vec_loop"] = self.spatial[-1]
        return decisions

    def mutate(self, decisions: Mapping[str, Any], rng: random.Random) -> Decisions:
        choices = self.choices()
        key = rng.choice(sorted(choices))
        mutated = dict(decisions)
        mutated[key] = rng.choice(choices[key])
        return mutated

    # --- building ---------------------------------------------------------------------
    def build(self, decisions: Mapping[str, Any]) -> Candidate:
        schedule = initial_schedule(self.kernel)
        main = self.main
        if main.reduction and self.spatial:
            schedule = self._reduction(schedule, decisions)
        done = set()
        for node in schedule.body:
            if main.name in statements_below(node):
                done = set(statements_below(node))
        for node in list(schedule.body):
            if isinstance(node, Loop) and not set(statements_below(node)) & done:
                schedule = self._simple(schedule, node.name, decisions)
        if not main.reduction or not self.spatial:
            schedule = self._simple_main(schedule, decisions)
        return Candidate(dict(decisions), schedule)

    def _split(self, schedule: Schedule, loop: str, factor: int) -> tuple[Schedule, list[str]]:
        if factor < 2 or T.loop_extent(schedule, loop) <= factor:
            return schedule, [loop]
        try:
            return T.split_named(schedule, loop, (None, factor))
        except IllegalSchedule:
            return schedule, [loop]

    def _reduction(self, schedule: Schedule, d: Mapping[str, Any]) -> Schedule:
        main = self.main
        vec_loop = d["vec_loop"] if d["vec_loop"] is not None else self.spatial[-1]
        if d["pack"]:
            schedule = self._pack(schedule, self.dim_of[vec_loop], d["vec"])
        outer: list[str] = []
        middle: list[str] = []
        inner_block: list[str] = []
        vec_inner: list[str] = []
        for loop in self.spatial:
            if loop == vec_loop:
                schedule, parts = self._split(schedule, loop, d["vec"])
                outer.append(parts[0])
                vec_inner.extend(parts[1:])
            elif loop == d["block_loop"]:
                schedule, parts = self._split(schedule, loop, d["block"])
                outer.append(parts[0])
                inner_block.extend(parts[1:])
            else:
                outer.append(loop)
        if d["otile_loop"] in outer:
            index = outer.index(d["otile_loop"])
            schedule, parts = self._split(schedule, d["otile_loop"], d["otile"])
            outer[index : index + 1] = parts[:1]
            middle.extend(parts[1:])
        reduce_outer: list[str] = []
        reduce_inner: list[str] = []
        for loop in self.reduce:
            if loop == d["rtile_loop"]:
                schedule, parts = self._split(schedule, loop, d["rtile"])
                reduce_outer.append(parts[0])
                reduce_inner.extend(parts[1:])
            else:
                reduce_outer.append(loop)
        order = [*outer, *reduce_outer, *middle, *reduce_inner, *inner_block, *vec_inner]
        current = [lp.name for lp in schedule.loops_of(main.name)]
        if order != current:
            schedule = _try(schedule, lambda s: T.reorder(s, *order))
        current = [lp.name for lp in schedule.loops_of(main.name)]
        reductions = set(reduce_outer) | set(reduce_inner)
        first = next((n for n in current if n in reductions), None)
        if first is not None:
            schedule = _try(schedule, lambda s: T.decompose_reduction(s, main.name, first))
        spatial_outer = [n for n in current[: current.index(first)]] if first else current
        if spatial_outer:
            depth = min(d["epilogue_depth"], len(spatial_outer) - 1)
            tile = spatial_outer[len(spatial_outer) - 1 - depth]
            for stmt in self._epilogue():
                schedule = _try(schedule, lambda s, st=stmt: T.reverse_compute_at(s, st, tile))
        if vec_inner:
            schedule = _try(schedule, lambda s: T.vectorize(s, vec_inner[-1]))
        if d["unroll"] and inner_block:
            schedule = _try(schedule, lambda s: T.unroll(s, inner_block[0]))
        for stmt in self._epilogue():
            schedule = self._vectorize_innermost(schedule, stmt, d["vec"])
        init = next((s.name for s in self.kernel.statements if s.init_of == main.name), None)
        if init is not None:
            schedule = self._vectorize_innermost(schedule, init, d["vec"])
        return self._parallel(schedule, main.name, d["parallel_depth"])

    def _pack(self, schedule: Schedule, dim: str, factor: int) -> Schedule:
        for ld in loads(self.main.expr):
            t = schedule.kernel.tensors.get(ld.tensor)
            if t is None or t.role is not Role.CONSTANT or len(t.shape) < 2:
                continue
            if dim in ld.index:
                axis = ld.index.index(dim)
                if t.shape[axis] >= 2 * factor:
                    schedule = _try(
                        schedule, lambda s, n=ld.tensor, a=axis: T.pack(s, n, a, factor)
                    )
        return schedule

    def _epilogue(self) -> list[str]:
        return epilogue(self.kernel, self.main)

    def _vectorize_innermost(self, schedule: Schedule, stmt: str, width: int) -> Schedule:
        own = [lp for lp in schedule.loops_of(stmt) if statements_below(lp) == [stmt]]
        if not own:
            return schedule
        last = own[-1].name
        schedule, parts = self._split(schedule, last, width)
        return _try(schedule, lambda s: T.vectorize(s, parts[-1]))

    def _parallel(self, schedule: Schedule, stmt: str, depth: int) -> Schedule:
        return parallelize_outer(schedule, stmt, _PARALLEL, depth=depth)

    def _simple(self, schedule: Schedule, nest: str, d: Mapping[str, Any]) -> Schedule:
        stmts = statements_below(schedule.loop(nest))
        for stmt in stmts:
            schedule = self._vectorize_innermost(schedule, stmt, d["vec"])
        return self._parallel(schedule, stmts[0], d["parallel_depth"])

    def _simple_main(self, schedule: Schedule, d: Mapping[str, Any]) -> Schedule:
        loops = schedule.loops_of(self.main.name)
        if loops and not any(lp.annotation for lp in loops):
            return self._simple(schedule, loops[0].name, d)
        return schedule
