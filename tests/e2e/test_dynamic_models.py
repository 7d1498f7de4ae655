"""Models compiled once for every value of their symbolic sizes: an attention block with
symbolic batch and sequence, a CNN with symbolic batch, height and width. Each compiled
model runs at several sizes (1, odd ones, ones no tile divides) against onnxruntime,
without compiling again; a saved model serves all sizes after loading; bad sizes are
refused naming the input."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
import polytile.codegen.dynamic
import polytile.compiler
from polytile import zoo
from polytile.errors import IndexOutOfRangeError, InputError, PolytileError
from polytile.poly.default.schedule import representative_sizes

from peers import ort_run


def _weights(rng: np.random.Generator, specs: list[tuple[str, tuple, float]]) -> list:
    return [
        numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
        for name, shape, scale in specs
    ]


def attention_model(d: int = 64, heads: int = 4) -> onnx.ModelProto:
    """A transformer encoder's attention half: projections, heads split by Reshape and
    Transpose, scaled scores, softmax, the output projection, residual and LayerNorm."""
    rng = np.random.default_rng(5)
    inits = _weights(rng, [(n, (d, d), d**-0.5) for n in ("wq", "wk", "wv", "wo")])
    inits += _weights(rng, [("gamma", (d,), 1.0), ("beta", (d,), 0.1)])
    dh = d // heads
    inits += [
        numpy_helper.from_array(np.array([0, 0, heads, dh], np.int64), "split"),
        numpy_helper.from_array(np.array([0, 0, d], np.int64), "merge"),
        numpy_helper.from_array(np.array(dh**-0.5, np.float32), "scale"),
    ]
    n = helper.make_node
    nodes = [
        *(n("MatMul", ["x", f"w{p}"], [f"{p}0"]) for p in "qkv"),
        *(n("Reshape", [f"{p}0", "split"], [f"{p}1"]) for p in "qkv"),
        n("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["s0"]),
        n("Mul", ["s0", "scale"], ["s1"]),
        n("Softmax", ["s1"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["o0"]),
        n("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["o1", "merge"], ["o2"]),
        n("MatMul", ["o2", "wo"], ["o3"]),
        n("Add", ["o3", "x"], ["r"]),
        n("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "attention", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn_model() -> onnx.ModelProto:
    """Padded and strided convs, a depthwise conv with a residual, max pooling, global
    average pooling (a mean over a symbolic count) and a classifier."""
    rng = np.random.default_rng(6)
    inits = _weights(
        rng,
        [
            ("w1", (8, 3, 3, 3), 0.3),
            ("b1", (8,), 0.1),
            ("w2", (16, 8, 3, 3), 0.15),
            ("dw", (16, 1, 3, 3), 0.3),
            ("w3", (10, 16), 0.25),
            ("b3", (10,), 0.1),
        ],
    )
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Relu", ["c2"], ["r2"]),
        n("Conv", ["r2", "dw"], ["c3"], pads=[1, 1, 1, 1], group=16),
        n("Add", ["c3", "r2"], ["a3"]),
        n("GlobalAveragePool", ["a3"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "cnn", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@functools.cache
def _attention() -> pt.CompiledModel:
    return pt.compile(attention_model())


def _no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run compiled again")

    monkeypatch.setattr(polytile.compiler, "_compile", refuse)
    monkeypatch.setattr(polytile.compiler, "link", refuse)


def _check(model: onnx.ModelProto, compiled: pt.CompiledModel, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    (got,) = compiled.run({"x": x})
    (want,) = ort_run(model, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"at {shape}")


def test_attention_compiles_once_for_every_batch_and_sequence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = _attention()
    assert compiled.manifest.dynamic is not None
    assert compiled.manifest.inputs[0].shape == ("batch", "seq", 64)
    _no_compiling(monkeypatch)
    for shape in [(1, 1, 64), (2, 7, 64), (1, 33, 64), (3, 16, 64), (1, 7, 64)]:
        _check(attention_model(), compiled, shape)


def test_cnn_compiles_once_for_every_batch_and_image_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = cnn_model()
    with pytest.raises(PolytileError, match=r"MaxPool.*give bounds"):
        pt.compile(model)  # an image of 1 pixel has no pooled output
    compiled = pt.compile(model, bounds={"h": (4, 64), "w": (4, 64)})
    _no_compiling(monkeypatch)
    for shape in [(1, 3, 32, 32), (2, 3, 17, 9), (1, 3, 4, 4), (3, 3, 40, 23)]:
        _check(model, compiled, shape)
    # sizes outside the bounds its schedules were proven for are refused, named
    x = np.zeros((1, 3, 3, 32), np.float32)
    with pytest.raises(InputError, match=r"size 'h' = 3 is outside the bounds \[4, 64\]"):
        compiled.run({compiled.input_names[0]: x})


def test_the_memory_plan_of_a_new_size_is_native_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new size's plan comes from the model's own `polytile_plan` (microseconds), not
    from planning in Python; its arena holds every live tensor apart (the outputs match)."""
    compiled = _attention()

    def refuse(*args: object) -> None:
        raise AssertionError("planned in Python")

    monkeypatch.setattr(polytile.codegen.dynamic, "plan_memory", refuse)
    shapes = [(1, 9, 64), (3, 21, 64), (2, 63, 64)]
    for shape in shapes:
        _check(attention_model(), compiled, shape)
    assert {shape[:2] for shape in shapes} <= set(compiled.manifest.dynamic._tables)


def test_a_saved_dynamic_model_serves_every_size(tmp_path: Path) -> None:
    path = _attention().save(tmp_path / "attention.ptm")
    loaded = pt.load(path)
    assert loaded.manifest.dynamic == _attention().manifest.dynamic
    for shape in [(2, 5, 64), (1, 40, 64)]:
        _check(attention_model(), loaded, shape)


def test_profile_of_a_dynamic_model_runs_its_kernels_at_the_feeds_sizes() -> None:
    """Each kernel called on its own with the run's sizes and arena offsets: the calls
    leave the outputs one run leaves."""
    compiled = _attention()
    for shape in [(1, 3, 64), (2, 40, 64)]:
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        profile = compiled.profile({"x": x}, repeat=2)
        assert len(profile.calls) == len(compiled.manifest.calls)
        (want,) = ort_run(attention_model(), {"x": x})
        np.testing.assert_allclose(profile.outputs[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("bounds", "want"),
    [
        ({}, {"batch": 1, "seq": 128, "batch__seq": 128}),
        ({"batch": (8, 16), "seq": (1, 64)}, {"batch": 8, "seq": 64, "batch__seq": 512}),
    ],
)
def test_default_decisions_are_made_at_a_batch_of_one(bounds: dict, want: dict) -> None:
    """A model input's leading size is a batch: its kernels' default decisions are made at
    1 (within the bounds), the other sizes at a representative size, products at theirs."""
    with polytile.compiler.imported(zoo.build("llama_small__dyn"), None, None, bounds) as graph:
        sizes = representative_sizes(graph)
    assert {k: sizes[k] for k in want} == want


def test_static_compile_is_still_asked_for_with_dynamic_false() -> None:
    model = attention_model()
    with pytest.raises(PolytileError, match="input_shapes"):
        pt.compile(model, dynamic=False)
    static = pt.compile(model, input_shapes={"x": (2, 5, 64)}, dynamic=False)
    assert static.manifest.dynamic is None
    _check(model, static, (2, 5, 64))


def test_bad_sizes_are_refused_naming_the_input() -> None:
    compiled = _attention()
    with pytest.raises(InputError, match="input 'x' must have rank 3"):
        compiled.run({"x": np.zeros((2, 64), np.float32)})
    with pytest.raises(InputError, match=r"input 'x' must have shape \[batch, seq, 64\]"):
        compiled.run({"x": np.zeros((2, 3, 32), np.float32)})
    with pytest.raises(InputError, match="'seq' = 0"):
        compiled.run({"x": np.zeros((2, 0, 64), np.float32)})


ZOO = {
    # BERT slices its 512 position ids by seq: it is defined for seq <= 512 only
    "bert_small__dyn": ({"seq": (1, 512)}, [(1, 1), (2, 7), (3, 33)]),
    "llama_small__dyn": ({}, [(1, 7), (2, 16), (1, 1)]),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_transformers_compile_once_for_every_batch_and_sequence(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their shape subgraphs (Shape → Gather → Concat → Reshape, Range over seq, a Slice
    ending at seq) fold away (`frontend.symbolic_graph`); the token ids are checked at run
    time against the embedding's rows."""
    bounds, grid = ZOO[name]
    model = zoo.build(name)
    compiled = pt.compile(model, bounds=bounds)
    assert compiled.manifest.dynamic is not None and compiled.manifest.checks
    _no_compiling(monkeypatch)
    for batch, seq in grid:
        feeds = zoo.random_inputs(model, dims={"batch": batch, "seq": seq})
        for got, want in zip(compiled.run(feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{batch}x{seq}")
    ids = next(n for n, v in feeds.items() if v.dtype.kind == "i" and v.max() > 1)
    feeds[ids] = np.full_like(feeds[ids], 10**6)
    with pytest.raises(IndexOutOfRangeError, match=ids):
        compiled.run(feeds)


def test_a_session_compiles_a_symbolic_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """As onnxruntime's: one session runs every size; where compiling for all sizes is
    refused (the CNN's pooling needs bounds), it warns and compiles per input shape."""
    session = pt.InferenceSession(attention_model().SerializeToString())
    x = np.random.default_rng(7).standard_normal((2, 9, 64)).astype(np.float32)
    with monkeypatch.context() as patched:
        _no_compiling(patched)
        for shape in [(2, 9, 64), (1, 4, 64)]:
            (got,) = session.run(None, {"x": x[: shape[0], : shape[1]]})
            (want,) = ort_run(attention_model(), {"x": x[: shape[0], : shape[1]]})
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.warns(UserWarning, match="compiled per input shape.*MaxPool"):
        session = pt.InferenceSession(cnn_model())
    x = np.random.default_rng(8).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, ort_run(cnn_model(), {"x": x})[0], rtol=1e-4, atol=1e-4)
