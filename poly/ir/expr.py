"""Expression trees of statements: tensor loads with affine indices, constants, arithmetic,
comparisons, select, casts and math calls. Every node carries its dtype.

Indices of a load are affine expressions over the statement's iteration dimensions, in isl
syntax (`"h*2 + kh - 1"`, `"floor(i/2)"`); an index may also be an `Expr` (an indirect
load, e.g. Gather with run-time indices), which dependence analysis over-approximates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

UNARY_OPS = frozenset(
    {
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "erf",
        "tanh",
        "floor",
        "ceil",
        "not",
        "sigmoid",
        "recip",
        "relu",
        # trigonometric and hyperbolic functions and their inverses (libm / libmvec)
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        #: to the nearest integer, halves to even (C's roundeven; numpy's round)
        "round",
        #: bitwise complement of an integer (`not` is the logical one of a bool)
        "bitnot",
    }
)
BINARY_OPS = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "min",
        "pow",
        #: C's remainder (fmod, `%`): the sign of the dividend; x % 0 is 0 for integers
        "mod",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and",
        "or",
        "xor",
        "bitand",
        "bitor",
        "bitxor",
    }
)
#: logical connectives of bools
LOGICAL = frozenset({"and", "or", "xor"})
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
#: reduction combiners and their identities
COMBINERS = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}


def identity(combiner: str, dtype: str) -> object:
    """The identity of a reduction combiner in `dtype` (integers: their extreme values
    for max and min)."""
    value = COMBINERS[combiner]
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "b":
        return np.bool_(value > 0)
    if np_dtype.kind in "iu" and math.isinf(value):
        info = np.iinfo(np_dtype)
        return info.min if value < 0 else info.max
    return np_dtype.type(value)


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: str

    def __str__(self) -> str:
        return repr(self.value) if not isinstance(self.value, float) else f"{self.value:g}"


@dataclass(frozen=True)
class Load:
    tensor: str
    index: tuple[str | Expr, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(map(str, self.index))}]"


@dataclass(frozen=True)
class Iter:
    """The value of an iteration dimension (e.g. Range, or index arithmetic)."""

    name: str
    dtype: str = "int64"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Unary:
    op: str
    x: Expr
    dtype: str

    def __str__(self) -> str:
        return f"{self.op}({self.x})"


@dataclass(frozen=True)
class Binary:
    op: str
    a: Expr
    b: Expr
    dtype: str

    def __str__(self) -> str:
        symbols = {
            "add": "+",
            "sub": "-",
            "mul": "*",
            "div": "/",
            "mod": "%",
            "eq": "==",
            "ne": "!=",
            "lt": "<",
            "le": "<=",
            "gt": ">",
            "ge": ">=",
            "and": "&&",
            "or": "||",
            "xor": "^^",
            "bitand": "&",
            "bitor": "|",
            "bitxor": "^",
        }
        if self.op in symbols:
            return f"({self.a} {symbols[self.op]} {self.b})"
        return f"{self.op}({self.a}, {self.b})"


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr
    dtype: str

    def __str__(self) -> str:
        return f"({self.cond} ? {self.a} : {self.b})"


@dataclass(frozen=True)
class Cast:
    x: Expr
    dtype: str
    #: ONNX Cast's `saturate` and `round_mode`: only conversions to the float8 types read
    #: them (frontend/narrow.py); every other conversion is the same under any value
    saturate: bool = True
    round_mode: str = "up"

    def __str__(self) -> str:
        # the modes are part of the text (and so of a kernel's workload key) where they
        # differ from the defaults: a float8 cast rounding down is other code
        modes = [] if self.saturate else ["no saturate"]
        modes += [] if self.round_mode == "up" else [f"round {self.round_mode}"]
        return f"({', '.join([self.dtype, *modes])}){self.x}"


Expr = Const | Load | Iter | Unary | Binary | Select | Cast


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Unary | Cast):
        return (expr.x,)
    if isinstance(expr, Binary):
        return (expr.a, expr.b)
    if isinstance(expr, Select):
        return (expr.cond, expr.a, expr.b)
    if isinstance(expr, Load):
        return tuple(i for i in expr.index if not isinstance(i, str))
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of the tree, parents before children."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def loads(expr: Expr) -> list[Load]:
    return [e for e in walk(expr) if isinstance(e, Load)]


def rewrite(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: `fn` returns a replacement or None to keep a node."""
    if isinstance(expr, Unary):
        expr = Unary(expr.op, rewrite(expr.x, fn), expr.dtype)
    elif isinstance(expr, Cast):
        expr = Cast(rewrite(expr.x, fn), expr.dtype, expr.saturate, expr.round_mode)
    elif isinstance(expr, Binary):
        expr = Binary(expr.op, rewrite(expr.a, fn), rewrite(expr.b, fn), expr.dtype)
    elif isinstance(expr, Select):
        expr = Select(rewrite(expr.cond, fn), rewrite(expr.a, fn), rewrite(expr.b, fn), expr.dtype)
    elif isinstance(expr, Load):
        index = tuple(i if isinstance(i, str) else rewrite(i, fn) for i in expr.index)
        expr = Load(expr.tensor, index, expr.dtype)
    replaced = fn(expr)
    return expr if replaced is None else replaced


# --- constructors that work out the dtype -------------------------------------------------


def unary(op: str, x: Expr) -> Unary:
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op}")
    return Unary(op, x, "bool" if op == "not" else x.dtype)


def binary(op: str, a: Expr, b: Expr) -> Binary:
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary op {op}")
    dtype = "bool" if op in COMPARISONS | LOGICAL else a.dtype
    return Binary(op, a, b, dtype)


def select(cond: Expr, a: Expr, b: Expr) -> Select:
    return Select(cond, a, b, a.dtype)


def const(value: float | int | bool, dtype: str) -> Const:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return Const(bool(value), dtype)
    if kind in "iu":
        return Const(int(value), dtype)
    return Const(float(value), dtype)
