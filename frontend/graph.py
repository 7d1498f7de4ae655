"""The graph IR: an immutable, statically shaped ONNX graph in one canonical opset.

A `Graph` is a frozen value: passes take one and return a new one. Nodes are kept in a
topological order; every tensor (graph inputs, constants, node outputs) has a static
`TensorType`. Constants are numpy arrays marked read-only. The networkx view
(`Graph.digraph`) is derived and cached, so graph algorithms (DCE, fusion, cycle checks)
use networkx while the IR itself stays a plain value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype name)
import networkx as nx
import numpy as np

from .narrow import NARROW_DTYPES

#: dtypes a tensor may have; names are numpy's.
SUPPORTED_DTYPES = (
    frozenset(
        {
            "bfloat16",
            "float16",
            "float32",
            "float64",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "bool",
        }
    )
    | NARROW_DTYPES
)  # storage types, converted by Cast only (frontend/narrow.py)
#: bfloat16 is a storage type: its arithmetic is float32's, rounded (frontend/widen.py)
FLOAT_DTYPES = frozenset({"bfloat16", "float16", "float32", "float64"})
INT_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})


def frozen_mapping(items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> Mapping[str, Any]:
    """A read-only copy, so IR objects cannot be changed behind a pass's back."""
    return MappingProxyType(dict(items))


def readonly(array: np.ndarray) -> np.ndarray:
    """A read-only numpy array; constants are shared between graphs and must not change."""
    array = np.asarray(array)
    if array.flags.writeable:
        array = array.copy() if array.base is not None else array
        array.flags.writeable = False
    return array


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype (numpy dtype name) of a tensor. In a graph imported by
    `symbolic_import.import_symbolic`, a size may be a `symbolic.Dim` (batch, seq*8)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Node:
    """One ONNX operator application. An omitted optional input is the empty string."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=frozen_mapping)
    domain: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.attrs, MappingProxyType):
            object.__setattr__(self, "attrs", frozen_mapping(self.attrs))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def label(self) -> str:
        return f"node '{self.name}' ({self.op_type})"

    def input(self, index: int) -> str:
        """The name of input `index`, or '' when it is omitted."""
        return self.inputs[index] if index < len(self.inputs) else ""


@dataclass(frozen=True)
class Graph:
    """A statically shaped graph; `nodes` are in topological order."""

    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    types: Mapping[str, TensorType]
    constants: Mapping[str, np.ndarray]
    opset: int
    #: output tensor of a zero-copy view node → the tensor whose memory it reuses
    aliases: Mapping[str, str] = field(default_factory=frozen_mapping)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        for attr in ("types", "constants", "aliases"):
            value = getattr(self, attr)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, attr, frozen_mapping(value))

    def replace(self, **changes: Any) -> Graph:
        """A new graph with some fields changed (the IR is immutable)."""
        return dataclasses.replace(self, **changes)

    @cached_property
    def producers(self) -> Mapping[str, Node]:
        return frozen_mapping((out, node) for node in self.nodes for out in node.outputs if out)

    @cached_property
    def consumers(self) -> Mapping[str, tuple[Node, ...]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.inputs):
                if name:
                    users.setdefault(name, []).append(node)
        return frozen_mapping((k, tuple(v)) for k, v in users.items())

    @cached_property
    def node_by_name(self) -> Mapping[str, Node]:
        return frozen_mapping((node.name, node) for node in self.nodes)

    @cached_property
    def digraph(self) -> nx.DiGraph:
        """Nodes are node names; an edge carries the tensors flowing along it."""
        g = nx.DiGraph()
        for node in self.nodes:
            g.add_node(node.name, node=node)
        for node in self.nodes:
            for tensor in node.inputs:
                producer = self.producers.get(tensor)
                if producer is not None:
                    if g.has_edge(producer.name, node.name):
                        g.edges[producer.name, node.name]["tensors"].append(tensor)
                    else:
                        g.add_edge(producer.name, node.name, tensors=[tensor])
        return g

    def type_of(self, tensor: str) -> TensorType:
        return self.types[tensor]

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.constants

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return counts

    def summary(self) -> str:
        weights = sum(v.nbytes for v in self.constants.values())
        ops = ", ".join(f"{k}×{v}" for k, v in sorted(self.op_counts().items()))
        return (
            f"graph '{self.name}' (opset {self.opset}): {len(self.nodes)} nodes, "
            f"{len(self.constants)} constants ({weights / 2**20:.1f} MiB); {ops}"
        )
