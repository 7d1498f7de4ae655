"""Default schedules of convolutions (`poly.default.conv`'s plans): register blocks, the
order of row, channel and pixel tiles, bands and channel chunks follow the registers and
the cache; the search space's default decisions build the same schedule, and each
compiled schedule matches numpy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import helper

from polytile.codegen.native import NativeKernel
from polytile.frontend import OptimizeConfig
from polytile.poly.default.conv import conv_plan
from polytile.poly.default.schedule import DefaultConfig, default_schedule, tile_band
from polytile.poly.default.steps import main_statement
from polytile.poly.dsl import kernel_from_node
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform import steps as T
from polytile.poly.transform.flatten import flatten_planes
from polytile.search.space import SearchSpace

from kernels import conv2d, float_model, random_inputs


@pytest.mark.parametrize(("pads", "lanes", "rows"), [(2, 16, 16), (0, 32, 8)])
def test_a_padded_conv_window_takes_one_register_of_channels_and_more_rows(
    pads: int, lanes: int, rows: int
) -> None:
    """A padded 5x5 window's columns (kw) go below the row block, which then holds a
    weight vector per column besides its accumulators: one 16-lane register of channels by
    16 rows (of 26), not two registers by 8, keeps them all in registers (AlexNet's
    grouped conv). Without padding the row block goes below kw and the channels stay two
    registers wide, over 8 rows. Both, compiled, match numpy."""
    w = np.random.default_rng(0).standard_normal((32, 1, 5, 5)).astype(np.float32)
    conv = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[pads] * 4),
        {"x": (1, 1, 6 - 2 * pads, 30 - 2 * pads)},
        initializers={"w": w},
    )
    config = DefaultConfig(vector_width=16, threads=2, min_parallel_work=0)
    assert config.vector_registers == 32
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    loops = schedule.loops_of(main)
    assert loops[-1].annotation == "vector"
    assert T.loop_extent(schedule, loops[-1].name) == lanes
    unrolled = [lp.name for lp in loops if lp.annotation == "unroll"]
    assert [T.loop_extent(schedule, n) for n in unrolled] == [rows]
    inputs = random_inputs(conv)
    padded = np.pad(inputs["x"][0, 0], pads)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (5, 5))
    want = np.einsum("ijkl,mkl->mij", windows, w[:, 0])[None]
    got = NativeKernel(schedule)(inputs)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("window", "height", "width", "cache_bytes", "first"),
    [
        (1, 32, 16, 4096, "oh"),
        (1, 32, 16, 1 << 20, None),
        (1, 32, 16, 12288, "oh"),
        (1, 32, 16, 16384, None),
        (1, 12, 16, 4096, None),
        (3, 32, 16, 4096, None),
        (3, 32, 32, 4096, None),
        (3, 32, 48, 4096, "oh"),
        (3, 32, 32, 10000, "oh"),
    ],
)
def test_a_strided_conv_walks_its_rows_outside_the_channel_blocks_when_its_input_outgrows_the_cache(
    window: int, height: int, width: int, cache_bytes: int, first: str | None
) -> None:
    """Each channel block of a conv plan (two of 16 lanes for the 1x1, four of 8 for the
    padded 3x3) reads the whole input (4 channels of 32 x 16, 8 KB). Larger than half
    the cache (12 KB), the output rows go outermost, so a band of input rows stays in
    cache across the blocks; not with a cache of twice it or more, nor with 6 output
    rows (too few to share among 2 threads at 4 each). A 3x3 window's weights (4.5 KB),
    read once per output row (16) instead, must either fit half the cache or move fewer
    bytes than the blocks' input: 72 KB against 32 KB (16 columns) and 64 KB (32) stay,
    against 96 KB (48) the rows go first, and so with 32 columns in a 10,000 byte cache.
    The search space's default decisions build the same schedule; the reordered one,
    compiled, matches numpy. (The 1x1 conv is lowered as it is: compile samples its
    input first, see `sample_strided_1x1_convs`.)"""
    w = np.random.default_rng(0).standard_normal((32, 4, window, window)).astype(np.float32)
    conv = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[window // 2] * 4),
        {"x": (1, 4, height, width)},
        initializers={"w": w},
        passes=OptimizeConfig(disabled=frozenset({"sample_strided_1x1_convs"})),
    )
    config = DefaultConfig(vector_width=8, threads=2, min_parallel_work=0, cache_bytes=cache_bytes)
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    outermost = schedule.loops_of(main)[0]
    assert outermost.annotation == "parallel"
    assert (outermost.name == "oh") == (first == "oh")
    space = SearchSpace(conv, config=config)
    assert space.plan is not None and space.default_decisions()["outer_first"] == first
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    if first is not None:  # the others keep the plan's order, tested elsewhere
        inputs = random_inputs(conv)
        pad = window // 2
        padded = np.pad(inputs["x"], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        want = conv2d(padded, w)[:, :, ::2, ::2].astype(np.float32)
        got = NativeKernel(schedule)(inputs)["y"]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def flat_1x1_conv(m: int, c: int, side: int) -> tuple[np.ndarray, Kernel]:
    """Seeded weights and the kernel of a 1×1 conv, c -> m channels over side² pixels,
    with its planes flattened as compile does."""
    w = np.random.default_rng(0).standard_normal((m, c, 1, 1)).astype(np.float32)
    conv = flatten_planes(
        kernel_from_node(
            helper.make_node("Conv", ["x", "w"], ["y"]),
            {"x": (1, c, side, side)},
            initializers={"w": w},
        )
    )
    return w, conv


def check_default_1x1(
    conv: Kernel, schedule: Schedule, config: DefaultConfig, w: np.ndarray
) -> None:
    """The space's default decisions build the default schedule, which matches numpy."""
    space = SearchSpace(conv, config=config)
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    inputs = random_inputs(conv)
    want = np.einsum("mc,ncp->nmp", w[:, :, 0, 0], inputs["x"])
    got = NativeKernel(schedule)(inputs)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("panel_bytes", "chunk"), [(4096, 64), (8192, None)])
def test_a_1x1_conv_over_few_pixels_reduces_a_chunk_of_channels_over_all_its_pixel_tiles(
    panel_bytes: int, chunk: int | None
) -> None:
    """Two channel blocks of 16 over 5 x 5 pixels (flattened as compile does: seven row
    tiles of 4, the last one partial) and 128 input channels: each block's 8 KB of
    weights is read once per row tile. With a 4 KB panel
    the channels are reduced 64 at a time with every row tile below, the block's outputs
    (1.6 KB) reloaded per chunk; with 8 KB the chunk (128) is the whole reduction, so
    nothing changes. The space's default decisions build the same schedule; compiled,
    both match numpy."""
    w, conv = flat_1x1_conv(32, 128, 5)
    config = DefaultConfig(vector_width=8, threads=2, min_parallel_work=0, panel_bytes=panel_bytes)
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    loops = [(lp.name, T.loop_extent(schedule, lp.name)) for lp in schedule.loops_of(main)]
    if chunk is None:
        assert [n for n, _ in loops][1:] == ["oh_ow0", "c", "oh_ow1", "m1"]
    else:
        assert [(n, e) for n, e in loops][1:] == [
            ("c0", 2),
            ("oh_ow0", 7),
            ("c1", chunk),
            ("oh_ow1", 4),
            ("m1", 16),
        ]
    assert SearchSpace(conv, config=config).default_decisions()["rtile"] == (chunk or 0)
    check_default_1x1(conv, schedule, config, w)


@pytest.mark.parametrize(("stream_weights", "first"), [(True, True), (False, False)])
def test_a_1x1_conv_whose_weights_stay_cached_walks_its_pixel_tiles_outermost(
    stream_weights: bool, first: bool
) -> None:
    """64 -> 16 channels over 32 x 32 pixels (flattened, as compile does): the input
    (256 KB) is twice a 128 KB L2 and the weights (4 KB) fit a quarter of it. Re-read per
    pixel tile the weights move 64 x 4 KB, the input re-read per channel block 2 x 256
    KB: the pixel tiles go outermost (and parallel), without the cache tiles a long
    reduction takes otherwise. With `stream_weights` off the channel blocks stay
    outside. The space's default decisions build the same schedule; compiled, it
    matches numpy."""
    w, conv = flat_1x1_conv(16, 64, 32)
    config = DefaultConfig(
        vector_width=8,
        threads=2,
        min_parallel_work=0,
        cache_bytes=128 << 10,
        cache_reduction=16,
        stream_weights=stream_weights,
    )
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    names = [lp.name for lp in schedule.loops_of(main)]
    assert schedule.loops_of(main)[0].annotation == "parallel"
    assert names[0].startswith("oh_ow") is first
    assert any(n.startswith("c0") for n in names) is not first  # the cache tiles
    check_default_1x1(conv, schedule, config, w)


@pytest.mark.parametrize(
    ("band_tiles", "cache_kb", "band"), [(8, 128, 8), (0, 128, 0), (8, 512, 0)]
)
def test_pixel_tiles_walked_first_go_in_bands_where_the_output_outgrows_l2(
    band_tiles: int, cache_kb: int, band: int
) -> None:
    """64 -> 64 channels over 32 x 32 pixels (flattened): the pixel tiles go first (the
    weights, 16 KB, fit a quarter of a 128 KB L2; the input, 256 KB, outgrows an
    eighth), and the output (256 KB) outgrows L2: the 64 tiles go in bands of 8, four
    bands a thread, each channel block writing a band before the next block. With
    `band_tiles` 0, or an L2 (512 KB) that holds the output, no bands. The space's default
    decisions build the same schedule; compiled, it matches numpy."""
    w, conv = flat_1x1_conv(64, 64, 32)
    config = DefaultConfig(
        vector_width=8,
        threads=2,
        min_parallel_work=0,
        cache_bytes=cache_kb << 10,
        band_tiles=band_tiles,
    )
    schedule = default_schedule(conv, config)
    main = main_statement(schedule.kernel).name  # not the input's packing copy
    loops = [(lp.name, T.loop_extent(schedule, lp.name)) for lp in schedule.loops_of(main)]
    assert schedule.loops_of(main)[0].annotation == "parallel"
    loops = [(n, e) for n, e in loops if e > 1]  # the batch's loop runs once
    if band:
        assert [n for n, _ in loops[:3]] == ["oh_ow00", "m0", "oh_ow01"]
        assert loops[0][1] == 64 // band and loops[2][1] == band
    else:
        assert loops[0] == ("oh_ow0", 64) and loops[1][0] == "m0"
    assert SearchSpace(conv, config=config).default_decisions()["band"] == band
    check_default_1x1(conv, schedule, config, w)


def test_a_band_splits_the_tiles_evenly_among_the_threads() -> None:
    """ResNet-50's 64 -> 256 conv at 56x56 (3136 pixels: 66 tiles of 48, a 3.2 MB
    output): bands of 11 tiles, three a thread, where bands of 8 would leave one thread
    five and the other four. Where the output fits L2, or the tiles are too few for a band
    a thread, none."""
    _, conv = flat_1x1_conv(256, 64, 56)
    main = max(conv.statements, key=lambda st: len(st.dims))
    config = DefaultConfig(vector_width=16, threads=2, cache_bytes=2 << 20)
    assert tile_band(conv, main, 66, config) == 11
    assert tile_band(conv, main, 64, config) == 8
    assert tile_band(conv, main, 3, config) == 0
    assert tile_band(conv, main, 66, replace(config, cache_bytes=4 << 20)) == 0


@pytest.mark.parametrize(
    ("lanes", "wide_rows", "vector"), [(16, True, 48), (16, False, 32), (8, True, 16)]
)
def test_a_matrix_product_row_holds_three_vectors_where_the_registers_leave_room(
    lanes: int, wide_rows: bool, vector: int
) -> None:
    """64 -> 32 channels over 14 x 14 pixels (flattened: 196, four tiles of 48 and a
    partial one): with AVX-512's 32 registers a block of 8 rows holds three vectors a
    row (24 accumulators, beside three operand vectors and a broadcast), two with
    `wide_rows` off; with AVX2's 16 registers (6 rows) two. The space's default
    decisions build the same schedule; compiled, it matches numpy."""
    w, conv = flat_1x1_conv(32, 64, 14)
    config = DefaultConfig(vector_width=lanes, threads=2, min_parallel_work=0, wide_rows=wide_rows)
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    loops = [(lp.name, T.loop_extent(schedule, lp.name)) for lp in schedule.loops_of(main)]
    assert loops[-1] == ("oh_ow1", vector)
    assert schedule.loops_of(main)[-1].annotation == "vector"
    assert loops[-2] == ("m1", 2 * config.rows)
    assert SearchSpace(conv, config=config).default_decisions()["vec"] == vector
    check_default_1x1(conv, schedule, config, w)


@pytest.mark.parametrize(
    ("channels", "stream_reduction", "block", "tile"),
    [(64, 64, 6, 32), (64, 0, 4, 0), (32, 64, 4, 0)],
)
def test_a_1x1_conv_with_a_long_reduction_fills_the_registers_and_tiles_its_channels(
    channels: int, stream_reduction: int, block: int, tile: int
) -> None:
    """A 1×1 conv over 7 x 7 pixels (flattened: 49, too few to stream in vectors of 8)
    takes channel vectors. Reducing over `stream_reduction` channels or more, its block
    holds two registers of channels by `(registers - 4) / 2` pixels (6 with AVX2's 16
    registers: 12 accumulators) instead of 4, and its channels go in tiles of
    `cache_reduction`; below it (or with it off: 0) the plan is as before. The space's
    default decisions build the same schedule; compiled, it matches numpy."""
    w, conv = flat_1x1_conv(32, channels, 7)
    config = DefaultConfig(
        vector_width=8,
        threads=2,
        min_parallel_work=0,
        cache_reduction=32,
        stream_reduction=stream_reduction,
        panel_bytes=1024,  # no `panel_chunk`
    )
    plan = conv_plan(conv, config)
    assert plan is not None and plan.streams
    assert (plan.lanes, plan.block, plan.tile) == (16, block, tile)
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    loops = [(lp.name, T.loop_extent(schedule, lp.name)) for lp in schedule.loops_of(main)]
    if tile:
        assert [e for n, e in loops if n.startswith("c")] == [channels // tile, tile]
    else:
        assert [n for n, _ in loops if n.startswith("c")] == ["c"]
    assert dict(loops)["oh_ow1"] == plan.block
    check_default_1x1(conv, schedule, config, w)


@pytest.mark.parametrize(
    ("pad", "width", "block"),
    [
        (0, 26, 4),  # 24 columns: 4 rows, not 6 (which divides them)
        (0, 17, 4),  # 15 columns: 4 rows and a partial block, not 5 (which divides them)
        (0, 10, 8),  # 8 columns: the whole row
        (1, 24, 8),  # a padded window keeps its 8 rows
    ],
)
def test_a_conv_blocks_its_rows_in_parts_or_multiples_of_a_vector(
    pad: int, width: int, block: int
) -> None:
    """The init and the epilogue in a register block's tile run in vectors along the row,
    cut at multiples of the vector width over the whole row: a block of 3, 5 or 6 rows
    splits them into guarded pieces in every tile, so the block takes 4 rows (half a
    vector of 8) or 8. The space's default decisions build the same schedule; compiled,
    it matches numpy."""
    w = np.random.default_rng(0).standard_normal((16, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[pad] * 4),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    conv = kernel_from_node(float_model(nodes, {"x": (1, 3, 6, width)}, {"w": w}))
    config = DefaultConfig(vector_width=8, threads=2, min_parallel_work=0)
    plan = conv_plan(conv, config)
    assert plan is not None and plan.block == block
    schedule = default_schedule(conv, config)
    space = SearchSpace(conv, config=config)
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    inputs = random_inputs(conv)
    padded = np.pad(inputs["x"], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    want = np.maximum(conv2d(padded, w), 0).astype(np.float32)
    got = NativeKernel(schedule)(inputs)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_grouped_1x1_conv_blocks_its_channels_within_a_group() -> None:
    """Each of 4 groups of 16 output channels reads its own 16 input channels
    (`16*floor(m/16) + c`), so the channels a register block holds must share a group: 4
    rows (the most, up to 6, that divide 16), not none. The space's default decisions
    build the same schedule; compiled, it matches numpy."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16, 1, 1)).astype(np.float32)
    conv = flatten_planes(
        kernel_from_node(
            helper.make_node("Conv", ["x", "w"], ["y"], group=4),
            {"x": (1, 64, 8, 8)},
            initializers={"w": w},
        )
    )
    config = DefaultConfig(vector_width=8, threads=2, min_parallel_work=0)
    schedule = default_schedule(conv, config)
    main = max(schedule.kernel.statements, key=lambda st: len(st.dims)).name
    unrolled = [lp for lp in schedule.loops_of(main) if lp.annotation == "unroll"]
    assert [(lp.name[0], T.loop_extent(schedule, lp.name)) for lp in unrolled] == [("m", 4)]
    space = SearchSpace(conv, config=config)
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    inputs = random_inputs(conv)
    x = inputs["x"].reshape(4, 16, 64)
    want = np.einsum("gmc,gcp->gmp", w[:, :, 0, 0].reshape(4, 16, 16), x).reshape(1, 64, 64)
    got = NativeKernel(schedule)(inputs)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
