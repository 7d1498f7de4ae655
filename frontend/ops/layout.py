"""Layout ops that move channels into space and back: DepthToSpace and SpaceToDepth, each
in DCR (depth-column-row, the default) and CRD mode (SpaceToDepth has `mode` since opset
28). Both are injective: each output element is one input element."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..graph import TensorType
from .base import InferContext, OpKind, register


def block_size(ctx: InferContext) -> int:
    """The checked `blocksize` of a rank-4 (N, C, H, W) input."""
    x = ctx.type(0)
    if x.rank != 4:
        raise ctx.error(f"input has shape {list(x.shape)}; expected rank 4 (N, C, H, W)")
    size = ctx.attr_int("blocksize")
    if size <= 0:
        raise ctx.error(f"attribute blocksize={size} must be positive")
    return size


def depth_mode(ctx: InferContext) -> str:
    """The `mode`: DCR (depth-column-row, the default) or CRD."""
    mode = ctx.attr_str("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.error(f"attribute mode='{mode}' must be 'DCR' or 'CRD'")
    return mode


def _checked(ctx: InferContext) -> tuple[int, tuple[int, ...]]:
    """The blocksize and the input's (N, C, H, W), once the attributes are checked."""
    b = block_size(ctx)
    depth_mode(ctx)
    return b, ctx.shape(0)


def _depth_to_space_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    b = block_size(ctx)
    n, c, h, w = x.shape
    if depth_mode(ctx) == "DCR":
        blocks = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        blocks = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return (np.ascontiguousarray(blocks.reshape(n, c // (b * b), h * b, w * b)),)


@register("DepthToSpace", OpKind.INJECTIVE, evaluate=_depth_to_space_evaluate)
def _depth_to_space(ctx: InferContext) -> tuple[TensorType, ...]:
    b, (n, c, h, w) = _checked(ctx)
    if c % (b * b):
        raise ctx.error(f"the {c} channels of the input are not a multiple of blocksize² {b * b}")
    return (TensorType((n, c // (b * b), h * b, w * b), ctx.dtype(0)),)


def _space_to_depth_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    b = block_size(ctx)
    n, c, h, w = x.shape
    order = (0, 3, 5, 1, 2, 4) if depth_mode(ctx) == "DCR" else (0, 1, 3, 5, 2, 4)
    blocks = x.reshape(n, c, h // b, b, w // b, b).transpose(order)
    return (np.ascontiguousarray(blocks.reshape(n, c * b * b, h // b, w // b)),)


@register("SpaceToDepth", OpKind.INJECTIVE, evaluate=_space_to_depth_evaluate)
def _space_to_depth(ctx: InferContext) -> tuple[TensorType, ...]:
    b, (n, c, h, w) = _checked(ctx)
    if h % b or w % b:
        raise ctx.error(f"the input's height {h} and width {w} are not multiples of blocksize {b}")
    return (TensorType((n, c * b * b, h // b, w // b), ctx.dtype(0)),)
