"""Winograd F(2x2, 3x3) convolutions (`poly.lower.winograd`), the folding of their fused
epilogue into the output pieces (`poly.fold`) and their default schedule (the gathered
loop inside the channel tiles): against onnxruntime on the original model, numpy, the
untransformed schedule and the direct conv."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import polytile as pt
from polytile.codegen.configs import lower_config
from polytile.codegen.native import NativeKernel
from polytile.codegen.target import Target
from polytile.frontend import import_model, optimize, partition
from polytile.poly.default.schedule import (
    DefaultConfig,
    default_schedule,
    gathered_loops,
    main_statement,
)
from polytile.poly.dsl import kernel
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.lower import LowerConfig, lower
from polytile.poly.lower import winograd as W
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T
from polytile.poly.transform.flatten import kernel_of
from polytile.poly.transform.fold import fold_into_writers
from polytile.search.space import SearchSpace
from polytile.search.tasks import extract_tasks

from kernels import random_inputs
from lowered import feeds_for, make

RNG = np.random.default_rng(0)
CONFIG = DefaultConfig(vector_width=8, threads=2, min_parallel_work=0)
#: Winograd from 8 channels: `compile`'s default (`lower_config`) needs 32 vectors of them
WINOGRAD = LowerConfig(winograd_channels=8)


def conv_model(
    x: tuple[int, ...],
    m: int,
    *,
    bias: bool = True,
    residual: bool = False,
    relu: bool = True,
    **attrs: object,
) -> onnx.ModelProto:
    """Conv (3x3 weights, seeded) [+ bias] [+ x-shaped residual input r] [+ Relu]."""
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    w = (RNG.standard_normal((m, x[1] // group, 3, 3)) * 0.3).astype(np.float32)
    init = {"w": w}
    inputs = ["x", "w"]
    if bias:
        init["b"] = RNG.standard_normal(m).astype(np.float32)
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c"], **attrs)]
    last = "c"
    feeds = {"x": (x, "float32")}
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        feeds["r"] = ((x[0], m, x[2], x[3]), "float32")
        last = "a"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["y"]))
        last = "y"
    nodes.append(helper.make_node("Identity", [last], ["out"]))
    return make(nodes, feeds, ["out"], init)


def kernels_of(m: onnx.ModelProto, config: LowerConfig = WINOGRAD) -> list[Kernel]:
    graph = optimize(import_model(m))
    return [kernel_of(graph, group, config) for group in partition(graph).groups]


def is_winograd(k: Kernel) -> bool:
    """Whether the kernel multiplies transformed weights: a constant [16, M, C]."""
    return any(
        t.role is Role.CONSTANT and len(t.shape) == 3 and t.shape[0] == 16
        for t in k.tensors.values()
    )


def inputs_of(m: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    shapes = {
        i.name: (tuple(d.dim_value for d in i.type.tensor_type.shape.dim), "float32")
        for i in m.graph.input
    }
    return feeds_for(shapes, seed)


def onnxruntime(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), options).run(None, feeds)[0]


CASES = {
    "padded, bias, relu": (conv_model((1, 16, 28, 28), 8, pads=[1, 1, 1, 1]), 8 * 28 * 28),
    "odd output, two images, no bias": (
        conv_model((2, 16, 29, 32), 8, bias=False, relu=False, pads=[1, 0, 1, 1]),
        2 * 8 * 29 * 31,
    ),
    "residual add and relu": (
        conv_model((1, 16, 28, 30), 8, residual=True, pads=[1, 1, 1, 1]),
        8 * 28 * 30,
    ),
    "unpadded": (conv_model((1, 16, 30, 30), 16, auto_pad="VALID"), 16 * 28 * 28),
}


@pytest.mark.parametrize("case", CASES)
def test_a_large_stride_1_3x3_conv_is_winograd_and_matches_onnxruntime(case: str) -> None:
    """Lowered as Winograd (16 transformed weights per channel pair), folded (the pieces
    store the model's output, every epilogue statement gone), it matches onnxruntime
    under its untransformed schedule and compiled; so does the direct lowering. (In
    program order, the reference executor takes a minute per case.)"""
    m, size = CASES[case]
    (k,) = kernels_of(m)
    assert is_winograd(k)
    (out,) = k.outputs()
    assert int(np.prod(out.shape)) == size
    pieces = [s for s in k.statements if s.tensor == out.name]
    assert len(pieces) == 4 and all("2*ty" in s.index[2] for s in pieces)
    assert not [t for t in k.tensors.values() if t.role is Role.TEMP and t.shape == out.shape]
    (direct,) = kernels_of(m, LowerConfig(winograd=False))
    assert not is_winograd(direct)
    feeds = inputs_of(m)
    want = onnxruntime(m, feeds)
    for name, kern in (("winograd", k), ("direct", direct)):
        inputs = {t.name: feeds[t.source].reshape(t.shape) for t in kern.inputs()}
        got = NativeKernel(initial_schedule(kern))(inputs)[kern.outputs()[0].name]
        assert got.dtype == want.dtype and got.size == want.size, name
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    compiled = pt.compile(m, num_threads=2, lowering=WINOGRAD).run(feeds)[0]
    assert compiled.shape == want.shape and compiled.dtype == want.dtype
    np.testing.assert_allclose(compiled, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 0, 0, 0], [2, 1, 0, 2]])
def test_a_stride_1_conv_transpose_is_the_winograd_conv_of_its_flipped_filters(
    pads: list[int],
) -> None:
    """ConvTranspose's weights are [C, M, 3, 3] and its pads crop the full output: as a
    Winograd conv its filters are transposed and flipped and its pads become 2 - p. It
    matches onnxruntime (the filters read as a conv's were off by up to 66)."""
    w = (RNG.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["out"], pads=pads)
    m = make([node], {"x": ((1, 16, 28, 29), "float32")}, ["out"], {"w": w, "b": b})
    (k,) = kernels_of(m)
    assert is_winograd(k)
    feeds = inputs_of(m)
    want = onnxruntime(m, feeds)
    got = pt.compile(m, num_threads=2, lowering=WINOGRAD).run(feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_conv_transpose_with_output_padding_stays_direct() -> None:
    """An output_shape past the natural 30x30 extends the output (output padding): no
    conv of the flipped filters computes those extra pixels (zeros, without a bias: the
    reference is numpy's scatter form; onnxruntime refuses the attribute)."""
    w = (RNG.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["out"], output_shape=[31, 31])
    m = make([node], {"x": ((1, 16, 28, 28), "float32")}, ["out"], {"w": w})
    (k,) = kernels_of(m)
    assert not is_winograd(k)
    x = inputs_of(m)["x"]
    want = np.zeros((1, 16, 31, 31), np.float64)
    for a in range(3):
        for b in range(3):
            want[0, :, a : a + 28, b : b + 28] += np.einsum("chw,cm->mhw", x[0], w[:, :, a, b])
    got = pt.compile(m, num_threads=2, lowering=WINOGRAD).run({"x": x})[0]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "x, attrs",
    [
        ((1, 16, 60, 60), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((1, 32, 30, 30), {"group": 2, "pads": [1, 1, 1, 1]}),
        ((1, 16, 30, 30), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
        ((1, 16, 26, 26), {"pads": [1, 1, 1, 1]}),  # 676 pixels, fewer than MIN_PIXELS
        ((1, 4, 28, 28), {"pads": [1, 1, 1, 1]}),  # 4 input channels, fewer than 8
    ],
)
def test_other_convs_stay_direct(x: tuple[int, ...], attrs: dict) -> None:
    """Each case differs from a Winograd conv (the first test's) in one respect."""
    (k,) = kernels_of(conv_model(x, 8, **attrs))
    assert not is_winograd(k)


def test_the_transformed_weights_compute_the_filter() -> None:
    """U = G g Gᵀ, multiplied back with the input transform of a 4x4 block d and the
    output transform, gives the block's 2x2 valid correlation."""
    g = RNG.standard_normal((1, 1, 3, 3))
    d = RNG.standard_normal((4, 4))
    u = W.weights(g.astype(np.float32)).reshape(4, 4).astype(np.float64)
    v = W.B_T @ d @ W.B_T.T
    y = W.A_T @ (u * v) @ W.A_T.T
    want = np.array(
        [[np.sum(d[i : i + 3, j : j + 3] * g[0, 0]) for j in range(2)] for i in range(2)]
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_its_default_schedule_walks_the_points_inside_the_channel_tiles() -> None:
    """The output pieces read all 16 points `e` of the product: `e` is the gathered loop,
    placed right inside the channel tiles, and the pieces run in its last iteration
    (without it the points would wait in memory for the whole image, and the AST of
    pieces placed across `e` blows isl's budget). The space's defaults build the same
    schedule; native code matches the untransformed schedule and the direct conv."""
    m = conv_model((1, 16, 28, 28), 32, residual=True, pads=[1, 1, 1, 1])
    (k,) = kernels_of(m)
    main = main_statement(k)
    loops = [lp.name for lp in initial_schedule(k).loops_of(main.name)]
    dim_of = dict(zip(loops, main.dims, strict=True))
    spatial = [n for n in loops if dim_of[n] not in main.reduction_dims]
    assert [dim_of[n] for n in gathered_loops(k, main, spatial, dim_of)] == ["e"]
    schedule = default_schedule(k, CONFIG)
    first, second, *_ = schedule.loops_of(main.name)
    assert first.name.startswith("m") and first.annotation == "parallel"
    assert T.loop_extent(schedule, first.name) == 32 // 16
    assert second.name == "e"
    (out,) = k.outputs()
    for piece in [s.name for s in k.statements if s.tensor == out.name]:
        assert [lp.name for lp in schedule.loops_of(piece)][:2] == [first.name, "e"]
    space = SearchSpace(k, config=CONFIG)
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    inputs = random_inputs(k)
    want = NativeKernel(initial_schedule(k))(inputs)[out.name]
    got = NativeKernel(schedule)(inputs)[out.name]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (direct,) = kernels_of(m, LowerConfig(winograd=False))
    by_source = {t.source: inputs[t.name] for t in k.inputs()}
    ref = NativeKernel(default_schedule(direct, CONFIG))(
        {t.name: by_source[t.source].reshape(t.shape) for t in direct.inputs()}
    )[direct.outputs()[0].name]
    np.testing.assert_allclose(got, ref.reshape(got.shape), rtol=1e-4, atol=1e-4)


def test_points_outgrowing_the_cache_are_walked_inside_the_image_rows() -> None:
    """Where one channel tile's 16 points outgrow the cache (a 64-channel conv at 224x224
    holds 12.8 MB of them), the gathered loop goes below the image's rows, just outside the row
    tiles, so each band of rows is gathered while it is in cache; the output still
    matches the untransformed schedule."""
    m = conv_model((1, 16, 28, 28), 32, residual=True, pads=[1, 1, 1, 1])
    (k,) = kernels_of(m)
    main = main_statement(k)
    roomy = [lp.name for lp in default_schedule(k, CONFIG).loops_of(main.name)]
    assert roomy.index("e") == 1  # right inside the channel tiles
    schedule = default_schedule(k, replace(CONFIG, cache_bytes=4096))
    loops = [lp.name for lp in schedule.loops_of(main.name)]
    e = loops.index("e")
    assert loops[e - 1].startswith("m0") and "ty" in loops[e - 1]  # rows fused in parallel
    assert loops[e + 1].startswith("tx")  # the row tiles
    inputs = random_inputs(k)
    (out,) = k.outputs()
    want = NativeKernel(initial_schedule(k))(inputs)[out.name]
    got = NativeKernel(schedule)(inputs)[out.name]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_sampled_and_mutated_winograd_candidates_match_the_untransformed_schedule() -> None:
    """The search's candidates for a Winograd conv (its gathered loop placed as the
    default does, the rest sampled and mutated) compute what the untransformed schedule
    does, natively; the space proposes more than one program."""
    (k,) = kernels_of(conv_model((1, 16, 28, 28), 16, residual=True, pads=[1, 1, 1, 1]))
    space = SearchSpace(k, config=CONFIG)
    rng = random.Random(0)
    inputs = random_inputs(k)
    (out,) = k.outputs()
    want = NativeKernel(initial_schedule(k))(inputs)[out.name]
    decisions = space.sample(rng)
    traces = set()
    for _ in range(6):
        candidate = space.build(decisions)
        got = NativeKernel(candidate.schedule)(inputs)[out.name]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        traces.add(str(candidate.trace))
        decisions = space.mutate(decisions, rng)
    assert len(traces) >= 2


def test_a_direct_conv_gathers_nothing() -> None:
    (k,) = kernels_of(conv_model((1, 16, 28, 28), 8, pads=[1, 1, 1, 1]), LowerConfig(False))
    main = main_statement(k)
    loops = [lp.name for lp in initial_schedule(k).loops_of(main.name)]
    dim_of = dict(zip(loops, main.dims, strict=True))
    assert gathered_loops(k, main, loops, dim_of) == []


def test_compile_and_tune_lower_for_the_target() -> None:
    """`lower_config` asks 32 vectors of channels (512 with AVX-512, 256 with AVX2), so a
    64-channel conv that the test config lowers as Winograd stays direct under compile's
    default, and the tasks `tune` extracts are the kernels `compile` runs (records name
    them)."""
    avx512 = Target("x", "", "x86_64-unknown-linux-gnu", vector_bits=512)
    avx2 = replace(avx512, vector_bits=256)
    assert lower_config(avx512).winograd_channels == 512
    assert lower_config(avx2).winograd_channels == 256
    m = conv_model((1, 64, 28, 28), 64, pads=[1, 1, 1, 1])
    assert is_winograd(kernels_of(m)[0])
    compiled = pt.compile(m, num_threads=2)
    tasks = extract_tasks(m)
    assert not is_winograd(tasks[0].kernel)
    assert {c.workload for c in compiled.profile(repeat=1).calls} == {t.key for t in tasks}


# --- folding -------------------------------------------------------------------------------


PIECES = ("Y[2*i] = A[i]", "Y[2*i + 1] = B[i]")


def interleave(*readers: str, writers: tuple[str, ...] = PIECES) -> Kernel:
    """Y written at even and odd positions by two pieces, then read by `readers`."""
    text = " ".join((*writers, *readers))
    inputs = {n: s for n, s in (("A", (4,)), ("B", (4,)), ("R", (8,))) if f"{n}[" in text}
    return kernel(
        *writers,
        *readers,
        **inputs,
        shapes={"Y": (8,)},
        extents={"i": 4, "j": 8},
        name="interleave",
    )


def test_an_elementwise_reader_folds_into_strided_pieces() -> None:
    k = interleave("Z[j] = max(Y[j] + R[j], 0)")
    folded = fold_into_writers(k)
    assert "Y" not in folded.tensors
    assert [(s.tensor, s.index) for s in folded.statements] == [
        ("Z", ("2*i",)),
        ("Z", ("2*i + 1",)),
    ]
    assert {ld.index for s in folded.statements for ld in loads(s.expr) if ld.tensor == "R"} == {
        ("2*i",),
        ("2*i + 1",),
    }
    inputs = {
        n: RNG.standard_normal(s).astype(np.float32) for n, s in (("A", 4), ("B", 4), ("R", 8))
    }
    want = run_program_order(k, inputs)["Z"]
    got = run_program_order(folded, inputs)["Z"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "readers, writers",
    [
        (("Z[j] = Y[j] * 2", "W[j] = Y[j] + 1"), None),  # two readers
        (("Z[j] = Y[7 - j]",), None),  # not at its own index
        (("Z[j] = Y[j] * 2",), ("Y[2*i] = A[i]",)),  # half of Y is never written
        (("Z[j] = Y[j] * 2",), ("Y[j] = R[j]",)),  # inline's case: not strided
        (("S[j] = R[j] + 1", "Z[j] = Y[j] + S[j]"), None),  # S written after the pieces
    ],
)
def test_other_readers_are_not_folded(readers: tuple[str, ...], writers) -> None:
    k = interleave(*readers, **({} if writers is None else {"writers": writers}))
    assert fold_into_writers(k) is k


def test_lowering_without_folding_keeps_the_relu_apart() -> None:
    """`lower` alone keeps the Relu reading the pieces' temporary; `kernel_of` folds it."""
    m = conv_model((1, 16, 28, 28), 8, pads=[1, 1, 1, 1])
    graph = optimize(import_model(m))
    (group,) = partition(graph).groups
    raw = lower(graph, group, WINOGRAD)
    assert any(t.role is Role.TEMP and t.shape == (1, 8, 28, 28) for t in raw.tensors.values())
    assert len(fold_into_writers(raw).statements) == len(raw.statements) - 1
