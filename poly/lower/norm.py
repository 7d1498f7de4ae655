"""Compute definitions of GroupNormalization, RMSNormalization, LpNormalization,
MeanVarianceNormalization and Hardmax.

Each is one or two reductions into per-slice temporaries (a mean, then an inverse scale
from the sum of squares) and one elementwise statement over the input's box applying
them, as LayerNormalization in `lower.nn`. Statistics are computed in the node's stash
dtype (float32 unless `stash_type` says float64) or, for the ops without one, in float32
for float16 inputs. The variance is the two-pass Σ (x - mean)² / N, which cannot go
negative as E[x²] - E[x]² (onnx's function bodies) can through rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polytile.frontend.ops.norm import lp_params, mvn_axes, norm_axis, num_groups, stash_dtype
from polytile.poly.ir.expr import Const, Expr, Iter, binary, identity, select, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    acc_dtype,
    as_dtype,
    box_statement,
    floordiv_text,
    lowering,
    reduction,
)

Box = tuple[Sequence[str], Sequence[int]]


def _elementwise(
    ctx: LowerContext, base: str, box: Box, tensor: str, index: Sequence[str], expr: Expr
) -> Statement:
    dims, shape = box
    name = ctx.statement_name(f"{ctx.node.name}_{base}")
    return box_statement(ctx, name, dims, shape, tensor, index, expr)


def _statistics(
    ctx: LowerContext,
    value: Expr,
    outer: Box,
    red: Box,
    centered: bool,
    finish: Callable[[Expr], Expr],
) -> tuple[list[Statement], str | None, str]:
    """mean = Σ value / N over `red` (when `centered`), then
    scale = finish(Σ (value - mean)² / N): the statements and the two temporaries (indexed
    by the `outer` dims)."""
    outer_dims, outer_shape = outer
    stat = value.dtype
    count = Const(float(math.prod(red[1])), stat)
    base = ctx.node.name
    statements: list[Statement] = []
    mean = None
    deviation = value
    if centered:
        total = ctx.temp("sum", outer_shape, stat)
        statements += reduction(
            ctx, f"{base}_reduce_sum", outer, red, total, outer_dims, value, "sum"
        )
        mean = ctx.temp("mean", outer_shape, stat)
        average = binary("div", ctx.load_temp(total, outer_dims), count)
        statements.append(_elementwise(ctx, "average", outer, mean, outer_dims, average))
        deviation = binary("sub", value, ctx.load_temp(mean, outer_dims))
    squares = ctx.temp("squares", outer_shape, stat)
    statements += reduction(
        ctx,
        f"{base}_reduce_squares",
        outer,
        red,
        squares,
        outer_dims,
        binary("mul", deviation, deviation),
        "sum",
    )
    scale = ctx.temp("scale", outer_shape, stat)
    variance = binary("div", ctx.load_temp(squares, outer_dims), count)
    statements.append(_elementwise(ctx, "scale", outer, scale, outer_dims, finish(variance)))
    return statements, mean, scale


def _rsqrt_plus(epsilon: float) -> Callable[[Expr], Expr]:
    """v → 1 / sqrt(v + epsilon)."""
    return lambda v: unary("recip", unary("sqrt", binary("add", v, Const(epsilon, v.dtype))))


def _epsilon(ctx: LowerContext) -> float:
    return float(ctx.attr("epsilon", 1e-5))  # type: ignore[arg-type]


@lowering("GroupNormalization")
def _group_norm(ctx: LowerContext) -> list[Statement]:
    """Statistics per (n, group) over the group's channels and the spatial axes, then
    Y[n, c, ..] = T((X - mean) * inv_std) * scale[c] + bias[c], the affine part in X's
    dtype as onnx's function body."""
    info = ctx.infer_context()
    x = ctx.input_type(0)
    groups = num_groups(info)
    stat = stash_dtype(info)
    size = x.shape[1] // groups
    spatial = tuple(f"s{i}" for i in range(x.rank - 2))
    channel = f"{size}*g + cc" if size > 1 else "g"
    value = as_dtype(ctx.load(ctx.node.inputs[0], ("n", channel, *spatial)), stat)
    outer = (("n", "g"), (x.shape[0], groups))
    red = (("cc", *spatial), (size, *x.shape[2:]))
    statements, mean, inv = _statistics(ctx, value, outer, red, True, _rsqrt_plus(_epsilon(ctx)))
    assert mean is not None
    dims = ("n", "c", *spatial)
    group = ("n", floordiv_text("c", size))
    element = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    normalized = binary(
        "mul", binary("sub", element, ctx.load_temp(mean, group)), ctx.load_temp(inv, group)
    )
    scale = ctx.load(ctx.node.inputs[1], ("c",))
    bias = ctx.load(ctx.node.inputs[2], ("c",))
    result = binary(
        "add",
        binary("mul", as_dtype(normalized, x.dtype), as_dtype(scale, x.dtype)),
        as_dtype(bias, x.dtype),
    )
    statements.append(_elementwise(ctx, "apply", (dims, x.shape), ctx.output(), dims, result))
    return statements


@lowering("RMSNormalization")
def _rms_norm(ctx: LowerContext) -> list[Statement]:
    """inv_rms = 1 / sqrt(Σ x² / N + epsilon) over the axes from `axis` on (in the stash
    dtype), then Y = V(T(x * inv_rms)) * scale."""
    info = ctx.infer_context()
    x, out = ctx.input_type(0), ctx.output_type()
    axis = norm_axis(info)
    stat = stash_dtype(info)
    dims = ctx.dims(x.rank)
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    outer = (dims[:axis], x.shape[:axis])
    red = (dims[axis:], x.shape[axis:])
    statements, _, inv = _statistics(ctx, value, outer, red, False, _rsqrt_plus(_epsilon(ctx)))
    normalized = as_dtype(binary("mul", value, ctx.load_temp(inv, dims[:axis])), x.dtype)
    scale = ctx.broadcast_load(ctx.node.inputs[1], dims, x.shape)
    result = binary("mul", as_dtype(normalized, out.dtype), scale)
    statements.append(_elementwise(ctx, "apply", (dims, x.shape), ctx.output(), dims, result))
    return statements


@lowering("LpNormalization")
def _lp_norm(ctx: LowerContext) -> list[Statement]:
    """norm = Σ |x| (p = 1) or sqrt(Σ x²) (p = 2) along `axis`; Y = x / norm, 0 where the
    norm is 0 (as onnx's reference)."""
    x = ctx.input_type(0)
    axis, p = lp_params(ctx.infer_context())
    stat = acc_dtype(x.dtype)
    dims = ctx.dims(x.rank)
    source = tuple("k" if a == axis else d for a, d in enumerate(dims))
    outer_dims = dims[:axis] + dims[axis + 1 :]
    outer = (outer_dims, x.shape[:axis] + x.shape[axis + 1 :])
    value = as_dtype(ctx.load(ctx.node.inputs[0], source), stat)
    magnitude = unary("abs", value) if p == 1 else binary("mul", value, value)
    total = ctx.temp("norm", outer[1], stat)
    statements = reduction(
        ctx,
        f"{ctx.node.name}_reduce_norm",
        outer,
        (("k",), (x.shape[axis],)),
        total,
        outer_dims,
        magnitude,
        "sum",
    )
    norm = ctx.load_temp(total, outer_dims)
    if p == 2:
        norm = unary("sqrt", norm)
    zero = Const(0.0, stat)
    inverse = select(binary("eq", norm, zero), zero, unary("recip", norm))
    inv = ctx.temp("inv_norm", outer[1], stat)
    statements.append(_elementwise(ctx, "inverse", outer, inv, outer_dims, inverse))
    element = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    result = as_dtype(binary("mul", element, ctx.load_temp(inv, outer_dims)), x.dtype)
    statements.append(_elementwise(ctx, "apply", (dims, x.shape), ctx.output(), dims, result))
    return statements


@lowering("MeanVarianceNormalization")
def _mvn(ctx: LowerContext) -> list[Statement]:
    """Y = (x - mean) / (sqrt(variance) + 1e-9) over `axes`."""
    x = ctx.input_type(0)
    axes = mvn_axes(ctx.infer_context())
    stat = acc_dtype(x.dtype)
    kept = [a for a in range(x.rank) if a not in axes]
    source = tuple(f"k{a}" if a in axes else f"i{a}" for a in range(x.rank))
    outer = (tuple(f"i{a}" for a in kept), tuple(x.shape[a] for a in kept))
    red = (tuple(f"k{a}" for a in axes), tuple(x.shape[a] for a in axes))
    value = as_dtype(ctx.load(ctx.node.inputs[0], source), stat)
    tiny = Const(1e-9, stat)
    statements, mean, inv = _statistics(
        ctx,
        value,
        outer,
        red,
        True,
        lambda v: unary("recip", binary("add", unary("sqrt", v), tiny)),
    )
    assert mean is not None
    dims = ctx.dims(x.rank)
    element = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    centered = binary("sub", element, ctx.load_temp(mean, outer[0]))
    result = as_dtype(binary("mul", centered, ctx.load_temp(inv, outer[0])), x.dtype)
    statements.append(_elementwise(ctx, "apply", (dims, x.shape), ctx.output(), dims, result))
    return statements


@lowering("Hardmax")
def _hardmax(ctx: LowerContext) -> list[Statement]:
    """peak = max along `axis`; first = min k with x[k] == peak (a NaN counts as the
    peak, as numpy's argmax); Y = (i == first) ? 1 : 0."""
    x = ctx.input_type(0)
    axis = ctx.infer_context().axis(int(ctx.attr("axis", -1)), x.rank)  # type: ignore[arg-type]
    dims = ctx.dims(x.rank)
    source = tuple("k" if a == axis else d for a, d in enumerate(dims))
    outer_dims = dims[:axis] + dims[axis + 1 :]
    outer = (outer_dims, x.shape[:axis] + x.shape[axis + 1 :])
    red = (("k",), (x.shape[axis],))
    value = ctx.load(ctx.node.inputs[0], source)
    peak = ctx.temp("max", outer[1], x.dtype)
    base = ctx.node.name
    statements = reduction(ctx, f"{base}_reduce_max", outer, red, peak, outer_dims, value, "max")
    hit = binary("eq", value, ctx.load_temp(peak, outer_dims))
    if np.dtype(x.dtype).kind == "f":
        hit = binary("or", hit, binary("ne", value, value))
    sentinel = ctx.const(identity("min", "int64"), "int64")  # type: ignore[arg-type]
    first = ctx.temp("first", outer[1], "int64")
    statements += reduction(
        ctx,
        f"{base}_reduce_index",
        outer,
        red,
        first,
        outer_dims,
        select(hit, Iter("k", "int64"), sentinel),
        "min",
    )
    chosen = binary("eq", Iter(dims[axis], "int64"), ctx.load_temp(first, outer_dims))
    result = select(chosen, Const(1.0, x.dtype), Const(0.0, x.dtype))
    statements.append(_elementwise(ctx, "apply", (dims, x.shape), ctx.output(), dims, result))
    return statements
