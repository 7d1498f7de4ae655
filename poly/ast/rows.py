"""Partial register tiles in power-of-two blocks.

A register tile's unrolled row loop runs a number of times known only at run time in the
last tile of a loop its size does not divide: `i1 < seq % 8` when `seq` is a size given
at run time, or `i1 <= min(5, 255 - 6 * m0)` in the last iteration of a parallel loop.
Codegen cannot unroll such a loop, so the reduction around it keeps its accumulators in
memory, every row reading and writing them at each reduction step.

BLAS kernels handle such edges with micro-kernels of fixed smaller heights; so does
`split_partial_rows`: the reduction nest around the row loop is emitted once per power of
two below the largest count, each copy running a block of that many rows (a constant
count, so unrolled with its accumulators in registers) under a test of the count's bit:
`t = 7` runs the blocks of 4, 2 and 1 rows, one after the other.

This moves the row loop out of the reduction loops around it. That is legal when the nest
runs one statement, a reduction that does not read its own tensor: its instances then
commute, up to the reassociation any tiled reduction makes; each element keeps its
reduction order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from polytile.poly.ast.nodes import AstExpr, AstNode, Block, Call, For, If, Int, Mark, Op, Var
from polytile.poly.ir.expr import Load, walk
from polytile.poly.ir.kernel import Kernel

#: the largest row count split into blocks: more would emit too many copies of the nest
MAX_ROWS = 16

Interval = tuple[int | None, int | None]
Facts = Mapping[frozenset[tuple[str, int]], Interval]


def split_partial_rows(node: AstNode, kernel: Kernel) -> AstNode:
    """The AST with each reduction nest around a row loop of run-time count emitted in
    blocks of constant counts (see the module's docstring)."""
    return _walk(node, kernel, {})


def _walk(node: AstNode, kernel: Kernel, facts: Facts) -> AstNode:
    if isinstance(node, For):
        split = _split(node, kernel, facts) if not node.annotation else None
        if split is not None:
            return split
        return replace(node, body=_walk(node.body, kernel, facts))
    if isinstance(node, Block):
        return Block(tuple(_walk(item, kernel, facts) for item in node.items))
    if isinstance(node, If):
        then = _walk(node.then, kernel, _learn(facts, node.cond, True))
        orelse = node.orelse
        if orelse is not None:
            orelse = _walk(orelse, kernel, _learn(facts, node.cond, False))
        return If(node.cond, then, orelse)
    if isinstance(node, Mark):
        return replace(node, body=_walk(node.body, kernel, facts))
    return node


def _split(nest: For, kernel: Kernel, facts: Facts) -> AstNode | None:
    """The nest in blocks, when it is a chain of single loops down to a row loop of
    run-time count (the count using none of the chain's iterators) and runs one
    reduction that does not read its own tensor; else None."""
    chain = {nest.var}
    node: AstNode = nest.body
    while True:
        if isinstance(node, Mark):
            node = node.body
        elif isinstance(node, Block) and len(node.items) == 1:
            node = node.items[0]
        elif isinstance(node, For) and node.annotation in ("", "unroll"):
            rows = _rows(node, facts)
            if rows is not None and not _vars(rows[0]) & chain:
                break
            chain.add(node.var)
            node = node.body
        else:
            return None
    if not _one_reduction(nest, kernel):
        return None
    count, largest = rows
    row_loop = node
    assert isinstance(row_loop, For)
    count = Op("max", (count, Int(0)))
    blocks: list[AstNode] = []
    size = 1 << (largest.bit_length() - 1)
    while size:
        if 2 * size > largest:  # the leading block: its bit is set when count >= size
            test, done = Op("ge", (count, Int(size))), Int(0)
        else:
            test = Op("ge", (Op("pdiv_r", (count, Int(2 * size))), Int(size)))
            done = Op("sub", (count, Op("pdiv_r", (count, Int(2 * size)))))
        start = _plus(row_loop.init, done)
        block = replace(
            row_loop,
            init=Int(0),
            cond=Op("lt", (Var(row_loop.var), Int(size))),
            inc=Int(1),
            body=_shift(row_loop.body, row_loop.var, start),
        )
        blocks.append(If(test, _substitute(nest, row_loop, block)))
        size //= 2
    return Block(tuple(blocks))


def _rows(loop: For, facts: Facts) -> tuple[AstExpr, int] | None:
    """An unrolled loop's run-time count and a constant bound of it (at least 2, at most
    `MAX_ROWS`); None for a constant count or none known."""
    if loop.annotation != "unroll" or loop.inc != Int(1) or not isinstance(loop.init, Int):
        return None
    end = _end(loop.cond, loop.var)
    if end is None:
        return None
    low, high = _bounds(end, facts)
    if high is None or low == high:
        return None
    largest = high - loop.init.value
    if not 2 <= largest <= MAX_ROWS:
        return None
    return (end if loop.init == Int(0) else Op("sub", (end, loop.init))), largest


def _end(cond: AstExpr, var: str) -> AstExpr | None:
    """The exclusive end a loop condition puts on its iterator."""
    if isinstance(cond, Op) and cond.op in ("lt", "le") and cond.args[0] == Var(var):
        limit = cond.args[1]
        if var in _vars(limit):
            return None
        return limit if cond.op == "lt" else Op("add", (limit, Int(1)))
    if isinstance(cond, Op) and cond.op == "and":
        parts = [_end(a, var) for a in cond.args]
        if any(p is None for p in parts):
            return None
        return Op("min", tuple(parts))  # type: ignore[arg-type]
    return None


def _one_reduction(nest: For, kernel: Kernel) -> bool:
    names = _called(nest)
    if len(names) != 1:
        return False
    stmt = kernel.statement[next(iter(names))]
    if stmt.reduction is None:
        return False
    return not any(isinstance(e, Load) and e.tensor == stmt.tensor for e in walk(stmt.expr))


# --- what the tests around a node tell about expressions --------------------------------
#
# Facts bound linear forms: the variable part of `a - b` for a test `a <= b` (constants
# moved to the bound), its sign normalized so that `m - 6 * i0` and `6 * i0 - m` share one.

Terms = frozenset[tuple[str, int]]


def _learn(facts: Facts, cond: AstExpr, holds: bool) -> Facts:
    """`facts` with the bounds a comparison gives where it holds (or, for a single
    comparison, where it does not)."""
    if not isinstance(cond, Op):
        return facts
    if cond.op == "and" and holds:
        for part in cond.args:
            facts = _learn(facts, part, True)
        return facts
    flip = {"le": "gt", "lt": "ge", "ge": "lt", "gt": "le"}
    if cond.op not in flip or len(cond.args) != 2:
        return facts
    op = cond.op if holds else flip[cond.op]
    form = _linear(Op("sub", cond.args))
    if form is None or not form[0]:
        return facts
    terms, constant = form
    # terms + constant OP 0, as terms in [low, high]
    if op in ("le", "lt"):
        low, high = None, -constant - (op == "lt")
    else:
        low, high = -constant + (op == "gt"), None
    key, sign = _normal(terms)
    if sign < 0:
        low, high = (None if high is None else -high), (None if low is None else -low)
    old = facts.get(key, (None, None))
    low = low if old[0] is None else old[0] if low is None else max(low, old[0])
    high = high if old[1] is None else old[1] if high is None else min(high, old[1])
    return {**facts, key: (low, high)}


def _bounds(e: AstExpr, facts: Facts) -> Interval:
    """Constant bounds of an expression (None where unknown): interval arithmetic over
    its operators, narrowed by the facts known of its linear form."""
    low, high = _raw_bounds(e, facts)
    form = _linear(e)
    if form is not None and form[0]:
        key, sign = _normal(form[0])
        known = facts.get(key)
        if known is not None:
            k_low, k_high = (
                known
                if sign > 0
                else (
                    None if known[1] is None else -known[1],
                    None if known[0] is None else -known[0],
                )
            )
            if k_low is not None:
                k_low += form[1]
                low = k_low if low is None else max(low, k_low)
            if k_high is not None:
                k_high += form[1]
                high = k_high if high is None else min(high, k_high)
    return low, high


def _linear(e: AstExpr) -> tuple[Terms, int] | None:
    """An affine expression as its variables' coefficients and its constant."""
    if isinstance(e, Int):
        return frozenset(), e.value
    if isinstance(e, Var):
        return frozenset(((e.name, 1),)), 0
    if e.op == "mul" and isinstance(e.args[0], Int):
        inner = _linear(e.args[1])
        return None if inner is None else _scale(inner, e.args[0].value)
    if e.op == "minus":
        inner = _linear(e.args[0])
        return None if inner is None else _scale(inner, -1)
    if e.op in ("add", "sub") and len(e.args) == 2:
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        if e.op == "sub":
            b = _scale(b, -1)
        coefs = dict(a[0])
        for var, c in b[0]:
            coefs[var] = coefs.get(var, 0) + c
        return frozenset((v, c) for v, c in coefs.items() if c), a[1] + b[1]
    return None


def _scale(form: tuple[Terms, int], factor: int) -> tuple[Terms, int]:
    return frozenset((v, c * factor) for v, c in form[0] if c * factor), form[1] * factor


def _normal(terms: Terms) -> tuple[Terms, int]:
    """The terms with their first coefficient (by name) positive, and the sign used."""
    first = min(terms)[1]
    sign = 1 if first > 0 else -1
    return (terms if sign > 0 else frozenset((v, -c) for v, c in terms)), sign


def _raw_bounds(e: AstExpr, facts: Facts) -> Interval:
    if isinstance(e, Int):
        return e.value, e.value
    if isinstance(e, Var):
        return None, None
    parts = [_bounds(a, facts) for a in e.args]
    if e.op == "add":
        return _sum(p[0] for p in parts), _sum(p[1] for p in parts)
    if e.op == "sub":
        (a, b), (c, d) = parts
        return _sum((a, None if d is None else -d)), _sum((b, None if c is None else -c))
    if e.op == "minus":
        a, b = parts[0]
        return (None if b is None else -b), (None if a is None else -a)
    if e.op == "min":
        lows = [p[0] for p in parts]
        highs = [p[1] for p in parts if p[1] is not None]
        return (None if None in lows else min(lows)), (min(highs) if highs else None)  # type: ignore[type-var]
    if e.op == "max":
        lows = [p[0] for p in parts if p[0] is not None]
        highs = [p[1] for p in parts]
        return (max(lows) if lows else None), (None if None in highs else max(highs))  # type: ignore[type-var]
    divisor = e.args[1] if len(e.args) == 2 else None
    if not isinstance(divisor, Int) or divisor.value <= 0:
        return None, None
    d = divisor.value
    if e.op == "pdiv_r":
        return 0, d - 1
    if e.op == "zdiv_r":
        return -(d - 1), d - 1
    if e.op in ("fdiv_q", "pdiv_q", "div"):
        a, b = parts[0]
        return (None if a is None else a // d), (None if b is None else b // d)
    if e.op == "mul" and isinstance(e.args[0], Int):
        c, (a, b) = e.args[0].value, parts[1]
        ends = (None if a is None else c * a), (None if b is None else c * b)
        return ends if c >= 0 else (ends[1], ends[0])
    return None, None


def _sum(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


# --- rewriting -------------------------------------------------------------------------


def _substitute(node: AstNode, old: For, new: AstNode) -> AstNode:
    """`node` with the loop `old` (found by identity) replaced by `new`."""
    if node is old:
        return new
    if isinstance(node, (For, Mark)):
        return replace(node, body=_substitute(node.body, old, new))
    if isinstance(node, Block):
        return Block(tuple(_substitute(item, old, new) for item in node.items))
    return node


def _shift(node: AstNode, var: str, start: AstExpr) -> AstNode:
    """`node` with the iterator `var` counted from `start`: each `var` reads `start + var`."""

    def expr(e: AstExpr) -> AstExpr:
        if e == Var(var):
            return _plus(start, e)
        if isinstance(e, Op):
            return Op(e.op, tuple(expr(a) for a in e.args))
        return e

    if isinstance(node, For):
        return replace(
            node,
            init=expr(node.init),
            cond=expr(node.cond),
            inc=expr(node.inc),
            body=_shift(node.body, var, start),
        )
    if isinstance(node, Block):
        return Block(tuple(_shift(item, var, start) for item in node.items))
    if isinstance(node, If):
        orelse = _shift(node.orelse, var, start) if node.orelse is not None else None
        return If(expr(node.cond), _shift(node.then, var, start), orelse)
    if isinstance(node, Mark):
        return replace(node, body=_shift(node.body, var, start))
    return Call(node.stmt, tuple(expr(a) for a in node.args))


def _plus(a: AstExpr, b: AstExpr) -> AstExpr:
    if a == Int(0):
        return b
    return a if b == Int(0) else Op("add", (a, b))


def _called(node: AstNode) -> set[str]:
    if isinstance(node, Call):
        return {node.stmt}
    if isinstance(node, Block):
        return set().union(*(_called(item) for item in node.items))
    if isinstance(node, (For, Mark)):
        return _called(node.body)
    if isinstance(node, If):
        return _called(node.then) | (_called(node.orelse) if node.orelse is not None else set())
    return set()


def _vars(e: AstExpr) -> frozenset[str]:
    if isinstance(e, Var):
        return frozenset((e.name,))
    if isinstance(e, Op):
        return frozenset().union(*(_vars(a) for a in e.args))
    return frozenset()
