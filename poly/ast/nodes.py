"""The loop AST's nodes: frozen dataclasses that codegen, the AST interpreter, the
checks and `explain` consume instead of islpy objects (`build` converts isl's AST)."""

from __future__ import annotations

from dataclasses import dataclass


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
