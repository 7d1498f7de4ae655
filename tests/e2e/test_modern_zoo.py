"""Today's exports (the modern zoo): trained-like random weights, every float model
compiled and compared with onnxruntime, symbolic models at two shapes, int8 models
refused with one error naming their quantization ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import polytile as pt
from polytile import zoo
from polytile.errors import UnsupportedOpError

ort = pytest.importorskip("onnxruntime")

INFOS = {i.name: i for i in zoo.list_models() if i.source == "modern"}
FLOAT = [n for n, i in INFOS.items() if not i.quantized]
STATIC = [n for n in FLOAT if not INFOS[n].symbolic]
SYMBOLIC = [n for n in FLOAT if INFOS[n].symbolic]
QUANTIZED = [n for n, i in INFOS.items() if i.quantized]
#: models whose compile takes long: they run in the slow tier (CI runs it too)
BIG = {"convnext_small", "efficientnet_v2_s", "maxvit_t", "swin_v2_t", "inception_v3"}
#: sizes of the symbolic dimensions, two shapes each
SHAPES = ({"batch": 1, "seq": 16}, {"batch": 2, "seq": 7})
#: layers whose outputs must stay of order 1 (the weights' scale shows there first)
LAYERS = ("Conv", "MatMul", "Gemm")


def _ort_run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], extra: list[str] = ()
) -> list[np.ndarray]:
    if extra:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        copy.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
        model = copy
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _assert_matches(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    """Within 1e-3 of each output's scale (its largest magnitude)."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        scale = float(np.abs(e).max()) or 1.0
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-3 * scale)


def test_the_modern_zoo_is_complete() -> None:
    assert len(INFOS) == 32
    assert sorted(i.quantized for i in INFOS.values() if i.quantized) == [
        "int8dyn",
        "qdq",
        "qdq",
        "qop",
    ]
    assert {n for n in SYMBOLIC} == {
        "bert_small__dyn",
        "gpt2_2l__dyn",
        "llama_small__dyn",
        "resnet34__dyn",
    }


@pytest.mark.parametrize("name", FLOAT)
def test_weights_keep_activations_of_order_1(name: str, zoo_model) -> None:
    """Every conv / linear layer's output and the model's outputs have a standard
    deviation of order 1 (as trained weights give), with no denormals in the outputs."""
    model = zoo_model(name)
    layer_outputs = [n.output[0] for n in model.graph.node if n.op_type in LAYERS]
    feeds = zoo.random_inputs(model, seed=1, dims=SHAPES[0])
    results = _ort_run(model, feeds, layer_outputs)
    outputs, layers = results[: len(model.graph.output)], results[len(model.graph.output) :]
    for value in outputs:
        assert np.isfinite(value).all()
        assert 0.1 < float(value.std()) < 10, float(value.std())
        tiny = (np.abs(value) < np.finfo(np.float32).tiny) & (value != 0)
        assert not tiny.any(), "denormal outputs"
    stds = [float(v.std()) for v in layers if v.size > 1]
    assert stds and min(stds) > 0.05 and max(stds) < 20, (min(stds), max(stds))


def _params(names: list[str]) -> list[object]:
    return [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in names]


@pytest.mark.parametrize("name", _params(STATIC))
def test_static_model_matches_onnxruntime(name: str, zoo_model) -> None:
    model = zoo_model(name)
    feeds = zoo.random_inputs(model, seed=2)
    _assert_matches(pt.compile(model).run(feeds), _ort_run(model, feeds))


@pytest.mark.parametrize("name", _params(SYMBOLIC))
def test_symbolic_model_matches_onnxruntime_at_two_shapes(name: str, zoo_model) -> None:
    model = zoo_model(name)
    session = pt.InferenceSession(model.SerializeToString())
    for seed, dims in enumerate(SHAPES):
        feeds = zoo.random_inputs(model, seed=seed, dims=dims)
        _assert_matches(session.run(None, feeds), _ort_run(model, feeds))


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_model_is_refused_naming_its_quantization_ops(name: str, zoo_model) -> None:
    model = zoo_model(name)
    ops = {n.op_type for n in model.graph.node}
    quantization = {op for op in ops if "Quant" in op or op.startswith("QLinear")}
    assert quantization
    with pytest.raises(UnsupportedOpError) as info:
        pt.compile(model)
    first = str(info.value).splitlines()[0]
    assert "int8-quantized" in first
    assert all(op in first for op in quantization)


def test_weights_are_seeded() -> None:
    a, b = zoo.build("squeezenet1_1", 0), zoo.build("squeezenet1_1", 1)
    wa = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
    wb = {t.name: numpy_helper.to_array(t) for t in b.graph.initializer}
    again = {
        t.name: numpy_helper.to_array(t) for t in zoo.build("squeezenet1_1", 0).graph.initializer
    }
    assert wa.keys() == wb.keys() == again.keys()
    convs = [k for k, v in wa.items() if v.ndim == 4]
    assert convs and all(not np.array_equal(wa[k], wb[k]) for k in convs)
    assert all(np.array_equal(wa[k], again[k]) for k in wa)
