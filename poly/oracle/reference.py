"""Execute a kernel in its program order, point by point: the meaning of a kernel.

Slow (a Python call per statement instance) and only for small shapes; it is the oracle
that lowering, the AST interpreter and every schedule transformation are checked against.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import replace

import islpy as isl
import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype name)
import numpy as np

from polytile.frontend.narrow import NARROW_DTYPES, cast_array
from polytile.poly.ir.buffers import allocate
from polytile.poly.ir.expr import Binary, Cast, Const, Expr, Iter, Load, Select, Unary
from polytile.poly.ir.kernel import Kernel, Statement

BF16 = "bfloat16"
_ERF = np.vectorize(math.erf, otypes=[np.float64])

UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "erf": lambda x: _ERF(x),
    "tanh": np.tanh,
    "floor": np.floor,
    "ceil": np.ceil,
    "not": np.logical_not,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "recip": lambda x: 1.0 / x,
    "relu": lambda x: np.maximum(x, 0),
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "round": np.round,  # halves to even
    "bitnot": np.invert,
}


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.asarray(a).dtype, np.integer):  # C semantics: truncate toward zero
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0)))
    return np.divide(a, b)


BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _div,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
    "mod": np.fmod,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.logical_and,
    "or": np.logical_or,
    "xor": np.logical_xor,
    "bitand": np.bitwise_and,
    "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor,
}

COMBINE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def evaluate(expr: Expr, point: Mapping[str, int], buffers: Mapping[str, np.ndarray]) -> object:
    """The value of `expr` at one statement instance (numpy scalars, in the expr's dtype;
    bfloat16 is computed in float32 and rounded, as the ONNX spec says)."""
    dtype = np.dtype(expr.dtype)
    if isinstance(expr, Cast) and NARROW_DTYPES & {expr.dtype, expr.x.dtype}:
        # ONNX's Cast with its saturate and round_mode (frontend/narrow.py)
        value = np.asarray(evaluate(expr.x, point, buffers), dtype=expr.x.dtype)
        return cast_array(value, expr.dtype, expr.saturate, expr.round_mode)[()]
    if dtype.name == BF16 and not isinstance(expr, Load | Select):
        wide: Expr
        if isinstance(expr, Const):
            wide = Const(expr.value, "float64")
        elif isinstance(expr, Iter):
            wide = Iter(expr.name, "int64")
        elif isinstance(expr, Cast):
            wide = expr.x
        else:
            wide = replace(expr, dtype="float32")
        return bfloat16_of(evaluate(wide, point, buffers))
    if isinstance(expr, Const):
        return dtype.type(expr.value)
    if isinstance(expr, Iter):
        return dtype.type(point[expr.name])
    if isinstance(expr, Load):
        index = tuple(
            affine(i, point) if isinstance(i, str) else int(evaluate(i, point, buffers))
            for i in expr.index
        )
        value = buffers[expr.tensor][index]
        return np.float32(value) if dtype.name == BF16 else value  # exact
    if isinstance(expr, Unary):
        return dtype.type(UNARY[expr.op](evaluate(expr.x, point, buffers)))
    if isinstance(expr, Binary):
        a = evaluate(expr.a, point, buffers)
        b = evaluate(expr.b, point, buffers)
        return dtype.type(BINARY[expr.op](a, b))
    if isinstance(expr, Select):
        cond = evaluate(expr.cond, point, buffers)
        return evaluate(expr.a, point, buffers) if cond else evaluate(expr.b, point, buffers)
    if isinstance(expr, Cast):
        return dtype.type(evaluate(expr.x, point, buffers))
    raise TypeError(f"not an expression: {expr!r}")


def bfloat16_of(value: object) -> np.generic:
    """`value` rounded to the nearest bfloat16 (ties to even) in one rounding: a float64
    goes to float32 rounding to odd first (ml_dtypes would round twice); NaN stays NaN."""
    x = np.float64(value)  # exact for every float32, float16, bfloat16 and 32-bit integer
    with np.errstate(over="ignore"):
        f = np.float32(x)
    if np.isfinite(x) and float(f) != float(x):
        bits = np.array(f).view(np.uint32)
        if abs(float(f)) > abs(float(x)):
            bits = bits - np.uint32(1)
        f = (bits | np.uint32(1)).view(np.float32)
    return np.array(f).astype(BF16)[()]


_FLOOR = re.compile(r"floor\(")


def affine(text: str, point: Mapping[str, int]) -> int:
    """An isl quasi-affine expression at a point. Division only appears as floor(e/c) of
    integers, evaluated exactly as e // c."""
    py = _FLOOR.sub("(", text).replace("/", "//")
    return int(eval(py, {"__builtins__": {}}, dict(point)))


def execute_statement(
    s: Statement, point: Mapping[str, int], buffers: dict[str, np.ndarray]
) -> None:
    index = tuple(affine(i, point) for i in s.index)
    value = evaluate(s.expr, point, buffers)
    out = buffers[s.tensor]
    if s.reduction is None:
        out[index] = value
    else:
        out[index] = COMBINE[s.reduction](out[index], value)


def points(s: Statement) -> list[dict[str, int]]:
    """The statement's domain points in lexicographic order."""
    found: list[tuple[int, ...]] = []
    s.domain_set().foreach_point(
        lambda p: found.append(
            tuple(p.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(len(s.dims)))
        )
    )
    found.sort()
    return [dict(zip(s.dims, coords, strict=True)) for coords in found]


def run_program_order(kernel: Kernel, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All buffers after executing every statement over its domain, in program order."""
    buffers = allocate(kernel, inputs)
    for s in kernel.statements:
        for point in points(s):
            execute_statement(s, point, buffers)
    return buffers
