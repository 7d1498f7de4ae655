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

from dataclasses import replace

from polytile.poly.ast.facts import Facts, bounds, in_loop, learn, parameter_facts
from polytile.poly.ast.nodes import AstExpr, AstNode, Block, Call, For, If, Int, Mark, Op, Var
from polytile.poly.ir.expr import Load, walk
from polytile.poly.ir.kernel import Kernel

#: the largest row count split into blocks: more would emit too many copies of the nest
MAX_ROWS = 16


def split_partial_rows(node: AstNode, kernel: Kernel) -> AstNode:
    """The AST with each reduction nest around a row loop of run-time count emitted in
    blocks of constant counts (see the module's docstring)."""
    return _walk(node, kernel, parameter_facts(kernel.params))


def _walk(node: AstNode, kernel: Kernel, facts: Facts) -> AstNode:
    if isinstance(node, For):
        split = _split(node, kernel, facts) if not node.annotation else None
        if split is not None:
            return split
        return replace(node, body=_walk(node.body, kernel, in_loop(facts, node)))
    if isinstance(node, Block):
        return Block(tuple(_walk(item, kernel, facts) for item in node.items))
    if isinstance(node, If):
        then = _walk(node.then, kernel, learn(facts, node.cond, True))
        orelse = node.orelse
        if orelse is not None:
            orelse = _walk(orelse, kernel, learn(facts, node.cond, False))
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
    low, high = bounds(end, facts)
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
