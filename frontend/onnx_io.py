"""Conversions between ONNX protobufs and the graph IR: attributes, dtypes, export.

Export writes a graph back as a valid ONNX model in its canonical opset. Tests use it to run
a graph before and after a pass with onnxruntime or the onnx reference evaluator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from polytile.errors import ModelError, UnsupportedOpError

from .graph import SUPPORTED_DTYPES, Graph, Node, TensorType, readonly


def onnx_to_dtype(elem_type: int, what: str) -> str:
    """numpy dtype name for an ONNX element type; unsupported types name `what`."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedOpError(
            f"{what} has element type {dtype}, which polytile does not support"
        )
    return dtype


def dtype_to_onnx(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def attribute_value(attr: onnx.AttributeProto, where: str) -> Any:
    """A plain, immutable Python value for an attribute (tensors become read-only arrays)."""
    kind = attr.type
    if kind == onnx.AttributeProto.TENSOR:
        return readonly(numpy_helper.to_array(attr.t))
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(
            f"{where}: attribute '{attr.name}' holds a subgraph; control flow is not supported"
        )
    if kind in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
        raise UnsupportedOpError(f"{where}: attribute '{attr.name}' is a sparse tensor")
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


def make_attribute(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(np.asarray(value)))
    if isinstance(value, tuple | list):
        values = list(value)
        if not values:
            return helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)
        if all(isinstance(v, int | np.integer) for v in values):
            return helper.make_attribute(name, [int(v) for v in values])
        if all(isinstance(v, str) for v in values):
            return helper.make_attribute(name, values)
        return helper.make_attribute(name, [float(v) for v in values])
    if isinstance(value, bool | np.bool_):
        return helper.make_attribute(name, int(value))
    if isinstance(value, np.integer):
        return helper.make_attribute(name, int(value))
    if isinstance(value, np.floating):
        return helper.make_attribute(name, float(value))
    return helper.make_attribute(name, value)


def node_to_proto(node: Node) -> onnx.NodeProto:
    proto = helper.make_node(
        node.op_type, list(node.inputs), list(node.outputs), name=node.name, domain=node.domain
    )
    proto.attribute.extend(make_attribute(k, v) for k, v in sorted(node.attrs.items()))
    return proto


def value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype_to_onnx(t.dtype), list(t.shape))


def export_model(graph: Graph, with_value_info: bool = False) -> onnx.ModelProto:
    """The graph as an ONNX model in its canonical opset (views become their ops again)."""
    initializers = [
        numpy_helper.from_array(np.asarray(value), name)
        for name, value in graph.constants.items()
        if name in _used_tensors(graph)
    ]
    onnx_graph = helper.make_graph(
        [node_to_proto(node) for node in graph.nodes],
        graph.name or "polytile",
        [value_info(name, graph.types[name]) for name in graph.inputs],
        [value_info(name, graph.types[name]) for name in graph.outputs],
        initializer=initializers,
    )
    if with_value_info:
        produced = [out for node in graph.nodes for out in node.outputs if out]
        onnx_graph.value_info.extend(
            value_info(t, graph.types[t]) for t in produced if t not in graph.outputs
        )
    model = helper.make_model(
        onnx_graph,
        opset_imports=[helper.make_opsetid("", graph.opset)],
        producer_name="polytile",
    )
    model.ir_version = min(model.ir_version, max_ir_version(graph.opset))
    return model


def _used_tensors(graph: Graph) -> set[str]:
    used = {name for node in graph.nodes for name in node.inputs}
    return used | set(graph.outputs)


def max_ir_version(opset: int) -> int:
    """The newest IR version that goes with an opset, so older runtimes accept exports."""
    for ir_version, ai_onnx in sorted(
        ((ir, ops) for _, ir, ops, *_ in helper.VERSION_TABLE), reverse=True
    ):
        if ai_onnx <= opset:
            return ir_version
    return onnx.IR_VERSION


def constant_arrays(model: onnx.ModelProto, where: str) -> Mapping[str, np.ndarray]:
    """The model's initializers as read-only arrays (external data must be loaded already)."""
    out = {}
    for init in model.graph.initializer:
        try:
            out[init.name] = readonly(numpy_helper.to_array(init))
        except Exception as exc:  # a malformed initializer is the model's fault
            raise ModelError(f"{where}: initializer '{init.name}' cannot be read: {exc}") from exc
    return out
