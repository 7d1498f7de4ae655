"""The compiled-model runtime: results against onnxruntime, saved artifacts, the C library,
feed validation, the ORT-compatible session, thread counts and the memory plan."""

from __future__ import annotations

import ctypes
import itertools
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import binding as llvm
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.codegen.jit import linker
from polytile.codegen.module import (
    PREFETCH_MIN_BYTES,
    KernelCall,
    Slot,
    add_entry,
    new_module,
    prefetch_targets,
)
from polytile.codegen.plan import ALIGN, Lifetime, plan_memory
from polytile.codegen.target import LARGE_L2, ROWS_AHEAD, host, machine_defaults
from polytile.errors import InputError, ModelError
from polytile.poly.ir.buffers import aligned_block, aligned_empty
from polytile.runtime import ALIGNED_OUTPUT_BYTES

RNG = np.random.default_rng(0)


def residual_block(batch: int | str = 1) -> onnx.ModelProto:
    """Conv → ReLU → Conv → + x → ReLU → GlobalAveragePool → Flatten → Gemm → Softmax."""
    w1 = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    w2 = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    fc = RNG.standard_normal((5, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 10, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(fc, "fc"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)


@pytest.fixture(scope="module")
def block() -> tuple[onnx.ModelProto, pt.CompiledModel]:
    model = residual_block()
    return model, pt.compile(model)


def test_compiled_model_matches_onnxruntime(block) -> None:
    model, compiled = block
    feeds = {"x": RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)}
    (got,) = compiled.run(feeds)
    (want,) = ort_run(model, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert compiled.stats.kernels >= 3
    assert 0 < compiled.stats.arena_bytes <= compiled.stats.unshared_bytes


def test_thread_counts_give_identical_results(block) -> None:
    _, compiled = block
    feeds = {"x": RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)}
    compiled.set_num_threads(1)
    one = compiled.run(feeds)[0]
    compiled.set_num_threads(2)
    two = compiled.run(feeds)[0]
    np.testing.assert_array_equal(one, two)
    with pytest.raises(InputError, match="num_threads"):
        compiled.set_num_threads(0)


def test_save_and_load_give_the_same_results(block, tmp_path: Path) -> None:
    _, compiled = block
    feeds = {"x": RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)}
    path = compiled.save(tmp_path / "block.ptm")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["inputs"][0]["name"] == "x"
    loaded = pt.load(path)
    np.testing.assert_array_equal(loaded.run(feeds)[0], compiled.run(feeds)[0])
    compiled.save(path)  # overwriting an artifact is allowed
    assert pt.load(path).output_names == ["y"]


def test_every_buffer_a_compiled_model_passes_starts_on_a_cache_line(block, tmp_path: Path) -> None:
    """Constants (the 160-byte `fc` among them), arena and outputs of `ALIGNED_OUTPUT_BYTES`
    and more are 64-byte aligned, also after loading: numpy's own 16-byte alignment makes
    vector loads span two lines."""
    _, compiled = block
    loaded = pt.load(compiled.save(tmp_path / "block.ptm"))
    for model in (compiled, loaded):
        assert len(model.constants) >= 3
        assert [c.ctypes.data % ALIGN for c in model.constants] == [0] * len(model.constants)
        assert model._arena.ctypes.data % ALIGN == 0
    for mine, theirs in zip(loaded.constants, compiled.constants, strict=True):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
        np.testing.assert_array_equal(mine, theirs)
    shape = [1, 4, ALIGNED_OUTPUT_BYTES // 16]  # float32: ALIGNED_OUTPUT_BYTES exactly
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "yz"],
    )
    wide = pt.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = RNG.standard_normal(shape).astype(np.float32)
    for outputs in (wide.run({"x": x}), wide.profile({"x": x}, repeat=1).outputs):
        assert [o.ctypes.data % ALIGN for o in outputs] == [0, 0]
        assert [o.shape for o in outputs] == [tuple(shape)] * 2
        np.testing.assert_array_equal(outputs[0], np.maximum(x, 0))
        np.testing.assert_array_equal(outputs[1], -x)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 7), max_size=3),
            st.sampled_from(["float32", "float64", "int8", "bool", "int64", "float16"]),
        ),
        max_size=8,
    )
)
def test_aligned_block_copies_each_array_to_its_own_aligned_place(specs: list) -> None:
    """(An empty array has no data to align: numpy may give it any address.)"""
    rng = np.random.default_rng(len(specs))
    values = [rng.integers(0, 100, shape).astype(dtype) for shape, dtype in specs]
    copies = aligned_block(values)
    spans = []
    for value, copy in zip(values, copies, strict=True):
        assert copy.shape == value.shape and copy.dtype == value.dtype
        assert copy.flags.c_contiguous and (copy.size == 0 or copy.ctypes.data % ALIGN == 0)
        np.testing.assert_array_equal(copy, value)
        if copy.size:
            spans.append((copy.ctypes.data, copy.ctypes.data + copy.nbytes))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    for shape, dtype in specs:
        empty = aligned_empty(tuple(shape), dtype)
        assert empty.shape == tuple(shape) and empty.dtype == np.dtype(dtype)
        assert empty.size == 0 or empty.ctypes.data % ALIGN == 0


def test_each_call_fetches_the_next_calls_largest_constant_ahead() -> None:
    """The entry points the prefetch window at the next call's largest constant before
    each call (none before the last, nor for constants under `PREFETCH_MIN_BYTES`) and
    empties it at the end."""
    big, mid, small = 4 * PREFETCH_MIN_BYTES, 2 * PREFETCH_MIN_BYTES, PREFETCH_MIN_BYTES - 64
    calls = [
        KernelCall("f", (Slot("arena", 0), Slot("constant", 0), Slot("constant", 1))),
        KernelCall("g", (Slot("constant", 1), Slot("constant", 2), Slot("arena", 64))),
        KernelCall("h", (Slot("constant", 3), Slot("arena", 0))),
        KernelCall("k", (Slot("arena", 0),)),
        KernelCall("f", (Slot("arena", 0), Slot("constant", 0), Slot("constant", 1))),
    ]
    sizes = [mid, mid // 2, big, small]
    assert prefetch_targets(calls, sizes) == [2, None, None, 0, None]
    assert prefetch_targets([], sizes) == []  # a model whose outputs no kernel writes
    mc = new_module("m", replace(host(), prefetch_weights=True))
    add_entry(mc, "entry", calls, {"f": 3, "g": 3, "h": 2, "k": 1}, sizes)
    text = str(mc.module)
    lines = re.findall(r"store i64 (\d+), [^@,]*@\"?polytile_prefetch_lines", text)
    assert lines == [str(big // 64), "0", "0", str(mid // 64), "0", "0"]


def test_a_target_that_leaves_prefetching_to_the_hardware_has_no_window(block) -> None:
    """`Target.prefetch_weights` off: no kernel asks for the window's lines (locality 1)
    and the entry never points it anywhere; the results are the same. `host()` turns it
    on for cores whose L2 is below `LARGE_L2`, where it was measured to pay."""
    model, _ = block
    feeds = {"x": RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)}
    (want,) = ort_run(model, feeds)
    for window in (True, False):
        compiled = pt.compile(model, target=replace(host(2), prefetch_weights=window))
        (got,) = compiled.run(feeds)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        texts = [str(llvm.parse_bitcode(part.bitcode)) for part in compiled._parts]
        asked = any(re.search(r"i32 0, i32 1, i32 1\)", t) for t in texts)
        assert asked is window
        if not window:
            assert not any(re.search(r"store ptr [^\n]*polytile_prefetch_at", t) for t in texts)
    assert machine_defaults(512 << 10).prefetch_weights
    assert machine_defaults(1 << 20).prefetch_weights
    assert not machine_defaults(2 << 20).prefetch_weights
    assert host().prefetch_weights is machine_defaults(host().l2_bytes).prefetch_weights


def test_the_panel_fetched_ahead_is_half_of_a_large_l2() -> None:
    """`Target.prefetch_panel`: 64 KB below `LARGE_L2` (512 KiB and 1 MiB cores), where
    larger panels did not pay; half of a larger L2, so that the next panel fits beside
    the one in use."""
    assert LARGE_L2 == 2 << 20
    assert machine_defaults(1 << 20).prefetch_panel == 1 << 16
    assert machine_defaults(512 << 10).prefetch_panel == 1 << 16
    assert machine_defaults(2 << 20).prefetch_panel == 1 << 20
    assert machine_defaults(4 << 20).prefetch_panel == 2 << 20
    assert host().prefetch_panel == machine_defaults(host().l2_bytes).prefetch_panel


def test_input_rows_are_fetched_ahead_on_cores_with_a_large_l2() -> None:
    """`Target.input_ahead`: 16 steps on cores with `LARGE_L2` or more, where it was
    measured to pay; below it the rows are left to the hardware."""
    assert ROWS_AHEAD == 16
    assert machine_defaults(2 << 20).input_ahead == machine_defaults(3 << 20).input_ahead == 16
    assert machine_defaults(1 << 20).input_ahead == machine_defaults(256 << 10).input_ahead == 0
    assert host().input_ahead == machine_defaults(host().l2_bytes).input_ahead


def test_stencil_weight_panels_are_fetched_ahead_on_cores_with_a_large_l2() -> None:
    """`Target.panel_ahead`: on cores with `LARGE_L2` or more, where it was measured to
    pay, not below it; `host()` follows its own L2."""
    assert machine_defaults(2 << 20).panel_ahead
    assert not machine_defaults((2 << 20) - 1).panel_ahead
    assert not machine_defaults(1 << 20).panel_ahead
    assert host().panel_ahead is machine_defaults(host().l2_bytes).panel_ahead


def exp_model() -> onnx.ModelProto:
    """One Log, whose vectors go through libmvec where the machine has it (float32 exp
    is inline arithmetic)."""
    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])],
        "exp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not host().vector_math, reason="this machine's C library has no libmvec")
def test_saved_code_calling_libmvec_loads_only_where_it_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved code that calls libmvec is compiled again for another CPU that can run it,
    and refused, naming the function, by one that cannot (its call would jump to 0)."""
    compiled = pt.compile(exp_model())
    feeds = {"x": np.abs(RNG.standard_normal((1, 4, 40))).astype(np.float32) + 0.1}
    path = compiled.save(tmp_path / "exp.ptm")
    other = replace(host(), cpu="skylake-avx512")
    monkeypatch.setattr("polytile.runtime.host", lambda num_threads=None: other)
    (got,) = pt.load(path).run(feeds)
    (want,) = compiled.run(feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)
    without = replace(other, vector_math=False)
    monkeypatch.setattr("polytile.runtime.host", lambda num_threads=None: without)
    with pytest.raises(ModelError, match=r"exp\.ptm.*libmvec's '_ZGV\w+_logf'"):
        pt.load(path)


@pytest.mark.skipif(linker() is None, reason="no system linker")
@pytest.mark.skipif(not host().vector_math, reason="this machine's C library has no libmvec")
def test_an_exported_library_calling_libmvec_names_it_as_a_dependency(tmp_path: Path) -> None:
    """A fresh process (which has not loaded libmvec) can open the library: the loader
    finds libmvec through the library's own dependencies (`-lm` brings it on glibc)."""
    path = pt.compile(exp_model()).export_library(tmp_path / "exp.so")
    opened = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert opened.returncode == 0, opened.stderr


def test_loading_something_else_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a readable saved polytile model"):
        pt.load(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": 99}')
    with pytest.raises(ModelError, match="format 99"):
        pt.load(tmp_path)


@pytest.mark.skipif(linker() is None, reason="no system linker")
def test_exported_library_is_callable_from_c(block, tmp_path: Path) -> None:
    _, compiled = block
    feeds = {"x": RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)}
    path = compiled.export_library(tmp_path / "block.so")
    lib = ctypes.CDLL(str(path))
    manifest = json.loads(Path(f"{path}.json").read_text())
    with np.load(f"{path}.npz") as npz:
        constants = [np.ascontiguousarray(npz[f"arr_{i}"]) for i in range(len(npz.files))]
    arena = np.zeros(manifest["arena_bytes"] + 64, dtype=np.uint8)
    out = np.zeros((1, 5), dtype=np.float32)
    pointers = ctypes.c_void_p * 8
    lib.polytile_run(
        pointers(feeds["x"].ctypes.data),
        pointers(out.ctypes.data),
        pointers(*[c.ctypes.data for c in constants]),
        ctypes.c_void_p(arena.ctypes.data),
    )
    np.testing.assert_allclose(out, compiled.run(feeds)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({}, "input 'x' is missing"),
        ({"x": np.zeros((1, 8, 10, 12), np.float64)}, "must be float32, got float64"),
        ({"x": np.zeros((1, 8, 10, 11), np.float32)}, r"must have shape \[1, 8, 10, 12\]"),
        ({"x": np.zeros((1, 8, 10, 12), np.float32), "z": 1}, r"unknown input\(s\) \['z'\]"),
    ],
)
def test_bad_feeds_are_input_errors_naming_the_input(block, feeds: dict, message: str) -> None:
    _, compiled = block
    with pytest.raises(InputError, match=message):
        compiled.run(feeds)


def test_non_contiguous_feeds_are_accepted(block) -> None:
    _, compiled = block
    x = RNG.standard_normal((1, 8, 12, 10)).astype(np.float32)
    view = x.transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(
        compiled.run({"x": view})[0], compiled.run({"x": np.ascontiguousarray(view)})[0]
    )


def test_session_is_onnxruntime_compatible() -> None:
    model = residual_block()
    mine = pt.InferenceSession(model.SerializeToString())
    theirs = ort.InferenceSession(model.SerializeToString())
    for a, b in zip(
        mine.get_inputs() + mine.get_outputs(),
        theirs.get_inputs() + theirs.get_outputs(),
        strict=True,
    ):
        assert (a.name, a.shape, a.type) == (b.name, b.shape, b.type)
    feeds = {"x": RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)}
    np.testing.assert_allclose(
        mine.run(["y"], feeds)[0], theirs.run(["y"], feeds)[0], rtol=1e-4, atol=1e-6
    )
    with pytest.raises(InputError, match="unknown output"):
        mine.run(["nope"], feeds)


def test_session_compiles_dynamic_shapes_per_feed_shape() -> None:
    model = residual_block(batch="N")
    mine = pt.InferenceSession(model)
    assert mine.get_inputs()[0].shape == ["N", 8, 10, 12]
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 8, 10, 12)).astype(np.float32)}
        (got,) = mine.run(None, feeds)
        assert got.shape == (batch, 5)
        np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-6)
    with pytest.raises(InputError, match="must have shape"):
        mine.run(None, {"x": np.zeros((1, 8, 10, 13), np.float32)})


def test_outputs_that_no_kernel_writes() -> None:
    """A graph output that is an input, a constant, or listed twice is still returned."""
    c = numpy_helper.from_array(np.arange(3, dtype=np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])],
        "passthrough",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3]),
        ],
        initializer=[c],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    got = pt.compile(model).run({"x": x})
    for g, w in zip(got, [np.maximum(x, 0), x, np.arange(3, dtype=np.float32)] * 2, strict=False):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[3], np.maximum(x, 0))


def test_benchmark_reports_each_repeat(block) -> None:
    _, compiled = block
    timing = compiled.benchmark(repeat=4, number=2)
    assert len(timing.results) == 4 and all(t > 0 for t in timing.results)
    assert timing.min <= timing.median <= max(timing.results)
    with pytest.raises(InputError):
        compiled.benchmark(repeat=0)


def test_profile_times_every_call_and_gives_the_outputs(block) -> None:
    """The calls made one by one from Python bind the same buffers as the entry function:
    the profiled run's outputs are the model's."""
    model, compiled = block
    x = RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)
    profile = compiled.profile({"x": x}, repeat=3)
    assert [c.function for c in profile.calls] == [c.function for c in compiled.manifest.calls]
    assert [c.index for c in profile.calls] == list(range(len(compiled.manifest.calls)))
    assert all(c.seconds > 0 for c in profile.calls)
    (want,) = compiled.run({"x": x})
    (got,) = profile.outputs
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="repeat"):
        compiled.profile({"x": x}, repeat=0)
    with pytest.raises(InputError, match="'x' is missing"):
        compiled.profile({}, repeat=1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 20)),
        min_size=1,
        max_size=25,
    )
)
def test_memory_plan_never_overlaps_live_tensors(items: list[tuple[int, int, int]]) -> None:
    lifetimes = {
        f"t{i}": Lifetime(size, min(a, b), max(a, b)) for i, (size, a, b) in enumerate(items)
    }
    plan = plan_memory(lifetimes)
    assert plan.arena_bytes <= plan.unshared_bytes
    names = sorted(lifetimes)
    for n in names:
        assert plan.offsets[n] % ALIGN == 0
        assert plan.offsets[n] + lifetimes[n].size <= plan.arena_bytes
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            la, lb = lifetimes[a], lifetimes[b]
            if la.first <= lb.last and lb.first <= la.last:
                sa, sb = plan.offsets[a], plan.offsets[b]
                assert sa + la.size <= sb or sb + lb.size <= sa, (a, b)


def test_memory_plan_reuses_dead_tensors() -> None:
    chain = {f"t{i}": Lifetime(1000, i, i + 1) for i in range(10)}
    plan = plan_memory(chain)
    assert plan.arena_bytes <= 3 * 1024 < plan.unshared_bytes


def test_memory_plan_gives_a_taken_over_input_s_bytes_to_its_taker() -> None:
    lifetimes = {
        "a": Lifetime(1000, 0, 2),
        "b": Lifetime(1000, 2, 4),
        "c": Lifetime(1000, 1, 3),
        "d": Lifetime(1000, 4, 5),
    }
    plan = plan_memory(lifetimes, {"b": "a", "d": "b"})
    assert plan.offsets["a"] == plan.offsets["b"] == plan.offsets["d"]
    assert abs(plan.offsets["c"] - plan.offsets["a"]) >= 1000
    assert plan.arena_bytes == 2 * 1024 < plan_memory(lifetimes).arena_bytes + 1024


@pytest.mark.parametrize(
    "shared",
    [{"b": "c"}, {"c": "a"}, {"b": "a", "e": "a"}, {"e": "a"}],
    ids=["overlapping", "starts-before-the-end", "two-takers", "other-size"],
)
def test_memory_plan_refuses_impossible_sharing(shared: dict[str, str]) -> None:
    lifetimes = {
        "a": Lifetime(1000, 0, 2),
        "b": Lifetime(1000, 2, 4),
        "c": Lifetime(1000, 1, 3),
        "e": Lifetime(500, 2, 3),
    }
    with pytest.raises(ValueError, match="bytes"):
        plan_memory(lifetimes, shared)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.booleans()), max_size=20))
def test_memory_plan_with_sharing_never_overlaps_live_groups(
    items: list[tuple[int, int, bool]],
) -> None:
    # chains of tensors, each living from its producer's step to a later one; where
    # the flag says so, a tensor takes over the bytes of the chain's previous one
    lifetimes: dict[str, Lifetime] = {}
    shared: dict[str, str] = {}
    step, previous = 0, None
    for i, (kb, length, take) in enumerate(items):
        name = f"t{i}"
        taking = take and previous is not None and lifetimes[previous].size == kb * 1000
        start = lifetimes[previous].last if taking else step
        lifetimes[name] = Lifetime(kb * 1000, start, start + length)
        if taking:
            shared[name] = previous
        previous, step = name, start + 1
    plan = plan_memory(lifetimes, shared)

    def group(n: str) -> str:
        while n in shared:
            n = shared[n]
        return n

    for n in shared:
        assert plan.offsets[n] == plan.offsets[shared[n]]
    names = sorted(lifetimes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            la, lb = lifetimes[a], lifetimes[b]
            if group(a) != group(b) and la.first <= lb.last and lb.first <= la.last:
                sa, sb = plan.offsets[a], plan.offsets[b]
                assert sa + la.size <= sb or sb + lb.size <= sa, (a, b)


def two_conv_block(reuse_input_later: bool) -> onnx.ModelProto:
    """Relu → Conv → Relu → Conv → + (the first Relu's output) → Relu → pool, where the
    residual is an intermediate tensor (optionally read once more at the end)."""
    w1 = RNG.standard_normal((6, 6, 3, 3)).astype(np.float32) * 0.2
    w2 = RNG.standard_normal((6, 6, 3, 3)).astype(np.float32) * 0.2
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Conv", ["c", "w2"], ["d"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["d", "a"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
    ]
    if reuse_input_later:
        nodes += [
            helper.make_node("GlobalAveragePool", ["r"], ["p"]),
            helper.make_node("GlobalMaxPool", ["a"], ["q"]),
            helper.make_node("Add", ["p", "q"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "two_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 1, 1])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _calls_sharing_bytes(compiled: pt.CompiledModel) -> list[str]:
    """The kernels that get one arena offset for two of their tensors (run in place)."""
    found = []
    for call in compiled.manifest.calls:
        offsets = [s.index for s in call.args if s.kind == "arena"]
        if len(set(offsets)) < len(offsets):
            found.append(call.function)
    return found


@pytest.mark.parametrize("reuse", [False, True], ids=["residual-dies", "residual-read-later"])
def test_a_residual_add_runs_in_place_when_its_input_dies(reuse: bool) -> None:
    model = two_conv_block(reuse)
    compiled = pt.compile(model)
    feeds = {"x": RNG.standard_normal((1, 6, 9, 11)).astype(np.float32)}
    (want,) = ort_run(model, feeds)
    for _ in range(2):  # the second run starts from the first one's arena
        (got,) = compiled.run(feeds)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    in_place = _calls_sharing_bytes(compiled)
    convs = [c.function for c in compiled.manifest.calls if c.function.endswith("Conv")]
    assert len(convs) == 2
    # the second conv's residual dies there, unless the max pool reads it again
    assert (convs[1] in in_place) is not reuse
    assert convs[0] not in in_place


def test_a_model_saved_before_index_checks_saves_again_without_them(tmp_path: Path) -> None:
    """A manifest without "checks" has an entry that returns nothing: saving it again must
    not add an empty list, or the next load would read a status from the void entry."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    first = pt.compile(model, num_threads=1).save(tmp_path / "first.ptm")
    data = json.loads((first / "manifest.json").read_text())
    assert data.pop("checks")
    (first / "manifest.json").write_text(json.dumps(data))
    second = pt.load(first).save(tmp_path / "second.ptm")
    assert "checks" not in json.loads((second / "manifest.json").read_text())
    loaded = pt.load(second)
    assert loaded.manifest.checks is None
    ids = np.array([0, 3, -1, 2, 1], np.int64)
    np.testing.assert_array_equal(loaded.run({"ids": ids})[0], table[ids])
