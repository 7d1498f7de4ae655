"""Resize: shape inference and canonicalization (the compute definition is
`poly.lower.resize`; constant inputs fold through onnx's reference evaluator).

Canonical Resize is opset 19's (X, roi, scales, sizes) with its attributes; antialias=1
is kept (linear and cubic filters widened when downsampling), refused with 'nearest',
where it has no meaning.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import FLOAT_DTYPES, Node, TensorType
from .base import InferContext, OpKind, Rewrite, register
from .tensor import _normalize_axes, _vector

RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _empty(ctx: InferContext, index: int) -> bool:
    """An omitted input, or a constant with no elements (how Resize-11 omits one)."""
    value = ctx.value(index)
    return not ctx.has_input(index) or (value is not None and np.asarray(value).size == 0)


def _resize_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Canonical Resize is opset 19's (X, roi, scales, sizes). Resize-10 (X, scales) maps
    source coordinates as x / scale ('asymmetric'); its nearest mode rounds down when an
    axis is upsampled and up when it is downsampled (onnxruntime's reading, the reference
    evaluator has no Resize-10). Resize-11/13's 'tf_half_pixel_for_nn' becomes half_pixel
    with the equivalent rounding. Omitted (empty) roi / scales become ''."""
    node = ctx.node
    if since == 10:
        return _resize10(ctx)
    attrs = dict(node.attrs)
    inputs = list(node.inputs) + [""] * (4 - len(node.inputs))
    if attrs.get("coordinate_transformation_mode") == "tf_half_pixel_for_nn":
        mode = attrs.get("mode", "nearest")
        rounding = attrs.get("nearest_mode", "round_prefer_floor")
        equivalent = {"floor": "round_prefer_ceil", "round_prefer_floor": "ceil"}
        if mode != "nearest" or rounding not in equivalent:
            raise ctx.unsupported(
                f"coordinate_transformation_mode 'tf_half_pixel_for_nn' with mode '{mode}' "
                f"and nearest_mode '{rounding}' has no opset-19 equivalent"
            )
        attrs["coordinate_transformation_mode"] = "half_pixel"
        attrs["nearest_mode"] = equivalent[rounding]
    if attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize" or _empty(ctx, 1):
        inputs[1] = ""
    if _empty(ctx, 2):
        inputs[2] = ""
    if _empty(ctx, 3):
        inputs[3] = ""
    while inputs and not inputs[-1]:
        inputs.pop()
    if tuple(inputs) == node.inputs and attrs == dict(node.attrs):
        return Rewrite((node,))
    return Rewrite((Node(node.name, "Resize", tuple(inputs), node.outputs, attrs),))


def _resize10(ctx: InferContext) -> Rewrite:
    node = ctx.node
    mode = ctx.attr_str("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise ctx.error(f"attribute mode='{mode}' is not 'nearest' or 'linear'")
    attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    x, scales_name = node.inputs[0], node.inputs[1]
    if mode == "linear":
        return Rewrite((Node(node.name, "Resize", (x, "", scales_name), node.outputs, attrs),))
    scales = np.asarray(ctx.const(1, "scales"), dtype=np.float32).reshape(-1)
    down = [a for a, s in enumerate(scales) if s < 1]
    up = [a for a, s in enumerate(scales) if s > 1]
    if not (down and up):
        attrs["nearest_mode"] = "ceil" if down else "floor"
        return Rewrite((Node(node.name, "Resize", (x, "", scales_name), node.outputs, attrs),))
    # nearest rounds per axis; two Resize nodes (separable) give each axis its own rounding
    consts = {}
    nodes = []
    source = x
    for axes, rounding, last in ((down, "ceil", False), (up, "floor", True)):
        name = ctx.fresh(f"scales_{rounding}")
        consts[name] = scales[axes]
        out = node.outputs[0] if last else ctx.fresh("downsampled")
        step = dict(attrs, nearest_mode=rounding, axes=tuple(axes))
        nodes.append(
            Node(
                node.name if last else ctx.fresh("resize"),
                "Resize",
                (source, "", name),
                (out,),
                step,
            )
        )
        source = out
    return Rewrite(tuple(nodes), consts)


def _resize_shape(ctx: InferContext) -> tuple[int, ...]:
    shape = ctx.shape(0)
    rank = len(shape)
    mode = ctx.attr_choice("mode", "nearest", RESIZE_MODES)
    coordinates = ctx.attr_choice(
        "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES, supported=False
    )
    ctx.attr_choice("nearest_mode", "round_prefer_floor", NEAREST_MODES)
    policy = ctx.attr_choice("keep_aspect_ratio_policy", "stretch", ASPECT_POLICIES)
    antialias = ctx.attr_int("antialias", 0)
    if antialias not in (0, 1):
        raise ctx.error(f"attribute antialias={antialias} must be 0 or 1")
    if antialias and mode == "nearest":
        raise ctx.unsupported("antialias=1 with mode 'nearest' (linear and cubic only)")
    raw_axes = ctx.attr_ints("axes")
    axes = _normalize_axes(ctx, raw_axes, rank) if raw_axes is not None else tuple(range(rank))
    if coordinates == "tf_crop_and_resize":
        if _empty(ctx, 1):
            raise ctx.error("coordinate_transformation_mode 'tf_crop_and_resize' needs a roi")
        roi = np.asarray(ctx.const(1, "roi")).reshape(-1)
        if roi.size != 2 * len(axes):
            raise ctx.error(f"roi has {roi.size} values, expected 2 × {len(axes)}")
    has_scales, has_sizes = not _empty(ctx, 2), not _empty(ctx, 3)
    if has_scales == has_sizes:
        raise ctx.error("exactly one of the scales and sizes inputs must be given")
    out = list(shape)
    if has_scales:
        scales = np.asarray(ctx.const(2, "scales")).reshape(-1)
        if scales.size != len(axes) or np.any(scales <= 0):
            raise ctx.error(f"scales {scales.tolist()} must be {len(axes)} positive factors")
        for axis, scale in zip(axes, scales, strict=True):
            out[axis] = math.floor(float(scale) * shape[axis])
        return tuple(out)
    sizes = _vector(ctx, 3, "sizes")
    if len(sizes) != len(axes) or any(s <= 0 for s in sizes):
        raise ctx.error(f"sizes {list(sizes)} must be {len(axes)} positive sizes")
    if policy == "stretch":
        for axis, size in zip(axes, sizes, strict=True):
            out[axis] = size
        return tuple(out)
    ratios = [size / shape[axis] for axis, size in zip(axes, sizes, strict=True)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    for axis in axes:
        out[axis] = int(scale * shape[axis] + 0.5)
    return tuple(out)


@register(
    "Resize",
    OpKind.INJECTIVE,
    canonicalize=_resize_canonicalize,
    dtypes=FLOAT_DTYPES | {"int8", "uint8", "int16", "int32", "int64"},
    params=(1, 2, 3),
)
def _resize(ctx: InferContext) -> tuple[TensorType, ...]:
    return (TensorType(_resize_shape(ctx), ctx.dtype(0)),)
