"""Partial register tiles in blocks of constant heights.

A register tile's unrolled row loop runs a number of times known only at run time in the
last tile of a loop its size does not divide: `i1 < seq % 8` when `seq` is a size given
at run time, or `i1 <= min(5, 255 - 6 * m0)` in the last iteration of a parallel loop.
Codegen cannot unroll such a loop, so the reduction around it keeps its accumulators in
memory, every row reading and writing them at each reduction step.

BLAS kernels handle such edges with micro-kernels of fixed smaller heights; so does
`split_partial_rows`: the reduction nest around the row loop is emitted once per count up
to `EXACT_COUNTS` when the count is a last tile's (`t == 5`: one block of 5 rows, the
operands read in one pass); otherwise (a count that is also the full tiles', or a larger
one) once per power of two below the largest, under a test of the count's bit (`t = 13`
runs blocks of 8, 4 and 1 rows). Each block's rows are a constant count,
unrolled with their accumulators in registers.

This moves the row loop out of the reduction loops around it. That is legal when the nest
runs one statement, a reduction that does not read its own tensor: its instances then
commute, up to the reassociation any tiled reduction makes; each element keeps its
reduction order.
"""

from __future__ import annotations

from dataclasses import replace

from polytile.poly.ast.facts import Facts, bounds, in_loop, learn, parameter_facts
from polytile.poly.ast.nodes import (
    AstExpr,
    AstNode,
    Block,
    For,
    If,
    Int,
    Mark,
    Op,
    Var,
    called,
    expr_vars,
    loop_end,
    map_exprs,
)
from polytile.poly.ir.kernel import Kernel

#: the largest row count split into blocks: more would emit too many copies of the nest
MAX_ROWS = 16
#: the counts of a last tile up to this one get a block each (one pass over the operands: 7
#: rows as 4 + 2 + 1 read its weights three times), others blocks of powers of two
EXACT_COUNTS = 8


def split_partial_rows(node: AstNode, kernel: Kernel) -> AstNode:
    """The AST with each reduction nest around a row loop of run-time count emitted in
    blocks of constant counts (see the module's docstring)."""
    return _walk(_guards_as_bounds(node), kernel, parameter_facts(kernel.params))


def _guards_as_bounds(node: AstNode) -> AstNode:
    if isinstance(node, For):
        node = _guard_as_bound(node)
        return replace(node, body=_guards_as_bounds(node.body))
    if isinstance(node, Block):
        return Block(tuple(_guards_as_bounds(item) for item in node.items))
    if isinstance(node, If):
        orelse = None if node.orelse is None else _guards_as_bounds(node.orelse)
        return If(node.cond, _guards_as_bounds(node.then), orelse)
    if isinstance(node, Mark):
        return replace(node, body=_guards_as_bounds(node.body))
    return node


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
            if rows is not None and not expr_vars(rows[0]) & chain:
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
    exact = largest <= EXACT_COUNTS and not _counts_full_tiles(count, facts)
    count = Op("max", (count, Int(0)))
    blocks: list[AstNode] = []
    for test, start, size in _blocks(count, largest, exact):
        block = replace(
            row_loop,
            init=Int(0),
            cond=Op("lt", (Var(row_loop.var), Int(size))),
            inc=Int(1),
            body=_shift(row_loop.body, row_loop.var, _plus(row_loop.init, start)),
        )
        blocks.append(If(test, _substitute(nest, row_loop, block)))
    return Block(tuple(blocks))


def _blocks(count: AstExpr, largest: int, exact: bool) -> list[tuple[AstExpr, AstExpr, int]]:
    """(test, first row, rows) of each block: one per count, or per power of two."""
    if exact:
        return [(Op("eq", (count, Int(c))), Int(0), c) for c in range(largest, 0, -1)]
    found = []
    size = 1 << (largest.bit_length() - 1)
    while size:
        if 2 * size > largest:  # the leading block: its bit is set when count >= size
            found.append((Op("ge", (count, Int(size))), Int(0), size))
        else:
            rest = Op("pdiv_r", (count, Int(2 * size)))
            found.append((Op("ge", (rest, Int(size))), Op("sub", (count, rest)), size))
        size //= 2
    return found


def _counts_full_tiles(count: AstExpr, facts: Facts) -> bool:
    """Whether the count is clamped by a constant that its other side passes
    (`min(7, seq - 8 * i0 - 1) + 1`): the loop runs the full tiles too, a block of the
    full count comes first and the rest are powers of two. A last tile's count
    (`seq % 8`, `seq` under `seq <= 7`) is not."""
    while isinstance(count, Op) and count.op in ("add", "sub"):
        low, high = bounds(count.args[1], facts)
        if low is None or low != high:
            break
        count = count.args[0]
    if not (isinstance(count, Op) and count.op == "min"):
        return False
    ends = [bounds(a, facts) for a in count.args]
    clamps = [low for low, high in ends if low is not None and low == high]
    others = [high for low, high in ends if low is None or low != high]
    return bool(clamps) and any(high is None or high > min(clamps) for high in others)


def _guard_as_bound(loop: For) -> For:
    """An unrolled loop whose whole body is a test bounding its iterator above by an
    expression of outer values (isl's `if (n % 8 >= i1 + 1)` in `i1 <= 6`), with the
    test moved into its condition: the loop's count is then a run-time value."""
    if loop.annotation != "unroll":
        return loop
    body = loop.body
    if not isinstance(body, If) or body.orelse is not None:
        return loop
    end = _guard_end(body.cond, loop.var)
    if end is None:
        return loop
    cond = Op("and", (loop.cond, Op("lt", (Var(loop.var), end))))
    return replace(loop, cond=cond, body=body.then)


def _guard_end(cond: AstExpr, var: str) -> AstExpr | None:
    """`e` where `cond` says var < e (e free of var): `e >= var + c`, `var + c <= e`, ..."""
    if not isinstance(cond, Op) or cond.op not in ("ge", "gt", "le", "lt"):
        return None
    left, right = cond.args
    op = cond.op
    if op in ("ge", "gt"):  # e >= var + c  is  var + c <= e
        left, right, op = right, left, {"ge": "le", "gt": "lt"}[op]
    offset = _offset(left, var)
    if offset is None or var in expr_vars(right):
        return None
    # var + offset <= right: var < right - offset + 1; with lt: var < right - offset
    shift = offset - (op == "le")
    return right if shift == 0 else Op("sub", (right, Int(shift)))


def _offset(e: AstExpr, var: str) -> int | None:
    """c where e is `var + c` (or `var`)."""
    if e == Var(var):
        return 0
    if isinstance(e, Op) and e.op == "add" and len(e.args) == 2:
        a, b = e.args
        if a == Var(var) and isinstance(b, Int):
            return b.value
        if b == Var(var) and isinstance(a, Int):
            return a.value
    return None


def _rows(loop: For, facts: Facts) -> tuple[AstExpr, int] | None:
    """An unrolled loop's run-time count and a constant bound of it (at least 2, at most
    `MAX_ROWS`); None for a constant count or none known."""
    if loop.annotation != "unroll" or loop.inc != Int(1) or not isinstance(loop.init, Int):
        return None
    end = loop_end(loop.cond, loop.var)
    if end is None:
        return None
    low, high = bounds(end, facts)
    if high is None or low == high:
        return None
    largest = high - loop.init.value
    if not 2 <= largest <= MAX_ROWS:
        return None
    return (end if loop.init == Int(0) else Op("sub", (end, loop.init))), largest


def _one_reduction(nest: For, kernel: Kernel) -> bool:
    names = called(nest)
    if len(names) != 1:
        return False
    return kernel.statement[next(iter(names))].accumulates_only


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

    return map_exprs(node, expr)


def _plus(a: AstExpr, b: AstExpr) -> AstExpr:
    if a == Int(0):
        return b
    return a if b == Int(0) else Op("add", (a, b))
