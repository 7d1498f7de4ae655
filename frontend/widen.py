"""bfloat16 arithmetic as the ONNX spec defines it: computed in float32, rounded to bfloat16.

bfloat16 is a storage type here. `widen_bfloat16` rewrites every node that reads or writes
bfloat16 tensors (except casts and views, which do no arithmetic) into the same node on
float32 tensors, between a Cast of each bfloat16 input to float32 (exact) and a Cast of each
output back to bfloat16 (round to nearest even, NaN stays NaN). The casts are elementwise,
so fusion puts them inside the node's kernel: a bfloat16 tensor is read and written as
bfloat16, and everything in between is float32. Only `Cast` kernels and copies ever see
bfloat16 in the poly and codegen stages (codegen/values.py converts it with shifts).
"""

from __future__ import annotations

import numpy as np
import onnx

from .graph import Graph, Node, TensorType, readonly, unique_name
from .ops import OPS, OpKind

BF16 = "bfloat16"
#: ops that read only a tensor's type, or convert it themselves (codegen rounds)
_NATIVE = frozenset({"Cast", "Shape", "Size"})
#: attributes that name an output element type (EyeLike, Random*, ...)
_DTYPE_ATTRS = ("dtype",)


def widen_bfloat16(graph: Graph) -> Graph:
    """The graph with every bfloat16 computation done in float32 between casts."""
    if not any(t.dtype == BF16 for t in graph.types.values()) and not any(
        _attrs_name_bf16(n) for n in graph.nodes
    ):
        return graph
    taken = set(graph.types) | {n.name for n in graph.nodes}
    types = dict(graph.types)
    constants = dict(graph.constants)
    widened: dict[str, str] = {}  # bfloat16 tensor -> its float32 copy
    nodes: list[Node] = []

    def float32_of(name: str, node: Node) -> str:
        if name not in widened:
            wide = unique_name(f"{name}_f32", taken)
            types[wide] = TensorType(types[name].shape, "float32")
            if name in graph.constants:
                constants[wide] = readonly(np.asarray(graph.constants[name], dtype=np.float32))
            else:
                nodes.append(_cast(unique_name(f"{node.name}_widen", taken), name, wide, "float32"))
            widened[name] = wide
        return widened[name]

    for node in graph.nodes:
        if not _computes_bf16(node, graph):
            nodes.append(node)
            continue
        inputs = tuple(
            float32_of(i, node) if i and types[i].dtype == BF16 else i for i in node.inputs
        )
        outputs = []
        rounds = []
        for out in node.outputs:
            if out and types[out].dtype == BF16:
                wide = unique_name(f"{out}_f32", taken)
                types[wide] = TensorType(types[out].shape, "float32")
                outputs.append(wide)
                rounds.append(_cast(unique_name(f"{node.name}_round", taken), wide, out, BF16))
            else:
                outputs.append(out)
        attrs = _float32_attrs(node)
        nodes.append(Node(node.name, node.op_type, inputs, tuple(outputs), attrs, node.domain))
        nodes.extend(rounds)
    return graph.replace(nodes=tuple(nodes), types=types, constants=constants)


def _computes_bf16(node: Node, graph: Graph) -> bool:
    if node.op_type in _NATIVE:
        return False
    op = OPS.get(node.op_type)
    if op is not None and op.kind is OpKind.VIEW:
        return False
    tensors = [t for t in (*node.inputs, *node.outputs) if t]
    return any(graph.types[t].dtype == BF16 for t in tensors) or _attrs_name_bf16(node)


def _attrs_name_bf16(node: Node) -> bool:
    for key, value in node.attrs.items():
        if key in _DTYPE_ATTRS and value == onnx.TensorProto.BFLOAT16 and node.op_type != "Cast":
            return True
        if isinstance(value, np.ndarray) and value.dtype.name == BF16:
            return True
    return False


def _float32_attrs(node: Node) -> dict[str, object]:
    """The node's attributes with bfloat16 types and tensors (ConstantOfShape's value)
    made float32: the node now computes float32."""
    attrs = dict(node.attrs)
    for key, value in node.attrs.items():
        if key in _DTYPE_ATTRS and value == onnx.TensorProto.BFLOAT16:
            attrs[key] = onnx.TensorProto.FLOAT
        elif isinstance(value, np.ndarray) and value.dtype.name == BF16:
            attrs[key] = readonly(value.astype(np.float32))
    return attrs


def _cast(name: str, source: str, target: str, dtype: str) -> Node:
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return Node(name, "Cast", (source,), (target,), {"to": to})
