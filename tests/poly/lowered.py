"""Run an optimized graph through the polyhedral kernels, group by group, with the
program-order reference executor: the differential harness for lowering."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polytile.frontend import Graph, import_model, optimize, partition
from polytile.poly.ir.kernel import Kernel
from polytile.poly.lower import lower
from polytile.poly.oracle.reference import run_program_order


def run_lowered(
    graph: Graph,
    feeds: dict[str, np.ndarray],
    execute: Callable[[Kernel, dict[str, np.ndarray]], dict[str, np.ndarray]] = run_program_order,
    inspect: Callable[[Kernel], None] | None = None,
) -> list[np.ndarray]:
    """Graph outputs computed by lowering every fused group and executing the kernels
    (`execute`: the program-order reference by default); `inspect` sees each kernel."""
    parts = partition(graph)
    env = dict(feeds)
    env.update(graph.constants)
    for view, source in graph.aliases.items():
        if source in env:
            env[view] = env[source].reshape(graph.types[view].shape)
    for group in parts.groups:
        kernel = lower(graph, group)
        if inspect is not None:
            inspect(kernel)
        inputs = {}
        for t in kernel.inputs():
            inputs[t.name] = np.asarray(env[t.source], dtype=t.dtype).reshape(t.shape)
        buffers = execute(kernel, inputs)
        for t in kernel.outputs():
            env[t.source] = buffers[t.name]
        for view, source in graph.aliases.items():
            if source in env and view not in env:
                env[view] = env[source].reshape(graph.types[view].shape)
    return [np.asarray(env[name]) for name in graph.outputs]


def check_lowered(
    m: onnx.ModelProto,
    inputs: dict[str, tuple[Shape, str]],
    oracle: str = "ort",
    rtol: float = 1e-5,
    atol: float = 1e-6,
    seed: int = 0,
    feeds: dict[str, np.ndarray] | None = None,
    execute: Callable[[Kernel, dict[str, np.ndarray]], dict[str, np.ndarray]] = run_program_order,
    inspect: Callable[[Kernel], None] | None = None,
) -> list[Kernel]:
    """The lowered kernels of `m` (run by `execute`, each seen by `inspect`) reproduce the
    oracle (shape, dtype, then values) on `feeds` (seeded random ones by default);
    returns the kernels."""
    feeds = feeds_for(inputs, seed) if feeds is None else feeds
    kernels: list[Kernel] = []

    def seen(kernel: Kernel) -> None:
        kernels.append(kernel)
        if inspect is not None:
            inspect(kernel)

    got = run_lowered(optimize(import_model(m)), feeds, execute, seen)
    assert_outputs_match(got, reference(m, feeds, oracle), rtol, atol)
    return kernels


Shape = Sequence[int]


def make(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, tuple[Shape, str]],
    outputs: Sequence[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 18,
    symbolic_outputs: bool = False,
) -> onnx.ModelProto:
    """A model whose output dtypes onnx's shape inference fills in. With
    `symbolic_outputs`, the output sizes are left symbolic: onnx's inference is then not
    the oracle (it sizes a ceil_mode pool whose last window would start in the padding
    wrongly)."""
    graph = helper.make_graph(
        list(nodes),
        "lowered",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
            for k, (s, d) in inputs.items()
        ],
        [helper.make_empty_tensor_value_info(k) for k in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 21 else 10
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    if symbolic_outputs:
        for out in m.graph.output:
            for i, dim in enumerate(out.type.tensor_type.shape.dim):
                dim.dim_param = f"{out.name}_{i}"
    onnx.checker.check_model(m)
    return m


def feeds_for(inputs: dict[str, tuple[Shape, str]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (shape, dtype) in inputs.items():
        kind = np.dtype(dtype).kind
        if kind == "b":
            feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
        elif kind in "iu":
            info = np.iinfo(dtype)
            low, high = max(info.min, -20), min(info.max, 20)
            feeds[name] = rng.integers(low, high, size=shape).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def reference(m: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle: str) -> list[np.ndarray]:
    """The model's outputs from onnxruntime ("ort") or onnx's reference evaluator."""
    if oracle == "ort":
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        return ort.InferenceSession(m.SerializeToString(), options).run(None, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(m).run(None, feeds)


def assert_outputs_match(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float
) -> None:
    """Shape and dtype first, then values (exactly for non-float outputs)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.shape == w.shape
        assert g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
