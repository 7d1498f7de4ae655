"""Register accumulators: a reduction loop whose body only accumulates into addresses
that stay fixed while it runs (the reduction loops of a register tile) keeps those
accumulators in SSA values (stack cells that mem2reg promotes): read before the loop,
written after it. Accumulators whose lanes lie rows apart move as rows and a transpose
in registers (`row_groups`); a float sum with too few accumulators to hide the FMA
latency keeps partial sums (`partial_sums`); the reduction's steps carry the
prefetches of `codegen.prefetch`; a reduction whose init nest, right before it, fills
exactly its accumulators starts them from the init's values instead of loading back what
the nest stored (`fused_init`).

`Accumulators` owns these decisions and the promoted loops' state; the loop emitter
(`codegen.kernel`) runs the loops and asks it to open a promoted loop (`enter`), split
its steps into partial sums (`split`), emit the promoted calls (`call`) and write the
accumulators back (`finish`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
from llvmlite import ir

from polytile.errors import CodegenError
from polytile.poly.ast.build import AstNode, Block, Call, For, Int, Mark
from polytile.poly.ast.nodes import called
from polytile.poly.ast.quasi import flat_index
from polytile.poly.ir.kernel import Statement, mentions

from .ast_facts import (
    exact,
    fors,
    linear_in,
    linear_terms,
    upper,
    vars_of,
)
from .emission import Emitter, KernelState, plus
from .llvm_types import Env, constant, kind, memory_type
from .prefetch import Prefetcher
from .transpose import columns_to_rows, rows_to_columns
from .values import Instance, Lanes, address_texts, lane_accumulator, shares_write

#: independent accumulators that keep an FMA unit busy (4-cycle latency × 2 issued a
#: cycle), the bytes of its vector registers, and at most how many partial sums a
#: promoted reduction is split into, when it runs at least `MIN_SPLIT_TRIPS` iterations
IN_FLIGHT = 8
VECTOR_BYTES = 64
MAX_PARTS = 4
MIN_SPLIT_TRIPS = 16
#: the most accumulator registers a tile started from its init's values takes: small
#: tiles gain from skipping the reload, while larger ones (28 registers) left more spills
#: in their loop, the register allocator choosing differently
FUSED_INIT_REGISTERS = 24


@dataclass
class Slot:
    """One promoted accumulator: its stack cell and where it lives in memory; the values
    of the promotion's key variables it was opened at and the piece of the loop nest (the
    write index, key variables symbolic) that opened it."""

    cell: ir.Value
    type: ir.Type
    dims: dict[str, ir.Value]
    lanes: Lanes | None
    values: tuple[int, ...] = ()
    piece: tuple = ()
    #: the write address (key variables at their values) and whether the slot's lanes
    #: all reduce into it (`shares_write`), combined when it is written back
    address: tuple = ()
    shared: bool = False

    @property
    def merges(self) -> bool:
        """Whether the slot may share its address with others (a scalar remainder's and
        a reduction's lanes), all combined into the element when written back."""
        return self.shared or self.lanes is None


@dataclass
class Promotion:
    stmt: str
    #: expanded inner loops the accumulator's address depends on
    key_vars: tuple[str, ...]
    write_dims: tuple[str, ...]
    #: the schedule loops of `key_vars`
    key_loops: tuple[str, ...] = ()
    #: the vector registers the accumulators take (key values × registers a vector)
    registers: int = 1
    #: which partial sum the code being emitted adds into (`partial_sums`)
    part: int = 0
    #: whether to fetch the next parallel iteration's constants ahead, and the key value
    #: of the unrolled copy that asks for a line all copies read
    prefetch: bool = False
    first_key: dict[str, int] = field(default_factory=dict)
    pre: ir.Block | None = None
    slots: dict[tuple, Slot] = field(default_factory=dict)
    #: the init statement whose values start the accumulators (`fused_init`), and the
    #: lane strides of its addresses along each vector loop below
    initial: str | None = None
    initial_strides: dict[str, dict[str, int | None]] = field(default_factory=dict)
    #: the reduction loop's iterator, schedule loop and step
    loop: tuple[str, str, int] | None = None


class Accumulators:
    """The register accumulators of one function being emitted: constructed with the
    function (`em`, through which it emits), the kernel's shared state and the
    function's prefetcher (which asks for lines along each promoted reduction step), it
    holds the promotion of the reduction loop being emitted."""

    def __init__(self, em: Emitter, state: KernelState, prefetcher: Prefetcher) -> None:
        self.em = em
        self.state = state
        self.kernel = state.kernel
        self.prefetcher = prefetcher
        #: the promoted loop being emitted (calls of its statement use its slots)
        self.active: Promotion | None = None

    def enter(self, node: For, promotion: Promotion) -> int:
        """Open the promoted loop `node` at the builder's position: a block before it
        where the accumulators are loaded (`open_slot`); returns how many partial sums
        its steps are split into (`partial_sums`)."""
        promotion.prefetch = self.prefetcher.fetches_next()
        if isinstance(node.inc, Int):
            promotion.loop = (node.var, node.loop, node.inc.value)
        b = self.em.b
        pre = b.append_basic_block(f"{node.var}.acc")
        b.branch(pre)
        b.position_at_end(pre)
        promotion.pre = pre
        self.active = promotion
        return self.partial_sums(node, promotion)

    def leave(self) -> None:
        """The promoted loop's code is emitted (or failed): calls no longer use slots."""
        self.active = None

    def finish(self, promotion: Promotion) -> None:
        """After the promoted loop: its partial sums joined, its accumulators stored."""
        self.join_parts(promotion)
        self.write_back(promotion)

    def partial_sums(self, node: For, promotion: Promotion) -> int:
        """How many partial sums a promoted float sum keeps: with fewer independent
        accumulators than an FMA unit has in flight (latency × issue width, 8 on current
        x86 cores), each iteration waits for the previous one's result, so the loop is
        split `parts` ways into separate accumulators summed at the end (the sum is
        reassociated, like any blocked reduction), as in a GEMV with two vector
        accumulators."""
        stmt = self.kernel.statement[promotion.stmt]
        dtype = self.kernel.tensors[stmt.tensor].dtype
        bound = upper(node)
        limit = exact(bound) if bound is not None else None
        if (
            stmt.reduction != "sum"
            or dtype not in ("float32", "float64")
            or node.inc != Int(1)
            or not isinstance(node.init, Int)
            or limit is None
            or limit - node.init.value < MIN_SPLIT_TRIPS
        ):
            return 1
        chains = promotion.registers
        return min(MAX_PARTS, -(-IN_FLIGHT // chains)) if chains < IN_FLIGHT else 1

    def split(self, node: For, parts: int, body: Callable[[Env], None]) -> Callable[[Env], None]:
        """The body of `parts` consecutive iterations, each into its own partial sums."""
        promotion = self.active
        assert promotion is not None

        def run(env: Env) -> None:
            for part in range(parts):
                promotion.part = part
                body({**env, node.var: plus(self.em.b, env[node.var], part)})

        return run

    def join_parts(self, promotion: Promotion) -> None:
        """Add each accumulator's partial sums into its first one (and drop the rest)."""
        for key in [k for k in promotion.slots if k[-1] > 0]:
            slot = promotion.slots.pop(key)
            first = promotion.slots[(*key[:-1], 0)]
            total = self.em.b.fadd(
                self.em.b.load(first.cell, typ=first.type), self.em.b.load(slot.cell, typ=slot.type)
            )
            self.em.b.store(total, first.cell)

    # --- accumulators in registers ------------------------------------------------------
    def fused_init(self, items: Sequence[AstNode], i: int) -> Promotion | None:
        """The promotion of `items[i + 1]`, a loop's body's reduction loop, started from
        the values of `items[i]`, the nest of its init, when nothing else in the body
        writes either statement and the init writes exactly the accumulators in every
        iteration of the loops around (`poly.tile_init`): a conv's bias goes straight
        into its register tile, not loaded back as rows and a transpose. The nest still
        runs, so memory sees the same stores as before; only the reload is gone."""
        if self.active is not None or i + 1 >= len(items):
            return None
        nest, loop = items[i], items[i + 1]
        if not isinstance(loop, For) or loop.annotation:
            return None  # a plain loop: the one `emit_loop` would promote
        names = called(nest)
        if len(names) != 1:
            return None
        init = self.kernel.statement[next(iter(names))]
        if init.init_of is None or called(loop) != {init.init_of}:
            return None
        main = self.kernel.statement[init.init_of]
        dtype = self.kernel.tensors[main.tensor].dtype
        if init.index != main.index or kind(dtype) == "b" or init.expr.dtype != dtype:
            return None
        others = set().union(*(called(x) for j, x in enumerate(items) if j not in (i, i + 1)))
        if init.name in others or main.name in others:
            return None
        promotion = self.promotable(loop)
        if promotion is None or not set(init.dims) <= set(promotion.write_dims):
            return None
        if promotion.registers > FUSED_INIT_REGISTERS:
            return None
        texts = address_texts(init.expr, self.state.shape)
        if texts is None:
            return None
        for vector in {f.loop for f in fors(loop) if f.annotation == "vector"}:
            strides = {t: self.state.stride_along(main, vector, t) for t in texts}
            if any(v is None for v in strides.values()):
                return None
            promotion.initial_strides[vector] = strides
        if not self.state.init_fills(init.name, main.name, loop.loop):
            return None
        promotion.initial = init.name
        return promotion

    def promotable(self, node: For) -> Promotion | None:
        """A loop whose body only accumulates into addresses that stay fixed while it
        runs (the reduction loops of a register tile): those accumulators are read
        before the loop, kept in SSA values and written after it."""
        calls: list[Call] = []
        inner: dict[str, bool] = {}
        loops: dict[str, str] = {}
        if not self._collect(node.body, calls, inner, loops):
            return None
        if self._misaligned(node.body):
            return None
        if not calls or len({c.stmt for c in calls}) != 1:
            return None
        stmt = self.kernel.statement[calls[0].stmt]
        if not stmt.accumulates_only:
            return None
        write_dims = [d for d in stmt.dims if any(mentions(i, d) for i in stmt.index)]
        per_call: set[frozenset[str]] = set()
        for call in calls:
            key_vars: set[str] = set()
            for dim, arg in zip(stmt.dims, call.args, strict=True):
                if dim not in write_dims:
                    continue
                used = vars_of(arg)
                if node.var in used or any(not inner[v] for v in used if v in inner):
                    return None
                expanded = [v for v in used if v in inner]
                if len(expanded) > 1 or (expanded and not linear_in(arg, expanded[0])):
                    return None
                key_vars.update(expanded)
            per_call.add(frozenset(key_vars))
        if len(per_call) > 1:
            # a call where isl substituted a loop that runs once (`i11` in a full block,
            # a constant in the leftover row after it) is not keyed like the others
            return None
        keys = tuple(sorted(next(iter(per_call))))
        promotion = Promotion(stmt.name, keys, tuple(write_dims), tuple(loops[v] for v in keys))
        values, widths = self._expansions(node.body)
        itemsize = np.dtype(self.kernel.tensors[stmt.tensor].dtype).itemsize
        vector_bytes = max((lanes * itemsize for lanes in widths.values()), default=0)
        promotion.registers = math.prod(values.get(v, 1) for v in keys) * max(
            1, vector_bytes // VECTOR_BYTES
        )
        return promotion

    def _collect(
        self, node: AstNode, calls: list[Call], inner: dict[str, bool], loops: dict[str, str]
    ) -> bool:
        """Calls and inner loops (var → expanded into constants, var → schedule loop)
        below a node; False when something else (a guard, a parallel loop) is there."""
        if isinstance(node, Call):
            calls.append(node)
            return True
        if isinstance(node, Block):
            return all(self._collect(i, calls, inner, loops) for i in node.items)
        if isinstance(node, Mark):
            return self._collect(node.body, calls, inner, loops)
        if isinstance(node, For):
            # full and partial tiles are sibling loops of one name: expanded only if all are
            inner[node.var] = inner.get(node.var, True) and self.state.expanded(node)
            loops[node.var] = node.loop
            return self._collect(node.body, calls, inner, loops)
        return False

    def _misaligned(self, node: AstNode) -> bool:
        """Whether sibling pieces of a vector loop start apart and one ends in a masked
        vector: their accumulators would cover overlapping addresses (`ow1` from 1 to 3
        in the first tap's piece, from 0 to 3 in the others)."""
        spans: dict[str, set[tuple[int, int]]] = {}
        partial: set[str] = set()
        for loop in fors(node):
            lanes = self.state.vector_lanes(loop) if loop.annotation == "vector" else None
            if not lanes or not self.state.expanded(loop):
                continue
            assert isinstance(loop.init, Int)
            limit = exact(upper(loop))  # type: ignore[arg-type]
            assert limit is not None
            spans.setdefault(loop.var, set()).add((loop.init.value, limit))
            if (limit - loop.init.value) % lanes:
                partial.add(loop.var)
        return any(len(spans[v]) > 1 for v in partial)

    def _expansions(self, node: AstNode) -> tuple[dict[str, int], dict[str, int]]:
        """For each expanded loop below a node: how many values its copies take, and for
        a vector loop its lanes."""
        values: dict[str, int] = {}
        widths: dict[str, int] = {}
        for loop in fors(node):
            if not self.state.expanded(loop):
                continue
            assert isinstance(loop.init, Int)
            limit = exact(upper(loop))  # type: ignore[arg-type]
            trips = limit - loop.init.value  # type: ignore[operator]
            lanes = self.state.vector_lanes(loop) if loop.annotation == "vector" else None
            values[loop.var] = max(values.get(loop.var, 1), -(-trips // (lanes or 1)))
            if lanes:
                widths[loop.var] = lanes
        return values, widths

    def call(self, node: Call, env: Env, lanes: Lanes | None) -> bool:
        """Emit a call of the active promoted loop's statement into its accumulator's
        slot (opened on first use); False for any other call."""
        promotion = self.active
        if promotion is None or node.stmt != promotion.stmt:
            return False
        stmt = self.kernel.statement[node.stmt]
        t = self.kernel.tensors[stmt.tensor]
        inst = Instance(self.em, stmt, {}, lanes)
        # a reduction along the vector loop keeps a vector of partial results, its
        # lanes combined once, when written back
        shared = shares_write(stmt, lanes, flat_index(self.state.shape(t.name), stmt.index))
        values = [env[v] for v in promotion.key_vars]
        if not all(isinstance(v, ir.Constant) for v in values):
            raise CodegenError(f"kernel {self.kernel.name}: a promoted accumulator's key varies")
        constants = {v: c.constant for v, c in zip(promotion.key_vars, values, strict=True)}
        written = [
            a for d, a in zip(stmt.dims, node.args, strict=True) if d in promotion.write_dims
        ]
        # keyed by the address itself: sibling pieces of a split loop (a full tile at
        # `ow1`, the next at `ow1 + 7`) reach other accumulators at equal key values
        address = tuple(linear_terms(a, constants) for a in written)
        width = 0 if lanes is None else ("shared", lanes.count) if shared else lanes.count
        key = (address, width, promotion.part)
        slot = promotion.slots.get(key)
        if slot is None:
            slot = self.open_slot(promotion, stmt, node, env, lanes, shared, address)
            slot.values = tuple(constants.values())
            slot.piece = tuple(linear_terms(a) for a in written)
            promotion.slots[key] = slot
        dims = {d: self.em.int(a, env) for d, a in zip(stmt.dims, node.args, strict=True)}
        inst.dims = dims
        value = inst.value(stmt.expr)
        if shared:
            value = inst.unused_lanes_idle(stmt.reduction, value, t.dtype)  # type: ignore[arg-type]
        self.prefetcher.reduction_step(promotion, stmt, node, env, None if shared else lanes)
        old = self.em.b.load(slot.cell, typ=slot.type)
        value = inst.combine(stmt.reduction, old, value, t.dtype)  # type: ignore[arg-type]
        self.em.b.store(inst.splat(value), slot.cell)
        return True

    def open_slot(
        self,
        promotion: Promotion,
        stmt: Statement,
        node: Call,
        env: Env,
        lanes: Lanes | None,
        shared: bool = False,
        address: tuple = (),
    ) -> Slot:
        """Load the accumulator before the promoted loop into a stack cell (mem2reg makes
        it a register). A shared slot (`shares_write`) holds the element in lane 0 and
        the identity in the others; a slot at the address of another that merges starts
        from the identity (the other holds the element)."""
        vector_lanes = lanes
        lanes = None if shared else lanes
        merges = shared or lanes is None
        later = merges and any(
            s.merges and s.address == address and k[-1] == promotion.part
            for k, s in promotion.slots.items()
        )
        t = self.kernel.tensors[stmt.tensor]
        text = flat_index(self.state.shape(t.name), stmt.index)
        assert promotion.pre is not None
        with self.em.b.goto_block(promotion.pre):
            dims = {
                d: self.em.int(a, env)
                for d, a in zip(stmt.dims, node.args, strict=True)
                if d in promotion.write_dims
            }
            inst = Instance(self.em, stmt, dims, lanes)
            if promotion.part == 0 and promotion.initial is not None:
                init = self.kernel.statement[promotion.initial]
                if lanes is not None:
                    extra = promotion.initial_strides[self.em.enclosing[-1].loop]
                    both = Lanes(lanes.count, {**lanes.strides, **extra}, lanes.active)
                    inst = Instance(self.em, stmt, dims, both)
                value = inst.splat(inst.value(init.expr))
            elif promotion.part == 0:
                value = inst.splat(inst.load(t.name, t.dtype, text))
            else:  # a further partial sum starts from zero
                mem = memory_type(t.dtype)
                value = constant(ir.VectorType(mem, lanes.count) if lanes else mem, 0.0)
            reduction = stmt.reduction
            assert reduction is not None
            if later:
                value = lane_accumulator(inst, reduction, None, t.dtype)
            if shared:
                wide = Instance(self.em, stmt, dims, vector_lanes)
                first = None if later or promotion.part else value
                value = lane_accumulator(wide, reduction, first, t.dtype)
        # (goto_block restores the position at the end of a block: no nesting)
        with self.em.b.goto_entry_block():
            cell = self.em.b.alloca(value.type)
        with self.em.b.goto_block(promotion.pre):
            self.em.b.store(value, cell)
        return Slot(cell, value.type, dims, vector_lanes, address=address, shared=shared)

    def write_back(self, promotion: Promotion) -> None:
        """Store the accumulators after the loop; a run of them whose lanes lie rows
        apart (`row_groups`) was loaded as rows and is stored as rows."""
        stmt = self.kernel.statement[promotion.stmt]
        t = self.kernel.tensors[stmt.tensor]
        text = flat_index(self.state.shape(t.name), stmt.index)
        groups = self.row_groups(promotion, text)
        for group in groups:
            # rows as wide as the group needs: a power of two, at most the lanes
            width = 1 << (len(group) - 1).bit_length()
            if promotion.initial is None:  # (started from the init: nothing to load)
                with self.em.b.goto_block(promotion.pre):
                    first = Instance(self.em, stmt, group[0].dims, group[0].lanes)
                    rows = first.load_rows(t.name, t.dtype, text, len(group), width)
                    for slot, column in zip(group, rows_to_columns(self.em.b, rows), strict=False):
                        self.em.b.store(column, slot.cell)
            first = Instance(self.em, stmt, group[0].dims, group[0].lanes)
            columns = [self.em.b.load(slot.cell, typ=slot.type) for slot in group]
            rows = columns_to_rows(self.em.b, columns, width)
            first.store_rows(t.name, t.dtype, text, rows, len(group))
        grouped = {id(slot) for group in groups for slot in group}
        merged: dict[tuple, list[Slot]] = {}
        for slot in promotion.slots.values():
            if id(slot) in grouped:
                continue
            if slot.merges:
                merged.setdefault(slot.address, []).append(slot)
                continue
            inst = Instance(self.em, stmt, slot.dims, slot.lanes)
            inst.store(t.name, t.dtype, text, self.em.b.load(slot.cell, typ=slot.type))
        reduction = stmt.reduction
        assert reduction is not None
        for slots in merged.values():
            total = None
            for slot in slots:
                value = self.em.b.load(slot.cell, typ=slot.type)
                if slot.shared:
                    wide = Instance(self.em, stmt, slot.dims, slot.lanes)
                    value = wide.reduce_lanes(reduction, value, t.dtype)
                scalar = Instance(self.em, stmt, slots[0].dims, None)
                total = value if total is None else scalar.combine(reduction, total, value, t.dtype)
            assert total is not None
            Instance(self.em, stmt, slots[0].dims, None).store(t.name, t.dtype, text, total)

    def row_groups(self, promotion: Promotion, text: str) -> list[list[Slot]]:
        """Runs of vector accumulators one element apart along an unrolled loop whose
        lanes lie at least a run's length apart (a conv's channels in lanes, its pixel
        block unrolled): `transpose` moves them as rows. Their lane-by-lane loads, emitted
        when the accumulators were opened, are overwritten in the cells and left dead."""
        stmt = self.kernel.statement[promotion.stmt]
        if kind(self.kernel.tensors[stmt.tensor].dtype) == "b":
            return []
        for axis, loop in enumerate(promotion.key_loops):
            if self.state.stride_along(stmt, loop, text) != 1:
                continue
            runs: dict[tuple, list[tuple[int, Slot]]] = {}
            for slot in promotion.slots.values():
                lanes = slot.lanes
                if slot.shared or lanes is None or lanes.active is not None or lanes.count < 2:
                    continue  # (a masked vector is no whole row)
                if lanes.count & (lanes.count - 1):
                    continue
                v = slot.values
                run_key = (slot.piece, lanes.count, *v[:axis], *v[axis + 1 :])
                runs.setdefault(run_key, []).append((v[axis], slot))
            groups: list[list[Slot]] = []
            for members in runs.values():
                members.sort(key=lambda m: m[0])
                run = [members[0][1]]
                for (before, _), (value, slot) in pairwise(members):
                    if value == before + 1 and len(run) < _lanes(slot):
                        run.append(slot)
                        continue
                    groups.extend(_row_group(run, text))
                    run = [slot]
                groups.extend(_row_group(run, text))
            return groups
        return []


def _lanes(slot: Slot) -> int:
    return slot.lanes.count if slot.lanes is not None else 1


def _row_group(run: list[Slot], text: str) -> list[list[Slot]]:
    """The run as one group if it has two accumulators or more and each lane's row of
    them does not reach the next lane's."""
    lanes = run[0].lanes
    apart = lanes.strides.get(text) if lanes is not None else None
    return [run] if len(run) >= 2 and apart is not None and apart >= len(run) else []
