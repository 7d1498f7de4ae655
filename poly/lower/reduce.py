"""Compute definitions of the reductions: ReduceSum, ReduceMean, ReduceMax, ReduceL2 and
ArgMax.

A reduction is an init statement (`init_of=`) writing the combiner's identity, then the
reduction statement (`reduction=` its combiner) over the kept dimensions followed by the
reduced ones, then, where needed, an elementwise statement finishing the value (the
division of the mean, the square root of L2, the cast of a float16 sum accumulated in
float32). Kept input axes are named `i<axis>`, reduced ones `k<axis>`; with keepdims the
written index holds 0 at the reduced axes. The accumulation dtypes are the frontend's
(its constant-folding evaluation): float16 sums in float32, means and L2 norms in float32
(float64 for float64).

ArgMax reduces the maximum into a temporary, then the first (or last) index whose value
equals it: a min (max) reduction of `select(x == max, k, sentinel)`, where a NaN counts as
equal so that a NaN maximum yields its first index as numpy's argmax does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polytile.frontend.ops.reduce import reduced_axes

from ..expr import Const, Expr, Iter, binary, select, unary
from ..kernel import Statement
from ..reference import identity
from .base import LowerContext, as_dtype, lowering, reduction


def _layout(
    ctx: LowerContext, axes: Sequence[int], keep: bool
) -> tuple[tuple[str, ...], tuple[str, ...], list[int], list[int], tuple[str, ...]]:
    """Input dims (kept `i<a>`, reduced `k<a>`), the kept and reduced dims' names and
    extents, and the output index (0 at reduced axes with keepdims)."""
    shape = ctx.input_type(0).shape
    dims = tuple(f"k{a}" if a in axes else f"i{a}" for a in range(len(shape)))
    kept = [a for a in range(len(shape)) if a not in axes]
    index = tuple("0" if a in axes else d for a, d in enumerate(dims) if keep or a not in axes)
    return dims, tuple(dims[a] for a in kept), kept, list(axes), index


Finish = Callable[[Expr, int], Expr]


def _reduce(
    ctx: LowerContext, combiner: str, acc_dtype: str, square: bool, finish: Finish | None
) -> list[Statement]:
    x, out = ctx.input_type(0), ctx.output_type()
    axes = reduced_axes(ctx.infer_context())
    if not axes:
        # noop_with_empty_axes and no axes: a reduction over nothing, elementwise (for
        # ReduceL2 that is sqrt(x * x), as onnxruntime and onnx's reference compute it)
        dims = ctx.dims(x.rank)
        name = ctx.statement_name()
        value = as_dtype(ctx.load(ctx.node.inputs[0], dims), acc_dtype)
        if square:
            value = binary("mul", value, value)
        if finish is not None:
            value = finish(value, 1)
        domain = ctx.domain(name, dims, x.shape)
        return [Statement(name, dims, domain, ctx.output(), dims, as_dtype(value, out.dtype))]
    keep = bool(int(ctx.attr("keepdims", 1)))  # type: ignore[arg-type]
    dims, outer, kept, reduced, out_index = _layout(ctx, axes, keep)
    outer_shape = [x.shape[a] for a in kept]
    red = (tuple(dims[a] for a in reduced), [x.shape[a] for a in reduced])
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), acc_dtype)
    if square:
        value = binary("mul", value, value)
    direct = finish is None and acc_dtype == out.dtype
    target = ctx.output() if direct else ctx.temp(combiner, outer_shape, acc_dtype)
    index = out_index if direct else outer
    statements = reduction(
        ctx,
        f"{ctx.node.name}_reduce_{combiner}",
        (outer, outer_shape),
        red,
        target,
        index,
        value,
        combiner,
    )
    if not direct:
        result = ctx.load_temp(target, outer)
        if finish is not None:
            result = finish(result, math.prod(x.shape[a] for a in reduced))
        name = ctx.statement_name()
        domain = ctx.domain(name, outer, outer_shape)
        expr = as_dtype(result, out.dtype)
        statements.append(Statement(name, outer, domain, ctx.output(), out_index, expr))
    return statements


def _float_acc(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


@lowering("ReduceSum")
def _reduce_sum(ctx: LowerContext) -> list[Statement]:
    dtype = ctx.input_type(0).dtype
    acc = "float32" if dtype == "float16" else dtype
    return _reduce(ctx, "sum", acc, square=False, finish=None)


@lowering("ReduceMean")
def _reduce_mean(ctx: LowerContext) -> list[Statement]:
    """The sum (in float32 / float64) divided by the number of reduced elements."""
    acc = _float_acc(ctx.input_type(0).dtype)
    return _reduce(
        ctx,
        "sum",
        acc,
        square=False,
        finish=lambda total, count: binary("div", total, Const(float(count), acc)),
    )


@lowering("ReduceMax")
def _reduce_max(ctx: LowerContext) -> list[Statement]:
    return _reduce(ctx, "max", ctx.input_type(0).dtype, square=False, finish=None)


@lowering("ReduceL2")
def _reduce_l2(ctx: LowerContext) -> list[Statement]:
    """sqrt of the sum of squares (in float32 / float64)."""
    acc = _float_acc(ctx.input_type(0).dtype)
    return _reduce(ctx, "sum", acc, square=True, finish=lambda total, _: unary("sqrt", total))


@lowering("ArgMax")
def _argmax(ctx: LowerContext) -> list[Statement]:
    """peak[outer] = max_k x; Y[outer] = min_k (x == peak ? k : sentinel) (max with
    select_last_index)."""
    x = ctx.input_type(0)
    axis = ctx.infer_context().axis(int(ctx.attr("axis", 0)), x.rank)  # type: ignore[arg-type]
    keep = bool(int(ctx.attr("keepdims", 1)))  # type: ignore[arg-type]
    last = bool(int(ctx.attr("select_last_index", 0)))  # type: ignore[arg-type]
    dims, outer, kept, _, out_index = _layout(ctx, [axis], keep)
    outer_shape = [x.shape[a] for a in kept]
    red = ((dims[axis],), [x.shape[axis]])
    value = ctx.load(ctx.node.inputs[0], dims)
    peak = ctx.temp("max", outer_shape, x.dtype)
    statements = reduction(
        ctx, f"{ctx.node.name}_reduce_max", (outer, outer_shape), red, peak, outer, value, "max"
    )
    hit = binary("eq", value, ctx.load_temp(peak, outer))
    if np.dtype(x.dtype).kind == "f":
        hit = binary("or", hit, binary("ne", value, value))  # NaN: the maximum is NaN
    combiner = "max" if last else "min"
    sentinel = ctx.const(identity(combiner, "int64"), "int64")  # type: ignore[arg-type]
    position = select(hit, Iter(dims[axis], "int64"), sentinel)
    statements += reduction(
        ctx,
        f"{ctx.node.name}_reduce_index",
        (outer, outer_shape),
        red,
        ctx.output(),
        out_index,
        position,
        combiner,
    )
    return statements
