"""Reductions, ArgMin and CumSum compiled to native code on cases the ONNX node tests miss
(non-last axes, odd lengths, reverse + exclusive scans, large values, unsigned and half
dtypes), against numpy and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import polytile as pt

from peers import ort_run

RNG = np.random.default_rng(7)


def model(
    node: onnx.NodeProto,
    x_shape: tuple[int, ...],
    dtype: str,
    out_dtype: str | None = None,
    constants: dict[str, np.ndarray] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out_elem = helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype or dtype))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, x_shape)],
        [helper.make_tensor_value_info("y", out_elem, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in (constants or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def compiled_run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    (got,) = pt.compile(m).run({"x": x})
    return got


def numpy_cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    calc = np.flip(x, axis) if reverse else x
    total = np.cumsum(calc, axis=axis, dtype=np.float64 if x.dtype.kind == "f" else x.dtype)
    if exclusive:
        total = np.concatenate(
            [np.zeros_like(np.take(total, [0], axis=axis)), np.delete(total, -1, axis=axis)],
            axis=axis,
        )
    return (np.flip(total, axis) if reverse else total).astype(x.dtype)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [1, -3])
def test_cumsum_inner_axis_odd_length(exclusive: int, reverse: int, axis: int) -> None:
    shape = (3, 7, 5)
    x = RNG.standard_normal(shape).astype(np.float32)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    m = model(node, shape, "float32", constants={"axis": np.array(axis, np.int64)})
    got = compiled_run(m, x)
    want = numpy_cumsum(x, axis % 3, bool(exclusive), bool(reverse))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32", "uint64", "float64", "float16"])
def test_cumsum_dtypes(dtype: str) -> None:
    shape = (2, 9)
    if np.dtype(dtype).kind in "iu":
        x = RNG.integers(0, 50, size=shape).astype(dtype)
    else:
        x = RNG.standard_normal(shape).astype(dtype)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1)
    m = model(node, shape, dtype, constants={"axis": np.array([1], np.int32)}, opset=14)
    got = compiled_run(m, x)
    assert got.dtype == x.dtype
    want = numpy_cumsum(x, 1, True, True)
    if dtype == "float16":
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cumsum_attention_mask_positions() -> None:
    """RoBERTa's position ids: CumSum of an int mask along the sequence."""
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int64)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    m = model(node, mask.shape, "int64", constants={"axis": np.array(1, np.int64)})
    np.testing.assert_array_equal(compiled_run(m, mask), np.cumsum(mask, axis=1))


def test_reduce_log_sum_exp_large_values_are_stable() -> None:
    x = (RNG.standard_normal((4, 6, 5)) * 10 + 500).astype(np.float32)
    x[0, :, 0] = -np.inf  # an all -inf slice gives -inf, not NaN
    x[1, 2, 1] = np.inf
    node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)
    m = model(node, x.shape, "float32", constants={"axes": np.array([1], np.int64)})
    got = compiled_run(m, x)
    calc = x.astype(np.float64)
    peak = np.max(calc, axis=1, keepdims=True)
    safe = np.where(np.isinf(peak), 0, peak)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        want = (np.log(np.sum(np.exp(calc - safe), axis=1, keepdims=True)) + safe)[:, 0]
    assert np.isfinite(got[1:, :]).sum() == np.isfinite(want[1:, :]).sum()
    assert got[0, 0] == -np.inf and got[1, 1] == np.inf
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5)


REDUCERS = {
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "ReduceSumSquare": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "ReduceLogSum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
}


@pytest.mark.parametrize("op", sorted(REDUCERS))
@pytest.mark.parametrize("axes,keepdims", [([0, -1], 1), ([1], 0), ([-2, 0], 0)])
def test_reductions_on_several_axes(op: str, axes: list[int], keepdims: int) -> None:
    shape = (3, 5, 4)
    x = RNG.uniform(0.5, 1.5, size=shape).astype(np.float32)
    x *= RNG.choice([-1.0, 1.0], size=shape).astype(np.float32) if op != "ReduceLogSum" else 1
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    m = model(node, shape, "float32", constants={"axes": np.array(axes, np.int64)})
    got = compiled_run(m, x)
    want = REDUCERS[op](x.astype(np.float64), tuple(a % 3 for a in axes), bool(keepdims))
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op,dtype",
    [
        ("ReduceMin", "uint8"),
        ("ReduceMin", "int8"),
        ("ReduceMin", "uint32"),
        ("ReduceMax", "uint64"),
        ("ReduceProd", "int64"),
        ("ReduceProd", "uint32"),
        ("ReduceL1", "int32"),
        ("ReduceSumSquare", "uint64"),
        ("ReduceL1", "float16"),
    ],
)
def test_reductions_of_integers_and_halves(op: str, dtype: str) -> None:
    shape = (4, 3)
    kind = np.dtype(dtype).kind
    low = 0 if kind == "u" else -3
    x = RNG.integers(low, 4, size=shape).astype(dtype) if kind in "iu" else None
    if x is None:
        x = RNG.standard_normal(shape).astype(dtype)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    m = model(node, shape, dtype, constants={"axes": np.array([0], np.int64)})
    got = compiled_run(m, x)
    assert got.dtype == x.dtype
    if op == "ReduceMax":
        want = np.max(x, axis=0, keepdims=True)
    else:
        want = REDUCERS[op](x, (0,), True).astype(dtype)
    tol = 2e-3 if dtype == "float16" else 0
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol)


def test_reduce_min_bool() -> None:
    x = np.array([[True, False, True], [True, True, True]])
    node = helper.make_node("ReduceMin", ["x", "axes"], ["y"], keepdims=0)
    m = model(node, x.shape, "bool", constants={"axes": np.array([1], np.int64)}, opset=20)
    np.testing.assert_array_equal(compiled_run(m, x), [False, True])


@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_argmin_ties_and_nan(last: int, axis: int) -> None:
    x = RNG.integers(0, 3, size=(5, 6)).astype(np.float32)
    x[2, 3] = np.nan
    node = helper.make_node("ArgMin", ["x"], ["y"], axis=axis, keepdims=0, select_last_index=last)
    m = model(node, x.shape, "float32", out_dtype="int64", opset=13)
    got = compiled_run(m, x)
    if last:
        want = x.shape[axis] - 1 - np.argmin(np.flip(x, axis), axis=axis)
    else:
        want = np.argmin(x, axis=axis)
    np.testing.assert_array_equal(got, want)
