"""Elementwise ops: unary math (trigonometric, rounding, sign, float tests) and
activations, broadcasting binary and variadic ops, comparisons, logic and bitwise ops,
Mod, Cast and CastLike, Clip, Where; Size (folded from the static shape).

Each op's numpy evaluation is used only for compile-time folding; ops without one fold
through onnx's reference evaluator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from polytile.errors import ModelError, UnsupportedOpError

from ..graph import FLOAT_DTYPES, INT_DTYPES, Node, TensorType
from ..narrow import ROUND_MODES
from ..onnx_io import dtype_to_onnx, onnx_to_dtype
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
_unary("Sign", lambda c, x: np.sign(x), NUMERIC)
_unary("Round", lambda c, x: np.round(x), FLOAT_DTYPES)  # halves to even
_unary("BitwiseNot", lambda c, x: np.invert(x), INT_DTYPES)
for _op, _fn in {
    "Sin": np.sin,
    "Cos": np.cos,
    "Tan": np.tan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Atan": np.arctan,
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Atanh": np.arctanh,
}.items():
    _unary(_op, lambda c, x, fn=_fn: fn(x), FLOAT_DTYPES)
_unary(
    "ThresholdedRelu",
    lambda c, x: np.where(x > c.attr_float("alpha", 1.0), x, 0),
    FLOAT_DTYPES,
)
_unary(
    "Celu",
    lambda c, x: (
        np.maximum(x, 0)
        + np.minimum(0, c.attr_float("alpha", 1.0) * np.expm1(x / c.attr_float("alpha", 1.0)))
    ),
    FLOAT_DTYPES,
)
_unary(
    "Shrink",
    lambda c, x: np.where(
        x < -c.attr_float("lambd", 0.5),
        x + c.attr_float("bias", 0.0),
        np.where(x > c.attr_float("lambd", 0.5), x - c.attr_float("bias", 0.0), 0),
    ),
    NUMERIC,
)


def _float_test(op_type: str, fn: Unary) -> None:
    """A float predicate (IsNaN, IsInf): bool output of the input's shape."""

    def evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
        return (np.asarray(fn(ctx, xs[0]), dtype=bool),)

    def infer(ctx: InferContext) -> tuple[TensorType, ...]:
        return (TensorType(ctx.shape(0), "bool"),)

    register(op_type, OpKind.ELEMENTWISE, evaluate=evaluate, dtypes=FLOAT_DTYPES)(infer)


_float_test("IsNaN", lambda c, x: np.isnan(x))
_float_test(
    "IsInf",
    lambda c, x: (
        (np.isposinf(x) & bool(c.attr_int("detect_positive", 1)))
        | (np.isneginf(x) & bool(c.attr_int("detect_negative", 1)))
    ),
)


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
_binary("GreaterOrEqual", np.greater_equal, NUMERIC, "bool")
_binary("LessOrEqual", np.less_equal, NUMERIC, "bool")
_binary("Or", np.logical_or, frozenset({"bool"}), "bool")
_binary("Xor", np.logical_xor, frozenset({"bool"}), "bool")
_binary("BitwiseAnd", np.bitwise_and, INT_DTYPES)
_binary("BitwiseOr", np.bitwise_or, INT_DTYPES)
_binary("BitwiseXor", np.bitwise_xor, INT_DTYPES)


def _mod_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    fn = np.fmod if ctx.attr_int("fmod", 0) else np.mod
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(fn(xs[0], xs[1])).astype(xs[0].dtype, copy=False),)


@register("Mod", OpKind.ELEMENTWISE, evaluate=_mod_evaluate, dtypes=NUMERIC)
def _mod(ctx: InferContext) -> tuple[TensorType, ...]:
    """fmod=0: the sign of the divisor (Python's %); fmod=1: of the dividend (C's fmod)."""
    if ctx.attr_int("fmod", 0) not in (0, 1):
        raise ctx.error(f"attribute fmod={ctx.attr_int('fmod')} is not 0 or 1")
    return _infer_broadcast(ctx)


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
    round_mode = ctx.node.attrs.get("round_mode", "up")
    if round_mode not in ROUND_MODES:
        raise ModelError(
            f"{ctx.where()}: round_mode '{round_mode}' is not one of {sorted(ROUND_MODES)}"
        )
    return (TensorType(ctx.shape(0), dtype),)


def _cast_like_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """CastLike is Cast to the second input's dtype (whose values are not read)."""
    node = ctx.node
    attrs = {"to": dtype_to_onnx(ctx.dtype(1))}
    for key in ("saturate", "round_mode"):
        if key in node.attrs:
            attrs[key] = node.attrs[key]
    return Rewrite((Node(node.name, "Cast", (node.inputs[0],), node.outputs, attrs),))


@register("CastLike", OpKind.ELEMENTWISE, canonicalize=_cast_like_canonicalize)
def _cast_like(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(ctx.shape(0), ctx.dtype(1)),)


@register(
    "Size",
    OpKind.SHAPE,
    evaluate=lambda ctx, xs: (np.array(ctx.type(0).size, dtype=np.int64),),
    needs_values=False,
)
def _size(ctx: InferContext) -> tuple[TensorType, ...]:
    """The number of elements, from the static shape: folded to a constant."""
    return (TensorType((), "int64"),)


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
