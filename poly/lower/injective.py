"""Compute definitions of the injective ops: every output element is one input element (or
a constant) at an index computed from the output's position.

Indices are affine in isl syntax: `floor(e/c)` for a division by a constant and
`e - c*floor(e/c)` for a remainder. Where the index map is piecewise (Pad's border modes)
each piece is a statement over its part of the output box, so the domains stay exact: no
statement instance loads outside its tensor and the pieces of one output are disjoint and
cover it. Concat has one statement per input over its slab of the output, Split one per
output (Gather lives with the indexing ops, `lower.indexing`, Resize in `lower.resize`).

Reshape-like ops (Reshape, Flatten, Squeeze, Unsqueeze) are usually zero-copy aliases (see
the frontend's `mark_views`); when one is lowered (a graph output) it is a copy whose index
relinearizes the row-major position, one group of axes with equal sizes at a time.

The rules (slice bounds, pads, split sizes, ...) are the frontend's, read through its
shape-inference helpers, so lowering and inference cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product

import numpy as np

from polytile.frontend.ops.tensor import (
    concat_axis,
    pad_plan,
    pad_value,
    slice_plan,
    split_sizes,
    tile_repeats,
    transpose_perm,
)
from polytile.poly.ir.expr import Iter, binary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    affine_text,
    as_dtype,
    copy_statement,
    floordiv_text,
    lowering,
    mod_text,
    parens,
    static_one,
)

# --- affine text ----------------------------------------------------------------------------


# --- Identity-like and reshape-like copies ----------------------------------------------------


@lowering("Dropout")
def _dropout(ctx: LowerContext) -> list[Statement]:
    """Inference Dropout (the frontend rejects a random training mode): a copy, and an
    all-true mask when it is requested."""
    rank = ctx.output_type().rank
    statements = [copy_statement(ctx, ctx.dims(rank))]
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        mask = ctx.output_type(1)
        dims = ctx.dims(mask.rank)
        name = ctx.statement_name(f"{ctx.node.name}_mask")
        statements.append(
            Statement(
                name,
                dims,
                ctx.domain(name, dims, mask.shape),
                ctx.output(1),
                dims,
                ctx.const(True, "bool"),
            )
        )
    return statements


def reshape_index(
    source: Sequence[int], target: Sequence[int], target_dims: Sequence[str]
) -> list[str]:
    """Index into a row-major tensor of shape `source` of the element at `target_dims` of
    its reshape to `target`. Axes are matched in groups with equal products (size-1 axes
    index 0), so a squeeze is an identity and only merged / split axes need division."""
    index = ["0"] * len(source)
    if math.prod(source) == 0:
        return index
    src = [a for a, n in enumerate(source) if not static_one(n)]
    dst = [a for a, n in enumerate(target) if not static_one(n)]
    i = j = 0
    while i < len(src):
        group_src, group_dst = [src[i]], [dst[j]]
        size_src, size_dst = source[src[i]], target[dst[j]]
        i, j = i + 1, j + 1
        while size_src != size_dst:
            if size_src < size_dst:
                group_src.append(src[i])
                size_src *= source[src[i]]
                i += 1
            else:
                group_dst.append(dst[j])
                size_dst *= target[dst[j]]
                j += 1
        terms, stride = [], 1
        for axis in reversed(group_dst):
            terms.append((stride, target_dims[axis]))
            stride *= target[axis]
        linear = affine_text(list(reversed(terms)))
        stride = size_src
        for position, axis in enumerate(group_src):
            stride //= source[axis]
            if position == 0:
                index[axis] = floordiv_text(linear, stride)
            elif stride == 1:
                index[axis] = mod_text(linear, source[axis])
            else:
                # floor(L / s) mod n = floor(L / s) - n * floor(L / (s * n))
                outer = floordiv_text(linear, stride * source[axis])
                index[axis] = f"{floordiv_text(linear, stride)} - {source[axis]}*{outer}"
    return index


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx: LowerContext) -> list[Statement]:
    """A copy to a new shape of the same row-major buffer (when not aliased)."""
    out = ctx.output_type()
    index = reshape_index(ctx.input_type(0).shape, out.shape, ctx.dims(out.rank))
    return [copy_statement(ctx, index)]


# --- data movement ----------------------------------------------------------------------------


@lowering("Transpose")
def _transpose(ctx: LowerContext) -> list[Statement]:
    """Y[i0, ..] = X[...] with input axis perm[a] indexed by output dim a."""
    perm = transpose_perm(ctx.infer_context())
    dims = ctx.dims(len(perm))
    index = [""] * len(perm)
    for a, p in enumerate(perm):
        index[p] = dims[a]
    return [copy_statement(ctx, index)]


@lowering("Concat")
def _concat(ctx: LowerContext) -> list[Statement]:
    """One statement per (non-empty) input over its slab `offset <= i_axis < offset + n`
    of the output, reading the input at `i_axis - offset`."""
    axis = concat_axis(ctx.infer_context())
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    statements, offset = [], 0
    for source, name in enumerate(ctx.node.inputs):
        size = ctx.type(name).shape[axis]
        if size == 0:
            continue
        index = list(dims)
        index[axis] = affine_text([(1, dims[axis])], -offset)
        where = [f"{dims[axis]} >= {offset}"] if offset else []
        if offset + size < out.shape[axis]:
            where.append(f"{dims[axis]} < {offset + size}")
        statements.append(
            copy_statement(ctx, index, where=where, base=f"{ctx.node.name}_{source}", source=source)
        )
        offset += size
    return statements


@lowering("Split")
def _split(ctx: LowerContext) -> list[Statement]:
    """One statement per output: Y_k[..., i, ...] = X[..., i + offset_k, ...]."""
    axis, sizes = split_sizes(ctx.infer_context())
    statements, offset = [], 0
    for k, size in enumerate(sizes):
        if ctx.node.outputs[k]:
            dims = ctx.dims(ctx.output_type(k).rank)
            index = list(dims)
            index[axis] = affine_text([(1, dims[axis])], offset)
            statements.append(copy_statement(ctx, index, output=k, base=f"{ctx.node.name}_{k}"))
        offset += size
    return statements


@lowering("Slice")
def _slice(ctx: LowerContext) -> list[Statement]:
    """Y[i] = X[start + step * i] on the sliced axes (negative steps included; the
    frontend clamps start and end as numpy does)."""
    _, plan = slice_plan(ctx.infer_context())
    dims = ctx.dims(ctx.output_type().rank)
    index = []
    for dim, part in zip(dims, plan, strict=True):
        start = part.start or 0
        step = part.step or 1
        index.append(affine_text([(step, dim)], start))
    return [copy_statement(ctx, index)]


@lowering("Expand")
def _expand(ctx: LowerContext) -> list[Statement]:
    """numpy broadcasting of X onto the target shape."""
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    name = ctx.statement_name()
    value = ctx.broadcast_load(ctx.node.inputs[0], dims, out.shape)
    return [Statement(name, dims, ctx.domain(name, dims, out.shape), ctx.output(), dims, value)]


@lowering("Range")
def _range(ctx: LowerContext) -> list[Statement]:
    """Y[i] = start + i * delta over the output's length: a Range with a constant limit
    is folded by the frontend, one whose limit is a symbolic size reaches here."""
    start, delta = ctx.constant(0), ctx.constant(2)
    if start is None or delta is None:
        raise ctx.unsupported("a Range whose start or delta is known only at run time")
    out = ctx.output_type()
    (dim,) = ctx.dims(1)
    kind = out.dtype if np.dtype(out.dtype).kind == "f" else "int64"
    position = as_dtype(Iter(dim, "int64"), kind)
    value = binary(
        "add", ctx.const(start.item(), kind), binary("mul", position, ctx.const(delta.item(), kind))
    )
    name = ctx.statement_name()
    domain = ctx.domain(name, (dim,), out.shape)
    return [Statement(name, (dim,), domain, ctx.output(), (dim,), as_dtype(value, out.dtype))]


@lowering("Tile")
def _tile(ctx: LowerContext) -> list[Statement]:
    """Y[i] = X[i mod n] on every repeated axis."""
    repeats = tile_repeats(ctx.infer_context())
    shape = ctx.input_type(0).shape
    dims = ctx.dims(len(shape))
    index = []
    for dim, size, repeat in zip(dims, shape, repeats, strict=True):
        if repeat == 1:
            index.append(dim)
        elif size == 1:
            index.append("0")
        else:
            index.append(mod_text(dim, size))
    return [copy_statement(ctx, index)]


# --- Pad --------------------------------------------------------------------------------------

#: one piece of a piecewise index map along one axis: domain constraints and the index
Piece = tuple[tuple[str, ...], str]


def _pad_pieces(mode: str, dim: str, size: int, begin: int, end: int) -> list[Piece]:
    """The index map of one axis of a reflect / edge / wrap Pad, as pieces over the output
    positions `dim`. A negative pad crops first (as the frontend's evaluation does)."""
    low, crop = max(begin, 0), max(-begin, 0)
    inner = size - crop - max(-end, 0)  # the cropped input length (> 0 for these modes)
    high = max(end, 0)
    mid = affine_text([(1, dim)], crop - low)
    if low == 0 and high == 0:
        return [((), mid)]
    below, above = f"{dim} < {low}", f"{dim} >= {low + inner}"
    inside = tuple(
        c for c, on in ((f"{dim} >= {low}", low), (f"{dim} < {low + inner}", high)) if on
    )
    if inner == 1:
        return [((), str(crop))]
    if mode == "edge":
        pieces = [(inside, mid)]
        if low:
            pieces.append(((below,), str(crop)))
        if high:
            pieces.append(((above,), str(crop + inner - 1)))
        return pieces
    if mode == "wrap":
        if low <= inner and high <= inner:
            pieces = [(inside, mid)]
            if low:
                pieces.append(((below,), affine_text([(1, dim)], crop - low + inner)))
            if high:
                pieces.append(((above,), affine_text([(1, dim)], crop - low - inner)))
            return pieces
        # positions further than one period away: (dim - low) mod inner
        shifted = affine_text([(1, dim)], inner * math.ceil(low / inner) - low)
        return [
            (
                (),
                affine_text([(1, mod_text(shifted, inner))], crop)
                if crop
                else mod_text(shifted, inner),
            )
        ]
    # reflect (without repeating the edge element); the period is 2 * (inner - 1)
    if low <= inner - 1 and high <= inner - 1:
        pieces = [(inside, mid)]
        if low:
            pieces.append(((below,), affine_text([(-1, dim)], crop + low)))
        if high:
            pieces.append(((above,), affine_text([(-1, dim)], crop + low + 2 * inner - 2)))
        return pieces
    period = 2 * (inner - 1)
    shifted = affine_text([(1, dim)], period * math.ceil(low / period) - low)
    phase = mod_text(shifted, period)
    forward = affine_text([(1, parens(phase))], crop)
    backward = affine_text([(-1, parens(phase))], crop + period)
    return [((f"{phase} <= {inner - 1}",), forward), ((f"{phase} >= {inner}",), backward)]


@lowering("Pad")
def _pad(ctx: LowerContext) -> list[Statement]:
    """Constant mode: an interior copy Y[i] = X[i - begin] and a border statement over the
    box minus the interior (a union) writing the pad value. Reflect / edge / wrap: one
    copy statement per combination of the padded axes' index pieces."""
    ictx = ctx.infer_context()
    mode, widths = pad_plan(ictx)
    x, out = ctx.input_type(0), ctx.output_type()
    dims = ctx.dims(out.rank)
    if mode == "constant":
        return _pad_constant(ctx, widths, pad_value(ictx))
    axes = [
        _pad_pieces(mode, dims[a], x.shape[a], *widths[a])
        if widths[a] != (0, 0)
        else [((), dims[a])]
        for a in range(x.rank)
    ]
    statements = []
    for n, combination in enumerate(product(*axes)):
        where = [c for constraints, _ in combination for c in constraints]
        index = [index for _, index in combination]
        base = ctx.node.name if len(statements) == 0 else f"{ctx.node.name}_{n}"
        statements.append(copy_statement(ctx, index, where=where, base=base))
    return statements


def _pad_constant(
    ctx: LowerContext, widths: Sequence[tuple[int, int]], value: np.ndarray
) -> list[Statement]:
    x, out = ctx.input_type(0), ctx.output_type()
    dims = ctx.dims(out.rank)
    inside, border, empty = [], [], False
    for a, (begin, end) in enumerate(widths):
        low, inner = max(begin, 0), x.shape[a] - max(-begin, 0) - max(-end, 0)
        empty = empty or inner <= 0 or out.shape[a] == 0
        if begin > 0:
            inside.append(f"{dims[a]} >= {low}")
            border.append(f"{dims[a]} < {low}")
        if end > 0:
            inside.append(f"{dims[a]} < {low + inner}")
            border.append(f"{dims[a]} >= {low + inner}")
    statements = []
    if not empty:
        index = [affine_text([(1, d)], -begin) for d, (begin, _) in zip(dims, widths, strict=True)]
        statements.append(
            copy_statement(ctx, index, where=inside, base=f"{ctx.node.name}_interior")
        )
    if empty or border:
        name = ctx.statement_name(f"{ctx.node.name}_border")
        where = "" if empty else " or ".join(border)
        fill = ctx.const(value.item(), out.dtype)
        domain = ctx.domain(name, dims, out.shape, where)
        statements.append(Statement(name, dims, domain, ctx.output(), dims, fill))
    return statements
