"""Linking (`codegen.link`): identical code is one function, each model's functions have
names of their own, outputs no kernel writes are copies, and the linked model computes
what numpy does."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
import polytile.codegen.link as link
from polytile.codegen import cache, jit
from polytile.codegen.configs import default_config
from polytile.codegen.link import PLACEHOLDER, OutputCopy, _renamed
from polytile.codegen.target import host
from polytile.errors import CodegenError
from polytile.frontend import import_model, partition
from polytile.poly.default.schedule import default_schedule
from polytile.poly.transform.flatten import kernel_of

RNG = np.random.default_rng(0)
W1, W2 = (RNG.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
C = RNG.standard_normal((2, 3)).astype(np.float32)


def _model(
    name: str, shape: list[int], nodes: list, outputs: list[str], constants: dict
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def two_layers(name: str) -> onnx.ModelProto:
    """Two MatMul+Relu layers alike but for their weights."""
    node = helper.make_node
    nodes = [
        node("MatMul", ["x", "w1"], ["m1"]),
        node("Relu", ["m1"], ["r1"]),
        node("MatMul", ["r1", "w2"], ["m2"]),
        node("Relu", ["m2"], ["y"]),
    ]
    return _model(name, [16, 16], nodes, ["y"], {"w1": W1, "w2": W2})


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(np.maximum(x @ W1, 0) @ W2, 0)


def test_identical_code_is_one_function_named_per_model() -> None:
    x = RNG.standard_normal((16, 16)).astype(np.float32)
    first = pt.compile(two_layers("first"))
    second = pt.compile(two_layers("second"))
    for compiled in (first, second):
        np.testing.assert_allclose(compiled.run({"x": x})[0], expected(x), rtol=1e-4, atol=1e-4)
        functions = [c.function for c in compiled.manifest.calls]
        matmuls = [f for f in functions if "matmul" in f.lower()]
        assert len(matmuls) == 2 and len(set(matmuls)) == 1  # one function, two weights
        assert compiled.stats.functions == len(set(functions)) < len(functions)
        assert PLACEHOLDER not in functions
    # both models live in this process: their symbols must differ
    assert not {c.function for c in first.manifest.calls} & {
        c.function for c in second.manifest.calls
    }


def test_outputs_no_kernel_writes_are_copies() -> None:
    node = helper.make_node
    model = _model(
        "copies",
        [2, 3],
        [node("Relu", ["x"], ["r"]), node("Add", ["r", "x"], ["s"])],
        ["s", "x", "c", "s"],
        {"c": C},
    )
    compiled = pt.compile(model)
    assert compiled.manifest.copies == (
        OutputCopy(1, "input", 0),
        OutputCopy(2, "constant", len(compiled.constants) - 1),
        OutputCopy(3, "output", 0),
    )
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    s, same_x, c, again = compiled.run({"x": x})
    np.testing.assert_allclose(s, np.maximum(x, 0) + x, rtol=1e-6)
    np.testing.assert_array_equal(same_x, x)
    np.testing.assert_array_equal(c, C)
    np.testing.assert_array_equal(again, s)


def test_renaming_refuses_text_that_names_the_placeholder_otherwise_than_once() -> None:
    define = f'define void @"{PLACEHOLDER}"(ptr %a) {{\n  ret void\n}}\n'
    assert _renamed(define, "pt_k0_relu") == 'define void @"pt_k0_relu"(ptr %a) {\n  ret void\n}\n'
    calls_itself = define + f'  call void @"{PLACEHOLDER}"(ptr %a)\n'
    with pytest.raises(CodegenError, match="2 times"):
        _renamed(calls_itself, "pt_k0_relu")
    with pytest.raises(CodegenError, match="0 times"):
        _renamed("define void @other() {\n  ret void\n}\n", "pt_k0_relu")


def test_kernels_emitted_on_forked_workers_give_the_same_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Emission on two forked workers (the threshold lowered so a small model uses them)
    gives the functions, the calls and the IR texts that serial emission gives."""
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w1"], ["m"]), node("Relu", ["m"], ["r"])]
    nodes += [node("Sigmoid", ["r"], ["s"]), node("MatMul", ["s", "w2"], ["y"])]
    graph = import_model(_model("forked", [16, 16], nodes, ["y"], {"w1": W1, "w2": W2}))
    target = host(2, 3)
    schedules = [
        default_schedule(kernel_of(graph, g), default_config(target))
        for g in partition(graph).groups
    ]
    serial = link.functions(schedules, target, "pt0", workers=1)
    monkeypatch.setattr(link, "PARALLEL_EMIT", 1)
    forked = link.functions(schedules, target, "pt0", workers=2)
    assert len(serial.texts) >= 2
    assert forked == serial


def test_a_second_compile_emits_and_compiles_only_what_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compiling a model again (as tuning's validation compiles variants of one model)
    takes every module's IR and object code from the memos (`codegen.cache`); another
    model's functions have other names, so its code is its own."""
    compiled: list[int] = []
    real = jit._compile_args
    monkeypatch.setattr(jit, "_compile_args", lambda args: compiled.append(1) or real(args))
    x = RNG.standard_normal((16, 16)).astype(np.float32)
    first = pt.compile(two_layers("memo"))
    cold = len(compiled)
    second = pt.compile(two_layers("memo"))
    assert cold >= 2 and len(compiled) == cold
    other = pt.compile(two_layers("memo_other"))
    assert len(compiled) == 2 * cold
    for m in (first, second, other):
        np.testing.assert_allclose(m.run({"x": x})[0], expected(x), rtol=1e-4, atol=1e-4)


def test_the_memo_forgets_the_least_recently_used() -> None:
    memo = cache.Memo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # now the most recently used
    memo.put("c", 3)
    assert memo.get("b") is None and memo.get("a") == 1 and len(memo) == 2


def test_kernels_scheduled_on_forked_workers_match_serial_scheduling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`compile` schedules distinct kernels on forked workers (the threshold lowered so a
    small model uses them): the same traces as serial scheduling, the same results, and
    a warning a worker raises reaches the caller."""
    import polytile.compiler as compiler

    node = helper.make_node
    nodes = [node("MatMul", ["x", "w1"], ["m"]), node("Relu", ["m"], ["r"])]
    nodes += [node("ReduceSum", ["r"], ["s"], keepdims=1), node("MatMul", ["r", "w2"], ["t"])]
    nodes += [node("Add", ["t", "s"], ["y"])]
    model = _model("scheduled", [16, 16], nodes, ["y"], {"w1": W1, "w2": W2})
    serial = pt.compile(model)
    real = compiler.checked_default

    def warning_default(kernel, config, sizes=None):  # noqa: ANN202
        warnings.warn(f"scheduled {kernel.name}", UserWarning, stacklevel=1)
        return real(kernel, config, sizes)

    monkeypatch.setattr(compiler, "PARALLEL_SCHEDULE", 1)
    monkeypatch.setattr(compiler, "checked_default", warning_default)
    with pytest.warns(UserWarning, match="scheduled") as caught:
        forked = pt.compile(model)
    assert len([w for w in caught if "scheduled" in str(w.message)]) >= 2
    assert [c.function for c in forked.manifest.calls] == [
        c.function for c in serial.manifest.calls
    ]
    x = RNG.standard_normal((16, 16)).astype(np.float32)
    r = np.maximum(x @ W1, 0)
    want = r @ W2 + r.sum()  # ReduceSum without axes: over all of them
    for m in (serial, forked):
        np.testing.assert_allclose(m.run({"x": x})[0], want, rtol=1e-4, atol=1e-3)


def test_casts_rounding_otherwise_are_other_workloads_and_code() -> None:
    """A float8e8m0 Cast rounding down is other code than one rounding up: their kernels'
    workload keys differ, so neither the memos nor tuning records mix them up."""
    from polytile.poly.dsl import kernel_from_node

    def rounding(mode: str) -> onnx.ModelProto:
        nodes = [
            helper.make_node("Cast", ["x"], ["e"], to=TensorProto.FLOAT8E8M0, round_mode=mode),
            helper.make_node("Cast", ["e"], ["y"], to=TensorProto.FLOAT),
        ]
        graph = helper.make_graph(
            nodes,
            "cast",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])

    keys = {kernel_from_node(rounding(m)).workload_key() for m in ("up", "down", "nearest")}
    assert len(keys) == 3
    x = np.array([3.0, 5.0, 6.0, 12.0, 24.0, 40.0, 100.0, 129.0], np.float32)
    up, down = (pt.compile(rounding(m)).run({"x": x})[0] for m in ("up", "down"))
    assert np.all(up >= x) and np.all(down <= x) and np.any(up != down)


def test_forked_maps_from_two_threads_keep_their_own_functions() -> None:
    """Two threads mapping at once (two models compiled side by side) each get their own
    function's results: the forked workers' function is set under a lock."""
    from concurrent.futures import ThreadPoolExecutor

    def square(i: int) -> int:
        return i * i

    def negate(i: int) -> int:
        return -i

    with ThreadPoolExecutor(2) as pool:
        squares = pool.submit(jit.forked_map, square, 6, 2)
        negated = pool.submit(jit.forked_map, negate, 6, 2)
        assert squares.result() == [i * i for i in range(6)]
        assert negated.result() == [-i for i in range(6)]
