"""Transformer ops of opset 23: RotaryEmbedding and Attention.

RotaryEmbedding has its own compute definition (`poly.lower.rotary`); its canonical form
has no `position_ids`: the cache rows are gathered first (Gather, whose run-time indices
the compiled model checks), so the caches it reads are (batch, sequence, rotary_dim / 2).

Attention is canonicalized into the subgraph PyTorch exports for attention (MatMul,
Softmax, MatMul), which the partitioner fuses like any other: Q and K scaled by
sqrt(scale) (the spec's order, against overflow), K transposed,
Q·Kᵀ, softcap (Div, Tanh, Mul), the additive bias (the mask, a bool mask as 0 / -inf,
padded with -inf to the keys; the causal and window frontiers as constants), Softmax,
the fully-masked-row guard (Where; only where a row can be fully masked), ·V. Grouped-
query heads are not repeated: Q is reshaped to (batch, kv_heads, group, seq, head) and
K / V broadcast over the group axis in the MatMuls. past_key / past_value are
concatenated in front of K / V (giving present_key / present_value);
qk_matmul_output is the scores at the stage `qk_matmul_output_mode` names (0: Q·Kᵀ
scaled, 1: after softcap, 2: plus the bias, 3: the softmax). Opset 24's
`nonpad_kv_seqlen` masks the keys at and after each batch's valid length, as part of the
additive bias (`_nonpad_bias`).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import FLOAT_DTYPES, Node, TensorType
from .base import InferContext, OpKind, Rewrite, register

FLOATS = FLOAT_DTYPES
#: `softmax_precision` (an ONNX element type) → dtype
PRECISIONS = {1: "float32", 10: "float16", 11: "float64"}


# --- RotaryEmbedding ------------------------------------------------------------------------


def rotary_facts(ctx: InferContext) -> tuple[int, int, int]:
    """(num_heads, head_size, rotary_dim) of a RotaryEmbedding node, checked."""
    x = ctx.type(0)
    if x.rank == 4:
        heads, head = x.shape[1], x.shape[3]
    elif x.rank == 3:
        heads = ctx.attr_int("num_heads", 0)
        if heads <= 0 or x.shape[2] % heads:
            raise ctx.error(
                f"3-D input {list(x.shape)} needs attribute num_heads dividing its hidden "
                f"size {x.shape[2]} (got num_heads={heads})"
            )
        head = x.shape[2] // heads
    else:
        raise ctx.error(f"input has shape {list(x.shape)}; expected rank 3 or 4")
    rotary = ctx.attr_int("rotary_embedding_dim", 0) or head
    if rotary % 2 or rotary > head:
        raise ctx.error(
            f"rotary_embedding_dim={rotary} must be even and at most the head size {head}"
        )
    if ctx.attr_int("interleaved", 0) not in (0, 1):
        raise ctx.error("attribute interleaved must be 0 or 1")
    return heads, head, rotary


def _rotary_layout(ctx: InferContext) -> tuple[int, int]:
    """(batch, sequence) of the input."""
    x = ctx.type(0)
    return (x.shape[0], x.shape[2]) if x.rank == 4 else (x.shape[0], x.shape[1])


def _rotary_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    """position_ids given: the caches' rows gathered into (batch, seq, rotary_dim / 2)."""
    node = ctx.node
    if not ctx.has_input(3):
        return Rewrite((Node(node.name, node.op_type, node.inputs[:3], node.outputs, node.attrs),))
    ids = ctx.type(3)
    if ids.dtype != "int64" or ids.shape != _rotary_layout(ctx):
        raise ctx.error(
            f"position_ids (input 3) is {ids}; expected int64 of shape "
            f"{list(_rotary_layout(ctx))} (batch, sequence)"
        )
    gathered = []
    nodes = []
    for index, what in ((1, "cos"), (2, "sin")):
        if ctx.type(index).rank != 2:
            raise ctx.error(
                f"{what}_cache (input {index}) has shape {list(ctx.shape(index))}; with "
                f"position_ids it must be 2-D (max_position + 1, rotary_dim / 2)"
            )
        out = ctx.fresh(f"{what}_rows")
        nodes.append(
            Node(
                ctx.fresh(f"gather_{what}"), "Gather", (node.inputs[index], node.inputs[3]), (out,)
            )
        )
        gathered.append(out)
    inputs = (node.inputs[0], *gathered)
    return Rewrite((*nodes, Node(node.name, node.op_type, inputs, node.outputs, node.attrs)))


@register("RotaryEmbedding", OpKind.ANCHOR, canonicalize=_rotary_canonicalize, dtypes=FLOATS)
def _rotary(ctx: InferContext) -> tuple[TensorType, ...]:
    x = ctx.type(0)
    _, _, rotary = rotary_facts(ctx)
    want = (*_rotary_layout(ctx), rotary // 2)
    for index, what in ((1, "cos_cache"), (2, "sin_cache")):
        t = ctx.type(index)
        if t.shape != want or t.dtype != x.dtype:
            raise ctx.error(
                f"{what} (input {index}) is {t}; expected {x.dtype} of shape {list(want)}"
            )
    return (x,)


# --- Attention ------------------------------------------------------------------------------


class _Subgraph:
    """Nodes and constants of a canonicalization, with fresh names."""

    def __init__(self, ctx: InferContext) -> None:
        self.ctx = ctx
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.ctx.fresh(base)
        self.constants[name] = value
        return name

    def ints(self, base: str, values: tuple[int, ...] | list[int]) -> str:
        return self.const(base, np.array(values, np.int64))

    def op(
        self, op_type: str, inputs: tuple[str, ...], out: str | None = None, **attrs: object
    ) -> str:
        out = out or self.ctx.fresh(op_type.lower())
        self.nodes.append(Node(self.ctx.fresh(op_type.lower()), op_type, inputs, (out,), attrs))
        return out


def _attention_check(ctx: InferContext) -> tuple[int, int, int, int]:
    """(q_heads, kv_heads, head_size, v_head_size), checked."""
    q, k, v = ctx.type(0), ctx.type(1), ctx.type(2)
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise ctx.error(f"Q, K and V must all be 3-D or all 4-D, got {q}, {k}, {v}")
    for index in (4, 5):
        if ctx.has_input(index) != ctx.has_input(9 - index):
            raise ctx.error("past_key and past_value must be given together")
    if ctx.has_input(6):
        lengths = ctx.type(6)
        if lengths.dtype != "int64" or lengths.shape != (q.shape[0],):
            raise ctx.error(
                f"nonpad_kv_seqlen (input 6) is {lengths}; expected int64 of shape "
                f"[{q.shape[0]}] (one length per batch)"
            )
        if ctx.has_input(4):
            raise ctx.error("nonpad_kv_seqlen (input 6) cannot be combined with past_key")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ctx.unsupported(
            f"Q, K and V have dtypes {q.dtype}, {k.dtype}, {v.dtype}; only equal ones are supported"
        )
    if q.rank == 3:
        hq, hkv = ctx.attr_int("q_num_heads", 0), ctx.attr_int("kv_num_heads", 0)
        if hq <= 0 or hkv <= 0:
            raise ctx.error("3-D Q, K, V need attributes q_num_heads and kv_num_heads")
        for t, heads, what in ((q, hq, "Q"), (k, hkv, "K"), (v, hkv, "V")):
            if t.shape[2] % heads:
                raise ctx.error(f"{what}'s hidden size {t.shape[2]} is not divisible by {heads}")
        dq, dk, dv = q.shape[2] // hq, k.shape[2] // hkv, v.shape[2] // hkv
        batch = {q.shape[0], k.shape[0], v.shape[0]}
        kv_len = {k.shape[1], v.shape[1]}
    else:
        hq, hkv, dq, dk, dv = q.shape[1], k.shape[1], q.shape[3], k.shape[3], v.shape[3]
        if v.shape[1] != hkv:
            raise ctx.error(f"K has {hkv} heads but V has {v.shape[1]}")
        batch = {q.shape[0], k.shape[0], v.shape[0]}
        kv_len = {k.shape[2], v.shape[2]}
    if len(batch) != 1 or len(kv_len) != 1 or dq != dk:
        raise ctx.error(f"Q, K and V do not agree in batch, key length or head size: {q}, {k}, {v}")
    if hq % hkv:
        raise ctx.error(f"q heads {hq} are not a multiple of kv heads {hkv}")
    mode = ctx.attr_int("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise ctx.error(f"attribute qk_matmul_output_mode={mode} must be 0, 1, 2 or 3")
    precision = ctx.attr_int("softmax_precision", 0)
    if precision and precision not in PRECISIONS:
        raise ctx.unsupported(f"attribute softmax_precision={precision} is not supported")
    return hq, hkv, dq, dv


def _windowed(ctx: InferContext) -> bool:
    """Whether a causal or window frontier limits the keys of each query."""
    return bool(
        ctx.attr_int("is_causal", 0)
        or ctx.attr_int("left_window_size", -1) >= 0
        or ctx.attr_int("right_window_size", -1) >= 0
    )


def _nonpad_bias(g: _Subgraph, dtype: str, q_len: int, kv_len: int) -> str:
    """The run-time 0 / -inf bias of nonpad_kv_seqlen, (batch, 1, q_len or 1, kv_len): key
    j is padding iff j >= length[b]; query i sits at position length[b] - q_len + i, so
    causal allows j <= length[b] - q_len + i, i.e. j - i + q_len - 1 < length[b], and the
    windows bound length[b] - q_len + i - j by left and j - (length[b] - q_len + i) by
    right."""
    ctx = g.ctx
    batch = ctx.shape(0)[0]
    lengths = g.op("Reshape", (ctx.node.inputs[6], g.ints("lengths_shape", [batch, 1, 1, 1])))
    j = np.arange(kv_len, dtype=np.int64).reshape(1, 1, 1, kv_len)
    i = np.arange(q_len, dtype=np.int64).reshape(1, 1, q_len, 1)
    allowed = g.op("Less", (g.const("key_index", j), lengths))
    tests: list[tuple[np.ndarray, bool]] = []  # (table, table < length) else length < table
    if ctx.attr_int("is_causal", 0):
        tests.append((j - i + q_len - 1, True))
    left, right = ctx.attr_int("left_window_size", -1), ctx.attr_int("right_window_size", -1)
    if left >= 0:
        tests.append((j - i + q_len + left + 1, False))
    if right >= 0:
        tests.append((j - i + q_len - right - 1, True))
    for table, below in tests:
        bound = g.const("frontier_index", table)
        test = g.op("Less", (bound, lengths) if below else (lengths, bound))
        allowed = g.op("And", (allowed, test))
    zero, neg_inf = np.array(0.0, dtype), np.array(-np.inf, dtype)
    return g.op("Where", (allowed, g.const("zero", zero), g.const("neg_inf", neg_inf)))


def _frontier_bias(ctx: InferContext, q_len: int, kv_len: int, offset: int) -> np.ndarray | None:
    """The constant 0 / -inf bias of is_causal and the window attributes (opset 25), or
    None without either: query i (at position offset + i) attends key j iff
    j <= offset + i (causal) and offset + i - left <= j <= offset + i + right."""
    i = np.arange(q_len).reshape(-1, 1) + offset
    j = np.arange(kv_len).reshape(1, -1)
    allowed = np.ones((q_len, kv_len), bool)
    used = False
    if ctx.attr_int("is_causal", 0):
        allowed &= j <= i
        used = True
    left, right = ctx.attr_int("left_window_size", -1), ctx.attr_int("right_window_size", -1)
    if left >= 0:
        allowed &= i - j <= left
        used = True
    if right >= 0:
        allowed &= j - i <= right
        used = True
    return np.where(allowed, 0.0, -np.inf) if used else None


def _attention_canonicalize(ctx: InferContext, since: int) -> Rewrite:
    hq, hkv, dq, dv = _attention_check(ctx)
    node, g = ctx.node, _Subgraph(ctx)
    dtype = ctx.dtype(0)
    q, k, v = node.inputs[:3]
    q_type = ctx.type(0)
    batch = q_type.shape[0]
    three_d = q_type.rank == 3
    q_len = q_type.shape[1] if three_d else q_type.shape[2]
    scalar = lambda value, base: g.const(base, np.array(value, dtype))  # noqa: E731
    if three_d:
        heads_first = (0, 2, 1, 3)
        k_len = ctx.shape(1)[1]
        q = g.op(
            "Transpose",
            (g.op("Reshape", (q, g.ints("q_shape", [batch, q_len, hq, dq]))),),
            perm=heads_first,
        )
        k = g.op(
            "Transpose",
            (g.op("Reshape", (k, g.ints("k_shape", [batch, k_len, hkv, dq]))),),
            perm=heads_first,
        )
        v = g.op(
            "Transpose",
            (g.op("Reshape", (v, g.ints("v_shape", [batch, k_len, hkv, dv]))),),
            perm=heads_first,
        )
    outputs = list(node.outputs) + [""] * (4 - len(node.outputs))
    past = ctx.shape(4)[2] if ctx.has_input(4) else 0
    for index, name, out in ((4, "k", 1), (5, "v", 2)):
        current = k if name == "k" else v
        if ctx.has_input(index):
            current = g.op("Concat", (node.inputs[index], current), outputs[out] or None, axis=2)
        elif outputs[out]:
            g.op("Identity", (current,), outputs[out])
        if name == "k":
            k = current
        else:
            v = current
    kv_len = ctx.shape(1)[1 if three_d else 2] + past
    # 1/sqrt(head_size) only when `scale` is absent: an explicit 0 is uniform attention,
    # as onnx's reference computes it; Q and K each take sqrt(scale), as the spec says
    given = node.attrs.get("scale")
    scale = 1.0 / math.sqrt(dq) if given is None else float(given)  # type: ignore[arg-type]
    if scale < 0:
        raise ctx.unsupported(
            f"scale {scale:g} is negative: the spec scales Q and K by sqrt(scale) "
            "(onnxruntime refuses it, onnx's reference gives NaN)"
        )
    root = scalar(math.sqrt(scale), "scale_root")
    scaled = g.op("Mul", (q, root))
    keys = g.op("Transpose", (g.op("Mul", (k, root)),), perm=(0, 1, 3, 2))
    group = hq // hkv
    values = v
    if group > 1:  # grouped-query: K / V broadcast over the group axis, never repeated
        scaled = g.op("Reshape", (scaled, g.ints("q_groups", [batch, hkv, group, q_len, dq])))
        axis = g.ints("group_axis", [2])
        keys = g.op("Unsqueeze", (keys, axis))
        values = g.op("Unsqueeze", (values, axis))
    scores = raw = g.op("MatMul", (scaled, keys))
    softcap = ctx.attr_float("softcap", 0.0)
    if softcap > 0:
        cap = scalar(softcap, "softcap")
        scores = g.op("Mul", (g.op("Tanh", (g.op("Div", (scores, cap)),)), cap))
    capped = scores
    bias, bias_value = _bias(ctx, g, dtype, q_len, kv_len, past)
    guard = None
    if bias is not None:
        bias_shape = _bias_shape(ctx, q_len, kv_len)
        if group > 1:
            full = (1,) * (4 - len(bias_shape)) + bias_shape
            heads = (hkv, group) if full[1] == hq and hq > 1 else (1, 1)
            bias = g.op("Reshape", (bias, g.ints("bias_groups", [full[0], *heads, *full[2:]])))
            if bias_value is not None:
                bias_value = bias_value.reshape(full[0], *heads, *full[2:])
        scores = g.op("Add", (scores, bias))
        guard = _guard(g, bias, bias_value, dtype)
    biased = scores
    precision = PRECISIONS.get(ctx.attr_int("softmax_precision", 0), dtype)
    if precision != dtype:
        scores = g.op("Cast", (scores,), to=_onnx_type(precision))
    probs = g.op("Softmax", (scores,), axis=-1)
    if precision != dtype:
        probs = g.op("Cast", (probs,), to=_onnx_type(dtype))
    if guard is not None:
        probs = g.op("Where", (guard, scalar(0.0, "zero"), probs))
    last = group == 1 and not three_d
    y = g.op("MatMul", (probs, values), outputs[0] if last else None)
    if group > 1:
        y = g.op(
            "Reshape",
            (y, g.ints("y_heads", [batch, hq, q_len, dv])),
            None if three_d else outputs[0],
        )
    if three_d:
        y = g.op("Transpose", (y,), perm=(0, 2, 1, 3))
        g.op("Reshape", (y, g.ints("y_shape", [batch, q_len, hq * dv])), outputs[0])
    if outputs[3]:
        mode = ctx.attr_int("qk_matmul_output_mode", 0)
        chosen = (raw, capped, biased, probs)[mode]
        if group > 1:
            g.op("Reshape", (chosen, g.ints("qk_shape", [batch, hq, q_len, kv_len])), outputs[3])
        else:
            g.op("Identity", (chosen,), outputs[3])
    return Rewrite(tuple(g.nodes), g.constants)


def _onnx_type(dtype: str) -> int:
    return {"float32": 1, "float16": 10, "float64": 11}[dtype]


def _bias_shape(ctx: InferContext, q_len: int, kv_len: int) -> tuple[int, ...]:
    """The shape of the additive bias: the mask's, its last axis the keys', broadcast with
    the (q_len, kv_len) frontier when there is one."""
    parts: list[tuple[int, ...]] = []
    if ctx.has_input(3):
        mask = ctx.shape(3)
        parts.append((*mask[:-1], kv_len) if mask else (kv_len,))
    if ctx.has_input(6):
        parts.append((ctx.shape(0)[0], 1, q_len if _windowed(ctx) else 1, kv_len))
    elif _windowed(ctx) or not parts:
        parts.append((q_len, kv_len))
    rank = max(len(p) for p in parts)
    full = [(1,) * (rank - len(p)) + p for p in parts]
    return tuple(max(sizes) for sizes in zip(*full, strict=True))


def _bias(
    ctx: InferContext, g: _Subgraph, dtype: str, q_len: int, kv_len: int, past: int
) -> tuple[str | None, np.ndarray | None]:
    """The additive bias tensor and, when known at compile time, its value."""
    frontier = None if ctx.has_input(6) else _frontier_bias(ctx, q_len, kv_len, past)
    mask = value = None
    if ctx.has_input(3):
        mask = ctx.node.inputs[3]
        mask_type = ctx.type(3)
        known = ctx.value(3)
        if mask_type.rank == 0:
            raise ctx.error("attn_mask (input 3) must have rank >= 1")
        if mask_type.dtype == "bool":
            neg_inf = g.const("neg_inf", np.array(-np.inf, dtype))
            mask = g.op("Where", (mask, g.const("zero", np.array(0.0, dtype)), neg_inf))
            if known is not None:
                value = np.where(known, 0.0, -np.inf).astype(dtype)
        elif mask_type.dtype != dtype:
            mask = g.op("Cast", (mask,), to=_onnx_type(dtype))
            if known is not None:
                value = np.asarray(known).astype(dtype)
        elif known is not None:
            value = np.asarray(known)
        short = kv_len - mask_type.shape[-1]
        if short < 0:
            raise ctx.error(
                f"attn_mask's last axis {mask_type.shape[-1]} is longer than the {kv_len} keys"
            )
        if short:
            fill = np.full((*mask_type.shape[:-1], short), -np.inf, dtype)
            mask = g.op("Concat", (mask, g.const("mask_fill", fill)), axis=-1)
            if value is not None:
                value = np.concatenate([value, fill], axis=-1)
    if ctx.has_input(6):
        padding = _nonpad_bias(g, dtype, q_len, kv_len)
        return (padding if mask is None else g.op("Add", (mask, padding))), None
    if frontier is None:
        return mask, value
    frontier = frontier.astype(dtype)
    if mask is None:
        return g.const("frontier", frontier), frontier
    total = g.op("Add", (mask, g.const("frontier", frontier)))
    return total, (value + frontier if value is not None else None)


def _guard(g: _Subgraph, bias: str, value: np.ndarray | None, dtype: str) -> str | None:
    """The rows whose bias is all -inf (no key to attend: their probabilities are 0), or
    None when the bias is a constant without such a row."""
    if value is not None:
        rows = np.isneginf(np.max(value, axis=-1, keepdims=True))
        return g.const("masked_rows", rows) if rows.any() else None
    peak = g.op("ReduceMax", (bias, g.ints("last_axis", [-1])), keepdims=1)
    return g.op("Equal", (peak, g.const("neg_inf", np.array(-np.inf, dtype))))


@register("Attention", OpKind.ANCHOR, canonicalize=_attention_canonicalize, dtypes=FLOATS)
def _attention(ctx: InferContext) -> tuple[TensorType, ...]:
    """Never reached: canonicalization replaces every Attention node."""
    raise ctx.error("Attention must be canonicalized before shape inference")
