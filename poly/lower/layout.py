"""Compute definitions of DepthToSpace and SpaceToDepth: copies over the output's box whose
input index splits an output coordinate into a block and an offset (`floor(y/b)`,
`y mod b`), as the other injective ops in `lower.injective`."""

from __future__ import annotations

from collections.abc import Sequence

from polytile.frontend.ops.layout import block_size, depth_mode

from ..kernel import Statement
from .base import LowerContext, lowering
from .injective import _floordiv, _mod


def _copy(ctx: LowerContext, index: Sequence[str]) -> list[Statement]:
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    name = ctx.statement_name()
    value = ctx.load(ctx.node.inputs[0], index)
    return [Statement(name, dims, ctx.domain(name, dims, out.shape), ctx.output(), dims, value)]


@lowering("DepthToSpace")
def _depth_to_space(ctx: LowerContext) -> list[Statement]:
    """Y[n, c, y, x] = X[n, channel, y / b, x / b] with the block offsets i = y mod b,
    j = x mod b: channel = (i*b + j)*C' + c (DCR) or c*b² + i*b + j (CRD)."""
    info = ctx.infer_context()
    b = block_size(info)
    depth = ctx.output_type().shape[1]
    n, c, y, x = ctx.dims(4)
    i, j = _mod(y, b), _mod(x, b)
    if depth_mode(info) == "DCR":
        channel = f"{b * depth}*({i}) + {depth}*({j}) + {c}"
    else:
        channel = f"{b * b}*{c} + {b}*({i}) + {j}"
    return _copy(ctx, (n, channel, _floordiv(y, b), _floordiv(x, b)))


@lowering("SpaceToDepth")
def _space_to_depth(ctx: LowerContext) -> list[Statement]:
    """Y[n, k, h, w] = X[n, c, h*b + i, w*b + j] where k = (i*b + j)*C + c (DCR) or
    c*b² + i*b + j (CRD)."""
    info = ctx.infer_context()
    b = block_size(info)
    depth = ctx.input_type(0).shape[1]
    n, k, h, w = ctx.dims(4)
    if depth_mode(info) == "DCR":
        c, block = _mod(k, depth), _floordiv(k, depth)
    else:
        c, block = _floordiv(k, b * b), _mod(k, b * b)
    i, j = _floordiv(block, b), _mod(block, b)
    return _copy(ctx, (n, c, f"{b}*{h} + {i}", f"{b}*{w} + {j}"))
