"""Matrix products: Gemm, MatMul and Einsum, each with a numpy `evaluate` for constant
folding. `einsum_spec` parses an Einsum equation once for shape inference and for the
poly layer's lowering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..graph import FLOAT_DTYPES, TensorType
from .base import InferContext, OpKind, register
from .nn import broadcasts_to, same_dtype

MATMUL_DTYPES = FLOAT_DTYPES | {"int32", "int64"}


def _gemm_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    a, b = xs[0], xs[1]
    if ctx.attr_int("transA", 0):
        a = a.T
    if ctx.attr_int("transB", 0):
        b = b.T
    y = ctx.attr_float("alpha", 1.0) * np.matmul(a, b)
    if ctx.has_input(2):
        y = y + ctx.attr_float("beta", 1.0) * xs[2]
    return (np.asarray(y).astype(xs[0].dtype),)


@register("Gemm", OpKind.ANCHOR, evaluate=_gemm_evaluate, dtypes=MATMUL_DTYPES)
def _gemm(ctx: InferContext) -> tuple[TensorType, ...]:
    a, b = ctx.type(0), ctx.type(1)
    for what, t in (("A", a), ("B", b)):
        if t.rank != 2:
            raise ctx.error(f"{what} has shape {list(t.shape)}; Gemm needs 2-D operands")
    same_dtype(ctx, 1, "B")
    m, k = a.shape[::-1] if ctx.attr_int("transA", 0) else a.shape
    k2, n = b.shape[::-1] if ctx.attr_int("transB", 0) else b.shape
    if k != k2:
        raise ctx.error(
            f"inner dimensions do not match: A' is [{m}, {k}] and B' is [{k2}, {n}] "
            f"(A {list(a.shape)}, B {list(b.shape)}, transA={ctx.attr_int('transA', 0)}, "
            f"transB={ctx.attr_int('transB', 0)})"
        )
    if ctx.has_input(2):
        same_dtype(ctx, 2, "C")
        c = ctx.shape(2)
        if not broadcasts_to(c, (m, n)):
            raise ctx.error(f"C has shape {list(c)}, which does not broadcast to [{m}, {n}]")
    return (TensorType((m, n), a.dtype),)


@register(
    "MatMul",
    OpKind.ANCHOR,
    evaluate=lambda ctx, xs: (np.matmul(xs[0], xs[1]).astype(xs[0].dtype),),
    dtypes=MATMUL_DTYPES,
)
def _matmul(ctx: InferContext) -> tuple[TensorType, ...]:
    a, b = ctx.shape(0), ctx.shape(1)
    same_dtype(ctx, 1, "B")
    if not a or not b:
        raise ctx.error(f"operands {list(a)} and {list(b)} must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ctx.error(
            f"inner dimensions do not match: A {list(a)} has {a2[-1]} columns, "
            f"B {list(b)} has {b2[-2]} rows"
        )
    batch = _broadcast_dims(
        ctx, a2[:-2], b2[:-2], f"batch dimensions of A {list(a)} and B {list(b)}"
    )
    rows = (a2[-2],) if len(a) > 1 else ()
    cols = (b2[-1],) if len(b) > 1 else ()
    return (TensorType((*batch, *rows, *cols), ctx.dtype(0)),)


@dataclass(frozen=True)
class EinsumSpec:
    """A parsed equation: each input's labels ('.' stands for the ellipsis) and the
    output's."""

    inputs: tuple[str, ...]
    output: str
    shape: tuple[int, ...]


def _einsum_term(ctx: InferContext, term: str) -> str:
    """Labels of one term with the ellipsis written as a single '.'."""
    if term.count("...") > 1 or term.replace("...", "").count("."):
        raise ctx.error(f"equation term '{term}' has a malformed or repeated ellipsis")
    labels = term.replace("...", ".")
    bad = [c for c in labels if c != "." and not (c.isascii() and c.isalpha())]
    if bad:
        raise ctx.error(f"equation term '{term}' has invalid label(s) {''.join(bad)!r}")
    return labels


def einsum_spec(ctx: InferContext) -> EinsumSpec:
    equation = ctx.attr_str("equation", "")
    eq = equation.replace(" ", "")
    if not eq:
        raise ctx.error("attribute 'equation' is required")
    lhs, arrow, rhs = eq.partition("->")
    if "->" in rhs:
        raise ctx.error(f"equation '{equation}' has more than one '->'")
    terms = [_einsum_term(ctx, t) for t in lhs.split(",")]
    if len(terms) != ctx.num_inputs:
        raise ctx.error(
            f"equation '{equation}' has {len(terms)} operand(s) but the node has "
            f"{ctx.num_inputs} input(s)"
        )
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    ellipsis: tuple[int, ...] = ()
    ellipsis_rank: int | None = None
    for index, term in enumerate(terms):
        shape = ctx.shape(index)
        same_dtype(ctx, index, f"operand {index}")
        letters = len(term) - term.count(".")
        if ("." in term and len(shape) < letters) or ("." not in term and len(shape) != letters):
            raise ctx.error(
                f"operand {index} has shape {list(shape)}, which does not match the "
                f"equation term '{lhs.split(',')[index]}'"
            )
        local: dict[str, int] = {}
        position = 0
        for label in term:
            if label == ".":
                count = len(shape) - letters
                if ellipsis_rank is not None and count != ellipsis_rank:
                    raise ctx.error(
                        f"the ellipsis of operand {index} stands for {count} dimension(s), "
                        f"an earlier one for {ellipsis_rank}; ONNX requires the same number"
                    )
                ellipsis_rank = count
                dims = shape[position : position + count]
                ellipsis = _broadcast_dims(
                    ctx, ellipsis, dims, f"ellipsis dimensions {list(ellipsis)} and {list(dims)}"
                )
                position += count
                continue
            dim = shape[position]
            position += 1
            if label in local and local[label] != dim:
                raise ctx.error(
                    f"label '{label}' of operand {index} has sizes {local[label]} and {dim}"
                )
            local[label] = dim
            counts[label] = counts.get(label, 0) + 1
            if label in sizes and dim != sizes[label] and 1 not in (dim, sizes[label]):
                raise ctx.error(f"label '{label}' has sizes {sizes[label]} and {dim}")
            sizes[label] = dim if sizes.get(label, 1) == 1 else sizes[label]
    has_ellipsis = any("." in t for t in terms)
    if arrow:
        output = _einsum_term(ctx, rhs)
        for label in output:
            if label != "." and label not in sizes:
                raise ctx.error(f"output label '{label}' does not occur in the inputs")
            if label != "." and output.count(label) > 1:
                raise ctx.error(f"output label '{label}' occurs more than once")
        if ellipsis and "." not in output:
            raise ctx.error(
                f"equation '{equation}' drops the ellipsis dimensions {list(ellipsis)} "
                f"from the output"
            )
    else:
        output = ("." if has_ellipsis else "") + "".join(
            sorted(label for label, count in counts.items() if count == 1)
        )
    shape = []
    for label in output:
        shape.extend(ellipsis if label == "." else (sizes[label],))
    return EinsumSpec(tuple(terms), output, tuple(shape))


def _broadcast_dims(
    ctx: InferContext, a: Sequence[int], b: Sequence[int], what: str
) -> tuple[int, ...]:
    """Numpy broadcasting of two shapes; the error says `what` did not broadcast."""
    rank = max(len(a), len(b))
    pa, pb = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb, strict=True):
        dims = {x, y} - {1}  # by hash: a symbolic size broadcasts with 1 undecided
        if len(dims) > 1:
            raise ctx.error(f"{what} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _einsum_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    equation = ctx.attr_str("equation", "").replace(" ", "")
    return (np.asarray(np.einsum(equation, *xs)).astype(xs[0].dtype),)


@register("Einsum", OpKind.ANCHOR, evaluate=_einsum_evaluate, dtypes=MATMUL_DTYPES)
def _einsum_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(einsum_spec(ctx).shape, ctx.dtype(0)),)
