"""The sketch of a kernel: its schedule template, the one both the default schedule and
the search build (`poly.default.decide` gives the default's decisions, `search.space`
samples and mutates others).

The sketch is the structure Ansor uses on CPUs: the main reduction statement's spatial
loops split into outer / middle (cache tile) / register-block / vector levels and its
reduction loops into outer / inner (cache) levels, ordered S R S R S; reductions that
move along the register block (`ow + kw`) may go below it, so the block's bounds stay
constant under padding; elementwise consumers computed inside the output tile; the init
placed before the reduction; outer loops fused and parallel; constant operands packed
into blocked layouts; and, when the output has little parallelism (fewer than two
vectors per thread), rfactor of the longest reduction loop so that its partial results
fill vectors. Its *decisions* say which loop is vectorized and how wide, up to two
register-blocked loops, reduction tile, outer tile, which loop's tiles go outermost,
where the epilogue goes, unroll, how many outer loops run in parallel, and for each
elementwise / injective statement writing a temporary whether it is inlined into its
readers (`inline:<statement>`). Applying them runs the transformations, each checked by
the poly layer; a step that would be illegal is skipped, so every decision set gives a
legal, replayable trace.

Two orientations of a reduction: channels in vectors and rows in registers (the conv
plan, `poly.default.conv`: the weights packed in channel vectors) or the matrix-product
plan (`poly.default.rules`: the innermost output dim in vectors, constant operands and
chosen inputs packed by the vector and block tiles). Inlining rewrites the kernel, so its
steps come first (after rfactor, which must be first): the loops of the statements that
remain keep their names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from polytile.errors import IllegalSchedule
from polytile.poly.default.conv import conv_plan
from polytile.poly.default.rules import packed_inputs
from polytile.poly.default.steps import (
    DefaultConfig,
    attempt,
    compute_prologue,
    contiguous_reduction,
    epilogue,
    gather_inside,
    gathered_loops,
    main_statement,
    moving_reductions,
    narrow_vector,
    pack_weights,
    parallelize_outer,
    split_init,
    vectorize_innermost,
)
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import Loop, Schedule, initial_schedule, statements_below
from polytile.poly.transform import steps as T
from polytile.poly.transform.inline import inline, inline_statement
from polytile.poly.transform.rfactor import rfactor

Decisions = dict[str, Any]
#: a checkpoint between steps: takes the schedule so far and where the build is
Checkpoint = Callable[[Schedule, str], Schedule]

VECTOR_WIDTHS = (4, 8, 16, 32, 48)
BLOCKS = (1, 2, 3, 4, 6, 8)
SECOND_BLOCKS = (1, 2, 3, 4)
REDUCTION_TILES = (0, 4, 8, 16, 32, 64, 128, 256)
OUTER_TILES = (0, 2, 4, 8, 16, 32)
#: register blocks of rows walking over one cache tile (`poly.default.rules.cache_rows`)
ROW_TILES = (0, 4, 8, 16, 32)
#: tiles a band of the outermost loop holds (`poly.default.rules.tile_band`; 0: no bands)
BANDS = (0, *range(2, 17))
RFACTORS = (8, 16, 32, 64)
#: largest register block sampled from a loop's divisors (accumulators are registers)
MAX_BLOCK = 16
#: the decision key of inlining a statement
INLINE = "inline:"


def _unchanged(schedule: Schedule, where: str) -> Schedule:
    return schedule


class Sketch:
    """The template of one kernel: its loops, its decisions' options, and the schedule
    a set of decisions makes (`apply`)."""

    def __init__(self, kernel: Kernel, config: DefaultConfig) -> None:
        """`config`: the target's settings (lanes, threads, caches) the default decisions
        derive from."""
        self.kernel = kernel
        self.config = config
        self.lanes = config.vector_width
        self.main = main_statement(kernel)
        base = initial_schedule(kernel)
        loops = [lp.name for lp in base.loops_of(self.main.name)]
        dim_of = dict(zip(loops, self.main.dims, strict=True))
        self.dim_of = dim_of
        reduction = set(self.main.reduction_dims)
        self.spatial = [n for n in loops if dim_of[n] not in reduction]
        self.reduce = [n for n in loops if dim_of[n] in reduction]
        self.extent = {n: T.loop_extent(base, n) for n in loops}
        self.padded = not self.main.domain_set().is_box()
        #: the default's conv plan (None: the matrix-product plan or no reduction)
        self.plan = conv_plan(kernel, config) if self.main.reduction else None
        #: output loops the epilogue reads across, walked inside the epilogue's tile
        self.gathered = gathered_loops(kernel, self.main, self.spatial, dim_of)
        #: channels in vectors, rows in registers: the default's plan, or for a kernel
        #: whose rows stream (a 1×1 conv, where the default vectorizes the pixels) the
        #: other orientation
        self.channels = self.plan
        if self.plan is None and self.main.reduction:
            self.channels = conv_plan(kernel, config, streaming=True)
        #: the longest reduction loop, rfactored when the output has little parallelism
        self.rloop = max(self.reduce, key=lambda n: self.extent[n], default=None)
        #: the reduction loop every operand of the main statement reads contiguously (a
        #: softmax's or a norm's row): vectorized, its lanes reduce into one element
        self.lane_loop = contiguous_reduction(self.main, self.reduce, dim_of)
        #: statements that may be inlined (one per temporary: the first of its writers)
        self.inlinable = _inlinable(kernel)
        self._inlined: dict[tuple[int, tuple[str, ...]], Schedule] = {}

    # --- decisions --------------------------------------------------------------------
    def structure_choices(self) -> dict[str, tuple[Any, ...]]:
        """Every structural decision's options (loops that cannot be split left out)."""
        splittable = tuple(n for n in self.spatial if self.extent[n] > 2)
        reducible = tuple(n for n in self.reduce if self.extent[n] > 4)
        divisors = {
            b
            for n in splittable
            for b in range(2, MAX_BLOCK + 1)
            if self.extent[n] % b == 0 and b < self.extent[n]
        }
        if self.channels is not None:
            divisors.add(self.channels.block)
        outputs = math.prod(self.extent[n] for n in self.spatial)
        little = outputs < 2 * self.lanes * self.config.threads
        long = (
            [] if self.rloop is None else [f for f in RFACTORS if 4 * f <= self.extent[self.rloop]]
        )
        return {
            "vec_loop": (None, *splittable, *([self.lane_loop] if self.lane_loop else [])),
            "vec": tuple(
                w for w in VECTOR_WIDTHS if w <= self.lanes * self.config.row_vector_limit
            ),
            "pack": (True, False),
            "block_loop": (None, *splittable),
            "block": tuple(sorted(set(BLOCKS) | divisors)),
            "block2_loop": (None, *splittable),
            "block2": SECOND_BLOCKS,
            "low_reduce": (True, False),
            "rtile_loop": (None, *reducible),
            "rtile": REDUCTION_TILES,
            "otile_loop": (None, *splittable),
            "otile": OUTER_TILES,
            "row_tile": ROW_TILES,
            "outer_first": (None, *splittable),
            "band": BANDS,
            "epilogue_depth": (0, 1, 2, 3),
            "unroll": (True, False),
            "parallel_depth": (None, 1, 2, 3),
            "rfactor": (0, *long) if little else (0,),
            **{f"{INLINE}{s}": (False, True) for s in self.inlinable},
        }

    # --- applying ---------------------------------------------------------------------
    def apply(self, decisions: Mapping[str, Any], at: Checkpoint | None = None) -> Schedule:
        """The schedule the decisions make. `at` is called between steps with the
        schedule so far (a budget's checkpoint)."""
        at = at or _unchanged
        d = decisions
        schedule = initial_schedule(self.kernel)
        main = self.main
        if d["rfactor"] and self.rloop is not None:
            dim, factor = self.dim_of[self.rloop], d["rfactor"]
            factored = attempt(schedule, lambda s: rfactor(s, main.name, dim, factor))
            if factored is not schedule:  # partial results in vectors, then combined
                factored = at(self._inline(factored, d, factor), "rfactor")
                for node in list(factored.body):
                    if isinstance(node, Loop):
                        factored = self._simple(factored, node.name, d)
                return factored
        schedule = at(self._inline(schedule, d, 0), "after inlining")
        if main.reduction and self.spatial:
            schedule = at(self._reduction(schedule, d), "main nest")
        elif main.reduction:  # a reduction to a point: its nest first, as any other
            schedule = self._simple_main(schedule, d)
        done = {main.name}
        for node in schedule.body:
            if main.name in statements_below(node):
                done = set(statements_below(node))
        # the other nests (a prologue, an input's packed copy): the vector decision is
        # the main statement's, whose two-register vectors would split them
        lanes = self.lanes if main.reduction and self.spatial else None
        for node in list(schedule.body):
            if isinstance(node, Loop) and not set(statements_below(node)) & done:
                schedule = at(schedule, f"before nest {node.name}")
                schedule = self._simple(schedule, node.name, d, lanes)
        if not main.reduction:
            schedule = self._simple_main(schedule, d)
        return schedule

    def _inline(self, schedule: Schedule, d: Mapping[str, Any], start: int) -> Schedule:
        """The chosen statements inlined, in program order (an inline that a previous one
        made illegal is skipped). `start` says which schedule this begins from (the
        rfactor factor; 0 for the initial schedule): every decision set with the same
        start and choices shares the result, computed once (inlining costs isl work)."""
        chosen = tuple(st for st in self.inlinable if d.get(f"{INLINE}{st}", False))
        found = self._inlined.get((start, chosen))
        if found is None:
            found = schedule
            for stmt in chosen:
                found = attempt(found, lambda s, st=stmt: inline_statement(s, st))
            ih.check_budget("inlining")  # a step refused for the budget is no result to keep
            self._inlined[(start, chosen)] = found
        return found

    def _split(self, schedule: Schedule, loop: str, factor: int) -> tuple[Schedule, list[str]]:
        if factor < 2 or T.loop_extent(schedule, loop) <= factor:
            return schedule, [loop]
        try:
            return T.split_named(schedule, loop, (None, factor))
        except IllegalSchedule:
            return schedule, [loop]

    def _block(
        self, schedule: Schedule, loop: str, factor: int
    ) -> tuple[Schedule, list[str], list[str]]:
        """Split `loop` into (outer, inner) parts of `factor`; a loop no longer than the
        factor is all inner (a row that runs once is still the block), a factor below 2
        leaves a longer one all outer."""
        if T.loop_extent(schedule, loop) <= factor:
            return schedule, [], [loop]
        if factor < 2:
            return schedule, [loop], []
        schedule, parts = self._split(schedule, loop, factor)
        return schedule, parts[:1], parts[1:]

    def _inputs(self, d: Mapping[str, Any], block_dim: str | None) -> tuple[str, ...]:
        """The inputs packed with the weights (`packed_inputs`)."""
        if d["vec_loop"] is None:
            return ()
        tiled = d["rtile_loop"] in self.reduce
        panel = d["rtile"] if tiled else math.prod(self.extent[n] for n in self.reduce)
        block = d["block_loop"]
        blocks = -(-self.extent[block] // d["block"]) if block_dim is not None else 1
        vec_dim = self.dim_of[d["vec_loop"]]
        return packed_inputs(self.kernel, self.main, vec_dim, block_dim, panel, blocks, self.config)

    def _pack(self, schedule: Schedule, d: Mapping[str, Any], conv: bool, vec: int) -> Schedule:
        """Constant operands in blocked layouts: in the conv orientation the weights in
        channel vectors; else every constant (and the inputs `_inputs` names) by the
        vector tile where it moves with it, else by the register block."""
        vec_loop, block_loop = d["vec_loop"], d["block_loop"]
        if conv and self.channels is not None:
            plan = self.channels
            return attempt(schedule, lambda s: T.pack(s, plan.weight, plan.axis, vec))
        blocked = (
            block_loop in self.spatial
            and block_loop != vec_loop
            and 2 <= d["block"] < self.extent[block_loop]
        )
        block_dim = self.dim_of[block_loop] if blocked else None
        vec_dim = self.dim_of[vec_loop] if vec_loop is not None else None
        packs = ((vec_dim, vec), (block_dim, d["block"]))
        return pack_weights(schedule, self.main.name, packs, self._inputs(d, block_dim))

    def _reduction(self, schedule: Schedule, d: Mapping[str, Any]) -> Schedule:
        main = self.main
        vec_loop = d["vec_loop"]  # None: the main statement is not vectorized
        conv = self.channels is not None and vec_loop == self.channels.channel
        heads: dict[str, list[str]] = {n: [n] for n in self.spatial}
        blocks: dict[str, list[str]] = {"block_loop": [], "block2_loop": []}
        vec_inner: list[str] = []
        # a short loop takes narrower vectors rather than one and a part (the conv
        # plan's channels fill their vectors already)
        vec = d["vec"]
        if vec_loop is not None and not conv:
            vec = narrow_vector(self.extent[vec_loop], vec, masked=not self.padded)
        lanes_reduce = vec_loop is not None and vec_loop in self.reduce
        if d["pack"] and not lanes_reduce:
            schedule = self._pack(schedule, d, conv, vec)
        reduce_heads: list[str] = []
        if lanes_reduce:  # the reduction's vector loop innermost, its tiles outside it
            schedule, reduce_heads, vec_inner = self._block(schedule, vec_loop, vec)
        elif vec_loop is not None:
            schedule, heads[vec_loop], vec_inner = self._block(schedule, vec_loop, vec)
        for which, size in (("block_loop", d["block"]), ("block2_loop", d["block2"])):
            loop = d[which]
            if loop in heads and loop != vec_loop and heads[loop] == [loop]:
                schedule, heads[loop], blocks[which] = self._block(schedule, loop, size)
        outer = [h for n in self.spatial for h in heads[n]]
        first = heads.get(d["outer_first"], [])
        if first:  # e.g. a 1x1 conv's pixel tiles outside its channel blocks: the input
            # tile stays in cache across the blocks instead of streaming once per block
            outer.remove(first[0])
            outer.insert(0, first[0])
            if d["band"] and not self.gathered and d["otile_loop"] != d["outer_first"]:
                # bands of those tiles: the blocks go between the bands and their tiles
                schedule, parts = self._split(schedule, first[0], d["band"])
                if len(parts) == 2:
                    outer[0] = parts[0]
                    outer.append(parts[1])
        gathered = [h for n in self.gathered for h in heads[n]]
        if gathered:  # inside the other loops, outside the row tiles
            lead = [o for o in first[:1] if o not in gathered]
            row = (heads.get(self.spatial[-1]) or [None])[0]  # the row tiles
            outer = gather_inside(schedule, main, outer, gathered, lead, row, self.config)
        middle: list[str] = []
        tiled = heads.get(d["otile_loop"], [])
        if tiled:  # the outer part of a blocked loop, or the whole loop
            index = outer.index(tiled[0])
            if 2 <= T.loop_extent(schedule, tiled[0]) <= d["otile"]:
                # one outer tile holds the whole loop: all of it goes below the reduction's
                # outer part (the pixel tiles of a 1x1 conv reuse one chunk of its weights)
                middle.append(outer.pop(index))
            else:
                schedule, parts = self._split(schedule, tiled[0], d["otile"])
                outer[index : index + 1] = parts[:1]
                middle.extend(parts[1:])
        low: list[str] = []
        if d["low_reduce"] and d["block_loop"] in self.spatial and blocks["block_loop"]:
            low = moving_reductions(main, self.reduce, self.dim_of, d["block_loop"])
            low = [n for n in low if n != vec_loop]  # (a vector loop of lanes stays innermost)
        reduce_outer: list[str] = []
        reduce_inner: list[str] = []
        for loop in self.reduce:
            if loop in low:
                continue
            if loop == vec_loop:
                reduce_outer.extend(reduce_heads)
            elif loop == d["rtile_loop"]:
                schedule, parts = self._split(schedule, loop, d["rtile"])
                reduce_outer.append(parts[0])
                reduce_inner.extend(parts[1:])
            else:
                reduce_outer.append(loop)
        rows = heads.get(d["block_loop"], []) if blocks["block_loop"] else []
        if d["row_tile"] and reduce_inner and rows and rows[0] in outer:
            # a band of row blocks walks over each cache tile
            schedule, parts = self._split(schedule, rows[0], d["row_tile"])
            if len(parts) == 2:
                outer[outer.index(rows[0])] = parts[0]
                middle.insert(0, parts[1])
            elif T.loop_extent(schedule, rows[0]) > 1:  # one band holds every block
                outer.remove(rows[0])
                middle.insert(0, rows[0])
        inner_block = [*blocks["block2_loop"], *blocks["block_loop"]]
        order = [*outer, *reduce_outer, *middle, *reduce_inner, *inner_block, *low, *vec_inner]
        current = [lp.name for lp in schedule.loops_of(main.name)]
        if order != current or conv:  # the conv orientation states its order always
            schedule = attempt(schedule, lambda s: T.reorder(s, *order))
        current = [lp.name for lp in schedule.loops_of(main.name)]
        reductions = {*reduce_outer, *reduce_inner, *low, *(vec_inner if lanes_reduce else ())}
        schedule, above = split_init(schedule, main.name, current, reductions)
        spatial_outer = [n for n in above if n not in inner_block]
        if spatial_outer:
            depth = min(d["epilogue_depth"], len(spatial_outer) - 1)
            tile = spatial_outer[len(spatial_outer) - 1 - depth]
            if gathered and gathered[-1] in spatial_outer:  # counted from the gathered loop
                tile = spatial_outer[max(spatial_outer.index(gathered[-1]) - depth, 0)]
            for stmt in self._epilogue(schedule.kernel):
                schedule = attempt(schedule, lambda s, st=stmt: T.reverse_compute_at(s, st, tile))
        if vec_inner:
            schedule = attempt(schedule, lambda s: T.vectorize(s, vec_inner[-1]))
        if d["unroll"]:
            for part in (blocks["block_loop"], blocks["block2_loop"]):
                if part:
                    schedule = attempt(schedule, lambda s, n=part[0]: T.unroll(s, n))
        for stmt in self._epilogue(schedule.kernel):
            schedule = vectorize_innermost(schedule, stmt, self.lanes)
        init = next((s.name for s in self.kernel.statements if s.init_of == main.name), None)
        if init is not None:
            schedule = vectorize_innermost(schedule, init, self.lanes)
        if self.plan is None:  # a conv plan leaves a fused Pad's nest alone
            schedule = compute_prologue(schedule, main.name, self.lanes)
        # a conv's padded row loops stay out of the parallel loop (their bounds would
        # become guards); a pooling window's do not decide the plan
        stop = set(self.spatial) if self.padded and self.plan is not None else set()
        return self._parallel(schedule, main.name, d["parallel_depth"], stop)

    def _epilogue(self, kernel: Kernel) -> list[str]:
        """The epilogue of the main statement in `kernel` (which inlining may shorten)."""
        return epilogue(kernel, kernel.statement[self.main.name])

    def _parallel(
        self, schedule: Schedule, stmt: str, depth: int | None, stop: set[str] | None = None
    ) -> Schedule:
        """`depth` outer loops fused and parallel; None: the default's rule."""
        return parallelize_outer(schedule, stmt, self.config, stop=stop, depth=depth)

    def _simple(
        self, schedule: Schedule, nest: str, d: Mapping[str, Any], lanes: int | None = None
    ) -> Schedule:
        """The nest vectorized (by `lanes`, else the `vec` decision) and parallel."""
        stmts = statements_below(schedule.loop(nest))
        for stmt in stmts:
            schedule = vectorize_innermost(schedule, stmt, lanes or d["vec"])
        return self._parallel(schedule, stmts[0], d["parallel_depth"])

    def _simple_main(self, schedule: Schedule, d: Mapping[str, Any]) -> Schedule:
        loops = schedule.loops_of(self.main.name)
        if loops and not any(lp.annotation for lp in loops):
            return self._simple(schedule, loops[0].name, d)
        return schedule


def _inlinable(kernel: Kernel) -> tuple[str, ...]:
    """The first writer of each temporary that `poly.inline` accepts (a trial run)."""
    found = []
    seen: set[str] = set()
    for s in kernel.statements:
        if s.tensor in seen or kernel.tensors[s.tensor].role is not Role.TEMP:
            continue
        seen.add(s.tensor)
        try:
            inline(kernel, s.name)
        except IllegalSchedule:
            continue
        found.append(s.name)
    return tuple(found)
