"""Elementwise ops: unary math and activations, broadcasting binary and variadic ops,
comparisons and logic, Cast, Clip, Where.

Each op's numpy evaluation is used only for compile-time folding; ops without one fold
through onnx's reference evaluator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from polytile.errors import UnsupportedOpError

from ..graph import FLOAT_DTYPES, INT_DTYPES, Node, TensorType
from ..onnx_io import onnx_to_dtype
from .base import (
    InferContext,
    OpKind,
    Rewrite,
    broadcast_shapes,
    register,
    same_as_input,
)

NUMERIC = FLOAT_DTYPES | INT_DTYPES
SIGNED = FLOAT_DTYPES | {"int8", "int16", "int32", "int64"}

Unary = Callable[[InferContext, np.ndarray], np.ndarray]


def _unary(op_type: str, fn: Unary | None, dtypes: frozenset[str]) -> None:
    evaluate = None
    if fn is not None:

        def evaluate(
            ctx: InferContext, xs: Sequence[np.ndarray], fn: Unary = fn
        ) -> tuple[np.ndarray]:
            return (np.asarray(fn(ctx, xs[0])).astype(xs[0].dtype, copy=False),)

    register(op_type, OpKind.ELEMENTWISE, evaluate=evaluate, dtypes=dtypes)(same_as_input)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(x, 0.0)


_unary("Abs", lambda c, x: np.abs(x), NUMERIC)
_unary("Neg", lambda c, x: np.negative(x), SIGNED)
_unary("Ceil", lambda c, x: np.ceil(x), FLOAT_DTYPES)
_unary("Floor", lambda c, x: np.floor(x), FLOAT_DTYPES)
_unary("Exp", lambda c, x: np.exp(x), FLOAT_DTYPES)
_unary("Log", lambda c, x: np.log(x), FLOAT_DTYPES)
_unary("Sqrt", lambda c, x: np.sqrt(x), FLOAT_DTYPES)
_unary("Reciprocal", lambda c, x: np.reciprocal(x), FLOAT_DTYPES)
_unary("Tanh", lambda c, x: np.tanh(x), FLOAT_DTYPES)
_unary("Erf", None, FLOAT_DTYPES)
_unary("Relu", lambda c, x: np.maximum(x, 0), SIGNED)
_unary("Sigmoid", lambda c, x: 1.0 / (1.0 + np.exp(-x)), FLOAT_DTYPES)
_unary("Softplus", lambda c, x: _softplus(x), FLOAT_DTYPES)
_unary("Softsign", lambda c, x: x / (1.0 + np.abs(x)), FLOAT_DTYPES)
_unary("Mish", lambda c, x: x * np.tanh(_softplus(x)), FLOAT_DTYPES)
_unary("Not", lambda c, x: np.logical_not(x), frozenset({"bool"}))
_unary(
    "Elu",
    lambda c, x: np.where(x > 0, x, c.attr_float("alpha", 1.0) * (np.exp(x) - 1.0)),
    FLOAT_DTYPES,
)
_unary(
    "Selu",
    lambda c, x: (
        c.attr_float("gamma", 1.05070102214813232421875)
        * np.where(x > 0, x, c.attr_float("alpha", 1.67326319217681884765625) * (np.exp(x) - 1.0))
    ),
    FLOAT_DTYPES,
)
_unary(
    "LeakyRelu",
    lambda c, x: np.where(x >= 0, x, c.attr_float("alpha", 0.01) * x),
    FLOAT_DTYPES,
)
_unary(
    "HardSigmoid",
    lambda c, x: np.clip(c.attr_float("alpha", 0.2) * x + c.attr_float("beta", 0.5), 0.0, 1.0),
    FLOAT_DTYPES,
)
_unary("HardSwish", lambda c, x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0), FLOAT_DTYPES)


@register("Gelu", OpKind.ELEMENTWISE, dtypes=FLOAT_DTYPES)
def _gelu(ctx: InferContext) -> tuple[TensorType, ...]:
    approximate = ctx.attr_str("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"attribute approximate='{approximate}' is not 'none' or 'tanh'")
    return (ctx.type(0),)


# --- broadcasting binary and variadic ops ----------------------------------------------

Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX integer division truncates toward zero (C semantics)."""
    if np.issubdtype(a.dtype, np.integer):
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))).astype(q.dtype)
    return np.divide(a, b)


def _infer_broadcast(ctx: InferContext, out_dtype: str | None = None) -> tuple[TensorType, ...]:
    types = [ctx.type(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]
    if not types:
        raise ctx.error("needs at least one input")
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1 and ctx.node.op_type != "Pow":
        raise ctx.error(f"inputs have different dtypes {sorted(dtypes)}")
    shape = broadcast_shapes(ctx, *(t.shape for t in types))
    return (TensorType(shape, out_dtype or types[0].dtype),)


def _binary(op_type: str, fn: Binary, dtypes: frozenset[str], out_dtype: str | None = None) -> None:
    def infer(ctx: InferContext) -> tuple[TensorType, ...]:
        return _infer_broadcast(ctx, out_dtype)

    def evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
        result = np.asarray(fn(xs[0], xs[1]))
        return (result.astype(out_dtype or xs[0].dtype, copy=False),)

    register(op_type, OpKind.ELEMENTWISE, evaluate=evaluate, dtypes=dtypes)(infer)


_binary("Add", np.add, NUMERIC)
_binary("Sub", np.subtract, NUMERIC)
_binary("Mul", np.multiply, NUMERIC)
_binary("Div", _int_div, NUMERIC)
_binary("Pow", np.power, NUMERIC)
_binary("And", np.logical_and, frozenset({"bool"}), "bool")
_binary("Equal", np.equal, NUMERIC | {"bool"}, "bool")
_binary("Greater", np.greater, NUMERIC, "bool")
_binary("Less", np.less, NUMERIC, "bool")


def _variadic(op_type: str, fn: Binary) -> None:
    def evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
        result = xs[0]
        for x in xs[1:]:
            result = fn(result, x)
        return (np.asarray(result).astype(xs[0].dtype, copy=False),)

    register(op_type, OpKind.ELEMENTWISE, evaluate=evaluate, dtypes=NUMERIC)(_infer_broadcast)


_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
_variadic("Sum", np.add)


@register(
    "PRelu",
    OpKind.ELEMENTWISE,
    evaluate=lambda ctx, xs: (np.where(xs[0] < 0, xs[0] * xs[1], xs[0]).astype(xs[0].dtype),),
    dtypes=SIGNED,
)
def _prelu(ctx: InferContext) -> tuple[TensorType, ...]:
    x, slope = ctx.type(0), ctx.type(1)
    shape = broadcast_shapes(ctx, x.shape, slope.shape)
    if shape != x.shape:
        raise ctx.error(f"slope shape {list(slope.shape)} does not broadcast to X {list(x.shape)}")
    return (x,)


@register(
    "Where",
    OpKind.ELEMENTWISE,
    evaluate=lambda ctx, xs: (np.where(xs[0], xs[1], xs[2]),),
    dtypes=frozenset({"bool"}),
)
def _where(ctx: InferContext) -> tuple[TensorType, ...]:
    if ctx.dtype(1) != ctx.dtype(2):
        raise ctx.error(f"X and Y have different dtypes {ctx.dtype(1)} and {ctx.dtype(2)}")
    shape = broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2))
    return (TensorType(shape, ctx.dtype(1)),)


def _cast_to(ctx: InferContext) -> str:
    return onnx_to_dtype(ctx.attr_int("to"), f"{ctx.where()}: attribute 'to'")


@register(
    "Cast",
    OpKind.ELEMENTWISE,
    evaluate=lambda ctx, xs: (xs[0].astype(_cast_to(ctx)),),
)
def _cast(ctx: InferContext) -> tuple[TensorType, ...]:
    try:
        dtype = _cast_to(ctx)
    except UnsupportedOpError as exc:
        raise ctx.unsupported(str(exc)) from exc
    return (TensorType(ctx.shape(0), dtype),)


def _clip_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = xs[0]
    lo = ctx.value(1)
    hi = ctx.value(2)
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return (x.astype(xs[0].dtype, copy=False),)


def _clip_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Clip before opset 11 takes min / max attributes; later versions take inputs."""
    node = ctx.node
    if since >= 11:
        return Rewrite((node,))
    dtype = np.dtype(ctx.dtype(0))
    consts = {}
    inputs = [node.inputs[0]]
    for bound, default in (("min", -np.inf), ("max", np.inf)):
        value = node.attrs.get(bound)
        name = ctx.fresh(bound)
        consts[name] = np.array(default if value is None else value, dtype=dtype)
        inputs.append(name)
    new = Node(node.name, "Clip", tuple(inputs), node.outputs, {})
    return Rewrite((new,), consts)


@register(
    "Clip",
    OpKind.ELEMENTWISE,
    evaluate=_clip_evaluate,
    canonicalize=_clip_canonicalize,
    dtypes=NUMERIC,
)
def _clip(ctx: InferContext) -> tuple[TensorType, ...]:
    for index in (1, 2):
        if ctx.has_input(index) and ctx.shape(index) not in ((), (1,)):
            raise ctx.error(f"input {index} must be a scalar, got shape {list(ctx.shape(index))}")
    return (ctx.type(0),)
