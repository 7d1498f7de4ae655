"""Tensor ops: constants and shape computations (always folded), Identity and Dropout
(eliminated), reshape-like views, and injective data movement (Transpose, Concat, Split,
Slice, Pad, Expand, Tile); Gather lives with the indexing ops (`indexing`), Resize in
`resize`.

Shape-chain ops have a numpy `evaluate` so that shape computations propagate during
import. Older op versions whose parameters were
attributes (Squeeze / Unsqueeze / Split before 13, Slice before 10, Pad before 11) are
canonicalized into the input form with constant int64 inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..graph import FLOAT_DTYPES, SUPPORTED_DTYPES, Node, TensorType
from ..onnx_io import dtype_to_onnx
from .base import InferContext, OpKind, Rewrite, broadcast_shapes, register, same_as_input

# --- helpers -----------------------------------------------------------------------------


def _ints(values: Sequence[int]) -> np.ndarray:
    return np.array([int(v) for v in values], dtype=np.int64)


def _normalize_axes(
    ctx: InferContext, axes: Sequence[int], rank: int, what: str = "axes"
) -> tuple[int, ...]:
    """Axes made non-negative, each in range and none repeated."""
    out = tuple(ctx.axis(int(a), rank, f"{what} entry") for a in axes)
    if len(set(out)) != len(out):
        raise ctx.error(f"{what} {list(axes)} repeat an axis")
    return out


def _vector(ctx: InferContext, index: int, what: str) -> tuple[int, ...]:
    """A compile-time 1-D integer input (a shape, axes, pads, ...)."""
    value = np.asarray(ctx.const(index, what))
    if value.ndim > 1:
        raise ctx.error(f"the {what} must be a 1-D tensor, got shape {list(value.shape)}")
    if value.dtype.kind not in "iu":
        raise ctx.error(f"the {what} must be an integer tensor, got {value.dtype}")
    return tuple(int(v) for v in value.reshape(-1))


def _scalar(ctx: InferContext, index: int, what: str) -> np.ndarray:
    value = np.asarray(ctx.const(index, what))
    if value.size != 1:
        raise ctx.error(f"the {what} must hold one element, got shape {list(value.shape)}")
    return value.reshape(())


def _check_dtype(ctx: InferContext, dtype: str, what: str) -> str:
    if dtype not in SUPPORTED_DTYPES:
        raise ctx.unsupported(f"{what} has element type {dtype}, which polytile does not support")
    return dtype


def _attr_to_input(ctx: InferContext, attr: str) -> tuple[str, dict[str, np.ndarray]]:
    """A fresh constant int64 input holding int-list attribute `attr`: its name ('' when the
    attribute is absent) and the constant to add."""
    value = ctx.node.attrs.get(attr)
    if value is None:
        return "", {}
    name = ctx.fresh(attr)
    return name, {name: _ints(value)}


# --- constants and shape computations (folded) -------------------------------------------

_CONSTANT_ATTRS = (
    "value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "value_string",
    "value_strings",
    "sparse_value",
)


def _constant_value(ctx: InferContext) -> np.ndarray:
    given = [k for k in _CONSTANT_ATTRS if k in ctx.node.attrs]
    if len(given) != 1:
        raise ctx.error(
            f"needs exactly one of the attributes {', '.join(_CONSTANT_ATTRS)}; "
            f"got {', '.join(given) or 'none'}"
        )
    key = given[0]
    value = ctx.node.attrs[key]
    if key in ("value_string", "value_strings"):
        raise ctx.unsupported(f"string constants (attribute '{key}') are not supported")
    if key == "sparse_value":
        raise ctx.unsupported("sparse constants (attribute 'sparse_value') are not supported")
    if key == "value":
        array = np.asarray(value)
    elif key == "value_float":
        array = np.array(value, dtype=np.float32)
    elif key == "value_floats":
        array = np.array(value, dtype=np.float32).reshape(-1)
    elif key == "value_int":
        array = np.array(value, dtype=np.int64)
    else:
        array = np.array(value, dtype=np.int64).reshape(-1)
    _check_dtype(ctx, array.dtype.name, f"attribute '{key}'")
    return array


@register("Constant", OpKind.SHAPE, evaluate=lambda ctx, xs: (_constant_value(ctx),))
def _constant(ctx: InferContext) -> tuple[TensorType, ...]:
    value = _constant_value(ctx)
    return (TensorType(tuple(value.shape), value.dtype.name),)


def _fill_value(ctx: InferContext) -> np.ndarray:
    value = ctx.attr("value")
    if value is None:
        return np.zeros((), dtype=np.float32)
    value = np.asarray(value)
    if value.size != 1:
        raise ctx.error(f"attribute 'value' must hold one element, got shape {list(value.shape)}")
    _check_dtype(ctx, value.dtype.name, "attribute 'value'")
    return value.reshape(())


def _fill_shape(ctx: InferContext) -> tuple[int, ...]:
    shape = _vector(ctx, 0, "output shape")
    if any(d < 0 for d in shape):
        raise ctx.error(f"output shape {list(shape)} has a negative dimension")
    return shape


@register(
    "ConstantOfShape",
    OpKind.SHAPE,
    evaluate=lambda ctx, xs: (np.full(_fill_shape(ctx), _fill_value(ctx)),),
    params=(0,),
)
def _constant_of_shape(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(_fill_shape(ctx), _fill_value(ctx).dtype.name),)


def _shape_slice(ctx: InferContext) -> tuple[int, ...]:
    shape = ctx.shape(0)
    rank = len(shape)
    start = ctx.attr_int("start", 0)
    end = ctx.attr("end")
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return shape[start:end]


@register(
    "Shape",
    OpKind.SHAPE,
    evaluate=lambda ctx, xs: (_ints(_shape_slice(ctx)),),
    needs_values=False,
)
def _shape(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType((len(_shape_slice(ctx)),), "int64"),)


RANGE_DTYPES = FLOAT_DTYPES | {"int16", "int32", "int64"}


def _range_args(ctx: InferContext) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.dtype]:
    """start, limit and delta in the type the values are computed in, and the output dtype."""
    names = ("start", "limit", "delta")
    args = [_scalar(ctx, i, names[i]) for i in range(3)]
    dtypes = {v.dtype.name for v in args}
    if len(dtypes) > 1:
        raise ctx.error(f"start, limit and delta have different dtypes {sorted(dtypes)}")
    if args[2].item() == 0:
        raise ctx.error("delta is 0")
    dtype = args[0].dtype
    if dtype.name in ("float16", "bfloat16") and ctx.opset >= 27:  # computed in stash_type
        stash = ctx.attr_int("stash_type", 1)
        compute = {1: np.float32, 11: np.float64}.get(stash)
        if compute is None:
            raise ctx.error(f"attribute stash_type={stash} is not 1 (float) or 11 (double)")
        args = [v.astype(compute) for v in args]
    return args[0], args[1], args[2], dtype


def _range_length(ctx: InferContext) -> int:
    """max(ceil((limit - start) / delta), 0), computed as numpy's arange does."""
    start, limit, delta, _ = _range_args(ctx)
    return max(math.ceil((limit.item() - start.item()) / delta.item()), 0)


def _range_values(ctx: InferContext) -> np.ndarray:
    start, limit, delta, dtype = _range_args(ctx)
    compute = start.dtype if start.dtype != dtype else None
    return np.arange(start.item(), limit.item(), delta.item(), dtype=compute).astype(dtype)


@register(
    "Range",
    OpKind.SHAPE,
    evaluate=lambda ctx, xs: (_range_values(ctx),),
    dtypes=RANGE_DTYPES,
    params=(0, 1, 2),
)
def _range(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType((_range_length(ctx),), ctx.dtype(0)),)


# --- Identity, Dropout (eliminated) ------------------------------------------------------

register("Identity", OpKind.ELIMINATED, evaluate=lambda ctx, xs: (xs[0],))(same_as_input)


def _dropout_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Before opset 12, Dropout takes `ratio` (and before 7 `is_test`) as attributes; in
    inference they change nothing. Dropout-7's mask has the data's type, not bool."""
    node = ctx.node
    if since >= 12:
        return Rewrite((node,))
    if since < 7 and not ctx.attr_int("is_test", 0):
        raise ctx.unsupported("training mode (is_test=0) is not supported")
    mask = node.outputs[1] if len(node.outputs) > 1 else ""
    if since >= 10 or not mask:
        return Rewrite((Node(node.name, "Dropout", node.inputs[:1], node.outputs, {}),))
    bool_mask = ctx.fresh("mask")
    dropout = Node(node.name, "Dropout", node.inputs[:1], (node.outputs[0], bool_mask), {})
    to = dtype_to_onnx(ctx.dtype(0))
    cast = Node(ctx.fresh("mask_cast"), "Cast", (bool_mask,), (mask,), {"to": to})
    return Rewrite((dropout, cast))


@register(
    "Dropout",
    OpKind.ELIMINATED,
    evaluate=lambda ctx, xs: (xs[0], np.ones(xs[0].shape, dtype=bool)),
    canonicalize=_dropout_canonicalize,
    params=(1, 2),
)
def _dropout(ctx: InferContext) -> tuple[TensorType, ...]:
    """Inference Dropout copies its input and keeps every element (the mask is all true).
    Training mode is random unless the ratio is 0, when it copies too."""
    x = ctx.type(0)
    ratio = None
    if ctx.has_input(1) and ctx.value(1) is not None:
        ratio = float(_scalar(ctx, 1, "ratio"))
        if not 0.0 <= ratio < 1.0:
            raise ctx.error(f"ratio {ratio} is not in [0, 1)")
    if ctx.has_input(2) and bool(_scalar(ctx, 2, "training mode flag")):
        if not ctx.has_input(1):
            ratio = 0.5
        if ratio != 0.0:
            raise ctx.unsupported(
                "training mode (training_mode=true) with a non-zero ratio drops random "
                "elements and is not supported"
            )
    return (x, TensorType(x.shape, "bool"))


# --- views: Reshape, Flatten, Squeeze, Unsqueeze -----------------------------------------


def _reshape_target(ctx: InferContext) -> tuple[int, ...]:
    in_shape = ctx.shape(0)
    spec = _vector(ctx, 1, "target shape")
    allowzero = ctx.attr_int("allowzero", 0)
    if spec.count(-1) > 1:
        raise ctx.error(f"target shape {list(spec)} has more than one -1")
    if allowzero and 0 in spec and -1 in spec:
        raise ctx.error(f"target shape {list(spec)} has both 0 and -1 with allowzero=1")
    out = []
    for index, dim in enumerate(spec):
        if dim < -1:
            raise ctx.error(f"target shape {list(spec)} has the invalid entry {dim}")
        if dim == 0 and not allowzero:
            if index >= len(in_shape):
                raise ctx.error(
                    f"target shape {list(spec)} copies dimension {index} (0 entry), but the "
                    f"input {list(in_shape)} has rank {len(in_shape)}"
                )
            dim = in_shape[index]
        out.append(dim)
    total = math.prod(in_shape)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {list(in_shape)} to {list(spec)}")
        out[out.index(-1)] = total // known
    if math.prod(out) != total:
        raise ctx.error(
            f"cannot reshape {list(in_shape)} ({total} elements) to {list(spec)} "
            f"({math.prod(out)} elements)"
        )
    return tuple(out)


@register(
    "Reshape",
    OpKind.VIEW,
    evaluate=lambda ctx, xs: (np.reshape(xs[0], _reshape_target(ctx)),),
    params=(1,),
)
def _reshape(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(_reshape_target(ctx), ctx.dtype(0)),)


def _flatten_shape(ctx: InferContext) -> tuple[int, int]:
    shape = ctx.shape(0)
    rank = len(shape)
    axis = ctx.attr_int("axis", 1)
    if not -rank <= axis <= rank:
        raise ctx.error(f"axis {axis} is out of range [{-rank}, {rank}]")
    if axis < 0:
        axis += rank
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


@register(
    "Flatten",
    OpKind.VIEW,
    evaluate=lambda ctx, xs: (np.reshape(xs[0], _flatten_shape(ctx)),),
)
def _flatten(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(_flatten_shape(ctx), ctx.dtype(0)),)


def _axes_attr_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Squeeze / Unsqueeze before opset 13 take `axes` as an attribute, later an input."""
    node = ctx.node
    if since >= 13:
        return Rewrite((node,))
    if node.op_type == "Squeeze" and not node.attrs.get("axes", ()):
        # an omitted or empty `axes` attribute squeezes every size-1 axis
        return Rewrite((Node(node.name, "Squeeze", node.inputs[:1], node.outputs, {}),))
    axes, consts = _attr_to_input(ctx, "axes")
    inputs = (node.inputs[0], axes) if axes else node.inputs[:1]
    return Rewrite((Node(node.name, node.op_type, inputs, node.outputs, {}),), consts)


def _squeeze_shape(ctx: InferContext) -> tuple[int, ...]:
    shape = ctx.shape(0)
    if not ctx.has_input(1):
        return tuple(d for d in shape if d != 1)
    axes = _normalize_axes(ctx, _vector(ctx, 1, "axes"), len(shape))
    for axis in axes:
        if shape[axis] != 1:
            raise ctx.error(
                f"cannot squeeze axis {axis} of size {shape[axis]} (shape {list(shape)})"
            )
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _unsqueeze_shape(ctx: InferContext) -> tuple[int, ...]:
    shape = ctx.shape(0)
    raw = _vector(ctx, 1, "axes")
    rank = len(shape) + len(raw)
    axes = set(_normalize_axes(ctx, raw, rank))
    dims = iter(shape)
    return tuple(1 if i in axes else next(dims) for i in range(rank))


def _register_axes_view(op_type: str, shape_of: Callable[[InferContext], tuple[int, ...]]) -> None:
    """Squeeze and Unsqueeze: a view of the input as `shape_of(ctx)`, the axes in input 1."""

    def infer(ctx: InferContext) -> tuple[TensorType, ...]:
        return (TensorType(shape_of(ctx), ctx.dtype(0)),)

    register(
        op_type,
        OpKind.VIEW,
        evaluate=lambda ctx, xs: (np.reshape(xs[0], shape_of(ctx)),),
        canonicalize=_axes_attr_canonicalize,
        params=(1,),
    )(infer)


_register_axes_view("Squeeze", _squeeze_shape)
_register_axes_view("Unsqueeze", _unsqueeze_shape)


# --- injective: Transpose, Concat, Split, Slice, Pad, Expand, Tile ---------------------


def transpose_perm(ctx: InferContext) -> tuple[int, ...]:
    rank = len(ctx.shape(0))
    perm = ctx.attr_ints("perm")
    if perm is None:
        return tuple(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {list(perm)} is not a permutation of the {rank} input axes")
    return perm


@register(
    "Transpose",
    OpKind.INJECTIVE,
    evaluate=lambda ctx, xs: (np.transpose(xs[0], transpose_perm(ctx)),),
)
def _transpose(ctx: InferContext) -> tuple[TensorType, ...]:
    shape = ctx.shape(0)
    return (TensorType(tuple(shape[p] for p in transpose_perm(ctx)), ctx.dtype(0)),)


def concat_axis(ctx: InferContext) -> int:
    return ctx.axis(ctx.attr_int("axis"), len(ctx.shape(0)))


@register(
    "Concat",
    OpKind.INJECTIVE,
    evaluate=lambda ctx, xs: (np.concatenate(list(xs), axis=concat_axis(ctx)),),
)
def _concat(ctx: InferContext) -> tuple[TensorType, ...]:
    if ctx.num_inputs == 0:
        raise ctx.error("needs at least one input")
    types = [ctx.type(i) for i in range(ctx.num_inputs)]
    first = types[0]
    if first.rank == 0:
        raise ctx.error("cannot concatenate scalars (rank-0 inputs)")
    axis = concat_axis(ctx)
    for index, t in enumerate(types[1:], start=1):
        if t.dtype != first.dtype:
            raise ctx.error(f"input {index} has dtype {t.dtype}, input 0 has {first.dtype}")
        if t.rank != first.rank or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if i != axis
        ):
            raise ctx.error(
                f"input {index} has shape {list(t.shape)}, which does not match input 0's "
                f"{list(first.shape)} except on axis {axis}"
            )
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return (TensorType(tuple(shape), first.dtype),)


def _split_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Split before 13 takes `split` as an attribute; before 18 an unspecified split means
    equal parts, which Split-18 spells `num_outputs`."""
    node = ctx.node
    if since >= 18:
        return Rewrite((node,))
    consts: dict[str, np.ndarray] = {}
    split = node.input(1)
    if since < 13:
        split, consts = _attr_to_input(ctx, "split")
    attrs = {k: v for k, v in node.attrs.items() if k == "axis"}
    if not split:
        parts = len(node.outputs)
        shape = ctx.shape(0)
        axis = ctx.axis(int(attrs.get("axis", 0)), len(shape))
        if shape[axis] % parts:
            raise ctx.error(
                f"axis {axis} of size {shape[axis]} does not split into {parts} equal parts"
            )
        attrs["num_outputs"] = parts
    inputs = (node.inputs[0], split) if split else node.inputs[:1]
    return Rewrite((Node(node.name, "Split", inputs, node.outputs, attrs),), consts)


def split_sizes(ctx: InferContext) -> tuple[int, tuple[int, ...]]:
    shape = ctx.shape(0)
    axis = ctx.axis(ctx.attr_int("axis", 0), len(shape))
    dim = shape[axis]
    parts = len(ctx.node.outputs)
    if ctx.has_input(1):
        if "num_outputs" in ctx.node.attrs:
            raise ctx.error("has both the split input and the num_outputs attribute")
        sizes = _vector(ctx, 1, "split sizes")
        if len(sizes) != parts or any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ctx.error(
                f"split sizes {list(sizes)} are not {parts} non-negative sizes summing to "
                f"{dim} (axis {axis} of shape {list(shape)})"
            )
        return axis, sizes
    count = ctx.attr_int("num_outputs", parts)
    if count != parts or count < 1:
        raise ctx.error(f"num_outputs={count} but the node has {parts} output(s)")
    chunk = -(-dim // count)
    last = dim - chunk * (count - 1)
    if last < 0:
        raise ctx.error(f"axis {axis} of size {dim} does not split into {count} chunks")
    return axis, (chunk,) * (count - 1) + (last,)


def _split_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    axis, sizes = split_sizes(ctx)
    return tuple(np.split(xs[0], np.cumsum(sizes)[:-1], axis=axis))


@register(
    "Split",
    OpKind.INJECTIVE,
    evaluate=_split_evaluate,
    canonicalize=_split_canonicalize,
    params=(1,),
)
def _split(ctx: InferContext) -> tuple[TensorType, ...]:
    axis, sizes = split_sizes(ctx)
    shape = ctx.shape(0)
    return tuple(
        TensorType((*shape[:axis], size, *shape[axis + 1 :]), ctx.dtype(0)) for size in sizes
    )


def _slice_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Slice before opset 10 takes starts / ends / axes as attributes and has no steps."""
    node = ctx.node
    if since >= 10:
        return Rewrite((node,))
    consts: dict[str, np.ndarray] = {}
    inputs = [node.inputs[0]]
    for attr in ("starts", "ends", "axes"):
        name, new = _attr_to_input(ctx, attr)
        if attr != "axes" and not name:
            raise ctx.error(f"attribute '{attr}' is required")
        consts.update(new)
        if name:
            inputs.append(name)
    return Rewrite((Node(node.name, "Slice", tuple(inputs), node.outputs, {}),), consts)


def slice_plan(ctx: InferContext) -> tuple[tuple[int, ...], tuple[slice, ...]]:
    """Output shape and the numpy index that computes the slice."""
    shape = ctx.shape(0)
    rank = len(shape)
    starts = _vector(ctx, 1, "starts")
    ends = _vector(ctx, 2, "ends")
    axes = _vector(ctx, 3, "axes") if ctx.has_input(3) else tuple(range(len(starts)))
    steps = _vector(ctx, 4, "steps") if ctx.has_input(4) else (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(
            f"starts, ends, axes and steps have different lengths "
            f"({len(starts)}, {len(ends)}, {len(axes)}, {len(steps)})"
        )
    axes = _normalize_axes(ctx, axes, rank)
    out = list(shape)
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[axis]
        if step == 0:
            raise ctx.error(f"step for axis {axis} is 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            out[axis] = max(0, -(-(end - start) // step))
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            out[axis] = max(0, -(-(start - end) // -step))
        index[axis] = slice(start, end if end >= 0 else None, step)
    return tuple(out), tuple(index)


def _slice_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    shape, index = slice_plan(ctx)
    return (xs[0][index] if 0 not in shape else np.empty(shape, dtype=xs[0].dtype),)


@register(
    "Slice",
    OpKind.INJECTIVE,
    evaluate=_slice_evaluate,
    canonicalize=_slice_canonicalize,
    params=(1, 2, 3, 4),
)
def _slice(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(slice_plan(ctx)[0], ctx.dtype(0)),)


PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Pad before opset 11 takes `pads` and `value` as attributes, later inputs."""
    node = ctx.node
    if since >= 11:
        return Rewrite((node,))
    pads = node.attrs.get("pads", node.attrs.get("paddings"))
    if pads is None:
        raise ctx.error("attribute 'pads' is required")
    name = ctx.fresh("pads")
    consts = {name: _ints(pads)}
    inputs = [node.inputs[0], name]
    value = node.attrs.get("value")
    if value is not None and float(value) != 0.0:
        fill = ctx.fresh("value")
        consts[fill] = np.array(value, dtype=np.float64).astype(ctx.dtype(0))
        inputs.append(fill)
    attrs = {k: v for k, v in node.attrs.items() if k == "mode"}
    return Rewrite((Node(node.name, "Pad", tuple(inputs), node.outputs, attrs),), consts)


def pad_plan(ctx: InferContext) -> tuple[str, list[tuple[int, int]]]:
    """The mode and (begin, end) pads of every axis."""
    shape = ctx.shape(0)
    rank = len(shape)
    mode = ctx.attr_choice("mode", "constant", PAD_MODES)
    pads = _vector(ctx, 1, "pads")
    axes = _vector(ctx, 3, "axes") if ctx.has_input(3) else tuple(range(rank))
    axes = _normalize_axes(ctx, axes, rank)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {list(pads)} must have 2 × {len(axes)} entries")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        begin, end = pads[i], pads[len(axes) + i]
        if shape[axis] + begin + end < 0:
            raise ctx.error(f"pads {list(pads)} crop axis {axis} of size {shape[axis]} below 0")
        if mode != "constant" and shape[axis] == 0 and (begin > 0 or end > 0):
            raise ctx.error(f"mode '{mode}' cannot pad axis {axis}, which has size 0")
        widths[axis] = (begin, end)
    return mode, widths


def pad_value(ctx: InferContext) -> np.ndarray:
    if not ctx.has_input(2):
        return np.zeros((), dtype=ctx.dtype(0))
    value = _scalar(ctx, 2, "constant value")
    if value.dtype.name != ctx.dtype(0):
        raise ctx.error(f"constant value has dtype {value.dtype}, data has {ctx.dtype(0)}")
    return value


def _pad_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    mode, widths = pad_plan(ctx)
    x = xs[0]
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(widths))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        return (np.pad(x, grow, mode="constant", constant_values=pad_value(ctx)),)
    return (np.pad(x, grow, mode=mode),)


@register(
    "Pad",
    OpKind.INJECTIVE,
    evaluate=_pad_evaluate,
    canonicalize=_pad_canonicalize,
    params=(1, 2, 3),
)
def _pad(ctx: InferContext) -> tuple[TensorType, ...]:
    mode, widths = pad_plan(ctx)
    if mode == "constant":
        pad_value(ctx)
    shape = tuple(d + b + e for d, (b, e) in zip(ctx.shape(0), widths, strict=True))
    return (TensorType(shape, ctx.dtype(0)),)


def _expand_shape(ctx: InferContext) -> tuple[int, ...]:
    target = _vector(ctx, 1, "target shape")
    if any(d < 0 for d in target):
        raise ctx.error(f"target shape {list(target)} has a negative dimension")
    return broadcast_shapes(ctx, ctx.shape(0), target)


@register(
    "Expand",
    OpKind.INJECTIVE,
    evaluate=lambda ctx, xs: (np.broadcast_to(xs[0], _expand_shape(ctx)).copy(),),
    params=(1,),
)
def _expand(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(_expand_shape(ctx), ctx.dtype(0)),)


def tile_repeats(ctx: InferContext) -> tuple[int, ...]:
    repeats = _vector(ctx, 1, "repeats")
    rank = len(ctx.shape(0))
    if len(repeats) != rank or any(r < 0 for r in repeats):
        raise ctx.error(f"repeats {list(repeats)} must be {rank} non-negative counts")
    return repeats


@register(
    "Tile",
    OpKind.INJECTIVE,
    evaluate=lambda ctx, xs: (np.tile(xs[0], tile_repeats(ctx)),),
    params=(1,),
)
def _tile(ctx: InferContext) -> tuple[TensorType, ...]:
    shape = tuple(d * r for d, r in zip(ctx.shape(0), tile_repeats(ctx), strict=True))
    return (TensorType(shape, ctx.dtype(0)),)
