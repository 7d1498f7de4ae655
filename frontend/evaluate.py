"""Compile-time evaluation of one node, for value propagation and constant folding.

An op's own numpy `evaluate` is used when it has one (fast, for the shape-chain ops); any
other op falls back to onnx's reference evaluator on a one-node model, which is slower but
exact. The result must match the inferred type: a mismatch is a polytile bug. bfloat16 and
float16 are computed in float32 and rounded at the end, as the compiled code does
(frontend/widen.py); only Cast converts them directly. A Cast from or to a narrow type
(float8, ...) converts with its saturate and round_mode (frontend/narrow.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .graph import TensorType
from .narrow import cast_array, is_narrow
from .onnx_io import dtype_to_onnx, node_to_proto
from .ops import OPS, InferContext
from .widen import NATIVE, WIDENED


def evaluate_node(ctx: InferContext, out_types: Sequence[TensorType]) -> tuple[np.ndarray, ...]:
    """The node's outputs, given that every input value (or, for Shape, type) is known."""
    node = ctx.node
    op = OPS[node.op_type]
    ctx = _widened(ctx)
    # IEEE results (log 0 = -inf, inf cast to int) are what the compiled code would give:
    # folding computes them silently, as it does
    with np.errstate(all="ignore"):
        if node.op_type == "Cast" and (is_narrow(ctx.dtype(0)) or is_narrow(out_types[0].dtype)):
            results: Sequence[np.ndarray] = (_narrow_cast(ctx, out_types[0].dtype),)
        elif op.evaluate is not None:
            results = op.evaluate(ctx, [v if v is not None else _missing() for v in ctx.values])
        else:
            results = _reference(ctx)
    out = []
    for name, value, t in zip(node.outputs, results, out_types, strict=False):
        array = np.asarray(value)
        if name and (tuple(array.shape) != t.shape):
            raise AssertionError(
                f"{ctx.where()}: evaluated output '{name}' has shape {array.shape}, "
                f"inference said {t.shape}"
            )
        out.append(array.astype(t.dtype, copy=False))
    return tuple(out)


def try_evaluate(ctx: InferContext, out_types: list[TensorType]) -> tuple[np.ndarray, ...] | None:
    """The node's outputs, or None when compile-time evaluation fails. Ops without a numpy
    evaluator fall back to onnx's reference evaluator, which has bugs of its own (5-D
    GlobalMaxPool, grouped dilated ConvTranspose, ...): such a node is simply not folded."""
    try:
        return evaluate_node(ctx, out_types)
    except Exception:  # the fallback evaluator's failure is not the model's
        return None


def _widened(ctx: InferContext) -> InferContext:
    """The context with bfloat16 and float16 inputs as float32 (exact), as the compiled
    code computes them (frontend/widen.py)."""
    types, values = ctx.input_types, ctx.values
    if ctx.node.op_type in NATIVE or not any(t is not None and t.dtype in WIDENED for t in types):
        return ctx
    return InferContext(
        ctx.node,
        [
            TensorType(t.shape, "float32") if t is not None and t.dtype in WIDENED else t
            for t in types
        ],
        [v.astype(np.float32) if v is not None and v.dtype.name in WIDENED else v for v in values],
        ctx.opset,
        ctx.model,
    )


def _narrow_cast(ctx: InferContext, dtype: str) -> np.ndarray:
    """A Cast from or to a narrow type, with its saturate and round_mode (frontend/narrow.py)."""
    value = ctx.value(0)
    assert value is not None
    saturate = bool(ctx.attr_int("saturate", 1))
    return cast_array(value, dtype, saturate, str(ctx.node.attrs.get("round_mode", "up")))


def _missing() -> np.ndarray:
    return np.empty((0,), dtype=np.float32)


def _reference(ctx: InferContext) -> list[np.ndarray]:
    node = ctx.node
    feeds = {}
    inputs = []
    for index, name in enumerate(node.inputs):
        if not name:
            continue
        value = ctx.value(index)
        if value is None:
            raise AssertionError(f"{ctx.where()}: input {index} has no value to fold")
        feeds[name] = np.asarray(value)
        inputs.append(helper.make_tensor_value_info(name, dtype_to_onnx(value.dtype.name), None))
    outputs = [
        helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
        for o in node.outputs
        if o
    ]
    graph = helper.make_graph([node_to_proto(node)], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ctx.opset)])
    results = ReferenceEvaluator(model).run(None, feeds)
    live = iter(results)
    return [next(live) if o else _missing() for o in node.outputs]
