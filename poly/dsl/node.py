"""`kernel_from_node`: the kernel of one ONNX node through the real frontend and lowering,
for comparing hand-written and lowered kernels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from polytile.errors import InputError
from polytile.poly.ir.kernel import Kernel

if TYPE_CHECKING:
    from polytile.frontend import OptimizeConfig
    from polytile.poly.lower.base import LowerConfig


def kernel_from_node(
    node: Any,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    opset: int = 17,
    *,
    dtype: str = "float32",
    dtypes: Mapping[str, str] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    passes: OptimizeConfig | None = None,
    lowering: LowerConfig | None = None,
) -> Kernel:
    """The kernel of a single ONNX node (a NodeProto, or a ModelProto), through the real
    frontend (import, optimize, partition) and lowering.

    For a NodeProto, `input_shapes` gives every non-constant input's shape, `dtype` /
    `dtypes` their element types, and `initializers` constant inputs (numpy arrays).
    `passes` selects the frontend passes (all by default), e.g. to study a kernel that a
    pass would rewrite, and `lowering` the compute definitions. Kernel tensors are renamed
    isl-safe; `kernel.by_source(onnx_name)` finds them."""
    import onnx

    from polytile.frontend import import_model, optimize, partition
    from polytile.poly.lower import lower, lower_group

    shapes = dict(input_shapes or {})
    if isinstance(node, onnx.ModelProto):
        model, given = node, shapes
    elif isinstance(node, onnx.NodeProto):
        model = _one_node_model(
            node, shapes, opset, dtype, dict(dtypes or {}), dict(initializers or {})
        )
        given = {}
    else:
        raise InputError(f"kernel_from_node takes an onnx NodeProto or ModelProto, got {node!r}")
    graph = optimize(import_model(model, input_shapes=given), passes)
    groups = partition(graph).groups
    if len(groups) == 1:
        return lower(graph, groups[0], lowering)
    if not groups:
        raise InputError(
            f"model '{graph.name}': nothing is left to compute after optimization "
            "(the node is a view or folds to a constant)"
        )
    nodes = [n for g in groups for n in g.nodes]
    produced = {t for g in groups for t in g.outputs}
    inputs = list(dict.fromkeys(t for g in groups for t in g.inputs if t not in produced))
    name = f"{graph.name}_node"
    return lower_group(graph, nodes, inputs, graph.outputs, name=name, config=lowering)


def _one_node_model(
    node: Any,
    shapes: dict[str, Sequence[int]],
    opset: int,
    dtype: str,
    dtypes: dict[str, str],
    initializers: dict[str, np.ndarray],
) -> Any:
    from onnx import helper, numpy_helper

    what = f"node '{node.name or node.op_type}' ({node.op_type})"
    names = list(dict.fromkeys(i for i in node.input if i))
    for given in shapes:
        if given not in names or given in initializers:
            raise InputError(f"input_shapes names '{given}', which is not an input of {what}")
    inputs = []
    for name in names:
        if name in initializers:
            continue
        if name not in shapes:
            raise InputError(f"{what}: give the shape of input '{name}' in input_shapes")
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtypes.get(name, dtype)))
        inputs.append(helper.make_tensor_value_info(name, elem, [int(d) for d in shapes[name]]))
    outputs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
    graph = helper.make_graph(
        [node],
        node.name or node.op_type.lower(),
        inputs,
        outputs,
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
