"""16-bit floats computed in float32 and rounded once per op, as the ONNX spec says of
bfloat16 and as onnxruntime computes float16 wherever it has no float16 kernel.

bfloat16 and float16 are storage types here. `widen_low_precision` rewrites every node that
reads or writes them (except casts and views, which do no arithmetic) into the same node on
float32 tensors, between a Cast of each 16-bit input to float32 (exact) and a Cast of each
output back (round to nearest even, NaN stays NaN). The casts are elementwise, so fusion
puts them inside the node's kernel: a 16-bit tensor is read and written as 16 bits, and
everything in between is float32, with one rounding per op: float16 matches onnxruntime's
results to the bit where step-by-step float16 arithmetic (an Elu's exp(x) - 1) was several
ulps off. Only `Cast` kernels and copies see these dtypes in the poly and codegen stages
(codegen/bfloat16.py converts bfloat16 with shifts; LLVM has float16's `half`).
"""

from __future__ import annotations

import numpy as np
import onnx

from polytile.errors import UnsupportedOpError
from polytile.names import unique_name

from .graph import Graph, Node, TensorType, readonly
from .narrow import is_narrow
from .ops import OPS, OpKind

#: dtype → its ONNX element type, for the attributes that name one
WIDENED = {"bfloat16": onnx.TensorProto.BFLOAT16, "float16": onnx.TensorProto.FLOAT16}
#: ops that read only a tensor's type, or convert it themselves (codegen rounds), and
#: Range, always folded (its values set its shape), which has a stash_type of its own
NATIVE = frozenset({"Cast", "Shape", "Size", "Range"})
#: what may read or write the narrow types (float8, float4, 4- and 2-bit integers): the
#: ONNX spec defines little else on them, and none of it computes (frontend/narrow.py)
_NARROW_KINDS = frozenset({OpKind.VIEW, OpKind.SHAPE, OpKind.ELIMINATED})
#: attributes that name an output element type (EyeLike, Random*, ...)
_DTYPE_ATTRS = ("dtype",)


def widen_low_precision(graph: Graph) -> Graph:
    """The graph with every bfloat16 / float16 computation done in float32 between casts.
    A node computing on a narrow type (float8, ...) is refused here."""
    for node in graph.nodes:
        _refuse_narrow(node, graph)
    if not any(_computes_narrow(n, graph) for n in graph.nodes):
        return graph
    taken = set(graph.types) | {n.name for n in graph.nodes}
    types = dict(graph.types)
    constants = dict(graph.constants)
    widened: dict[str, str] = {}  # 16-bit tensor -> its float32 copy
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
        if not _computes_narrow(node, graph):
            nodes.append(node)
            continue
        inputs = tuple(
            float32_of(i, node) if i and types[i].dtype in WIDENED else i for i in node.inputs
        )
        outputs = []
        rounds = []
        for out in node.outputs:
            dtype = types[out].dtype if out else ""
            if dtype in WIDENED:
                wide = unique_name(f"{out}_f32", taken)
                types[wide] = TensorType(types[out].shape, "float32")
                outputs.append(wide)
                rounds.append(_cast(unique_name(f"{node.name}_round", taken), wide, out, dtype))
            else:
                outputs.append(out)
        attrs = _float32_attrs(node)
        nodes.append(Node(node.name, node.op_type, inputs, tuple(outputs), attrs, node.domain))
        nodes.extend(rounds)
    return graph.replace(nodes=tuple(nodes), types=types, constants=constants)


def _refuse_narrow(node: Node, graph: Graph) -> None:
    """Only Cast converts the narrow types; views, Identity and Shape move or read them."""
    op = OPS.get(node.op_type)
    if node.op_type in ("Cast", "Shape", "Size") or (op is not None and op.kind in _NARROW_KINDS):
        return
    for tensor in (*node.inputs, *node.outputs):
        if tensor and is_narrow(graph.types[tensor].dtype):
            dtype = graph.types[tensor].dtype
            raise UnsupportedOpError(
                f"{node.label} in model '{graph.name}': tensor '{tensor}' has element type "
                f"{dtype}, on which polytile supports only Cast, CastLike and data views",
                ((node.name, node.op_type, f"dtype {dtype}"),),
            )


def _computes_narrow(node: Node, graph: Graph) -> bool:
    if node.op_type in NATIVE:
        return False
    op = OPS.get(node.op_type)
    if op is not None and op.kind is OpKind.VIEW:
        return False
    tensors = [t for t in (*node.inputs, *node.outputs) if t]
    return any(graph.types[t].dtype in WIDENED for t in tensors) or _attrs_name_narrow(node)


def _attrs_name_narrow(node: Node) -> bool:
    for key, value in node.attrs.items():
        if key in _DTYPE_ATTRS and value in WIDENED.values():
            return True
        if isinstance(value, np.ndarray) and value.dtype.name in WIDENED:
            return True
    return False


def _float32_attrs(node: Node) -> dict[str, object]:
    """The node's attributes with 16-bit types and tensors (ConstantOfShape's value) made
    float32: the node now computes float32."""
    attrs = dict(node.attrs)
    for key, value in node.attrs.items():
        if key in _DTYPE_ATTRS and value in WIDENED.values():
            attrs[key] = onnx.TensorProto.FLOAT
        elif isinstance(value, np.ndarray) and value.dtype.name in WIDENED:
            attrs[key] = readonly(value.astype(np.float32))
    return attrs


def _cast(name: str, source: str, target: str, dtype: str) -> Node:
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return Node(name, "Cast", (source,), (target,), {"to": to})
