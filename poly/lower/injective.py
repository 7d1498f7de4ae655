"""Compute definitions of the injective ops: every output element is one input element (or
a constant) at an index computed from the output's position.

Indices are affine in isl syntax: `floor(e/c)` for a division by a constant and
`e - c*floor(e/c)` for a remainder. Where the index map is piecewise (Pad's border modes,
Resize's clamped nearest neighbours) each piece is a statement over its part of the output
box, so the domains stay exact: no statement instance loads outside its tensor and the
pieces of one output are disjoint and cover it. Concat has one statement per input over
its slab of the output, Split one per output (Gather lives with the indexing ops,
`lower.indexing`). Linear and cubic Resize compute their source coordinates as float64 `Expr`s
exactly as onnx's reference evaluator does and load the clamped neighbours indirectly.

Reshape-like ops (Reshape, Flatten, Squeeze, Unsqueeze) are usually zero-copy aliases (see
the frontend's `mark_views`); when one is lowered (a graph output) it is a copy whose index
relinearizes the row-major position, one group of axes with equal sizes at a time.

The rules (slice bounds, pads, split sizes, ...) are the frontend's, read through its
shape-inference helpers, so lowering and inference cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import product

import numpy as np

from polytile.frontend.ops.tensor import (
    concat_axis,
    pad_plan,
    pad_value,
    slice_plan,
    split_sizes,
    tile_repeats,
    transpose_perm,
)

from ..expr import Cast, Const, Expr, Iter, binary, select, unary
from ..kernel import Statement
from .base import LowerContext, affine_text, lowering, parens

# --- affine text ----------------------------------------------------------------------------


def _floordiv(text: str, divisor: int) -> str:
    """floor(text / divisor) for a positive constant divisor."""
    return text if divisor == 1 else f"floor({parens(text)}/{divisor})"


def _mod(text: str, divisor: int) -> str:
    """text mod divisor (non-negative), without isl's `mod`: `e - c*floor(e/c)`."""
    if divisor == 1:
        return "0"
    return f"{text} - {divisor}*{_floordiv(text, divisor)}"


def _copy(
    ctx: LowerContext,
    index: Sequence[str | Expr],
    output: int = 0,
    where: Sequence[str] = (),
    base: str | None = None,
    source: int = 0,
) -> Statement:
    """output[dims] = input[index] over the output's box (restricted by `where`)."""
    out = ctx.output_type(output)
    dims = ctx.dims(out.rank)
    name = ctx.statement_name(base)
    domain = ctx.domain(name, dims, out.shape, " and ".join(where))
    value = ctx.load(ctx.node.inputs[source], index)
    return Statement(name, dims, domain, ctx.output(output), dims, value)


# --- Identity-like and reshape-like copies ----------------------------------------------------


@lowering("Dropout")
def _dropout(ctx: LowerContext) -> list[Statement]:
    """Inference Dropout (the frontend rejects a random training mode): a copy, and an
    all-true mask when it is requested."""
    rank = ctx.output_type().rank
    statements = [_copy(ctx, ctx.dims(rank))]
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        mask = ctx.output_type(1)
        dims = ctx.dims(mask.rank)
        name = ctx.statement_name(f"{ctx.node.name}_mask")
        statements.append(
            Statement(
                name,
                dims,
                ctx.domain(name, dims, mask.shape),
                ctx.output(1),
                dims,
                ctx.const(True, "bool"),
            )
        )
    return statements


def reshape_index(
    source: Sequence[int], target: Sequence[int], target_dims: Sequence[str]
) -> list[str]:
    """Index into a row-major tensor of shape `source` of the element at `target_dims` of
    its reshape to `target`. Axes are matched in groups with equal products (size-1 axes
    index 0), so a squeeze is an identity and only merged / split axes need division."""
    index = ["0"] * len(source)
    if math.prod(source) == 0:
        return index
    src = [a for a, n in enumerate(source) if n != 1]
    dst = [a for a, n in enumerate(target) if n != 1]
    i = j = 0
    while i < len(src):
        group_src, group_dst = [src[i]], [dst[j]]
        size_src, size_dst = source[src[i]], target[dst[j]]
        i, j = i + 1, j + 1
        while size_src != size_dst:
            if size_src < size_dst:
                group_src.append(src[i])
                size_src *= source[src[i]]
                i += 1
            else:
                group_dst.append(dst[j])
                size_dst *= target[dst[j]]
                j += 1
        terms, stride = [], 1
        for axis in reversed(group_dst):
            terms.append((stride, target_dims[axis]))
            stride *= target[axis]
        linear = affine_text(list(reversed(terms)))
        stride = size_src
        for position, axis in enumerate(group_src):
            stride //= source[axis]
            if position == 0:
                index[axis] = _floordiv(linear, stride)
            elif stride == 1:
                index[axis] = _mod(linear, source[axis])
            else:
                # floor(L / s) mod n = floor(L / s) - n * floor(L / (s * n))
                outer = _floordiv(linear, stride * source[axis])
                index[axis] = f"{_floordiv(linear, stride)} - {source[axis]}*{outer}"
    return index


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx: LowerContext) -> list[Statement]:
    """A copy to a new shape of the same row-major buffer (when not aliased)."""
    out = ctx.output_type()
    index = reshape_index(ctx.input_type(0).shape, out.shape, ctx.dims(out.rank))
    return [_copy(ctx, index)]


# --- data movement ----------------------------------------------------------------------------


@lowering("Transpose")
def _transpose(ctx: LowerContext) -> list[Statement]:
    """Y[i0, ..] = X[...] with input axis perm[a] indexed by output dim a."""
    perm = transpose_perm(ctx.infer_context())
    dims = ctx.dims(len(perm))
    index = [""] * len(perm)
    for a, p in enumerate(perm):
        index[p] = dims[a]
    return [_copy(ctx, index)]


@lowering("Concat")
def _concat(ctx: LowerContext) -> list[Statement]:
    """One statement per (non-empty) input over its slab `offset <= i_axis < offset + n`
    of the output, reading the input at `i_axis - offset`."""
    axis = concat_axis(ctx.infer_context())
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    statements, offset = [], 0
    for source, name in enumerate(ctx.node.inputs):
        size = ctx.type(name).shape[axis]
        if size == 0:
            continue
        index = list(dims)
        index[axis] = affine_text([(1, dims[axis])], -offset)
        where = [f"{dims[axis]} >= {offset}"] if offset else []
        if offset + size < out.shape[axis]:
            where.append(f"{dims[axis]} < {offset + size}")
        statements.append(
            _copy(ctx, index, where=where, base=f"{ctx.node.name}_{source}", source=source)
        )
        offset += size
    return statements


@lowering("Split")
def _split(ctx: LowerContext) -> list[Statement]:
    """One statement per output: Y_k[..., i, ...] = X[..., i + offset_k, ...]."""
    axis, sizes = split_sizes(ctx.infer_context())
    statements, offset = [], 0
    for k, size in enumerate(sizes):
        if ctx.node.outputs[k]:
            dims = ctx.dims(ctx.output_type(k).rank)
            index = list(dims)
            index[axis] = affine_text([(1, dims[axis])], offset)
            statements.append(_copy(ctx, index, output=k, base=f"{ctx.node.name}_{k}"))
        offset += size
    return statements


@lowering("Slice")
def _slice(ctx: LowerContext) -> list[Statement]:
    """Y[i] = X[start + step * i] on the sliced axes (negative steps included; the
    frontend clamps start and end as numpy does)."""
    _, plan = slice_plan(ctx.infer_context())
    dims = ctx.dims(ctx.output_type().rank)
    index = []
    for dim, part in zip(dims, plan, strict=True):
        start = part.start or 0
        step = part.step or 1
        index.append(affine_text([(step, dim)], start))
    return [_copy(ctx, index)]


@lowering("Expand")
def _expand(ctx: LowerContext) -> list[Statement]:
    """numpy broadcasting of X onto the target shape."""
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    name = ctx.statement_name()
    value = ctx.broadcast_load(ctx.node.inputs[0], dims, out.shape)
    return [Statement(name, dims, ctx.domain(name, dims, out.shape), ctx.output(), dims, value)]


@lowering("Tile")
def _tile(ctx: LowerContext) -> list[Statement]:
    """Y[i] = X[i mod n] on every repeated axis."""
    repeats = tile_repeats(ctx.infer_context())
    shape = ctx.input_type(0).shape
    dims = ctx.dims(len(shape))
    index = []
    for dim, size, repeat in zip(dims, shape, repeats, strict=True):
        if repeat == 1:
            index.append(dim)
        elif size == 1:
            index.append("0")
        else:
            index.append(_mod(dim, size))
    return [_copy(ctx, index)]


# --- Pad --------------------------------------------------------------------------------------

#: one piece of a piecewise index map along one axis: domain constraints and the index
Piece = tuple[tuple[str, ...], str]


def _pad_pieces(mode: str, dim: str, size: int, begin: int, end: int) -> list[Piece]:
    """The index map of one axis of a reflect / edge / wrap Pad, as pieces over the output
    positions `dim`. A negative pad crops first (as the frontend's evaluation does)."""
    low, crop = max(begin, 0), max(-begin, 0)
    inner = size - crop - max(-end, 0)  # the cropped input length (> 0 for these modes)
    high = max(end, 0)
    mid = affine_text([(1, dim)], crop - low)
    if low == 0 and high == 0:
        return [((), mid)]
    below, above = f"{dim} < {low}", f"{dim} >= {low + inner}"
    inside = tuple(
        c for c, on in ((f"{dim} >= {low}", low), (f"{dim} < {low + inner}", high)) if on
    )
    if inner == 1:
        return [((), str(crop))]
    if mode == "edge":
        pieces = [(inside, mid)]
        if low:
            pieces.append(((below,), str(crop)))
        if high:
            pieces.append(((above,), str(crop + inner - 1)))
        return pieces
    if mode == "wrap":
        if low <= inner and high <= inner:
            pieces = [(inside, mid)]
            if low:
                pieces.append(((below,), affine_text([(1, dim)], crop - low + inner)))
            if high:
                pieces.append(((above,), affine_text([(1, dim)], crop - low - inner)))
            return pieces
        # positions further than one period away: (dim - low) mod inner
        shifted = affine_text([(1, dim)], inner * math.ceil(low / inner) - low)
        return [
            ((), affine_text([(1, _mod(shifted, inner))], crop) if crop else _mod(shifted, inner))
        ]
    # reflect (without repeating the edge element); the period is 2 * (inner - 1)
    if low <= inner - 1 and high <= inner - 1:
        pieces = [(inside, mid)]
        if low:
            pieces.append(((below,), affine_text([(-1, dim)], crop + low)))
        if high:
            pieces.append(((above,), affine_text([(-1, dim)], crop + low + 2 * inner - 2)))
        return pieces
    period = 2 * (inner - 1)
    shifted = affine_text([(1, dim)], period * math.ceil(low / period) - low)
    phase = _mod(shifted, period)
    forward = affine_text([(1, parens(phase))], crop)
    backward = affine_text([(-1, parens(phase))], crop + period)
    return [((f"{phase} <= {inner - 1}",), forward), ((f"{phase} >= {inner}",), backward)]


@lowering("Pad")
def _pad(ctx: LowerContext) -> list[Statement]:
    """Constant mode: an interior copy Y[i] = X[i - begin] and a border statement over the
    box minus the interior (a union) writing the pad value. Reflect / edge / wrap: one
    copy statement per combination of the padded axes' index pieces."""
    ictx = ctx.infer_context()
    mode, widths = pad_plan(ictx)
    x, out = ctx.input_type(0), ctx.output_type()
    dims = ctx.dims(out.rank)
    if mode == "constant":
        return _pad_constant(ctx, widths, pad_value(ictx))
    axes = [
        _pad_pieces(mode, dims[a], x.shape[a], *widths[a])
        if widths[a] != (0, 0)
        else [((), dims[a])]
        for a in range(x.rank)
    ]
    statements = []
    for n, combination in enumerate(product(*axes)):
        where = [c for constraints, _ in combination for c in constraints]
        index = [index for _, index in combination]
        base = ctx.node.name if len(statements) == 0 else f"{ctx.node.name}_{n}"
        statements.append(_copy(ctx, index, where=where, base=base))
    return statements


def _pad_constant(
    ctx: LowerContext, widths: Sequence[tuple[int, int]], value: np.ndarray
) -> list[Statement]:
    x, out = ctx.input_type(0), ctx.output_type()
    dims = ctx.dims(out.rank)
    inside, border, empty = [], [], False
    for a, (begin, end) in enumerate(widths):
        low, inner = max(begin, 0), x.shape[a] - max(-begin, 0) - max(-end, 0)
        empty = empty or inner <= 0 or out.shape[a] == 0
        if begin > 0:
            inside.append(f"{dims[a]} >= {low}")
            border.append(f"{dims[a]} < {low}")
        if end > 0:
            inside.append(f"{dims[a]} < {low + inner}")
            border.append(f"{dims[a]} >= {low + inner}")
    statements = []
    if not empty:
        index = [affine_text([(1, d)], -begin) for d, (begin, _) in zip(dims, widths, strict=True)]
        statements.append(_copy(ctx, index, where=inside, base=f"{ctx.node.name}_interior"))
    if empty or border:
        name = ctx.statement_name(f"{ctx.node.name}_border")
        where = "" if empty else " or ".join(border)
        fill = ctx.const(value.item(), out.dtype)
        domain = ctx.domain(name, dims, out.shape, where)
        statements.append(Statement(name, dims, domain, ctx.output(), dims, fill))
    return statements


# --- Resize -----------------------------------------------------------------------------------

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
        resized[a] = _coordinate_map(coordinates, scale, size, length, start, stop)
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
                    pieces.append((where, _floordiv(affine_text([(a, dim)], b), d)))
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
    if int(ctx.attr("antialias", 0)):  # type: ignore[arg-type]
        raise ctx.unsupported("antialias=1 is not supported")
    mode = str(ctx.attr("mode", "nearest"))
    resized = _resize_axes(ctx)
    if mode == "nearest":
        return _resize_nearest(ctx, resized)
    if mode in ("linear", "cubic"):
        return _resize_interpolate(ctx, resized, mode)
    raise ctx.unsupported(f"mode '{mode}'")


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
        statements.append(_copy(ctx, index, where=where, base=base))
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
    if outside is not None:
        value = select(outside, Const(_extrapolation(ctx), "float64"), value)
    if np.dtype(out.dtype).kind in "iu":
        info = np.iinfo(out.dtype)
        value = _round_half_even(value)
        value = binary("max", value, Const(float(info.min), "float64"))
        value = binary("min", value, Const(float(info.max), "float64"))
    name = ctx.statement_name()
    domain = ctx.domain(name, dims, out.shape)
    return [Statement(name, dims, domain, ctx.output(), dims, Cast(value, out.dtype))]
