"""The notation's parser: one statement's text → its written tensor, combiner, indices,
expression and condition as Python `ast` nodes (typing and naming happen in `convert`)."""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from dataclasses import dataclass

REDUCTIONS = {"+=": "sum", "*=": "prod", "max=": "max", "min=": "min"}
#: unary math calls (name in the DSL → IR op)
UNARY_CALLS = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "erf": "erf",
    "tanh": "tanh",
    "floor": "floor",
    "ceil": "ceil",
    "abs": "abs",
    "sigmoid": "sigmoid",
    "relu": "relu",
}
#: math calls whose result is a float even for integer operands
FLOAT_CALLS = frozenset({"exp", "log", "sqrt", "erf", "tanh", "sigmoid"})
CALLS = frozenset({*UNARY_CALLS, "max", "min", "pow", "where"})
CONSTANTS = {"inf": math.inf, "nan": math.nan}
#: words isl's parser reserves: never names of tensors or variables
ISL_WORDS = frozenset(
    [
        "exists",
        "mod",
        "floor",
        "ceil",
        "min",
        "max",
        "and",
        "or",
        "not",
        "infty",
        "true",
        "false",
        "rat",
        "implies",
        "NaN",
    ]
)


_ASSIGN = re.compile(r"^\s*(?P<lhs>[^=]*?)\s*(?P<op>max=|min=|\+=|\*=|=)(?!=)\s*(?P<rhs>.*)$", re.S)


class Fail(Exception):
    """A problem in one statement; `kernel` adds the statement's text."""


def check_local(name: str, what: str) -> None:
    if not name.isidentifier() or name in ISL_WORDS:
        raise Fail(f"'{name}' cannot name a {what} (an isl keyword)")


@dataclass
class ParsedStatement:
    """What one statement's text says, before naming and typing it."""

    text: str
    tensor: str
    combiner: str | None
    lhs: list[ast.expr]
    rhs: ast.expr
    guard: ast.expr | None


def _split_guard(rhs: str) -> tuple[str, str | None]:
    """`expr if cond` → (expr, cond); a Python conditional `a if c else b` stays whole."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(rhs).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        raise Fail(f"cannot tokenize the expression: {exc}") from None
    depth, ifs, last_else = 0, [], -1
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in ("(", "[", "{"):
            depth += 1
        elif tok.type == tokenize.OP and tok.string in (")", "]", "}"):
            depth -= 1
        elif tok.type == tokenize.NAME and depth == 0 and tok.string in ("if", "else"):
            if tok.string == "if":
                ifs.append(tok.start[1])
            else:
                last_else = tok.start[1]
    guards = [col for col in ifs if col > last_else]
    if not guards:
        return rhs, None
    col = guards[-1]
    return rhs[:col], rhs[col + 2 :]


def parse_statement(text: str) -> ParsedStatement:
    flat = " ".join(text.split())
    found = _ASSIGN.match(flat)
    if found is None:
        raise Fail("expected `T[index] = expression` (or +=, *=, max=, min=)")
    op, rhs_text = found["op"], found["rhs"]
    if re.search(r"[-/%&|^@<>!]$", found["lhs"]):
        raise Fail(f"unsupported assignment '{found['lhs'][-1]}{op}' (use =, +=, *=, max=, min=)")
    lhs = _parse_python(found["lhs"], "left-hand side")
    if not (isinstance(lhs, ast.Subscript) and isinstance(lhs.value, ast.Name)):
        raise Fail(f"the left-hand side '{found['lhs']}' must be a tensor element T[i, ...]")
    expr_text, guard_text = _split_guard(rhs_text)
    if not expr_text.strip():
        raise Fail("the right-hand side is empty")
    rhs = _parse_python(expr_text, "right-hand side")
    guard = _parse_python(guard_text, "condition") if guard_text is not None else None
    return ParsedStatement(text, lhs.value.id, REDUCTIONS.get(op), index_list(lhs), rhs, guard)


def _parse_python(text: str, what: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise Fail(f"syntax error in the {what} '{text.strip()}': {exc.msg}") from None


def index_list(sub: ast.Subscript) -> list[ast.expr]:
    index = sub.slice
    return list(index.elts) if isinstance(index, ast.Tuple) else [index]
