"""Load and validate an ONNX model and turn it into a statically shaped `Graph`.

Import does three things in one topological walk, because each needs the others' results:
canonicalize every node to the canonical opset (old Softmax, Clip, Split, ... semantics),
infer static types, and propagate small compile-time values (shape chains) so that
Reshape, Expand, Slice, ... get static shapes. Large constants are folded later by the
`fold_constants` pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs

from polytile.errors import InputError, ModelError, PolytileError, ShapeError, UnsupportedOpError
from polytile.names import unique_name

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
from .graph import Graph, Node, TensorType, readonly
from .loading import (
    MIN_OPSET,
    QUANTIZATION_OPS,
    ModelSource,
    check_model,
    find_unsupported,
    load_external_data,
    load_model,
    raise_unsupported,
    unsupported_reason,
)
from .onnx_io import attribute_value, constant_arrays, onnx_to_dtype
from .ops import OPS, InferContext
from .symbolic import Dim

#: the opset the graph IR is expressed in (at least; newer models keep their opset)
CANONICAL_OPSET = 21
#: values with at most this many elements are propagated during import (shape chains)
PROPAGATE_LIMIT = 1 << 16
#: a Loop is unrolled for at most this many iterations (exporters write INT64_MAX trip
#: counts for loops that exit on a condition)
MAX_UNROLL = 4096
#: no tensor may have more elements than this (a guard against absurd shapes)
MAX_ELEMENTS = 1 << 34

__all__ = [
    "MIN_OPSET",
    "QUANTIZATION_OPS",
    "ModelSource",
    "check_model",
    "find_unsupported",
    "import_model",
    "load_external_data",
    "load_model",
    "parameter_inputs",
    "raise_unsupported",
    "unsupported_reason",
]


def _check_shape(
    name: str, shape: object, model: str, names: bool = False
) -> tuple[int | str, ...]:
    """An `input_shapes` entry as a tuple of non-negative ints (and, with `names`, size
    names: a symbolic import's `("batch", "seq")`), or a clear InputError."""
    allowed = "non-negative integers and size names" if names else "non-negative integers"
    bad = InputError(
        f"input_shapes['{name}'] for model '{model}' must be a sequence of {allowed}, got {shape!r}"
    )
    if isinstance(shape, str | bytes) or not hasattr(shape, "__iter__"):
        raise bad
    dims = list(shape)  # type: ignore[call-overload]
    for d in dims:
        if names and isinstance(d, str):
            continue
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0:
            raise bad
    return tuple(d if isinstance(d, str) else int(d) for d in dims)


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
        return InferContext.looking_up(
            node, self.types, self.values, self.opset, self.name, self.fresh
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
            # a symbolic size (`symbolic.Dim`, where the caller made a size symbolic) may
            # differ from what the exporter wrote
            if len(declared) != len(inferred) or any(
                d is not None and not isinstance(s, Dim) and d != s
                for d, s in zip(declared, inferred, strict=False)
            ):
                raise ShapeError(
                    f"output '{value.name}' of model '{self.name}' is declared with shape "
                    f"{declared} but has shape {list(inferred)}"
                )
