"""Winograd F(2×2, 3×3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional
Neural Networks", 2016): each 2×2 block of output pixels is computed from a 4×4 block of
input with 16 products per channel pair instead of 36.

    V[e, n, c, ty, tx] = (Bᵀ d B)[e]      d = the padded input's 4×4 block at (2ty, 2tx)
    M[e, n, m, ty, tx] = Σ_c U[e, m, c] · V[e, n, c, ty, tx]      U = G g Gᵀ, precomputed
    Y[n, m, 2ty + p, 2tx + q] = (Aᵀ M A)[p, q] + B[m]

The 16 input transforms are prologue statements, the batched matrix product is the
kernel's main reduction (one per transformed point `e`), and the four output pieces are
its epilogue: they gather all 16 points of `e`, which the default schedule computes
inside each channel tile (`poly.default.steps.gathered_loops`). onnxruntime's CPU convs
are direct. Whether the transforms pay depends on the machine and the image size (the
weights grow 16/9 and small images give few tiles), hence `MIN_PIXELS` and
`LowerConfig.winograd`; the measured ratios are in benchmarks/results/conv-*.md.
`compile` asks for 32 vectors of channels (`polytile.codegen.configs.lower_config`).
"""

from __future__ import annotations

import numpy as np

from polytile.frontend.graph import TensorType
from polytile.frontend.ops.nn import Window
from polytile.poly.ir.expr import Expr, Load, binary, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import LowerContext, affine_text, for_all_sizes, reduction

#: the transforms of F(2x2, 3x3): input Bᵀ, filter G, output Aᵀ
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)

#: the smallest output (in pixels) worth the transforms: below it the tiles are too few
#: to pay for the larger weights (benchmarks/results/conv-*.md)
MIN_PIXELS = 28 * 28


def applies(ctx: LowerContext, window: Window, group: int) -> bool:
    """Whether a Conv or ConvTranspose is lowered as Winograd F(2x2, 3x3): a float32 2-D
    3x3 window of stride 1, no dilation and one group, with constant weights, over a
    large output, with at least `LowerConfig.winograd_channels` input and output
    channels (a ConvTranspose also without output padding and with pads of at most
    2, so that it is the conv of its flipped filters, see `conv_filters`)."""
    x, w, out = ctx.input_type(0), ctx.input_type(1), ctx.output_type()
    transposed = ctx.node.op_type == "ConvTranspose"
    return (
        ctx.config.winograd
        and x.rank == 4
        and tuple(window.kernel) == (3, 3)
        and tuple(window.strides) == (1, 1)
        and tuple(window.dilations) == (1, 1)
        and group == 1
        and x.dtype == w.dtype == "float32"
        and ctx.constant(1) is not None
        and for_all_sizes(lambda: window.out[0] * window.out[1] >= MIN_PIXELS)
        and min(x.shape[1], out.shape[1]) >= ctx.config.winograd_channels
        and (not transposed or (not any(window.output_padding) and max(window.pads) <= 2))
    )


def conv_filters(ctx: LowerContext, window: Window) -> tuple[np.ndarray, int, int]:
    """The node's filters as a Conv's [M, C, 3, 3] and its top and left padding. A
    ConvTranspose of stride 1 is the conv of its filters transposed and flipped
    (`W[c, m, 2 - i, 2 - j]`) with padding `2 - p` on each side."""
    w = ctx.constant(1)
    if ctx.node.op_type != "ConvTranspose":
        return w, window.pads[0], window.pads[1]
    flipped = np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    return flipped, 2 - window.pads[0], 2 - window.pads[1]


def weights(w: np.ndarray) -> np.ndarray:
    """U = G g Gᵀ of every filter g = w[m, c] (M, C, 3, 3), as [16, M, C] float32."""
    u = np.einsum("ai,mcij,bj->abmc", G, w.astype(np.float64), G)
    return u.reshape(16, *w.shape[:2]).astype(np.float32)


def _signed_sum(terms: list[tuple[float, Load]]) -> Expr:
    """Σ ±load (the input and output transforms' coefficients are ±1), as adds and
    subtracts, a positive term first."""
    ordered = sorted(terms, key=lambda t: -t[0])
    first, *rest = ordered
    expr: Expr = first[1] if first[0] > 0 else unary("neg", first[1])
    for coef, load in rest:
        expr = binary("add" if coef > 0 else "sub", expr, load)
    return expr


def conv(ctx: LowerContext, out: TensorType, window: Window) -> list[Statement]:
    """The statements of a Winograd conv writing `out` (see the module docstring)."""
    x = ctx.input_type(0)
    n_, c_, h_, w_ = x.shape
    m_ = out.shape[1]
    oh, ow = window.out
    th, tw = -(-oh // 2), -(-ow // 2)
    filters, top, left = conv_filters(ctx, window)
    node = ctx.node.name
    # the input with its padding, large enough for every tile's 4x4 block
    pdims = ("n", "c", "h", "v")
    pext = (n_, c_, 2 * th + 2, 2 * tw + 2)
    padded = ctx.temp("padded", pext, x.dtype)
    inside = [f"h >= {top}", f"h < {top + h_}", f"v >= {left}", f"v < {left + w_}"]
    border = [f"h < {top}", f"h >= {top + h_}", f"v < {left}", f"v >= {left + w_}"]
    copy = ctx.statement_name(f"{node}_pad")
    fill = ctx.statement_name(f"{node}_pad_border")
    source = ctx.load(
        ctx.node.inputs[0],
        ("n", "c", affine_text([(1, "h")], -top), affine_text([(1, "v")], -left)),
    )
    statements = [
        Statement(
            copy, pdims, ctx.domain(copy, pdims, pext, " and ".join(inside)), padded, pdims, source
        ),
        Statement(
            fill,
            pdims,
            ctx.domain(fill, pdims, pext, " or ".join(border)),
            padded,
            pdims,
            ctx.const(0, x.dtype),
        ),
    ]
    # the input transform, one statement per point e = 4a + b
    tiles = ("n", "c", "ty", "tx")
    text = ctx.temp("input", (16, n_, c_, th, tw), x.dtype)
    for a in range(4):
        for b in range(4):
            terms = [
                (
                    B_T[a, i] * B_T[b, j],
                    ctx.load_temp(
                        padded, ("n", "c", affine_text([(2, "ty")], i), affine_text([(2, "tx")], j))
                    ),
                )
                for i in range(4)
                for j in range(4)
                if B_T[a, i] * B_T[b, j]
            ]
            name = ctx.statement_name(f"{node}_in{4 * a + b}")
            domain = ctx.domain(name, tiles, (n_, c_, th, tw))
            index = (str(4 * a + b), *tiles)
            statements.append(Statement(name, tiles, domain, text, index, _signed_sum(terms)))
    # the batched matrix product over the channels
    u = ctx.constant_tensor("winograd", weights(filters))
    product = ctx.temp("product", (16, n_, m_, th, tw), "float32")
    mdims = ("e", "n", "m", "ty", "tx")
    term = binary(
        "mul",
        ctx.load_temp(u, ("e", "m", "c")),
        ctx.load_temp(text, ("e", "n", "c", "ty", "tx")),
    )
    statements += reduction(
        ctx, node, (mdims, (16, n_, m_, th, tw)), (("c",), (c_,)), product, mdims, term, "sum"
    )
    # the output transform and the bias, one piece per pixel (p, q) of a 2x2 block
    odims = ("n", "m", "ty", "tx")
    bias = ctx.load(ctx.node.inputs[2], ("m",)) if ctx.has_input(2) else None
    for p in range(2):
        for q in range(2):
            terms = [
                (A_T[p, a] * A_T[q, b], ctx.load_temp(product, (str(4 * a + b), *odims)))
                for a in range(4)
                for b in range(4)
                if A_T[p, a] * A_T[q, b]
            ]
            value = _signed_sum(terms)
            if bias is not None:
                value = binary("add", value, bias)
            name = ctx.statement_name(f"{node}_out{2 * p + q}")
            where = []
            if 2 * (th - 1) + p >= oh:  # the last tile's pixel falls outside an odd output
                where.append(f"2*ty + {p} < {oh}")
            if 2 * (tw - 1) + q >= ow:
                where.append(f"2*tx + {q} < {ow}")
            domain = ctx.domain(name, odims, (n_, m_, th, tw), " and ".join(where))
            index = ("n", "m", affine_text([(2, "ty")], p), affine_text([(2, "tx")], q))
            statements.append(Statement(name, odims, domain, ctx.output(), index, value))
    return statements
