"""Indexing ops: Gather, GatherElements, GatherND, ScatterElements (and the older Scatter),
ScatterND, OneHot, TopK, Trilu, EyeLike and NonZero.

Every index an op reads from a tensor is described by an `IndexBound` (which input, and
the size of the axis each of its values indexes). Indices known at compile time are
checked here, with an error naming the node, the value and its position; indices known
only at run time are checked by the compiled model before the kernel that reads them
(`polytile.compiler`, `codegen.module`), from the same bounds. ONNX lets an index be
negative: the valid range of an axis of size n is [-n, n-1].

OneHot reads its indices as values (out-of-range ones give an all-off row, as ONNX
says), so they have no bound; its depth and TopK's k fix output shapes and must be
compile-time constants. NonZero's output shape depends on its input's values, so it is
supported only where that input is a compile-time constant (it is then folded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from polytile.errors import UnsupportedOpError

from ..graph import Node, TensorType
from ..onnx_io import onnx_to_dtype
from .base import InferContext, OpKind, Rewrite, register

INDEX_DTYPES = frozenset({"int32", "int64"})
SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


@dataclass(frozen=True)
class IndexBound:
    """Input `input` of a node holds indices: its values, cycling over `sizes` along its
    last axis (one size: every value), index axes `axis`, `axis + 1`, ... of those sizes
    of the tensor `data` (valid: [-n, n-1])."""

    input: int
    sizes: tuple[int, ...]
    data: str
    axis: int


BoundsFn = Callable[[InferContext], tuple[IndexBound, ...]]
#: op type -> the index bounds of a node (from its input types and attributes)
INDEX_BOUNDS: dict[str, BoundsFn] = {}


def index_inputs(node: Node) -> frozenset[int]:
    """The positions of a node's inputs read as indices (none for other ops): fusion
    keeps their producers out of the node's group, so that the compiled model can check
    them, as a buffer, before the kernel that reads them."""
    return INDEX_INPUTS.get(node.op_type, frozenset())


INDEX_INPUTS: dict[str, frozenset[int]] = {
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "GatherND": frozenset({1}),
    "ScatterElements": frozenset({1}),
    "ScatterND": frozenset({1}),
}


def bounds_of(ctx: InferContext) -> tuple[IndexBound, ...]:
    fn = INDEX_BOUNDS.get(ctx.node.op_type)
    return fn(ctx) if fn is not None else ()


def first_out_of_range(values: np.ndarray, sizes: Sequence[int]) -> tuple[int, int] | None:
    """(flat position, value) of the first index outside [-n, n-1], or None."""
    flat = np.asarray(values).astype(np.int64).reshape(-1)
    if flat.size == 0:
        return None
    n = np.resize(np.asarray(sizes, dtype=np.int64), flat.size)
    bad = np.flatnonzero((flat < -n) | (flat >= n))
    if bad.size == 0:
        return None
    return int(bad[0]), int(flat[bad[0]])


def out_of_range_message(
    input_name: str, shape: Sequence[int], bound: IndexBound, position: int, value: int
) -> str:
    """The one wording of an out-of-range index, at compile time and at run time."""
    where = np.unravel_index(position, tuple(shape)) if len(shape) else ()
    component = position % len(bound.sizes)
    size = bound.sizes[component]
    return (
        f"index {value} is out of range for axis {bound.axis + component} of '{bound.data}' "
        f"(size {size}; valid indices are {-size}..{size - 1}), at position "
        f"{[int(i) for i in where]} of input '{input_name}'"
    )


def check_constant_indices(ctx: InferContext) -> None:
    """Compile-time indices of the node checked against their bounds (a ShapeError)."""
    for bound in bounds_of(ctx):
        value = ctx.value(bound.input)
        if value is None:
            continue
        found = first_out_of_range(np.asarray(value), bound.sizes)
        if found is not None:
            name = ctx.node.inputs[bound.input]
            raise ctx.error(out_of_range_message(name, np.shape(value), bound, *found))


def _index_dtype(ctx: InferContext, index: int, what: str = "indices") -> None:
    if ctx.dtype(index) not in INDEX_DTYPES:
        raise ctx.error(f"{what} have dtype {ctx.dtype(index)}, not int32 or int64")


def _wrap(indices: np.ndarray, sizes: np.ndarray | int) -> np.ndarray:
    indices = np.asarray(indices).astype(np.int64)
    return np.where(indices < 0, indices + sizes, indices)


def _axis(ctx: InferContext, rank: int) -> int:
    return ctx.axis(ctx.attr_int("axis", 0), rank)


# --- Gather -----------------------------------------------------------------------------


def _axis_bound(ctx: InferContext) -> tuple[IndexBound, ...]:
    """Input 1 indexes data's `axis` (Gather, GatherElements, ScatterElements)."""
    axis = _axis(ctx, len(ctx.shape(0)))
    return (IndexBound(1, (ctx.shape(0)[axis],), ctx.node.inputs[0], axis),)


def _gather_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    axis = _axis(ctx, len(ctx.shape(0)))
    check_constant_indices(ctx)
    return (np.take(xs[0], _wrap(xs[1], ctx.shape(0)[axis]), axis=axis),)


@register("Gather", OpKind.INJECTIVE, evaluate=_gather_evaluate)
def _gather(ctx: InferContext) -> tuple[TensorType, ...]:
    shape = ctx.shape(0)
    if not shape:
        raise ctx.error("data must have rank at least 1")
    axis = _axis(ctx, len(shape))
    _index_dtype(ctx, 1)
    check_constant_indices(ctx)
    out = shape[:axis] + ctx.shape(1) + shape[axis + 1 :]
    return (TensorType(out, ctx.dtype(0)),)


# --- GatherElements ---------------------------------------------------------------------


def _gather_elements_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    axis = _axis(ctx, len(ctx.shape(0)))
    check_constant_indices(ctx)
    return (np.take_along_axis(xs[0], _wrap(xs[1], ctx.shape(0)[axis]), axis=axis),)


def _elements_shapes(ctx: InferContext) -> int:
    """The axis of an elements op, with the indices' shape checked against the data's:
    the same rank, and no larger off the axis."""
    data, indices = ctx.shape(0), ctx.shape(1)
    if not data:
        raise ctx.error("data must have rank at least 1")
    if len(indices) != len(data):
        raise ctx.error(
            f"indices have rank {len(indices)} but data has rank {len(data)}; they must be equal"
        )
    axis = _axis(ctx, len(data))
    _index_dtype(ctx, 1)
    for d, (n, m) in enumerate(zip(data, indices, strict=True)):
        if d != axis and m > n:
            raise ctx.error(
                f"indices have shape {list(indices)}, larger than data's {list(data)} on axis {d}"
            )
    return axis


@register("GatherElements", OpKind.INJECTIVE, evaluate=_gather_elements_evaluate)
def _gather_elements(ctx: InferContext) -> tuple[TensorType, ...]:
    _elements_shapes(ctx)
    check_constant_indices(ctx)
    return (TensorType(ctx.shape(1), ctx.dtype(0)),)


# --- GatherND ---------------------------------------------------------------------------


def _nd_facts(ctx: InferContext, batch_dims: int) -> int:
    """The index tuple length m of GatherND / ScatterND, with the shapes checked."""
    data, indices = ctx.shape(0), ctx.shape(1)
    _index_dtype(ctx, 1)
    if not data or not indices:
        raise ctx.error("data and indices must have rank at least 1")
    m = indices[-1]
    if batch_dims < 0 or batch_dims >= min(len(data), len(indices)):
        raise ctx.error(f"batch_dims {batch_dims} must be below the ranks of data and indices")
    if data[:batch_dims] != indices[:batch_dims]:
        raise ctx.error(
            f"the first {batch_dims} dims of data {list(data)} and indices {list(indices)} differ"
        )
    if not 1 <= m <= len(data) - batch_dims:
        raise ctx.error(
            f"the last dim of indices ({m}) must be between 1 and the rank of data minus "
            f"batch_dims ({len(data) - batch_dims})"
        )
    return m


def _nd_bounds(ctx: InferContext) -> tuple[IndexBound, ...]:
    b = ctx.attr_int("batch_dims", 0)
    m = ctx.shape(1)[-1]
    return (IndexBound(1, tuple(ctx.shape(0)[b : b + m]), ctx.node.inputs[0], b),)


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """numpy GatherND (indices already in range)."""
    m = indices.shape[-1]
    batch = data.shape[:batch_dims]
    count = int(np.prod(batch, dtype=np.int64))
    flat_data = data.reshape((count, *data.shape[batch_dims:]))
    flat_idx = _wrap(indices, np.asarray(data.shape[batch_dims : batch_dims + m]))
    flat_idx = flat_idx.reshape((count, *indices.shape[batch_dims:]))
    rows = [d[tuple(np.moveaxis(i, -1, 0))] for d, i in zip(flat_data, flat_idx, strict=True)]
    out_shape = (*batch, *indices.shape[batch_dims:-1], *data.shape[batch_dims + m :])
    if not rows:
        return np.empty(out_shape, data.dtype)
    return np.stack(rows).reshape(out_shape)


def _gather_nd_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    check_constant_indices(ctx)
    return (gather_nd(np.asarray(xs[0]), np.asarray(xs[1]), ctx.attr_int("batch_dims", 0)),)


@register("GatherND", OpKind.INJECTIVE, evaluate=_gather_nd_evaluate)
def _gather_nd(ctx: InferContext) -> tuple[TensorType, ...]:
    b = ctx.attr_int("batch_dims", 0)
    m = _nd_facts(ctx, b)
    data, indices = ctx.shape(0), ctx.shape(1)
    check_constant_indices(ctx)
    out = (*indices[:-1], *data[b + m :])
    return (TensorType(tuple(out), ctx.dtype(0)),)


# --- ScatterElements / Scatter / ScatterND ----------------------------------------------

_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_reduction(ctx: InferContext) -> str:
    return ctx.attr_choice("reduction", "none", SCATTER_REDUCTIONS)


def _apply(out: np.ndarray, where: tuple[np.ndarray, ...], updates: np.ndarray, how: str) -> None:
    """out[where[n]] op= updates[n] for every n in order (for 'none' with duplicate
    positions, the last one wins, as onnxruntime does)."""
    if how != "none":
        _UFUNCS[how].at(out, where, updates)
        return
    positions = list(zip(*(w.tolist() for w in where), strict=True))
    if len(set(positions)) == len(positions):
        out[where] = updates
        return
    for n, at in enumerate(positions):
        out[at] = updates[n]


def _scatter_elements_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    data, indices, updates = (np.asarray(x) for x in xs)
    axis = _axis(ctx, data.ndim)
    check_constant_indices(ctx)
    out = data.copy()
    if indices.size == 0:
        return (out,)
    where = list(np.indices(indices.shape))
    where[axis] = _wrap(indices, data.shape[axis])
    flat = np.ravel_multi_index(tuple(w.reshape(-1) for w in where), data.shape)
    _apply(out.reshape(-1), (flat,), updates.reshape(-1), scatter_reduction(ctx))
    return (out,)


def _scatter_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Scatter (opset 9-10) is ScatterElements without a reduction."""
    node = ctx.node
    return Rewrite((Node(node.name, "ScatterElements", node.inputs, node.outputs, node.attrs),))


@register("Scatter", OpKind.REDUCTION, canonicalize=_scatter_canonicalize)
def _scatter(ctx: InferContext) -> tuple[TensorType, ...]:
    raise ctx.error("Scatter is canonicalized to ScatterElements")


@register("ScatterElements", OpKind.REDUCTION, evaluate=_scatter_elements_evaluate)
def _scatter_elements(ctx: InferContext) -> tuple[TensorType, ...]:
    _elements_shapes(ctx)
    indices = ctx.shape(1)
    if ctx.shape(2) != indices:
        raise ctx.error(f"updates have shape {list(ctx.shape(2))}, indices {list(indices)}")
    return _scatter_type(ctx)


def _scatter_type(ctx: InferContext) -> tuple[TensorType, ...]:
    """A scatter's output type (the data's), once its updates' dtype, its reduction and
    its constant indices are checked (the updates' shape is each op's own)."""
    if ctx.dtype(2) != ctx.dtype(0):
        raise ctx.error(f"updates have dtype {ctx.dtype(2)}, data {ctx.dtype(0)}")
    scatter_reduction(ctx)
    check_constant_indices(ctx)
    return (ctx.type(0),)


def _scatter_nd_bounds(ctx: InferContext) -> tuple[IndexBound, ...]:
    m = ctx.shape(1)[-1]
    return (IndexBound(1, tuple(ctx.shape(0)[:m]), ctx.node.inputs[0], 0),)


def _scatter_nd_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    data, indices, updates = (np.asarray(x) for x in xs)
    check_constant_indices(ctx)
    m = indices.shape[-1]
    wrapped = _wrap(indices, np.asarray(data.shape[:m]))
    out = data.copy()
    where = tuple(wrapped[..., k].reshape(-1) for k in range(m))
    rows = updates.reshape((-1, *data.shape[m:]))
    _apply(out, where, rows, scatter_reduction(ctx))
    return (out,)


@register("ScatterND", OpKind.REDUCTION, evaluate=_scatter_nd_evaluate)
def _scatter_nd(ctx: InferContext) -> tuple[TensorType, ...]:
    m = _nd_facts(ctx, 0)
    data, indices = ctx.shape(0), ctx.shape(1)
    expected = (*indices[:-1], *data[m:])
    if ctx.shape(2) != expected:
        raise ctx.error(f"updates have shape {list(ctx.shape(2))}, expected {list(expected)}")
    return _scatter_type(ctx)


INDEX_BOUNDS.update(
    {
        "Gather": _axis_bound,
        "GatherElements": _axis_bound,
        "GatherND": _nd_bounds,
        "ScatterElements": _axis_bound,
        "ScatterND": _scatter_nd_bounds,
    }
)


# --- OneHot -----------------------------------------------------------------------------


def onehot_depth(ctx: InferContext) -> int:
    value = np.asarray(ctx.const(1, "depth"))
    if value.size != 1:
        raise ctx.error(f"depth must hold one value, got shape {list(value.shape)}")
    depth = int(value.reshape(-1)[0])
    if depth < 1:
        raise ctx.error(f"depth {depth} must be at least 1")
    return depth


def onehot_axis(ctx: InferContext) -> int:
    return ctx.axis(ctx.attr_int("axis", -1), len(ctx.shape(0)) + 1)


def _onehot_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    depth, axis = onehot_depth(ctx), onehot_axis(ctx)
    indices = np.asarray(xs[0]).astype(np.int64)
    values = np.asarray(xs[2]).reshape(-1)
    wrapped = np.expand_dims(_wrap(indices, depth), axis)
    shape = [1] * (indices.ndim + 1)
    shape[axis] = depth
    hot = wrapped == np.arange(depth).reshape(shape)
    return (np.where(hot, values[1], values[0]).astype(values.dtype),)


@register("OneHot", OpKind.INJECTIVE, evaluate=_onehot_evaluate, params=(1,))
def _onehot(ctx: InferContext) -> tuple[TensorType, ...]:
    depth, axis = onehot_depth(ctx), onehot_axis(ctx)
    if ctx.type(2).size != 2:
        raise ctx.error(f"values must hold two elements (off, on), got {list(ctx.shape(2))}")
    if ctx.dtype(0) == "bool":
        raise ctx.error("indices must be numeric, not bool")
    shape = list(ctx.shape(0))
    shape.insert(axis, depth)
    return (TensorType(tuple(shape), ctx.dtype(2)),)


# --- TopK -------------------------------------------------------------------------------


def topk_facts(ctx: InferContext) -> tuple[int, int, bool]:
    """(axis, k, largest) with k checked against the axis."""
    shape = ctx.shape(0)
    if not shape:
        raise ctx.error("input must have rank at least 1")
    axis = ctx.axis(ctx.attr_int("axis", -1), len(shape))
    value = np.asarray(ctx.const(1, "k"))
    if value.size != 1:
        raise ctx.error(f"k must hold one value, got shape {list(value.shape)}")
    k = int(value.reshape(-1)[0])
    if not 0 <= k <= shape[axis]:
        raise ctx.error(f"k = {k} is out of range for axis {axis} of size {shape[axis]}")
    return axis, k, bool(ctx.attr_int("largest", 1))


def topk_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Positions along `axis` in TopK's order: by value, ties by the lower position."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    flipped = np.flip(x, axis)
    return n - 1 - np.flip(np.argsort(flipped, axis=axis, kind="stable"), axis)


def _topk_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    axis, k, largest = topk_facts(ctx)
    x = np.asarray(xs[0])
    order = np.take(topk_order(x, axis, largest), np.arange(k), axis=axis)
    return np.take_along_axis(x, order, axis=axis), order.astype(np.int64)


def _topk_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """TopK-1 had k as an attribute: it becomes a constant input."""
    node = ctx.node
    if since >= 10:
        return Rewrite((node,))
    name = ctx.fresh("k")
    attrs = {k: v for k, v in node.attrs.items() if k != "k"}
    new = Node(node.name, "TopK", (node.inputs[0], name), node.outputs, attrs)
    return Rewrite((new,), {name: np.array([ctx.attr_int("k")], dtype=np.int64)})


@register(
    "TopK",
    OpKind.REDUCTION,
    evaluate=_topk_evaluate,
    canonicalize=_topk_canonicalize,
    params=(1,),
)
def _topk(ctx: InferContext) -> tuple[TensorType, ...]:
    axis, k, _ = topk_facts(ctx)
    if ctx.dtype(0) == "bool":
        raise ctx.unsupported("TopK of a bool tensor is not supported")
    shape = list(ctx.shape(0))
    shape[axis] = k
    return TensorType(tuple(shape), ctx.dtype(0)), TensorType(tuple(shape), "int64")


# --- Trilu, EyeLike, NonZero --------------------------------------------------------------


def trilu_k(ctx: InferContext) -> int:
    if not ctx.has_input(1):
        return 0
    value = np.asarray(ctx.const(1, "k"))
    if value.size != 1:
        raise ctx.error(f"k must hold one value, got shape {list(value.shape)}")
    return int(value.reshape(-1)[0])


def _trilu_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    k = trilu_k(ctx)
    x = np.asarray(xs[0])
    return ((np.triu(x, k) if ctx.attr_int("upper", 1) else np.tril(x, k)).astype(x.dtype),)


@register("Trilu", OpKind.INJECTIVE, evaluate=_trilu_evaluate, params=(1,))
def _trilu(ctx: InferContext) -> tuple[TensorType, ...]:
    if len(ctx.shape(0)) < 2:
        raise ctx.error(f"input must have rank at least 2, got shape {list(ctx.shape(0))}")
    trilu_k(ctx)
    return (ctx.type(0),)


def eyelike_dtype(ctx: InferContext) -> str:
    code = ctx.attr("dtype")
    if code is None:
        return ctx.dtype(0)
    try:
        return onnx_to_dtype(int(code), "attribute 'dtype'")
    except UnsupportedOpError as exc:
        raise ctx.unsupported(str(exc)) from None


def _eyelike_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    rows, cols = ctx.shape(0)
    return (np.eye(rows, cols, ctx.attr_int("k", 0), dtype=eyelike_dtype(ctx)),)


@register("EyeLike", OpKind.INJECTIVE, evaluate=_eyelike_evaluate, needs_values=False)
def _eyelike(ctx: InferContext) -> tuple[TensorType, ...]:
    """Its output depends on the input's shape only: folded to a constant when small."""
    if len(ctx.shape(0)) != 2:
        raise ctx.error(f"input must be 2-D, got shape {list(ctx.shape(0))}")
    return (TensorType(ctx.shape(0), eyelike_dtype(ctx)),)


def _nonzero_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x = np.asarray(xs[0])
    return (np.array(np.nonzero(x.reshape(1) if x.ndim == 0 else x), dtype=np.int64),)


@register("NonZero", OpKind.INJECTIVE, evaluate=_nonzero_evaluate, params=(0,))
def _nonzero(ctx: InferContext) -> tuple[TensorType, ...]:
    value = ctx.value(0)
    if value is None:
        raise ctx.unsupported(
            f"the output shape of NonZero depends on the values of its input "
            f"'{ctx.node.inputs[0]}', which are known only at run time (polytile compiles "
            f"static shapes; NonZero is supported where its input is a compile-time constant)"
        )
    count = int(np.count_nonzero(value))
    return (TensorType((max(np.ndim(value), 1), count), "int64"),)
