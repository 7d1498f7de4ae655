"""Compute definitions of the elementwise ops: one statement over the output's box, loading
every input with numpy broadcasting."""

from __future__ import annotations

import math
from collections.abc import Callable

from polytile.errors import UnsupportedOpError
from polytile.poly.ir.expr import Cast, Const, Expr, binary, select, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import LowerContext, lowering

Build = Callable[[LowerContext, list[Expr]], Expr]


def _statement(ctx: LowerContext, build: Build) -> list[Statement]:
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    name = ctx.statement_name()
    args = [ctx.broadcast_load(t, dims, out.shape) if t else None for t in ctx.node.inputs]
    expr = build(ctx, args)
    if expr.dtype != out.dtype:
        expr = Cast(expr, out.dtype)
    return [Statement(name, dims, ctx.domain(name, dims, out.shape), ctx.output(), dims, expr)]


def _simple(op_type: str, build: Build) -> None:
    lowering(op_type)(lambda ctx: _statement(ctx, build))


def _f(ctx: LowerContext, name: str, default: float, like: Expr) -> Expr:
    return ctx.const(float(ctx.attr(name, default)), like.dtype)  # type: ignore[arg-type]


def _softplus(ctx: LowerContext, x: Expr) -> Expr:
    """log(1 + exp(x)) computed stably: max(x, 0) + log(1 + exp(-|x|))."""
    one = ctx.const(1.0, x.dtype)
    tail = unary("log", binary("add", one, unary("exp", unary("neg", unary("abs", x)))))
    return binary("add", binary("max", x, ctx.const(0.0, x.dtype)), tail)


for _op, _fn in {
    "Abs": "abs",
    "Neg": "neg",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Erf": "erf",
    "Tanh": "tanh",
    "Floor": "floor",
    "Ceil": "ceil",
    "Not": "not",
    "Sigmoid": "sigmoid",
    "Reciprocal": "recip",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
    "Round": "round",
    "BitwiseNot": "bitnot",
}.items():
    _simple(_op, lambda ctx, a, fn=_fn: unary(fn, a[0]))

for _op, _fn in {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "And": "and",
    "Equal": "eq",
    "Greater": "gt",
    "Less": "lt",
    "GreaterOrEqual": "ge",
    "LessOrEqual": "le",
    "Or": "or",
    "Xor": "xor",
    "BitwiseAnd": "bitand",
    "BitwiseOr": "bitor",
    "BitwiseXor": "bitxor",
}.items():
    _simple(_op, lambda ctx, a, fn=_fn: binary(fn, a[0], a[1]))


def _fold(fn: str) -> Build:
    def build(ctx: LowerContext, args: list[Expr]) -> Expr:
        acc = args[0]
        for arg in args[1:]:
            acc = binary(fn, acc, arg)
        return acc

    return build


def _pow(ctx: LowerContext, a: list[Expr]) -> Expr:
    """ONNX's Pow takes an exponent of any numeric type; the result has the base's type.
    A float base takes the converted exponent; an integer base with a float exponent is
    raised in double (as onnx's reference does) and converted back."""
    base, exponent = a
    value = ctx.constant(1)
    if base.dtype.startswith("float") and value is not None and value.size == 1:
        # a constant exponent in the expression itself: code generation raises to the
        # common powers (2, 0.5, ...) without pow (`Instance.constant_power`)
        return binary("pow", base, Const(float(value.reshape(-1)[0]), base.dtype))
    if exponent.dtype == base.dtype:
        return binary("pow", base, exponent)
    if base.dtype.startswith("float") or not exponent.dtype.startswith("float"):
        return binary("pow", base, Cast(exponent, base.dtype))
    return Cast(binary("pow", Cast(base, "float64"), Cast(exponent, "float64")), base.dtype)


_simple("Pow", _pow)
_simple("Max", _fold("max"))
_simple("Min", _fold("min"))
_simple("Sum", _fold("add"))
_simple("Relu", lambda ctx, a: binary("max", a[0], ctx.const(0, a[0].dtype)))
_simple(
    "Cast",
    lambda ctx, a: Cast(
        a[0],
        ctx.output_type().dtype,
        bool(ctx.attr("saturate", 1)),
        str(ctx.attr("round_mode", "up")),
    ),
)
_simple("Where", lambda ctx, a: select(a[0], a[1], a[2]))
_simple(
    "PRelu",
    lambda ctx, a: select(
        binary("lt", a[0], ctx.const(0, a[0].dtype)), binary("mul", a[0], a[1]), a[0]
    ),
)
_simple(
    "LeakyRelu",
    lambda ctx, a: select(
        binary("ge", a[0], ctx.const(0, a[0].dtype)),
        a[0],
        binary("mul", _f(ctx, "alpha", 0.01, a[0]), a[0]),
    ),
)


def _elu(ctx: LowerContext, a: list[Expr], alpha: float, scale: float) -> Expr:
    x = a[0]
    neg = binary(
        "mul", ctx.const(alpha, x.dtype), binary("sub", unary("exp", x), ctx.const(1.0, x.dtype))
    )
    value = select(binary("gt", x, ctx.const(0.0, x.dtype)), x, neg)
    return value if scale == 1.0 else binary("mul", ctx.const(scale, x.dtype), value)


_simple("Elu", lambda ctx, a: _elu(ctx, a, float(ctx.attr("alpha", 1.0)), 1.0))
_simple(
    "Selu",
    lambda ctx, a: _elu(
        ctx,
        a,
        float(ctx.attr("alpha", 1.67326319217681884765625)),
        float(ctx.attr("gamma", 1.05070102214813232421875)),
    ),
)


def _hard_sigmoid(ctx: LowerContext, x: Expr, alpha: float, beta: float) -> Expr:
    lin = binary("add", binary("mul", ctx.const(alpha, x.dtype), x), ctx.const(beta, x.dtype))
    return binary("min", binary("max", lin, ctx.const(0.0, x.dtype)), ctx.const(1.0, x.dtype))


_simple(
    "HardSigmoid",
    lambda ctx, a: _hard_sigmoid(
        ctx, a[0], float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    ),
)
_simple("HardSwish", lambda ctx, a: binary("mul", a[0], _hard_sigmoid(ctx, a[0], 1 / 6, 0.5)))
_simple("Softplus", lambda ctx, a: _softplus(ctx, a[0]))
_simple(
    "Softsign",
    lambda ctx, a: binary(
        "div", a[0], binary("add", ctx.const(1.0, a[0].dtype), unary("abs", a[0]))
    ),
)
_simple("Mish", lambda ctx, a: binary("mul", a[0], unary("tanh", _softplus(ctx, a[0]))))


def _gelu(ctx: LowerContext, a: list[Expr]) -> Expr:
    x = a[0]
    c = lambda v: ctx.const(v, x.dtype)  # noqa: E731
    if ctx.attr("approximate", "none") == "tanh":
        cube = binary("mul", binary("mul", x, x), x)
        inner = binary(
            "mul", c(math.sqrt(2 / math.pi)), binary("add", x, binary("mul", c(0.044715), cube))
        )
        gate = binary("add", c(1.0), unary("tanh", inner))
    else:
        gate = binary("add", c(1.0), unary("erf", binary("mul", x, c(1 / math.sqrt(2)))))
    return binary("mul", binary("mul", c(0.5), x), gate)


_simple("Gelu", _gelu)


def _clip(ctx: LowerContext, a: list[Expr]) -> Expr:
    x = a[0]
    if len(a) > 1 and a[1] is not None:
        x = binary("max", x, a[1])
    if len(a) > 2 and a[2] is not None:
        x = binary("min", x, a[2])
    return x


_simple("Clip", _clip)


def _batch_norm(ctx: LowerContext, a: list[Expr]) -> Expr:
    """Inference BatchNormalization (the passes usually fold it away)."""
    x, scale, bias, mean, var = a[:5]
    eps = ctx.const(float(ctx.attr("epsilon", 1e-5)), x.dtype)
    inv = unary("recip", unary("sqrt", binary("add", var, eps)))
    return binary("add", binary("mul", binary("mul", binary("sub", x, mean), inv), scale), bias)


def _batch_norm_lowering(ctx: LowerContext) -> list[Statement]:
    if ctx.attr("training_mode", 0):
        raise UnsupportedOpError(
            f"node '{ctx.node.name}' (BatchNormalization): training_mode=1 on an input known "
            "only at run time (only inference is supported; on constants, as in weight "
            "standardization, it is computed at compile time)",
            ((ctx.node.name, "BatchNormalization", "training_mode=1"),),
        )
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    name = ctx.statement_name()
    x = ctx.load(ctx.node.inputs[0], dims)
    params = [ctx.load(ctx.node.inputs[i], (dims[1],)) for i in range(1, 5)]
    return [
        Statement(
            name,
            dims,
            ctx.domain(name, dims, out.shape),
            ctx.output(),
            dims,
            _batch_norm(ctx, [x, *params]),
        )
    ]


lowering("BatchNormalization")(_batch_norm_lowering)
_simple("Identity", lambda ctx, a: a[0])


def _sign(ctx: LowerContext, a: list[Expr]) -> Expr:
    """1, -1, 0 (+0 for either zero, as numpy and onnxruntime) or NaN."""
    x = a[0]
    zero, one = ctx.const(0, x.dtype), ctx.const(1, x.dtype)
    rest = x
    if x.dtype.startswith("float"):
        rest = select(binary("eq", x, zero), zero, x)
    if not x.dtype.startswith("uint"):
        rest = select(binary("lt", x, zero), ctx.const(-1, x.dtype), rest)
    return select(binary("gt", x, zero), one, rest)


def _mod(ctx: LowerContext, a: list[Expr]) -> Expr:
    """fmod=1: C's remainder (the sign of the dividend). fmod=0: the sign of the divisor
    (numpy's mod): a nonzero remainder whose sign differs from the divisor's moves by
    one divisor, and a zero one of floats takes the divisor's sign."""
    x, y = a
    r = binary("mod", x, y)
    if ctx.attr("fmod", 0) or x.dtype.startswith("uint"):
        return r
    zero = ctx.const(0, x.dtype)
    differ = binary("ne", binary("lt", r, zero), binary("lt", y, zero))
    moved = select(binary("and", binary("ne", r, zero), differ), binary("add", r, y), r)
    if not x.dtype.startswith("float"):
        return moved
    signed_zero = select(binary("lt", y, zero), ctx.const(-0.0, x.dtype), zero)
    return select(binary("eq", moved, zero), signed_zero, moved)


def _is_inf(ctx: LowerContext, a: list[Expr]) -> Expr:
    x = a[0]
    positive, negative = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    inf = ctx.const(math.inf, x.dtype)
    if positive and negative:
        return binary("eq", unary("abs", x), inf)
    if positive:
        return binary("eq", x, inf)
    if negative:
        return binary("eq", x, unary("neg", inf))
    return ctx.const(False, "bool")


def _shrink(ctx: LowerContext, a: list[Expr]) -> Expr:
    """Integers are compared and shifted in double, as onnx's reference does (its float
    attributes promote them), then converted back by the statement."""
    x = a[0] if a[0].dtype.startswith("float") else Cast(a[0], "float64")
    lambd, bias = float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0))  # type: ignore[arg-type]
    c = lambda v: ctx.const(v, x.dtype)  # noqa: E731
    above = select(binary("gt", x, c(lambd)), binary("sub", x, c(bias)), c(0.0))
    return select(binary("lt", x, c(-lambd)), binary("add", x, c(bias)), above)


def _celu(ctx: LowerContext, a: list[Expr]) -> Expr:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = a[0]
    alpha = float(ctx.attr("alpha", 1.0))  # type: ignore[arg-type]
    c = lambda v: ctx.const(v, x.dtype)  # noqa: E731
    scaled = x if alpha == 1.0 else binary("div", x, c(alpha))
    negative = binary("sub", unary("exp", scaled), c(1.0))
    if alpha != 1.0:
        negative = binary("mul", c(alpha), negative)
    return binary("add", binary("max", x, c(0.0)), binary("min", negative, c(0.0)))


_simple("Sign", _sign)
_simple("Mod", _mod)
_simple("IsNaN", lambda ctx, a: binary("ne", a[0], a[0]))
_simple("IsInf", _is_inf)
_simple("Shrink", _shrink)
_simple(
    "ThresholdedRelu",
    lambda ctx, a: select(
        binary("gt", a[0], _f(ctx, "alpha", 1.0, a[0])), a[0], ctx.const(0.0, a[0].dtype)
    ),
)
_simple("Celu", _celu)
