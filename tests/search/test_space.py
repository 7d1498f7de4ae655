"""The search space: sampled candidates are legal, replayable traces that compute the
kernel's result (checked with the AST interpreter), for several kernel kinds."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import machine_defaults
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import HINTS, Schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T
from polytile.poly.transform.flatten import flatten_planes
from polytile.poly.transform.steps import replay
from polytile.search.cost_model import trace_features
from polytile.search.space import SearchSpace

RNG = np.random.default_rng(0)
KERNELS = {
    "mm_relu": kernel(
        "Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(6, 10), B=(10, 19)
    ),
    "conv": kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
        {"x": (1, 3, 6, 7)},
        initializers={"w": RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)},
    ),
    "softmax": kernel_from_node(helper.make_node("Softmax", ["x"], ["y"]), {"x": (3, 11)}),
    "elementwise": kernel("Y[i, j] = exp(A[i, j]) * 2", A=(5, 21)),
    "chain": kernel(
        "T[i, j] = A[j, i] - 1", "U[i, j] = exp(T[i, j])", "Y[i, j] = U[i, j] * 2", A=(9, 6)
    ),
}


def _pad_conv(channels: int, shape: tuple[int, ...]) -> object:
    """ReLU → Pad (in two pieces: interior and border) → 3×3 conv: a prologue of two
    inlinable temporaries."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Pad", ["r", "pads"], ["p"]),
        helper.make_node("Conv", ["p", "w"], ["y"]),
    ]
    constants = {
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64),
        "w": RNG.standard_normal((channels, shape[1], 3, 3)).astype(np.float32),
    }
    graph = helper.make_graph(
        nodes,
        "pad_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    return kernel_from_node(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


PAD_CONV = _pad_conv(32, (1, 4, 5, 6))
SMALL_PAD_CONV = _pad_conv(8, (1, 2, 4, 5))
KERNELS["pad_conv"] = SMALL_PAD_CONV


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_sampled_and_mutated_candidates_are_correct(name: str) -> None:
    k = KERNELS[name]
    space = SearchSpace(k, lanes=8)
    rng = random.Random(0)
    inputs = {
        t.name: RNG.standard_normal(t.shape).astype(t.dtype)
        for t in k.tensors.values()
        if t.role is Role.INPUT
    }
    want = run_program_order(k, inputs)
    decisions = space.sample(rng)
    traces = set()
    for _ in range(16):
        candidate = space.build(decisions)
        assert replay(k, candidate.trace).body == candidate.schedule.body
        got = run_schedule(candidate.schedule, inputs)
        for t in k.outputs():
            np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-5, atol=1e-5)
        traces.add(str(candidate.trace))
        decisions = space.mutate(decisions, rng)
    if name in ("mm_relu", "conv"):
        assert len(traces) >= 2  # mutations change the program


def test_sampling_is_seeded() -> None:
    space = SearchSpace(KERNELS["mm_relu"])
    a = [space.sample(random.Random(7)) for _ in range(3)]
    b = [space.sample(random.Random(7)) for _ in range(3)]
    assert a == b


CONV = kernel_from_node(
    helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    {"x": (1, 8, 6, 14)},
    initializers={"w": RNG.standard_normal((32, 8, 3, 3)).astype(np.float32)},
)
MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(64, 96), B=(96, 128))


BIG_MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(32, 512), B=(512, 512))
# B of 2 MB, read once per block of rows: its column tiles go outside the row blocks
WIDE_MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(16, 64), B=(64, 8192))


ELEMENTWISE = kernel("Y[i, j] = max(X[i, j] * 2 + 1, 0)", X=(64, 3025))


def _conv1x1_add_relu() -> Kernel:
    """A flattened 1×1 conv with a shortcut Add and a ReLU: the matrix-product plan, and
    its epilogue chain inlined into one statement."""
    w = RNG.standard_normal((32, 16, 1, 1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Add", ["c", "r"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        "conv1x1",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 8, 8)),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, (1, 32, 8, 8)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return flatten_planes(kernel_from_node(model))


# a padded pooling window: no register block along its rows, and parallel over channels
POOL = kernel_from_node(
    helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
    {"x": (1, 4, 20, 36)},
)
# pooled rows of 12: vectors of 4 of the 8 lanes
SHORT_POOL = kernel_from_node(
    helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
    {"x": (1, 4, 6, 24)},
)
# sixteen channels: the window's register block goes over them
CHANNEL_POOL = kernel_from_node(
    helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
    {"x": (1, 16, 10, 36)},
)
# eight output channels: one vector holds them all (weights packed channel-last)
ONE_VECTOR_CONV = kernel_from_node(
    helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    {"x": (1, 4, 6, 20)},
    initializers={"w": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)},
)


@pytest.mark.parametrize(
    "k",
    [
        CONV,
        MATMUL,
        BIG_MATMUL,
        WIDE_MATMUL,
        KERNELS["softmax"],
        PAD_CONV,
        ELEMENTWISE,
        _conv1x1_add_relu(),
        POOL,
        SHORT_POOL,
        CHANNEL_POOL,
        ONE_VECTOR_CONV,
    ],
    ids=[
        "conv",
        "mm",
        "cached-mm",
        "wide-mm",
        "sm",
        "pad-conv",
        "elementwise",
        "conv1x1-add",
        "pool",
        "short-pool",
        "channel-pool",
        "one-vector-conv",
    ],
)
def test_default_decisions_build_the_default_schedule(k: object) -> None:
    from polytile.poly.default.schedule import DefaultConfig, default_schedule

    space = SearchSpace(k, lanes=8, threads=2)
    built = space.build(space.default_decisions())
    assert built.trace == default_schedule(k, DefaultConfig(vector_width=8)).trace_json()
    if k is WIDE_MATMUL:
        assert space.default_decisions()["outer_first"] == "j"
        assert built.schedule.body[0].name.startswith("j0")


def test_a_pooling_window_is_blocked_over_channels_not_rows() -> None:
    space = SearchSpace(CHANNEL_POOL, lanes=8)
    d = space.default_decisions()
    # the window slides along the rows, so only the channels give independent chains
    assert space.dim_of[d["block_loop"]] == space.main.dims[1]
    assert d["block"] == space.config.rows == 3
    schedule = space.build(d).schedule
    unrolled = [lp for lp in schedule.loops_of(space.main.name) if lp.annotation == "unroll"]
    assert len(unrolled) == 1
    x = RNG.standard_normal((1, 16, 10, 36)).astype(np.float32)
    name = CHANNEL_POOL.inputs()[0].name
    got = run_schedule(schedule, {name: x})
    want = run_program_order(CHANNEL_POOL, {name: x})
    out = CHANNEL_POOL.outputs()[0].name
    assert got[out].shape == want[out].shape == (1, 16, 5, 18)
    np.testing.assert_array_equal(got[out], want[out])
    # four channels are too few for two blocks: no block
    assert SearchSpace(POOL, lanes=8).default_decisions()["block_loop"] is None


def test_a_batch_of_one_does_not_count_toward_the_parallel_depth() -> None:
    space = SearchSpace(CONV, lanes=8, threads=2)
    batch = space.spatial[0]
    assert space.extent[batch] == 1
    for depth in (1, 2):
        schedule = space.build({**space.default_decisions(), "parallel_depth": depth}).schedule
        (parallel,) = [lp for lp, _ in schedule.loops() if lp.annotation == "parallel"]
        # the batch loop fused with a loop that runs more than once (depth 1 was the
        # batch loop alone: one iteration, so no parallel loop at all)
        assert parallel.name.startswith(f"{batch}_")
        assert T.loop_extent(schedule, parallel.name) >= 2


def test_conv_hint_puts_channels_in_vectors_and_rows_in_registers() -> None:
    space = SearchSpace(CONV, lanes=8)
    assert space.plan is not None and space.dim_of[space.plan.channel] == "m"
    hinted = [space.sample(random.Random(s)) for s in range(40)]
    channel = [d for d in hinted if d["vec_loop"] == space.plan.channel]
    assert len(channel) >= 20  # the hint (70%) plus random picks
    hint = next(d for d in channel if d["block_loop"] == space.plan.row)
    d = {**hint, "low_reduce": True, "block": 7, "unroll": True, "block2_loop": None}
    schedule = space.build(d).schedule
    loops = schedule.loops_of(space.main.name)
    marks = {lp.annotation for lp in loops}
    assert "vector" in marks and loops[-1].annotation == "vector"
    # the row block (unrolled) sits above the reduction that moves along the row (kw)
    names = [lp.name for lp in loops]
    row_block = next(lp.name for lp in loops if lp.annotation == "unroll")
    assert names.index(row_block) < names.index("kw")


def test_a_streaming_1x1_conv_samples_both_orientations() -> None:
    """Its default vectorizes the pixels (they stream); channels in vectors with pixels in
    registers was ResNet-50's faster 1024→256 conv in the model and had been sampled only
    by chance (3% of samples)."""
    w = RNG.standard_normal((32, 8)).astype(np.float32)
    k = kernel("Y[m, p] += X[c, p] * W[m, c]", X=(8, 196), W=w)
    space = SearchSpace(k, lanes=16)
    assert space.plan is None and space.channels is not None
    assert space.dim_of[space.channels.channel] == "m"
    samples = [space.sample(random.Random(s)) for s in range(200)]
    channels = [d for d in samples if d["vec_loop"] == "m" and d["block_loop"] == "p"]
    pixels = [d for d in samples if d["vec_loop"] == "p"]
    assert len(channels) >= 50 and len(pixels) >= 50
    d = {**channels[0], "vec": 16, "block": 7, "rtile_loop": None, "otile_loop": None}
    schedule = space.build(d).schedule
    loops = schedule.loops_of(space.main.name)
    assert loops[-1].annotation == "vector" and loops[-1].name.startswith("m")
    x = RNG.standard_normal((8, 196)).astype(np.float32)
    got = run_schedule(schedule, {"X": x})["Y"]
    assert got.shape == (32, 196) and got.dtype == np.float32
    np.testing.assert_allclose(got, w @ x, rtol=1e-4, atol=1e-4)


def test_outer_tile_applies_to_a_blocked_loop() -> None:
    space = SearchSpace(MATMUL, lanes=8)
    d = {**space.default_decisions(), "otile_loop": "j", "otile": 4, "vec": 8}
    d.update(rtile_loop="k", rtile=32)
    trace = space.build(d).trace
    splits = [s["args"]["loop"] for s in trace if s["kind"] == "split"]
    assert "j0" in splits  # the vector loop's outer part, tiled again
    loops = [lp.name for lp in space.build(d).schedule.loops_of(space.main.name)]
    assert loops.index("k0") < loops.index("j01") < loops.index("k1")  # S R S R S


def test_outer_tile_as_long_as_its_loop_moves_the_whole_loop_below_the_reduction() -> None:
    w = RNG.standard_normal((32, 64)).astype(np.float32)
    k = kernel("Y[m, p] += X[c, p] * W[m, c]", X=(64, 21), W=w)
    space = SearchSpace(k, lanes=16)
    d = {**space.default_decisions(), "vec_loop": "m", "vec": 16, "block_loop": "p", "block": 7}
    d.update(rtile_loop="c", rtile=16, otile_loop="p", otile=4)  # p0 has 3 iterations
    schedule = space.build(d).schedule
    loops = [lp.name for lp in schedule.loops_of(space.main.name)]
    assert loops.index("c0") < loops.index("p0") < loops.index("c1")  # was a no-op
    x = RNG.standard_normal((64, 21)).astype(np.float32)
    got = run_schedule(schedule, {"X": x})["Y"]
    assert got.shape == (32, 21) and got.dtype == np.float32
    np.testing.assert_allclose(got, w @ x, rtol=1e-4, atol=1e-4)


def test_rfactor_vectorizes_a_reduction_with_little_parallelism() -> None:
    k = kernel("Y[i] += A[i, k] * 2", A=(2, 512))
    space = SearchSpace(k, lanes=8)
    assert space.choices()["rfactor"] == (0, 8, 16, 32, 64)
    assert SearchSpace(MATMUL, lanes=8).choices()["rfactor"] == (0,)  # enough outputs
    candidate = space.build({**space.default_decisions(), "rfactor": 16, "vec": 8})
    assert candidate.trace[0]["kind"] == "rfactor"
    partial = next(s for s in candidate.schedule.kernel.statements if s.name.endswith("_rf_1"))
    assert candidate.schedule.loops_of(partial.name)[-1].annotation == "vector"
    a = RNG.standard_normal((2, 512)).astype(np.float32)
    got = run_schedule(replay(k, candidate.trace), {"A": a})["Y"]
    assert got.shape == (2,) and got.dtype == np.float32
    np.testing.assert_allclose(got, (a * 2).sum(axis=1), rtol=1e-5)


def test_decisions_of_an_older_space_are_completed() -> None:
    space = SearchSpace(MATMUL, lanes=8)
    old = {"vec_loop": "j", "vec": 8, "block": 3, "retired": 1, "otile": 999}
    d = space.complete(old)
    assert set(d) == set(space.choices())
    assert (d["vec"], d["block"]) == (8, 3)  # kept
    assert d["otile"] == space.default_decisions()["otile"]  # not an option any more
    assert d["row_tile"] == 0  # not a decision then: its absence meant no row tiles
    assert space.build(d).trace  # buildable


def test_a_large_matrix_product_walks_bands_of_row_blocks_over_each_cache_tile() -> None:
    """Past `cache_tiles` (a long reduction, many vector tiles) the default splits the
    row blocks too: a band of `cache_rows` blocks sits below the reduction's cache tile,
    next to the vector tiles, and the space's default decisions (`row_tile`) build the
    same schedule; the result matches numpy."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(256, 512), B=(512, 256))
    config = DefaultConfig(vector_width=8, cache_columns=2, cache_rows=4)
    space = SearchSpace(k, config=config)
    d = space.default_decisions()
    assert d["row_tile"] == 4 and d["rtile_loop"] == "k"
    schedule = default_schedule(k, config)
    assert space.build(d).trace == schedule.trace_json()
    loops = [lp.name for lp in schedule.loops_of("Y")]
    k0 = next(n for n in loops if n.startswith("k"))
    band = loops[loops.index(k0) + 1]
    assert band.startswith("i") and T.loop_extent(schedule, band) == 4
    blocks = -(-256 // d["block"])
    assert T.loop_extent(schedule, loops[0]) == -(-blocks // 4)  # the bands
    untiled = space.build({**d, "row_tile": 0}).schedule
    assert not any(n.startswith("i") for n in untiled_after(untiled, "Y"))
    a = RNG.standard_normal((256, 512)).astype(np.float32)
    b = RNG.standard_normal((512, 256)).astype(np.float32)
    got = NativeKernel(schedule)({"A": a, "B": b})["Y"]
    assert got.shape == (256, 256) and got.dtype == np.float32
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


def test_few_row_blocks_all_walk_over_each_cache_tile() -> None:
    """Where one band holds every row block (a transformer MLP over few tokens), the row
    blocks sit below the reduction's cache tile, not outside (where each re-read all of
    B); the space's default decisions build the same schedule; it matches numpy."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(20, 512), B=(512, 256))
    # A (40 KB) outgrows a quarter of this L2: the rows are not walked under each tile
    config = DefaultConfig(vector_width=8, cache_columns=2, cache_rows=4, cache_bytes=1 << 16)
    schedule = default_schedule(k, config)
    space = SearchSpace(k, config=config)
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    loops = [lp.name for lp in schedule.loops_of("Y")]
    k0 = next(n for n in loops if n.startswith("k"))
    assert not any(n.startswith("i") for n in loops[: loops.index(k0)])
    assert any(n.startswith("i") and T.loop_extent(schedule, n) > 1 for n in loops)
    a = RNG.standard_normal((20, 512)).astype(np.float32)
    b = RNG.standard_normal((512, 256)).astype(np.float32)
    got = NativeKernel(schedule)({"A": a, "B": b})["Y"]
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


def untiled_after(schedule: Schedule, stmt: str) -> list[str]:
    """The loops between the reduction's outer part and the register block."""
    loops = [lp.name for lp in schedule.loops_of(stmt)]
    k0 = next(n for n in loops if n.startswith("k"))
    return loops[loops.index(k0) + 1 : -2]


def test_inlining_is_sampled_and_replays_from_json() -> None:
    space = SearchSpace(SMALL_PAD_CONV, lanes=8)
    keys = [k for k in space.choices() if k.startswith("inline:")]
    assert len(keys) == 2  # the ReLU and the Pad (its interior and border together)
    # default: the ReLU is inlined into the Pad's copy (one pass), the Pad materialized
    assert [k for k in keys if space.default_decisions()[k]] == ["inline:Relu_0"]
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    want = run_program_order(SMALL_PAD_CONV, {"x": x})["y"]
    rng = random.Random(1)
    seen = set()
    for _ in range(8):
        decisions = space.sample(rng)
        candidate = space.build(json.loads(json.dumps(decisions)))
        chosen = [k.removeprefix("inline:") for k in keys if decisions[k]]
        inlined = [s["args"]["stmt"] for s in candidate.trace if s["kind"] == "inline"]
        assert inlined == chosen
        assert [s["kind"] for s in candidate.trace[: len(inlined)]] == ["inline"] * len(inlined)
        replayed = replay(SMALL_PAD_CONV, json.loads(json.dumps(candidate.trace)))
        assert replayed.body == candidate.schedule.body
        assert replayed.kernel.workload_key() == candidate.schedule.kernel.workload_key()
        got = run_schedule(replayed, {"x": x})["y"]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        seen.add(tuple(chosen))
    assert len(seen) >= 3  # none, one and both among the samples
    mutated = {
        space.mutate(space.default_decisions(), random.Random(s))[keys[0]] for s in range(60)
    }
    assert mutated == {False, True}


def test_decisions_without_inlining_complete_to_materialized() -> None:
    space = SearchSpace(PAD_CONV, lanes=8)
    old = {k: v for k, v in space.default_decisions().items() if not k.startswith("inline:")}
    d = space.complete({**old, "inline:gone": True})
    assert d == space.default_decisions()
    pad = next(k for k in space.choices() if k.startswith("inline:Pad"))
    d = space.complete(json.loads(json.dumps({**old, pad: True})))
    assert d[pad] is True
    assert any(s["kind"] == "inline" for s in space.build(d).trace)


def test_prefetch_choices_default_to_the_targets_and_matter_only_in_reductions() -> None:
    """The prefetch decisions (codegen hints) of a register-tiled reduction default to
    the target's choices (`machine_defaults` of its L2), so the default decisions add no
    step; a kernel without a reduction has none; a stencil (a 3x3 conv) may fetch its
    next panel only on a target whose window does not hold the next kernel's weights."""
    small, large = DefaultConfig(vector_width=8), DefaultConfig(vector_width=8, cache_bytes=2 << 20)
    for config in (small, large):
        space = SearchSpace(PAD_CONV, config=config)
        d, machine = space.default_decisions(), machine_defaults(config.cache_bytes)
        assert {k: d[k] for k in HINTS if k in d} == {
            k: getattr(machine, k) for k in HINTS if k in d
        }
        assert ("panel_ahead" in space.choices()) is not machine.prefetch_weights
        assert all(s["kind"] != "hint" for s in space.build(d).trace)
    assert not set(HINTS) & set(SearchSpace(KERNELS["elementwise"], lanes=8).choices())


def test_a_sampled_prefetch_choice_is_a_hint_that_replays() -> None:
    """A sample whose prefetch choices differ from the target's builds one `hint` step,
    last, naming only those; the trace round-trips through JSON and replay to the same
    schedule and hints, which the cost model's features see (rows of one length);
    decisions of a record that predates the choices complete to the target's."""
    space = SearchSpace(PAD_CONV, lanes=8)
    default = space.default_decisions()
    rng = random.Random(3)
    d = next(
        d
        for d in (space.sample(rng) for _ in range(200))
        if d["input_ahead"] != default["input_ahead"] and d["rfactor"] == 0
    )
    candidate = space.build(d)
    changed = {k: d[k] for k in HINTS if k in d and d[k] != default[k]}
    assert candidate.trace[-1] == {"kind": "hint", "args": changed}
    assert sum(s["kind"] == "hint" for s in candidate.trace) == 1
    again = replay(PAD_CONV, json.loads(json.dumps(candidate.trace)))
    assert again.trace_json() == candidate.trace and again.body == candidate.schedule.body
    assert dict(again.hints) == changed
    plain = space.build(default).schedule
    rows = [trace_features(s) for s in (plain, again)]
    assert len(rows[0]) == len(rows[1])
    assert rows[0][-3] == default["input_ahead"] and rows[1][-3] == d["input_ahead"]
    old = {k: v for k, v in d.items() if k not in HINTS}
    assert {k: space.complete(old)[k] for k in changed} == {k: default[k] for k in changed}
