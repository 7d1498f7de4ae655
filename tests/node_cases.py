"""The ONNX project's node tests (built in memory by the onnx package) as a differential
harness for the frontend: import, check inferred types against the expected outputs and
onnx.shape_inference, export, run with the reference evaluator and compare values."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import numpy as np
import onnx
from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase
from onnx.reference import ReferenceEvaluator

from polytile.frontend.graph import Graph
from polytile.frontend.importer import import_model, parameter_inputs
from polytile.frontend.narrow import NARROW_DTYPES
from polytile.frontend.onnx_io import export_model
from polytile.frontend.ops import OPS


@functools.cache
def all_cases() -> tuple[TestCase, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(c for c in collect_testcases(None) if c.kind == "node")


def cases_for(ops: set[str] | None = None) -> list[TestCase]:
    """Cases whose every op is supported and, if `ops` is given, that use one of `ops`."""
    out = []
    for case in all_cases():
        used = {n.op_type for n in case.model.graph.node}
        if not used <= set(OPS):
            continue
        if ops is not None and not used & ops:
            continue
        out.append(case)
    return out


def feeds_of(case: TestCase) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    inputs, outputs = case.data_sets[0]
    names = [v.name for v in case.model.graph.input]
    return dict(zip(names, map(_array, inputs), strict=False)), [_array(o) for o in outputs]


def _array(value: object) -> np.ndarray:
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value)


def import_case(case: TestCase) -> tuple[Graph, dict[str, np.ndarray], list[np.ndarray]]:
    feeds, expected = feeds_of(case)
    bind_names = parameter_inputs(case.model)
    bind = {k: v for k, v in feeds.items() if k in bind_names}
    shapes = {k: v.shape for k, v in feeds.items() if k not in bind_names}
    graph = import_model(case.model, input_shapes=shapes, bind=bind, name=case.name)
    runtime = {k: v for k, v in feeds.items() if k not in bind_names}
    return graph, runtime, expected


def check_types(case: TestCase, graph: Graph, expected: list[np.ndarray]) -> None:
    """Inferred output types equal the expected outputs' and onnx.shape_inference's."""
    for name, want in zip(graph.outputs, expected, strict=True):
        got = graph.types[name]
        assert got.shape == tuple(want.shape), (
            f"{case.name}: {name} shape {got.shape} != {want.shape}"
        )
        assert got.dtype == want.dtype.name, (
            f"{case.name}: {name} dtype {got.dtype} != {want.dtype}"
        )
    inferred = onnx.shape_inference.infer_shapes(case.model, data_prop=True)
    declared = {v.name: v for v in inferred.graph.value_info}
    for node in case.model.graph.node:
        for out in node.output:
            if out not in declared or out not in graph.types:
                continue
            tt = declared[out].type.tensor_type
            if not tt.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if None in dims:
                continue
            assert tuple(dims) == graph.types[out].shape, (
                f"{case.name}: '{out}' inferred {graph.types[out].shape}, onnx says {dims}"
            )


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    model = export_model(graph)
    onnx.checker.check_model(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)


def compare(case: TestCase, got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g = np.asarray(g)
        assert g.shape == e.shape, f"{case.name}: shape {g.shape} != {e.shape}"
        assert g.dtype == e.dtype, f"{case.name}: dtype {g.dtype} != {e.dtype}"
        if e.dtype.name in NARROW_DTYPES:  # exact, as float32 (every value fits; NaN == NaN)
            f32 = np.float32
            np.testing.assert_array_equal(g.astype(f32), e.astype(f32), err_msg=case.name)
            continue
        rtol = max(case.rtol, 1e-5)
        if e.dtype.name == "bfloat16":  # numpy's kind V; two ulps, as onnx's own runner
            g, e, rtol = g.astype(np.float32), e.astype(np.float32), max(rtol, 2**-6)
        if e.dtype.name == "float16":  # two ulps: polytile rounds once per op (float32
            rtol = max(rtol, 2**-9)  # inside), onnx's expected values round every step
        if e.dtype.kind in "fc":
            np.testing.assert_allclose(
                g, e, rtol=rtol, atol=max(case.atol, 1e-6), err_msg=case.name
            )
        else:
            np.testing.assert_array_equal(g, e, err_msg=case.name)


def roundtrip(case: TestCase, transform: Callable[[Graph], Graph] | None = None) -> None:
    """Import (and optionally transform) a case's model and check it reproduces the
    expected outputs."""
    graph, feeds, expected = import_case(case)
    check_types(case, graph, expected)
    if transform is not None:
        graph = transform(graph)
    compare(case, run_graph(graph, feeds), expected)
