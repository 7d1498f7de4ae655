"""Quasi-affine index text (`"h*2 + kh - 1"`, `"floor((o)/8)"`) parsed into the isl AST's
expression types, so that codegen emits indices with the same operators as loop bounds.

The grammar is what lowering and `pack` write: integers, names, `+ - *`, parentheses,
unary minus and `floor(e / c)` with a positive integer `c`.
"""

from __future__ import annotations

import functools
import re

from polytile.poly.ast.build import AstExpr, Int, Op, Var

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][\w']*)|(.))")


class QuasiAffineError(ValueError):
    """The text is not quasi-affine in the supported grammar."""


def flat_index(shape: tuple[int, ...], index: tuple[str, ...]) -> str:
    """The row-major element offset of an index, as quasi-affine text."""
    terms = []
    stride = 1
    for size, entry in zip(reversed(shape), reversed(index), strict=True):
        terms.append(f"({entry})*{stride}" if stride != 1 else f"({entry})")
        stride *= size
    return " + ".join(reversed(terms)) if terms else "0"


@functools.lru_cache(maxsize=65536)
def parse_index(text: str) -> AstExpr:
    tokens = [m.group(1) or m.group(2) or m.group(3) for m in _TOKEN.finditer(text)]
    tokens = [t for t in tokens if t and not t.isspace()]
    parser = _Parser(tokens, text)
    expr = parser.sum()
    if parser.pos != len(tokens):
        raise QuasiAffineError(f"unexpected '{tokens[parser.pos]}' in index '{text}'")
    return expr


class _Parser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise QuasiAffineError(f"expected {expected or 'more'} in index '{self.text}'")
        self.pos += 1
        return token

    def sum(self) -> AstExpr:
        expr = self.product()
        while self.peek() in ("+", "-"):
            op = "add" if self.take() == "+" else "sub"
            expr = Op(op, (expr, self.product()))
        return expr

    def product(self) -> AstExpr:
        expr = self.factor()
        while self.peek() == "*":
            self.take()
            expr = Op("mul", (expr, self.factor()))
        return expr

    def factor(self) -> AstExpr:
        token = self.take()
        if token == "-":
            return Op("minus", (self.factor(),))
        if token == "(":
            expr = self.sum()
            self.take(")")
            return expr
        if token.isdigit():
            return Int(int(token))
        if token == "floor":
            self.take("(")
            num = self.sum()
            self.take("/")
            den = self.factor()
            self.take(")")
            if not isinstance(den, Int) or den.value <= 0:
                raise QuasiAffineError(f"floor needs a positive constant divisor in '{self.text}'")
            return Op("fdiv_q", (num, den))
        if token[0].isalpha() or token[0] == "_":
            return Var(token)
        raise QuasiAffineError(f"unexpected '{token}' in index '{self.text}'")
