"""Normalizations beyond LayerNormalization / InstanceNormalization: GroupNormalization,
RMSNormalization, LpNormalization, MeanVarianceNormalization, and Hardmax (softmax's
one-hot sibling).

The canonical GroupNormalization is opset 21's: scale and bias hold one value per channel.
Opset 18's per-group scale and bias are repeated per channel by canonicalization (a
constant, or Unsqueeze → Expand → Reshape when only known at run time). Hardmax before
opset 13 works on the input flattened to 2-D at `axis`; canonicalization turns it into
Flatten → Hardmax(axis=-1) → Reshape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..graph import FLOAT_DTYPES, Node, TensorType
from .base import InferContext, OpKind, Rewrite, register

FLOATS = FLOAT_DTYPES
#: `stash_type` (an ONNX element type) → the dtype statistics are computed in
STASH_DTYPES = {1: "float32", 11: "float64"}


def stash_dtype(ctx: InferContext) -> str:
    """The statistics dtype named by `stash_type` (float32 by default)."""
    stash = ctx.attr_int("stash_type", 1)
    if stash not in STASH_DTYPES:
        raise ctx.unsupported(
            f"attribute stash_type={stash} (only 1 (float32) and 11 (float64) statistics "
            f"are supported)"
        )
    return STASH_DTYPES[stash]


def _float_input(ctx: InferContext, index: int, what: str) -> TensorType:
    t = ctx.type(index)
    if t.dtype not in FLOATS:
        raise ctx.error(f"{what} (input {index}) has dtype {t.dtype}, expected a float dtype")
    return t


# --- GroupNormalization -----------------------------------------------------------------------


def num_groups(ctx: InferContext) -> int:
    """The checked `num_groups`: positive and dividing the channels."""
    x = ctx.type(0)
    if x.rank < 3:
        raise ctx.error(f"X has shape {list(x.shape)}; expected rank >= 3 (N, C, spatial...)")
    groups = ctx.attr_int("num_groups")
    if groups <= 0 or x.shape[1] % groups:
        raise ctx.error(
            f"attribute num_groups={groups} must be positive and divide the {x.shape[1]} "
            f"channels of X"
        )
    return groups


def _group_norm_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Opset 18 → 21: per-group scale and bias repeated over each group's channels."""
    node = ctx.node
    if since >= 21:
        return Rewrite((node,))
    groups = num_groups(ctx)
    channels = ctx.shape(0)[1]
    size = channels // groups
    stash = 11 if ctx.dtype(0) == "float64" else 1  # opset 18 computes in X's precision
    inputs = list(node.inputs)
    nodes: list[Node] = []
    constants: dict[str, np.ndarray] = {}
    for index, what in ((1, "scale"), (2, "bias")):
        t = _float_input(ctx, index, what)
        if t.shape != (groups,):
            raise ctx.error(
                f"{what} (input {index}) has shape {list(t.shape)}; opset 18 expects "
                f"[{groups}] (one value per group)"
            )
        value = ctx.value(index)
        if value is not None:
            name = ctx.fresh(f"{what}_per_channel")
            constants[name] = np.repeat(np.asarray(value), size)
            inputs[index] = name
            continue
        axes, shape, flat = (ctx.fresh(f"{what}_{s}") for s in ("axes", "shape", "flat"))
        constants[axes] = np.array([1], np.int64)
        constants[shape] = np.array([groups, size], np.int64)
        constants[flat] = np.array([channels], np.int64)
        column, block, repeated = (ctx.fresh(f"{what}_{s}") for s in ("column", "block", "c"))
        nodes += [
            Node(ctx.fresh(f"{what}_unsqueeze"), "Unsqueeze", (inputs[index], axes), (column,)),
            Node(ctx.fresh(f"{what}_expand"), "Expand", (column, shape), (block,)),
            Node(ctx.fresh(f"{what}_reshape"), "Reshape", (block, flat), (repeated,)),
        ]
        inputs[index] = repeated
    attrs = {**node.attrs, "stash_type": stash}
    new = Node(node.name, node.op_type, tuple(inputs), node.outputs, attrs, node.domain)
    return Rewrite((*nodes, new), constants)


@register(
    "GroupNormalization",
    OpKind.ANCHOR,
    canonicalize=_group_norm_canonicalize,
    dtypes=FLOATS,
)
def _group_norm(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    num_groups(ctx)
    stash_dtype(ctx)
    for index, what in ((1, "scale"), (2, "bias")):
        t = _float_input(ctx, index, what)
        if t.shape != (x.shape[1],):
            raise ctx.error(
                f"{what} (input {index}) has shape {list(t.shape)}, expected [{x.shape[1]}] "
                f"(one value per channel)"
            )
    return (x,)


# --- RMSNormalization -------------------------------------------------------------------------


def norm_axis(ctx: InferContext) -> int:
    """The first normalized axis of RMSNormalization (`axis`, default -1)."""
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("X must have rank >= 1")
    return ctx.axis(ctx.attr_int("axis", -1), x.rank)


@register("RMSNormalization", OpKind.ANCHOR, dtypes=FLOATS)
def _rms_norm(ctx: InferContext) -> tuple[TensorType, ...]:
    """Y has X's shape and the scale's dtype."""
    x = ctx.type(0)
    axis = norm_axis(ctx)
    stash_dtype(ctx)
    scale = _float_input(ctx, 1, "scale")
    normalized = x.shape[axis:]
    tail = normalized[len(normalized) - scale.rank :] if scale.rank <= len(normalized) else None
    if tail is None or any(s not in (1, d) for s, d in zip(scale.shape, tail, strict=True)):
        raise ctx.error(
            f"scale has shape {list(scale.shape)}, which does not broadcast to the normalized "
            f"shape {list(normalized)} of X"
        )
    return (TensorType(x.shape, scale.dtype),)


# --- LpNormalization --------------------------------------------------------------------------


def lp_params(ctx: InferContext) -> tuple[int, int]:
    """(axis, p) of LpNormalization, p being 1 or 2."""
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input must have rank >= 1")
    p = ctx.attr_int("p", 2)
    if p not in (1, 2):
        raise ctx.error(f"attribute p={p} must be 1 or 2")
    return ctx.axis(ctx.attr_int("axis", -1), x.rank), p


def _lp_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    axis, p = lp_params(ctx)
    calc = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    norm = np.sum(np.abs(calc), axis, keepdims=True)
    if p == 2:
        norm = np.sqrt(np.sum(calc * calc, axis, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        result = np.where(norm == 0, 0, calc / norm)
    return (result.astype(x.dtype),)


@register("LpNormalization", OpKind.ANCHOR, evaluate=_lp_evaluate, dtypes=FLOATS)
def _lp_norm(ctx: InferContext) -> tuple[TensorType, ...]:
    lp_params(ctx)
    return (ctx.type(0),)


# --- MeanVarianceNormalization ----------------------------------------------------------------


def mvn_axes(ctx: InferContext) -> tuple[int, ...]:
    """The sorted, normalized axes MeanVarianceNormalization reduces (default 0, 2, 3)."""
    rank = ctx.type(0).rank
    axes = ctx.attr_ints("axes", (0, 2, 3)) or ()
    out = sorted({ctx.axis(a, rank, "axes value") for a in axes})
    if len(out) != len(axes):
        raise ctx.error(f"axes {list(axes)} name an axis more than once")
    return tuple(out)


@register("MeanVarianceNormalization", OpKind.ANCHOR, dtypes=FLOATS)
def _mvn(ctx: InferContext) -> tuple[TensorType, ...]:
    mvn_axes(ctx)
    return (ctx.type(0),)


# --- Hardmax ----------------------------------------------------------------------------------


def _hardmax_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Before opset 13 Hardmax flattens X to 2-D at `axis` (default 1): Flatten, Hardmax
    over the last axis, Reshape back."""
    node = ctx.node
    if since >= 13:
        return Rewrite((node,))
    x = ctx.type(0)
    axis = ctx.axis(ctx.attr_int("axis", 1), x.rank)
    if axis == x.rank - 1:
        return Rewrite((Node(node.name, node.op_type, node.inputs, node.outputs, {"axis": axis}),))
    flat, hard, shape = ctx.fresh("flat"), ctx.fresh("hardmax"), ctx.fresh("shape")
    nodes = (
        Node(ctx.fresh("flatten"), "Flatten", (node.inputs[0],), (flat,), {"axis": axis}),
        Node(node.name, node.op_type, (flat,), (hard,), {"axis": -1}),
        Node(ctx.fresh("reshape"), "Reshape", (hard, shape), node.outputs),
    )
    return Rewrite(nodes, {shape: np.array(x.shape, np.int64)})


def _hardmax_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    axis = ctx.axis(ctx.attr_int("axis", -1), x.ndim)
    first = np.expand_dims(np.argmax(x, axis=axis), axis)
    positions = np.arange(x.shape[axis]).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
    return ((positions == first).astype(x.dtype),)


@register(
    "Hardmax",
    OpKind.ANCHOR,
    evaluate=_hardmax_evaluate,
    canonicalize=_hardmax_canonicalize,
    dtypes=FLOATS,
)
def _hardmax(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input must have rank >= 1")
    ctx.axis(ctx.attr_int("axis", -1), x.rank)
    return (x,)
