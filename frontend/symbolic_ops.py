"""Symbolic shape rules: the ops whose output shape reads a value that may be symbolic
(Reshape, Expand, ConstantOfShape, Range, Slice, Tile), and the folding of shape values
(Shape → Gather → Unsqueeze → Concat, arithmetic, comparisons, Where, ...) into vectors of
`Dim`s.

Every other op keeps its registry inference (`frontend/ops`), which works unchanged on
symbolic dims through `Dim`'s arithmetic; these rules exist only where the registry's
rule converts a value to ints. A symbolic value is a numpy object array of ints and
`Dim`s; a value with no `Dim` left is an ordinary int64 / bool array.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polytile.errors import SymbolicShapeError

from .graph import TensorType
from .ops import OPS, InferContext, broadcast_shapes
from .ops.reduce import reduced_axes
from .ops.tensor import _shape_slice
from .symbolic import MAX_DIM, Dim, DimLike, is_static

__all__ = ["TYPE_RULES", "VALUE_RULES", "SymbolicContext", "has_dim", "settle"]


class SymbolicContext(InferContext):
    """An InferContext whose `values` hold only numeric arrays (what the registry's rules
    expect); `full` adds the symbolic ones, read through `dims` and `full_value`."""

    def __init__(self, base: InferContext, full: Sequence[np.ndarray | None]) -> None:
        super().__init__(base.node, base.input_types, base.values, base.opset, base.model)
        self.full = tuple(full)

    def full_value(self, index: int) -> np.ndarray | None:
        return self.full[index] if self.has_input(index) else None

    def dims(self, index: int, what: str) -> tuple[DimLike, ...]:
        """A 1-D integer input (a shape, starts, ...) whose entries may be symbolic."""
        if not self.has_input(index):
            raise self.error(f"input {index} (the {what}) is required but missing")
        value = self.full_value(index)
        if value is None:
            raise self.error(
                f"input {index} ('{self.node.inputs[index]}', the {what}) is neither a "
                f"constant nor computed from input shapes"
            )
        if value.ndim > 1:
            raise self.error(f"the {what} must be a 1-D tensor, got shape {list(value.shape)}")
        if value.dtype != object and value.dtype.kind not in "iu":
            raise self.error(f"the {what} must be an integer tensor, got {value.dtype}")
        return tuple(v if isinstance(v, Dim) else int(v) for v in value.reshape(-1))

    def with_values(self, values: dict[int, np.ndarray | None]) -> SymbolicContext:
        """The context with some inputs' values replaced (placeholders for the registry's
        checks of attributes and dtypes)."""
        merged = [values.get(i, v) for i, v in enumerate(self.values)]
        base = InferContext(self.node, self.input_types, merged, self.opset, self.model)
        return SymbolicContext(base, self.full)

    def with_types(self, types: dict[int, TensorType]) -> SymbolicContext:
        """The context with some inputs' types replaced (static placeholders)."""
        merged = [types.get(i, t) for i, t in enumerate(self.input_types)]
        base = InferContext(self.node, merged, self.values, self.opset, self.model)
        return SymbolicContext(base, self.full)


def has_dim(values: object) -> bool:
    """Whether a shape, a value array or a sequence holds any symbolic dim."""
    if isinstance(values, Dim):
        return True
    if isinstance(values, np.ndarray):
        return values.dtype == object and any(isinstance(v, Dim) for v in values.flat)
    if isinstance(values, tuple | list):
        return any(isinstance(v, Dim) for v in values)
    return False


def settle(value: np.ndarray, dtype: str) -> np.ndarray:
    """An object array with no Dim left becomes an ordinary array of `dtype`."""
    if value.dtype == object and not has_dim(value):
        return np.asarray(value.tolist(), dtype=dtype).reshape(value.shape)
    return value


def _objects(value: np.ndarray) -> np.ndarray:
    """Python ints (not numpy scalars) and Dims, so arithmetic stays exact."""
    if value.dtype == object:
        return value
    if value.dtype.kind not in "iub":
        raise SymbolicShapeError("a symbolic value meets a float tensor")
    return value.astype(object)


# --- output types ----------------------------------------------------------------------

TypeRule = Callable[[SymbolicContext], tuple[TensorType, ...]]
TYPE_RULES: dict[str, TypeRule] = {}


def _type_rule(op_type: str) -> Callable[[TypeRule], TypeRule]:
    def wrap(fn: TypeRule) -> TypeRule:
        TYPE_RULES[op_type] = fn
        return fn

    return wrap


def _non_negative(ctx: SymbolicContext, dims: Sequence[DimLike], what: str) -> None:
    if any(d < 0 for d in dims):
        raise ctx.error(f"{what} {list(dims)} has a negative dimension")


@_type_rule("Reshape")
def _reshape(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    in_shape = ctx.shape(0)
    spec = ctx.dims(1, "target shape")
    allowzero = ctx.attr_int("allowzero", 0)
    minus = [i for i, d in enumerate(spec) if is_static(d) and d == -1]
    if len(minus) > 1:
        raise ctx.error(f"target shape {list(spec)} has more than one -1")
    out: list[DimLike] = []
    for index, dim in enumerate(spec):
        if index not in minus and dim < 0:
            raise ctx.error(f"target shape {list(spec)} has the invalid entry {dim}")
        if isinstance(dim, Dim) and not allowzero and dim == 0:  # 0 would copy a dim
            raise ctx.error(f"target shape {list(spec)} has the entry {dim} = 0")
        if is_static(dim) and dim == 0 and not allowzero:
            if index >= len(in_shape):
                raise ctx.error(
                    f"target shape {list(spec)} copies dimension {index} (0 entry), but the "
                    f"input {list(in_shape)} has rank {len(in_shape)}"
                )
            dim = in_shape[index]
        out.append(dim)
    total = math.prod(in_shape)
    if minus:
        known = math.prod(d for i, d in enumerate(out) if i != minus[0])
        if known == 0 or (isinstance(known, int) and total % known):
            raise ctx.error(f"cannot reshape {list(in_shape)} to {list(spec)}")
        out[minus[0]] = total // known
    if math.prod(out) != total:
        raise ctx.error(f"cannot reshape {list(in_shape)} ({total} elements) to {list(spec)}")
    return (TensorType(tuple(out), ctx.dtype(0)),)


@_type_rule("Expand")
def _expand(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    target = ctx.dims(1, "target shape")
    _non_negative(ctx, target, "target shape")
    return (TensorType(broadcast_shapes(ctx, ctx.shape(0), target), ctx.dtype(0)),)


@_type_rule("ConstantOfShape")
def _constant_of_shape(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    shape = ctx.dims(0, "output shape")
    _non_negative(ctx, shape, "output shape")
    placeholder = np.ones(len(shape), dtype=np.int64)  # the fill value's checks and dtype
    (static,) = OPS["ConstantOfShape"].infer(ctx.with_values({0: placeholder}))
    return (TensorType(shape, static.dtype),)


@_type_rule("Tile")
def _tile(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    repeats = ctx.dims(1, "repeats")
    shape = ctx.shape(0)
    if len(repeats) != len(shape):
        raise ctx.error(f"repeats {list(repeats)} must be {len(shape)} non-negative counts")
    _non_negative(ctx, repeats, "repeats")
    return (TensorType(tuple(d * r for d, r in zip(shape, repeats, strict=True)), ctx.dtype(0)),)


def _scalar_dim(ctx: SymbolicContext, index: int, what: str) -> DimLike:
    value = ctx.full_value(index)
    if value is None or value.size != 1:
        raise ctx.error(f"the {what} must be one known value")
    (dim,) = ctx.dims(index, what) if value.ndim else (value.reshape(-1)[0],)
    return dim if isinstance(dim, Dim) else int(dim)


RANGE_ARGS = ("start", "limit", "delta")


@_type_rule("Range")
def _range(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    start, limit, delta = (_scalar_dim(ctx, i, n) for i, n in enumerate(RANGE_ARGS))
    if not isinstance(delta, int):
        raise SymbolicShapeError(f"the delta {delta} of a Range must be static", ())
    if delta == 0:
        raise ctx.error("delta is 0")
    span = limit - start if delta > 0 else start - limit
    length = (span + abs(delta) - 1) // abs(delta)
    return (TensorType((max(length, 0),), ctx.dtype(0)),)


def _clamp(index: DimLike, dim: DimLike, lo: DimLike, hi: DimLike) -> DimLike:
    """A Slice bound made non-negative and clamped to [lo, hi]. A static bound beyond
    MAX_DIM either way (exporters write INT64_MAX for "to the end") is past every axis
    polytile handles, whose sizes are at most MAX_DIM: it clamps without comparing."""
    if is_static(index) and abs(index) >= MAX_DIM:
        return hi if index > 0 else lo
    index = index + dim if index < 0 else index
    return min(max(index, lo), hi)


def slice_plan(ctx: SymbolicContext) -> tuple[tuple[DimLike, ...], tuple[slice, ...] | None]:
    """Output shape of a Slice with symbolic bounds or dims, and the numpy index when
    every bound is static (for folding values)."""
    shape = ctx.shape(0)
    rank = len(shape)
    starts, ends = ctx.dims(1, "starts"), ctx.dims(2, "ends")
    axes = ctx.dims(3, "axes") if ctx.has_input(3) else tuple(range(len(starts)))
    steps = ctx.dims(4, "steps") if ctx.has_input(4) else (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps have different lengths")
    if not all(is_static(v) for v in (*axes, *steps)):
        raise SymbolicShapeError("the axes and steps of a Slice must be static", ())
    axes = tuple(ctx.axis(int(a), rank, "axes entry") for a in axes)
    out = list(shape)
    index: list[slice] | None = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[axis]
        if step == 0:
            raise ctx.error(f"step for axis {axis} is 0")
        if step > 0:
            start, end = _clamp(start, dim, 0, dim), _clamp(end, dim, 0, dim)
            out[axis] = max(0, -(-(end - start) // step))
        else:
            start, end = _clamp(start, dim, 0, dim - 1), _clamp(end, dim, -1, dim - 1)
            out[axis] = max(0, -(-(start - end) // -step))
        if index is not None and is_static(start) and is_static(end):
            index[axis] = slice(start, end if end >= 0 else None, step)
        else:
            index = None
    return tuple(out), None if index is None else tuple(index)


@_type_rule("Slice")
def _slice(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    return (TensorType(slice_plan(ctx)[0], ctx.dtype(0)),)


@_type_rule("Gather")
def _gather(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    """The registry's rule, but constant indices into a symbolic axis are checked by
    decided comparisons (-n <= i < n for every n in bounds)."""
    shape = ctx.shape(0)
    axis = ctx.axis(ctx.attr_int("axis", 0), len(shape)) if shape else 0
    if not shape or is_static(shape[axis]):
        return OPS["Gather"].infer(ctx)
    size = shape[axis]
    indices = ctx.value(1)
    for index in () if indices is None else np.asarray(indices).reshape(-1).tolist():
        if not -size <= index < size:
            raise ctx.error(f"index {index} is out of range for axis {axis} of size {size}")
    placeholder = np.zeros(np.shape(indices), dtype=np.int64) if indices is not None else None
    static = ctx.with_types({0: TensorType((*shape[:axis], 1, *shape[axis + 1 :]), ctx.dtype(0))})
    (out,) = OPS["Gather"].infer(static.with_values({1: placeholder}))
    return (TensorType(shape[:axis] + ctx.shape(1) + shape[axis + 1 :], out.dtype),)


@_type_rule("Resize")
def _resize(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    """Symbolic sizes (input 3) or integer scales of a symbolic axis; the attributes are
    checked by the registry's rule on placeholder values."""
    shape = ctx.shape(0)
    axes = ctx.attr_ints("axes")
    axes = tuple(a % len(shape) for a in axes) if axes is not None else tuple(range(len(shape)))
    out = list(shape)
    if ctx.has_input(3) and ctx.full_value(3) is not None and ctx.full_value(3).size:
        sizes = ctx.dims(3, "sizes")
        if ctx.attr_str("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise SymbolicShapeError("a Resize keeping its aspect ratio needs static sizes")
        _non_negative(ctx, sizes, "sizes")
        placeholder = np.ones(len(sizes), dtype=np.int64)
        static = ctx.with_types({0: TensorType((1,) * len(shape), ctx.dtype(0))})
        OPS["Resize"].infer(static.with_values({3: placeholder}))
        for axis, size in zip(axes, sizes, strict=True):
            out[axis] = size
        return (TensorType(tuple(out), ctx.dtype(0)),)
    scales = ctx.value(2)
    static = ctx.with_types({0: TensorType((1,) * len(shape), ctx.dtype(0))})
    OPS["Resize"].infer(static)
    for axis, scale in zip(axes, np.asarray(scales).reshape(-1).tolist(), strict=True):
        dim = shape[axis]
        if not isinstance(dim, Dim):
            out[axis] = math.floor(float(scale) * dim)
        elif float(scale).is_integer():
            out[axis] = dim * int(scale)
        else:
            raise SymbolicShapeError(f"a scale {scale} of the symbolic size {dim} is not exact")
    return (TensorType(tuple(out), ctx.dtype(0)),)


@_type_rule("Pad")
def _pad(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    """Symbolic pads (padding up to a multiple of a window: (w - seq % w) % w)."""
    shape = ctx.shape(0)
    pads = ctx.dims(1, "pads")
    rank = len(shape)
    static = ctx.with_types({0: TensorType((1,) * rank, ctx.dtype(0))})
    OPS["Pad"].infer(static.with_values({1: np.zeros(len(pads), dtype=np.int64)}))
    axes = ctx.const_ints(3, "axes") if ctx.has_input(3) else tuple(range(rank))
    axes = tuple(a % rank for a in axes)
    out = list(shape)
    for i, axis in enumerate(axes):
        out[axis] = shape[axis] + pads[i] + pads[len(axes) + i]
        if out[axis] < 0:
            raise ctx.error(f"pads {list(pads)} crop axis {axis} of size {shape[axis]} below 0")
    return (TensorType(tuple(out), ctx.dtype(0)),)


@_type_rule("Trilu")
def _trilu(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    """Its shape is its input's whatever k is; a symbolic k is read at run time."""
    if ctx.full_value(1) is not None and ctx.value(1) is None:
        ctx = ctx.with_values({1: np.zeros((), dtype=np.int64)})
    return OPS["Trilu"].infer(ctx)


def _symbolic(ctx: SymbolicContext, index: int) -> bool:
    value = ctx.full_value(index)
    return value is not None and value.dtype == object


@_type_rule("TopK")
def _topk(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    """A symbolic k (the whole axis, k = seq); a static k keeps the registry's rule."""
    if not _symbolic(ctx, 1):
        return OPS["TopK"].infer(ctx)
    shape = ctx.shape(0)
    axis = ctx.axis(ctx.attr_int("axis", -1), len(shape)) if shape else 0
    k = _scalar_dim(ctx, 1, "k")
    if not 0 <= k <= shape[axis]:
        raise ctx.error(f"k = {k} is out of range for axis {axis} of size {shape[axis]}")
    static = ctx.with_types({0: TensorType((1,) * len(shape), ctx.dtype(0))})
    values, indices = OPS["TopK"].infer(static.with_values({1: np.ones(1, dtype=np.int64)}))
    out = (*shape[:axis], k, *shape[axis + 1 :])
    return TensorType(out, values.dtype), TensorType(out, indices.dtype)


@_type_rule("Split")
def _split(ctx: SymbolicContext) -> tuple[TensorType, ...]:
    """Symbolic split sizes; static ones (or equal parts) keep the registry's rule."""
    if not _symbolic(ctx, 1):
        return OPS["Split"].infer(ctx)
    shape = ctx.shape(0)
    axis = ctx.axis(ctx.attr_int("axis", 0), len(shape))
    sizes = ctx.dims(1, "split sizes")
    parts = len(ctx.node.outputs)
    if len(sizes) != parts or any(s < 0 for s in sizes) or sum(sizes) != shape[axis]:
        raise ctx.error(
            f"split sizes {list(sizes)} are not {parts} non-negative sizes summing to "
            f"{shape[axis]} (axis {axis} of shape {list(shape)})"
        )
    placeholder = tuple(parts if a == axis else 1 for a in range(len(shape)))
    static = ctx.with_types({0: TensorType(placeholder, ctx.dtype(0))})
    OPS["Split"].infer(static.with_values({1: np.ones(parts, dtype=np.int64)}))
    return tuple(
        TensorType((*shape[:axis], size, *shape[axis + 1 :]), ctx.dtype(0)) for size in sizes
    )


# --- values ------------------------------------------------------------------------------

#: (context, input values, output types) -> output values (object arrays allowed)
ValueRule = Callable[[SymbolicContext, list[np.ndarray], tuple[TensorType, ...]], tuple]
VALUE_RULES: dict[str, ValueRule] = {}


def _value_rule(*op_types: str) -> Callable[[ValueRule], ValueRule]:
    def wrap(fn: ValueRule) -> ValueRule:
        for op_type in op_types:
            VALUE_RULES[op_type] = fn
        return fn

    return wrap


def _static_shape(t: TensorType) -> tuple[int, ...]:
    if has_dim(t.shape):
        raise SymbolicShapeError(f"a value of symbolic shape {list(t.shape)} is not folded")
    return tuple(int(d) for d in t.shape)


@_value_rule("Shape")
def _shape_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    return (_vector(_shape_slice(ctx)),)


@_value_rule("Size")
def _size_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    return (_scalar(math.prod(ctx.shape(0))),)


def _vector(items: Sequence[DimLike]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


def _scalar(value: DimLike) -> np.ndarray:
    out = np.empty((), dtype=object)
    out[()] = value
    return out


@_value_rule("Identity")
def _identity_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    return (xs[0],)


@_value_rule("Cast")
def _cast_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    dtype = outs[0].dtype
    if np.dtype(dtype).kind in "iu":
        return (xs[0],)
    if dtype == "bool":
        return (np.vectorize(bool, otypes=[bool])(xs[0]),)
    raise SymbolicShapeError(f"a symbolic size cast to {dtype} is not folded")


@_value_rule("Unsqueeze", "Squeeze", "Reshape", "Flatten")
def _view_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    return (np.reshape(xs[0], _static_shape(outs[0])),)


@_value_rule("Concat")
def _concat_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    axis = ctx.axis(ctx.attr_int("axis"), len(ctx.shape(0)))
    return (np.concatenate([_objects(x) for x in xs], axis=axis),)


@_value_rule("Gather")
def _gather_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    data, indices = xs
    if indices.dtype == object:
        raise SymbolicShapeError("symbolic gather indices are not folded")
    axis = ctx.axis(ctx.attr_int("axis", 0), data.ndim)
    size = data.shape[axis]
    if np.any((indices < -size) | (indices >= size)):
        raise ctx.error(f"indices {indices.tolist()} are out of range for axis size {size}")
    return (np.take(data, np.where(indices < 0, indices + size, indices), axis=axis),)


@_value_rule("Slice")
def _slice_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    _, index = slice_plan(ctx)
    if index is None:
        raise SymbolicShapeError("a slice with symbolic bounds of a value is not folded")
    return (xs[0][index],)


def _c_div(a: DimLike, b: DimLike) -> DimLike:
    """ONNX integer division (truncating), exact where the signs are decided."""
    if is_static(a) and is_static(b):
        q = abs(int(a)) // abs(int(b))
        return q if (a < 0) == (b < 0) else -q
    if b > 0:
        if a >= 0:
            return a // b
        if a <= 0:
            return -((-a) // b)
    raise SymbolicShapeError(f"the sign of {a} // {b} is not known")


def _elementwise(fn: Callable[..., object], out: str = "object") -> ValueRule:
    def rule(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
        if any(x.dtype.kind == "f" for x in xs):
            raise SymbolicShapeError("float arithmetic on symbolic sizes is not folded")
        args = [_objects(x) for x in xs]
        return (np.vectorize(fn, otypes=[object if out == "object" else out])(*args),)

    return rule


_BINARY: dict[str, tuple[Callable[..., object], str]] = {
    "Add": (lambda a, b: a + b, "object"),
    "Sub": (lambda a, b: a - b, "object"),
    "Mul": (lambda a, b: a * b, "object"),
    "Div": (_c_div, "object"),
    "Equal": (lambda a, b: a == b, "bool"),
    "Less": (lambda a, b: a < b, "bool"),
    "LessOrEqual": (lambda a, b: a <= b, "bool"),
    "Greater": (lambda a, b: a > b, "bool"),
    "GreaterOrEqual": (lambda a, b: a >= b, "bool"),
    "Neg": (lambda a: -a, "object"),
    "Abs": (abs, "object"),
    "Max": (lambda *a: max(a), "object"),
    "Min": (lambda *a: min(a), "object"),
    "Sum": (lambda *a: sum(a), "object"),
}
for _op, (_fn, _out) in _BINARY.items():
    VALUE_RULES[_op] = _elementwise(_fn, _out)


@_value_rule("Mod")
def _mod_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    if ctx.attr_int("fmod", 0):
        raise SymbolicShapeError("fmod of symbolic sizes is not folded")
    return _elementwise(lambda a, b: a % b)(ctx, xs, outs)


@_value_rule("Where")
def _where_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    cond, x, y = xs
    if cond.dtype == object:
        raise SymbolicShapeError("a symbolic Where condition is not folded")
    return (np.where(cond, _objects(x), _objects(y)),)


@_value_rule("Expand")
def _expand_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    return (np.broadcast_to(_objects(xs[0]), _static_shape(outs[0])).copy(),)


@_value_rule("ConstantOfShape")
def _fill_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    placeholder = np.asarray(_static_shape(outs[0]), dtype=np.int64)
    return OPS["ConstantOfShape"].evaluate(ctx.with_values({0: placeholder}), [placeholder])  # type: ignore[misc]


@_value_rule("Range")
def _range_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    (length,) = _static_shape(outs[0])
    start = _scalar_dim(ctx, 0, "start")
    delta = _scalar_dim(ctx, 2, "delta")
    return (_vector([start + k * delta for k in range(length)]),)


@_value_rule("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce_value(ctx: SymbolicContext, xs: list, outs: tuple) -> tuple:
    if xs[0].ndim != 1 or reduced_axes(ctx) != (0,):
        raise SymbolicShapeError("only whole-vector reductions of symbolic sizes are folded")
    items = list(_objects(xs[0]))
    op = ctx.node.op_type
    value = {
        "ReduceProd": lambda: math.prod(items),
        "ReduceSum": lambda: sum(items),
        "ReduceMax": lambda: max(items),
        "ReduceMin": lambda: min(items),
    }[op]()
    return (np.reshape(_scalar(value), _static_shape(outs[0])),)
