"""An independent oracle: execute a schedule's isl AST point by point, without LLVM.

    buffers = run_schedule(schedule, {"A": a, "B": b})      # every buffer after the run
    buffers = interpret(build_ast(schedule), kernel, inputs)

Loop iterators are Python ints and every AST expression follows isl's operator semantics
exactly (`fdiv_q` floors, `pdiv_q` / `pdiv_r` require a non-negative dividend, `zdiv_r` is
C's remainder, `div` is exact, `select` / `and` / `or` evaluate lazily). A `Call` runs one
statement instance with `reference.execute_statement`, so values are numpy scalars in the
statements' dtypes. Slow (a Python call per instance): small shapes only.

This is the other side of the differential test against `reference.run_program_order`, so
it shares only the per-instance semantics with it (`allocate`, `execute_statement`), never
the iteration order. To be a sharper oracle it also:

- runs the iterations of loops marked `parallel` or `vector` in reverse order (or shuffled,
  `order="shuffle"`). A legal mark means the loop carries no dependence, so the result is
  bit-identical; a mark on a loop that carries one shows up as a wrong result;
- checks (`check=True`) that every statement instance is executed exactly once: no
  instance twice, none outside the statement's domain, none missing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import islpy as isl
import numpy as np

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
from polytile.poly.ir.buffers import allocate
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.oracle.reference import execute_statement

ORDERS = ("forward", "reverse", "shuffle")
#: annotations whose loops may run their iterations in any order
UNORDERED = frozenset({"parallel", "vector"})

Env = dict[str, int]
Compiled = Callable[[Env], int]


class InterpretError(RuntimeError):
    """The AST broke an invariant (an isl operator's precondition, an instance executed
    twice or outside its domain, an unbound iterator): a bug, never a user error."""


# --- expressions ----------------------------------------------------------------------


def _c_rem(a: int, b: int) -> int:
    """C's `%`: the remainder of division truncated toward zero (sign of the dividend)."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _exact_div(a: int, b: int) -> int:
    q, r = divmod(a, b)
    if r != 0:
        raise InterpretError(f"isl AST 'div' is exact, but {a} / {b} leaves {r}")
    return q


def _pdiv_q(a: int, b: int) -> int:
    if a < 0 or b <= 0:
        raise InterpretError(f"isl AST 'pdiv_q' needs a >= 0 and b > 0, got {a} / {b}")
    return a // b


def _pdiv_r(a: int, b: int) -> int:
    if a < 0 or b <= 0:
        raise InterpretError(f"isl AST 'pdiv_r' needs a >= 0 and b > 0, got {a} % {b}")
    return a % b


_BINARY: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": _exact_div,
    "fdiv_q": lambda a, b: a // b,  # Python's // floors, as isl's fdiv_q
    "pdiv_q": _pdiv_q,
    "pdiv_r": _pdiv_r,
    "zdiv_r": _c_rem,
    "eq": lambda a, b: int(a == b),
    "le": lambda a, b: int(a <= b),
    "lt": lambda a, b: int(a < b),
    "ge": lambda a, b: int(a >= b),
    "gt": lambda a, b: int(a > b),
}


def compile_expr(e: AstExpr) -> Compiled:
    """An AST expression as a function of the iterator environment (Python ints)."""
    if isinstance(e, Int):
        value = int(e.value)
        return lambda env: value
    if isinstance(e, Var):
        name = e.name

        def var(env: Env) -> int:
            try:
                return env[name]
            except KeyError:
                raise InterpretError(f"iterator '{name}' is not bound here") from None

        return var
    if not isinstance(e, Op):
        raise InterpretError(f"not an AST expression: {e!r}")
    args = [compile_expr(a) for a in e.args]
    op = e.op
    if op == "minus":
        (x,) = args
        return lambda env: -x(env)
    if op in ("min", "max"):
        fold = min if op == "min" else max
        return lambda env: fold(a(env) for a in args)
    if op == "select":
        c, t, f = args
        return lambda env: t(env) if c(env) else f(env)
    if op == "and":
        return lambda env: int(all(a(env) for a in args))  # short-circuit, as and_then
    if op == "or":
        return lambda env: int(any(a(env) for a in args))
    if op in _BINARY:
        fn = _BINARY[op]
        if len(args) != 2:
            raise InterpretError(f"isl AST '{op}' takes 2 arguments, got {len(args)}")
        a, b = args
        return lambda env: fn(a(env), b(env))
    raise InterpretError(f"unknown isl AST operator '{op}'")


def eval_expr(e: AstExpr, env: Mapping[str, int]) -> int:
    """One AST expression at given iterator values."""
    return compile_expr(e)(dict(env))


# --- statements -----------------------------------------------------------------------


@dataclass
class _Run:
    kernel: Kernel
    buffers: dict[str, np.ndarray]
    order: str
    rng: random.Random
    check: bool
    execute: bool = True
    seen: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    domains: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    log: list[tuple[str, tuple[int, ...]]] | None = None

    def domain(self, stmt: str) -> set[tuple[int, ...]]:
        if stmt not in self.domains:
            self.domains[stmt] = _domain_points(self.kernel.statement[stmt].domain_set())
        return self.domains[stmt]


Runner = Callable[[Env, _Run], None]


def _compile(node: AstNode, kernel: Kernel) -> Runner:
    if isinstance(node, Block):
        items = [_compile(item, kernel) for item in node.items]

        def block(env: Env, run: _Run) -> None:
            for item in items:
                item(env, run)

        return block
    if isinstance(node, Mark):
        return _compile(node.body, kernel)
    if isinstance(node, If):
        cond = compile_expr(node.cond)
        then = _compile(node.then, kernel)
        orelse = _compile(node.orelse, kernel) if node.orelse is not None else None

        def if_(env: Env, run: _Run) -> None:
            if cond(env):
                then(env, run)
            elif orelse is not None:
                orelse(env, run)

        return if_
    if isinstance(node, For):
        return _compile_for(node, kernel)
    if isinstance(node, Call):
        return _compile_call(node, kernel)
    raise InterpretError(f"not an AST node: {node!r}")


def _compile_for(node: For, kernel: Kernel) -> Runner:
    var = node.var
    init, cond, inc = compile_expr(node.init), compile_expr(node.cond), compile_expr(node.inc)
    body = _compile(node.body, kernel)
    unordered = node.annotation in UNORDERED
    label = node.loop or var

    def for_(env: Env, run: _Run) -> None:
        outer = env.get(var, _UNBOUND)
        env[var] = init(env)
        step = inc(env)
        if step <= 0:
            raise InterpretError(f"loop {label}: the increment {step} is not positive")
        if unordered and run.order != "forward":
            values = []
            while cond(env):
                values.append(env[var])
                env[var] += step
            if run.order == "reverse":
                values.reverse()
            else:
                run.rng.shuffle(values)
            for value in values:
                env[var] = value
                body(env, run)
        else:
            while cond(env):
                body(env, run)
                env[var] += step
        if outer is _UNBOUND:
            del env[var]
        else:
            env[var] = outer

    return for_


_UNBOUND = object()


def _compile_call(node: Call, kernel: Kernel) -> Runner:
    if node.stmt not in kernel.statement:
        raise InterpretError(f"kernel {kernel.name} has no statement '{node.stmt}'")
    stmt = kernel.statement[node.stmt]
    if len(node.args) != len(stmt.dims):
        raise InterpretError(
            f"call of {stmt.name} passes {len(node.args)} values for dims {list(stmt.dims)}"
        )
    args = [compile_expr(a) for a in node.args]
    dims = stmt.dims

    def call(env: Env, run: _Run) -> None:
        coords = tuple(a(env) for a in args)
        if run.check:
            seen = run.seen.setdefault(stmt.name, set())
            if coords in seen:
                raise InterpretError(f"instance {stmt.name}{list(coords)} executed twice")
            if coords not in run.domain(stmt.name):
                raise InterpretError(
                    f"instance {stmt.name}{list(coords)} is outside its domain {stmt.domain}"
                )
            seen.add(coords)
        if run.log is not None:
            run.log.append((stmt.name, coords))
        if run.execute:
            execute_statement(stmt, dict(zip(dims, coords, strict=True)), run.buffers)

    return call


def _domain_points(domain: isl.Set) -> set[tuple[int, ...]]:
    n = domain.dim(isl.dim_type.set)
    found: set[tuple[int, ...]] = set()
    domain.foreach_point(
        lambda p: found.add(
            tuple(int(p.get_coordinate_val(isl.dim_type.set, i).to_python()) for i in range(n))
        )
    )
    return found


def _check_complete(run: _Run) -> None:
    for stmt in run.kernel.statements:
        missing = sorted(run.domain(stmt.name) - run.seen.get(stmt.name, set()))
        if missing:
            raise InterpretError(
                f"kernel {run.kernel.name}: the AST misses {len(missing)} instance(s) of "
                f"{stmt.name} (e.g. {missing[:3]})"
            )


def _start(
    program: Schedule | AstNode, kernel: Kernel | None, order: str, seed: int, check: bool
) -> tuple[AstNode, _Run]:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if isinstance(program, Schedule):
        if kernel is not None and kernel is not program.kernel:
            raise ValueError("interpret: the kernel differs from the schedule's kernel")
        kernel = program.kernel
        program = build_ast(program)
    if kernel is None:
        raise ValueError("interpret: give the kernel the AST was built for")
    return program, _Run(kernel, {}, order, random.Random(seed), check)


def interpret(
    program: Schedule | AstNode,
    kernel: Kernel | None,
    inputs: Mapping[str, np.ndarray],
    *,
    order: str = "reverse",
    seed: int = 0,
    check: bool = True,
) -> dict[str, np.ndarray]:
    """Execute an AST (or a schedule's AST) of `kernel`; return every buffer afterwards.

    `kernel` may be None when `program` is a Schedule. `order` is the iteration order of
    loops marked parallel or vector: "reverse" (default), "shuffle" (seeded by `seed`)
    or "forward". With `check`, every statement instance must run exactly once.
    """
    ast, run = _start(program, kernel, order, seed, check)
    run.buffers = allocate(run.kernel, inputs)
    _compile(ast, run.kernel)({}, run)
    if check:
        _check_complete(run)
    return run.buffers


def run_schedule(
    schedule: Schedule, inputs: Mapping[str, np.ndarray], **options: Any
) -> dict[str, np.ndarray]:
    """`interpret(build_ast(schedule), schedule.kernel, inputs)`: every buffer afterwards."""
    return interpret(build_ast(schedule), schedule.kernel, inputs, **options)


def execution_order(
    program: Schedule | AstNode,
    kernel: Kernel | None = None,
    *,
    order: str = "forward",
    seed: int = 0,
) -> list[tuple[str, tuple[int, ...]]]:
    """The statement instances `(name, dim values)` the AST runs, in order (no values are
    computed): for tests of what a transformation does to the execution order."""
    ast, run = _start(program, kernel, order, seed, check=True)
    run.execute = False
    run.log = []
    _compile(ast, run.kernel)({}, run)
    _check_complete(run)
    return run.log
