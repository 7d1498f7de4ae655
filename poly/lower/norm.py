"""Compute definitions of the normalizations (LayerNormalization, InstanceNormalization,
GroupNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization) and
Hardmax.

Each is one or two reductions into per-slice statistics (a mean, then an inverse scale
from the sum of squares: `moments`, shared by all) and one elementwise statement over
the input's box applying them. Statistics are float32 for LayerNormalization, in the
node's stash dtype where it has one (float32 unless `stash_type` says float64), else
in float32 for float16 inputs. The variance is the two-pass Σ (x - mean)² / N, which
cannot go negative as E[x²] - E[x]² (onnx's function bodies) can through rounding.
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
from polytile.poly.lower.window import spatial_dims

Box = tuple[Sequence[str], Sequence[int]]
#: where a statistic goes: a tensor and its index
Target = tuple[str, Sequence[str]]


def _elementwise(
    ctx: LowerContext, base: str, box: Box, tensor: str, index: Sequence[str], expr: Expr
) -> Statement:
    dims, shape = box
    name = ctx.statement_name(f"{ctx.node.name}_{base}")
    return box_statement(ctx, name, dims, shape, tensor, index, expr)


def moments(
    ctx: LowerContext,
    value: Expr,
    outer: Box,
    red: Box,
    finish: Callable[[Expr], Expr],
    scale: Target,
    mean: Target | None,
) -> list[Statement]:
    """mean = Σ value / N over the `red` dims into `mean` (skipped when None: an
    uncentered statistic), then scale = finish(Σ (value - mean)² / N) into `scale`;
    `value` is in the statistics dtype, targets are (tensor, index by the `outer` dims)."""
    outer_dims, outer_shape = outer
    stat = value.dtype
    count = Const(float(math.prod(red[1])), stat)
    base = ctx.node.name
    statements: list[Statement] = []
    deviation = value
    if mean is not None:
        total = ctx.temp("sum", outer_shape, stat)
        statements += reduction(
            ctx, f"{base}_reduce_sum", outer, red, total, outer_dims, value, "sum"
        )
        average = binary("div", ctx.load_temp(total, outer_dims), count)
        statements.append(_elementwise(ctx, "average", outer, *mean, average))
        deviation = binary("sub", value, ctx.load_temp(*mean))
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
    variance = binary("div", ctx.load_temp(squares, outer_dims), count)
    statements.append(_elementwise(ctx, "scale", outer, *scale, finish(variance)))
    return statements


def _temporaries(
    ctx: LowerContext, outer: Box, dtype: str, centered: bool
) -> tuple[Target, Target | None]:
    """Temporaries for the scale and (when `centered`) the mean, indexed by `outer`."""
    dims, shape = outer
    scale = (ctx.temp("scale", shape, dtype), tuple(dims))
    mean = (ctx.temp("mean", shape, dtype), tuple(dims)) if centered else None
    return scale, mean


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
    inv, mean = _temporaries(ctx, outer, stat, centered=True)
    assert mean is not None
    statements = moments(ctx, value, outer, red, _rsqrt_plus(_epsilon(ctx)), inv, mean)
    dims = ("n", "c", *spatial)
    group = ("n", floordiv_text("c", size))
    element = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    normalized = binary(
        "mul", binary("sub", element, ctx.load_temp(mean[0], group)), ctx.load_temp(inv[0], group)
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
    inv, _ = _temporaries(ctx, outer, stat, centered=False)
    statements = moments(ctx, value, outer, red, _rsqrt_plus(_epsilon(ctx)), inv, None)
    normalized = as_dtype(binary("mul", value, ctx.load_temp(*inv)), x.dtype)
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
    inv, mean = _temporaries(ctx, outer, stat, centered=True)
    assert mean is not None
    finish = lambda v: unary("recip", binary("add", unary("sqrt", v), tiny))  # noqa: E731
    statements = moments(ctx, value, outer, red, finish, inv, mean)
    dims = ctx.dims(x.rank)
    element = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    centered = binary("sub", element, ctx.load_temp(*mean))
    result = as_dtype(binary("mul", centered, ctx.load_temp(*inv)), x.dtype)
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


# --- LayerNormalization and InstanceNormalization ---------------------------------------------


def _statistic(
    ctx: LowerContext,
    output: int,
    base: str,
    dims: Sequence[str],
    shape: Sequence[int],
    kept: int,
    dtype: str,
) -> tuple[str, tuple[str, ...]]:
    """Where a statistic over the leading `dims` goes: the node's optional output `output`
    (the input's rank, the reduced axes kept as 1) when it is requested, else a temporary."""
    outputs = ctx.node.outputs
    if output < len(outputs) and outputs[output]:
        return ctx.output(output), (*dims, *("0",) * kept)
    return ctx.temp(base, shape, dtype), tuple(dims)


@lowering("LayerNormalization")
def _layer_norm(ctx: LowerContext) -> list[Statement]:
    """Mean and inverse standard deviation over the axes from `axis` on (float32, into the
    optional Mean / InvStdDev outputs when requested), then
    Y = (X - mean) * inv_std * Scale + B."""
    x = ctx.input_type(0)
    axis = int(ctx.attr("axis", -1))  # type: ignore[arg-type]
    axis = axis + x.rank if axis < 0 else axis
    if int(ctx.attr("stash_type", 1)) != 1:  # type: ignore[arg-type]
        raise ctx.unsupported("stash_type other than 1 (float32 statistics)")
    epsilon = float(ctx.attr("epsilon", 1e-5))  # type: ignore[arg-type]
    dims = ctx.dims(x.rank)
    outer = (dims[:axis], x.shape[:axis])
    red = (dims[axis:], x.shape[axis:])
    stat = "float32"  # stash_type 1
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    kept = x.rank - axis
    mean = _statistic(ctx, 1, "mean", dims[:axis], x.shape[:axis], kept, stat)
    inv_std = _statistic(ctx, 2, "inv_std", dims[:axis], x.shape[:axis], kept, stat)
    statements = moments(ctx, value, outer, red, _rsqrt_plus(epsilon), inv_std, mean)
    normalized = binary(
        "mul",
        binary("sub", value, ctx.load_temp(mean[0], mean[1])),
        ctx.load_temp(inv_std[0], inv_std[1]),
    )
    result = binary(
        "mul", as_dtype(normalized, x.dtype), ctx.broadcast_load(ctx.node.inputs[1], dims, x.shape)
    )
    if ctx.has_input(2):
        result = binary("add", result, ctx.broadcast_load(ctx.node.inputs[2], dims, x.shape))
    name = ctx.statement_name()
    statements.append(box_statement(ctx, name, dims, x.shape, ctx.output(), dims, result))
    return statements


@lowering("InstanceNormalization")
def _instance_norm(ctx: LowerContext) -> list[Statement]:
    """Statistics per (n, c) over the spatial axes, then
    Y = (X - mean) * inv_std * scale[c] + B[c]."""
    x = ctx.input_type(0)
    epsilon = float(ctx.attr("epsilon", 1e-5))  # type: ignore[arg-type]
    spatial = spatial_dims(x.rank - 2, "")
    dims = ("n", "c", *spatial)
    stat = acc_dtype(x.dtype)
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    outer = (("n", "c"), x.shape[:2])
    mean = (ctx.temp("mean", x.shape[:2], stat), ("n", "c"))
    inv_std = (ctx.temp("inv_std", x.shape[:2], stat), ("n", "c"))
    red = (spatial, x.shape[2:])
    statements = moments(ctx, value, outer, red, _rsqrt_plus(epsilon), inv_std, mean)
    scale = as_dtype(ctx.load(ctx.node.inputs[1], ("c",)), stat)
    bias = as_dtype(ctx.load(ctx.node.inputs[2], ("c",)), stat)
    normalized = binary(
        "mul",
        binary("sub", value, ctx.load_temp(*mean)),
        ctx.load_temp(*inv_std),
    )
    result = binary("add", binary("mul", normalized, scale), bias)
    name = ctx.statement_name()
    statements.append(
        box_statement(ctx, name, dims, x.shape, ctx.output(), dims, as_dtype(result, x.dtype))
    )
    return statements
