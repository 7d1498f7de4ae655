"""Load and validate an ONNX model and turn it into a statically shaped `Graph`.

Import does three things in one topological walk, because each needs the others' results:
canonicalize every node to the canonical opset (old Softmax, Clip, Split, ... semantics),
infer static types, and propagate small compile-time values (shape chains) so that
Reshape, Expand, Slice, ... get static shapes. Large constants are folded later by the
`fold_constants` pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.defs
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from polytile.errors import InputError, ModelError, PolytileError, ShapeError, UnsupportedOpError

from .control import (
    CONTROL_FLOW,
    bind_outputs,
    inline,
    loop_iterations,
    loop_never_exits,
    outer_reads,
    scan_nodes,
    subgraph,
)
from .evaluate import try_evaluate
from .graph import Graph, Node, TensorType, readonly, unique_name
from .onnx_io import attribute_value, constant_arrays, onnx_to_dtype
from .ops import OPS, InferContext

MIN_OPSET = 7
#: the opset the graph IR is expressed in (at least; newer models keep their opset)
CANONICAL_OPSET = 21
#: values with at most this many elements are propagated during import (shape chains)
PROPAGATE_LIMIT = 1 << 16
#: a Loop is unrolled for at most this many iterations (exporters write INT64_MAX trip
#: counts for loops that exit on a condition)
MAX_UNROLL = 4096
#: no tensor may have more elements than this (a guard against absurd shapes)
MAX_ELEMENTS = 1 << 34

ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto


def load_model(source: ModelSource) -> tuple[onnx.ModelProto, str]:
    """The ModelProto and a display name for it, with clear errors for unreadable input."""
    if isinstance(source, onnx.ModelProto):
        load_external_data(source, None, source.graph.name or "<model>")
        return source, source.graph.name or "<model>"
    if isinstance(source, bytes | bytearray):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(source))
        except DecodeError as exc:
            raise ModelError(f"the given bytes are not an ONNX model: {exc}") from exc
        _nonempty(model, "<bytes>")
        load_external_data(model, None, model.graph.name or "<bytes>")
        return model, model.graph.name or "<bytes>"
    if not isinstance(source, str | os.PathLike):
        raise InputError(
            f"a model is a path, bytes or onnx.ModelProto, not {type(source).__name__}"
        )
    path = Path(source)
    if not path.is_file():
        raise InputError(f"model file '{path}' does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise ModelError(
            f"model '{path}' is not a readable ONNX file (truncated or not ONNX): {exc}"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelError(f"model '{path}' cannot be loaded: {exc}") from exc
    _nonempty(model, str(path))
    load_external_data(model, path.parent, str(path))
    return model, path.stem


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in external_data_helper._get_all_tensors(model)
        if t.data_location == onnx.TensorProto.EXTERNAL
    ]


def load_external_data(model: onnx.ModelProto, base: Path | None, where: str) -> None:
    """Read the data of tensors stored in external files (paths relative to the model's
    folder), in place; a missing, escaping or short file is a ModelError naming it and
    the tensor. Models over 2 GB are stored this way."""
    tensors = _external_tensors(model)
    if not tensors:
        return
    if base is None:
        tensor = tensors[0]
        location = external_data_helper.ExternalDataInfo(tensor).location
        raise ModelError(
            f"model '{where}': tensor '{tensor.name}' keeps its data in the external file "
            f"'{location}', which was not loaded: give the model's path instead, or "
            "onnx.load it with its external data"
        )
    root = base.resolve()
    for tensor in tensors:
        info = external_data_helper.ExternalDataInfo(tensor)
        file = (root / info.location).resolve()
        if not file.is_relative_to(root):
            raise ModelError(
                f"model '{where}': tensor '{tensor.name}' names external file "
                f"'{info.location}' outside the model's folder"
            )
        if not file.is_file():
            raise ModelError(
                f"model '{where}': tensor '{tensor.name}' keeps its data in '{file}', "
                "which does not exist"
            )
        size = file.stat().st_size
        needed = (info.offset or 0) + (info.length or 0)
        if info.length is not None and needed > size:
            raise ModelError(
                f"model '{where}': tensor '{tensor.name}' needs bytes {info.offset or 0} to "
                f"{needed} of '{file}', which holds only {size} bytes"
            )
    try:
        external_data_helper.load_external_data_for_model(model, str(root))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"model '{where}': external data cannot be read: {exc}") from exc


def _check_shape(name: str, shape: object, model: str) -> tuple[int, ...]:
    """An `input_shapes` entry as a tuple of non-negative ints, or a clear InputError."""
    bad = InputError(
        f"input_shapes['{name}'] for model '{model}' must be a sequence of non-negative "
        f"integers, got {shape!r}"
    )
    if isinstance(shape, str | bytes) or not hasattr(shape, "__iter__"):
        raise bad
    dims = list(shape)  # type: ignore[call-overload]
    if not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in dims
    ):
        raise bad
    return tuple(int(d) for d in dims)


def _nonempty(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    if not model.HasField("graph") or not model.opset_import:
        raise ModelError(f"model '{where}' has no graph or no opset: not an ONNX model")
    return model


def check_model(model: onnx.ModelProto, name: str) -> int:
    """Validate with onnx.checker; return the default-domain opset."""
    try:
        _check_allowing_unknown_rank(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise ModelError(f"model '{name}' fails the ONNX checker: {first}") from exc
    except ValueError as exc:  # e.g. models over 2 GB given in memory
        raise ModelError(f"model '{name}' cannot be checked: {exc}") from exc
    opsets = {imp.domain or "ai.onnx": imp.version for imp in model.opset_import}
    if "ai.onnx" not in opsets:
        raise ModelError(f"model '{name}' does not import the default ONNX domain")
    opset = opsets["ai.onnx"]
    newest = onnx.defs.onnx_opset_version()
    if opset > newest or (opset < MIN_OPSET and _changed_since(model, opset)):
        raise ModelError(
            f"model '{name}' uses opset {opset}; polytile accepts opsets {MIN_OPSET} to {newest}"
            + (
                f" (ops changed since: {', '.join(_changed_since(model, opset))})"
                if opset < MIN_OPSET
                else ""
            )
        )
    return max(opset, MIN_OPSET)


def _check_allowing_unknown_rank(model: onnx.ModelProto) -> None:
    """onnx.checker, except that graph inputs / outputs may omit their shape (unknown rank),
    as onnxruntime allows: the checker requires the field, so it is set while checking."""
    patched = [
        v.type.tensor_type
        for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]
        if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")
    ]
    for ttype in patched:
        ttype.shape.SetInParent()
    try:
        onnx.checker.check_model(_skeleton(model) if model.ByteSize() > _CHECK_LIMIT else model)
    finally:
        for ttype in patched:
            ttype.ClearField("shape")


#: protobuf cannot serialize messages past 2 GB, and the checker serializes the model
_CHECK_LIMIT = (1 << 31) - (1 << 20)


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers are empty tensors, small enough for the checker,
    which checks the graph, not the weights' values."""
    inits = list(model.graph.initializer)
    del model.graph.initializer[:]
    try:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
    finally:
        model.graph.initializer.extend(inits)
    for tensor in inits:
        if tensor.ByteSize() > 1 << 16:
            copy.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=[0])
        else:
            copy.graph.initializer.append(tensor)
    return copy


def _changed_since(model: onnx.ModelProto, opset: int) -> list[str]:
    """Ops of an older-than-supported model whose definition changed by MIN_OPSET; a model
    without any is the same model at MIN_OPSET."""
    changed = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            old = onnx.defs.get_schema(node.op_type, opset).since_version
            new = onnx.defs.get_schema(node.op_type, MIN_OPSET).since_version
        except onnx.defs.SchemaError:
            continue
        if old != new:
            changed.add(node.op_type)
    return sorted(changed)


#: ops of int8-quantized models (onnxruntime.quantization's QDQ, QOperator and dynamic
#: formats), refused together with one explanation
QUANTIZATION_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSoftmax",
        "QGemm",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    }
)
_QUANTIZED = "int8 quantization op; quantized models are not supported yet"


def unsupported_reason(node: onnx.NodeProto) -> str | None:
    """Why polytile cannot import this op at all, or None when it can."""
    if node.op_type in QUANTIZATION_OPS:
        return _QUANTIZED
    if node.domain not in ("", "ai.onnx"):
        return f"domain '{node.domain}' is not supported"
    if node.op_type not in OPS and node.op_type not in CONTROL_FLOW:
        return "op is not supported"
    return None


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(node name, op type, reason) for every node polytile cannot import, subgraphs of
    control flow included; unsupported variants of supported ops show at import."""
    bad = []

    def visit(graph: onnx.GraphProto) -> None:
        for index, node in enumerate(graph.node):
            reason = unsupported_reason(node)
            if reason is not None:
                bad.append((node.name or f"#{index}", node.op_type, reason))
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    visit(sub)

    visit(model.graph)
    return bad


def raise_unsupported(model_name: str, bad: Sequence[tuple[str, str, str]]) -> None:
    by_op: dict[str, list[str]] = {}
    for name, op, reason in bad:
        by_op.setdefault(f"{op} ({reason})", []).append(name)
    lines = [
        f"  {op}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
        for op, names in by_op.items()
    ]
    quantized = sorted({op for _, op, reason in bad if reason == _QUANTIZED})
    header = (
        f"model '{model_name}' is int8-quantized ({', '.join(quantized)}), which polytile "
        "does not compile yet; compile the float model instead.\n"
        if quantized
        else ""
    )
    raise UnsupportedOpError(
        f"{header}model '{model_name}' uses {len(by_op)} unsupported op(s) or variant(s) in "
        f"{len(bad)} node(s):\n" + "\n".join(lines),
        tuple(bad),
    )


def import_model(
    source: ModelSource,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    name: str | None = None,
    bind: Mapping[str, np.ndarray] | None = None,
) -> Graph:
    """Load, validate, canonicalize and type an ONNX model (no optimization passes).

    `bind` turns graph inputs into constants, for inputs that must be known at compile
    time (a Reshape's shape fed as an input, say); see `parameter_inputs`.
    """
    model, display = load_model(source)
    name = name or display
    opset = check_model(model, name)
    return _Importer(model, name, opset, dict(input_shapes or {}), dict(bind or {})).run()


def parameter_inputs(source: ModelSource) -> set[str]:
    """Graph inputs that feed an op parameter (shape, axes, pads, ...), directly or through
    a chain of nodes, and so must be bound to values before the model can be compiled."""
    model, _ = load_model(source)
    inputs = {v.name for v in model.graph.input} - {i.name for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output if out}
    pending = []
    for node in model.graph.node:
        op = OPS.get(node.op_type)
        if op is not None:
            pending.extend(
                node.input[i] for i in op.params if i < len(node.input) and node.input[i]
            )
    found: set[str] = set()
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
            continue
        node = producers.get(name)
        op = OPS.get(node.op_type) if node is not None else None
        if node is None or (op is not None and not op.needs_values):
            continue  # Shape reads only its input's type
        pending.extend(i for i in node.input if i)
        pending.extend(outer_reads(node))  # an If branch reading the size it returns
    return found


class _Importer:
    def __init__(
        self,
        model: onnx.ModelProto,
        name: str,
        opset: int,
        input_shapes: dict[str, Sequence[int]],
        bind: dict[str, np.ndarray],
    ) -> None:
        self.model = model
        self.name = name
        self.source_opset = opset
        self.opset = max(opset, CANONICAL_OPSET)
        self.constants: dict[str, np.ndarray] = dict(constant_arrays(model, f"model '{name}'"))
        declared = {v.name: v for v in model.graph.input}
        for bound, value in bind.items():
            if bound not in declared or bound in self.constants:
                raise InputError(f"bind names '{bound}', which is not an input of model '{name}'")
            what = f"bound input '{bound}' of model '{name}'"
            dtype = onnx_to_dtype(declared[bound].type.tensor_type.elem_type, what)
            try:
                array = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError) as exc:
                raise InputError(f"{what}: the value cannot be a {dtype} array: {exc}") from exc
            self.constants[bound] = readonly(array)
        self.input_shapes = {k: _check_shape(k, v, name) for k, v in input_shapes.items()}
        self.types: dict[str, TensorType] = {}
        self.values: dict[str, np.ndarray] = {}
        self.taken: set[str] = set()
        self.nodes: list[Node] = []
        #: (node, op, reason) of every unsupported op or variant: all are reported at once
        self.refused: list[tuple[str, str, str]] = []
        #: the errors of refused variants of supported ops (they name their node)
        self.variants: list[UnsupportedOpError] = []
        #: outputs of refused nodes: nodes reading them are skipped, not reported
        self.poisoned: set[str] = set()

    def fresh(self, base: str) -> str:
        return unique_name(base, self.taken)

    def run(self) -> Graph:
        g = self.model.graph
        for value in [*g.input, *g.output, *g.value_info]:
            self.taken.add(value.name)
        for init in g.initializer:
            self.taken.add(init.name)
        for node in g.node:
            self.taken.update(node.input)
            self.taken.update(node.output)
            if node.name:
                self.taken.add(node.name)
        for cname, value in self.constants.items():
            self.types[cname] = TensorType(tuple(value.shape), value.dtype.name)
            self.values[cname] = value
        inputs = self._graph_inputs()
        self._import_nodes(g.node, set())
        if len(self.refused) == 1 and len(self.variants) == 1:
            raise self.variants[0]  # its own message names the node and the variant
        if self.refused:
            raise_unsupported(self.name, self.refused)
        outputs = tuple(o.name for o in g.output)
        self._check_declared_outputs()
        return Graph(
            name=self.name,
            nodes=tuple(self.nodes),
            inputs=inputs,
            outputs=outputs,
            types=self.types,
            constants=self.constants,
            opset=self.opset,
        )

    def _import_nodes(self, protos: Sequence[onnx.NodeProto], node_names: set[str]) -> None:
        """Canonicalize and type each node in order; a refused node is recorded and the
        walk goes on, so one error lists every unsupported op and variant (variants only
        where the node's inputs are typed, i.e. not after a refused node)."""
        for index, proto in enumerate(protos):
            base = proto.name or f"{proto.op_type}_{index}"
            node_name = unique_name(base, node_names)
            self.taken.add(node_name)
            outputs = list(proto.output)
            while outputs and not outputs[-1]:  # trailing omitted outputs are not requested
                outputs.pop()
            reason = unsupported_reason(proto)  # needs no types: reported wherever it is
            if reason is None and any(i in self.poisoned for i in proto.input):
                self.poisoned.update(outputs)
                continue
            try:
                if reason is not None:
                    raise UnsupportedOpError(reason, ((node_name, proto.op_type, reason),))
                if proto.op_type in CONTROL_FLOW:
                    self._expand(proto, node_name, outputs, node_names)
                    continue
                where = f"node '{node_name}' ({proto.op_type}) in model '{self.name}'"
                attrs = {a.name: attribute_value(a, where) for a in proto.attribute}
                node = Node(node_name, proto.op_type, tuple(proto.input), tuple(outputs), attrs)
                for new in self._canonicalize(node, node_names):
                    self._infer(new)
            except UnsupportedOpError as exc:
                self.refused.extend(exc.unsupported or ((node_name, proto.op_type, str(exc)),))
                if reason is None:
                    self.variants.append(exc)
                self.poisoned.update(outputs)

    def _add_constants(self, constants: Mapping[str, np.ndarray]) -> None:
        for cname, value in constants.items():
            value = readonly(value)
            self.constants[cname] = value
            self.types[cname] = TensorType(tuple(value.shape), value.dtype.name)
            self.values[cname] = value

    def _known(self, tensor: str, proto: onnx.NodeProto, node_name: str, what: str) -> Any:
        """The one value of a control-flow input known at import (a condition, a trip
        count); a refusal naming the node when it is only known at run time."""
        if not tensor or tensor not in self.values:
            raise self._refusal(proto, node_name, f"its {what} is only known at run time")
        value = self.values[tensor]
        if value.size != 1:
            raise ModelError(
                f"node '{node_name}' ({proto.op_type}) in model '{self.name}': its {what} "
                f"'{tensor}' holds {value.size} values, not one"
            )
        return value.reshape(-1)[0]

    def _refusal(self, proto: onnx.NodeProto, node_name: str, reason: str) -> UnsupportedOpError:
        """A refused variant: the message names the node and the model."""
        return UnsupportedOpError(
            f"node '{node_name}' ({proto.op_type}) in model '{self.name}': {reason}",
            ((node_name, proto.op_type, reason),),
        )

    def _expand(
        self, proto: onnx.NodeProto, node_name: str, outputs: list[str], node_names: set[str]
    ) -> None:
        """An If with a known condition becomes its taken branch; a Loop with a known trip
        count and no data-dependent exit becomes one copy of its body per iteration."""
        if proto.op_type == "If":
            cond = self._known(proto.input[0], proto, node_name, "condition")
            branch = subgraph(proto, "then_branch" if bool(cond) else "else_branch")
            assert branch is not None  # the checker guarantees both branches
            inlined = inline(branch, {}, self.fresh)
            self._add_constants(inlined.constants)
            tail = bind_outputs(inlined.outputs, outputs, node_name)
            self._import_nodes([*inlined.nodes, *tail], node_names)
            return
        trips_input = proto.input[0] if proto.input else ""
        if not trips_input:
            reason = "a Loop without a trip count runs until a data-dependent exit"
            raise self._refusal(proto, node_name, reason)
        trips = int(self._known(trips_input, proto, node_name, "trip count"))
        start = proto.input[1] if len(proto.input) > 1 else ""
        if start and not self._known(start, proto, node_name, "condition"):
            trips = 0
        if trips > MAX_UNROLL and loop_never_exits(proto):
            reason = f"it runs {trips} iterations, more than the {MAX_UNROLL} polytile unrolls"
            raise self._refusal(proto, node_name, reason)
        carried = list(proto.input[2:])
        scans: list[list[str]] = []
        final = carried
        for step, iteration in enumerate(loop_iterations(proto, trips, carried, self.fresh)):
            if step == MAX_UNROLL:
                reason = f"it runs more than {MAX_UNROLL} iterations, the most polytile unrolls"
                raise self._refusal(proto, node_name, reason)
            self._add_constants(iteration.inlined.constants)
            self._import_nodes(iteration.inlined.nodes, node_names)
            if any(o in self.poisoned for o in iteration.inlined.outputs):
                raise self._refusal(proto, node_name, "its body has unsupported nodes")
            final = list(iteration.inlined.outputs[1 : 1 + len(carried)])
            scans.append(list(iteration.inlined.outputs[1 + len(carried) :]))
            if not self._known(iteration.condition, proto, node_name, "exit condition"):
                break
        scan_targets = outputs[len(carried) :]
        if any(scan_targets) and not scans:
            reason = "a Loop that runs no iteration has scan outputs of unknown shape"
            raise self._refusal(proto, node_name, reason)
        tail = bind_outputs(tuple(final), outputs[: len(carried)], node_name)
        tail += scan_nodes(scans, scan_targets, node_name, self.fresh)
        self._import_nodes(tail, node_names)

    def _graph_inputs(self) -> tuple[str, ...]:
        """Non-constant inputs with static shapes (IR-3 weights listed as inputs are constants)."""
        names = []
        declared = [v for v in self.model.graph.input if v.name not in self.constants]
        known = {v.name for v in declared}
        for given in self.input_shapes:
            if given not in known:
                raise InputError(
                    f"input_shapes names '{given}', which is not an input of model "
                    f"'{self.name}' (inputs: {', '.join(sorted(known)) or 'none'})"
                )
        for value in declared:
            what = f"input '{value.name}' of model '{self.name}'"
            if not value.type.HasField("tensor_type"):
                raise UnsupportedOpError(f"{what} is not a tensor")
            ttype = value.type.tensor_type
            dtype = onnx_to_dtype(ttype.elem_type, what)
            shape = self._input_shape(value.name, ttype, what)
            self.types[value.name] = TensorType(shape, dtype)
            names.append(value.name)
        return tuple(names)

    def _input_shape(self, name: str, ttype: onnx.TypeProto.Tensor, what: str) -> tuple[int, ...]:
        given = self.input_shapes.get(name)
        if not ttype.HasField("shape"):
            if given is None:
                raise ShapeError(
                    f"{what} has no shape; pass input_shapes={{'{name}': (...)}} to fix it"
                )
            return given
        dims = [
            (d.dim_value if d.HasField("dim_value") else None, d.dim_param) for d in ttype.shape.dim
        ]
        if given is None:
            dynamic = [
                f"{i} ('{p}')" if p else f"{i}" for i, (v, p) in enumerate(dims) if v is None
            ]
            if dynamic:
                example = tuple(v if v is not None else 1 for v, _ in dims)
                raise ShapeError(
                    f"{what} has dynamic dimension(s) {', '.join(dynamic)}; polytile compiles "
                    f"static shapes: pass input_shapes={{'{name}': {example}}} with the real sizes"
                )
            return tuple(int(v) for v, _ in dims)
        shape = given  # validated by _check_shape
        if len(shape) != len(dims):
            raise InputError(
                f"input_shapes gives {what} rank {len(shape)}, but the model declares rank "
                f"{len(dims)}"
            )
        for axis, ((declared, _), actual) in enumerate(zip(dims, shape, strict=True)):
            if declared is not None and declared != actual:
                raise InputError(
                    f"input_shapes gives {what} size {actual} on axis {axis}, but the model "
                    f"declares {declared}"
                )
        return shape

    def _context(self, node: Node) -> InferContext:
        return InferContext(
            node,
            [self.types.get(i) if i else None for i in node.inputs],
            [self.values.get(i) if i else None for i in node.inputs],
            self.opset,
            self.name,
            self.fresh,
        )

    def _canonicalize(self, node: Node, node_names: set[str]) -> tuple[Node, ...]:
        op = OPS[node.op_type]
        for i, tensor in enumerate(node.inputs):
            if tensor and tensor not in self.types:
                raise ModelError(
                    f"{node.label} in model '{self.name}': input {i} '{tensor}' is never produced"
                )
        if op.canonicalize is None:
            return (node,)
        since = onnx.defs.get_schema(node.op_type, self.source_opset).since_version
        ctx = self._context(node)
        try:
            rewrite = op.canonicalize(ctx, since)
        except PolytileError:
            raise
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise ctx.error(f"canonicalization failed: {exc}") from exc
        self._add_constants(rewrite.constants)
        for new in rewrite.nodes:
            node_names.add(new.name)
        return rewrite.nodes

    def _infer(self, node: Node) -> None:
        op = OPS[node.op_type]
        ctx = self._context(node)
        if op.dtypes is not None and ctx.has_input(0) and ctx.dtype(0) not in op.dtypes:
            raise UnsupportedOpError(
                f"{ctx.where()}: input dtype {ctx.dtype(0)} is not supported "
                f"(supported: {', '.join(sorted(op.dtypes))})",
                ((node.name, node.op_type, f"dtype {ctx.dtype(0)}"),),
            )
        try:
            out_types = op.infer(ctx)
        except PolytileError:
            raise
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise ctx.error(f"shape inference failed: {exc}") from exc
        live = [o for o in node.outputs if o]
        for out, t in zip(node.outputs, out_types, strict=False):
            if out:
                self.types[out] = t
        missing = [o for o in live if o not in self.types]
        if missing:
            raise ctx.unsupported(f"output(s) {', '.join(missing)} are not supported")
        self.nodes.append(node)
        known = not op.needs_values or all(not i or i in self.values for i in node.inputs)
        small = sum(self.types[o].size for o in live) <= PROPAGATE_LIMIT
        too_big = [o for o in live if self.types[o].size > MAX_ELEMENTS]
        if too_big:
            raise ctx.error(
                f"output '{too_big[0]}' would have {self.types[too_big[0]].size} elements "
                f"(shape {list(self.types[too_big[0]].shape)}), more than polytile handles"
            )
        if known and small:
            results = try_evaluate(ctx, list(out_types))
            for out, value in zip(node.outputs, results or (), strict=False):
                if out:
                    self.values[out] = readonly(value)

    def _check_declared_outputs(self) -> None:
        """Declared static output shapes must agree with inference."""
        for value in self.model.graph.output:
            if value.name not in self.types:
                raise ModelError(f"output '{value.name}' of model '{self.name}' is never produced")
            ttype = value.type.tensor_type
            if not ttype.HasField("shape"):
                continue
            inferred = self.types[value.name].shape
            declared = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
            if len(declared) != len(inferred) or any(
                d is not None and d != s for d, s in zip(declared, inferred, strict=False)
            ):
                raise ShapeError(
                    f"output '{value.name}' of model '{self.name}' is declared with shape "
                    f"{declared} but has shape {list(inferred)}"
                )
