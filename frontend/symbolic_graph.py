"""The graph a model with symbolic sizes compiles to: its shape subgraphs taken out.

`import_symbolic` keeps the nodes that compute shapes from the sizes (Shape → Gather →
Concat → a Reshape's target), their values folded symbolically (`SymbolicModel.values`).
A static import folds such nodes into constants; `compute_graph` does the same with
symbolic values:

- a node whose outputs all have known values (symbolic or constant) is dropped;
- an operand that only restates its node's output type (a Reshape's or Expand's target
  shape, ConstantOfShape's shape, Range's limit) is omitted (''): the lowering reads the
  output type, whose sizes are the same `Dim`s;
- a Slice's symbolic ends become unbounded ones (its output type holds the length,
  and where a slice starts does not depend on where it ends);
- a symbolic value that a remaining node reads as data (`Mul(x, [seq])`) becomes a
  constant of object dtype holding its ints and `Dim`s, which lowering reads as values
  of the kernel's sizes (`poly.lower.base.size_value`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .graph import Graph, Node, TensorType
from .symbolic import Dim, evaluate_shape
from .symbolic_isl import to_isl

#: (op, input position) of operands whose value only gives the output type's sizes
SHAPE_OPERANDS = frozenset(
    {("Reshape", 1), ("Expand", 1), ("ConstantOfShape", 0), ("Range", 1)}
)


def compute_graph(graph: Graph, values: Mapping[str, np.ndarray]) -> Graph:
    """`graph` (imported by `import_symbolic`, with its symbolic `values`) with its shape
    computations folded away, as the module's docstring says."""
    known = set(values) | set(graph.constants)
    outputs = set(graph.outputs)
    nodes: list[Node] = []
    read: set[str] = set()
    added: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        produced = [o for o in node.outputs if o]
        if produced and all(o in known and o not in outputs for o in produced):
            continue
        inputs = []
        for position, name in enumerate(node.inputs):
            if name in values and name not in graph.constants:
                if (node.op_type, position) in SHAPE_OPERANDS:
                    name = ""
                elif (node.op_type, position) == ("Slice", 2):
                    name = f"{node.name}_unbounded_ends"
                    added[name] = _unbounded_ends(graph, node, len(values[node.inputs[2]]))
                else:
                    read.add(name)
            inputs.append(name)
        nodes.append(Node(node.name, node.op_type, tuple(inputs), node.outputs, node.attrs,
                          node.domain))  # fmt: skip
    constants = {**graph.constants, **{name: _frozen(values[name]) for name in sorted(read)}}
    types = dict(graph.types)
    for name, value in added.items():
        value.flags.writeable = False
        constants[name] = value
        types[name] = TensorType(value.shape, str(value.dtype))
    return graph.replace(nodes=tuple(nodes), constants=constants, types=types)


def at_sizes(graph: Graph, sizes: Mapping[str, int], name: str | None = None) -> Graph:
    """`graph` (a `compute_graph`, or a group of one) with static shapes at these sizes:
    its types evaluated and its constants of sizes (object arrays) made int64 values.
    The operands `compute_graph` omitted stay omitted: lowering reads output types."""
    types = {
        n: TensorType(evaluate_shape(t.shape, sizes), t.dtype) for n, t in graph.types.items()
    }
    constants = {}
    for n, value in graph.constants.items():
        if value.dtype == object:
            flat = [d.evaluate(sizes) if isinstance(d, Dim) else int(d) for d in value.flat]
            value = np.array(flat, np.int64).reshape(value.shape)
            value.flags.writeable = False
        constants[n] = value
    return graph.replace(types=types, constants=constants, name=name or graph.name)


def derived_sizes(graph: Graph) -> dict[str, Dim]:
    """The derived isl parameters its tensors' shapes use (products of sizes, such as
    `batch__seq`), each with the size it stands for."""
    return {
        name: size
        for t in graph.types.values()
        for d in t.shape
        if isinstance(d, Dim)
        for name, size in to_isl([d]).derived.items()
    }


def _unbounded_ends(graph: Graph, node: Node, axes: int) -> np.ndarray:
    """Ends past either end of every sliced axis, by the sign of its step."""
    steps = graph.constants.get(node.input(4))
    signs = np.ones(axes, np.int64) if steps is None else np.sign(np.asarray(steps, np.int64))
    info = np.iinfo(np.int64)
    return np.where(signs > 0, info.max, info.min).astype(np.int64)


def _frozen(value: np.ndarray) -> np.ndarray:
    array = np.array(value, dtype=object)
    array.flags.writeable = False
    return array
