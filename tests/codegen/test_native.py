"""Native code against the reference: every kernel, under its initial schedule, its default
schedule (at several vector widths) and random legal traces, must give the program-order
reference's outputs (shape and dtype first, then values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.errors import IllegalSchedule
from polytile.frontend import import_model, optimize, partition
from polytile.poly.default.schedule import DefaultConfig, default_schedule, main_statement
from polytile.poly.default.steps import padded_inputs, tile_prologues
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.buffers import BUFFER_ALIGN
from polytile.poly.ir.expr import Binary
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Loop, Schedule, initial_schedule
from polytile.poly.lower import lower
from polytile.poly.transform import steps as T

from natives import avx512_ir, check, inputs_for


def node(op: str, inputs: list[str], **attrs: object) -> object:
    return helper.make_node(op, inputs, ["y"], **attrs)


RNG = np.random.default_rng(1)
W = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
KERNELS: dict[str, Kernel] = {
    "mm_relu_odd": kernel(
        "Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(13, 9), B=(9, 37)
    ),
    "mm_const_weights": kernel(
        "Y[i, j] += A[i, k] * B[k, j]", A=(5, 20), B=RNG.standard_normal((20, 33)).astype("f4")
    ),
    "math": kernel(
        "Y[i, j] = exp(A[i, j]) + log(abs(A[i, j]) + 1) + sqrt(abs(A[i, j])) + tanh(A[i, j])"
        " + erf(A[i, j]) + sigmoid(A[i, j]) + floor(A[i, j]) + ceil(A[i, j])",
        A=(3, 21),
    ),
    "select_pow": kernel("Y[i] = pow(abs(A[i]), 1.5) if A[i] > 0 else -A[i] * 2", A=(19,)),
    "int_division": kernel(
        "Y[i] = A[i] / B[i]", "Z[i] = A[i] % B[i]", A=(40,), B=(40,), dtype="int32"
    ),
    "int64_minmax": kernel(
        "Y[i] = max(A[i], B[i]) - min(A[i], 3)", A=(23,), B=(23,), dtype="int64"
    ),
    "float64": kernel("Y[i, j] += A[i, k] * A[j, k]", A=(7, 11), dtype="float64"),
    "float16": kernel("Y[i] = A[i] * 2 + 1", A=(35,), dtype="float16"),
    "bool_logic": kernel(
        "Y[i] = (A[i] and not B[i]) or (A[i] == B[i])", A=(30,), B=(30,), dtype="bool"
    ),
    "gather": kernel(
        "Y[i, j] = A[I[i], j]", A=(6, 17), I=(4,), dtypes={"I": "int64"}, name="gather"
    ),
    "conv_pads_strides": kernel_from_node(
        node("Conv", ["x", "w"], pads=[1, 2, 1, 0], strides=[2, 1]),
        {"x": (1, 3, 9, 10)},
        initializers={"w": W},
    ),
    "conv_groups_dilation": kernel_from_node(
        node("Conv", ["x", "w"], group=3, dilations=[2, 1], pads=[2, 1, 2, 1]),
        {"x": (1, 6, 8, 7)},
        initializers={"w": RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)},
    ),
    "maxpool": kernel_from_node(
        node("MaxPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        {"x": (1, 2, 9, 11)},
    ),
    "avgpool": kernel_from_node(
        node("AveragePool", ["x"], kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[1, 2]),
        {"x": (1, 3, 7, 9)},
    ),
    "softmax": kernel_from_node(node("Softmax", ["x"], axis=-1), {"x": (3, 37)}),
    "layernorm": kernel_from_node(
        node("LayerNormalization", ["x", "s", "b"]),
        {"x": (4, 24)},
        initializers={
            "s": RNG.standard_normal(24).astype(np.float32),
            "b": RNG.standard_normal(24).astype(np.float32),
        },
    ),
    "pad_reflect": kernel_from_node(
        node("Pad", ["x", "p"], mode="reflect"),
        {"x": (3, 9)},
        initializers={"p": np.array([1, 2, 1, 3], dtype=np.int64)},
    ),
    "concat": kernel_from_node(node("Concat", ["a", "b"], axis=1), {"a": (2, 5), "b": (2, 19)}),
    "transpose": kernel_from_node(node("Transpose", ["x"], perm=[1, 0]), {"x": (20, 18)}),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_initial_schedule_matches_reference(name: str) -> None:
    k = KERNELS[name]
    check(initial_schedule(k), inputs_for(k))


@pytest.mark.parametrize("width", [4, 16])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_default_schedule_matches_reference(name: str, width: int) -> None:
    k = KERNELS[name]
    schedule = default_schedule(k, DefaultConfig(vector_width=width))
    check(schedule, inputs_for(k))


def test_default_schedules_really_use_vectors_and_threads() -> None:
    """The marks reach the code: vector types in the IR, an outlined body run by libgomp."""
    k = KERNELS["mm_relu_odd"]  # small: threads only when every kernel gets them
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=8, min_parallel_work=0)))
    assert "<8 x float>" in native.ir
    assert "GOMP_parallel" in native.ir


def test_a_conv_whose_channels_fill_one_vector_still_runs_on_every_thread() -> None:
    """32 output channels in one vector and padded rows: the rows, kept out of the
    parallel loop when the channel tiles suffice, are fused in when there is only one
    channel tile (DenseNet's 3x3 convs ran on one thread of two, 2x slower)."""
    rng = np.random.default_rng(1)
    k = kernel_from_node(
        node("Conv", ["x", "w"], pads=[1, 1, 1, 1]),
        {"x": (1, 2, 5, 6)},
        initializers={"w": rng.standard_normal((32, 2, 3, 3)).astype(np.float32)},
    )
    schedule = default_schedule(k, DefaultConfig(vector_width=32, threads=2, min_parallel_work=0))
    parallel = [lp for lp in schedule.loops_of("Conv_0") if lp.annotation == "parallel"]
    assert len(parallel) == 1 and T.loop_extent(schedule, parallel[0].name) == 5  # the rows
    assert any(step.kind == "pack" for step in schedule.trace)  # channels last, contiguous
    check(schedule, inputs_for(k))


def test_a_short_pooling_row_runs_in_narrower_vectors() -> None:
    """A pooled row of 12 with 16 lanes: vectors of 4 (not scalars, which were 8x slower
    for Inception v1's padded 27-wide MaxPool)."""
    k = kernel_from_node(
        node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        {"x": (1, 3, 10, 24)},
    )
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    main = next(s.name for s in k.statements if s.reduction)
    (vector,) = [lp for lp in schedule.loops_of(main) if lp.annotation == "vector"]
    assert T.loop_extent(schedule, vector.name) == 4
    native = NativeKernel(schedule)
    assert "<4 x float>" in native.ir
    check(schedule, inputs_for(k))


def test_accumulators_of_a_loop_with_full_and_partial_tiles_inside() -> None:
    """A tuned ResNet-50 MaxPool trace: under the reduction loop kh, isolation emits the
    row's full vector tiles and its padded partial ones as sibling loops of one name.
    Only a name whose every loop is expanded may key a register accumulator (the
    partial loop's varying key stopped the model's compilation)."""
    k = kernel_from_node(
        node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        {"x": (1, 4, 8, 80)},
    )
    steps = [
        ("split", {"loop": "ow", "factors": (None, 32)}),
        ("split", {"loop": "c", "factors": (None, 2)}),
        ("reorder", {"order": ("n", "c0", "oh", "ow0", "kh", "kw", "c1", "ow1")}),
        ("decompose_reduction", {"stmt": "MaxPool_0", "loop": "kh"}),
        ("vectorize", {"loop": "ow1"}),
        ("unroll", {"loop": "c1"}),
        ("vectorize", {"loop": "ow_init"}),
        ("fuse", {"loops": ("n", "c0")}),
        ("parallel", {"loop": "n_c0_f"}),
    ]
    trace = [{"kind": kind, "args": args} for kind, args in steps]
    check(T.replay(k, trace), inputs_for(k))


def test_a_short_depthwise_row_runs_as_one_masked_vector() -> None:
    """A 5x5 depthwise conv over 7x7 planes reads a padded copy and runs each 7-wide
    row as one vector of 8 lanes, the last masked: no lane reads past the copy's row
    nor writes past the output's, and the values match the reference."""
    k = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], group=16, pads=[2] * 4),
        {"x": (1, 16, 7, 7), "w": (16, 1, 5, 5)},
    )
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    main = main_statement(k)
    (vector,) = [lp for lp in schedule.loops_of(main.name) if lp.annotation == "vector"]
    assert T.loop_extent(schedule, vector.name) == 7
    ir = NativeKernel(schedule).ir
    assert "llvm.masked.load.v8f32" in ir and "llvm.masked.store.v8f32" in ir
    check(schedule, inputs_for(k))


def test_a_global_pool_over_one_vector_of_channels_is_not_vectorized_along_them() -> None:
    """A global average pool over 16 channels of 14400 pixels: its channels fill one
    vector, but the input holds them a plane apart, so they are no masked row (every
    lane would gather, and the reduction would run on one thread): the pool keeps a
    parallel loop, and the values match."""
    k = kernel_from_node(node("GlobalAveragePool", ["x"]), {"x": (1, 16, 60, 60)})
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    assert "parallel" in {schedule.loop(n).annotation for n in schedule.loop_names()}
    check(schedule, inputs_for(k))


def test_masked_pieces_that_start_apart_keep_their_accumulators_in_memory() -> None:
    """A padded pool's row of 12 as one masked vector of 16: the first tap's piece
    (padding in the domain, at stride 2) starts one column later than the others, so
    register accumulators keyed by address would overlap (each writing back its own sum
    of the shared columns); the loop is not promoted and the values match the reference."""
    k = kernel_from_node(
        node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        {"x": (1, 4, 6, 24)},
    )
    steps = [
        ("reorder", {"order": ("n", "c", "oh", "kh", "kw", "ow")}),
        ("decompose_reduction", {"stmt": "MaxPool_0", "loop": "kh"}),
        ("vectorize", {"loop": "ow"}),
    ]
    trace = [{"kind": kind, "args": args} for kind, args in steps]
    schedule = T.replay(k, trace)
    assert "llvm.masked.load.v16f32" in NativeKernel(schedule).ir
    check(schedule, inputs_for(k))


def test_accumulators_of_calls_keyed_by_different_unrolled_loops() -> None:
    """Under one reduction loop, a block's calls run in an unrolled loop while the
    leftover row's call has that loop substituted by a constant (a random trace found
    it: the accumulators were keyed by a loop the second call is not in). Such a loop
    is not promoted, and the values match the reference."""
    k = KERNELS["mm_relu_odd"]
    schedule = T.split(default_schedule(k), "i1", (None, 3))
    check(schedule, inputs_for(k))


def test_thread_counts_agree() -> None:
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(64, 48), B=(48, 40))
    native = NativeKernel(default_schedule(k))
    inputs = inputs_for(k)
    native.set_threads(1)
    one = native.outputs(inputs)["Y"]
    native.set_threads(2)
    two = native.outputs(inputs)["Y"]
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(two, inputs["A"] @ inputs["B"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("rows", [1, 7, 130])
def test_threads_claim_every_iteration_of_a_parallel_loop_once(threads: int, rows: int) -> None:
    """Each thread's share of the rows: every row is computed whatever the number of
    threads against iterations (the output starts as NaN, so a skipped row shows)."""
    k = kernel("Y[i, j] = A[i, j] * 2 + 1", A=(rows, 5))
    native = NativeKernel(T.parallel(initial_schedule(k), "i"))
    native.set_threads(threads)
    buffers = native.buffers(inputs_for(k))
    buffers["Y"][...] = np.nan
    native.run_on(buffers)
    np.testing.assert_array_equal(buffers["Y"], buffers["A"] * 2 + 1)


def random_step(data: st.DataObject, schedule: Schedule) -> Schedule:
    loops = schedule.loop_names()
    kind = data.draw(st.sampled_from(["split", "reorder", "parallel", "vectorize", "unroll"]))
    loop = data.draw(st.sampled_from(loops))
    if kind == "split":
        return T.split(schedule, loop, (None, data.draw(st.integers(2, 9))))
    if kind == "reorder":
        target = schedule.loop(loop)
        if len(target.body) != 1 or not isinstance(target.body[0], Loop):
            raise IllegalSchedule("no perfectly nested pair")
        return T.reorder(schedule, target.body[0].name, loop)
    return {"parallel": T.parallel, "vectorize": T.vectorize, "unroll": T.unroll}[kind](
        schedule, loop
    )


@pytest.mark.parametrize("name", ["mm_relu_odd", "conv_pads_strides", "softmax", "pad_reflect"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_legal_traces_match_reference(name: str, data: st.DataObject) -> None:
    k = KERNELS[name]
    schedule = default_schedule(k) if data.draw(st.booleans()) else initial_schedule(k)
    for _ in range(data.draw(st.integers(1, 4))):
        try:
            schedule = random_step(data, schedule)
        except IllegalSchedule:
            continue
    check(schedule, inputs_for(k))


def test_512_bit_vectors_in_the_assembly() -> None:
    """On an AVX-512 host, 16-lane float vectors are real zmm instructions (LLVM would
    split them into ymm halves without the function's vector-width attributes)."""
    native = NativeKernel(default_schedule(KERNELS["mm_relu_odd"], DefaultConfig(16)))
    if native.target.vector_bits < 512:
        pytest.skip("this host has no AVX-512")
    assert "zmm" in native.assembly()


def test_a_kernel_runs_and_is_timed_on_buffers_aligned_to_a_cache_line() -> None:
    """The tuner times candidates on these buffers: aligned like the compiled model's,
    whatever the caller's arrays (a 16-byte-aligned view here) and the constant's."""
    k = kernel("Y[i, j] = A[i, j] * W[j] + W[j]", A=(5, 7), W=np.arange(7, dtype=np.float32))
    native = NativeKernel(default_schedule(k))
    raw = np.zeros(5 * 7 + 16, dtype=np.float32)
    start = next(i for i in range(16) if (raw.ctypes.data + 4 * i) % BUFFER_ALIGN == 16)
    a = raw[start : start + 35].reshape(5, 7)
    a[...] = np.arange(35).reshape(5, 7)
    buffers = native.buffers({"A": a})
    assert {n: b.ctypes.data % BUFFER_ALIGN for n, b in buffers.items()} == dict.fromkeys(
        buffers, 0
    )
    native.run_on(buffers)
    want = a * np.arange(7) + np.arange(7)
    assert buffers["Y"].shape == want.shape and buffers["Y"].dtype == np.float32
    np.testing.assert_array_equal(buffers["Y"], want)


def test_accumulators_are_kept_in_registers_across_the_reduction() -> None:
    """Codegen's local accumulation: the register tile's accumulators get stack cells
    (which LLVM turns into registers) instead of a load and store of Y per k."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(32, 64), B=(64, 64))
    lanes = host().lanes("float32")
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=lanes)))
    assert native.ir.count(f"alloca <{lanes} x float>") >= 4
    inputs = inputs_for(k)
    np.testing.assert_allclose(
        native.outputs(inputs)["Y"], inputs["A"] @ inputs["B"], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "bool"])
@pytest.mark.parametrize("stride", [2, 3, 4, 5])
def test_strided_vector_loads(stride: int, dtype: str) -> None:
    """Lanes `stride` apart: strides up to 4 are one masked wide load and a shuffle (the
    last row's last lane reads the buffer's last element, so nothing past it may be
    touched), wider ones a load per lane; both give the reference's values."""
    lanes = 16
    cols = stride * (lanes - 1) + 2
    k = kernel(f"Y[i, j] = A[i, {stride}*j + 1]", A=(3, cols), dtype=dtype, extents={"j": lanes})
    schedule = T.vectorize(initial_schedule(k), "j")
    check(schedule, inputs_for(k))
    assert ("llvm.masked.load" in NativeKernel(schedule).ir) is (stride <= 4)


def test_a_pooling_window_over_short_rows_keeps_its_channel_block_in_registers() -> None:
    """Seven output columns are too few to split into vectors; the block of channels is
    still unrolled, so its accumulators are promoted instead of being loaded and stored
    for every window element."""
    k = kernel_from_node(
        node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), {"x": (1, 16, 7, 7)}
    )
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    main = main_statement(k)  # the window's sum (the tap counts are reductions too)
    assert [lp.annotation for lp in schedule.loops_of(main.name)][-1] == "unroll"
    check(schedule, inputs_for(k))


def _silu_depthwise(side: int, stride: int) -> Kernel:
    """The kernel of SiLU then a padded depthwise 3x3 conv over 8 channels."""
    out = (side - 1) // stride + 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, side, side])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, out, out])
    w = numpy_helper.from_array(RNG.standard_normal((8, 1, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["a"]),
        helper.make_node("Conv", ["a", "w"], ["y"], group=8, pads=[1] * 4, strides=[stride] * 2),
    ]
    graph = helper.make_graph(nodes, "silu_dw", [x], [y], [w])
    g = optimize(import_model(helper.make_model(graph)))
    (group,) = partition(g).groups
    return lower(g, group)


def test_a_padded_input_computed_from_the_input_is_made_per_channel_tile() -> None:
    """A depthwise conv after SiLU: the padded copy computes x * sigmoid(x) from the
    kernel's input alone, so it is made one tile of channels at a time inside the conv's
    parallel loop (one nest, the copy private to each thread), and the values match the
    program-order reference."""
    k = _silu_depthwise(12, 1)
    main = main_statement(k)
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    inlined = schedule.kernel  # the SiLU inlined into the padded copy
    pads = padded_inputs(inlined, main.name)
    assert len(pads) == 2
    assert any(isinstance(inlined.statement[p].expr, Binary) for p in pads)
    assert len(schedule.body) == 1  # the copy inside the conv's nest
    check(schedule, inputs_for(k))


def test_an_activation_a_strided_window_reads_is_made_per_channel_tile() -> None:
    """A stride-2 depthwise conv over rows too long for a padded copy reads its SiLU
    from a temporary (each element about twice): the temporary is made one tile of
    channels at a time inside the conv's parallel loop, and the values match."""
    k = _silu_depthwise(80, 2)
    main = main_statement(k)
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    assert tile_prologues(schedule.kernel, main.name)
    assert not padded_inputs(schedule.kernel, main.name)
    assert len(schedule.body) == 1
    check(schedule, inputs_for(k))


def test_a_prologue_every_tile_reads_whole_stays_in_its_own_nest() -> None:
    """A 1x1 conv after a Concat (SqueezeNet's classifier): each tile of output channels
    sums over all input channels, so the concatenated copy is not made per tile (it would
    all be made in the first one, and the tile loop could no longer run in parallel)."""
    w = RNG.standard_normal((64, 32)).astype(np.float32)
    k = kernel(
        "T[c, p] = A[c, p] + 0",
        "Y[m, p] += T[c, p] * W[m, c]",
        A=(32, 169),
        W=w,
    )
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    main = main_statement(k)
    assert any(lp.annotation == "parallel" for lp in schedule.loops_of(main.name))
    check(schedule, inputs_for(k))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_padded_pool_input_is_copied_per_channel_tile_inside_the_parallel_loop(op: str) -> None:
    """The default makes a pool's padded copy for one tile of channels right before the
    window reads it (in cache, one slice per thread), not as a pass over the whole input;
    the window's accumulators are unrolled over the channel block and vectorized along
    the row, and the results match the program-order reference."""
    k = kernel_from_node(
        node(op, ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), {"x": (1, 32, 14, 14)}
    )
    pads = [s.name for s in k.statements if s.name.endswith(("_pad", "_pad_border"))]
    assert len(pads) == 2 and all(k.statement[p].tensor.endswith("padded") for p in pads)
    main = main_statement(k)
    assert sorted(padded_inputs(k, main.name)) == sorted(pads)
    # a producer that computes (a fused ReLU before a sum) is no padded copy: left alone
    fused = kernel("T[i, j] = max(A[i, j], 0)", "Y[i] += T[i, j]", A=(8, 16))
    assert padded_inputs(fused, main_statement(fused).name) == []
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    outer = schedule.loops_of(main.name)[0]
    assert outer.annotation == "parallel"
    for pad in pads:  # under the pool's own parallel loop
        assert schedule.loops_of(pad)[0] is outer
    annotations = [lp.annotation for lp in schedule.loops_of(main.name)]
    assert annotations[-2:] == ["unroll", "vector"]
    check(schedule, inputs_for(k))


@pytest.mark.parametrize("vector", [False, True])
def test_float_max_and_min_propagate_nan_from_either_operand(vector: bool) -> None:
    """Max / min are x86's max / min both ways round with their bits OR-ed (not LLVM's
    `maximum`, whose signed-zero ordering costs two blends per call); a NaN in either
    operand, the running value of a `max=` reduction or the input of a ReLU-like
    `max(x, 0)` must still come out as NaN, as numpy's `maximum` / `minimum` give."""
    k = kernel(
        "Y[i, j] = max(A[i, j], B[i, j])",
        "Z[i, j] = min(A[i, j], B[i, j])",
        "R[i, j] = max(A[i, j], 0)",
        "S[i, j] = min(0.5, B[i, j])",
        "M[i] max= A[i, j]",
        "N[i] min= B[i, j]",
        A=(4, 16),
        B=(4, 16),
    )
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 16)).astype(np.float32)
    b = rng.standard_normal((4, 16)).astype(np.float32)
    a[0, 3] = b[1, 5] = a[2, 7] = b[2, 7] = np.nan
    a[3, 0] = b[3, 15] = np.nan
    a[1, 0], b[1, 0], a[1, 1], b[1, 1] = np.inf, -np.inf, np.inf, np.nan  # OR-ed bits
    schedule = initial_schedule(k)
    if vector:
        for loop in ("j", "j_1", "j_2", "j_3"):
            schedule = T.vectorize(schedule, loop)
    native = NativeKernel(schedule)
    ir_text = avx512_ir(schedule)
    assert "llvm.maximum" not in ir_text and "llvm.minimum" not in ir_text
    # both ways round for Y, Z, M and N; one select where the other operand is a
    # constant that is not NaN (R, S)
    assert ir_text.count("select") == 2 * 4 + 2 and "fcmp uno" not in ir_text
    got = native.outputs({"A": a, "B": b})
    want = {
        "Y": np.maximum(a, b),
        "Z": np.minimum(a, b),
        "R": np.maximum(a, 0),
        "S": np.minimum(0.5, b),
        "M": a.max(axis=1),
        "N": b.min(axis=1),
    }
    for name, value in want.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize(
    ("dtype", "cols", "block"),
    [("float32", 30, 14), ("float32", 48, 16), ("float64", 21, 5), ("int32", 19, 3)],
)
def test_accumulators_with_lanes_rows_apart_move_as_rows(dtype: str, cols: int, block: int) -> None:
    """A register tile with its rows in vector lanes (a conv's output channels) and an
    unrolled block along the contiguous axis: its accumulators are loaded and stored as
    one (masked) row per lane, as wide as the block needs, and transposed in registers,
    not lane by lane; full and partial blocks (30 = 14 + 14 + 2) give the reference's
    values. (The init runs before the pixel tiles, so the tile's accumulators are read
    from memory.)"""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(32, 24), B=(24, cols), dtype=dtype)
    lanes = 64 // np.dtype(dtype).itemsize
    steps = [
        ("split", {"loop": "i", "factors": (None, lanes)}),
        ("split", {"loop": "j", "factors": (None, block)}),
        ("reorder", {"order": ("i0", "j0", "k", "j1", "i1")}),
        ("decompose_reduction", {"stmt": "Y", "loop": "j0"}),
        ("vectorize", {"loop": "i1"}),
        ("unroll", {"loop": "j1"}),
    ]
    schedule = T.replay(k, [{"kind": kind, "args": args} for kind, args in steps])
    ir_text = avx512_ir(schedule)
    masked = block < lanes
    assert ("llvm.masked.store" in ir_text) is masked
    assert ("llvm.masked.load" in ir_text) is masked
    assert ir_text.count("shufflevector") >= 2 * lanes  # (lane by lane: only splats)
    check(schedule, inputs_for(k))


@pytest.mark.parametrize(("vectors", "fused"), [(1, True), (2, False)])
def test_a_register_tile_starts_from_the_bias_its_init_fills_it_with(
    vectors: int, fused: bool
) -> None:
    """A conv's register tile (output channels in lanes, a row of 14 pixels unrolled)
    whose init nest, right before the reduction, fills exactly the tile starts from the
    bias instead of loading the rows back (masked: 14 of 16 lanes); a tile of 28
    accumulators (two vectors a pixel) loads them (`FUSED_INIT_REGISTERS`). The values
    match the reference either way."""
    rng = np.random.default_rng(3)
    channels = 16 * vectors
    k = kernel_from_node(
        helper.make_node("Conv", ["x", "w", "b"], ["y"]),
        {"x": (1, 3, 4, 16)},
        initializers={
            "w": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
            "b": rng.standard_normal(channels).astype(np.float32),
        },
    )
    main = next(s for s in k.statements if s.reduction is not None)
    steps = [
        ("split", {"loop": "m", "factors": (None, channels)}),
        ("reorder", {"order": ("n", "m0", "oh", "c", "kh", "kw", "ow", "m1")}),
        ("decompose_reduction", {"stmt": main.name, "loop": "c"}),
        ("vectorize", {"loop": "m1"}),
        ("unroll", {"loop": "ow"}),
    ]
    schedule = T.replay(k, [{"kind": kind, "args": args} for kind, args in steps])
    ir_text = avx512_ir(schedule)
    assert "llvm.masked.store" in ir_text  # the rows written back
    assert ("llvm.masked.load" in ir_text) is not fused
    check(schedule, inputs_for(k), rtol=1e-4)


@pytest.mark.parametrize(("dtype", "depth"), [("float32", 300), ("float32", 301), ("float64", 77)])
def test_a_reduction_with_few_accumulators_keeps_partial_sums(dtype: str, depth: int) -> None:
    """A GEMV keeps two vector accumulators, which wait on each other's FMA latency:
    the reduction is split four ways into separate partial sums (added at the end, the
    leftover iterations into the first); a register tile with enough accumulators, and
    a max reduction, are not split. Values match numpy either way."""
    lanes = 64 // np.dtype(dtype).itemsize
    gemv = kernel("Y[j] += A[k] * B[k, j]", A=(depth,), B=(depth, 2 * lanes), dtype=dtype)
    steps = [
        ("reorder", {"order": ("k", "j")}),
        ("decompose_reduction", {"stmt": "Y", "loop": "k"}),
        ("vectorize", {"loop": "j"}),
    ]
    schedule = T.replay(gemv, [{"kind": kind, "args": args} for kind, args in steps])
    assert avx512_ir(schedule).count(f"alloca <{lanes} x") == 2 * 4
    check(schedule, inputs_for(gemv), rtol=1e-4)

    tile = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(8, depth), B=(depth, lanes), dtype=dtype)
    steps = [
        ("reorder", {"order": ("k", "i", "j")}),
        ("decompose_reduction", {"stmt": "Y", "loop": "k"}),
        ("vectorize", {"loop": "j"}),
        ("unroll", {"loop": "i"}),
    ]
    schedule = T.replay(tile, [{"kind": kind, "args": args} for kind, args in steps])
    assert avx512_ir(schedule).count(f"alloca <{lanes} x") == 8
    check(schedule, inputs_for(tile), rtol=1e-4)

    peak = kernel("Y[j] max= B[k, j]", B=(depth, lanes), dtype=dtype)
    steps = [
        ("reorder", {"order": ("k", "j")}),
        ("decompose_reduction", {"stmt": "Y", "loop": "k"}),
        ("vectorize", {"loop": "j"}),
    ]
    schedule = T.replay(peak, [{"kind": kind, "args": args} for kind, args in steps])
    assert avx512_ir(schedule).count(f"alloca <{lanes} x") == 1
    check(schedule, inputs_for(peak))
