"""Neural-network ops: convolutions and their windows (shared with pooling in `pool`),
normalizations, softmax, and inference BatchNormalization (Gemm, MatMul and Einsum are in
`matmul`).

Canonical forms (what the importer hands to the passes and the poly layer):

- Conv and ConvTranspose spell out every window attribute: `kernel_shape`, `strides`,
  `dilations` and explicit `pads`. The deprecated `auto_pad` is resolved to pads exactly as
  onnx.shape_inference does; ConvTranspose's `output_shape` becomes pads plus
  `output_padding` (the ONNX spec's rule, which onnxruntime follows).
- AveragePool and MaxPool keep their attributes as written (auto_pad included): onnx's
  reference evaluator misreads asymmetric explicit 2-D MaxPool pads, so resolving SAME to
  pads would make exported graphs disagree with it. Later stages get every pool's explicit
  window from `pool_window`, as they get a convolution's from `conv_window` /
  `conv_transpose_window`: the window rules live here only.
- Softmax / LogSoftmax before opset 13 coerced the input to 2-D at `axis`; the canonical
  form is Reshape → Softmax(axis=-1) → Reshape.
- Optional outputs that are not requested (MaxPool's Indices, LayerNormalization's Mean /
  InvStdDev, BatchNormalization's training statistics) are dropped; requesting them is
  unsupported.

Conv and pooling fold through onnx's reference evaluator; cheap ops have a numpy `evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..graph import FLOAT_DTYPES, Node, TensorType
from .base import EvalFn, InferContext, OpKind, Rewrite, register

FLOATS = FLOAT_DTYPES
POOL8_DTYPES = FLOAT_DTYPES | {"int8", "uint8"}
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# --- shared helpers ----------------------------------------------------------------------


def same_dtype(ctx: InferContext, index: int, what: str) -> None:
    """Input `index`, if given, has input 0's dtype."""
    if ctx.has_input(index) and ctx.dtype(index) != ctx.dtype(0):
        raise ctx.error(
            f"{what} (input {index}) has dtype {ctx.dtype(index)}, but X has {ctx.dtype(0)}"
        )


def _require_outputs(ctx: InferContext, keep: int, what: str) -> None:
    """Outputs past the first `keep` are optional; requesting one is unsupported."""
    extra = [o for o in ctx.node.outputs[keep:] if o]
    if extra:
        raise ctx.unsupported(f"output(s) {', '.join(extra)} ({what}) are not supported")


def _rewrite_outputs(ctx: InferContext, keep: int, what: str, **attrs: object) -> Rewrite:
    """The node with its unused optional outputs dropped and some attributes replaced
    (an attribute given as None is removed)."""
    _require_outputs(ctx, keep, what)
    node = ctx.node
    new_attrs = dict(node.attrs)
    for name, value in attrs.items():
        if value is None:
            new_attrs.pop(name, None)
        else:
            new_attrs[name] = value
    new = Node(node.name, node.op_type, node.inputs, node.outputs[:keep], new_attrs, node.domain)
    return Rewrite((new,))


def _channel_vector(ctx: InferContext, index: int, channels: int, what: str) -> None:
    """Input `index` (a per-channel parameter) has shape (channels,) and a float dtype."""
    t = ctx.type(index)
    if t.shape != (channels,):
        raise ctx.error(
            f"{what} (input {index}) has shape {list(t.shape)}, expected [{channels}] "
            f"(one value per channel)"
        )
    if t.dtype not in FLOATS:
        raise ctx.error(f"{what} (input {index}) has dtype {t.dtype}, expected a float dtype")


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """ONNX unidirectional broadcasting: `shape` stretches to `target`."""
    if len(shape) > len(target):
        return False
    tail = target[len(target) - len(shape) :]
    return all(d in (1, t) for d, t in zip(shape, tail, strict=True))


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel vector along axis 1 of `x`."""
    return (1, -1) + (1,) * (x.ndim - 2)


# --- convolution and pooling windows -------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A resolved sliding window: everything explicit, pads as ONNX orders them
    (all begins, then all ends)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    out: tuple[int, ...]
    #: ConvTranspose only: extra output elements at the end of each spatial axis
    output_padding: tuple[int, ...] = ()

    def attrs(self) -> dict[str, tuple[int, ...]]:
        attrs = {
            "kernel_shape": self.kernel,
            "strides": self.strides,
            "dilations": self.dilations,
            "pads": self.pads,
        }
        if self.output_padding:
            attrs["output_padding"] = self.output_padding
        return attrs


def _spatial_attr(ctx: InferContext, name: str, n: int, default: int) -> tuple[int, ...]:
    value = ctx.attr_ints(name)
    if value is None:
        return (default,) * n
    if len(value) != n:
        raise ctx.error(
            f"attribute '{name}' has {len(value)} values, expected {n} (one per spatial axis)"
        )
    return value


def _positive_attr(ctx: InferContext, name: str, n: int) -> tuple[int, ...]:
    value = _spatial_attr(ctx, name, n, 1)
    if any(v <= 0 for v in value):
        raise ctx.error(f"attribute '{name}' {list(value)} must be positive")
    return value


def _auto_pad(ctx: InferContext) -> str:
    return ctx.attr_choice("auto_pad", "NOTSET", AUTO_PADS)


def _pads_attr(ctx: InferContext, n: int, auto_pad: str) -> tuple[int, ...] | None:
    pads = ctx.attr_ints("pads")
    if pads is None:
        return None
    if len(pads) != 2 * n:
        raise ctx.error(
            f"attribute 'pads' has {len(pads)} values, expected {2 * n} (begin and end "
            f"of each spatial axis)"
        )
    if any(p < 0 for p in pads):
        raise ctx.error(f"attribute 'pads' {list(pads)} must not be negative")
    if auto_pad != "NOTSET" and any(pads):
        raise ctx.error(f"attributes pads={list(pads)} and auto_pad='{auto_pad}' are exclusive")
    return pads


def _split_pad(total: int, upper: bool) -> tuple[int, int]:
    """SAME_UPPER puts the odd element at the end, SAME_LOWER at the beginning."""
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def _window(
    ctx: InferContext,
    spatial: Sequence[int],
    kernel: Sequence[int],
    ceil_mode: bool = False,
) -> Window:
    """Output size of a Conv / pooling window, by onnx.shape_inference's rules."""
    n = len(spatial)
    kernel = tuple(kernel)
    if len(kernel) != n:
        raise ctx.error(
            f"kernel_shape {list(kernel)} has {len(kernel)} values, expected {n} "
            f"(one per spatial axis)"
        )
    if any(k <= 0 for k in kernel):
        raise ctx.error(f"kernel_shape {list(kernel)} must be positive")
    strides = _positive_attr(ctx, "strides", n)
    dilations = _positive_attr(ctx, "dilations", n)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    auto_pad = _auto_pad(ctx)
    pads = _pads_attr(ctx, n, auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        split = []
        for size, extent, stride in zip(spatial, extents, strides, strict=True):
            residual = size % stride
            total = max(extent - (residual or stride), 0)
            split.append(_split_pad(total, auto_pad == "SAME_UPPER"))
        pads = tuple(b for b, _ in split) + tuple(e for _, e in split)
    elif pads is None or auto_pad == "VALID":
        pads = (0,) * (2 * n)
    out = []
    for i, (size, extent, stride) in enumerate(zip(spatial, extents, strides, strict=True)):
        begin, end = pads[i], pads[i + n]
        span = size + begin + end - extent
        if ceil_mode:
            span += stride - 1  # the last window may hang over the end
        size_out = span // stride + 1
        if ceil_mode and (size_out - 1) * stride >= size + begin:
            size_out -= 1  # a window may not start in the end padding
        if size_out <= 0:
            raise ctx.error(
                f"the window (extent {extent}) is larger than the padded input "
                f"({size + begin + end}) on spatial axis {i}"
            )
        out.append(size_out)
    return Window(kernel, strides, dilations, pads, tuple(out))


def _transpose_window(ctx: InferContext, spatial: Sequence[int], kernel: Sequence[int]) -> Window:
    """ConvTranspose's output size; `output_shape` and SAME padding become explicit pads
    and output_padding (a negative total padding extends the end: output_padding)."""
    n = len(spatial)
    kernel = tuple(kernel)
    strides = _positive_attr(ctx, "strides", n)
    dilations = _positive_attr(ctx, "dilations", n)
    output_padding = list(_spatial_attr(ctx, "output_padding", n, 0))
    if any(p < 0 for p in output_padding):
        raise ctx.error(f"attribute 'output_padding' {output_padding} must not be negative")
    auto_pad = _auto_pad(ctx)
    pads = _pads_attr(ctx, n, auto_pad)
    natural = [
        s * (size - 1) + p + (k - 1) * d + 1
        for size, s, p, k, d in zip(
            spatial, strides, output_padding, kernel, dilations, strict=True
        )
    ]
    target = ctx.attr_ints("output_shape")
    extend = True  # an explicit output_shape larger than the natural size extends it
    if target is not None:
        if len(target) == n + 2:  # some exporters give the full shape
            target = target[2:]
        if len(target) != n or any(t <= 0 for t in target):
            raise ctx.error(
                f"attribute output_shape {list(target)} must have {n} positive values "
                f"(one per spatial axis)"
            )
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # input * stride, cropped from the natural size (never extended), as onnxruntime
        target = tuple(size * s for size, s in zip(spatial, strides, strict=True))
        extend = False
    if target is None:
        if pads is None or auto_pad == "VALID":
            pads = (0,) * (2 * n)
    else:
        split = []
        for i in range(n):
            total = natural[i] - target[i]
            if total < 0 and extend:
                output_padding[i] -= total
                natural[i] -= total
            split.append(_split_pad(max(total, 0), auto_pad == "SAME_UPPER"))
        pads = tuple(b for b, _ in split) + tuple(e for _, e in split)
    out = tuple(natural[i] - pads[i] - pads[i + n] for i in range(n))
    if any(o <= 0 for o in out):
        raise ctx.error(f"the output spatial shape {list(out)} is not positive")
    return Window(kernel, strides, dilations, pads, out, tuple(output_padding))


def _conv_operands(ctx: InferContext) -> tuple[TensorType, TensorType, int]:
    x, w = ctx.type(0), ctx.type(1)
    if x.rank < 3:
        raise ctx.error(f"X has shape {list(x.shape)}; expected rank >= 3 (N, C, spatial...)")
    if w.rank != x.rank:
        raise ctx.error(f"W has shape {list(w.shape)}; expected rank {x.rank} like X")
    same_dtype(ctx, 1, "W")
    group = ctx.attr_int("group", 1)
    if group <= 0:
        raise ctx.error(f"attribute group={group} must be positive")
    kernel = ctx.attr_ints("kernel_shape")
    if kernel is not None and tuple(kernel) != w.shape[2:]:
        raise ctx.error(
            f"attribute kernel_shape {list(kernel)} does not match W's spatial shape "
            f"{list(w.shape[2:])}"
        )
    return x, w, group


def _bias(ctx: InferContext, channels: int) -> None:
    if ctx.has_input(2):
        same_dtype(ctx, 2, "B")
        if ctx.shape(2) != (channels,):
            raise ctx.error(
                f"B has shape {list(ctx.shape(2))}, expected [{channels}] (one per output channel)"
            )


def conv_window(ctx: InferContext) -> tuple[TensorType, Window]:
    """A Conv node's output type and resolved window (errors name the node)."""
    x, w, group = _conv_operands(ctx)
    channels, out_channels = x.shape[1], w.shape[0]
    if channels != w.shape[1] * group:
        raise ctx.error(
            f"X has {channels} channels but W {list(w.shape)} with group={group} expects "
            f"{w.shape[1] * group} (C must equal W.shape[1] * group)"
        )
    if out_channels % group:
        raise ctx.error(f"W has {out_channels} output channels, not divisible by group={group}")
    _bias(ctx, out_channels)
    window = _window(ctx, x.shape[2:], w.shape[2:])
    return TensorType((x.shape[0], out_channels, *window.out), x.dtype), window


def _conv_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    _, window = conv_window(ctx)
    return _rewrite_outputs(ctx, 1, "no such output", auto_pad=None, **window.attrs())


@register("Conv", OpKind.ANCHOR, canonicalize=_conv_canonicalize, dtypes=FLOATS)
def _conv(ctx: InferContext) -> tuple[TensorType, ...]:
    return (conv_window(ctx)[0],)


def conv_transpose_window(ctx: InferContext) -> tuple[TensorType, Window]:
    """A ConvTranspose node's output type and resolved window."""
    x, w, group = _conv_operands(ctx)
    channels = x.shape[1]
    if channels != w.shape[0]:
        raise ctx.error(
            f"X has {channels} channels but W {list(w.shape)} expects {w.shape[0]} "
            f"(C must equal W.shape[0])"
        )
    if channels % group:
        raise ctx.error(f"X has {channels} channels, not divisible by group={group}")
    out_channels = w.shape[1] * group
    _bias(ctx, out_channels)
    window = _transpose_window(ctx, x.shape[2:], w.shape[2:])
    return TensorType((x.shape[0], out_channels, *window.out), x.dtype), window


def _conv_transpose_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    _, window = conv_transpose_window(ctx)
    return _rewrite_outputs(
        ctx, 1, "no such output", auto_pad=None, output_shape=None, **window.attrs()
    )


@register("ConvTranspose", OpKind.ANCHOR, canonicalize=_conv_transpose_canonicalize, dtypes=FLOATS)
def _conv_transpose(ctx: InferContext) -> tuple[TensorType, ...]:
    return (conv_transpose_window(ctx)[0],)


def _flag(ctx: InferContext, name: str) -> bool:
    value = ctx.attr_int(name, 0)
    if value not in (0, 1):
        raise ctx.error(f"attribute {name}={value} must be 0 or 1")
    return bool(value)


# --- normalizations ------------------------------------------------------------------------


@register("InstanceNormalization", OpKind.ANCHOR, dtypes=FLOATS)
def _instance_norm(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 3:
        raise ctx.error(f"input has shape {list(x.shape)}; expected rank >= 3 (N, C, spatial...)")
    for index, what in ((1, "scale"), (2, "B")):
        _channel_vector(ctx, index, x.shape[1], what)
        same_dtype(ctx, index, what)
    return (x,)


def _layer_norm_check(ctx: InferContext) -> None:
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("X must have rank >= 1")
    ctx.axis(ctx.attr_int("axis", -1), x.rank)
    stash = ctx.attr_int("stash_type", 1)
    if stash != 1:
        raise ctx.unsupported(f"stash_type={stash} (only float32 statistics are supported)")
    for index, what in ((1, "Scale"), (2, "B")):
        if not ctx.has_input(index):
            if index == 1:
                raise ctx.error("input 1 (Scale) is required")
            continue
        same_dtype(ctx, index, what)
        shape = ctx.shape(index)
        if not broadcasts_to(shape, x.shape):
            raise ctx.error(
                f"{what} has shape {list(shape)}, which does not broadcast to X {list(x.shape)}"
            )


@register("LayerNormalization", OpKind.ANCHOR, dtypes=FLOATS)
def _layer_norm(ctx: InferContext) -> tuple[TensorType, ...]:
    """Y, and the optional Mean and InvStdDev: float32 (stash_type 1), X's shape with the
    normalized axes kept as 1."""
    _layer_norm_check(ctx)
    x = ctx.type(0)
    axis = ctx.axis(ctx.attr_int("axis", -1), x.rank)
    stats = TensorType(x.shape[:axis] + (1,) * (x.rank - axis), "float32")
    return (x, stats, stats)


@register("LRN", OpKind.ANCHOR, dtypes=FLOATS)
def _lrn(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 3:
        raise ctx.error(f"X has shape {list(x.shape)}; expected rank >= 3 (N, C, spatial...)")
    size = ctx.attr_int("size")
    if size <= 0:
        raise ctx.error(f"attribute size={size} must be positive")
    return (x,)


def _batch_norm_check(ctx: InferContext) -> None:
    x = ctx.type(0)
    if x.rank < 2:
        raise ctx.error(f"X has shape {list(x.shape)}; expected rank >= 2 (N, C, ...)")
    # training_mode=1 normalizes by the batch's own statistics: where X is a constant (the
    # weight standardization of BiT / NFNet convs) folding computes it; on a run-time X
    # the lowering refuses it
    _require_outputs(ctx, 1, "training statistics")
    for index, what in ((1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")):
        _channel_vector(ctx, index, x.shape[1], what)


def _batch_norm_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """BatchNormalization-7 has `spatial`; a non-spatial BN (per-element statistics) is
    unsupported, a spatial one is the later versions' op. Training outputs are dropped."""
    per_element = any(ctx.has_input(i) and ctx.type(i).rank != 1 for i in (1, 2, 3, 4))
    if since < 9 and ctx.attr_int("spatial", 1) == 0 and per_element:
        raise ctx.unsupported("spatial=0 with per-element statistics is not supported")
    _batch_norm_check(ctx)
    return _rewrite_outputs(ctx, 1, "training statistics", spatial=None)


def _batch_norm_evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
    x, scale, bias, mean, var = xs[:5]
    shape = _channel_shape(x)
    eps = ctx.attr_float("epsilon", 1e-5)
    calc = np.float64 if x.dtype == np.float64 else np.float32
    if ctx.attr_int("training_mode", 0):  # the batch's statistics (variance: population)
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean, var = x.astype(calc).mean(axis=axes), x.astype(calc).var(axis=axes)
    y = (x.astype(calc) - mean.reshape(shape)) / np.sqrt(var.reshape(shape).astype(calc) + eps)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    return (y.astype(x.dtype),)


@register(
    "BatchNormalization",
    OpKind.ELEMENTWISE,
    evaluate=_batch_norm_evaluate,
    canonicalize=_batch_norm_canonicalize,
    dtypes=FLOATS,
)
def _batch_norm(ctx: InferContext) -> tuple[TensorType, ...]:
    _batch_norm_check(ctx)
    return (ctx.type(0),)


# --- softmax ---------------------------------------------------------------------------------


def _softmax_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """Before opset 13, (Log)Softmax flattens the input to 2-D at `axis` (default 1) and
    normalizes each row; from 13 it normalizes along the one axis (default -1)."""
    node = ctx.node
    if since >= 13:
        return Rewrite((node,))
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input must have rank >= 1")
    axis = ctx.axis(ctx.attr_int("axis", 1), x.rank)
    attrs = {**node.attrs, "axis": -1}
    if axis == x.rank - 1:
        return Rewrite((Node(node.name, node.op_type, node.inputs, node.outputs, attrs),))
    rows, cols = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    zero = 0 in x.shape  # Reshape reads a 0 as "copy the input's dim" unless allowzero
    reshape_attrs = {"allowzero": 1} if zero else {}
    flat_shape, out_shape = ctx.fresh("flat_shape"), ctx.fresh("shape")
    flat, normalized = ctx.fresh("flat"), ctx.fresh("normalized")
    nodes = (
        Node(ctx.fresh("flatten"), "Reshape", (node.inputs[0], flat_shape), (flat,), reshape_attrs),
        Node(node.name, node.op_type, (flat,), (normalized,), attrs),
        Node(
            ctx.fresh("unflatten"),
            "Reshape",
            (normalized, out_shape),
            node.outputs[:1],
            reshape_attrs,
        ),
    )
    constants = {
        flat_shape: np.array([rows, cols], dtype=np.int64),
        out_shape: np.array(x.shape, dtype=np.int64),
    }
    return Rewrite(nodes, constants)


def _softmax_infer(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    if x.rank < 1:
        raise ctx.error("input must have rank >= 1")
    ctx.axis(ctx.attr_int("axis", -1), x.rank)
    return (x,)


def _softmax_evaluate(log: bool) -> EvalFn:
    def evaluate(ctx: InferContext, xs: Sequence[np.ndarray]) -> tuple[np.ndarray]:
        x = xs[0]
        axis = ctx.axis(ctx.attr_int("axis", -1), x.ndim)
        calc = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
        shifted = calc - np.max(calc, axis=axis, keepdims=True)
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        y = shifted - np.log(total) if log else np.exp(shifted) / total
        return (y.astype(x.dtype),)

    return evaluate


for _op, _log in (("Softmax", False), ("LogSoftmax", True)):
    register(
        _op,
        OpKind.ANCHOR,
        evaluate=_softmax_evaluate(_log),
        canonicalize=_softmax_canonicalize,
        dtypes=FLOATS,
    )(_softmax_infer)
