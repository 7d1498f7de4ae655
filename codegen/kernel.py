"""A kernel under a schedule → one LLVM function, `void name(ptr noalias t0, ...)` with one
pointer per tensor in `kernel.tensors` order.

The loop AST comes from isl (`poly.ast.build_ast`). Loop marks decide the code:
- `vector`: explicit vector code. Each address's stride along the loop is decided
  exactly by isl (`poly.strides`): stride 1 is a vector load / store, 0 a broadcast,
  others gather lane by lane; a statement without uniform strides (or with an indirect
  load) runs lane by lane. A scalar loop finishes the iterations a full vector misses.
- `unroll`: the body is emitted once per iteration when the trip count is a constant.
- `parallel`: the loop body is outlined and run by `GOMP_parallel`; threads claim its
  iterations in guided chunks from a shared counter.

Floating point follows the expressions exactly; only `contract` (FMA) is allowed.
Integer division by zero yields 0 instead of trapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from llvmlite import ir

from polytile.errors import CodegenError
from polytile.poly.ast import AstExpr, AstNode, Block, Call, For, If, Int, Mark, Op, Var, build_ast
from polytile.poly.contract import Private, private_temporaries
from polytile.poly.expr import Iter, Load, walk
from polytile.poly.kernel import Kernel, Statement, mentions
from polytile.poly.quasi import flat_index
from polytile.poly.schedule import Schedule
from polytile.poly.strides import lane_strides

from .llvm_types import I32, I64, PTR, ModuleContext, kind
from .transpose import columns_to_rows, rows_to_columns
from .values import Instance, Lanes

#: unroll marks on loops with more iterations than this stay loops
MAX_UNROLL = 64
#: environment entries that carry a private temporary's offset shift into outlined code
SHIFT = "%shift:"
#: the environment entry of the thread running the enclosing parallel loop's iteration
THREAD = "%thread"

Env = dict[str, ir.Value]


@dataclass(frozen=True)
class KernelFunction:
    name: str
    #: tensor names in argument order
    params: tuple[str, ...]


def emit_kernel(mc: ModuleContext, schedule: Schedule, name: str) -> KernelFunction:
    kernel = schedule.kernel
    params = tuple(kernel.tensors)
    fn = ir.Function(mc.module, ir.FunctionType(ir.VoidType(), [PTR] * len(params)), name=name)
    for arg in fn.args:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    ast = build_ast(schedule)
    shared = _Shared()
    for private in private_temporaries(schedule, ast):
        # fewer slices than threads would leave threads idle: keep the full storage
        if private.slots < mc.target.num_threads:
            continue
        shared.private.setdefault(private.loop, []).append(private)
        shared.layout[private.tensor] = private.shape
        for loop in (*private.outer, private.loop):
            if schedule.loop(loop).annotation == "parallel":
                shared.slots[loop] = min(shared.slots.get(loop, private.slots), private.slots)
    ptrs = dict(zip(params, fn.args, strict=True))
    emitter = _Emitter(mc, schedule, fn, ptrs, name, False, shared)
    emitter.node(ast, {})
    emitter.b.ret_void()
    return KernelFunction(name, params)


@dataclass
class _Shared:
    """What the emitters of one kernel (the function and its outlined bodies) share."""

    strides: dict[tuple[str, str], dict[str, int | None] | None] = field(default_factory=dict)
    #: loop → the temporaries stored in one slice per thread inside each iteration
    private: dict[str, list[Private]] = field(default_factory=dict)
    #: tensor → the shape its offsets are computed in: a private temporary's slice box
    layout: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: parallel loop → the fewest slices of the private temporaries in or below it
    slots: dict[str, int] = field(default_factory=dict)


class _Emitter:
    def __init__(
        self,
        mc: ModuleContext,
        schedule: Schedule,
        fn: ir.Function,
        ptrs: Mapping[str, ir.Value],
        base: str,
        in_parallel: bool = False,
        shared: _Shared | None = None,
    ) -> None:
        self.mc = mc
        self.schedule = schedule
        self.kernel: Kernel = schedule.kernel
        self.fn = fn
        self.ptrs = dict(ptrs)
        self.base = base
        self.in_parallel = in_parallel
        self.shared = shared or _Shared()
        self.promotion: _Promotion | None = None
        #: tensor → elements added to its offsets (a private temporary's slice)
        self.shift: dict[str, ir.Value] = {}
        entry = fn.append_basic_block("entry") if not fn.blocks else fn.blocks[-1]
        self.b = ir.IRBuilder(entry)

    def shape(self, tensor: str) -> tuple[int, ...]:
        """The shape the tensor's offsets are computed in (a private temporary's box)."""
        return self.shared.layout.get(tensor) or self.kernel.tensors[tensor].shape

    # --- loop structure ---------------------------------------------------------------
    def node(self, node: AstNode, env: Env) -> None:
        if isinstance(node, Block):
            for item in node.items:
                self.node(item, env)
        elif isinstance(node, Mark):
            self.node(node.body, env)
        elif isinstance(node, If):
            cond = self.cond(node.cond, env)
            if node.orelse is None:
                with self.b.if_then(cond):
                    self.node(node.then, env)
            else:
                with self.b.if_else(cond) as (then, otherwise):
                    with then:
                        self.node(node.then, env)
                    with otherwise:
                        self.node(node.orelse, env)
        elif isinstance(node, For):
            self.loop(node, env)
        elif isinstance(node, Call):
            self.call(node, env)
        else:
            raise CodegenError(f"kernel {self.kernel.name}: unknown AST node {node!r}")

    def loop(self, node: For, env: Env) -> None:
        serial_only = self.in_parallel or not self.mc.threading
        if node.annotation == "parallel" and not serial_only and self.parallel_loop(node, env):
            return
        if node.annotation == "vector" and self.vector_loop(node, env):
            return
        if node.annotation == "unroll" and self.unrolled_loop(node, env):
            return
        promotion = self.promotable(node) if self.promotion is None else None
        if promotion is None:
            self.serial_loop(node, env, self.int(node.init, env), node.cond, 1, self.body_of(node))
            return
        pre = self.b.append_basic_block(f"{node.var}.acc")
        self.b.branch(pre)
        self.b.position_at_end(pre)
        promotion.pre = pre
        self.promotion = promotion
        try:
            self.serial_loop(node, env, self.int(node.init, env), node.cond, 1, self.body_of(node))
        finally:
            self.promotion = None
        self.write_back(promotion)

    # --- accumulators in registers ------------------------------------------------------
    def promotable(self, node: For) -> _Promotion | None:
        """A loop whose body only accumulates into addresses that stay fixed while it
        runs (the reduction loops of a register tile): those accumulators are read
        before the loop, kept in SSA values and written after it."""
        calls: list[Call] = []
        inner: dict[str, bool] = {}
        loops: dict[str, str] = {}
        if not self._collect(node.body, calls, inner, loops):
            return None
        if not calls or len({c.stmt for c in calls}) != 1:
            return None
        stmt = self.kernel.statement[calls[0].stmt]
        if stmt.reduction is None or any(
            isinstance(e, Load) and e.tensor == stmt.tensor for e in walk(stmt.expr)
        ):
            return None
        write_dims = [d for d in stmt.dims if any(mentions(i, d) for i in stmt.index)]
        key_vars: set[str] = set()
        for call in calls:
            for dim, arg in zip(stmt.dims, call.args, strict=True):
                if dim not in write_dims:
                    continue
                used = _vars(arg)
                if node.var in used or any(not inner[v] for v in used if v in inner):
                    return None
                expanded = [v for v in used if v in inner]
                if len(expanded) > 1 or (expanded and not _linear_in(arg, expanded[0])):
                    return None
                key_vars.update(expanded)
        keys = tuple(sorted(key_vars))
        return _Promotion(stmt.name, keys, tuple(write_dims), tuple(loops[v] for v in keys))

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
            inner[node.var] = inner.get(node.var, True) and self._expanded(node)
            loops[node.var] = node.loop
            return self._collect(node.body, calls, inner, loops)
        return False

    def _expanded(self, node: For) -> bool:
        """Whether codegen emits the loop as straight-line copies with constant values."""
        if not isinstance(node.init, Int) or node.inc != Int(1):
            return False
        bound = _upper(node)
        limit = _exact(bound) if bound is not None else None
        if limit is None:
            return False
        trips = limit - node.init.value
        if node.annotation == "unroll":
            return 0 < trips <= MAX_UNROLL
        if node.annotation == "vector":
            lanes = self.vector_lanes(node)
            return lanes is not None and trips % lanes == 0 and trips // lanes <= MAX_UNROLL
        return False

    def promoted_call(self, node: Call, env: Env, lanes: Lanes | None) -> bool:
        promotion = self.promotion
        if promotion is None or node.stmt != promotion.stmt:
            return False
        stmt = self.kernel.statement[node.stmt]
        t = self.kernel.tensors[stmt.tensor]
        values = [env[v] for v in promotion.key_vars]
        if not all(isinstance(v, ir.Constant) for v in values):
            raise CodegenError(f"kernel {self.kernel.name}: a promoted accumulator's key varies")
        key = (*(v.constant for v in values), lanes.count if lanes is not None else 0)
        slot = promotion.slots.get(key)
        if slot is None:
            slot = self.open_slot(promotion, stmt, node, env, lanes)
            promotion.slots[key] = slot
        inst = Instance(self, stmt, {}, lanes)
        dims = {d: self.int(a, env) for d, a in zip(stmt.dims, node.args, strict=True)}
        inst.dims = dims
        value = inst.value(stmt.expr)
        old = self.b.load(slot.cell, typ=slot.type)
        value = inst.combine(stmt.reduction, old, value, t.dtype)  # type: ignore[arg-type]
        self.b.store(inst.splat(value), slot.cell)
        return True

    def open_slot(
        self, promotion: _Promotion, stmt: Statement, node: Call, env: Env, lanes: Lanes | None
    ) -> _Slot:
        """Load the accumulator before the promoted loop into a stack cell (mem2reg makes
        it a register)."""
        t = self.kernel.tensors[stmt.tensor]
        text = flat_index(self.shape(t.name), stmt.index)
        assert promotion.pre is not None
        with self.b.goto_block(promotion.pre):
            dims = {
                d: self.int(a, env)
                for d, a in zip(stmt.dims, node.args, strict=True)
                if d in promotion.write_dims
            }
            inst = Instance(self, stmt, dims, lanes)
            value = inst.splat(inst.load(t.name, t.dtype, text))
        # (goto_block restores the position at the end of a block: no nesting)
        with self.b.goto_entry_block():
            cell = self.b.alloca(value.type)
        with self.b.goto_block(promotion.pre):
            self.b.store(value, cell)
        return _Slot(cell, value.type, dims, lanes)

    def write_back(self, promotion: _Promotion) -> None:
        """Store the accumulators after the loop; a run of them whose lanes lie rows
        apart (`row_groups`) was loaded as rows and is stored as rows."""
        stmt = self.kernel.statement[promotion.stmt]
        t = self.kernel.tensors[stmt.tensor]
        text = flat_index(self.shape(t.name), stmt.index)
        groups = self.row_groups(promotion, text)
        for group in groups:
            # rows as wide as the group needs: a power of two, at most the lanes
            width = 1 << (len(group) - 1).bit_length()
            with self.b.goto_block(promotion.pre):
                first = Instance(self, stmt, group[0].dims, group[0].lanes)
                rows = first.load_rows(t.name, t.dtype, text, len(group), width)
                for slot, column in zip(group, rows_to_columns(self.b, rows), strict=False):
                    self.b.store(column, slot.cell)
            first = Instance(self, stmt, group[0].dims, group[0].lanes)
            columns = [self.b.load(slot.cell, typ=slot.type) for slot in group]
            rows = columns_to_rows(self.b, columns, width)
            first.store_rows(t.name, t.dtype, text, rows, len(group))
        grouped = {id(slot) for group in groups for slot in group}
        for slot in promotion.slots.values():
            if id(slot) in grouped:
                continue
            inst = Instance(self, stmt, slot.dims, slot.lanes)
            inst.store(t.name, t.dtype, text, self.b.load(slot.cell, typ=slot.type))

    def row_groups(self, promotion: _Promotion, text: str) -> list[list[_Slot]]:
        """Runs of vector accumulators one element apart along an unrolled loop whose
        lanes lie at least a run's length apart (a conv's channels in lanes, its pixel
        block unrolled): `transpose` moves them as rows. Their lane-by-lane loads, emitted
        when the accumulators were opened, are overwritten in the cells and left dead."""
        stmt = self.kernel.statement[promotion.stmt]
        if kind(self.kernel.tensors[stmt.tensor].dtype) == "b":
            return []
        for axis, loop in enumerate(promotion.key_loops):
            if lane_strides(self.schedule, stmt.name, loop, {text: text})[text] != 1:
                continue
            runs: dict[tuple, list[tuple[int, _Slot]]] = {}
            for key, slot in promotion.slots.items():
                lanes = slot.lanes
                if lanes is None or lanes.count & (lanes.count - 1) or lanes.count < 2:
                    continue
                runs.setdefault((*key[:axis], *key[axis + 1 :]), []).append((key[axis], slot))
            groups: list[list[_Slot]] = []
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

    def body_of(self, node: For) -> Callable[[Env], None]:
        """The loop body; in a loop with private temporaries, their offsets move to the
        slice of the thread running the enclosing parallel loop (or 0) for each
        iteration."""
        privates = self.shared.private.get(node.loop, [])
        if not privates:
            return lambda env: self.node(node.body, env)

        def body(env: Env) -> None:
            first = env.get(THREAD, ir.Constant(I64, 0))
            saved = dict(self.shift)
            scope = dict(env)
            for p in privates:
                start = self.b.mul(first, ir.Constant(I64, p.span), flags=["nsw"])
                shift = self.b.sub(start, self.int(p.origin, env), flags=["nsw"])
                self.shift[p.tensor] = shift
                scope[f"{SHIFT}{p.tensor}"] = shift
            self.node(node.body, scope)
            self.shift = saved

        return body

    def serial_loop(
        self,
        node: For,
        env: Env,
        start: ir.Value,
        cond: AstExpr,
        lanes: int,
        body: Callable[[Env], None],
    ) -> ir.Value:
        """`for (v = start; cond(v + lanes - 1); v += lanes*inc) body`; returns the value
        of v when the loop exits."""
        b = self.b
        pre = b.block
        header = b.append_basic_block(f"{node.var}.head")
        inner = b.append_basic_block(f"{node.var}.body")
        done = b.append_basic_block(f"{node.var}.done")
        b.branch(header)
        b.position_at_end(header)
        v = b.phi(I64, name=node.var)
        v.add_incoming(start, pre)
        last = v if lanes == 1 else b.add(v, ir.Constant(I64, lanes - 1), flags=["nsw"])
        b.cbranch(self.cond(cond, {**env, node.var: last}), inner, done)
        b.position_at_end(inner)
        scope = {**env, node.var: v}
        body(scope)
        step = self.int(node.inc, scope)
        if lanes != 1:
            step = b.mul(step, ir.Constant(I64, lanes), flags=["nsw"])
        v.add_incoming(b.add(v, step, flags=["nsw"]), b.block)
        b.branch(header)
        b.position_at_end(done)
        return v

    def unrolled_loop(self, node: For, env: Env) -> bool:
        bound = _upper(node)
        start = _constant_lower(node.init)
        if start is None or not isinstance(node.inc, Int) or bound is None:
            return False
        limit = _constant_bound(bound)
        if limit is None or node.inc.value <= 0:
            return False
        if not isinstance(node.init, Int) and node.inc.value != 1:
            return False
        values = range(start, limit, node.inc.value)
        if len(values) > MAX_UNROLL:
            return False
        exact = _exact(bound) is not None and isinstance(node.init, Int)
        for value in values:
            scope = {**env, node.var: ir.Constant(I64, value)}
            if exact:
                self.node(node.body, scope)
                continue
            cond = node.cond
            if not isinstance(node.init, Int):
                cond = Op("and", (Op("ge", (Var(node.var), node.init)), cond))
            with self.b.if_then(self.cond(cond, scope)):
                self.node(node.body, scope)
        return True

    def parallel_loop(self, node: For, env: Env) -> bool:
        """Outline the loop into `body(ctx)`; the threads take its iterations in guided
        chunks from a shared counter in the context."""
        bound = _upper(node)
        if bound is None or not isinstance(node.inc, Int) or node.inc.value <= 0:
            return False
        b = self.b
        names = sorted(env)
        slots = [*self.ptrs.values(), *(env[n] for n in names), ir.Constant(I64, 0)]
        ctx_type = ir.LiteralStructType([PTR] * len(self.ptrs) + [I64] * (len(names) + 1))
        with b.goto_entry_block():
            ctx = b.alloca(ctx_type, name="ctx")
        for i, value in enumerate(slots):
            b.store(value, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        outlined = ir.Function(
            self.mc.module, ir.FunctionType(ir.VoidType(), [PTR]), self.mc.outlined_name(self.base)
        )
        outlined.linkage = "internal"
        outlined.attributes.add("nounwind")
        # the body takes the tensors as noalias arguments: pointers loaded from the
        # context carry no alias facts, and without them no accumulator stays in a register
        fields = list(ctx_type.elements)[:-1]
        body_fn = ir.Function(
            self.mc.module,
            ir.FunctionType(ir.VoidType(), [*fields, PTR]),
            f"{outlined.name}_body",
        )
        body_fn.linkage = "internal"
        body_fn.attributes.add("nounwind")
        for arg in body_fn.args[: len(self.ptrs)]:
            arg.add_attribute("noalias")
        ob = ir.IRBuilder(outlined.append_basic_block("entry"))

        def field_ptr(i: int) -> ir.Value:
            return ob.gep(
                outlined.args[0], [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=ctx_type
            )

        loaded = [ob.load(field_ptr(i), typ=t) for i, t in enumerate(fields)]
        ob.call(body_fn, [*loaded, field_ptr(len(fields))])
        ob.ret_void()
        inner = _Emitter(self.mc, self.schedule, body_fn, {}, self.base, True, self.shared)
        args = list(body_fn.args)
        inner.ptrs = dict(zip(self.ptrs, args[: len(self.ptrs)], strict=True))
        scope = dict(zip(names, args[len(self.ptrs) : -1], strict=True))
        inner.shift = {n.removeprefix(SHIFT): v for n, v in scope.items() if n.startswith(SHIFT)}
        inner.chunks(node, scope, bound, args[-1])
        inner.b.ret_void()
        self.mc.run_parallel(b, outlined, ctx)
        return True

    def chunks(self, node: For, env: Env, bound: AstExpr, counter: ir.Value) -> None:
        """Guided self-scheduling: each thread claims `max(1, left / (2 * threads))`
        iterations at a time until none are left. A thread the machine delays (a busy or
        preempted core) takes fewer chunks instead of holding every other thread at the
        join, and the chunks shrink so the threads finish together."""
        b = self.b
        lo = self.int(node.init, env)
        hi = self.int(bound, env)
        inc = node.inc.value  # type: ignore[union-attr]
        span = b.sub(hi, lo)
        count = b.sdiv(b.add(span, ir.Constant(I64, inc - 1)), ir.Constant(I64, inc))
        count = _smax(b, count, ir.Constant(I64, 0))
        thread = b.sext(b.call(self.mc.function("omp_get_thread_num", I32, []), []), I64)
        threads = b.sext(b.call(self.mc.function("omp_get_num_threads", I32, []), []), I64)
        share = b.mul(threads, ir.Constant(I64, 2))
        claim = b.append_basic_block(f"{node.var}.claim")
        take = b.append_basic_block(f"{node.var}.take")
        run = b.append_basic_block(f"{node.var}.run")
        done = b.append_basic_block(f"{node.var}.all")
        slots = self.shared.slots.get(node.loop)
        if slots is not None:
            # a thread without a slice of every private temporary takes no iterations
            b.cbranch(b.icmp_signed("<", thread, ir.Constant(I64, slots)), claim, done)
        else:
            b.branch(claim)
        b.position_at_end(claim)
        first = b.load_atomic(counter, "monotonic", 8, typ=I64)
        b.cbranch(b.icmp_signed("<", first, count), take, done)
        b.position_at_end(take)
        left = b.sub(count, first)
        size = _smax(b, b.sdiv(left, share), ir.Constant(I64, 1))
        last = _smin(b, b.add(first, size), count)
        pair = b.cmpxchg(counter, first, last, "monotonic", "monotonic")
        b.cbranch(b.extract_value(pair, 1), run, claim)
        b.position_at_end(run)
        start = b.add(lo, b.mul(first, ir.Constant(I64, inc)))
        stop = b.add(lo, b.mul(last, ir.Constant(I64, inc)))
        chunk_cond = Op("lt", (Var(node.var), Var("%stop")))
        body = self.body_of(node)
        scope = {**env, "%stop": stop, THREAD: thread}
        self.serial_loop(node, scope, start, chunk_cond, 1, body)
        b.branch(claim)
        b.position_at_end(done)

    # --- vector loops -----------------------------------------------------------------
    def vector_lanes(self, node: For) -> int | None:
        """Lanes of a vector loop: one register of the narrowest type, fewer when the
        loop is shorter; None when it cannot run as vectors."""
        calls = _calls(node.body)
        if calls is None or node.inc != Int(1):
            return None
        dtypes = set()
        for call in calls:
            stmt = self.kernel.statement[call.stmt]
            dtypes.add(self.kernel.tensors[stmt.tensor].dtype)
            dtypes.update(e.dtype for e in walk(stmt.expr))
        lanes = min(self.mc.target.lanes(d) for d in dtypes)
        bound = _upper(node)
        limit = _constant_bound(bound) if bound is not None else None
        if limit is not None and isinstance(node.init, Int):
            trips = limit - node.init.value
            lanes = min(lanes, 1 << max(trips, 1).bit_length() - 1)
        return lanes if lanes >= 2 else None

    def vector_loop(self, node: For, env: Env) -> bool:
        lanes = self.vector_lanes(node)
        calls = _calls(node.body)
        if lanes is None or calls is None:
            return False
        loop = node.loop
        plans = {
            call.stmt: self.vector_plan(self.kernel.statement[call.stmt], loop) for call in calls
        }

        def vector_body(scope: Env) -> None:
            for call in calls:
                plan = plans[call.stmt]
                if plan is None:
                    for lane in range(lanes):
                        lane_scope = {**scope, node.var: self._plus(scope[node.var], lane)}
                        self.call(call, lane_scope)
                else:
                    self.call(call, scope, Lanes(lanes, plan))

        if self._expanded(node):
            # constant trip count, a multiple of the lanes: straight-line vectors
            assert isinstance(node.init, Int)
            bound = _upper(node)
            limit = _exact(bound) if bound is not None else None
            assert limit is not None
            for start in range(node.init.value, limit, lanes):
                vector_body({**env, node.var: ir.Constant(I64, start)})
            return True
        end = self.serial_loop(node, env, self.int(node.init, env), node.cond, lanes, vector_body)
        self.serial_loop(node, env, end, node.cond, 1, self.body_of(node))
        return True

    def vector_plan(self, stmt: Statement, loop: str) -> dict[str, int | None] | None:
        """Lane strides of every address and dimension the statement uses, or None when
        it must run lane by lane."""
        key = (stmt.name, loop)
        if key in self.shared.strides:
            return self.shared.strides[key]
        exprs: dict[str, str] = {}
        plan: dict[str, int | None] | None = None
        indirect = False
        write = self.kernel.tensors[stmt.tensor]
        exprs[flat_index(self.shape(write.name), stmt.index)] = ""
        for e in walk(stmt.expr):
            if isinstance(e, Load):
                if not all(isinstance(i, str) for i in e.index):
                    indirect = True
                    break
                exprs[flat_index(self.shape(e.tensor), e.index)] = ""  # type: ignore[arg-type]
            elif isinstance(e, Iter):
                exprs[e.name] = ""
        if not indirect and loop:
            found = lane_strides(self.schedule, stmt.name, loop, {t: t for t in exprs})
            if all(v is not None for v in found.values()):
                plan = found
        self.shared.strides[key] = plan
        return plan

    def _plus(self, value: ir.Value, n: int) -> ir.Value:
        """value + n, folded when value is a constant (promoted accumulators of expanded
        loops are keyed by their iterators' constant values)."""
        if isinstance(value, ir.Constant) and isinstance(value.constant, int):
            return ir.Constant(I64, value.constant + n)
        return value if n == 0 else self.b.add(value, ir.Constant(I64, n), flags=["nsw"])

    # --- statements -------------------------------------------------------------------
    def call(self, node: Call, env: Env, lanes: Lanes | None = None) -> None:
        if self.promoted_call(node, env, lanes):
            return
        stmt = self.kernel.statement[node.stmt]
        dims = {d: self.int(a, env) for d, a in zip(stmt.dims, node.args, strict=True)}
        inst = Instance(self, stmt, dims, lanes)
        value = inst.value(stmt.expr)
        t = self.kernel.tensors[stmt.tensor]
        text = flat_index(self.shape(t.name), stmt.index)
        if stmt.reduction is not None:
            old = inst.load(t.name, t.dtype, text)
            value = inst.combine(stmt.reduction, old, value, t.dtype)
        inst.store(t.name, t.dtype, text, value)

    # --- integer AST expressions ------------------------------------------------------
    def int(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value:
        b = self.b
        if isinstance(e, Int):
            return ir.Constant(I64, e.value)
        if isinstance(e, Var):
            try:
                return env[e.name]
            except KeyError:
                raise CodegenError(f"kernel {self.kernel.name}: '{e.name}' is unbound") from None
        op = e.op
        if op in ("eq", "le", "lt", "ge", "gt", "and", "or"):
            return b.zext(self.cond(e, env), I64)
        args = [self.int(a, env) for a in e.args]
        if op == "add":
            return b.add(args[0], args[1], flags=["nsw"])
        if op == "sub":
            return b.sub(args[0], args[1], flags=["nsw"])
        if op == "mul":
            return b.mul(args[0], args[1], flags=["nsw"])
        if op == "minus":
            return b.sub(ir.Constant(I64, 0), args[0], flags=["nsw"])
        if op == "min":
            return _fold(args, lambda x, y: _smin(b, x, y))
        if op == "max":
            return _fold(args, lambda x, y: _smax(b, x, y))
        if op == "select":
            return b.select(self.cond(e.args[0], env), args[1], args[2])
        if op == "fdiv_q":
            return _floordiv(b, args[0], args[1], e.args[1])
        if op in ("div", "pdiv_q"):
            return b.sdiv(args[0], args[1])
        if op in ("pdiv_r", "zdiv_r"):
            return b.srem(args[0], args[1])
        raise CodegenError(f"kernel {self.kernel.name}: isl AST operator '{op}' is not supported")

    def cond(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value:
        b = self.b
        if isinstance(e, Op):
            compare = {"eq": "==", "le": "<=", "lt": "<", "ge": ">=", "gt": ">"}
            if e.op in compare:
                return b.icmp_signed(
                    compare[e.op], self.int(e.args[0], env), self.int(e.args[1], env)
                )
            if e.op in ("and", "or"):
                parts = [self.cond(a, env) for a in e.args]
                join = b.and_ if e.op == "and" else b.or_
                return _fold(parts, join)
        return b.icmp_signed("!=", self.int(e, env), ir.Constant(I64, 0))


@dataclass
class _Slot:
    """One promoted accumulator: its stack cell and where it lives in memory."""

    cell: ir.Value
    type: ir.Type
    dims: dict[str, ir.Value]
    lanes: Lanes | None


@dataclass
class _Promotion:
    stmt: str
    #: expanded inner loops the accumulator's address depends on
    key_vars: tuple[str, ...]
    write_dims: tuple[str, ...]
    #: the schedule loops of `key_vars`
    key_loops: tuple[str, ...] = ()
    pre: ir.Block | None = None
    slots: dict[tuple, _Slot] = field(default_factory=dict)


# --- helpers -----------------------------------------------------------------------------
def _lanes(slot: _Slot) -> int:
    return slot.lanes.count if slot.lanes is not None else 1


def _row_group(run: list[_Slot], text: str) -> list[list[_Slot]]:
    """The run as one group if it has two accumulators or more and each lane's row of
    them does not reach the next lane's."""
    lanes = run[0].lanes
    apart = lanes.strides.get(text) if lanes is not None else None
    return [run] if len(run) >= 2 and apart is not None and apart >= len(run) else []


def _calls(node: AstNode) -> list[Call] | None:
    if isinstance(node, Call):
        return [node]
    if isinstance(node, Block) and all(isinstance(i, Call) for i in node.items):
        return list(node.items)  # type: ignore[arg-type]
    return None


def _vars(e: AstExpr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Op):
        return set().union(*(_vars(a) for a in e.args))
    return set()


def _linear_in(e: AstExpr, var: str) -> bool:
    """`e` is `var` plus / minus terms without it, or an integer multiple of that: then
    distinct values of `var` give distinct values of `e`."""
    if e == Var(var):
        return True
    if isinstance(e, Op) and e.op in ("add", "sub"):
        a, c = e.args
        if var not in _vars(c):
            return _linear_in(a, var)
        return e.op == "add" and var not in _vars(a) and _linear_in(c, var)
    if isinstance(e, Op) and e.op == "mul":
        a, c = e.args
        if isinstance(a, Int) and a.value != 0:
            return _linear_in(c, var)
        if isinstance(c, Int) and c.value != 0:
            return _linear_in(a, var)
    return False


def _upper(node: For) -> AstExpr | None:
    """The exclusive upper bound of a loop whose condition bounds its iterator above."""
    return _bound(node.cond, node.var)


def _bound(cond: AstExpr, var: str) -> AstExpr | None:
    if isinstance(cond, Op) and cond.op in ("lt", "le") and cond.args[0] == Var(var):
        limit = cond.args[1]
        if _mentions(limit, var):
            return None
        return limit if cond.op == "lt" else Op("add", (limit, Int(1)))
    if isinstance(cond, Op) and cond.op == "and":
        parts = [_bound(a, var) for a in cond.args]
        if any(p is None for p in parts):
            return None
        return Op("min", tuple(parts))  # type: ignore[arg-type]
    return None


def _mentions(e: AstExpr, var: str) -> bool:
    if isinstance(e, Var):
        return e.name == var
    if isinstance(e, Op):
        return any(_mentions(a, var) for a in e.args)
    return False


def _constant_bound(e: AstExpr) -> int | None:
    """A constant upper bound of an expression built of ints, min and +."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Op) and e.op == "min":
        found = [_constant_bound(a) for a in e.args]
        known = [f for f in found if f is not None]
        return min(known) if known else None
    if isinstance(e, Op) and e.op == "add":
        parts = [_constant_bound(a) for a in e.args]
        if all(isinstance(a, Int) for a in e.args):
            return sum(p for p in parts if p is not None)
        if isinstance(e.args[1], Int) and parts[0] is not None:
            return parts[0] + e.args[1].value
    return None


def _exact(e: AstExpr) -> int | None:
    """The value of an expression of integers only."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Op) and e.op == "add":
        parts = [_exact(a) for a in e.args]
        return None if None in parts else sum(parts)  # type: ignore[arg-type]
    return None


def _constant_lower(e: AstExpr) -> int | None:
    """A constant lower bound of an expression built of ints and max."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Op) and e.op == "max":
        known = [k for k in (_constant_lower(a) for a in e.args) if k is not None]
        return max(known) if known else None
    return None


def _fold(values: list[ir.Value], fn: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
    result = values[0]
    for value in values[1:]:
        result = fn(result, value)
    return result


def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _floordiv(b: ir.IRBuilder, a: ir.Value, d: ir.Value, d_expr: AstExpr) -> ir.Value:
    """isl's fdiv_q: the floor of a / d."""
    if isinstance(d_expr, Int) and d_expr.value > 0:
        negative = b.icmp_signed("<", a, ir.Constant(I64, 0))
        adjusted = b.select(negative, b.sub(a, ir.Constant(I64, d_expr.value - 1)), a)
        return b.sdiv(adjusted, d)
    q = b.sdiv(a, d)
    r = b.srem(a, d)
    inexact = b.icmp_signed("!=", r, ir.Constant(I64, 0))
    signs = b.xor(
        b.icmp_signed("<", r, ir.Constant(I64, 0)), b.icmp_signed("<", d, ir.Constant(I64, 0))
    )
    return b.sub(q, b.zext(b.and_(inexact, signs), I64))
