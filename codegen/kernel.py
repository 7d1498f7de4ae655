"""A kernel under a schedule → one LLVM function, `void name(ptr noalias t0, ..., i64 s0,
...)` with one pointer per tensor in `kernel.tensors` order, then the value of each
symbolic size (`Kernel.params`): the loop bounds and the offsets of symbolic layouts use
them.

The loop AST comes from isl (`poly.ast.build_ast`). Loop marks decide the code:
- `vector`: explicit vector code. Each address's stride along the loop is decided
  exactly by isl (`poly.strides`): stride 1 is a vector load / store, 0 a broadcast,
  others gather lane by lane; a statement without uniform strides (or with an indirect
  load) runs lane by lane. A scalar loop finishes the iterations a full vector misses.
- `unroll`: the body is emitted once per iteration when the trip count is a constant.
- `parallel`: the loop body is outlined and run by `GOMP_parallel`; each thread runs one
  contiguous, equal share of its iterations (`chunks`). Where the target says so, each
  iteration asks for a range of lines, one per step of its register-tile reductions:
  its share of the model's next kernel's weights, or the next iteration's weight panel
  (`codegen.prefetch`).

A reduction loop whose body only accumulates into addresses fixed while it runs keeps
those accumulators in registers (`codegen.promote`): loaded before it, stored after it
(as rows and a transpose in registers when their lanes lie rows apart), with partial
sums when they are too few, and asking for the next parallel iteration's weights ahead.

Each function (the kernel's and each outlined parallel body) has one `_Emitter` for
its loops, calls and integer expressions, which owns an `Accumulators` and a
`Prefetcher`; they share the kernel's `KernelState` and emit through the `Emitter`
interface (`codegen.emission`).

Floating point follows the expressions exactly; only `contract` (FMA) is allowed, and a
promoted float sum with too few accumulators to hide the FMA latency is reassociated
into partial sums (`partial_sums`). Integer division by zero yields 0 instead of
trapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llvmlite import ir

from polytile.errors import CodegenError
from polytile.poly.ast.build import (
    AstExpr,
    AstNode,
    Block,
    Call,
    For,
    If,
    Int,
    Mark,
    Op,
    Var,
    build_ast,
)
from polytile.poly.ast.quasi import flat_index
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform.contract import private_temporaries

from .ast_facts import calls_of, constant_bound, constant_lower, exact, relative_trips, upper
from .emission import MAX_UNROLL, KernelState, plus
from .integers import Integers, smax, smin
from .llvm_types import I32, I64, PTR, STOP, Env, ModuleContext
from .prefetch import Prefetcher
from .promote import Accumulators, Promotion
from .values import Instance, Lanes, shares_write

#: environment entries that carry a private temporary's offset shift into outlined code
SHIFT = "%shift:"
#: the environment entry of the thread running the enclosing parallel loop's iteration
THREAD = "%thread"


@dataclass(frozen=True)
class KernelFunction:
    name: str
    #: tensor names in argument order
    params: tuple[str, ...]
    #: the symbolic sizes it takes after the tensors, as i64 values (`Kernel.params`)
    sizes: tuple[str, ...] = ()


def emit_kernel(
    mc: ModuleContext, schedule: Schedule, name: str, ast: AstNode | None = None
) -> KernelFunction:
    """The kernel's function in `mc`, from `ast` (the schedule's AST, built when None)."""
    kernel = schedule.kernel
    params = tuple(kernel.tensors)
    sizes = kernel.params
    signature = ir.FunctionType(ir.VoidType(), [PTR] * len(params) + [I64] * len(sizes))
    fn = ir.Function(mc.module, signature, name=name)
    for arg in fn.args[: len(params)]:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    ast = ast if ast is not None else build_ast(schedule)
    state = KernelState(schedule, mc.target)
    for private in private_temporaries(schedule, ast):
        # fewer slices than threads would leave threads idle: keep the full storage
        if private.slots < mc.target.num_threads:
            continue
        state.private.setdefault(private.loop, []).append(private)
        state.layout[private.tensor] = private.shape
        for loop in (*private.outer, private.loop):
            if schedule.loop(loop).annotation == "parallel":
                state.slots[loop] = min(state.slots.get(loop, private.slots), private.slots)
    ptrs = dict(zip(params, fn.args[: len(params)], strict=True))
    values = dict(zip(sizes, fn.args[len(params) :], strict=True))
    emitter = _Emitter(mc, state, fn, ptrs, name, sizes=values)
    emitter.node(ast, values)
    emitter.b.ret_void()
    return KernelFunction(name, params, sizes)


class _Emitter:
    """The code of one function: its loops, statement calls and integer expressions,
    with the register accumulators and prefetches of its reductions delegated to its
    `Accumulators` and `Prefetcher` (which emit through it: `codegen.emission.Emitter`)."""

    def __init__(
        self,
        mc: ModuleContext,
        state: KernelState,
        fn: ir.Function,
        ptrs: Mapping[str, ir.Value],
        base: str,
        in_parallel: bool = False,
        shift: Mapping[str, ir.Value] | None = None,
        sizes: Mapping[str, ir.Value] | None = None,
    ) -> None:
        self.mc = mc
        self.state = state
        self.kernel: Kernel = state.kernel
        self.fn = fn
        self.ptrs = dict(ptrs)
        self.base = base
        self.in_parallel = in_parallel
        #: the loops being emitted, outermost first (inside an outlined parallel body:
        #: those inside the parallel loop)
        self.enclosing: list[For] = []
        #: tensor → elements added to its offsets (a private temporary's slice)
        self.shift: dict[str, ir.Value] = dict(shift or {})
        #: the kernel's symbolic sizes (`Kernel.params`) as values of this function
        self.sizes: dict[str, ir.Value] = dict(sizes or {})
        entry = fn.append_basic_block("entry") if not fn.blocks else fn.blocks[-1]
        self.b = ir.IRBuilder(entry)
        #: index arithmetic, shared within a block by affine form
        self.ints = Integers(self.b, f"kernel {self.kernel.name}")
        self.prefetcher = Prefetcher(self, state)
        self.accumulators = Accumulators(self, state, self.prefetcher)

    def shape(self, tensor: str) -> tuple[int | str, ...]:
        """The shape the tensor's offsets are computed in (a private temporary's box)."""
        return self.state.shape(tensor)

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
        self.enclosing.append(node)
        try:
            self.emit_loop(node, env)
        finally:
            self.enclosing.pop()

    def emit_loop(self, node: For, env: Env) -> None:
        serial_only = self.in_parallel or not self.mc.threading
        if node.annotation == "parallel" and not serial_only and self.parallel_loop(node, env):
            return
        if node.annotation == "vector" and self.vector_loop(node, env):
            return
        if node.annotation == "unroll" and self.unrolled_loop(node, env):
            return
        acc = self.accumulators
        promotion = acc.promotable(node) if acc.active is None else None
        if promotion is None:
            self.serial_loop(node, env, self.int(node.init, env), node.cond, 1, self.body_of(node))
            return
        self.promoted_loop(node, env, promotion)

    def promoted_loop(self, node: For, env: Env, promotion: Promotion) -> None:
        """The loop with its accumulators in registers (`Accumulators`), split into
        partial sums where it keeps them, each step asking for a line of the enclosing
        parallel iteration's prefetch window."""
        acc = self.accumulators
        parts = acc.enter(node, promotion)
        inner = self.body_of(node)

        def body(scope: Env) -> None:
            self.prefetcher.window_step()
            inner(scope)

        try:
            start = self.int(node.init, env)
            if parts > 1:
                start = self.serial_loop(
                    node, env, start, node.cond, parts, acc.split(node, parts, body)
                )
                promotion.part = 0
            self.serial_loop(node, env, start, node.cond, 1, body)
        finally:
            acc.leave()
        acc.finish(promotion)

    def body_of(self, node: For) -> Callable[[Env], None]:
        """The loop body; in a loop with private temporaries, their offsets move to the
        slice of the thread running the enclosing parallel loop (or 0) for each
        iteration."""
        privates = self.state.private.get(node.loop, [])
        if not privates:
            return lambda env: self.loop_body(node.body, env)

        def body(env: Env) -> None:
            first = env.get(THREAD, ir.Constant(I64, 0))
            saved = dict(self.shift)
            scope = dict(env)
            for p in privates:
                start = self.b.mul(first, ir.Constant(I64, p.span), flags=["nsw"])
                shift = self.b.sub(start, self.int(p.origin, env), flags=["nsw"])
                self.shift[p.tensor] = shift
                scope[f"{SHIFT}{p.tensor}"] = shift
            self.loop_body(node.body, scope)
            self.shift = saved

        return body

    def loop_body(self, body: AstNode, env: Env) -> None:
        """A loop's body; the reduction loop after an init nest that fills its
        accumulators (`fused_init`) starts them from the init's values."""
        if not isinstance(body, Block):
            self.node(body, env)
            return
        i = 0
        while i < len(body.items):
            promotion = self.accumulators.fused_init(body.items, i)
            self.node(body.items[i], env)
            i += 1
            if promotion is None:
                continue
            loop = body.items[i]
            assert isinstance(loop, For)
            self.enclosing.append(loop)
            try:
                self.promoted_loop(loop, env, promotion)
            finally:
                self.enclosing.pop()
            i += 1

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
        latch = b.branch(header)
        if self.sizes:  # its trip count may be a run-time value
            latch.set_metadata("llvm.loop", self.mc.runtime_trips())
        b.position_at_end(done)
        return v

    def unrolled_loop(self, node: For, env: Env) -> bool:
        bound = upper(node)
        start = constant_lower(node.init)
        if start is None or not isinstance(node.inc, Int) or bound is None:
            return False
        limit = constant_bound(bound)
        if limit is None or node.inc.value <= 0:
            return False
        if not isinstance(node.init, Int) and node.inc.value != 1:
            return False
        values = range(start, limit, node.inc.value)
        if len(values) > MAX_UNROLL:
            return False
        known = exact(bound) is not None and isinstance(node.init, Int)
        for value in values:
            scope = {**env, node.var: ir.Constant(I64, value)}
            if known:
                self.node(node.body, scope)
                continue
            cond = node.cond
            if not isinstance(node.init, Int):
                cond = Op("and", (Op("ge", (Var(node.var), node.init)), cond))
            with self.b.if_then(self.cond(cond, scope)):
                self.node(node.body, scope)
        return True

    def parallel_loop(self, node: For, env: Env) -> bool:
        """Outline the loop into `body(ctx)`; each thread runs its share of the
        iterations (`chunks`)."""
        bound = upper(node)
        if bound is None or not isinstance(node.inc, Int) or node.inc.value <= 0:
            return False
        b = self.b
        names = sorted(env)
        slots = [*self.ptrs.values(), *(env[n] for n in names)]
        ctx_type = ir.LiteralStructType([PTR] * len(self.ptrs) + [I64] * len(names))
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
        fields = list(ctx_type.elements)
        body_fn = ir.Function(
            self.mc.module,
            ir.FunctionType(ir.VoidType(), fields),
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
        ob.call(body_fn, loaded)
        ob.ret_void()
        args = list(body_fn.args)
        ptrs = dict(zip(self.ptrs, args[: len(self.ptrs)], strict=True))
        scope = dict(zip(names, args[len(self.ptrs) :], strict=True))
        shift = {n.removeprefix(SHIFT): v for n, v in scope.items() if n.startswith(SHIFT)}
        sizes = {p: scope[p] for p in self.sizes}
        inner = _Emitter(self.mc, self.state, body_fn, ptrs, self.base, True, shift, sizes)
        inner.chunks(node, scope, bound)
        inner.b.ret_void()
        several = None
        if self.sizes:  # a trip count known at run time only: one iteration runs here
            span = b.sub(self.int(bound, env), self.int(node.init, env))
            several = b.icmp_signed(">", span, ir.Constant(I64, node.inc.value))
        self.mc.run_parallel(b, outlined, ctx, several)
        return True

    def chunks(self, node: For, env: Env, bound: AstExpr) -> None:
        """Static shares: thread t of n runs iterations [t·N/n, (t+1)·N/n), so each
        thread meets the same part of the data in every run (where consecutive kernels
        split alike, the part it wrote itself) and none waits on a shared counter. The
        price: a thread the machine delays holds the others at the join; guided chunks
        from a shared counter, which balance that, were slower on the tuned models."""
        b = self.b
        lo = self.int(node.init, env)
        hi = self.int(bound, env)
        inc = node.inc.value  # type: ignore[union-attr]
        span = b.sub(hi, lo)
        count = b.sdiv(b.add(span, ir.Constant(I64, inc - 1)), ir.Constant(I64, inc))
        count = smax(b, count, ir.Constant(I64, 0))
        thread = b.sext(b.call(self.mc.function("omp_get_thread_num", I32, []), []), I64)
        threads = b.sext(b.call(self.mc.function("omp_get_num_threads", I32, []), []), I64)
        run = b.append_basic_block(f"{node.var}.run")
        done = b.append_basic_block(f"{node.var}.all")
        slots = self.state.slots.get(node.loop)
        if slots is not None:
            # only threads with a slice of every private temporary take iterations
            threads = smin(b, threads, ir.Constant(I64, slots))
            b.cbranch(b.icmp_signed("<", thread, threads), run, done)
        else:
            b.branch(run)
        b.position_at_end(run)
        first = b.sdiv(b.mul(thread, count), threads)
        last = b.sdiv(b.mul(b.add(thread, ir.Constant(I64, 1)), count), threads)
        start = b.add(lo, b.mul(first, ir.Constant(I64, inc)))
        stop = b.add(lo, b.mul(last, ir.Constant(I64, inc)))
        chunk_cond = Op("lt", (Var(node.var), Var(STOP)))
        body = self.prefetcher.parallel_body(node, lo, count, stop, self.body_of(node))
        scope = {**env, STOP: stop, THREAD: thread}
        self.serial_loop(node, scope, start, chunk_cond, 1, body)
        b.branch(done)
        b.position_at_end(done)

    # --- vector loops -----------------------------------------------------------------
    def vector_loop(self, node: For, env: Env) -> bool:
        lanes = self.state.vector_lanes(node)
        calls = calls_of(node.body)
        if lanes is None or calls is None:
            return False
        loop = node.loop
        plans = {
            call.stmt: self.state.vector_plan(self.kernel.statement[call.stmt], loop)
            for call in calls
        }

        def vector_body(scope: Env, active: int | None = None) -> None:
            for call in calls:
                plan = plans[call.stmt]
                if plan is None:
                    for lane in range(lanes if active is None else active):
                        lane_scope = {**scope, node.var: plus(self.b, scope[node.var], lane)}
                        self.call(call, lane_scope)
                else:
                    self.call(call, scope, Lanes(lanes, plan, active))

        if self.state.expanded(node):
            # constant bounds: straight-line vectors, the last one masked if partial
            assert isinstance(node.init, Int)
            bound = upper(node)
            limit = exact(bound) if bound is not None else None
            assert limit is not None
            for start in range(node.init.value, limit, lanes):
                active = limit - start if limit - start < lanes else None
                vector_body({**env, node.var: ir.Constant(I64, start)}, active)
            return True
        end = self.serial_loop(node, env, self.int(node.init, env), node.cond, lanes, vector_body)
        trips = relative_trips(node)
        if trips is not None and trips % lanes and self.state.maskable(node):
            # a known remainder: one masked vector rather than a scalar loop
            vector_body({**env, node.var: end}, trips % lanes)
            return True
        self.serial_loop(node, env, end, node.cond, 1, self.body_of(node))
        return True

    # --- statements -------------------------------------------------------------------
    def call(self, node: Call, env: Env, lanes: Lanes | None = None) -> None:
        if self.accumulators.call(node, env, lanes):
            return
        stmt = self.kernel.statement[node.stmt]
        dims = {d: self.int(a, env) for d, a in zip(stmt.dims, node.args, strict=True)}
        inst = Instance(self, stmt, dims, lanes)
        value = inst.value(stmt.expr)
        t = self.kernel.tensors[stmt.tensor]
        text = flat_index(self.shape(t.name), stmt.index)
        if shares_write(stmt, lanes, text):
            value = inst.reduce_lanes(stmt.reduction, value, t.dtype)  # type: ignore[arg-type]
            inst = Instance(self, stmt, dims, None)
        if stmt.reduction is not None:
            old = inst.load(t.name, t.dtype, text)
            value = inst.combine(stmt.reduction, old, value, t.dtype)
        inst.store(t.name, t.dtype, text, value)

    # --- integer AST expressions ------------------------------------------------------
    def int(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value:
        return self.ints.expr(e, env)

    def cond(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value:
        return self.ints.cond(e, env)
