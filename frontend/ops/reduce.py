"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, ArgMax, ArgMin, and the scan CumSum.

The canonical form takes `axes` as a constant int64 input (ONNX moved it from an attribute
to an input in opset 13 for ReduceSum and in opset 18 for the others); an absent or empty
`axes` reduces every axis unless `noop_with_empty_axes` is set, in which case the op is
applied elementwise without reducing (|x| for ReduceL1, x * x for ReduceSumSquare, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..graph import FLOAT_DTYPES, INT_DTYPES, Node, TensorType
from .base import InferContext, OpKind, Rewrite, register

INTS = frozenset({"int32", "int64"})
SUM_DTYPES = FLOAT_DTYPES | INTS
MAX_DTYPES = FLOAT_DTYPES | INTS | {"int8", "uint8", "uint32", "uint64", "bool"}
ARG_DTYPES = FLOAT_DTYPES | INT_DTYPES
#: ReduceProd / L1 / SumSquare allow unsigned 32 / 64-bit integers as well as ReduceSum's
PROD_DTYPES = SUM_DTYPES | {"uint32", "uint64"}
#: CumSum: every float type (float16 and bfloat16 since opset 14), 32- and 64-bit integers
CUMSUM_DTYPES = FLOAT_DTYPES | INTS | {"uint32", "uint64"}

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


def _extreme(dtype: np.dtype, highest: bool) -> object:
    """The dtype's lowest or highest value: the identity of max or min."""
    if dtype == np.bool_:
        return highest
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max if highest else np.iinfo(dtype).min
    return np.inf if highest else -np.inf


def _sum(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = np.float32 if x.dtype == np.float16 else x.dtype  # accumulate halves in float32
    return np.sum(x, axis=axes, keepdims=keep, dtype=calc)


def _mean(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = np.float64 if x.dtype == np.float64 else np.float32
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.mean(x.astype(calc), axis=axes, keepdims=keep)


def _float_calc(x: np.ndarray) -> np.ndarray:
    """x in the accumulation dtype of the float reductions: float32, float64 for float64."""
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32)


def _max(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keep, initial=_extreme(x.dtype, highest=False))


def _min(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=keep, initial=_extreme(x.dtype, highest=True))


def _prod(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = np.float32 if x.dtype == np.float16 else x.dtype
    return np.prod(x, axis=axes, keepdims=keep, dtype=calc)


def _sum_square(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = x.astype(np.float32) if x.dtype == np.float16 else x
    return np.sum(calc * calc, axis=axes, keepdims=keep)


def _l1(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    calc = x.astype(np.float32) if x.dtype == np.float16 else x
    return np.sum(np.abs(calc), axis=axes, keepdims=keep)


def _log_sum(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log(np.sum(_float_calc(x), axis=axes, keepdims=keep))


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    """max + log(sum(exp(x - max))), the maximum replaced by 0 where it is infinite (an
    all -inf slice then gives -inf, not NaN)."""
    calc = _float_calc(x)
    peak = np.max(calc, axis=axes, keepdims=True, initial=-np.inf)
    peak = np.where(np.isinf(peak), 0, peak).astype(calc.dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        total = np.sum(np.exp(calc - peak), axis=axes, keepdims=True)
        result = np.log(total) + peak
    return result if keep else np.squeeze(result, axis=axes)


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
_reduction("ReduceMin", _min, MAX_DTYPES, 18)
_reduction("ReduceProd", _prod, PROD_DTYPES, 18)
_reduction("ReduceSumSquare", _sum_square, PROD_DTYPES, 18)
_reduction("ReduceL1", _l1, PROD_DTYPES, 18)
# integer inputs are left out: onnx removed them in opset 28 (exp and log are float ops)
_reduction("ReduceLogSum", _log_sum, FLOAT_DTYPES, 18)
_reduction("ReduceLogSumExp", _log_sum_exp, FLOAT_DTYPES, 18)


def arg_axis(ctx: InferContext) -> int:
    """ArgMax's / ArgMin's normalized axis, checked to be non-empty."""
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input must have rank >= 1")
    axis = ctx.axis(ctx.attr_int("axis", 0), x.rank)
    if x.shape[axis] == 0:
        extreme = "maximum" if ctx.node.op_type == "ArgMax" else "minimum"
        raise ctx.error(f"axis {axis} of input {list(x.shape)} is empty: no {extreme} exists")
    if ctx.attr_int("select_last_index", 0) not in (0, 1):
        raise ctx.error("attribute select_last_index must be 0 or 1")
    return axis


def _arg_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    axis = arg_axis(ctx)
    find = np.argmax if ctx.node.op_type == "ArgMax" else np.argmin
    if ctx.attr_int("select_last_index", 0):
        index = x.shape[axis] - 1 - find(np.flip(x, axis=axis), axis=axis)
    else:
        index = find(x, axis=axis)
    if _keepdims(ctx):
        index = np.expand_dims(index, axis)
    return (np.asarray(index, dtype=np.int64),)


def _arg_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    axis = arg_axis(ctx)
    if _keepdims(ctx):
        shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    else:
        shape = x.shape[:axis] + x.shape[axis + 1 :]
    return (TensorType(shape, "int64"),)


for _op in ("ArgMax", "ArgMin"):
    register(_op, OpKind.REDUCTION, evaluate=_arg_evaluate, dtypes=ARG_DTYPES)(_arg_infer)


# --- CumSum -----------------------------------------------------------------------------------


def cumsum_axis(ctx: InferContext) -> int:
    """The normalized axis of CumSum (input 1: a 0-D, or one-element 1-D, int tensor)."""
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input x must have rank >= 1")
    axis_type = ctx.type(1)
    if axis_type.dtype not in INTS or axis_type.rank > 1 or axis_type.size != 1:
        raise ctx.error(f"axis (input 1) must be a 0-D int32 / int64 tensor, got {axis_type}")
    for flag in ("exclusive", "reverse"):
        if ctx.attr_int(flag, 0) not in (0, 1):
            raise ctx.error(f"attribute {flag}={ctx.attr_int(flag, 0)} must be 0 or 1")
    return ctx.axis(ctx.const_ints(1, "axis")[0], x.rank, "axis (input 1)")


def _cumsum_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    axis = cumsum_axis(ctx)
    reverse = bool(ctx.attr_int("reverse", 0))
    calc = np.flip(x, axis) if reverse else x
    acc = np.float32 if x.dtype == np.float16 else x.dtype
    total = np.cumsum(calc, axis=axis, dtype=acc)
    if ctx.attr_int("exclusive", 0) and x.shape[axis]:
        total = np.concatenate(
            [np.zeros_like(np.take(total, [0], axis=axis)), np.delete(total, -1, axis=axis)],
            axis=axis,
        )
    if reverse:
        total = np.flip(total, axis)
    return (np.ascontiguousarray(total).astype(x.dtype),)


@register("CumSum", OpKind.ANCHOR, evaluate=_cumsum_evaluate, dtypes=CUMSUM_DTYPES, params={1})
def _cumsum(ctx: InferContext) -> tuple[TensorType, ...]:
    cumsum_axis(ctx)
    return (ctx.type(0),)
