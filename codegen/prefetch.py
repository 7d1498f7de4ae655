"""Software prefetches of a kernel function, owned by its `Prefetcher` (a prefetch never
changes a value; past a tensor's end it neither faults nor fetches). Each is used only
where it pays on the targets that enable it (figures in `benchmarks/results/`):

- `prefetch_next`: a reduction run at most `PREFETCH_TILES` times per parallel
  iteration asks, per load of a constant panel, for the same line of the next
  iteration's panel.
- `prefetch_ahead` (`Target.input_ahead`): a reduction reading a vector from a new row
  of a computed tensor each step asks for the row some steps on.
- the window (`parallel_body`, `window_step`): each parallel iteration holds a range of
  lines, asked for one per step of its register-tile reductions. On targets that fetch
  weights across calls (`Target.prefetch_weights`) the range is the iteration's share of
  the next kernel's largest constant; on targets with `Target.panel_ahead` it is the next
  iteration's weight panel of a stencil reduction (`next_panel`).

The register accumulators (`codegen.promote`) ask for the per-load prefetches of each
reduction step (`reduction_step`); the loop emitter (`codegen.kernel`) opens the window
of each parallel iteration and steps it along promoted reductions."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from polytile.poly.ast.build import Call, For
from polytile.poly.ast.nodes import called
from polytile.poly.ast.quasi import flat_index
from polytile.poly.ir.expr import Load, walk
from polytile.poly.ir.kernel import Role, Statement, mentions

from .ast_facts import constant_trips
from .emission import Emitter, KernelState
from .llvm_types import I32, I64, PTR, STOP, Env, memory_type
from .values import Instance, Lanes

if TYPE_CHECKING:
    from .promote import Promotion

#: a reduction loop run at most this often per parallel iteration fetches the next
#: iteration's constants ahead; the cache line size
PREFETCH_TILES = 8
LINE_BYTES = 64
#: the smallest weight panel worth a window (smaller ones are a few lines)
MIN_PANEL_BYTES = 4096


class Prefetcher:
    """The prefetch decisions and requests of one function being emitted: constructed
    with the function (`em`, through which it emits) and the kernel's shared state, it
    holds the enclosing parallel loop and the window of the iteration being emitted."""

    def __init__(self, em: Emitter, state: KernelState) -> None:
        self.em = em
        self.state = state
        self.kernel = state.kernel
        self.target = state.target
        #: the enclosing parallel loop's iterator, schedule loop and step
        self.parallel: tuple[str, str, int] | None = None
        #: inside a parallel loop's iteration: the prefetch window's start and the cells
        #: of the iteration's next and end line (`window_step`)
        self.window: tuple[ir.Value, ir.Value, ir.Value] | None = None
        #: whether the window holds the next parallel iteration's weight panel
        self.panel = False

    def parallel_body(
        self,
        node: For,
        lo: ir.Value,
        count: ir.Value,
        stop: ir.Value,
        inner: Callable[[Env], None],
    ) -> Callable[[Env], None]:
        """The body of the parallel loop `node`'s iteration: `inner`, after the iteration
        takes its range of the prefetch window (none without a window). The reductions
        below then prefetch for the loop's next iteration."""
        inc = node.inc.value  # type: ignore[union-attr]
        self.parallel = (node.var, node.loop, inc)
        b = self.em.b
        if self.target.prefetch_weights:
            window = self.em.mc.prefetch_window()
            at = b.load(window[0], typ=PTR)
            lines = b.load(window[1], typ=I64)

            def share(scope: Env) -> tuple[ir.Value, ir.Value]:
                # this iteration's share of the next kernel's constant
                index = b.sdiv(b.sub(scope[node.var], lo), ir.Constant(I64, inc))
                first = b.sdiv(b.mul(index, lines), count)
                return first, b.sdiv(b.mul(b.add(index, ir.Constant(I64, 1)), lines), count)

        else:
            panel = self.next_panel(node) if self.target.panel_ahead else None
            if panel is None:
                return inner
            tensor, nbytes = panel
            at = self.em.ptrs[tensor]
            self.panel = True

            def share(scope: Env) -> tuple[ir.Value, ir.Value]:
                # the next iteration's panel, if this thread runs it (else none)
                index = b.sdiv(b.sub(scope[node.var], lo), ir.Constant(I64, inc))
                after = b.add(index, ir.Constant(I64, 1))
                ours = b.icmp_signed("<", b.add(scope[node.var], ir.Constant(I64, inc)), stop)
                size = ir.Constant(I64, nbytes)
                first = b.sdiv(b.mul(after, size), ir.Constant(I64, LINE_BYTES))
                last = b.add(b.mul(after, size), ir.Constant(I64, nbytes + LINE_BYTES - 1))
                end = b.sdiv(last, ir.Constant(I64, LINE_BYTES))
                none = ir.Constant(I64, 0)
                return b.select(ours, first, none), b.select(ours, end, none)

        with b.goto_entry_block():
            cursor = b.alloca(I64, name="prefetch.next")
            limit = b.alloca(I64, name="prefetch.end")
        self.window = (at, cursor, limit)

        def body(scope: Env) -> None:
            first, end = share(scope)
            b.store(first, cursor)
            b.store(end, limit)
            inner(scope)

        return body

    def next_panel(self, node: For) -> tuple[str, int] | None:
        """The constant of a stencil reduction (its index uses two or more reduced
        dimensions: a 3x3 conv's channel, row and column) of which each iteration of a
        parallel loop reads its own panel, the panels in order and tiling the tensor, as
        (tensor, panel bytes); the largest if several. Such a reduction's border tiles
        read only part of the panel (the top row skips the kernel's first row), so the
        panel comes from memory in pieces the hardware does not stream, unlike a 1x1
        conv's, read in order (there a window costs more than it saves). None where the
        kernel's activations and two panels pass L2: streaming its activations from
        memory, a kernel needs its fill buffers for them (`benchmarks/results/`)."""
        trips = constant_trips(node)
        if trips is None:
            return None
        activations = sum(
            math.prod(t.shape) * np.dtype(t.dtype).itemsize
            for t in self.kernel.tensors.values()
            if t.role is not Role.CONSTANT
        )
        best: tuple[str, int] | None = None
        for name in sorted(called(node)):
            stmt = self.kernel.statement[name]
            for e in walk(stmt.expr):
                if not isinstance(e, Load):
                    continue
                tensor = self.kernel.tensors[e.tensor]
                if tensor.role is not Role.CONSTANT:
                    continue
                used = " ".join(str(i) for i in e.index)
                if sum(1 for d in stmt.reduction_dims if mentions(used, d)) < 2:
                    continue
                text = flat_index(self.state.shape(e.tensor), e.index)  # type: ignore[arg-type]
                stride = self.state.stride_along(stmt, node.loop, text)
                if not stride or stride < 0 or stride * trips != math.prod(tensor.shape):
                    continue  # no panel of its own, or panels that do not tile it
                nbytes = stride * np.dtype(e.dtype).itemsize
                if not MIN_PANEL_BYTES <= nbytes <= self.target.prefetch_panel:
                    continue
                if activations + 2 * nbytes > self.target.l2_bytes:
                    continue
                if best is None or nbytes > best[1]:
                    best = (e.tensor, nbytes)
        return best

    def window_step(self) -> None:
        """One line of the enclosing parallel iteration's range of the window, while lines
        are left (branch-free: past its share an iteration asks for the line after it, which
        a prefetch may, and an empty window for its start, a valid line); nothing outside
        a window."""
        if self.window is None:
            return
        b = self.em.b
        at, cursor, limit = self.window
        line = b.load(cursor, typ=I64)
        end = b.load(limit, typ=I64)
        left = b.icmp_signed("<", line, end)
        ptr = b.gep(at, [b.mul(line, ir.Constant(I64, LINE_BYTES))], source_etype=ir.IntType(8))
        fn = self.em.mc.function("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        # a read, to the outer caches (locality 1), of data
        b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 1), ir.Constant(I32, 1)])
        b.store(b.add(line, b.zext(left, I64)), cursor)

    def fetches_next(self) -> bool:
        """Whether the reduction loop being entered asks, per load, for the next parallel
        iteration's constants (`prefetch_next`): where it runs few times per iteration
        and no window already fetches the next iteration's panel along its steps."""
        return self.streams_per_iteration() and not self.panel

    def reduction_step(
        self, promotion: Promotion, stmt: Statement, node: Call, env: Env, lanes: Lanes | None
    ) -> None:
        """The prefetches of one promoted reduction call: the next parallel iteration's
        constants (`prefetch_next`) and the rows `Target.input_ahead` steps on
        (`prefetch_ahead`), where each applies."""
        if promotion.prefetch:
            self.prefetch_next(promotion, stmt, node, env, lanes)
        if self.target.input_ahead and promotion.loop is not None:
            self.prefetch_ahead(promotion, stmt, node, env, lanes)

    def streams_per_iteration(self) -> bool:
        """Whether the reduction loop being entered runs at most `PREFETCH_TILES` times
        per iteration of the enclosing parallel loop (a layer-4 1×1 conv: a weight panel
        per channel block, read by its few pixel tiles): then the panel of the next
        iteration is worth fetching ahead (`prefetch_next`). Run more often, the same
        lines would be asked for again and again."""
        if self.parallel is None:
            return False
        runs = 1
        for loop in self.em.enclosing[:-1]:
            trips = constant_trips(loop)
            if trips is None:
                return False
            runs *= max(1, trips)
        return runs <= PREFETCH_TILES

    def prefetch_next(
        self, promotion: Promotion, stmt: Statement, node: Call, env: Env, lanes: Lanes | None
    ) -> None:
        """Ask for the constants the next iteration of the enclosing parallel loop will
        read, into L2, while this one computes: otherwise the first tile of each channel
        block reads its weight panel from memory while the block's other tiles leave
        memory idle. One request per cache line, from the first of the unrolled copies
        that read the same line."""
        assert self.parallel is not None
        var, loop, step = self.parallel
        if var not in env or STOP not in env:
            return
        for e in walk(stmt.expr):
            if not isinstance(e, Load) or self.kernel.tensors[e.tensor].role is not Role.CONSTANT:
                continue
            text = flat_index(self.state.shape(e.tensor), e.index)  # type: ignore[arg-type]
            size = np.dtype(e.dtype).itemsize
            contiguous = lanes is not None and lanes.strides.get(text) == 1
            count = lanes.count if contiguous and lanes is not None else 1
            panel = self.state.stride_along(stmt, loop, text)
            largest = self.target.prefetch_panel
            if not panel or count * size < LINE_BYTES or abs(panel) * size > largest:
                # the same panel for every iteration, a line read over several iterations
                # (asked for again each time), or a panel L2 would not hold twice
                continue
            if not self.first_copy(promotion, stmt, env, text):
                continue
            # the next iteration of this thread's chunk (past its end, another thread's
            # iteration: this one's own lines instead, which are cached already)
            after = self.em.b.add(env[var], ir.Constant(I64, step))
            inside = self.em.b.icmp_signed("<", after, env[STOP])
            ahead = {**env, var: self.em.b.select(inside, after, env[var])}
            dims = {d: self.em.int(a, ahead) for d, a in zip(stmt.dims, node.args, strict=True)}
            offset = Instance(self.em, stmt, dims, lanes).offset(text)
            # kept in L2 (locality 2)
            self.prefetch_lines(e.tensor, e.dtype, offset, count * size, 2)

    def first_copy(self, promotion: Promotion, stmt: Statement, env: Env, text: str) -> bool:
        """Whether the unrolled copy being emitted is the first of those that read the
        same address (the key loops along which it does not move), which asks for its
        lines for all of them."""
        repeated = [
            v
            for v, key_loop in zip(promotion.key_vars, promotion.key_loops, strict=True)
            if self.state.stride_along(stmt, key_loop, text) == 0
        ]
        first = promotion.first_key
        return all(first.setdefault(v, env[v].constant) == env[v].constant for v in repeated)

    def prefetch_lines(
        self, tensor: str, dtype: str, offset: ir.Value, nbytes: int, locality: int
    ) -> None:
        """A read prefetch of each line of `nbytes` from the element at `offset` (of a
        private temporary: in the running thread's slice, as its loads are)."""
        size = np.dtype(dtype).itemsize
        shift = self.em.shift.get(tensor)
        if shift is not None:
            offset = self.em.ints.add(offset, shift)
        fn = self.em.mc.function("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        for line in range(0, nbytes, LINE_BYTES):
            at = self.em.ints.add(offset, ir.Constant(I64, line // size))
            ptr = self.em.b.gep(self.em.ptrs[tensor], [at], source_etype=memory_type(dtype))
            # a read (0), of data (1)
            self.em.b.call(
                fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)]
            )

    def prefetch_ahead(
        self, promotion: Promotion, stmt: Statement, node: Call, env: Env, lanes: Lanes | None
    ) -> None:
        """Ask for the lines a reduction step `Target.input_ahead` steps on reads of
        a computed tensor, into L1, where each step reads a vector from a new row: the
        hardware's streams follow lines in order, not rows apart, and in a model such
        an input is seldom all in the core's L2 (a 1x1 conv over pixel vectors).
        Constants are left to
        `prefetch_next`, broadcasts (a 3x3 conv over channel vectors reads a scalar a
        step) are not worth an instruction each. Past the tensor's end a prefetch is
        harmless (no fault, no effect)."""
        assert promotion.loop is not None
        var, loop, step = promotion.loop
        if var not in env or lanes is None:
            return  # no vector, no row read a step
        for e in walk(stmt.expr):
            if not isinstance(e, Load) or self.kernel.tensors[e.tensor].role is Role.CONSTANT:
                continue
            text = flat_index(self.state.shape(e.tensor), e.index)  # type: ignore[arg-type]
            if lanes.strides.get(text) != 1:
                continue  # a broadcast or gathered lanes
            size = np.dtype(e.dtype).itemsize
            stride = self.state.stride_along(stmt, loop, text)
            if not stride or abs(stride) * size < LINE_BYTES:
                continue
            if not self.first_copy(promotion, stmt, env, text):
                continue
            later = self.em.b.add(env[var], ir.Constant(I64, step * self.target.input_ahead))
            ahead = {**env, var: later}
            dims = {d: self.em.int(a, ahead) for d, a in zip(stmt.dims, node.args, strict=True)}
            offset = Instance(self.em, stmt, dims, lanes).offset(text)
            # into L1 (locality 3)
            self.prefetch_lines(e.tensor, e.dtype, offset, lanes.count * size, 3)
