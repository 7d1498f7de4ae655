"""Compute definitions of DepthToSpace and SpaceToDepth: copies over the output's box whose
input index splits an output coordinate into a block and an offset (`floor(y/b)`,
`y mod b`), as the other injective ops in `lower.injective`."""

from __future__ import annotations

from polytile.frontend.ops.layout import block_size, depth_mode
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import LowerContext, copy_statement, floordiv_text, lowering, mod_text


@lowering("DepthToSpace")
def _depth_to_space(ctx: LowerContext) -> list[Statement]:
    """Y[n, c, y, x] = X[n, channel, y / b, x / b] with the block offsets i = y mod b,
    j = x mod b: channel = (i*b + j)*C' + c (DCR) or c*b² + i*b + j (CRD)."""
    info = ctx.infer_context()
    b = block_size(info)
    depth = ctx.output_type().shape[1]
    n, c, y, x = ctx.dims(4)
    i, j = mod_text(y, b), mod_text(x, b)
    if depth_mode(info) == "DCR":
        channel = f"{b * depth}*({i}) + {depth}*({j}) + {c}"
    else:
        channel = f"{b * b}*{c} + {b}*({i}) + {j}"
    return [copy_statement(ctx, (n, channel, floordiv_text(y, b), floordiv_text(x, b)))]


@lowering("SpaceToDepth")
def _space_to_depth(ctx: LowerContext) -> list[Statement]:
    """Y[n, k, h, w] = X[n, c, h*b + i, w*b + j] where k = (i*b + j)*C + c (DCR) or
    c*b² + i*b + j (CRD)."""
    info = ctx.infer_context()
    b = block_size(info)
    depth = ctx.input_type(0).shape[1]
    n, k, h, w = ctx.dims(4)
    if depth_mode(info) == "DCR":
        c, block = mod_text(k, depth), floordiv_text(k, depth)
    else:
        c, block = floordiv_text(k, b * b), mod_text(k, b * b)
    i, j = floordiv_text(block, b), mod_text(block, b)
    return [copy_statement(ctx, (n, c, f"{b}*{h} + {i}", f"{b}*{w} + {j}"))]
