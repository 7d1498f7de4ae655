"""The op registry: for each supported ONNX op, its kind, shape inference, numpy
evaluation (for constant folding) and canonicalization of older opset versions.

Every op family module registers its ops with `register`. The importer and the passes only
talk to `OpDef`s; nothing outside `frontend/ops` knows an op's rules.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.errors import ShapeError, UnsupportedOpError

from ..graph import Node, TensorType


class OpKind(enum.Enum):
    """How an op fuses (the classes of TVM's fusion rules)."""

    ELEMENTWISE = "elementwise"  # out[i] = f(in0[bcast(i)], in1[bcast(i)], ...)
    INJECTIVE = "injective"  # out[i] = in[g(i)]: transpose, slice, pad, concat, gather, ...
    REDUCTION = "reduction"  # reduces axes: ReduceSum, ArgMax, ...
    ANCHOR = "anchor"  # heavy compute that owns a group: conv, matmul, pooling, softmax, norms
    VIEW = "view"  # reshape-like: zero-copy in a row-major layout
    SHAPE = "shape"  # metadata only (Shape, Constant, ...): always folded away
    ELIMINATED = "eliminated"  # removed by a pass before partitioning (Identity, Dropout)


class InferContext:
    """What shape inference and canonicalization of one node may look at."""

    def __init__(
        self,
        node: Node,
        input_types: Sequence[TensorType | None],
        values: Sequence[np.ndarray | None],
        opset: int,
        model: str = "",
        fresh: Callable[[str], str] | None = None,
    ) -> None:
        self.node = node
        self.input_types = tuple(input_types)
        self.values = tuple(values)
        self.opset = opset
        self.model = model
        self._fresh = fresh

    @classmethod
    def looking_up(
        cls,
        node: Node,
        types: Mapping[str, TensorType],
        values: Mapping[str, np.ndarray],
        opset: int,
        model: str = "",
        fresh: Callable[[str], str] | None = None,
    ) -> InferContext:
        """The context of `node` with its inputs' types and known values taken from the
        graph's tables by name (None for an omitted input or one not in a table)."""
        return cls(
            node,
            [types.get(i) if i else None for i in node.inputs],
            [values.get(i) if i else None for i in node.inputs],
            opset,
            model,
            fresh,
        )

    def fresh(self, base: str) -> str:
        """A tensor or node name not used anywhere in the graph yet."""
        if self._fresh is None:
            raise RuntimeError("this context cannot create names")
        return self._fresh(f"{self.node.name}/{base}")

    # --- errors ---------------------------------------------------------------------
    def where(self) -> str:
        model = f" in model '{self.model}'" if self.model else ""
        return f"{self.node.label}{model}"

    def error(self, message: str) -> ShapeError:
        return ShapeError(f"{self.where()}: {message}")

    def unsupported(self, message: str) -> UnsupportedOpError:
        node = self.node
        return UnsupportedOpError(
            f"{self.where()}: {message}", ((node.name, node.op_type, message),)
        )

    # --- inputs ---------------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.node.inputs)

    def has_input(self, index: int) -> bool:
        return index < len(self.node.inputs) and self.node.inputs[index] != ""

    def type(self, index: int) -> TensorType:
        if not self.has_input(index):
            raise self.error(f"input {index} is required but missing")
        t = self.input_types[index]
        if t is None:
            raise self.error(f"input {index} ('{self.node.inputs[index]}') has no known type")
        return t

    def shape(self, index: int) -> tuple[int, ...]:
        return self.type(index).shape

    def dtype(self, index: int) -> str:
        return self.type(index).dtype

    def value(self, index: int) -> np.ndarray | None:
        """The input's value when it is known at compile time, else None."""
        if not self.has_input(index):
            return None
        return self.values[index]

    def const(self, index: int, what: str) -> np.ndarray:
        """The input's compile-time value; a ShapeError when it is only known at run time."""
        if not self.has_input(index):
            raise self.error(f"input {index} (the {what}) is required but missing")
        value = self.value(index)
        if value is None:
            raise self.error(
                f"input {index} ('{self.node.inputs[index]}', the {what}) must be a "
                f"compile-time constant for static shapes"
            )
        return value

    def const_ints(self, index: int, what: str) -> tuple[int, ...]:
        return tuple(int(v) for v in np.asarray(self.const(index, what)).reshape(-1))

    # --- attributes -----------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def attr_int(self, name: str, default: int | None = None) -> int:
        value = self.node.attrs.get(name, default)
        if value is None:
            raise self.error(f"attribute '{name}' is required")
        return int(value)

    def attr_ints(self, name: str, default: Sequence[int] | None = None) -> tuple[int, ...] | None:
        value = self.node.attrs.get(name, default)
        return None if value is None else tuple(int(v) for v in value)

    def attr_float(self, name: str, default: float) -> float:
        return float(self.node.attrs.get(name, default))

    def attr_str(self, name: str, default: str) -> str:
        value = self.node.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else str(value)

    def attr_choice(
        self, name: str, default: str, allowed: Iterable[str], supported: bool = True
    ) -> str:
        """A string attribute that must be one of `allowed`: another value is invalid
        (a ShapeError), or with `supported=False` valid ONNX that polytile refuses."""
        value = self.attr_str(name, default)
        allowed = tuple(allowed)
        if value not in allowed:
            message = f"attribute {name}='{value}' is not one of {', '.join(allowed)}"
            raise self.error(message) if supported else self.unsupported(message)
        return value

    def axis(self, axis: int, rank: int, what: str = "axis") -> int:
        """Normalize a possibly negative axis, with an error naming the attribute."""
        if not -rank <= axis < max(rank, 1):
            raise self.error(f"{what} {axis} is out of range for rank {rank}")
        return axis + rank if axis < 0 else axis


InferFn = Callable[[InferContext], tuple[TensorType, ...]]
EvalFn = Callable[[InferContext, Sequence[np.ndarray]], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Rewrite:
    """Canonical replacement of one node: new nodes plus the constants they introduce."""

    nodes: tuple[Node, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)


#: (context, since_version) -> the node's replacement in the canonical opset
CanonFn = Callable[[InferContext, int], Rewrite]


@dataclass(frozen=True)
class OpDef:
    op_type: str
    kind: OpKind
    infer: InferFn
    evaluate: EvalFn | None = None
    canonicalize: CanonFn | None = None
    #: dtypes accepted for the first input; None means any supported dtype
    dtypes: frozenset[str] | None = None
    #: input indices that must be compile-time constants (shapes, axes, pads, scales, ...)
    params: frozenset[int] = frozenset()
    #: False for ops computed from input types alone (Shape), so they fold on any input
    needs_values: bool = True


OPS: dict[str, OpDef] = {}


def register(
    op_type: str,
    kind: OpKind,
    *,
    evaluate: EvalFn | None = None,
    canonicalize: CanonFn | None = None,
    dtypes: frozenset[str] | None = None,
    params: Iterable[int] = (),
    needs_values: bool = True,
) -> Callable[[InferFn], InferFn]:
    """Decorator registering `infer` (the decorated function) as `op_type`'s definition."""

    def wrap(infer: InferFn) -> InferFn:
        if op_type in OPS:
            raise RuntimeError(f"op {op_type} registered twice")
        OPS[op_type] = OpDef(
            op_type, kind, infer, evaluate, canonicalize, dtypes, frozenset(params), needs_values
        )
        return infer

    return wrap


def broadcast_shapes(ctx: InferContext, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """ONNX multidirectional (numpy) broadcasting, with an error naming the node."""
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ctx.error(
                f"input shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast"
            )
        result.append(dims.pop() if dims else 1)
    return tuple(result)


def same_as_input(ctx: InferContext) -> tuple[TensorType, ...]:
    """Inference for ops whose single output has the first input's type."""
    return (ctx.type(0),)
