"""The loop AST's nodes: frozen dataclasses that codegen, the AST interpreter, the
checks and `explain` consume instead of islpy objects (`build` converts isl's AST)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Int:
    value: int


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Op:
    """isl AST operators: add sub mul minus min max select eq le lt ge gt and or
    and_then or_else; div (exact), fdiv_q (floor), pdiv_q / pdiv_r (non-negative
    dividend), zdiv_r (remainder, compared with zero)."""

    op: str
    args: tuple[AstExpr, ...]


AstExpr = Int | Var | Op


@dataclass(frozen=True)
class For:
    var: str
    init: AstExpr
    cond: AstExpr
    inc: AstExpr
    body: AstNode
    loop: str = ""
    annotation: str = ""


@dataclass(frozen=True)
class If:
    cond: AstExpr
    then: AstNode
    orelse: AstNode | None = None


@dataclass(frozen=True)
class Block:
    items: tuple[AstNode, ...]


@dataclass(frozen=True)
class Call:
    """One statement instance; `args` are the values of the statement's dims."""

    stmt: str
    args: tuple[AstExpr, ...]


@dataclass(frozen=True)
class Mark:
    """A loop mark whose loop isl did not emit as a `for` (it runs once)."""

    loop: str
    annotation: str
    body: AstNode


AstNode = For | If | Block | Call | Mark


def map_exprs(node: AstNode, f: Callable[[AstExpr], AstExpr]) -> AstNode:
    """The AST with `f` applied to each expression: loop bounds and steps, tests, and
    the calls' arguments."""
    if isinstance(node, For):
        return replace(
            node,
            init=f(node.init),
            cond=f(node.cond),
            inc=f(node.inc),
            body=map_exprs(node.body, f),
        )
    if isinstance(node, Block):
        return Block(tuple(map_exprs(item, f) for item in node.items))
    if isinstance(node, If):
        orelse = map_exprs(node.orelse, f) if node.orelse is not None else None
        return If(f(node.cond), map_exprs(node.then, f), orelse)
    if isinstance(node, Mark):
        return replace(node, body=map_exprs(node.body, f))
    return Call(node.stmt, tuple(f(a) for a in node.args))


def called(node: AstNode) -> set[str]:
    """The statements called in or below a node."""
    if isinstance(node, Call):
        return {node.stmt}
    if isinstance(node, Block):
        return set().union(*(called(item) for item in node.items))
    if isinstance(node, (For, Mark)):
        return called(node.body)
    if isinstance(node, If):
        return called(node.then) | (called(node.orelse) if node.orelse is not None else set())
    return set()


def expr_vars(e: AstExpr) -> frozenset[str]:
    """The variables an expression reads."""
    if isinstance(e, Var):
        return frozenset((e.name,))
    if isinstance(e, Op):
        return frozenset().union(*(expr_vars(a) for a in e.args))
    return frozenset()


def loop_end(cond: AstExpr, var: str) -> AstExpr | None:
    """The exclusive end a loop's condition puts on its iterator (None when it does not
    bound it above by an expression free of it)."""
    if isinstance(cond, Op) and cond.op in ("lt", "le") and cond.args[0] == Var(var):
        limit = cond.args[1]
        if var in expr_vars(limit):
            return None
        return limit if cond.op == "lt" else Op("add", (limit, Int(1)))
    if isinstance(cond, Op) and cond.op == "and":
        parts = [loop_end(a, var) for a in cond.args]
        if any(p is None for p in parts):
            return None
        return Op("min", tuple(parts))  # type: ignore[arg-type]
    return None
