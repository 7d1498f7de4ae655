"""`InferenceSession`: onnxruntime's session interface over polytile's compiled models.

    sess = pt.InferenceSession("model.onnx")
    outputs = sess.run(None, {"data": x})
    sess.get_inputs()[0].name, .shape, .type

A model with symbolic input dimensions is compiled once for all their sizes (`compile`'s
`dynamic`), as onnxruntime runs any shape with one session; a kernel that cannot stay
symbolic is compiled per size on first use inside that model (`polytile.special`). Where
the compile for all sizes is refused (a shape the sizes cannot express, a comparison of
sizes that needs `bounds`), the session says why in a warning and compiles per distinct
set of input shapes instead, as it does with `dynamic=False`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from polytile.errors import InputError, PolytileError
from polytile.frontend.importer import load_model

from .compiler import compile
from .runtime import CompiledModel

#: onnxruntime's type strings
_ORT_TYPES = {
    "float32": "tensor(float)",
    "float64": "tensor(double)",
    "float16": "tensor(float16)",
    "int8": "tensor(int8)",
    "int16": "tensor(int16)",
    "int32": "tensor(int32)",
    "int64": "tensor(int64)",
    "uint8": "tensor(uint8)",
    "uint16": "tensor(uint16)",
    "uint32": "tensor(uint32)",
    "uint64": "tensor(uint64)",
    "bool": "tensor(bool)",
}

PROVIDER = "PolytileCPUExecutionProvider"


def _ort_type(elem_type: int) -> str:
    """onnxruntime's spelling of the other types: the ONNX name in lower case
    (tensor(bfloat16), tensor(float8e4m3fn), tensor(int4), ...)."""
    if not elem_type:
        return "tensor(?)"
    return f"tensor({onnx.TensorProto.DataType.Name(elem_type).lower()})"


@dataclass(frozen=True)
class NodeArg:
    """As onnxruntime's NodeArg: symbolic dimensions are strings (or None)."""

    name: str
    shape: list[int | str | None]
    type: str


@dataclass
class SessionOptions:
    """The options polytile honours from onnxruntime's SessionOptions."""

    intra_op_num_threads: int = 0
    graph_optimization_level: object = None


def _args(values: Sequence[onnx.ValueInfoProto], skip: set[str] | None = None) -> list[NodeArg]:
    """NodeArgs of graph inputs or outputs (inputs backed by initializers skipped)."""
    found = []
    for value in values:
        if value.name in (skip or ()):
            continue
        t = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?"
        shape: list[int | str | None] = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            else:
                shape.append(d.dim_param or None)
        found.append(NodeArg(value.name, shape, _ORT_TYPES.get(dtype) or _ort_type(t.elem_type)))
    return found


class InferenceSession:
    """onnxruntime-compatible: `run(output_names, input_feed)`, `get_inputs()`,
    `get_outputs()`, `get_providers()`."""

    def __init__(
        self,
        path_or_bytes: str | bytes | onnx.ModelProto | Any,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Any] | None = None,
        records: object = None,
        dynamic: bool | None = None,
        bounds: Mapping[str, Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> None:
        model, self._display = load_model(path_or_bytes)
        self._model_proto = model
        self._records = records
        threads = int(getattr(sess_options, "intra_op_num_threads", 0) or 0)
        self._threads = threads if threads > 0 else None
        self._inputs = _args(model.graph.input, {i.name for i in model.graph.initializer})
        self._outputs = _args(model.graph.output)
        self._compiled: dict[tuple, CompiledModel] = {}
        if all(isinstance(d, int) for a in self._inputs for d in a.shape):
            self._compiled[()] = self._compile(None)
        elif dynamic is not False:
            try:
                self._compiled[()] = self._compile(None, dynamic=True, bounds=bounds)
            except PolytileError as err:
                if dynamic:
                    raise
                warnings.warn(
                    f"model '{self._display}' is compiled per input shape: compiling it once "
                    f"for all sizes was refused ({err})",
                    stacklevel=2,
                )

    def _compile(
        self, shapes: Mapping[str, tuple[int, ...]] | None, **options: Any
    ) -> CompiledModel:
        return compile(
            self._model_proto,
            records=self._records,
            num_threads=self._threads,
            input_shapes=shapes,
            **options,
        )

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [PROVIDER]

    def get_modelmeta(self) -> onnx.ModelProto:
        return self._model_proto

    def _model_for(self, input_feed: Mapping[str, Any]) -> CompiledModel:
        if () in self._compiled:
            return self._compiled[()]
        shapes = {}
        for arg in self._inputs:
            if arg.name not in input_feed:
                raise InputError(f"model '{self._display}': input '{arg.name}' is missing")
            shape = tuple(np.shape(input_feed[arg.name]))
            if len(shape) != len(arg.shape) or any(
                isinstance(d, int) and d != s for d, s in zip(arg.shape, shape, strict=False)
            ):
                raise InputError(
                    f"model '{self._display}': input '{arg.name}' must have shape {arg.shape}, "
                    f"got {list(shape)}"
                )
            shapes[arg.name] = shape
        key = tuple(sorted(shapes.items()))
        if key not in self._compiled:
            self._compiled[key] = self._compile(shapes, dynamic=False)
        return self._compiled[key]

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        model = self._model_for(input_feed)
        outputs = model.run(input_feed)
        if output_names is None:
            return outputs
        index = {name: i for i, name in enumerate(model.output_names)}
        unknown = [n for n in output_names if n not in index]
        if unknown:
            raise InputError(
                f"model '{self._display}': unknown output(s) {unknown}; "
                f"outputs are {model.output_names}"
            )
        return [outputs[index[n]] for n in output_names]
