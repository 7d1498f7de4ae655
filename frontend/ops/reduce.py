"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceL2 and ArgMax.

The canonical form takes `axes` as a constant int64 input (ONNX moved it from an attribute
to an input in opset 13 for ReduceSum and in opset 18 for the others); an absent or empty
`axes` reduces every axis unless `noop_with_empty_axes` is set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..graph import FLOAT_DTYPES, INT_DTYPES, Node, TensorType
from .base import InferContext, OpKind, Rewrite, register

INTS = frozenset({"int32", "int64"})
SUM_DTYPES = FLOAT_DTYPES | INTS
MAX_DTYPES = FLOAT_DTYPES | INTS | {"int8", "uint8", "bool"}
ARG_DTYPES = FLOAT_DTYPES | INT_DTYPES

Reducer = Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]


def reduced_axes(ctx: InferContext) -> tuple[int, ...]:
    """The sorted, non-negative axes a Reduce* node reduces (empty: the node is a no-op)."""
    rank = ctx.type(0).rank
    axes: tuple[int, ...] = ()
    if ctx.has_input(1):
        if len(ctx.shape(1)) > 1 or ctx.dtype(1) != "int64":
            raise ctx.error(f"axes (input 1) must be a 1-D int64 tensor, got {ctx.type(1)}")
        axes = ctx.const_ints(1, "axes")
    if not axes:
        return () if ctx.attr_int("noop_with_empty_axes", 0) else tuple(range(rank))
    out = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise ctx.error(f"axes value {axis} is out of range for rank {rank}")
        out.append(axis % rank)
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} name an axis more than once")
    return tuple(sorted(out))


def _keepdims(ctx: InferContext) -> bool:
    value = ctx.attr_int("keepdims", 1)
    if value not in (0, 1):
        raise ctx.error(f"attribute keepdims={value} must be 0 or 1")
    return bool(value)


def _infer_reduce(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axes = reduced_axes(ctx)
    keep = _keepdims(ctx)
    shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(x.shape))
    return (TensorType(tuple(d for d in shape if d is not None), x.dtype),)


def _axes_to_input(since_input: int) -> Callable[[InferContext, int], Rewrite]:
    """Before `since_input`, axes is an attribute; the canonical form has it as input 1."""

    def canonicalize(ctx: InferContext, since: int) -> Rewrite:
        node = ctx.node
        if since >= since_input:
            return Rewrite((node,))
        attrs = dict(node.attrs)
        axes = attrs.pop("axes", None)
        inputs: tuple[str, ...] = (node.inputs[0],)
        constants = {}
        if axes is not None and len(axes):
            name = ctx.fresh("axes")
            constants[name] = np.array([int(a) for a in axes], dtype=np.int64)
            inputs = (*inputs, name)
        new = Node(node.name, node.op_type, inputs, node.outputs, attrs, node.domain)
        return Rewrite((new,), constants)

    return canonicalize


def _lowest(dtype: np.dtype) -> object:
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


def _sum(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = np.float32 if x.dtype == np.float16 else x.dtype  # accumulate halves in float32
    return np.sum(x, axis=axes, keepdims=keep, dtype=calc)


def _mean(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = np.float64 if x.dtype == np.float64 else np.float32
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.mean(x.astype(calc), axis=axes, keepdims=keep)


def _max(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keep, initial=_lowest(x.dtype))


def _l2(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    return np.sqrt(np.sum(calc * calc, axis=axes, keepdims=keep))


def _reduction(op_type: str, fn: Reducer, dtypes: frozenset[str], since_input: int) -> None:
    def evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
        x = xs[0]
        axes = reduced_axes(ctx)  # empty: the op applied without reducing (|x| for L2)
        return (np.asarray(fn(x, axes, _keepdims(ctx))).astype(x.dtype),)

    register(
        op_type,
        OpKind.REDUCTION,
        evaluate=evaluate,
        canonicalize=_axes_to_input(since_input),
        dtypes=dtypes,
        params={1},
    )(_infer_reduce)


_reduction("ReduceSum", _sum, SUM_DTYPES, 13)
_reduction("ReduceMean", _mean, FLOAT_DTYPES, 18)
_reduction("ReduceMax", _max, MAX_DTYPES, 18)
_reduction("ReduceL2", _l2, FLOAT_DTYPES, 18)


def _argmax_axis(ctx: InferContext) -> int:
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input must have rank >= 1")
    axis = ctx.axis(ctx.attr_int("axis", 0), x.rank)
    if x.shape[axis] == 0:
        raise ctx.error(f"axis {axis} of input {list(x.shape)} is empty: no maximum exists")
    if ctx.attr_int("select_last_index", 0) not in (0, 1):
        raise ctx.error("attribute select_last_index must be 0 or 1")
    return axis


def _argmax_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    axis = _argmax_axis(ctx)
    if ctx.attr_int("select_last_index", 0):
        index = x.shape[axis] - 1 - np.argmax(np.flip(x, axis=axis), axis=axis)
    else:
        index = np.argmax(x, axis=axis)
    if _keepdims(ctx):
        index = np.expand_dims(index, axis)
    return (np.asarray(index, dtype=np.int64),)


@register("ArgMax", OpKind.REDUCTION, evaluate=_argmax_evaluate, dtypes=ARG_DTYPES)
def _argmax(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axis = _argmax_axis(ctx)
    if _keepdims(ctx):
        shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    else:
        shape = x.shape[:axis] + x.shape[axis + 1 :]
    return (TensorType(shape, "int64"),)
