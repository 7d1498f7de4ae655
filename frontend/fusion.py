"""Fusion partitioning: the graph becomes a DAG of groups, each one future kernel.

The rules are TVM's, on the op kinds of the registry:
- an anchor (conv, matmul, pooling, softmax, norms) or a reduction absorbs the chain of
  elementwise consumers of its output (bias, BN, ReLU, residual Add, GELU, scaling), as
  long as each keeps the anchor's output shape, so the epilogue runs inside its tile;
- an anchor absorbs the elementwise / injective producers of its inputs (Pad before Conv,
  Transpose before MatMul, BN-ReLU before a pre-activation conv); the poly layer decides
  whether such a prologue is recomputed or materialized;
- the remaining elementwise / injective ops fuse into chains;
- a tensor with several consumers, or a graph output, ends a chain; zero-copy views
  (`Graph.aliases`) belong to no group;
- the indices of an indexing op (Gather, Scatter, ...) are read from a buffer of their
  own, never computed inside its group: the compiled model checks them there before the
  kernel runs (`ops.indexing.index_inputs`);
- no merge may create a cycle between groups: the group graph stays a DAG.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from .graph import Graph, Node
from .ops import OPS, OpKind
from .ops.indexing import index_inputs

FUSABLE = (OpKind.ELEMENTWISE, OpKind.INJECTIVE, OpKind.VIEW)


@dataclass(frozen=True)
class Group:
    """One fused group: its nodes in topological order and its boundary tensors."""

    index: int
    kind: str
    anchor: str | None
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]  # read from outside: graph inputs, constants, other groups
    outputs: tuple[str, ...]  # read outside the group, or graph outputs

    def subgraph(self, graph: Graph) -> Graph:
        """The group as a graph of its own (constants included), e.g. to run it alone."""
        nodes = tuple(graph.node_by_name[n] for n in self.nodes)
        constants = {t: graph.constants[t] for t in self.inputs if t in graph.constants}
        used = {t for n in nodes for t in (*n.inputs, *n.outputs) if t}
        return Graph(
            name=f"{graph.name}/group{self.index}",
            nodes=nodes,
            inputs=tuple(t for t in self.inputs if t not in graph.constants),
            outputs=self.outputs,
            types={t: graph.types[t] for t in used},
            constants=constants,
            opset=graph.opset,
        )


@dataclass(frozen=True)
class Partition:
    graph: Graph
    groups: tuple[Group, ...]  # in a topological order of the group DAG

    @cached_property
    def group_of(self) -> dict[str, int]:
        return {n: g.index for g in self.groups for n in g.nodes}

    @cached_property
    def dag(self) -> nx.DiGraph:
        """Groups and the tensors flowing between them (views resolved to their source)."""
        dag = nx.DiGraph()
        dag.add_nodes_from(g.index for g in self.groups)
        producer_group = {t: g.index for g in self.groups for t in g.outputs}
        for group in self.groups:
            for tensor in group.inputs:
                source = self.graph.aliases.get(tensor, tensor)
                src = producer_group.get(source)
                if src is not None and src != group.index:
                    dag.add_edge(src, group.index)
        return dag

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for g in self.groups:
            kinds[g.kind] = kinds.get(g.kind, 0) + 1
        body = ", ".join(f"{k}×{v}" for k, v in sorted(kinds.items()))
        return f"{len(self.groups)} groups: {body}"


class _UnionFind:
    def __init__(self, items: list[str]) -> None:
        self.parent = {i: i for i in items}

    def find(self, item: str) -> str:
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, keep: str, other: str) -> None:
        self.parent[self.find(other)] = self.find(keep)


def _detour(q: nx.DiGraph, src: str, dst: str) -> bool:
    """Whether a path leads from src to dst other than their direct edge."""
    stack = [t for t in q.successors(src) if t != dst]
    seen = set(stack)
    while stack:
        node = stack.pop()
        for t in q.successors(node):
            if t == dst:
                return True
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return False


class _Partitioner:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.compute = [n for n in graph.nodes if n.outputs[0] not in graph.aliases]
        self.sets = _UnionFind([n.name for n in self.compute])
        self.outputs = set(graph.outputs)
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.anchors = [
            n for n in self.compute if OPS[n.op_type].kind in (OpKind.ANCHOR, OpKind.REDUCTION)
        ]
        self._groups: nx.DiGraph | None = None

    # --- queries --------------------------------------------------------------------
    def kind(self, node: Node) -> OpKind:
        return OPS[node.op_type].kind

    def single_consumer(self, tensor: str) -> Node | None:
        """The only consumer of `tensor`, if it has exactly one and is not a graph output."""
        if tensor in self.outputs or tensor in self.graph.aliases:
            return None
        users = self.graph.consumers.get(tensor, ())
        if len(users) != 1 or users[0].outputs[0] in self.graph.aliases:
            return None
        return users[0]

    def quotient(self) -> nx.DiGraph:
        q = nx.DiGraph()
        q.add_nodes_from({self.sets.find(n.name) for n in self.compute})
        for node in self.compute:
            dst = self.sets.find(node.name)
            for tensor in node.inputs:
                producer = self.graph.producers.get(self.graph.aliases.get(tensor, tensor))
                if producer is None:
                    continue
                src = self.sets.find(producer.name)
                if src != dst:
                    q.add_edge(src, dst)
        return q

    def can_merge(self, a: str, b: str) -> bool:
        """Merging the groups of a and b keeps the group graph acyclic: no path between
        them goes through a third group."""
        ra, rb = self.sets.find(a), self.sets.find(b)
        if ra == rb:
            return True
        q = self.groups_graph()
        return not (_detour(q, ra, rb) or _detour(q, rb, ra))

    def groups_graph(self) -> nx.DiGraph:
        """The quotient graph of the current groups, kept up to date by `merge` (built
        once: rebuilding it for every merge made partitioning quadratic)."""
        if self._groups is None:
            self._groups = self.quotient()
        return self._groups

    def merge(self, keep: Node, other: Node) -> bool:
        if not self.can_merge(keep.name, other.name):
            return False
        ra, rb = self.sets.find(keep.name), self.sets.find(other.name)
        self.sets.union(keep.name, other.name)
        if ra != rb:  # contract rb into ra, the root `union` keeps
            q = self.groups_graph()
            q.add_edges_from((p, ra) for p in q.predecessors(rb) if p != ra)
            q.add_edges_from((ra, t) for t in q.successors(rb) if t != ra)
            q.remove_node(rb)
        return True

    # --- rules ----------------------------------------------------------------------
    def run(self) -> Partition:
        merged: set[str] = set()
        for anchor in self.anchors:
            self.fuse_epilogue(anchor, merged)
        for anchor in self.anchors:
            self.fuse_prologue(anchor, anchor, merged)
        for node in self.compute:
            if self.kind(node) in FUSABLE:
                self.fuse_chain(node, merged)
        return self.build()

    def fuse_epilogue(self, anchor: Node, merged: set[str]) -> None:
        shape = self.graph.types[anchor.outputs[0]].shape
        current = anchor
        while len([o for o in current.outputs if o]) == 1:
            consumer = self.single_consumer(current.outputs[0])
            if (
                consumer is None
                or consumer.name in merged
                or self.kind(consumer) is not OpKind.ELEMENTWISE
                or self.graph.types[consumer.outputs[0]].shape != shape
                or not self.merge(anchor, consumer)
            ):
                return
            merged.add(consumer.name)
            current = consumer

    def fuse_prologue(self, anchor: Node, consumer: Node, merged: set[str]) -> None:
        held = index_inputs(consumer)
        for position, tensor in enumerate(consumer.inputs):
            if not tensor or tensor in self.graph.constants or position in held:
                continue
            producer = self.graph.producers.get(tensor)
            if (
                producer is None
                or producer.name in merged
                or self.kind(producer) not in FUSABLE
                or producer.outputs[0] in self.graph.aliases
                or len([o for o in producer.outputs if o]) != 1
                or self.single_consumer(tensor) is not consumer
                or not self.merge(anchor, producer)
            ):
                continue
            merged.add(producer.name)
            self.fuse_prologue(anchor, producer, merged)

    def fuse_chain(self, node: Node, merged: set[str]) -> None:
        """Join an elementwise / injective node to the injective group of its producer."""
        held = index_inputs(node)
        for position, tensor in enumerate(node.inputs):
            producer = self.graph.producers.get(tensor) if tensor else None
            if (
                producer is None
                or position in held
                or producer.outputs[0] in self.graph.aliases
                or len([o for o in producer.outputs if o]) != 1  # its other outputs escape
                or self.kind(producer) not in FUSABLE
                or self.single_consumer(tensor) is not node
                or self.sets.find(producer.name) == self.sets.find(node.name)
            ):
                continue
            # an anchor's group takes only the epilogue and prologue rules above
            if self.has_anchor(producer) or self.has_anchor(node):
                continue
            if self.merge(producer, node):
                merged.add(node.name)

    def has_anchor(self, node: Node) -> bool:
        root = self.sets.find(node.name)
        return any(self.sets.find(a.name) == root for a in self.anchors)

    # --- result ---------------------------------------------------------------------
    def build(self) -> Partition:
        members: dict[str, list[Node]] = {}
        for node in self.compute:
            members.setdefault(self.sets.find(node.name), []).append(node)
        q = self.quotient()
        if not nx.is_directed_acyclic_graph(q):
            raise AssertionError(f"fusion of '{self.graph.name}' created a cycle between groups")
        order = list(
            nx.lexicographical_topological_sort(
                q, key=lambda r: min(self.order[n.name] for n in members[r])
            )
        )
        groups = []
        for index, root in enumerate(order):
            nodes = sorted(members[root], key=lambda n: self.order[n.name])
            groups.append(self.describe(index, nodes))
        return Partition(self.graph, tuple(groups))

    def describe(self, index: int, nodes: list[Node]) -> Group:
        inside = {n.name for n in nodes}
        produced = {o for n in nodes for o in n.outputs if o}
        inputs: dict[str, None] = {}
        for node in nodes:
            for tensor in node.inputs:
                if tensor and tensor not in produced:
                    inputs[tensor] = None
        outputs = [
            t
            for n in nodes
            for t in n.outputs
            if t
            and (
                t in self.outputs
                or any(c.name not in inside for c in self.graph.consumers.get(t, ()))
            )
        ]
        anchors = [n for n in nodes if self.kind(n) in (OpKind.ANCHOR, OpKind.REDUCTION)]
        if anchors:
            kind, anchor = anchors[0].op_type, anchors[0].name
        elif all(self.kind(n) is OpKind.ELEMENTWISE for n in nodes):
            kind, anchor = "elementwise", None
        else:
            kind, anchor = "injective", None
        return Group(
            index, kind, anchor, tuple(n.name for n in nodes), tuple(inputs), tuple(outputs)
        )


def partition(graph: Graph) -> Partition:
    """Fused groups of an optimized graph (see the module docstring for the rules)."""
    return _Partitioner(graph).run()
