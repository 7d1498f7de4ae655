"""Flattening whole planes (`poly.flatten`): which kernels flatten, and that a flattened
kernel computes what the original does, in program order, under the interpreter and
natively under its default schedule (whose plan the flattening changes)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from polytile.codegen.native import NativeKernel
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.kernel import Kernel
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform.flatten import flatten_planes

from kernels import float_model

RNG = np.random.default_rng(0)
CONFIG = DefaultConfig(vector_width=16)


def conv1x1_add_relu(size: int, channels: int = 32) -> tuple[Kernel, dict, np.ndarray]:
    """Y = relu(conv1x1(X) + B + R): a ResNet bottleneck's last conv with its shortcut."""
    x = RNG.standard_normal((1, 16, size, size)).astype(np.float32)
    r = RNG.standard_normal((1, channels, size, size)).astype(np.float32)
    w = RNG.standard_normal((channels, 16, 1, 1)).astype(np.float32)
    b = RNG.standard_normal(channels).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    k = kernel_from_node(float_model(nodes, {"x": x.shape, "r": r.shape}, {"w": w, "b": b}))
    conv = np.einsum("nchw,mc->nmhw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    want = np.maximum(conv + b[None, :, None, None] + r, 0)
    return k, {"x": x, "r": r}, want


def by_source(k: Kernel, inputs: dict) -> dict:
    """The inputs (by ONNX name, or by name in a DSL kernel) keyed by the kernel's tensor
    names, reshaped to the kernel's shapes."""
    return {t.name: inputs[t.source or t.name].reshape(t.shape) for t in k.inputs()}


def check(original: Kernel, flat: Kernel, inputs: dict, want: np.ndarray) -> None:
    """The flattened kernel against numpy and the original, in every executor; shape and
    dtype before values."""
    (out,) = original.outputs()
    (flat_out,) = flat.outputs()
    schedule = default_schedule(flat, CONFIG)
    runs = {
        "original": run_program_order(original, by_source(original, inputs))[out.name],
        "program order": run_program_order(flat, by_source(flat, inputs))[flat_out.name],
        "interpreter": run_schedule(schedule, by_source(flat, inputs), order="shuffle")[
            flat_out.name
        ],
        "native": NativeKernel(schedule)(by_source(flat, inputs))[flat_out.name],
    }
    for name, got in runs.items():
        assert got.dtype == np.float32, name
        assert got.size == want.size, name
        np.testing.assert_allclose(
            got.reshape(want.shape), want, rtol=1e-4, atol=1e-4, err_msg=name
        )


def test_a_1x1_conv_with_its_epilogue_becomes_a_matrix_product() -> None:
    k, inputs, want = conv1x1_add_relu(8)
    flat = flatten_planes(k)
    assert {t.name: len(t.shape) for t in flat.inputs()} == {t.name: 3 for t in k.inputs()}
    assert [t.shape for t in flat.outputs()] == [(1, 32, 64)]
    (conv,) = [s for s in flat.statements if s.reduction]
    assert conv.dims == ("n", "m", "oh_ow", "c")  # no unit tap loops, one plane loop
    assert all(len(s.dims) == 3 for s in flat.statements if not s.reduction)
    check(k, flat, inputs, want)


def test_a_long_contiguous_row_takes_the_matrix_product_plan() -> None:
    """An 8×8 image flattens into whole vectors of the test's width: vectors run along
    the plane. A 7×7 image wastes too many lanes in its partial last vector: it keeps
    vectors across the channels."""
    for size, vector_dim in ((8, "oh_ow"), (7, "m")):
        k, inputs, want = conv1x1_add_relu(size)
        flat = flatten_planes(k)
        schedule = default_schedule(flat, CONFIG)
        (conv,) = [s for s in flat.statements if s.reduction]
        loops = schedule.loops_of(conv.name)
        (vector,) = [lp for lp in loops if lp.annotation == "vector"]
        assert vector.name.startswith(vector_dim), (size, [lp.name for lp in loops])
        check(k, flat, inputs, want)


def test_a_padded_3x3_conv_is_left_alone() -> None:
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    k = kernel_from_node(float_model(nodes, {"x": x.shape}, {"w": w}))
    assert flatten_planes(k) is k


def test_a_global_pool_reduces_along_one_axis() -> None:
    """The input flattens; the [n, c, 1, 1] output, indexed by constants, does not."""
    x = RNG.standard_normal((2, 5, 6, 7)).astype(np.float32)
    k = kernel_from_node(
        float_model([helper.make_node("GlobalAveragePool", ["x"], ["y"])], {"x": x.shape}, {})
    )
    flat = flatten_planes(k)
    assert [t.shape for t in flat.inputs()] == [(2, 5, 42)]
    assert [t.shape for t in flat.outputs()] == [(2, 5, 1, 1)]
    check(k, flat, {"x": x}, x.mean(axis=(2, 3), keepdims=True))


def test_a_constant_plane_is_reshaped_with_its_values() -> None:
    x = RNG.standard_normal((1, 3, 4, 5)).astype(np.float32)
    c = RNG.standard_normal((1, 3, 4, 5)).astype(np.float32)
    k = kernel_from_node(
        float_model([helper.make_node("Mul", ["x", "c"], ["y"])], {"x": x.shape}, {"c": c})
    )
    flat = flatten_planes(k)
    (constant,) = [t for t in flat.tensors.values() if t.value is not None]
    assert constant.shape == (1, 3, 20)
    np.testing.assert_array_equal(constant.value, c.reshape(1, 3, 20))
    check(k, flat, {"x": x}, x * c)


@pytest.mark.parametrize(
    "statement",
    [
        "Y[i, j, k] = X[i, k, j]",  # a transposed plane
        "Y[i, j, k] = X[i, j, k] + X[i, j, 0]",  # a plane read elsewhere than its point
        "Y[i, j, k] = X[i, j, k] * j",  # the dim's value is used
    ],
)
def test_planes_read_otherwise_stay(statement: str) -> None:
    k = kernel(statement, X=(2, 4, 4), extents={"i": 2, "j": 4, "k": 4})
    assert flatten_planes(k) is k


def test_a_triangular_domain_stays() -> None:
    """A plane walked only in part (its domain ties the two dims) cannot be one loop."""
    k = kernel("Y[i, j, k] = X[i, j, k] if k <= j", X=(2, 4, 4), extents={"i": 2, "j": 4, "k": 4})
    assert flatten_planes(k) is k


def test_an_elementwise_kernel_is_parallel_and_vectorized_by_default() -> None:
    """A long row that vectors do not divide gets vectors and a partial last one; a tiny
    kernel stays on one thread (waking the others costs more)."""
    big = kernel("Y[i, j] = max(X[i, j] * 2 + 1, 0)", X=(64, 3025))
    loops = default_schedule(big, CONFIG).loops_of("Y")
    assert [lp.annotation for lp in loops] == ["parallel", "", "vector"]
    x = RNG.standard_normal((64, 3025)).astype(np.float32)
    got = NativeKernel(default_schedule(big, CONFIG))({"X": x})["Y"]
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, np.maximum(x * 2 + 1, 0), rtol=1e-6)
    tiny = kernel("Y[i, j] = max(X[i, j] * 2 + 1, 0)", X=(2, 40))
    assert [lp.annotation for lp in default_schedule(tiny, CONFIG).loops_of("Y")] == ["", "vector"]


def test_a_strided_1x1_conv_is_a_matrix_product_over_its_sampled_plane() -> None:
    """The frontend samples a strided 1×1 conv's input (a Slice prologue). The prologue
    cannot merge its dims, since it reads every other row and column of X, but it writes
    the sampled plane row-major, so the conv still walks its output pixels in one loop."""
    x = RNG.standard_normal((1, 16, 10, 7)).astype(np.float32)
    w = RNG.standard_normal((24, 16, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])]
    k = kernel_from_node(float_model(nodes, {"x": x.shape}, {"w": w}))
    flat = flatten_planes(k)
    sample, init, conv = flat.statements
    assert conv.reduction and conv.dims == ("n", "m", "oh_ow", "c") and init.init_of == conv.name
    assert flat.tensors[sample.tensor].shape == (1, 16, 20)  # 5 × 4 sampled pixels
    assert len(sample.dims) == 4 and sample.index[-1] == f"4*{sample.dims[2]} + {sample.dims[3]}"
    assert [t.shape for t in flat.inputs()] == [x.shape]  # what the prologue reads stays
    want = np.einsum("chw,mc->mhw", x[0, :, ::2, ::2], w[:, :, 0, 0])[None]
    check(k, flat, {"x": x}, want)


def test_a_prologue_that_cannot_merge_keeps_what_it_reads() -> None:
    """T = 2X merges on its own, but U (T transposed) cannot: U goes row-major for the
    product that reads it, and T and X keep their planes."""
    w = RNG.standard_normal((6, 3)).astype(np.float32)
    k = kernel(
        "T[i, c, h, v] = X[i, c, h, v] * 2",
        "U[i, c, v, h] = T[i, c, h, v]",
        "Y[i, m, v, h] += U[i, c, v, h] * W[m, c]",
        X=(1, 3, 4, 5),
        W=w,
    )
    flat = flatten_planes(k)
    shapes = {t.source or t.name: t.shape for t in flat.tensors.values()}
    assert shapes["X"] == (1, 3, 4, 5) and shapes["T"] == (1, 3, 4, 5)
    assert shapes["U"] == (1, 3, 20) and shapes["Y"] == (1, 6, 20)
    x = RNG.standard_normal((1, 3, 4, 5)).astype(np.float32)
    want = np.einsum("chv,mc->mvh", 2 * x[0], w)[None]
    check(k, flat, {"X": x}, want)


def test_a_channels_last_matmul_walks_its_pixels_as_one_row_loop() -> None:
    """[1, h, w, c] x [c, m] (a ConvNeXt block's MLP): `first=1` merges h and w, before the
    channels, into one axis of h*w rows; the weights and the bias stay as they are."""
    x = RNG.standard_normal((1, 3, 5, 16)).astype(np.float32)
    w = RNG.standard_normal((16, 8)).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["t"]),
        helper.make_node("Add", ["t", "b"], ["y"]),
    ]
    k = kernel_from_node(float_model(nodes, {"x": x.shape}, {"w": w, "b": b}))
    assert flatten_planes(k) is k  # the trailing pair is (w, c) for x but (w, m) for y
    flat = flatten_planes(k, first=1)
    assert [t.shape for t in flat.inputs()] == [(1, 15, 16)]
    assert [t.shape for t in flat.outputs()] == [(1, 15, 8)]
    assert sorted(t.shape for t in flat.tensors.values() if t.value is not None) == [(8,), (16, 8)]
    check(k, flat, {"x": x}, x.astype(np.float64) @ w + b)


def test_a_channels_last_layer_norm_merges_its_pixels() -> None:
    x = RNG.standard_normal((1, 3, 4, 8)).astype(np.float32)
    scale = RNG.standard_normal(8).astype(np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1)]
    k = kernel_from_node(float_model(nodes, {"x": x.shape}, {"s": scale}))
    flat = flatten_planes(k, first=1)
    assert [t.shape for t in flat.inputs()] == [(1, 12, 8)]
    d = x.astype(np.float64) - x.mean(-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * scale
    check(k, flat, {"x": x}, want)


def test_planes_whose_dims_a_statement_orders_otherwise_merge_exactly() -> None:
    """MeanVarianceNormalization over the channels: its reductions walk (n, h, w, c) while
    X is indexed [n, c, h, w], so the merged dim's place in the statement differs from its
    place in the tensor's index (a mix-up of the two gave X[n, h_w, w])."""
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[1])
    k = kernel_from_node(float_model([node], {"x": x.shape}, {}))
    flat = flatten_planes(k)
    assert [t.shape for t in flat.inputs()] == [(2, 3, 20)]
    d = x.astype(np.float64) - x.mean(axis=1, keepdims=True)
    check(k, flat, {"x": x}, d / (np.sqrt((d * d).mean(axis=1, keepdims=True)) + 1e-9))
