"""Compute definition of Resize, as onnx's reference evaluator computes it (separable,
float64 source coordinates in the reference's order of operations; the axis model is
`poly.lower.resize_axes`).

nearest: a gather with a piecewise affine index per axis (clamped ends and the
extrapolated borders of tf_crop_and_resize are pieces of their own), so the domains stay
exact; linear: one float64 pass per resized axis, the innermost first, with affine
source indices per piece (`_resize_linear_separable`), where they reproduce the
reference's picks; otherwise (cubic, exclude_outside, integer outputs) a weighted sum of
the 2 / 4 clamped neighbours per axis, loaded indirectly. With antialias=1 (linear /
cubic) a downsampled axis filters over a window widened by 1 / scale: its weights depend
on the output position only, so they are computed at compile time (as onnx's reference
does) into a constant (out, taps) table, with the window's first source index per output
position, and each resized axis is a sum reduction over its taps into a float64
temporary (the first resized axis first, as the reference), loading the clamped
neighbours indirectly.
"""

from __future__ import annotations

import math
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
from polytile.poly.lower.resize_axes import (
    ROUNDING,
    Axis,
    affine_rounding,
    clamp_index,
    interval,
    resize_axes,
    round_coordinates,
    round_expr,
    runs,
)


def _affine_pick(axis: Axis, rounding: str, dim: str, picks: np.ndarray, start: int) -> str | None:
    """An affine floor formula of `dim` giving the reference's integer `picks` of the
    output positions from `start` on (the coordinate map's constants read as fractions
    of growing denominators), or None when none does."""
    y = np.arange(start, start + len(picks), dtype=object)
    for limit in (16, 256, 4096, 1 << 20, None):
        a, b, d = affine_rounding(axis, rounding, limit)
        if np.array_equal((a * y + b) // d, picks):
            return floordiv_text(affine_text([(a, dim)], b), d)
    return None


def _nearest_pieces(
    axis: Axis, dim: str, rounding: str
) -> tuple[list[tuple[tuple[str, ...], str | Expr]], list[tuple[str, ...]]]:
    """The pieces of one axis of a nearest Resize: (constraints, source index) with an
    affine index where a formula reproduces the reference's float picks (an indirect float
    computation otherwise), and the extrapolated intervals of tf_crop_and_resize."""
    coords = axis.coordinates()
    raw = round_coordinates(coords, rounding)
    outside = (coords < 0) | (coords > axis.size - 1) if axis.crop else np.zeros(axis.out, bool)
    keys = [
        "ext" if o else "low" if r < 0 else "high" if r > axis.size - 1 else "mid"
        for o, r in zip(outside, raw, strict=True)
    ]
    pieces: list[tuple[tuple[str, ...], str | Expr]] = []
    extrapolated = []
    for key, start, stop in runs(keys):
        where = interval(dim, start, stop, axis.out)
        if key == "ext":
            extrapolated.append(where)
        elif key == "low":
            pieces.append((where, "0"))
        elif key == "high":
            pieces.append((where, str(axis.size - 1)))
        elif len(set(raw[start:stop].tolist())) == 1:
            pieces.append((where, str(int(raw[start]))))
        else:
            found = _affine_pick(axis, rounding, dim, raw[start:stop], start)
            if found is None:
                found = clamp_index(round_expr(axis.coordinate(dim), rounding), axis.size)
            pieces.append((where, found))
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
    resized = resize_axes(ctx)
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


def _linear_pieces(axis: Axis, dim: str) -> list[tuple[tuple[str, ...], str, str]] | None:
    """The pieces of one axis of a linear Resize: (constraints, left and right source
    index), affine where a formula reproduces the reference's float floor of the
    coordinate; the clamped ends are pieces of their own. None when no formula does."""
    raw = np.floor(axis.coordinates())
    keys = ["low" if r < 0 else "high" if r >= axis.size - 1 else "mid" for r in raw]
    pieces: list[tuple[tuple[str, ...], str, str]] = []
    for key, start, stop in runs(keys):
        where = interval(dim, start, stop, axis.out)
        if key != "mid":
            edge = "0" if key == "low" else str(axis.size - 1)
            pieces.append((where, edge, edge))
            continue
        left = _affine_pick(axis, "floor", dim, raw[start:stop].astype(int), start)
        if left is None:
            return None
        pieces.append((where, left, f"{parens(left)} + 1"))
    return pieces


def _resize_linear_separable(ctx: LowerContext, resized: dict[int, Axis]) -> list[Statement] | None:
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


def _resize_nearest(ctx: LowerContext, resized: dict[int, Axis]) -> list[Statement]:
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


def _resize_interpolate(ctx: LowerContext, resized: dict[int, Axis], mode: str) -> list[Statement]:
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
        taps[axis] = [
            (clamp_index(p, spec.size), w) for p, w in zip(positions, weights, strict=True)
        ]
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


def antialias_taps(axis: Axis, mode: str, a: float, exclude: bool) -> tuple[np.ndarray, np.ndarray]:
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


def _resize_antialias(ctx: LowerContext, resized: dict[int, Axis], mode: str) -> list[Statement]:
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
        index[axis] = clamp_index(tap, spec.size)
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
