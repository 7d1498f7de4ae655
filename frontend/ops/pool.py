"""Pooling ops: AveragePool, MaxPool (with its optional Indices output: the flat index of
each maximum in X, row-major or with storage_order=1 column-major over the spatial axes),
GlobalAveragePool and GlobalMaxPool. The window rules are `nn`'s, shared with Conv.
"""

from __future__ import annotations

from ..graph import TensorType
from .base import InferContext, OpKind, Rewrite, register
from .nn import (
    FLOATS,
    POOL8_DTYPES,
    Window,
    _flag,
    _require_outputs,
    _rewrite_outputs,
    _window,
)


def pool_window(ctx: InferContext) -> tuple[TensorType, Window]:
    """An AveragePool / MaxPool node's output type and resolved window."""
    x = ctx.type(0)
    if x.rank < 3:
        raise ctx.error(f"X has shape {list(x.shape)}; expected rank >= 3 (N, C, spatial...)")
    kernel = ctx.attr_ints("kernel_shape")
    if kernel is None:
        raise ctx.error("attribute 'kernel_shape' is required")
    window = _window(ctx, x.shape[2:], kernel, ceil_mode=_flag(ctx, "ceil_mode"))
    return TensorType((*x.shape[:2], *window.out), x.dtype), window


@register("AveragePool", OpKind.ANCHOR, dtypes=FLOATS)
def _average_pool(ctx: InferContext) -> tuple[TensorType, ...]:
    _flag(ctx, "count_include_pad")
    return (pool_window(ctx)[0],)


def _wants_indices(ctx: InferContext) -> bool:
    return len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])


def _max_pool_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Without Indices the node keeps one output and no storage_order (it only orders
    Indices); with it, storage_order is kept only when 1."""
    column_major = _flag(ctx, "storage_order")
    if not _wants_indices(ctx):
        return _rewrite_outputs(ctx, 1, "Indices", storage_order=None)
    return _rewrite_outputs(ctx, 2, "no such output", storage_order=1 if column_major else None)


@register("MaxPool", OpKind.ANCHOR, canonicalize=_max_pool_canonicalize, dtypes=POOL8_DTYPES)
def _max_pool(ctx: InferContext) -> tuple[TensorType, ...]:
    _flag(ctx, "storage_order")
    out = pool_window(ctx)[0]
    if _wants_indices(ctx):
        return out, TensorType(out.shape, "int64")
    _require_outputs(ctx, 1, "Indices")
    return (out,)


def _global_pool(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 2:
        raise ctx.error(f"X has shape {list(x.shape)}; expected rank >= 2 (N, C, spatial...)")
    return (TensorType((*x.shape[:2], *(1,) * (x.rank - 2)), x.dtype),)


register("GlobalAveragePool", OpKind.ANCHOR, dtypes=FLOATS)(_global_pool)
register("GlobalMaxPool", OpKind.ANCHOR, dtypes=FLOATS)(_global_pool)
