"""Compute definition of Resize, as onnx's reference evaluator computes it (separable,
float64 source coordinates in the reference's order of operations).

nearest: a gather with a piecewise affine index per axis (clamped ends and the
extrapolated borders of tf_crop_and_resize are pieces of their own), so the domains stay
exact; linear / cubic: a weighted sum of the 2 / 4 clamped neighbours per axis, loaded
indirectly. With antialias=1 (linear / cubic) a downsampled axis filters over a window
widened by 1 / scale: its weights depend on the output position only, so they are
computed at compile time (as onnx's reference does) into a constant (out, taps) table,
with the window's first source index per output position, and each resized axis is a sum
reduction over its taps into a float64 temporary (the first resized axis first, as the
reference), loading the clamped neighbours indirectly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import product

import numpy as np

from polytile.poly.ir.expr import Cast, Const, Expr, Iter, binary, select, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import (
    LowerContext,
    affine_text,
    copy_statement,
    floordiv_text,
    lowering,
    parens,
    reduction,
)

#: an affine float64 step of a source coordinate: ('add' | 'sub' | 'mul' | 'div', constant)
Step = tuple[str, float]


@dataclass(frozen=True)
class _Axis:
    """How one resized axis maps output positions to source coordinates: either a constant
    coordinate, or `steps` applied in float64 to the output position (the operations of
    onnx's reference evaluator, in its order, so that the float results are identical)."""

    size: int  # input length
    out: int  # output length
    steps: tuple[Step, ...]
    constant: float | None = None
    crop: bool = False  # tf_crop_and_resize: coordinates outside [0, size - 1] extrapolate
    scale: float = 1.0  # output / input length, as the reference reads it (antialias)

    def coordinates(self) -> np.ndarray:
        y = np.arange(self.out, dtype=np.float64)
        if self.constant is not None:
            return np.full(self.out, self.constant, dtype=np.float64)
        for op, c in self.steps:
            y = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](
                y, np.float64(c)
            )
        return y

    def coordinate(self, dim: str) -> Expr:
        if self.constant is not None:
            return Const(float(self.constant), "float64")
        value: Expr = Cast(Iter(dim), "float64")
        for op, c in self.steps:
            value = binary(op, value, Const(float(c), "float64"))
        return value

    def outside(self, coordinate: Expr) -> Expr:
        """Whether a coordinate extrapolates (tf_crop_and_resize)."""
        return binary(
            "or",
            binary("lt", coordinate, Const(0.0, "float64")),
            binary("gt", coordinate, Const(float(self.size - 1), "float64")),
        )


def _resize_axes(ctx: LowerContext) -> dict[int, _Axis]:
    """The resized axes (those the reference evaluator does not skip as identities)."""
    x, out = ctx.input_type(0), ctx.output_type()
    rank = x.rank
    given = ctx.attr("axes")
    axes = (
        [int(a) % rank for a in given]  # type: ignore[union-attr]
        if given is not None
        else list(range(rank))
    )
    coordinates = str(ctx.attr("coordinate_transformation_mode", "half_pixel"))
    policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
    scales = ctx.constant(2)
    if scales is not None and np.asarray(scales).size:
        factors = {a: float(s) for a, s in zip(axes, np.asarray(scales).reshape(-1), strict=True)}
    else:
        sizes = np.asarray(ctx.constant(3)).reshape(-1)
        factors = {a: int(s) / x.shape[a] for a, s in zip(axes, sizes, strict=True)}
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            common = float(pick(np.array(list(factors.values()))))
            factors = dict.fromkeys(axes, common)
    roi = None
    if coordinates == "tf_crop_and_resize":
        roi = np.asarray(ctx.constant(1)).reshape(-1)
    resized = {}
    for i, a in enumerate(axes):
        scale, size, length = factors[a], x.shape[a], out.shape[a]
        start, stop = (roi[i], roi[len(axes) + i]) if roi is not None else (0.0, 1.0)
        if (
            math.isclose(scale, 1.0)
            and length == size
            and math.isclose(float(start), 0.0)
            and math.isclose(float(stop), 1.0)
        ):
            continue
        axis = _coordinate_map(coordinates, scale, size, length, start, stop)
        resized[a] = replace(axis, scale=scale)
    return resized


def _coordinate_map(
    mode: str, scale: float, size: int, length: int, start: object, stop: object
) -> _Axis:
    width = scale * size  # the reference's (float) output width
    half = (("add", 0.5), ("div", scale), ("sub", 0.5))
    if mode == "align_corners":
        if width == 1:
            return _Axis(size, length, (), constant=0.0)
        return _Axis(size, length, (("mul", size - 1), ("div", width - 1)))
    if mode == "asymmetric":
        return _Axis(size, length, (("div", scale),))
    if mode == "pytorch_half_pixel":
        if width == 1:
            return _Axis(size, length, (), constant=-0.5)
        return _Axis(size, length, half)
    if mode == "half_pixel":
        return _Axis(size, length, half)
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - length / width)
        steps = (("add", 0.5), ("div", scale), ("add", offset), ("sub", 0.5))
        return _Axis(size, length, steps)
    # tf_crop_and_resize; the roi arithmetic happens in the roi's own dtype, as in onnx
    shift = float(start * (size - 1))  # type: ignore[operator]
    if width == 1:
        centre = np.float64((stop - start) * (size - 1) / 2)  # type: ignore[operator]
        return _Axis(size, length, (), constant=float(centre + shift), crop=True)
    steps = (("mul", float(stop - start)), ("mul", size - 1), ("div", width - 1), ("add", shift))  # type: ignore[operator]
    return _Axis(size, length, steps, crop=True)


# nearest: source index = clamp(round(coordinate), 0, size - 1) with the mode's rounding

ROUNDING = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _round(coordinates: np.ndarray, rounding: str) -> np.ndarray:
    """The reference's nearest pick: the coordinate when it is an integer, else its floor
    or the next index by the mode."""
    floor = np.floor(coordinates)
    frac = coordinates - floor
    up = {
        "round_prefer_floor": frac > 0.5,
        "round_prefer_ceil": frac >= 0.5,
        "floor": np.zeros_like(frac, dtype=bool),
        "ceil": frac > 0,
    }[rounding]
    return floor.astype(np.int64) + up


def _round_expr(coordinate: Expr, rounding: str) -> Expr:
    floor = unary("floor", coordinate)
    frac = binary("sub", coordinate, floor)
    index: Expr = Cast(floor, "int64")
    threshold = {"round_prefer_floor": ("gt", 0.5), "round_prefer_ceil": ("ge", 0.5)}
    if rounding == "floor":
        return index
    op, edge = threshold.get(rounding, ("gt", 0.0))
    one, zero = Const(1, "int64"), Const(0, "int64")
    return binary("add", index, select(binary(op, frac, Const(edge, "float64")), one, zero))


def _clamp(index: Expr, size: int) -> Expr:
    index = binary("max", index, Const(0, "int64"))
    return binary("min", index, Const(size - 1, "int64"))


def _fractions(value: float, limit: int | None) -> Fraction:
    exact = Fraction(value)
    return exact if limit is None else exact.limit_denominator(limit)


def _affine_rounding(axis: _Axis, rounding: str, limit: int | None) -> tuple[int, int, int]:
    """(A, B, D) with round(coordinate(y)) = floor((A*y + B) / D), the float constants of
    the coordinate map read as fractions of denominator at most `limit`."""
    if axis.constant is not None:
        a, b = Fraction(0), _fractions(axis.constant, limit)
    else:
        a, b = Fraction(1), Fraction(0)
        for op, c in axis.steps:
            f = _fractions(c, limit)
            if op == "add":
                b += f
            elif op == "sub":
                b -= f
            elif op == "mul":
                a, b = a * f, b * f
            else:
                a, b = a / f, b / f
    den = math.lcm(a.denominator, b.denominator)
    num_a, num_b = int(a * den), int(b * den)
    if rounding == "floor":
        terms = (num_a, num_b, den)
    elif rounding == "ceil":
        terms = (num_a, num_b + den - 1, den)
    elif rounding == "round_prefer_floor":  # ceil(u - 1/2)
        terms = (2 * num_a, 2 * num_b + den - 1, 2 * den)
    else:  # round_prefer_ceil: floor(u + 1/2)
        terms = (2 * num_a, 2 * num_b + den, 2 * den)
    # floor((g*a*y + b) / (g*d)) = floor((a*y + floor(b/g)) / d) for integer y
    g = math.gcd(terms[0], terms[2])
    return terms[0] // g, terms[1] // g, terms[2] // g


def _runs(keys: Sequence[str]) -> list[tuple[str, int, int]]:
    """Maximal runs of equal keys: (key, start, stop)."""
    runs: list[tuple[str, int, int]] = []
    for y, key in enumerate(keys):
        if runs and runs[-1][0] == key:
            runs[-1] = (key, runs[-1][1], y + 1)
        else:
            runs.append((key, y, y + 1))
    return runs


def _interval(dim: str, start: int, stop: int, length: int) -> tuple[str, ...]:
    where = []
    if start > 0:
        where.append(f"{dim} >= {start}")
    if stop < length:
        where.append(f"{dim} < {stop}")
    return tuple(where)


def _nearest_pieces(
    axis: _Axis, dim: str, rounding: str
) -> tuple[list[tuple[tuple[str, ...], str | Expr]], list[tuple[str, ...]]]:
    """The pieces of one axis of a nearest Resize: (constraints, source index) with an
    affine index where a formula reproduces the reference's float picks (an indirect float
    computation otherwise), and the extrapolated intervals of tf_crop_and_resize."""
    coords = axis.coordinates()
    raw = _round(coords, rounding)
    outside = (coords < 0) | (coords > axis.size - 1) if axis.crop else np.zeros(axis.out, bool)
    keys = [
        "ext" if o else "low" if r < 0 else "high" if r > axis.size - 1 else "mid"
        for o, r in zip(outside, raw, strict=True)
    ]
    pieces: list[tuple[tuple[str, ...], str | Expr]] = []
    extrapolated = []
    y = np.arange(axis.out, dtype=object)
    for key, start, stop in _runs(keys):
        where = _interval(dim, start, stop, axis.out)
        if key == "ext":
            extrapolated.append(where)
        elif key == "low":
            pieces.append((where, "0"))
        elif key == "high":
            pieces.append((where, str(axis.size - 1)))
        elif len(set(raw[start:stop].tolist())) == 1:
            pieces.append((where, str(int(raw[start]))))
        else:
            for limit in (16, 256, 4096, 1 << 20, None):
                a, b, d = _affine_rounding(axis, rounding, limit)
                if np.array_equal((a * y[start:stop] + b) // d, raw[start:stop]):
                    pieces.append((where, floordiv_text(affine_text([(a, dim)], b), d)))
                    break
            else:
                index = _clamp(_round_expr(axis.coordinate(dim), rounding), axis.size)
                pieces.append((where, index))
    return pieces, extrapolated


def _extrapolation(ctx: LowerContext) -> float:
    return float(ctx.attr("extrapolation_value", 0.0))  # type: ignore[arg-type]


@lowering("Resize")
def _resize(ctx: LowerContext) -> list[Statement]:
    """Resize as onnx's reference evaluator computes it (separable, float64 coordinates).

    nearest: a gather with a piecewise affine index per axis (clamped ends and the
    extrapolated borders of tf_crop_and_resize are pieces of their own); linear / cubic: a
    weighted sum of the 2 / 4 clamped neighbours per axis, loaded indirectly."""
    mode = str(ctx.attr("mode", "nearest"))
    resized = _resize_axes(ctx)
    if mode == "nearest":
        if int(ctx.attr("antialias", 0)):  # type: ignore[arg-type]
            raise ctx.unsupported("antialias=1 with mode 'nearest'")
        return _resize_nearest(ctx, resized)
    if mode in ("linear", "cubic") and int(ctx.attr("antialias", 0)):  # type: ignore[arg-type]
        return _resize_antialias(ctx, resized, mode)
    if mode == "linear":
        separable = _resize_linear_separable(ctx, resized)
        if separable is not None:
            return separable
    if mode in ("linear", "cubic"):
        return _resize_interpolate(ctx, resized, mode)
    raise ctx.unsupported(f"mode '{mode}'")


def _linear_pieces(axis: _Axis, dim: str) -> list[tuple[tuple[str, ...], str, str]] | None:
    """The pieces of one axis of a linear Resize: (constraints, left and right source
    index), affine where a formula reproduces the reference's float floor of the
    coordinate; the clamped ends are pieces of their own. None when no formula does."""
    raw = np.floor(axis.coordinates())
    keys = ["low" if r < 0 else "high" if r >= axis.size - 1 else "mid" for r in raw]
    y = np.arange(axis.out, dtype=object)
    pieces: list[tuple[tuple[str, ...], str, str]] = []
    for key, start, stop in _runs(keys):
        where = _interval(dim, start, stop, axis.out)
        if key != "mid":
            edge = "0" if key == "low" else str(axis.size - 1)
            pieces.append((where, edge, edge))
            continue
        for limit in (16, 256, 4096, 1 << 20, None):
            a, b, d = _affine_rounding(axis, "floor", limit)
            if np.array_equal((a * y[start:stop] + b) // d, raw[start:stop].astype(int)):
                left = floordiv_text(affine_text([(a, dim)], b), d)
                pieces.append((where, left, f"{parens(left)} + 1"))
                break
        else:
            return None
    return pieces


def _resize_linear_separable(
    ctx: LowerContext, resized: dict[int, _Axis]
) -> list[Statement] | None:
    """Linear Resize one axis at a time, the innermost first (as the reference's
    recursion): each pass a float64 temporary T[.., y, ..] = (1 - r(y)) S[.., i(y), ..]
    + r(y) S[.., i(y) + 1, ..] with an affine source index per piece of the axis, so the
    outer axes' passes read whole rows (vectors) and only the innermost gathers. None
    where it does not apply (integer outputs, exclude_outside, tf_crop_and_resize, or a
    coordinate map no affine formula reproduces)."""
    x, out = ctx.input_type(0), ctx.output_type()
    if (
        np.dtype(out.dtype).kind != "f"
        or int(ctx.attr("exclude_outside", 0))  # type: ignore[arg-type]
        or any(spec.crop or spec.constant is not None for spec in resized.values())
        or not resized
    ):
        return None
    dims = ctx.dims(out.rank)
    pieces = {a: _linear_pieces(spec, dims[a]) for a, spec in resized.items()}
    if any(p is None for p in pieces.values()):
        return None
    shape = list(x.shape)
    statements: list[Statement] = []
    source: str | None = None  # the previous pass's temporary, X first
    order = sorted(resized, reverse=True)
    for n, axis in enumerate(order):
        shape[axis] = resized[axis].out
        last = n == len(order) - 1
        target = ctx.output() if last else ctx.temp(f"axis{axis}", shape, "float64")
        coordinate = resized[axis].coordinate(dims[axis])
        ratio = binary("sub", coordinate, unary("floor", coordinate))
        for k, (where, left, right) in enumerate(pieces[axis]):  # type: ignore[union-attr]
            taps = []
            for weight, position in (
                (binary("sub", Const(1.0, "float64"), ratio), left),
                (ratio, right),
            ):
                index: list[str | Expr] = list(dims)
                index[axis] = position
                value: Expr = (
                    Cast(ctx.load(ctx.node.inputs[0], index), "float64")
                    if source is None
                    else ctx.load_temp(source, index)
                )
                taps.append(binary("mul", weight, value))
            total: Expr = binary("add", taps[0], taps[1])
            if last:
                total = Cast(total, out.dtype)
            name = ctx.statement_name(f"{ctx.node.name}_axis{axis}" + (f"_{k}" if k else ""))
            domain = ctx.domain(name, dims, shape, " and ".join(where))
            statements.append(Statement(name, dims, domain, target, dims, total))
        source = target
    return statements


def _resize_nearest(ctx: LowerContext, resized: dict[int, _Axis]) -> list[Statement]:
    rounding = str(ctx.attr("nearest_mode", "round_prefer_floor"))
    if rounding not in ROUNDING:
        raise ctx.unsupported(f"nearest_mode '{rounding}'")
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    per_axis: list[list[tuple[tuple[str, ...], str | Expr]]] = []
    extrapolated: list[str] = []
    for a, dim in enumerate(dims):
        if a not in resized:
            per_axis.append([((), dim)])
            continue
        pieces, outside = _nearest_pieces(resized[a], dim, rounding)
        per_axis.append(pieces)
        extrapolated += [f"({' and '.join(w) or 'true'})" for w in outside]
    statements = []
    for n, combination in enumerate(product(*per_axis)):
        where = [c for constraints, _ in combination for c in constraints]
        index = [index for _, index in combination]
        base = ctx.node.name if n == 0 else f"{ctx.node.name}_{n}"
        statements.append(copy_statement(ctx, index, where=where, base=base))
    if extrapolated:
        name = ctx.statement_name(f"{ctx.node.name}_extrapolate")
        domain = ctx.domain(name, dims, out.shape, " or ".join(extrapolated))
        fill = ctx.const(_extrapolation(ctx), out.dtype)
        statements.append(Statement(name, dims, domain, ctx.output(), dims, fill))
    return statements


def _cubic_weights(ratio: Expr, a: float) -> list[Expr]:
    """onnx's cubic convolution coefficients of the 4 taps at p-1, p, p+1, p+2."""
    c = lambda v: Const(float(v), "float64")  # noqa: E731
    one = c(1.0)
    add, sub, mul = (lambda x, y, op=op: binary(op, x, y) for op in ("add", "sub", "mul"))
    r1 = add(ratio, one)
    inv = sub(one, ratio)
    inv1 = add(inv, one)
    outer = lambda t: sub(  # noqa: E731
        mul(add(mul(sub(mul(c(a), t), c(5 * a)), t), c(8 * a)), t), c(4 * a)
    )
    inner = lambda t: add(  # noqa: E731
        mul(mul(sub(mul(c(a + 2), t), c(a + 3)), t), t), one
    )
    return [outer(r1), inner(ratio), inner(inv), outer(inv1)]


def _round_half_even(value: Expr) -> Expr:
    """numpy.round of a float64 Expr."""
    c = lambda v: Const(float(v), "float64")  # noqa: E731
    up = unary("floor", binary("add", value, c(0.5)))
    tie = binary("eq", binary("sub", up, value), c(0.5))
    odd = binary(
        "eq",
        binary("sub", up, binary("mul", c(2), unary("floor", binary("mul", up, c(0.5))))),
        c(1),
    )
    return select(binary("and", tie, odd), binary("sub", up, c(1)), up)


def _resize_interpolate(ctx: LowerContext, resized: dict[int, _Axis], mode: str) -> list[Statement]:
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    a = float(ctx.attr("cubic_coeff_a", -0.75))  # type: ignore[arg-type]
    exclude = bool(int(ctx.attr("exclude_outside", 0)))  # type: ignore[arg-type]
    taps: dict[int, list[tuple[Expr, Expr]]] = {}  # axis -> [(index, weight)]
    outside: Expr | None = None
    for axis, spec in resized.items():
        coordinate = spec.coordinate(dims[axis])
        if spec.crop:
            test = spec.outside(coordinate)
            outside = test if outside is None else binary("or", outside, test)
        floor = unary("floor", coordinate)
        ratio = binary("sub", coordinate, floor)
        base = Cast(floor, "int64")
        if mode == "linear":
            offsets = (0, 1)
            weights = [binary("sub", Const(1.0, "float64"), ratio), ratio]
        else:
            offsets = (-1, 0, 1, 2)
            weights = _cubic_weights(ratio, a)
        positions = [binary("add", base, Const(k, "int64")) if k else base for k in offsets]
        if exclude:
            inside = [
                binary(
                    "and",
                    binary("ge", p, Const(0, "int64")),
                    binary("lt", p, Const(spec.size, "int64")),
                )
                for p in positions
            ]
            weights = [
                select(keep, w, Const(0.0, "float64"))
                for keep, w in zip(inside, weights, strict=True)
            ]
            total = weights[0]
            for w in weights[1:]:
                total = binary("add", total, w)
            weights = [binary("div", w, total) for w in weights]
        taps[axis] = [(_clamp(p, spec.size), w) for p, w in zip(positions, weights, strict=True)]
    # separable, first resized axis innermost: Σ_tk w_k (... Σ_t0 w_0 X[p0 + t0, ...])
    order = sorted(taps)

    def combine(level: int, index: list[str | Expr]) -> Expr:
        if level < 0:
            return Cast(ctx.load(ctx.node.inputs[0], index), "float64")
        axis = order[level]
        total: Expr | None = None
        for position, weight in taps[axis]:
            index[axis] = position
            term = binary("mul", weight, combine(level - 1, index))
            total = term if total is None else binary("add", total, term)
        index[axis] = dims[axis]
        assert total is not None
        return total

    value = combine(len(order) - 1, list(dims))
    return [_finish(ctx, value, outside)]


def _finish(ctx: LowerContext, value: Expr, outside: Expr | None) -> Statement:
    """The output statement of a float64 interpolated value: the extrapolation value where
    tf_crop_and_resize leaves the input, integers rounded half to even and saturated."""
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    if outside is not None:
        value = select(outside, Const(_extrapolation(ctx), "float64"), value)
    if np.dtype(out.dtype).kind in "iu":
        info = np.iinfo(out.dtype)
        value = _round_half_even(value)
        value = binary("max", value, Const(float(info.min), "float64"))
        value = binary("min", value, Const(float(info.max), "float64"))
    name = ctx.statement_name()
    domain = ctx.domain(name, dims, out.shape)
    return Statement(name, dims, domain, ctx.output(), dims, Cast(value, out.dtype))


# --- antialias ------------------------------------------------------------------------------


def _linear_antialias(ratio: float, scale: float, a: float) -> np.ndarray:
    """onnx's triangle filter widened by 1 / scale when downsampling, normalized."""
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
    coeffs = np.clip(1 - np.abs(args), 0, 1)
    return coeffs / sum(coeffs)


def _cubic_antialias(ratio: float, scale: float, a: float) -> np.ndarray:
    """onnx's cubic convolution filter (coefficient a) widened by 1 / scale, normalized."""
    scale = min(scale, 1.0)

    def coeff(x: float) -> float:
        x = abs(x)
        x2 = x * x
        x3 = x * x2
        if x <= 1:
            return (a + 2) * x3 - (a + 3) * x2 + 1
        if x < 2:
            return a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
        return 0.0

    start = int(np.floor(-2 / scale) + 1)
    coeffs = [coeff(scale * (i - ratio)) for i in range(start, 2 - start)]
    return np.array(coeffs) / sum(coeffs)


def antialias_taps(
    axis: _Axis, mode: str, a: float, exclude: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(first, weights): the window's first source index per output position (int64,
    before clamping) and its weights (float64, (out, taps)), as onnx's reference computes
    them: the ratio is taken from the pixel left of the coordinate (1 at an integer), the
    window holds the taps nearest the coordinate (ties to the lower index), and
    exclude_outside renormalizes the weights of the taps inside the input."""
    x = axis.coordinates()
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)
    filter_ = _linear_antialias if mode == "linear" else _cubic_antialias
    weights = np.array([filter_(float(r), axis.scale, a) for r in ratios], np.float64)
    weights = weights.reshape(axis.out, -1)
    n = weights.shape[1]
    pad = math.ceil(n / 2)
    padded = x + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    first = (p + offset - pad).astype(np.int64)
    if exclude:
        taps = first[:, None] + np.arange(n)[None, :]
        weights = np.where((taps < 0) | (taps >= axis.size), 0.0, weights)
        total = weights.sum(axis=-1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return first, weights


def _resize_antialias(ctx: LowerContext, resized: dict[int, _Axis], mode: str) -> list[Statement]:
    """One sum reduction per resized axis into a float64 temporary:
    T[.., y, ..] = Σ_k weights[y, k] · S[.., clamp(first[y] + k), ..]."""
    x, out = ctx.input_type(0), ctx.output_type()
    dims = ctx.dims(out.rank)
    a = float(ctx.attr("cubic_coeff_a", -0.75))  # type: ignore[arg-type]
    exclude = bool(int(ctx.attr("exclude_outside", 0)))  # type: ignore[arg-type]
    shape = list(x.shape)
    source: str | None = None  # the previous axis' temporary, X first
    statements: list[Statement] = []
    outside: Expr | None = None
    for axis in sorted(resized):
        spec = resized[axis]
        first, weights = antialias_taps(spec, mode, a, exclude)
        if spec.crop:
            test = spec.outside(spec.coordinate(dims[axis]))
            outside = test if outside is None else binary("or", outside, test)
        starts = ctx.constant_tensor(f"first_{axis}", first)
        table = ctx.constant_tensor(f"weights_{axis}", weights)
        tap = binary("add", ctx.load_temp(starts, (dims[axis],)), Iter("k", "int64"))
        index: list[str | Expr] = list(dims)
        index[axis] = _clamp(tap, spec.size)
        if source is None:
            value: Expr = Cast(ctx.load(ctx.node.inputs[0], index), "float64")
        else:
            value = ctx.load_temp(source, index)
        term = binary("mul", ctx.load_temp(table, (dims[axis], "k")), value)
        shape[axis] = spec.out
        target = ctx.temp(f"axis{axis}", shape, "float64")
        statements += reduction(
            ctx,
            f"{ctx.node.name}_axis{axis}",
            (dims, shape),
            (("k",), (weights.shape[1],)),
            target,
            dims,
            term,
            "sum",
        )
        source = target
    if source is None:  # every axis an identity
        value = Cast(ctx.load(ctx.node.inputs[0], dims), "float64")
    else:
        value = ctx.load_temp(source, dims)
    return [*statements, _finish(ctx, value, outside)]
