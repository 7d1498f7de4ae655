"""polytile as an ONNX backend (`onnx.backend.base.Backend`), so that the ONNX project's
own backend tests, and tools written against that interface, run on polytile:

    import polytile.backend as backend
    rep = backend.prepare(model)          # a BackendRep
    outputs = rep.run([x])                # a tuple in the graph's output order
    outputs = backend.run_model(model, [x])

polytile compiles static shapes and needs the values of op parameters (a Reshape's shape,
Slice's starts, ...) at compile time. A model is therefore compiled when `prepare` can do
so (every input shape known, no parameter input); otherwise it is compiled on first run,
once per distinct set of input shapes and parameter values, the parameter inputs bound as
constants (see `frontend.importer.parameter_inputs`).

Options (keyword arguments of `prepare`, `run_model` and `run_node`): `opt_level` (LLVM's,
0-3, default 3) and `num_threads` (default: the machine's cores). `rtol` / `atol`, which
the ONNX test runner passes along with per-test options, are accepted and ignored.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx.checker
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from polytile.errors import InputError, ModelError
from polytile.frontend.importer import (
    find_unsupported,
    import_model,
    load_model,
    parameter_inputs,
)

from .compiler import compile
from .runtime import CompiledModel

#: options the ONNX test runner passes to `prepare` with per-test kwargs; not ours
_RUNNER_OPTIONS = frozenset({"rtol", "atol"})


@dataclass(frozen=True)
class BackendOptions:
    """How `prepare` compiles: LLVM's optimization level and the thread count."""

    opt_level: int = 3
    num_threads: int | None = None

    @staticmethod
    def parse(kwargs: Mapping[str, Any]) -> BackendOptions:
        unknown = sorted(set(kwargs) - {"opt_level", "num_threads"} - _RUNNER_OPTIONS)
        if unknown:
            raise InputError(
                f"polytile.backend: unknown option(s) {unknown}; options are opt_level, num_threads"
            )
        opt_level = kwargs.get("opt_level", 3)
        if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
            raise InputError(f"polytile.backend: opt_level must be 0-3, got {opt_level!r}")
        threads = kwargs.get("num_threads")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InputError(
                f"polytile.backend: num_threads must be a positive int, got {threads!r}"
            )
        return BackendOptions(opt_level, threads)


def _check_device(device: str) -> None:
    if not PolytileBackend.supports_device(device):
        raise InputError(f"polytile.backend runs on the CPU only, not on device '{device}'")


def _static_shape(value: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """The declared shape if every dimension is a number; None if any is symbolic or the
    rank is unknown."""
    ttype = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
        return None
    dims = ttype.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


class PolytileRep(BackendRep):
    """A prepared model: `run(inputs)` compiles on demand (per input shapes and parameter
    values) and calls the native module."""

    def __init__(self, model: onnx.ModelProto, display: str, options: BackendOptions) -> None:
        self._model = model
        self._display = display
        self._options = options
        initializers = {i.name for i in model.graph.initializer}
        declared = [v for v in model.graph.input if v.name not in initializers]
        #: inputs in the order a list of inputs is given (as onnxruntime's get_inputs)
        self.input_names = [v.name for v in declared]
        self.output_names = [v.name for v in model.graph.output]
        self._declared = {v.name: _static_shape(v) for v in declared}
        self._params = parameter_inputs(model)
        self._compiled: dict[tuple[Any, ...], CompiledModel] = {}
        self._lock = threading.Lock()
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        if not self._params and all(s is not None for s in self._declared.values()):
            # everything is known now: compile eagerly so that errors surface in prepare
            self._compiled[()] = self._compile({}, {})

    def _compile(
        self, shapes: Mapping[str, tuple[int, ...]], bind: Mapping[str, np.ndarray]
    ) -> CompiledModel:
        graph = import_model(
            self._model, input_shapes=shapes or None, name=self._display, bind=bind or None
        )
        return compile(
            graph, opt_level=self._options.opt_level, num_threads=self._options.num_threads
        )

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        """Inputs given as a dict (by name), a list (in input order) or one array."""
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise InputError(
                    f"model '{self._display}' takes {len(self.input_names)} input(s) "
                    f"{self.input_names}, got {len(inputs)}"
                )
            feeds = dict(zip(self.input_names, inputs, strict=True))
        unknown = sorted(set(feeds) - set(self.input_names))
        missing = [n for n in self.input_names if n not in feeds]
        if unknown or missing:
            raise InputError(
                f"model '{self._display}': inputs are {self.input_names}; "
                f"unknown {unknown}, missing {missing}"
            )
        return {k: np.asarray(v) for k, v in feeds.items()}

    def _model_for(self, feeds: Mapping[str, np.ndarray]) -> CompiledModel:
        if () in self._compiled:
            return self._compiled[()]
        bind = {n: feeds[n] for n in self.input_names if n in self._params}
        shapes = {
            n: tuple(feeds[n].shape)
            for n in self.input_names
            if n not in self._params and self._declared[n] is None
        }
        key = (
            tuple(sorted(shapes.items())),
            tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(bind.items())),
        )
        with self._lock:
            if key not in self._compiled:
                self._compiled[key] = self._compile(shapes, bind)
            return self._compiled[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The outputs in the graph's output order (also addressable by name)."""
        if kwargs:
            raise InputError(f"polytile.backend: run() takes no options, got {sorted(kwargs)}")
        feeds = self._feeds(inputs)
        model = self._model_for(feeds)
        outputs = model.run({n: feeds[n] for n in model.input_names})
        return self._outputs_type(*outputs)


class PolytileBackend(Backend):
    """The ONNX backend interface over `polytile.compile` (CPU only)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether every op is supported (variants may still be refused when compiling)."""
        return cls.supports_device(device) and not find_unsupported(model)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> PolytileRep:
        """Validate and (when shapes and parameters are known) compile `model`, a
        ModelProto, path or bytes."""
        _check_device(device)
        options = BackendOptions.parse(kwargs)
        proto, display = load_model(model)
        return PolytileRep(proto, display, options)

    @classmethod
    def run_model(
        cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        """Run one node by wrapping it in a one-node model (inputs typed by the given
        arrays, in the node's input order; `opset_version` picks the opset)."""
        _check_device(device)
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            arrays = {n: np.asarray(inputs[n]) for n in names}
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(values) != len(names):
                raise InputError(
                    f"run_node: {node.op_type} node has {len(names)} input(s), "
                    f"got {len(values)} array(s)"
                )
            arrays = {n: np.asarray(v) for n, v in zip(names, values, strict=True)}
        try:
            graph_inputs = [
                onnx.helper.make_tensor_value_info(
                    n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape
                )
                for n, a in arrays.items()
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"run_node: an input's dtype has no ONNX type: {exc}") from exc
        outputs = []
        for index, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and index < len(outputs_info):
                dtype, shape = outputs_info[index]
                elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
                outputs.append(onnx.helper.make_tensor_value_info(name, elem, shape))
            else:
                outputs.append(onnx.ValueInfoProto(name=name))
        graph = onnx.helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, outputs)
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid(node.domain, opset)]
        )
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except onnx.shape_inference.InferenceError as exc:
            raise ModelError(f"run_node: {node.op_type} node is not valid: {exc}") from exc
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except (AttributeError, ValueError):
            return False


# the module itself is the backend, as onnx.backend.test.BackendTest expects
is_compatible = PolytileBackend.is_compatible
prepare = PolytileBackend.prepare
run_model = PolytileBackend.run_model
run_node = PolytileBackend.run_node
supports_device = PolytileBackend.supports_device
