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


def flat_index(shape: tuple[int | str, ...], index: tuple[str, ...]) -> str:
    """The row-major element offset of an index, as quasi-affine text. A symbolic size
    (isl text over the sizes) in the shape makes the strides before it products with
    it, `(i)*(8*n)`: no longer affine, which `flat_terms` takes apart again."""
    terms = []
    stride, sizes = 1, []
    for size, entry in zip(reversed(shape), reversed(index), strict=True):
        if sizes:
            terms.append(f"({entry})*({'*'.join([str(stride), *sizes])})")
        else:
            terms.append(f"({entry})*{stride}" if stride != 1 else f"({entry})")
        if isinstance(size, str):
            sizes.append(size if size.isidentifier() else f"({size})")
        else:
            stride *= size
    return " + ".join(reversed(terms)) if terms else "0"


#: the stride after a term's parenthesized entry: none, a number, or a symbolic product
_STRIDE = re.compile(r"(?:\*(\d+)|\*\((\d+)\*(.+)\))?")


def flat_terms(text: str) -> list[tuple[str, int, str]] | None:
    """`flat_index`'s text as its terms: (index entry, constant factor of the stride,
    the symbolic sizes multiplying it as text, or ''); None for text of another form."""
    terms = []
    for part in _top_level(text, "+"):
        close = _closing(part)
        match = _STRIDE.fullmatch(part[close + 1 :]) if close is not None else None
        if close is None or match is None:
            return None
        number, first, product = match.groups()
        if product is None:
            terms.append((part[1:close], int(number or 1), ""))
        else:
            terms.append((part[1:close], int(first), product))
    return terms


def _top_level(text: str, separator: str) -> list[str]:
    """The text split at `separator` outside parentheses, each part stripped."""
    parts, depth, start = [], 0, 0
    for pos, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == separator and depth == 0:
            parts.append(text[start:pos].strip())
            start = pos + 1
    parts.append(text[start:].strip())
    return parts


def _closing(part: str) -> int | None:
    """The position of the parenthesis closing the one `part` starts with."""
    if not part.startswith("("):
        return None
    depth = 0
    for pos, char in enumerate(part):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return pos
    return None


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
