"""GroupNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization and
Hardmax compiled to native code on cases the ONNX node tests miss (groups != channels,
opset 18's per-group scale given at run time, half precision, old Hardmax's 2-D
flattening), against numpy and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import polytile as pt
from polytile.errors import UnsupportedOpError
from polytile.frontend.importer import _Importer

from peers import one_node_model, ort_run

RNG = np.random.default_rng(11)


def model(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    constants: dict[str, np.ndarray] | None = None,
    opset: int = 21,
) -> onnx.ModelProto:
    """A one-node model whose output `y` has the first input's dtype."""
    elem = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)
    return one_node_model(node, inputs, {"y": elem}, constants, opset, 8 if opset < 21 else 10)


def compiled_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (got,) = pt.compile(m).run(feeds)
    return got


def numpy_group_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int, eps: float
) -> np.ndarray:
    n, c = x.shape[:2]
    grouped = x.astype(np.float64).reshape(n, groups, -1)
    mean = grouped.mean(axis=2, keepdims=True)
    var = grouped.var(axis=2, keepdims=True)
    normalized = ((grouped - mean) / np.sqrt(var + eps)).reshape(x.shape)
    channel = (1, c) + (1,) * (x.ndim - 2)
    return normalized * scale.reshape(channel) + bias.reshape(channel)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 3), 3), ((1, 8, 7), 2), ((2, 4, 3), 4)])
def test_group_norm_groups_differ_from_channels(shape: tuple[int, ...], groups: int) -> None:
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    scale = RNG.standard_normal(shape[1]).astype(np.float32)
    bias = RNG.standard_normal(shape[1]).astype(np.float32)
    node = helper.make_node(
        "GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups, epsilon=1e-3
    )
    m = model(node, {"x": x}, {"scale": scale, "bias": bias})
    got = compiled_run(m, {"x": x})
    want = numpy_group_norm(x, scale, bias, groups, 1e-3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scale_at_run_time", [False, True])
def test_group_norm_opset18_per_group_scale(scale_at_run_time: bool) -> None:
    """Opset 18's scale and bias hold one value per group. onnx's checker now refuses
    GroupNormalization-18 as deprecated, so the model is imported past the checker."""
    x = RNG.standard_normal((2, 6, 4)).astype(np.float32)
    scale = RNG.standard_normal(3).astype(np.float32)
    bias = RNG.standard_normal(3).astype(np.float32)
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3)
    params = {"scale": scale, "bias": bias}
    if scale_at_run_time:
        m = model(node, {"x": x, **params}, opset=18)
        feeds = {"x": x, **params}
    else:
        m = model(node, {"x": x}, params, opset=18)
        feeds = {"x": x}
    graph = _Importer(m, "g", 18, {}, {}).run()
    (got,) = pt.compile(graph).run(feeds)
    want = numpy_group_norm(x, np.repeat(scale, 2), np.repeat(bias, 2), 3, 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_group_norm_float16() -> None:
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float16)
    scale = RNG.standard_normal(4).astype(np.float16)
    bias = RNG.standard_normal(4).astype(np.float16)
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=2)
    m = model(node, {"x": x}, {"scale": scale, "bias": bias})
    got = compiled_run(m, {"x": x})
    assert got.dtype == np.float16
    want = numpy_group_norm(x, scale, bias, 2, 1e-5)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_group_norm_unsupported_stash_type_is_refused() -> None:
    x = RNG.standard_normal((1, 4, 3)).astype(np.float32)
    params = {"scale": np.ones(4, np.float32), "bias": np.zeros(4, np.float32)}
    node = helper.make_node(
        "GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=2, stash_type=10
    )
    with pytest.raises(UnsupportedOpError, match="stash_type"):
        pt.compile(model(node, {"x": x}, params))


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_rms_norm_against_numpy(axis: int) -> None:
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    scale = RNG.standard_normal((4, 5)[axis % 3 - 1 :] if axis % 3 else (3, 4, 5))
    scale = scale.astype(np.float32)
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-4)
    m = model(node, {"x": x}, {"scale": scale}, opset=23)
    got = compiled_run(m, {"x": x})
    axes = tuple(range(axis % 3, 3))
    calc = x.astype(np.float64)
    want = calc / np.sqrt(np.mean(calc * calc, axis=axes, keepdims=True) + 1e-4) * scale
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_norm_with_negative_values(p: int, axis: int) -> None:
    x = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    x[1, 2, :] = 0  # a zero norm along the last axis gives 0
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p)
    m = model(node, {"x": x}, opset=13)
    got = compiled_run(m, {"x": x})
    norm = np.linalg.norm(x.astype(np.float64), ord=p, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.where(norm == 0, 0, x / norm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axes", [[0, 2, 3], [1], [-1, -2], [0, 1, 2, 3]])
def test_mvn_axes_against_onnxruntime(axes: list[int]) -> None:
    x = (RNG.standard_normal((2, 3, 4, 5)) * 2 + 3).astype(np.float32)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=axes)
    m = model(node, {"x": x}, opset=13)
    got = compiled_run(m, {"x": x})
    red = tuple(a % 4 for a in axes)
    calc = x.astype(np.float64)
    mean = calc.mean(axis=red, keepdims=True)
    want = (calc - mean) / (np.sqrt(((calc - mean) ** 2).mean(axis=red, keepdims=True)) + 1e-9)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 0), (11, 2), (13, 1), (13, -3)])
def test_hardmax_opsets_against_onnxruntime(opset: int, axis: int) -> None:
    """Before opset 13 Hardmax works on the input flattened to 2-D at `axis`."""
    x = RNG.integers(0, 3, size=(2, 3, 4)).astype(np.float32)  # ties: the first wins
    node = helper.make_node("Hardmax", ["x"], ["y"], axis=axis)
    m = model(node, {"x": x}, opset=opset)
    got = compiled_run(m, {"x": x})
    np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])
    if opset < 13:
        rows = int(np.prod(x.shape[: axis % 3]))
        flat = x.reshape(rows, -1)
        want = np.zeros_like(flat)
        want[np.arange(rows), np.argmax(flat, axis=1)] = 1
    else:
        first = np.expand_dims(np.argmax(x, axis=axis), axis)
        want = (
            np.arange(x.shape[axis]).reshape([-1 if a == axis % 3 else 1 for a in range(3)])
            == first
        ).astype(np.float32)
    np.testing.assert_array_equal(got, want.reshape(x.shape))
