"""Control flow that exporters leave behind, expanded into straight-line nodes at import.

polytile compiles straight-line graphs. Exporters still emit `If` nodes whose condition
is known once shapes are (a branch on a static size) and `Loop` nodes with a constant
trip count (a Python loop traced with its bound). The importer expands both: an `If`
with a known condition becomes the taken branch, a `Loop` with a known trip count and no
data-dependent exit becomes one copy of its body per iteration. The nodes of a branch or
body get fresh names for everything they define, so copies never collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: ops whose subgraphs the importer expands
CONTROL_FLOW = frozenset({"If", "Loop"})

Fresh = Callable[[str], str]


@dataclass(frozen=True)
class Inlined:
    """Nodes of a subgraph renamed into the outer graph, with its constants."""

    nodes: tuple[onnx.NodeProto, ...]
    constants: dict[str, np.ndarray]
    #: subgraph output i is this outer tensor
    outputs: tuple[str, ...]


def subgraph(node: onnx.NodeProto, name: str) -> onnx.GraphProto | None:
    for attr in node.attribute:
        if attr.name == name and attr.type == onnx.AttributeProto.GRAPH:
            return attr.g
    return None


def outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read from the enclosing graph (their implicit inputs)."""
    found: set[str] = set()

    def visit(graph: onnx.GraphProto, defined: set[str]) -> None:
        defined = defined | {i.name for i in graph.input} | {t.name for t in graph.initializer}
        for inner in graph.node:
            found.update(i for i in inner.input if i and i not in defined)
            for attr in inner.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    visit(sub, defined)
            defined |= set(inner.output)

    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            visit(sub, set())
    return found


def _rename_graph(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename, in place, the outer values a nested subgraph reads."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in names:
                node.input[i] = names[name]
        _rename_subgraphs(node, names)


def _rename_subgraphs(node: onnx.NodeProto, names: dict[str, str]) -> None:
    """Rename, in place, the outer values the node's nested subgraphs read."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            _rename_graph(attr.g, names)
        for g in attr.graphs:
            _rename_graph(g, names)


def inline(graph: onnx.GraphProto, bound: dict[str, str], fresh: Fresh) -> Inlined:
    """The nodes of `graph` with every name it defines made fresh; `bound` maps its
    formal inputs to outer tensors."""
    names = dict(bound)
    constants = {}
    for init in graph.initializer:
        names[init.name] = fresh(init.name)
        constants[names[init.name]] = numpy_helper.to_array(init)
    for node in graph.node:
        for out in node.output:
            if out:
                names[out] = fresh(out)
    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = fresh(node.name or node.op_type)
        copy.input[:] = [names.get(i, i) for i in node.input]
        copy.output[:] = [names.get(o, o) for o in node.output]
        _rename_subgraphs(copy, names)
        nodes.append(copy)
    outputs = tuple(names.get(o.name, o.name) for o in graph.output)
    return Inlined(tuple(nodes), constants, outputs)


def bind_outputs(sources: tuple[str, ...], targets: list[str], label: str) -> list[onnx.NodeProto]:
    """Identity nodes giving the outer node's output names to a subgraph's outputs."""
    return [
        helper.make_node("Identity", [src], [dst], name=f"{label}/{dst}")
        for src, dst in zip(sources, targets, strict=False)
        if dst
    ]


def loop_never_exits(node: onnx.NodeProto) -> bool:
    """Whether a Loop body passes its condition on unchanged (it runs all its trips)."""
    body = subgraph(node, "body")
    if body is None or len(body.input) < 2 or not body.output:
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    producer = {o: n for n in body.node for o in n.output}.get(cond_out)
    passed = producer is not None and producer.op_type == "Identity"
    return cond_out == cond_in or (passed and list(producer.input) == [cond_in])


@dataclass(frozen=True)
class Iteration:
    """One unrolled copy of a Loop body."""

    inlined: Inlined
    #: the body's condition output for this iteration ('' when the body has none)
    condition: str


def loop_iterations(
    node: onnx.NodeProto, trips: int, carried: list[str], fresh: Fresh
) -> Iterator[Iteration]:
    """Copies of the Loop body, one per iteration, each reading the previous copy's
    carried values; the caller stops when a copy's condition is false."""
    body = subgraph(node, "body")
    assert body is not None  # the checker guarantees it
    formal = [i.name for i in body.input]
    current = list(carried)
    for step in range(trips):
        counter = fresh(f"{node.name or 'loop'}/iteration_{step}")
        condition = fresh(f"{node.name or 'loop'}/condition_{step}")
        bound = {formal[0]: counter, formal[1]: condition}
        bound.update(zip(formal[2:], current, strict=True))
        inlined = inline(body, bound, fresh)
        constants = dict(inlined.constants)
        constants[counter] = np.array(step, dtype=np.int64)
        constants[condition] = np.array(True)
        yield Iteration(Inlined(inlined.nodes, constants, inlined.outputs), inlined.outputs[0])
        current = list(inlined.outputs[1 : 1 + len(carried)])


def scan_nodes(
    per_step: list[list[str]], targets: list[str], label: str, fresh: Fresh
) -> list[onnx.NodeProto]:
    """A Loop's scan outputs: each step's value stacked along a new first axis."""
    nodes = []
    for k, target in enumerate(targets):
        if not target:
            continue
        axis0 = fresh(f"{label}/axes")
        parts = []
        for values in per_step:
            part = fresh(f"{label}/{target}/step")
            nodes.append(
                helper.make_node("Unsqueeze", [values[k], axis0], [part], name=fresh(part))
            )
            parts.append(part)
        zero = numpy_helper.from_array(np.array([0], np.int64))
        nodes.insert(0, helper.make_node("Constant", [], [axis0], name=fresh(axis0), value=zero))
        nodes.append(helper.make_node("Concat", parts, [target], name=fresh(target), axis=0))
    return nodes
