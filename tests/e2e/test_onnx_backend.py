"""The ONNX project's node tests (built in memory by the onnx package) through
`polytile.backend` with onnx's own runner, `onnx.backend.test.BackendTest`: each test
compiles a one-op model to native code and compares with onnx's expected outputs.

Exclusions, each with its reason, are in backend_exclusions.py. Only the CPU variants of
the node tests are collected (polytile has no other device; the runner's model-zoo tests
need the network and are not collected either).
"""

from __future__ import annotations

import re
import unittest
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

import polytile.backend
from polytile.backend import PolytileBackend
from polytile.errors import InputError, UnsupportedOpError

from backend_exclusions import BUGS, UNSUPPORTED, node_cases, reason_for

#: LLVM's optimization level for the node tests: their kernels are tiny, so the level
#: barely changes compile time; the default (3) tests what users get
OPT_LEVEL = 3


class NodeTestBackend(PolytileBackend):
    """The backend with the options the node tests compile with."""

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> Any:
        kwargs.setdefault("opt_level", OPT_LEVEL)
        return super().prepare(model, device, **kwargs)


def _node_test_case() -> type[unittest.TestCase]:
    """The runner's node test class, CPU variants only, exclusions skipped with reasons."""
    runner = onnx.backend.test.BackendTest(NodeTestBackend, __name__)
    case = runner.test_cases["OnnxBackendNodeModelTest"]
    for attr in [a for a in vars(case) if a.startswith("test_")]:
        if not attr.endswith("_cpu"):
            delattr(case, attr)
            continue
        why = reason_for(attr.removesuffix("_cpu"))
        if why is not None:
            setattr(case, attr, unittest.skip(why)(getattr(case, attr)))
    return case


OnnxBackendNodeModelTest = _node_test_case()


# --- the exclusion list stays honest -------------------------------------------------


@pytest.mark.parametrize("pattern", [*UNSUPPORTED, *BUGS])
def test_exclusion_pattern_matches_a_node_test(pattern: str) -> None:
    """A pattern that matches nothing is stale (the test was renamed or removed)."""
    assert any(re.search(pattern, c.name) for c in node_cases()), pattern


def _feeds(case: Any) -> list[np.ndarray]:
    return [
        onnx.numpy_helper.to_array(x) if isinstance(x, TensorProto) else x
        for x in case.data_sets[0][0]
    ]


REFUSED = [c for c in node_cases() if reason_for(c.name) in UNSUPPORTED.values()]


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_unsupported_variant_is_refused(case: Any) -> None:
    """Excluded as unsupported means refused with an UnsupportedOpError, never a crash or
    a wrong answer."""
    with pytest.raises(UnsupportedOpError):
        polytile.backend.run_model(case.model, _feeds(case))


# --- the backend interface itself ----------------------------------------------------


def _add_model(dims: list[int | str]) -> onnx.ModelProto:
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "abc"]
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])], "add", value[:2], value[2:]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_devices() -> None:
    assert polytile.backend.supports_device("CPU")
    assert not polytile.backend.supports_device("CUDA")
    assert not polytile.backend.supports_device("CUDA:1")
    with pytest.raises(InputError, match="CPU only"):
        polytile.backend.prepare(_add_model([2]), "CUDA")


def test_outputs_by_position_and_name() -> None:
    rep = polytile.backend.prepare(_add_model([2, 3]))
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)
    by_list, by_dict = rep.run([a, b]), rep.run({"a": a, "b": b})
    np.testing.assert_array_equal(by_list[0], a + b)
    np.testing.assert_array_equal(by_dict["c"], a + b)


def test_symbolic_dims_compile_per_shape() -> None:
    rep = polytile.backend.prepare(_add_model(["N", 3]))
    for n in (1, 4, 1):
        x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(rep.run([x, x])[0], 2 * x)
    assert len(rep._compiled) == 2


def test_parameter_inputs_are_bound_per_value() -> None:
    """A Reshape's shape given as an input is bound at run time, per distinct value."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    rep = polytile.backend.prepare(helper.make_model(graph))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, 3]):
        np.testing.assert_array_equal(rep.run([x, np.array(shape)])[0], x.reshape(shape))


def test_run_node() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    x = np.array([[-1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(polytile.backend.run_node(node, [x])[0], np.maximum(x, 0))


def test_errors_are_polytile_errors() -> None:
    rep = polytile.backend.prepare(_add_model([2]))
    with pytest.raises(InputError, match="takes 2 input"):
        rep.run([np.ones(2, np.float32)])
    with pytest.raises(InputError, match="unknown option"):
        polytile.backend.prepare(_add_model([2]), fast=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "g", [x], [y])
    with pytest.raises(UnsupportedOpError, match="Det"):
        polytile.backend.prepare(helper.make_model(graph))
