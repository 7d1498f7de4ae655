"""The axis model of Resize: how each resized axis maps output positions to source
coordinates (the operations of onnx's reference evaluator, in its order, in float64),
and the affine forms of their rounding that keep source indices quasi-affine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from polytile.poly.ir.expr import Cast, Const, Expr, Iter, binary, select, unary
from polytile.poly.lower.base import LowerContext

#: an affine float64 step of a source coordinate: ('add' | 'sub' | 'mul' | 'div', constant)
Step = tuple[str, float]


@dataclass(frozen=True)
class Axis:
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


def resize_axes(ctx: LowerContext) -> dict[int, Axis]:
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
        axis = coordinate_map(coordinates, scale, size, length, start, stop)
        resized[a] = replace(axis, scale=scale)
    return resized


def coordinate_map(
    mode: str, scale: float, size: int, length: int, start: object, stop: object
) -> Axis:
    width = scale * size  # the reference's (float) output width
    half = (("add", 0.5), ("div", scale), ("sub", 0.5))
    if mode == "align_corners":
        if width == 1:
            return Axis(size, length, (), constant=0.0)
        return Axis(size, length, (("mul", size - 1), ("div", width - 1)))
    if mode == "asymmetric":
        return Axis(size, length, (("div", scale),))
    if mode == "pytorch_half_pixel":
        if width == 1:
            return Axis(size, length, (), constant=-0.5)
        return Axis(size, length, half)
    if mode == "half_pixel":
        return Axis(size, length, half)
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - length / width)
        steps = (("add", 0.5), ("div", scale), ("add", offset), ("sub", 0.5))
        return Axis(size, length, steps)
    # tf_crop_and_resize; the roi arithmetic happens in the roi's own dtype, as in onnx
    shift = float(start * (size - 1))  # type: ignore[operator]
    if width == 1:
        centre = np.float64((stop - start) * (size - 1) / 2)  # type: ignore[operator]
        return Axis(size, length, (), constant=float(centre + shift), crop=True)
    steps = (("mul", float(stop - start)), ("mul", size - 1), ("div", width - 1), ("add", shift))  # type: ignore[operator]
    return Axis(size, length, steps, crop=True)


# nearest: source index = clamp(round(coordinate), 0, size - 1) with the mode's rounding

ROUNDING = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def round_coordinates(coordinates: np.ndarray, rounding: str) -> np.ndarray:
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


def round_expr(coordinate: Expr, rounding: str) -> Expr:
    floor = unary("floor", coordinate)
    frac = binary("sub", coordinate, floor)
    index: Expr = Cast(floor, "int64")
    threshold = {"round_prefer_floor": ("gt", 0.5), "round_prefer_ceil": ("ge", 0.5)}
    if rounding == "floor":
        return index
    op, edge = threshold.get(rounding, ("gt", 0.0))
    one, zero = Const(1, "int64"), Const(0, "int64")
    return binary("add", index, select(binary(op, frac, Const(edge, "float64")), one, zero))


def clamp_index(index: Expr, size: int) -> Expr:
    index = binary("max", index, Const(0, "int64"))
    return binary("min", index, Const(size - 1, "int64"))


def fractions(value: float, limit: int | None) -> Fraction:
    exact = Fraction(value)
    return exact if limit is None else exact.limit_denominator(limit)


def affine_rounding(axis: Axis, rounding: str, limit: int | None) -> tuple[int, int, int]:
    """(A, B, D) with round(coordinate(y)) = floor((A*y + B) / D), the float constants of
    the coordinate map read as fractions of denominator at most `limit`."""
    if axis.constant is not None:
        a, b = Fraction(0), fractions(axis.constant, limit)
    else:
        a, b = Fraction(1), Fraction(0)
        for op, c in axis.steps:
            f = fractions(c, limit)
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


def runs(keys: Sequence[str]) -> list[tuple[str, int, int]]:
    """Maximal runs of equal keys: (key, start, stop)."""
    runs: list[tuple[str, int, int]] = []
    for y, key in enumerate(keys):
        if runs and runs[-1][0] == key:
            runs[-1] = (key, runs[-1][1], y + 1)
        else:
            runs.append((key, y, y + 1))
    return runs


def interval(dim: str, start: int, stop: int, length: int) -> tuple[str, ...]:
    where = []
    if start > 0:
        where.append(f"{dim} >= {start}")
    if stop < length:
        where.append(f"{dim} < {stop}")
    return tuple(where)
