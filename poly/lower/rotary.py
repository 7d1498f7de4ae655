"""Compute definition of RotaryEmbedding (canonical form: caches of shape (batch, seq,
rotary_dim / 2), see `frontend.ops.attention`).

Each head's first `rotary_dim` features are rotated in pairs (x1, x2) by the cached
angle: real = cos·x1 - sin·x2, imag = sin·x1 + cos·x2; the rest are copied. The pairs are
(d, d + R/2) split in halves, or (2j, 2j + 1) interleaved. The output's box is cut into
pieces by the feature position d within the head (first halves / second halves, or even
/ odd, and the copied tail), one statement each, so that no statement loads outside X.
For a 3-D input (batch, seq, heads·head_size) d is the last index modulo the head size.
"""

from __future__ import annotations

from polytile.frontend.ops.attention import rotary_facts
from polytile.poly.ir.expr import Expr, binary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import LowerContext, affine_text, floordiv_text, lowering, mod_text


@lowering("RotaryEmbedding")
def _rotary(ctx: LowerContext) -> list[Statement]:
    x = ctx.input_type(0)
    _, head, rotary = rotary_facts(ctx.infer_context())
    half = rotary // 2
    interleaved = bool(int(ctx.attr("interleaved", 0)))  # type: ignore[arg-type]
    if x.rank == 4:
        dims = ("b", "h", "s", "d")
        position = "d"
    else:
        dims = ("b", "s", "t")
        position = mod_text("t", head)
    last = dims[-1]

    def element(shift: int) -> Expr:
        index = (*dims[:-1], affine_text([(1, last)], shift))
        return ctx.load(ctx.node.inputs[0], index)

    def cache(which: int, j: str) -> Expr:
        return ctx.load(ctx.node.inputs[which], ("b", "s", j))

    pieces: list[tuple[str, list[str], Expr]] = []
    if interleaved:
        pair = floordiv_text(position, 2)
        even = f"{mod_text(position, 2)} = 0"
        odd = f"{mod_text(position, 2)} = 1"
        inside = f"{position} < {rotary}"
        cos, sin = cache(1, pair), cache(2, pair)
        real = binary("sub", binary("mul", cos, element(0)), binary("mul", sin, element(1)))
        imag = binary("add", binary("mul", sin, element(-1)), binary("mul", cos, element(0)))
        pieces += [("real", [inside, even], real), ("imag", [inside, odd], imag)]
    else:
        first = f"{position} < {half}"
        second = [f"{position} >= {half}", f"{position} < {rotary}"]
        cos, sin = cache(1, position), cache(2, position)
        real = binary("sub", binary("mul", cos, element(0)), binary("mul", sin, element(half)))
        shifted = affine_text([(1, position)], -half) if x.rank == 4 else f"{position} - {half}"
        cos2, sin2 = cache(1, shifted), cache(2, shifted)
        imag = binary("add", binary("mul", sin2, element(-half)), binary("mul", cos2, element(0)))
        pieces += [("real", [first], real), ("imag", second, imag)]
    if rotary < head:
        pieces.append(("copy", [f"{position} >= {rotary}"], element(0)))
    statements = []
    for base, where, expr in pieces:
        name = ctx.statement_name(f"{ctx.node.name}_{base}")
        domain = ctx.domain(name, dims, x.shape, " and ".join(where))
        statements.append(Statement(name, dims, domain, ctx.output(), dims, expr))
    return statements
