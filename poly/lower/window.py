"""Sliding-window indexing shared by the convolutions (`nn`) and pooling (`pool`): the
names of spatial dimensions, and each window tap's input position with the domain
constraints keeping it inside the input (the padding is outside the domain)."""

from __future__ import annotations

from collections.abc import Sequence

from polytile.frontend.ops.nn import Window
from polytile.poly.ir.expr import const
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    Size,
    affine_text,
    box_statement,
    extent,
    for_all_sizes,
)


def spatial_dims(rank: int, prefix: str) -> tuple[str, ...]:
    """Names of spatial dimensions: `oh, ow` for prefix 'o' in 2-D, `kd, kh, kw` in 3-D."""
    letters = {1: "w", 2: "hw", 3: "dhw"}.get(rank)
    if letters is not None:
        return tuple(prefix + letter for letter in letters)
    return tuple(f"{prefix or 's'}{i}" for i in range(rank))


def within(index: str, low: Size, high: Size, lowest: Size, highest: Size) -> list[str]:
    """Constraints keeping `index` (ranging over [lowest, highest]) in [low, high); one
    that symbolic sizes may need is kept."""
    where = []
    if not for_all_sizes(lambda: lowest >= low):
        where.append(f"{index} >= {extent(low)}")
    if not for_all_sizes(lambda: highest < high):
        where.append(f"{index} < {extent(high)}")
    return where


def window_taps(
    window: Window,
    spatial: Sequence[int],
    out_dims: Sequence[str],
    taps: Sequence[str],
    lows: Sequence[int] | None = None,
    highs: Sequence[int] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Input index `o*s + k*d - p` of each spatial axis of a sliding window (`o*s - p` where
    the window is one tap wide, so a 1×1 window reads bare output positions) and, per
    axis, the domain constraints keeping it inside the input (or inside [lows, highs))."""
    n = len(spatial)
    lows = [0] * n if lows is None else lows
    highs = spatial if highs is None else highs
    index, where = [], []
    for i in range(n):
        s, d, p = window.strides[i], window.dilations[i], window.pads[i]
        tap = [(d, taps[i])] if window.kernel[i] > 1 else []
        pos = affine_text([(s, out_dims[i]), *tap], -p)
        index.append(pos)
        highest = (window.out[i] - 1) * s + (window.kernel[i] - 1) * d - p
        where.append(within(pos, lows[i], highs[i], -p, highest))
    return index, where


#: pad a pool's or depthwise conv's input in a temporary only when its output rows are
#: at least this long: short rows run scalar, so the copy does not pay for itself there
#: (a pool also slides by one along every axis, so every input element is read `kernel`
#: times along a row, which amortizes the copy; a conv's rule is `nn.PAD_MIN_REUSE`)
PAD_MIN_ROW = 8


def phases(window: Window) -> int:
    """How many phases a padded copy splits its last axis into: the window's stride there
    when it slides by more than one with several undilated taps, else 1 (no split)."""
    s, d, k = window.strides[-1], window.dilations[-1], window.kernel[-1]
    return s if s > 1 and d == 1 and k > 1 else 1


def padded_input(
    ctx: LowerContext, window: Window, fill: float | int, phased: bool = False
) -> tuple[str, list[Statement]]:
    """X copied into a temporary holding every window tap, the taps outside X set to
    `fill`: a pool or depthwise conv then reads a rectangle, without the edge pieces
    whose differently shaped vectors keep its accumulators out of registers. `phased`
    stores the last axis as (phase, position) pairs, `j = phase + s*position` for its
    stride `s` (`phases`): tap `o*s + k` is then `(k mod s, o + k div s)`, so the taps of
    consecutive outputs lie side by side rather than `s` apart."""
    x = ctx.input_type(0)
    rank = x.rank - 2
    split = phases(window) if phased else 1
    dims = ("n", "c", *ctx.dims(rank + (split > 1), "j"))
    extents, inside, border, index = list(x.shape[:2]), [], [], ["n", "c"]
    for i in range(rank):
        s, d, p = window.strides[i], window.dilations[i], window.pads[i]
        size = (window.out[i] - 1) * s + (window.kernel[i] - 1) * d + 1
        high = min(p + x.shape[2 + i], size)
        if i == rank - 1 and split > 1:
            phase, position = dims[2 + i], dims[3 + i]
            extents += [split, -(-size // split)]
            terms = [(1, phase), (split, position)]
        else:
            extents.append(size)
            terms = [(1, dims[2 + i])]
        at = affine_text(terms, 0)
        inside += [f"{at} >= {p}", f"{at} < {high}"]
        border += [f"{at} < {p}", f"{at} >= {high}"]
        index.append(affine_text(terms, -p))
    padded = ctx.temp("padded", extents, x.dtype)
    copy = ctx.statement_name(f"{ctx.node.name}_pad")
    edge = ctx.statement_name(f"{ctx.node.name}_pad_border")
    value = ctx.load(ctx.node.inputs[0], tuple(index))
    return padded, [
        box_statement(ctx, copy, dims, extents, padded, dims, value, inside),
        Statement(
            edge,
            dims,
            ctx.domain(edge, dims, extents, " or ".join(border)),
            padded,
            dims,
            const(fill, x.dtype),
        ),
    ]


def padded_taps(
    window: Window, out_dims: Sequence[str], taps: Sequence[str], phased: bool = False
) -> list[str]:
    """Index `o*s + k*d` of each window tap in the copy `padded_input` makes (`o*s` where
    the window is one tap wide, as `window_taps`); with `phased`, the last axis as
    `(k mod s, o + k div s)`."""
    split = phases(window) if phased else 1
    if split > 1:
        o, k = out_dims[-1], taps[-1]
        head = padded_taps(window, out_dims[:-1], taps[:-1]) if len(out_dims) > 1 else []
        return [*head, f"{k} - {split}*floor({k}/{split})", f"{o} + floor({k}/{split})"]
    return [
        affine_text(
            [(window.strides[i], out_dims[i])]
            + ([(window.dilations[i], taps[i])] if window.kernel[i] > 1 else []),
            0,
        )
        for i in range(len(out_dims))
    ]
