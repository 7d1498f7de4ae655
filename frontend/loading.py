"""Reading an ONNX model: from a path (with its external data, checked file by file),
bytes or a ModelProto, validated by onnx's checker (a skeleton past protobuf's 2 GB), and
which of its ops polytile cannot import at all."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import onnx
import onnx.defs
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from polytile.errors import InputError, ModelError, UnsupportedOpError

from .control import CONTROL_FLOW
from .ops import OPS

MIN_OPSET = 7

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
    by_op: dict[str, list[tuple[str, str]]] = {}
    for name, op, reason in bad:
        by_op.setdefault(op, []).append((name, reason))
    lines = []
    for op, found in by_op.items():
        reasons = list(dict.fromkeys(reason for _, reason in found))
        if len(reasons) == 1:  # one line for the op: its reason, then its nodes
            names = [name for name, _ in found]
            more = f" ... ({len(names) - 8} more)" if len(names) > 8 else ""
            lines.append(f"  {op} ({reasons[0]}): {', '.join(names[:8])}{more}")
        else:  # reasons that name each node's inputs: the first few nodes with theirs
            more = f"; ... ({len(found) - 3} more)" if len(found) > 3 else ""
            shown = "; ".join(f"{name} ({reason})" for name, reason in found[:3])
            lines.append(f"  {op}: {shown}{more}")
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
