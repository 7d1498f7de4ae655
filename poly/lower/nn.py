"""Compute definitions of the neural-network ops: convolutions, matrix products, global
pooling, softmax and LRN (MaxPool and AveragePool are in `lower.pool`, the
normalizations in `lower.norm`).

Every heavy op is a reduction statement (`reduction=` its combiner) over the output's
dimensions followed by the reduced ones, preceded by its init statement (`init_of=`)
writing the combiner's identity or a start value (a bias, `beta * C`). Padding is part of
the domain: a window tap that falls outside the input is not a point of the reduction
(`0 <= oh*s + kh*d - p < H`), so no statement loads out of bounds (a depthwise conv
reusing its input enough reads a zero-padded copy instead: `_pads_depthwise`). The
transposed convolution is written in gather form: an output position reduces over the taps whose
input position `(o + p - k*d) / s` is an integer inside the input (an existential in the
domain).

Windows come from the frontend's `conv_window` / `conv_transpose_window`,
the one place where the window rules live. float16 tensors accumulate in float32
temporaries and are cast once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polytile.frontend.graph import TensorType
from polytile.frontend.ops.matmul import einsum_spec
from polytile.frontend.ops.nn import Window, conv_transpose_window, conv_window
from polytile.poly.ir.expr import Cast, Expr, binary, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    acc_dtype,
    affine_text,
    as_dtype,
    box_statement,
    broadcast,
    lowering,
    reduction,
)
from polytile.poly.lower.window import (
    padded_input,
    padded_taps,
    spatial_dims,
    window_taps,
    within,
)
from polytile.poly.lower.winograd import applies as winograd_applies
from polytile.poly.lower.winograd import conv as winograd_conv

# --- helpers --------------------------------------------------------------------------------


def _accumulator(ctx: LowerContext, out: TensorType) -> str:
    """Where a sum producing the node's output accumulates: the output itself, or a float32
    temporary for a float16 output (see `_store`)."""
    acc = acc_dtype(out.dtype)
    return ctx.output() if acc == out.dtype else ctx.temp("acc", out.shape, acc)


def _store(ctx: LowerContext, acc: str, dims: Sequence[str], out: TensorType) -> list[Statement]:
    """The cast of a float32 accumulator into the float16 output (nothing otherwise)."""
    if acc == ctx.output():
        return []
    name = ctx.statement_name(f"{ctx.node.name}_store")
    value = Cast(ctx.load_temp(acc, dims), out.dtype)
    return [box_statement(ctx, name, dims, out.shape, ctx.output(), dims, value)]


def _sum(
    ctx: LowerContext,
    out: TensorType,
    out_dims: Sequence[str],
    red: tuple[Sequence[str], Sequence[int]],
    product: Expr,
    where: Sequence[str] = (),
    start: Expr | None = None,
) -> list[Statement]:
    """Y[out_dims] = start + Σ_red product (over the points in `where`), in the
    accumulator `_accumulator` picks and stored by `_store`."""
    target = _accumulator(ctx, out)
    statements = reduction(
        ctx,
        ctx.node.name,
        (out_dims, out.shape),
        red,
        target,
        out_dims,
        product,
        "sum",
        where,
        start,
    )
    return [*statements, *_store(ctx, target, out_dims, out)]


def _group_channel(out: str, per_group_out: int, per_group_in: int, tap: str, group: int) -> str:
    """The input channel `g * per_group_in + tap` of output channel `out` in group
    `g = floor(out / per_group_out)`."""
    if group == 1:
        return tap
    if per_group_out == 1:
        return affine_text([(per_group_in, out), (1, tap)])
    scale = "" if per_group_in == 1 else f"{per_group_in}*"
    return f"{scale}floor({out}/{per_group_out}) + {tap}"


# --- convolutions ------------------------------------------------------------------------------


def _convolution_sum(
    ctx: LowerContext,
    out: TensorType,
    out_dims: tuple[str, ...],
    x_load: Expr,
    w_index: Sequence[str],
    taps: tuple[Sequence[str], Sequence[int]],
    where: Sequence[str],
) -> list[Statement]:
    """Y[out_dims] = B[m] + Σ_taps X · W[w_index] over the taps in `where`, the sum
    shared by Conv and ConvTranspose (float16 accumulates in float32)."""
    acc = acc_dtype(out.dtype)
    product = binary(
        "mul",
        as_dtype(x_load, acc),
        as_dtype(ctx.load(ctx.node.inputs[1], w_index), acc),
    )
    bias = ctx.load(ctx.node.inputs[2], ("m",)) if ctx.has_input(2) else ctx.const(0, acc)
    return _sum(ctx, out, out_dims, taps, product, where, start=bias)


#: a padded depthwise conv reads a padded copy of its input when its window reads each
#: input element at least this many times (kernel / stride, multiplied over the axes):
#: the copy reads and writes each element once, which a 3x3 window at stride 2 reusing
#: each element about twice repays only over short rows (`_pads_depthwise`)
PAD_MIN_REUSE = 4


#: the direct form of a convolution: (ctx, Y's type, window, group, output dims, tap dims)
Direct = Callable[
    [LowerContext, TensorType, Window, int, tuple[str, ...], tuple[str, ...]], list[Statement]
]


def _convolution(
    ctx: LowerContext, out: TensorType, window: Window, direct: Direct
) -> list[Statement]:
    """Winograd F(2x2, 3x3) where it applies (`winograd.applies`), else the direct form
    over output positions `o*` and window taps `k*`."""
    group = int(ctx.attr("group", 1))  # type: ignore[arg-type]
    if winograd_applies(ctx, window, group):
        return winograd_conv(ctx, out, window)
    rank = out.rank - 2
    return direct(ctx, out, window, group, spatial_dims(rank, "o"), spatial_dims(rank, "k"))


@lowering("Conv")
def _conv(ctx: LowerContext) -> list[Statement]:
    return _convolution(ctx, *conv_window(ctx.infer_context()), _direct_conv)


@lowering("ConvTranspose")
def _conv_transpose(ctx: LowerContext) -> list[Statement]:
    return _convolution(ctx, *conv_transpose_window(ctx.infer_context()), _gathered_conv)


def _direct_conv(
    ctx: LowerContext,
    out: TensorType,
    window: Window,
    group: int,
    o: tuple[str, ...],
    k: tuple[str, ...],
) -> list[Statement]:
    """Y[n, m, oh, ow] = B[m] + Σ_{c, kh, kw} X[n, g*C/G + c, oh*s + kh*d - p, ...] W[m, c, kh, kw]
    over the taps inside X (a depthwise conv over every tap of a zero-padded copy of X,
    where `_pads_depthwise`)."""
    x, w = ctx.input_type(0), ctx.input_type(1)
    rank = len(o)
    out_dims = ("n", "m", *o)
    per_group_in, per_group_out = w.shape[1], out.shape[1] // group
    # a one-tap axis has no tap loop: its weight index is 0
    wide = [i for i in range(rank) if window.kernel[i] > 1]  # as `window_taps` decides
    # nor has one input channel a group beside a window (a depthwise conv): the output
    # channel alone picks its input plane, so no reduction moves along the channels
    tap = "0" if per_group_in == 1 and group > 1 and wide else "c"
    if tap == "0":
        channel = "m" if per_group_out == 1 else f"floor(m/{per_group_out})"
    else:
        channel = _group_channel("m", per_group_out, per_group_in, tap, group)
    spatial, bounds = window_taps(window, x.shape[2:], o, k)
    where = [c for axis in bounds for c in axis]
    x_load = ctx.load(ctx.node.inputs[0], ("n", channel, *spatial))
    prologue: list[Statement] = []
    if tap == "0" and per_group_out == 1 and _pads_depthwise(window, ctx.config.vector_width):
        prologue, x_load = _padded_taps(ctx, window, channel, o, k)
        where = []
    w_index = ("m", tap, *(k[i] if i in wide else "0" for i in range(rank)))
    channels = [] if tap == "0" else [("c", per_group_in)]
    taps = tuple(zip(*channels, *((k[i], window.kernel[i]) for i in wide), strict=True))
    return [*prologue, *_convolution_sum(ctx, out, out_dims, x_load, w_index, taps, where)]


def _pads_depthwise(window: Window, lanes: int) -> bool:
    """Whether a padded depthwise conv reads a padded copy of its input: with a window
    reading each input element often (`PAD_MIN_REUSE`), or rows of at most two vectors
    of `lanes`. Its rows are then boxes: whole vectors (a short row's last one masked)
    whose register accumulators every tap shares, rather than edge pieces starting
    apart, whose accumulators stay in memory (most of a short row's tiles)."""
    reuse = math.prod(k / s for k, s in zip(window.kernel, window.strides, strict=True))
    short = window.out[-1] <= 2 * lanes
    return any(window.pads) and (reuse >= PAD_MIN_REUSE or (short and reuse >= 2))


def _padded_taps(
    ctx: LowerContext, window: Window, channel: str, o: tuple[str, ...], k: tuple[str, ...]
) -> tuple[list[Statement], Expr]:
    """The statements making X's zero-padded copy (`padded_input`), and the load of the
    tap `o*s + k*d` from it: the domain is then a box, so each row is one piece of full
    vectors rather than edge pieces with differently shaped ones. A row sliding by s > 1
    is stored in s phases, so that a tap's lanes are adjacent (one load, no shuffle)."""
    padded, statements = padded_input(ctx, window, 0, phased=True)
    taps = padded_taps(window, o, k, phased=True)
    return statements, ctx.load_temp(padded, ("n", channel, *taps))


def _gathered_conv(
    ctx: LowerContext,
    out: TensorType,
    window: Window,
    group: int,
    o: tuple[str, ...],
    k: tuple[str, ...],
) -> list[Statement]:
    """ConvTranspose in gather form: Y[n, m, o] = B[m] + Σ_{c, k} X[n, g*C/G + c, (o + p - k*d)/s]
    W[g*C/G + c, m mod M/G, k] over the taps where (o + p - k*d) is a multiple of s whose
    quotient lies inside X. Output padding only extends Y (its extra positions gather
    whatever taps reach them, often none: the bias)."""
    x, w = ctx.input_type(0), ctx.input_type(1)
    rank = len(o)
    out_dims = ("n", "m", *o)
    per_group_in, per_group_out = x.shape[1] // group, w.shape[1]
    channel = _group_channel("m", per_group_out, per_group_in, "c", group)
    if group == 1:
        filter_channel = "m"
    elif per_group_out == 1:
        filter_channel = "0"
    else:
        filter_channel = f"m - {per_group_out}*floor(m/{per_group_out})"
    spatial, where = [], []
    for i in range(rank):
        s, d, p = window.strides[i], window.dilations[i], window.pads[i]
        full = affine_text([(1, o[i]), (-d, k[i])], p)
        lowest = p - (window.kernel[i] - 1) * d
        highest = window.out[i] - 1 + p
        if s == 1:
            spatial.append(full)
            where += within(full, 0, x.shape[2 + i], lowest, highest)
        else:
            q = f"{o[i]}_in"
            spatial.append(f"floor(({full})/{s})")
            bounds = [f"{q} >= 0", f"{q} < {x.shape[2 + i]}"]
            where.append(f"exists ({q}: {full} = {s}*{q} and {' and '.join(bounds)})")
    x_load = ctx.load(ctx.node.inputs[0], ("n", channel, *spatial))
    w_index = (channel, filter_channel, *k)
    taps = (("c", *k), (per_group_in, *w.shape[2:]))
    return _convolution_sum(ctx, out, out_dims, x_load, w_index, taps, where)


# --- matrix products ------------------------------------------------------------------------


def _batch_index(shape: Sequence[int], dims: Sequence[str], extents: Sequence[int]) -> list[str]:
    """Index of an operand's leading (batch) axes `shape` broadcast onto output `dims`
    (aligned to the right, numpy style)."""
    offset = len(dims) - len(shape)
    return [
        "0" if broadcast(size, extents[offset + a]) else dims[offset + a]
        for a, size in enumerate(shape)
    ]


@lowering("MatMul")
def _matmul(ctx: LowerContext) -> list[Statement]:
    """numpy.matmul: Y[b..., i, j] = Σ_k A[b..., i, k] B[b..., k, j], batch axes broadcast,
    a 1-D A has no `i` and a 1-D B no `j`."""
    a, b, out = ctx.input_type(0), ctx.input_type(1), ctx.output_type()
    depth = a.shape[-1]
    rows, cols = a.rank > 1, b.rank > 1
    batch_rank = out.rank - rows - cols
    batch = tuple(f"b{i}" for i in range(batch_rank))
    out_dims = (*batch, *(("i",) if rows else ()), *(("j",) if cols else ()))
    extents = out.shape[:batch_rank]
    a_index = ["k"] if not rows else [*_batch_index(a.shape[:-2], batch, extents), "i", "k"]
    b_index = ["k"] if not cols else [*_batch_index(b.shape[:-2], batch, extents), "k", "j"]
    acc = acc_dtype(out.dtype)
    product = binary(
        "mul",
        as_dtype(ctx.load(ctx.node.inputs[0], a_index), acc),
        as_dtype(ctx.load(ctx.node.inputs[1], b_index), acc),
    )
    return _sum(ctx, out, out_dims, (("k",), (depth,)), product)


@lowering("Gemm")
def _gemm(ctx: LowerContext) -> list[Statement]:
    """Y[i, j] = beta * C[bcast(i, j)] (the init) + Σ_k alpha * A'[i, k] B'[k, j]."""
    a, out = ctx.input_type(0), ctx.output_type()
    alpha = float(ctx.attr("alpha", 1.0))  # type: ignore[arg-type]
    beta = float(ctx.attr("beta", 1.0))  # type: ignore[arg-type]
    trans_a, trans_b = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))  # type: ignore[arg-type]
    acc = acc_dtype(out.dtype)
    if np.dtype(acc).kind in "iu" and not (alpha.is_integer() and beta.is_integer()):
        raise ctx.unsupported(f"non-integer alpha={alpha} / beta={beta} on {out.dtype} operands")
    depth = a.shape[0] if trans_a else a.shape[1]
    a_load = ctx.load(ctx.node.inputs[0], ("k", "i") if trans_a else ("i", "k"))
    b_load = ctx.load(ctx.node.inputs[1], ("j", "k") if trans_b else ("k", "j"))
    product: Expr = binary("mul", as_dtype(a_load, acc), as_dtype(b_load, acc))
    if alpha != 1.0:
        product = binary("mul", ctx.const(alpha, acc), product)
    dims = ("i", "j")
    start: Expr = ctx.const(0, acc)
    if ctx.has_input(2) and beta != 0.0:
        start = as_dtype(ctx.broadcast_load(ctx.node.inputs[2], dims, out.shape), acc)
        if beta != 1.0:
            start = binary("mul", ctx.const(beta, acc), start)
    return _sum(ctx, out, dims, (("k",), (depth,)), product, start=start)


@lowering("Einsum")
def _einsum_lowering(ctx: LowerContext) -> list[Statement]:
    """A sum of products: one dimension per label (the ellipsis as `e0, e1, ...`), the
    labels absent from the output reduced; a repeated label indexes its operand's
    diagonal, a size-1 operand axis broadcasts."""
    spec = einsum_spec(ctx.infer_context())
    out = ctx.output_type()
    operands = [
        (term, name, ctx.type(name).shape)
        for term, name in zip(spec.inputs, ctx.node.inputs, strict=True)
    ]
    sizes: dict[str, int] = {}
    for term, _, shape in operands:
        # every ellipsis stands for the same number of axes (the frontend checks it)
        labels = term.replace(".", "." * (len(shape) - len(term) + 1))
        for position, label in enumerate(labels):
            key = f"e{position - labels.index('.')}" if label == "." else label
            size = shape[position]
            sizes[key] = size if sizes.get(key, 1) == 1 else sizes[key]

    def axes(term: str, rank: int) -> list[str]:
        labels = term.replace(".", "." * (rank - len(term) + 1))
        return [
            f"e{position - labels.index('.')}" if label == "." else label
            for position, label in enumerate(labels)
        ]

    out_dims = tuple(axes(spec.output, out.rank))
    reduced = [label for label in sizes if label not in out_dims]
    acc = acc_dtype(out.dtype)
    product: Expr | None = None
    for term, name, shape in operands:
        index = [
            "0" if broadcast(size, sizes[dim]) else dim
            for dim, size in zip(axes(term, len(shape)), shape, strict=True)
        ]
        load = as_dtype(ctx.load(name, index), acc)
        product = load if product is None else binary("mul", product, load)
    assert product is not None
    if reduced:
        red = (tuple(reduced), tuple(sizes[label] for label in reduced))
        return _sum(ctx, out, out_dims, red, product)
    target = _accumulator(ctx, out)
    copy = box_statement(ctx, ctx.statement_name(), out_dims, out.shape, target, out_dims, product)
    return [copy, *_store(ctx, target, out_dims, out)]


# --- global pooling (MaxPool / AveragePool are in `lower.pool`) --------------------------------


def _global_pool(ctx: LowerContext, combiner: str) -> list[Statement]:
    """A max / sum reduction of each (n, c) over every spatial position into Y[n, c, 0, ...]
    (the average then divides by the spatial size)."""
    x, out = ctx.input_type(0), ctx.output_type()
    spatial = spatial_dims(x.rank - 2, "i")
    out_dims = ("n", "c")
    out_index = ("n", "c", *("0" for _ in spatial))
    value = ctx.load(ctx.node.inputs[0], ("n", "c", *spatial))
    red = (spatial, x.shape[2:])
    if combiner == "max":
        return reduction(
            ctx, ctx.node.name, (out_dims, x.shape[:2]), red, ctx.output(), out_index, value, "max"
        )
    acc = acc_dtype(out.dtype)
    total = ctx.temp("sum", x.shape[:2], acc)
    statements = reduction(
        ctx,
        f"{ctx.node.name}_reduce_sum",
        (out_dims, x.shape[:2]),
        red,
        total,
        out_dims,
        as_dtype(value, acc),
        "sum",
    )
    name = ctx.statement_name()
    size = ctx.const(math.prod(x.shape[2:]), acc)
    mean = as_dtype(binary("div", ctx.load_temp(total, out_dims), size), out.dtype)
    statements.append(
        Statement(
            name, out_dims, ctx.domain(name, out_dims, x.shape[:2]), ctx.output(), out_index, mean
        )
    )
    return statements


lowering("GlobalAveragePool")(lambda ctx: _global_pool(ctx, "sum"))
lowering("GlobalMaxPool")(lambda ctx: _global_pool(ctx, "max"))


# --- softmax and normalizations ----------------------------------------------------------------


def _softmax(ctx: LowerContext, log: bool) -> list[Statement]:
    """max-reduce along the axis into a temporary; then for Softmax e = exp(x - max)
    into a temporary, its sum, the sum's reciprocal per row and e times it (each exp
    computed once, one division a row); for LogSoftmax the sum of exp(x - max) and
    x - max - log(sum)."""
    x = ctx.input_type(0)
    axis = int(ctx.attr("axis", -1))  # type: ignore[arg-type]
    axis = axis + x.rank if axis < 0 else axis
    dims = ctx.dims(x.rank)
    outer = dims[:axis] + dims[axis + 1 :]
    outer_shape = x.shape[:axis] + x.shape[axis + 1 :]
    stat = acc_dtype(x.dtype)
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    red = ((dims[axis],), (x.shape[axis],))
    peak = ctx.temp("max", outer_shape, stat)
    total = ctx.temp("sum", outer_shape, stat)
    shifted = binary("sub", value, ctx.load_temp(peak, outer))
    statements = list(
        reduction(
            ctx, f"{ctx.node.name}_reduce_max", (outer, outer_shape), red, peak, outer, value, "max"
        )
    )
    summed: Expr = unary("exp", shifted)
    if not log:
        exps = ctx.temp("exp", x.shape, stat)
        statements.append(
            box_statement(ctx, ctx.statement_name(), dims, x.shape, exps, dims, summed)
        )
        summed = ctx.load_temp(exps, dims)
    statements += reduction(
        ctx, f"{ctx.node.name}_reduce_sum", (outer, outer_shape), red, total, outer, summed, "sum"
    )
    if log:
        result = binary("sub", shifted, unary("log", ctx.load_temp(total, outer)))
    else:
        scale = ctx.temp("scale", outer_shape, stat)
        inverse = unary("recip", ctx.load_temp(total, outer))
        statements.append(
            box_statement(ctx, ctx.statement_name(), outer, outer_shape, scale, outer, inverse)
        )
        result = binary("mul", summed, ctx.load_temp(scale, outer))
    name = ctx.statement_name()
    statements.append(
        box_statement(ctx, name, dims, x.shape, ctx.output(), dims, as_dtype(result, x.dtype))
    )
    return statements


lowering("Softmax")(lambda ctx: _softmax(ctx, log=False))
lowering("LogSoftmax")(lambda ctx: _softmax(ctx, log=True))


@lowering("LRN")
def _lrn(ctx: LowerContext) -> list[Statement]:
    """square_sum[n, c, ...] = Σ X[n, c - (size-1)//2 + t, ...]² over the channel window
    taps t inside X, then Y = X / (bias + alpha / size * square_sum) ** beta."""
    x = ctx.input_type(0)
    size = int(ctx.attr("size"))  # type: ignore[arg-type]
    alpha = float(ctx.attr("alpha", 1e-4))  # type: ignore[arg-type]
    beta = float(ctx.attr("beta", 0.75))  # type: ignore[arg-type]
    bias = float(ctx.attr("bias", 1.0))  # type: ignore[arg-type]
    spatial = spatial_dims(x.rank - 2, "")
    dims = ("n", "c", *spatial)
    stat = acc_dtype(x.dtype)
    before = (size - 1) // 2
    channel = affine_text([(1, "c"), (1, "t")], -before)
    channels = x.shape[1]
    where = within(channel, 0, channels, -before, channels - 1 - before + size - 1)
    tap = as_dtype(ctx.load(ctx.node.inputs[0], ("n", channel, *spatial)), stat)
    squares = ctx.temp("square_sum", x.shape, stat)
    statements = reduction(
        ctx,
        f"{ctx.node.name}_reduce_squares",
        (dims, x.shape),
        (("t",), (size,)),
        squares,
        dims,
        binary("mul", tap, tap),
        "sum",
        where,
    )
    c = lambda v: ctx.const(v, stat)  # noqa: E731
    scaled = binary("add", c(bias), binary("mul", c(alpha / size), ctx.load_temp(squares, dims)))
    value = as_dtype(ctx.load(ctx.node.inputs[0], dims), stat)
    result = binary("div", value, binary("pow", scaled, c(beta)))
    name = ctx.statement_name()
    statements.append(
        box_statement(ctx, name, dims, x.shape, ctx.output(), dims, as_dtype(result, x.dtype))
    )
    return statements
