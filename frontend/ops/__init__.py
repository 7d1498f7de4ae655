"""Supported ONNX ops. Importing this package registers every op family."""

from . import (  # noqa: F401  (each registers its ops)
    attention,
    elementwise,
    indexing,
    layout,
    matmul,
    nn,
    norm,
    pool,
    reduce,
    resize,
    tensor,
)
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
