"""Compute definitions of the reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin,
ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp), ArgMax,
ArgMin and CumSum.

A reduction is an init statement (`init_of=`) writing the combiner's identity, then the
reduction statement (`reduction=` its combiner) over the kept dimensions followed by the
reduced ones, then, where needed, an elementwise statement finishing the value (the
division of the mean, the square root of L2, the cast of a float16 sum accumulated in
float32). Kept input axes are named `i<axis>`, reduced ones `k<axis>`; with keepdims the
written index holds 0 at the reduced axes. The accumulation dtypes are the frontend's
(its constant-folding evaluation): float16 sums and products in float32, means, L2 norms
and logarithms in float32 (float64 for float64).

ReduceLogSumExp reduces the maximum first and sums exp(x - max), so large inputs do not
overflow; an infinite maximum is replaced by 0 (an all -inf slice gives -inf, not NaN).

ArgMax (ArgMin) reduces the maximum (minimum) into a temporary, then the first (or last)
index whose value equals it: a min (max) reduction of `select(x == peak, k, sentinel)`,
where a NaN counts as equal so that a NaN peak yields its first index as numpy does.

CumSum is a running sum along its axis, n additions per row rather than the n(n+1)/2 of a
triangular reduction: a first statement writes the step-0 element, a second
`Y[s] = Y[s - 1] + X[s]` the others. The second reads what it wrote one step before, a
flow dependence carried by the step loop, so the poly layer keeps that loop sequential
(no parallel or vector mark, no reordering) while every other axis stays free. The step
`s` walks the axis forward, or backward with `reverse` (the element `n - 1 - s`), so that
program order is the scan's order either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polytile.frontend.ops.reduce import arg_axis, cumsum_axis, reduced_axes
from polytile.poly.ir.expr import Const, Expr, Iter, Load, binary, identity, select, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    acc_dtype,
    affine_text,
    as_dtype,
    lowering,
    reduction,
)


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


Prepare = Callable[[Expr], Expr]
Finish = Callable[[Expr, int], Expr]


def _square(value: Expr) -> Expr:
    return binary("mul", value, value)


def _reduce(
    ctx: LowerContext,
    combiner: str,
    acc_dtype: str,
    prepare: Prepare | None,
    finish: Finish | None,
) -> list[Statement]:
    """Y = finish(combine over the reduced axes of prepare(X in `acc_dtype`), count)."""
    x, out = ctx.input_type(0), ctx.output_type()
    axes = reduced_axes(ctx.infer_context())
    if not axes:
        # noop_with_empty_axes and no axes: a reduction over nothing, elementwise (for
        # ReduceL2 that is sqrt(x * x), as onnxruntime and onnx's reference compute it)
        dims = ctx.dims(x.rank)
        name = ctx.statement_name()
        value = as_dtype(ctx.load(ctx.node.inputs[0], dims), acc_dtype)
        if prepare is not None:
            value = prepare(value)
        if finish is not None:
            value = finish(value, 1)
        domain = ctx.domain(name, dims, x.shape)
        return [Statement(name, dims, domain, ctx.output(), dims, as_dtype(value, out.dtype))]
    keep = bool(int(ctx.attr("keepdims", 1)))  # type: ignore[arg-type]
    dims, outer, kept, reduced, out_index = _layout(ctx, axes, keep)
    outer_shape = [x.shape[a] for a in kept]
    red = (tuple(dims[a] for a in reduced), [x.shape[a] for a in reduced])
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), acc_dtype)
    if prepare is not None:
        value = prepare(value)
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
    return _reduce(ctx, "sum", acc_dtype(ctx.input_type(0).dtype), prepare=None, finish=None)


@lowering("ReduceMean")
def _reduce_mean(ctx: LowerContext) -> list[Statement]:
    """The sum (in float32 / float64) divided by the number of reduced elements."""
    acc = _float_acc(ctx.input_type(0).dtype)
    return _reduce(
        ctx,
        "sum",
        acc,
        prepare=None,
        finish=lambda total, count: binary("div", total, Const(float(count), acc)),
    )


@lowering("ReduceMax")
def _reduce_max(ctx: LowerContext) -> list[Statement]:
    return _reduce(ctx, "max", ctx.input_type(0).dtype, prepare=None, finish=None)


@lowering("ReduceMin")
def _reduce_min(ctx: LowerContext) -> list[Statement]:
    return _reduce(ctx, "min", ctx.input_type(0).dtype, prepare=None, finish=None)


@lowering("ReduceProd")
def _reduce_prod(ctx: LowerContext) -> list[Statement]:
    acc = acc_dtype(ctx.input_type(0).dtype)
    return _reduce(ctx, "prod", acc, prepare=None, finish=None)


@lowering("ReduceSumSquare")
def _reduce_sum_square(ctx: LowerContext) -> list[Statement]:
    acc = acc_dtype(ctx.input_type(0).dtype)
    return _reduce(ctx, "sum", acc, prepare=_square, finish=None)


@lowering("ReduceL1")
def _reduce_l1(ctx: LowerContext) -> list[Statement]:
    acc = acc_dtype(ctx.input_type(0).dtype)
    return _reduce(ctx, "sum", acc, prepare=lambda v: unary("abs", v), finish=None)


@lowering("ReduceLogSum")
def _reduce_log_sum(ctx: LowerContext) -> list[Statement]:
    acc = _float_acc(ctx.input_type(0).dtype)
    return _reduce(ctx, "sum", acc, prepare=None, finish=lambda total, _: unary("log", total))


@lowering("ReduceL2")
def _reduce_l2(ctx: LowerContext) -> list[Statement]:
    """sqrt of the sum of squares (in float32 / float64)."""
    acc = _float_acc(ctx.input_type(0).dtype)
    return _reduce(ctx, "sum", acc, prepare=_square, finish=lambda total, _: unary("sqrt", total))


@lowering("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx: LowerContext) -> list[Statement]:
    """peak = max x; shift = peak if finite else 0; Y = shift + log(Σ exp(x - shift))."""
    x, out = ctx.input_type(0), ctx.output_type()
    acc = _float_acc(x.dtype)
    axes = reduced_axes(ctx.infer_context())
    if not axes:  # no reduction: log(exp(x)), as the reference computes it
        return _reduce(
            ctx, "sum", acc, prepare=None, finish=lambda v, _: unary("log", unary("exp", v))
        )
    keep = bool(int(ctx.attr("keepdims", 1)))  # type: ignore[arg-type]
    dims, outer, kept, reduced, out_index = _layout(ctx, axes, keep)
    outer_shape = [x.shape[a] for a in kept]
    red = (tuple(dims[a] for a in reduced), [x.shape[a] for a in reduced])
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), acc)
    base = ctx.node.name
    peak = ctx.temp("max", outer_shape, acc)
    statements = reduction(
        ctx, f"{base}_reduce_max", (outer, outer_shape), red, peak, outer, value, "max"
    )
    top = ctx.load_temp(peak, outer)
    infinite = binary("eq", unary("abs", top), Const(math.inf, acc))
    shift = select(infinite, Const(0.0, acc), top)
    total = ctx.temp("sum", outer_shape, acc)
    statements += reduction(
        ctx,
        f"{base}_reduce_sum",
        (outer, outer_shape),
        red,
        total,
        outer,
        unary("exp", binary("sub", value, shift)),
        "sum",
    )
    result = binary("add", unary("log", ctx.load_temp(total, outer)), shift)
    name = ctx.statement_name()
    domain = ctx.domain(name, outer, outer_shape)
    expr = as_dtype(result, out.dtype)
    statements.append(Statement(name, outer, domain, ctx.output(), out_index, expr))
    return statements


@lowering("ArgMax", "ArgMin")
def _arg_extremum(ctx: LowerContext) -> list[Statement]:
    """peak[outer] = max_k x (min for ArgMin); Y[outer] = min_k (x == peak ? k : sentinel)
    (max with select_last_index)."""
    x = ctx.input_type(0)
    axis = arg_axis(ctx.infer_context())
    extreme = "max" if ctx.node.op_type == "ArgMax" else "min"
    keep = bool(int(ctx.attr("keepdims", 1)))  # type: ignore[arg-type]
    last = bool(int(ctx.attr("select_last_index", 0)))  # type: ignore[arg-type]
    dims, outer, kept, _, out_index = _layout(ctx, [axis], keep)
    outer_shape = [x.shape[a] for a in kept]
    red = ((dims[axis],), [x.shape[axis]])
    value = ctx.load(ctx.node.inputs[0], dims)
    peak = ctx.temp(extreme, outer_shape, x.dtype)
    statements = reduction(
        ctx,
        f"{ctx.node.name}_reduce_{extreme}",
        (outer, outer_shape),
        red,
        peak,
        outer,
        value,
        extreme,
    )
    hit = binary("eq", value, ctx.load_temp(peak, outer))
    if np.dtype(x.dtype).kind == "f":
        hit = binary("or", hit, binary("ne", value, value))  # NaN: the peak is NaN
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


@lowering("CumSum")
def _cumsum(ctx: LowerContext) -> list[Statement]:
    """Y[p(0)] = X[p(0)] (0 exclusive); Y[p(s)] = Y[p(s-1)] + X[p(s)] (X[p(s-1)]
    exclusive) for s >= 1, where p(s) = s, or n - 1 - s with reverse; accumulated in
    float32 for float16."""
    x = ctx.input_type(0)
    axis = cumsum_axis(ctx.infer_context())
    exclusive = bool(int(ctx.attr("exclusive", 0)))  # type: ignore[arg-type]
    reverse = bool(int(ctx.attr("reverse", 0)))  # type: ignore[arg-type]
    n = x.shape[axis]
    step = f"s{axis}"
    dims = tuple(step if a == axis else d for a, d in enumerate(ctx.dims(x.rank)))

    def at(offset: int) -> tuple[str, ...]:
        """The index of the element `offset` steps from the current one along the scan."""
        place = (
            affine_text([(-1, step)], n - 1 - offset)
            if reverse
            else affine_text([(1, step)], offset)
        )
        return tuple(place if a == axis else d for a, d in enumerate(dims))

    acc = acc_dtype(x.dtype)
    direct = acc == x.dtype
    target = ctx.output() if direct else ctx.temp("sum", x.shape, acc)
    source = ctx.node.inputs[0]
    first = ctx.const(0, acc) if exclusive else as_dtype(ctx.load(source, at(0)), acc)
    name = ctx.statement_name(f"{ctx.node.name}_scan_first")
    first_shape = [min(e, 1) if a == axis else e for a, e in enumerate(x.shape)]
    domain = ctx.domain(name, dims, first_shape)
    statements = [Statement(name, dims, domain, target, at(0), first)]
    if n > 1:
        added = as_dtype(ctx.load(source, at(-1) if exclusive else at(0)), acc)
        running = binary("add", Load(target, at(-1), acc), added)
        name = ctx.statement_name(f"{ctx.node.name}_scan")
        domain = ctx.domain(name, dims, x.shape, f"{step} >= 1")
        statements.append(Statement(name, dims, domain, target, at(0), running))
    if not direct:
        plain = ctx.dims(x.rank)
        name = ctx.statement_name()
        domain = ctx.domain(name, plain, x.shape)
        expr = as_dtype(ctx.load_temp(target, plain), x.dtype)
        statements.append(Statement(name, plain, domain, ctx.output(), plain, expr))
    return statements
