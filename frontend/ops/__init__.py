"""Supported ONNX ops. Importing this package registers every op family."""

from . import attention, elementwise, indexing, layout, nn, norm, pool, reduce, resize, tensor  # noqa: F401  (each registers its ops)
from .base import (
    OPS,
    InferContext,
    OpDef,
    OpKind,
    Rewrite,
    broadcast_shapes,
    register,
    same_as_input,
)

__all__ = [
    "OPS",
    "InferContext",
    "OpDef",
    "OpKind",
    "Rewrite",
    "broadcast_shapes",
    "register",
    "same_as_input",
]
