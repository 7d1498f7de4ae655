"""A Cast kernel run both ways: compiled at vector width 16 (rows with a scalar tail) and
in program order through the oracle, for the cast tests of each dtype family."""

from __future__ import annotations

import numpy as np
from onnx import helper

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel_from_node
from polytile.poly.oracle.reference import run_program_order


def cast_both_ways(
    x: np.ndarray, to: str, opset: int, **attrs: object
) -> tuple[np.ndarray, np.ndarray]:
    """Cast of `x` to `to` (with Cast's attributes): (compiled, program order)."""
    node = helper.make_node(
        "Cast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(to)), **attrs
    )
    k = kernel_from_node(node, {"x": x.shape}, opset, dtypes={"x": x.dtype.name})
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=16)), host())
    (compiled,) = native.outputs({"x": x}).values()
    with np.errstate(all="ignore"):
        reference = run_program_order(k, {"x": x})[k.outputs()[0].name]
    return compiled, reference
