"""Graph optimizations, as one flat pipeline of named passes.

Every pass is a pure function `Graph -> Graph` and keeps the graph's meaning: tests run the
graph before and after each pass with onnx's reference evaluator / onnxruntime.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from polytile.errors import InputError
from polytile.names import unique_name

from .evaluate import try_evaluate
from .graph import Graph, Node, TensorType, readonly
from .ops import OPS, InferContext, OpKind
from .symbolic import is_static
from .widen import widen_low_precision


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph], Graph]
    reason: str


@dataclass(frozen=True)
class PassReport:
    name: str
    nodes_before: int
    nodes_after: int
    seconds: float


@dataclass(frozen=True)
class OptimizeConfig:
    """Which passes run; by default all of them, in pipeline order."""

    disabled: frozenset[str] = field(default_factory=frozenset)


# --- helpers -----------------------------------------------------------------------------


class _Names:
    """Fresh tensor and node names for one pass over one graph."""

    def __init__(self, graph: Graph) -> None:
        self.taken = set(graph.types) | {n.name for n in graph.nodes}

    def __call__(self, base: str) -> str:
        return unique_name(base, self.taken)


def _context(graph: Graph, node: Node, values: dict[str, np.ndarray]) -> InferContext:
    return InferContext.looking_up(node, graph.types, values, graph.opset, graph.name)


def _rename_inputs(nodes: Iterable[Node], mapping: dict[str, str]) -> list[Node]:
    out = []
    for node in nodes:
        if any(i in mapping for i in node.inputs):
            inputs = tuple(_resolve(mapping, i) for i in node.inputs)
            node = Node(node.name, node.op_type, inputs, node.outputs, node.attrs, node.domain)
        out.append(node)
    return out


def _resolve(mapping: dict[str, str], name: str) -> str:
    while name in mapping:
        name = mapping[name]
    return name


def _with_constants(graph: Graph, nodes: list[Node], new: dict[str, np.ndarray]) -> Graph:
    constants = dict(graph.constants)
    types = dict(graph.types)
    for name, value in new.items():
        value = readonly(value)
        constants[name] = value
        types[name] = TensorType(tuple(value.shape), value.dtype.name)
    return graph.replace(nodes=tuple(nodes), constants=constants, types=types)


#: constants larger than this are not materialized when they would grow the model
FOLD_LIMIT_BYTES = 64 << 20


# --- passes ------------------------------------------------------------------------------


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all compile-time constants."""
    values = dict(graph.constants)
    kept: list[Node] = []
    folded: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        op = OPS[node.op_type]
        if op.needs_values and not all(not i or i in values for i in node.inputs):
            kept.append(node)
            continue
        ctx = _context(graph, node, values)
        out_types = [graph.types[o] if o else TensorType((0,), "float32") for o in node.outputs]
        if not all(is_static(d) for t in out_types for d in t.shape):
            kept.append(node)  # its size is known only at run time
            continue
        out_bytes = sum(t.nbytes for t in out_types)
        in_bytes = sum(values[i].nbytes for i in node.inputs if i in values)
        if out_bytes > FOLD_LIMIT_BYTES and out_bytes > in_bytes:
            kept.append(node)  # e.g. an Expand of a scalar: cheaper to compute at run time
            continue
        results = try_evaluate(ctx, out_types)
        if results is None:
            kept.append(node)
            continue
        for name, value in zip(node.outputs, results, strict=False):
            if name:
                values[name] = value
                folded[name] = value
    return _with_constants(graph, kept, folded)


def eliminate_identities(graph: Graph) -> Graph:
    """Identity and inference-mode Dropout copy their input: consumers read it directly."""
    mapping: dict[str, str] = {}
    renamed_outputs: dict[str, str] = {}
    masks: dict[str, np.ndarray] = {}
    outputs = set(graph.outputs)
    kept = []
    for node in graph.nodes:
        if OPS[node.op_type].kind is not OpKind.ELIMINATED:
            kept.append(node)
            continue
        src, dst = node.inputs[0], node.outputs[0]
        if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
            masks[node.outputs[1]] = np.ones(graph.types[src].shape, dtype=bool)
        if dst not in outputs:
            mapping[dst] = src
            continue
        producer = graph.producers.get(_resolve(mapping, src))
        src = _resolve(mapping, src)
        if producer is not None and src not in outputs and src not in renamed_outputs:
            renamed_outputs[src] = dst
        else:
            kept.append(Node(node.name, "Identity", (src,), (dst,), {}))
    kept = _rename_inputs(kept, mapping)
    if renamed_outputs:
        kept = _rename_outputs(kept, renamed_outputs)
    types = dict(graph.types)
    for old, new in renamed_outputs.items():
        types[new] = types[old]
    return _with_constants(graph.replace(types=types), kept, masks)


def _rename_outputs(nodes: list[Node], renames: dict[str, str]) -> list[Node]:
    """Rename produced tensors (and their uses) so a graph output keeps its name."""
    out = []
    for node in nodes:
        outs = tuple(renames.get(o, o) for o in node.outputs)
        ins = tuple(renames.get(i, i) for i in node.inputs)
        if outs != node.outputs or ins != node.inputs:
            node = Node(node.name, node.op_type, ins, outs, node.attrs, node.domain)
        out.append(node)
    return out


def sum_to_add(graph: Graph) -> Graph:
    """Sum of n inputs becomes a chain of binary Adds, which fuse as elementwise ops; a Sum of
    one input becomes an Identity, which `eliminate_identities` (next) removes."""
    names = _Names(graph)
    nodes: list[Node] = []
    types = dict(graph.types)
    for node in graph.nodes:
        live = [i for i in node.inputs if i]
        if node.op_type != "Sum":
            nodes.append(node)
        elif len(live) == 1:
            nodes.append(Node(node.name, "Identity", (live[0],), node.outputs, {}))
        else:
            acc = live[0]
            for index, operand in enumerate(live[1:], start=1):
                last = index == len(live) - 1
                out = node.outputs[0] if last else names(f"{node.outputs[0]}/partial{index}")
                if not last:
                    shape = np.broadcast_shapes(graph.types[acc].shape, graph.types[operand].shape)
                    types[out] = TensorType(tuple(shape), graph.types[acc].dtype)
                name = node.name if last else names(f"{node.name}/add{index}")
                nodes.append(Node(name, "Add", (acc, operand), (out,), {}))
                acc = out
    return graph.replace(nodes=tuple(nodes), types=types)


def batchnorm_to_affine(graph: Graph) -> Graph:
    """Inference BatchNormalization is y = x * s + t per channel: as Mul and Add it folds
    into a preceding Conv / Gemm (`fold_affine_into_anchor`) and fuses like any
    elementwise op elsewhere."""
    names = _Names(graph)
    nodes: list[Node] = []
    consts: dict[str, np.ndarray] = {}
    types = dict(graph.types)
    for node in graph.nodes:
        params = node.inputs[1:5]
        affine = node.op_type == "BatchNormalization" and not node.attrs.get("training_mode", 0)
        if not affine or not all(p in graph.constants for p in params):
            nodes.append(node)
            continue
        x = node.inputs[0]
        xt = graph.types[x]
        scale, bias, mean, var = (graph.constants[p].astype(np.float64) for p in params)
        eps = float(node.attrs.get("epsilon", 1e-5))
        s = scale / np.sqrt(var + eps)
        t = bias - mean * s
        channel_shape = (-1,) + (1,) * (xt.rank - 2)
        s_name, t_name = names(f"{node.name}/scale"), names(f"{node.name}/shift")
        consts[s_name] = s.reshape(channel_shape).astype(xt.dtype)
        consts[t_name] = t.reshape(channel_shape).astype(xt.dtype)
        mid = names(f"{node.outputs[0]}/scaled")
        types[mid] = xt
        nodes.append(Node(names(f"{node.name}/mul"), "Mul", (x, s_name), (mid,), {}))
        nodes.append(Node(node.name, "Add", (mid, t_name), (node.outputs[0],), {}))
    return _with_constants(graph.replace(types=types), nodes, consts)


def _per_channel(graph: Graph, operand: str, out: str, axis: int) -> np.ndarray | None:
    """The constant `operand` as a vector over `axis` of `out`, if it varies only there and
    broadcasting it does not change `out`'s shape."""
    if operand not in graph.constants:
        return None
    value = graph.constants[operand]
    out_type = graph.types[out]
    if value.ndim > out_type.rank:
        return None
    shape = (1,) * (out_type.rank - value.ndim) + tuple(value.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != axis):
        return None
    channels = out_type.shape[axis]
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float64)


def fold_affine_into_anchor(graph: Graph) -> Graph:
    """Conv / Gemm followed by a per-output-channel Mul or Add by a constant (BatchNorm,
    Caffe "Scale" layers, biases) becomes one Conv / Gemm with new weights and bias."""
    names = _Names(graph)
    outputs = set(graph.outputs)
    nodes: list[Node | None] = list(graph.nodes)
    position = {out: i for i, n in enumerate(graph.nodes) for out in n.outputs if out}
    consts: dict[str, np.ndarray] = {}
    known = dict(graph.constants)
    for index, node in enumerate(graph.nodes):
        if node.op_type not in ("Mul", "Add") or node.domain:
            continue
        for slot in (0, 1):
            x, operand = node.inputs[slot], node.inputs[1 - slot]
            where = position.get(x)
            anchor = nodes[where] if where is not None else None
            if anchor is None or anchor.op_type not in ("Conv", "Gemm") or x in outputs:
                continue
            if (
                len(graph.consumers.get(x, ())) != 1
                or graph.types[x] != graph.types[node.outputs[0]]
            ):
                continue
            vector = _per_channel(graph, operand, x, 1)
            if vector is None or graph.types[operand].dtype != graph.types[x].dtype:
                continue
            result = _fold_into_anchor(known, graph.types, anchor, node.op_type, vector, names)
            if result is None:
                continue
            new_anchor, new_consts = result
            consts.update(new_consts)
            known.update(new_consts)
            nodes[where] = Node(
                new_anchor.name,
                new_anchor.op_type,
                new_anchor.inputs,
                node.outputs,
                new_anchor.attrs,
            )
            nodes[index] = None
            position[node.outputs[0]] = where
            break
    return _with_constants(graph, [n for n in nodes if n is not None], consts)


Constants = Mapping[str, np.ndarray]
Types = Mapping[str, TensorType]


def _fold_into_anchor(
    constants: Constants, types: Types, anchor: Node, op: str, vector: np.ndarray, names: _Names
) -> tuple[Node, dict[str, np.ndarray]] | None:
    """Conv / Gemm `anchor` with the per-output-channel Mul / Add by `vector` folded into
    its weights (input 1, scaled along their output-channel axis) and bias (input 2, a
    Gemm's scaled by `beta`); None unless both are constants."""
    w_name, b_name = anchor.input(1), anchor.input(2)
    if w_name not in constants or (b_name and b_name not in constants):
        return None
    w = constants[w_name]
    dtype = w.dtype
    attrs = dict(anchor.attrs)
    if anchor.op_type == "Conv":
        channels, axis, beta = w.shape[0], 0, 1.0
    else:
        # B is (K, N), or (N, K) under transB
        channels = types[anchor.outputs[0]].shape[1]
        axis = 0 if int(attrs.get("transB", 0)) else 1
        beta = float(attrs.get("beta", 1.0))
        attrs["beta"] = 1.0
    bias = beta * constants[b_name].astype(np.float64) if b_name else np.zeros(channels)
    bias = np.broadcast_to(bias, np.broadcast_shapes(bias.shape, (channels,)))
    consts = {}
    new_w = w_name
    if op == "Mul":
        new_w = names(f"{w_name}/folded")
        scale = [1] * w.ndim
        scale[axis] = -1
        consts[new_w] = (w * vector.reshape(scale)).astype(dtype)
        bias = bias * vector
    else:
        bias = bias + vector
    new_b = names(f"{anchor.name}/bias_folded")
    consts[new_b] = np.ascontiguousarray(bias).astype(dtype)
    inputs = (anchor.inputs[0], new_w, new_b)
    return Node(anchor.name, anchor.op_type, inputs, anchor.outputs, attrs), consts


def sample_strided_1x1_convs(graph: Graph) -> Graph:
    """A 1×1 Conv with strides and no padding reads one pixel in every stride: a Slice
    with those steps samples its input into a dense tensor, and the Conv runs with unit
    strides. Fusion keeps the Slice as the conv's prologue (materialized by default)."""
    names = _Names(graph)
    nodes: list[Node] = []
    consts: dict[str, np.ndarray] = {}
    types = dict(graph.types)
    for node in graph.nodes:
        strides = _strided_1x1(graph, node)
        if strides is None:
            nodes.append(node)
            continue
        x = node.inputs[0]
        spatial = graph.types[x].shape[2:]
        params = {
            "starts": [0] * len(spatial),
            "ends": list(spatial),
            "axes": list(range(2, 2 + len(spatial))),
            "steps": list(strides),
        }
        inputs = [x]
        for what, values in params.items():
            name = names(f"{node.name}/sample_{what}")
            consts[name] = np.array(values, dtype=np.int64)
            types[name] = TensorType(consts[name].shape, "int64")
            inputs.append(name)
        sampled = names(f"{x}/sampled")
        slice_node = Node(names(f"{node.name}/sample"), "Slice", tuple(inputs), (sampled,), {})
        ctx = InferContext.looking_up(slice_node, types, consts, graph.opset)
        (types[sampled],) = OPS["Slice"].infer(ctx)
        attrs = {k: v for k, v in node.attrs.items() if k not in ("strides", "auto_pad", "pads")}
        conv = Node(node.name, "Conv", (sampled, *node.inputs[1:]), node.outputs, attrs)
        nodes += [slice_node, conv]
    return _with_constants(graph.replace(types=types), nodes, consts)


def _strided_1x1(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The strides of a strided 1×1 Conv without padding (None for any other node)."""
    if node.op_type != "Conv" or node.domain or len(node.inputs) < 2:
        return None
    x, w = graph.types.get(node.inputs[0]), graph.types.get(node.inputs[1])
    if x is None or w is None or len(x.shape) < 3 or any(k != 1 for k in w.shape[2:]):
        return None
    rank = len(x.shape) - 2
    strides = tuple(int(s) for s in node.attrs.get("strides", (1,) * rank))
    pads = node.attrs.get("pads", (0,) * 2 * rank)
    # with a 1×1 kernel every auto_pad gives no padding and ⌈d/s⌉ outputs
    if len(strides) != rank or all(s == 1 for s in strides) or any(int(p) for p in pads):
        return None
    return strides


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes no output depends on, and constants nothing reads."""
    digraph = graph.digraph
    live: set[str] = set()
    for out in graph.outputs:
        producer = graph.producers.get(out)
        if producer is not None and producer.name not in live:
            live.add(producer.name)
            live |= nx.ancestors(digraph, producer.name)
    nodes = tuple(n for n in graph.nodes if n.name in live)
    used = {i for n in nodes for i in n.inputs if i} | set(graph.outputs) | set(graph.inputs)
    constants = {k: v for k, v in graph.constants.items() if k in used}
    produced = {o for n in nodes for o in n.outputs if o}
    types = {k: v for k, v in graph.types.items() if k in used or k in produced}
    aliases = {k: v for k, v in graph.aliases.items() if k in produced}
    return graph.replace(nodes=nodes, constants=constants, types=types, aliases=aliases)


def mark_views(graph: Graph) -> Graph:
    """Reshape / Flatten / Squeeze / Unsqueeze only relabel a row-major buffer: their output
    aliases the input's memory and costs nothing at run time. A graph output stays a copy,
    since it needs a buffer of its own."""
    aliases: dict[str, str] = {}
    outputs = set(graph.outputs)
    for node in graph.nodes:
        if OPS[node.op_type].kind is not OpKind.VIEW:
            continue
        src, dst = node.inputs[0], node.outputs[0]
        if dst in outputs or src in graph.constants:
            continue
        aliases[dst] = aliases.get(src, src)
    return graph.replace(aliases=aliases)


PASSES: tuple[Pass, ...] = (
    Pass("widen_low_precision", widen_low_precision, "16-bit floats compute in float32, rounded"),
    Pass(
        "fold_constants",
        fold_constants,
        "weights (ConstantOfShape fills) and shape chains are computed once, at compile time",
    ),
    Pass(
        "sum_to_add",
        sum_to_add,
        "binary Adds are elementwise ops that fuse into the producing conv's tile",
    ),
    Pass(
        "eliminate_identities",
        eliminate_identities,
        "Identity and inference Dropout only copy; consumers read the source",
    ),
    Pass(
        "batchnorm_to_affine",
        batchnorm_to_affine,
        "inference BatchNorm is a per-channel scale and shift",
    ),
    Pass(
        "fold_affine_into_anchor",
        fold_affine_into_anchor,
        "a per-channel scale / shift after Conv or Gemm is folded into its weights and bias",
    ),
    Pass(
        "sample_strided_1x1_convs",
        sample_strided_1x1_convs,
        "a strided 1×1 conv gathers one pixel per cache line; sampled once, it is a dense "
        "matrix product",
    ),
    Pass(
        "eliminate_dead_code",
        eliminate_dead_code,
        "nodes no output depends on and unused constants cost time and memory",
    ),
    Pass("mark_views", mark_views, "reshape-like ops are zero-copy aliases of a row-major buffer"),
)


def optimize(graph: Graph, config: OptimizeConfig | None = None) -> Graph:
    """The graph after every enabled pass of the pipeline."""
    return optimize_with_report(graph, config)[0]


def optimize_with_report(
    graph: Graph, config: OptimizeConfig | None = None
) -> tuple[Graph, list[PassReport]]:
    config = config or OptimizeConfig()
    unknown = config.disabled - {p.name for p in PASSES}
    if unknown:
        raise InputError(
            f"OptimizeConfig.disabled names unknown pass(es) {sorted(unknown)}; "
            f"passes are {[p.name for p in PASSES]}"
        )
    reports = []
    for p in PASSES:
        if p.name in config.disabled:
            continue
        start = time.perf_counter()
        before = len(graph.nodes)
        graph = p.run(graph)
        reports.append(PassReport(p.name, before, len(graph.nodes), time.perf_counter() - start))
    return graph, reports


def verify_graph(graph: Graph) -> None:
    """Structural invariants every pass must keep (used by the tests after each pass)."""
    available = set(graph.inputs) | set(graph.constants)
    for node in graph.nodes:
        for tensor in node.inputs:
            if tensor and tensor not in available:
                raise AssertionError(f"{node.label} reads '{tensor}' before it is produced")
        for tensor in node.outputs:
            if tensor:
                if tensor in available:
                    raise AssertionError(f"'{tensor}' is produced twice")
                if tensor not in graph.types:
                    raise AssertionError(f"'{tensor}' has no type")
                available.add(tensor)
    for out in graph.outputs:
        if out not in available:
            raise AssertionError(f"graph output '{out}' is never produced")
    names = [n.name for n in graph.nodes]
    if len(names) != len(set(names)):
        raise AssertionError("node names are not unique")
