"""Compute definitions of MaxPool and AveragePool: a max / sum reduction over the window
taps inside X (the domain excludes the padding, so no statement loads out of bounds), or,
for a pool sliding by one over long rows, over a padded copy of X (`PAD_MIN_ROW`).

MaxPool's Indices output is the flat index in X of each window's first maximum (the
first in the window's row-major scan, as onnxruntime and onnx's reference pick ties):
a min reduction of `select(x == y, row-major index, sentinel)` over the same taps after
the max, the row-major index turned column-major over the spatial axes when
storage_order=1.
"""

from __future__ import annotations

import math

import numpy as np

from polytile.frontend.ops.nn import Window
from polytile.frontend.ops.pool import pool_window
from polytile.poly.ir.expr import Const, Expr, Iter, binary, const, identity, select
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    acc_dtype,
    as_dtype,
    box_statement,
    lowering,
    reduction,
)
from polytile.poly.lower.window import (
    PAD_MIN_ROW,
    padded_input,
    padded_taps,
    spatial_dims,
    window_taps,
)


def _tap_counts(window: Window, axis: int, low: int, high: int) -> np.ndarray:
    """For each output position of a spatial axis, how many window taps `o*s + k*d - p`
    fall in [low, high)."""
    s, d, p = window.strides[axis], window.dilations[axis], window.pads[axis]
    size, kernel = window.out[axis], window.kernel[axis]
    pos = np.arange(size)[:, None] * s + np.arange(kernel)[None, :] * d - p
    return ((pos >= low) & (pos < high)).sum(axis=1)


@lowering("MaxPool", "AveragePool")
def _pool(ctx: LowerContext) -> list[Statement]:
    """A max / sum reduction over the window taps inside X (or over every tap of a padded
    copy of X holding the combiner's identity outside it). The average divides by the
    number of taps inside X, or with count_include_pad inside the padded input (the
    overhang of ceil_mode never counts). The count is a product over the spatial axes; an
    axis whose count varies with the output position gets it counted exactly, by a small
    reduction of 1 over the same clipped taps (computed first, so the division can run
    inside the tile of the main reduction)."""
    out, window = pool_window(ctx.infer_context())
    x = ctx.input_type(0)
    rank = x.rank - 2
    o, k = spatial_dims(rank, "o"), spatial_dims(rank, "k")
    out_dims = ("n", "c", *o)
    taps = (k, window.kernel)
    spatial, bounds = window_taps(window, x.shape[2:], o, k)
    where = [c for axis in bounds for c in axis]
    value = ctx.load(ctx.node.inputs[0], ("n", "c", *spatial))
    statements: list[Statement] = []
    max_pool = ctx.node.op_type == "MaxPool"
    if any(window.pads) and set(window.strides) == {1} and window.out[-1] >= PAD_MIN_ROW:
        lowest = np.asarray(identity("max", x.dtype)).item()
        padded, statements = padded_input(ctx, window, lowest if max_pool else 0)
        value, where = ctx.load_temp(padded, ("n", "c", *padded_taps(window, o, k))), []
    if max_pool:
        statements += reduction(
            ctx,
            ctx.node.name,
            (out_dims, out.shape),
            taps,
            ctx.output(),
            out_dims,
            value,
            "max",
            where,
        )
        if len(ctx.node.outputs) > 1:
            statements += _max_indices(ctx, window, (out_dims, out.shape), taps)
        return statements
    acc = acc_dtype(out.dtype)
    if ctx.attr("count_include_pad", 0):
        lows = [-window.pads[i] for i in range(rank)]
        highs = [x.shape[2 + i] + window.pads[rank + i] for i in range(rank)]
        _, count_bounds = window_taps(window, x.shape[2:], o, k, lows, highs)
    else:
        lows, highs, count_bounds = [0] * rank, list(x.shape[2:]), bounds
    constant, factors = 1, []
    for i in range(rank):
        counts = _tap_counts(window, i, lows[i], highs[i])
        if len(set(counts.tolist())) <= 1:
            constant *= int(counts[0]) if len(counts) else 1
            continue
        count = ctx.temp(f"taps_{o[i]}", (window.out[i],), acc)
        statements += reduction(
            ctx,
            f"{ctx.node.name}_count_{o[i]}",
            ((o[i],), (window.out[i],)),
            ((k[i],), (window.kernel[i],)),
            count,
            (o[i],),
            ctx.const(1.0, acc),
            "sum",
            count_bounds[i],
        )
        factors.append(ctx.load_temp(count, (o[i],)))
    total = ctx.temp("sum", out.shape, acc)
    statements += reduction(
        ctx,
        f"{ctx.node.name}_reduce_sum",
        (out_dims, out.shape),
        taps,
        total,
        out_dims,
        as_dtype(value, acc),
        "sum",
        where,
    )
    divisor: Expr | None = None if constant == 1 and factors else ctx.const(constant, acc)
    for factor in factors:
        divisor = factor if divisor is None else binary("mul", divisor, factor)
    assert divisor is not None
    name = ctx.statement_name()
    mean = as_dtype(binary("div", ctx.load_temp(total, out_dims), divisor), out.dtype)
    statements.append(box_statement(ctx, name, out_dims, out.shape, ctx.output(), out_dims, mean))
    return statements


def _max_indices(
    ctx: LowerContext,
    window: Window,
    out: tuple[tuple[str, ...], tuple[int, ...]],
    taps: tuple[tuple[str, ...], tuple[int, ...]],
) -> list[Statement]:
    """Indices[n, c, o] = the least row-major flat index of a tap inside X holding the
    maximum Y[n, c, o] (a NaN maximum: the first NaN); with storage_order=1 the spatial
    part of that index is re-linearized column-major."""
    x = ctx.input_type(0)
    sizes = x.shape[2:]
    out_dims, out_shape = out
    o, k = out_dims[2:], taps[0]
    spatial, bounds = window_taps(window, sizes, o, k)
    where = [c for axis in bounds for c in axis]
    value = ctx.load(ctx.node.inputs[0], ("n", "c", *spatial))
    peak = ctx.load(ctx.node.outputs[0], out_dims)
    hit = binary("eq", value, peak)
    if np.dtype(x.dtype).kind == "f":
        nan = binary("and", binary("ne", peak, peak), binary("ne", value, value))
        hit = binary("or", hit, nan)
    i64 = lambda v: Const(int(v), "int64")  # noqa: E731
    positions = [
        binary(
            "sub",
            binary(
                "add",
                binary("mul", Iter(o[i]), i64(window.strides[i])),
                binary("mul", Iter(k[i]), i64(window.dilations[i])),
            ),
            i64(window.pads[i]),
        )
        for i in range(len(sizes))
    ]
    key: Expr = i64(0)  # the tap's row-major position in its (n, c) plane
    for position, size in zip(positions, sizes, strict=True):
        key = binary("add", binary("mul", key, i64(size)), position)
    channel = binary("add", binary("mul", Iter("n"), i64(x.shape[1])), Iter("c"))
    plane = binary("mul", channel, i64(math.prod(sizes)))
    sentinel = const(identity("min", "int64"), "int64")  # type: ignore[arg-type]
    column_major = bool(int(ctx.attr("storage_order", 0)))  # type: ignore[arg-type]
    if not column_major:
        flat = select(hit, binary("add", plane, key), sentinel)
        return reduction(
            ctx, f"{ctx.node.name}_indices", out, taps, ctx.output(1), out_dims, flat, "min", where
        )
    first = ctx.temp("first", out_shape, "int64")
    statements = reduction(
        ctx,
        f"{ctx.node.name}_first",
        out,
        taps,
        first,
        out_dims,
        select(hit, key, sentinel),
        "min",
        where,
    )
    row_major = ctx.load_temp(first, out_dims)
    index: Expr = plane
    inner, outer = 1, math.prod(sizes)  # column-major stride of the axis, row-major one
    for size in sizes:
        outer //= size
        position = binary("mod", binary("div", row_major, i64(outer)), i64(size))
        index = binary("add", index, binary("mul", position, i64(inner)))
        inner *= size
    name = ctx.statement_name(f"{ctx.node.name}_indices")
    statements.append(box_statement(ctx, name, out_dims, out_shape, ctx.output(1), out_dims, index))
    return statements
