"""Private temporaries (array contraction): which temporaries a top-level loop's
iterations keep to themselves, the window of offsets one iteration touches, and the code
that stores them in one slice per thread, checked against the reference and by the
buffer bytes the code leaves untouched."""

from __future__ import annotations

import numpy as np
import pytest

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.explanation import explain
from polytile.poly.ast.build import Int, Op, Var, parameter_expr
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.oracle.interp import eval_expr
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T
from polytile.poly.transform.contract import Private, private_temporaries

#: Y = A @ B then ReLU: the default schedule computes 4-row blocks of Y in a parallel
#: loop and applies the ReLU to each block in the same iteration
MM_RELU = kernel("Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(13, 9), B=(9, 37))


def blocked() -> Schedule:
    config = DefaultConfig(vector_width=8, register_block=4, threads=2, min_parallel_work=0)
    return default_schedule(MM_RELU, config)


def mm_relu_inputs() -> dict[str, np.ndarray]:
    return {
        "A": np.random.default_rng(0).standard_normal((13, 9)).astype(np.float32),
        "B": np.random.default_rng(1).standard_normal((9, 37)).astype(np.float32),
    }


def run_with_nan(
    schedule: Schedule, inputs: dict[str, np.ndarray], threads: int, temporary: str
) -> list[np.ndarray]:
    """Run on `threads` threads with the temporary filled with NaN first: C matches the
    reference; returns the temporary's slices of `span` elements (its box's size) that
    the threads wrote, after checking that nothing past the slices of `threads` threads
    was written."""
    want = run_program_order(schedule.kernel, inputs)["C"]
    native = NativeKernel(schedule)
    native.set_threads(threads)
    buffers = native.buffers(inputs)
    buffers[temporary][...] = np.nan
    native.run_on(buffers)
    assert buffers["C"].shape == want.shape and buffers["C"].dtype == want.dtype
    np.testing.assert_allclose(buffers["C"], want, rtol=1e-5, atol=1e-5)
    (private,) = [p for p in private_temporaries(schedule) if p.tensor == temporary]
    flat = buffers[temporary].reshape(-1)
    slices = flat[: private.slots * private.span].reshape(private.slots, private.span)
    assert np.isnan(flat[private.slots * private.span :]).all()
    written = [int(n) for n in np.nonzero(~np.isnan(slices).all(axis=1))[0]]
    # whichever threads took iterations wrote slices of their own
    assert written and all(i < threads for i in written)
    return [slices[i] for i in written]


def test_an_accumulator_with_its_epilogue_is_private_to_the_parallel_iteration() -> None:
    schedule = blocked()
    top = schedule.body[0]
    assert top.annotation == "parallel"
    # the column tile loop inside would hold a smaller box, but isl emits its last,
    # partial tile without a `for` (its iterator is unbound there): so the parallel loop,
    # 4 rows of 37 per iteration, the i0-th block starting at offset 148 * i0
    assert "// loop j0 runs once" in explain(schedule)
    assert private_temporaries(schedule) == (
        Private("Y", top.name, Op("mul", (Int(148), Var(top.name))), 148, 3, (4, 37)),
    )
    assert f"Y (private to each iteration of {top.name}: 148 elements" in explain(schedule)


def test_a_temporary_written_and_read_in_different_top_level_loops_keeps_its_storage() -> None:
    assert private_temporaries(initial_schedule(MM_RELU)) == ()


@pytest.mark.parametrize(
    ("reader", "private"), [("Y[i] = T[i] * 3", True), ("Y[i] = T[i] + T[i - 1] if 1 <= i", False)]
)
def test_a_value_read_in_a_later_iteration_keeps_its_storage(reader: str, private: bool) -> None:
    """T[i - 1] is written one iteration before it is read: its value crosses
    iterations, so one slice reused by every iteration would lose it."""
    k = kernel("T[i] = A[i] * 2", reader, A=(16,), extents={"i": 16})
    schedule = T.reverse_compute_at(initial_schedule(k), "Y", "i")
    found = private_temporaries(schedule)
    assert found == ((Private("T", "i", Var("i"), 1, 16, (1,)),) if private else ())


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_private_temporary_lives_in_one_slice_per_thread(threads: int) -> None:
    """The code matches the reference on 1, 2 and 7 threads (more than the buffer's three
    slices: the threads past them take no iterations), and it writes only the slices of
    the threads that ran, where the full-size storage wrote every element."""
    inputs = mm_relu_inputs()
    for piece in run_with_nan(blocked(), inputs, threads, "Y"):
        assert not np.isnan(piece).any()  # whole slices


@pytest.mark.parametrize(
    ("threads", "last_rows"),
    [(2, [[4, 5, 6, 7], [12, 9, 10, 11]]), (3, [[0, 1, 2, 3], [4, 5, 6, 7], [12, 9, 10, 11]])],
)
def test_each_thread_runs_one_contiguous_share_of_the_parallel_loop(
    threads: int, last_rows: list[list[int]]
) -> None:
    """Thread t of n runs row blocks [t·4/n, (t+1)·4/n) of the four, so its slice of Y
    ends up holding the last block of its share (the one-row last block leaves the three
    rows of the block before it). Guided chunks handed out blocks in arrival order."""
    inputs = mm_relu_inputs()
    product = inputs["A"] @ inputs["B"]
    pieces = run_with_nan(blocked(), inputs, threads, "Y")
    assert len(pieces) == threads
    for piece, rows in zip(pieces, last_rows, strict=True):
        np.testing.assert_allclose(piece.reshape(4, 37), product[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "origin",
    [
        "25088v",
        # AlexNet's first conv: a fused (channel, row) loop's origin, with a modulo
        "-88722 + 1728v + 1674*((-1 - v) mod 54)",
        "3 + floor((v + floor(v/3))/2)",
    ],
)
def test_an_origin_with_integer_divisions_evaluates_as_isl_does(origin: str) -> None:
    expr = parameter_expr(ih.parse_pw_aff(f"{{ [v] -> [({origin})] : 0 <= v < 200 }}"), "v")
    assert expr is not None
    for v in range(200):
        want, _ = ih.value_range(ih.parse_set(f"{{ S[v] : v = {v} }}"), origin)
        assert eval_expr(expr, {"v": v}) == want


def test_an_origin_of_two_different_pieces_is_refused() -> None:
    two = ih.parse_pw_aff("{ [v] -> [(v)] : v < 5; [v] -> [(2v)] : v >= 5 }")
    assert parameter_expr(two, "v") is None


def test_a_temporary_with_fewer_slices_than_threads_keeps_its_storage() -> None:
    """Y holds three slices of 148; built for 4 threads, one slice per thread would
    leave a thread idle, so every element is stored (and written) as before."""
    inputs = {"A": np.ones((13, 9), np.float32), "B": np.ones((9, 37), np.float32)}
    native = NativeKernel(blocked(), host(num_threads=4))
    buffers = native.buffers(inputs)
    buffers["Y"][...] = np.nan
    native.run_on(buffers)
    assert not np.isnan(buffers["Y"]).any()
    np.testing.assert_array_equal(buffers["C"], np.full((13, 37), 9, np.float32))


def column_strips(vector: bool) -> Schedule:
    """T = 2A, then C = T + 1, both in a parallel loop over strips of 8 columns: an
    iteration writes 8 columns of every row of T, a window of offsets nearly as long as
    T, but a box of 13 x 8 elements."""
    k = kernel("T[i, j] = A[i, j] * 2", "C[i, j] = T[i, j] + 1", A=(13, 37))
    schedule, (j0, j1) = T.split_named(initial_schedule(k), "j", (None, 8))
    schedule = T.reverse_compute_at(T.reorder(schedule, j0, "i", j1), "C", j0)
    if vector:
        schedule = T.vectorize(schedule, j1)
    return T.parallel(schedule, j0)


def test_a_strip_of_every_row_is_private_in_a_box() -> None:
    schedule = column_strips(vector=False)
    assert private_temporaries(schedule) == (
        Private("T", "j0", Op("mul", (Int(8), Var("j0"))), 104, 4, (13, 8)),
    )


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_box_slice_per_thread_computes_the_reference(threads: int, vector: bool) -> None:
    """Offsets of T are laid out in the 13 x 8 box of a slice: the result matches the
    reference, only the slices of threads that ran were written, and in each the first
    five columns of every row of the box (every strip has at least five columns)."""
    inputs = {"A": np.random.default_rng(2).standard_normal((13, 37)).astype(np.float32)}
    for piece in run_with_nan(column_strips(vector), inputs, threads, "T"):
        assert not np.isnan(piece.reshape(13, 8)[:, :5]).any()


#: Y = A @ B then ReLU with the column tiles outermost (B outgrows the "cache"): the row
#: blocks run inside each parallel column tile, and Y's 4 x 16 register tile lives
#: within one row block's iteration
WIDE = kernel("Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(24, 32), B=(32, 64))


def tiles_first() -> Schedule:
    """Column tiles outermost, blocks of 4 rows inside (twice a register block of 2)."""
    config = DefaultConfig(
        vector_width=8, register_block=2, threads=2, min_parallel_work=0, cache_bytes=4096
    )
    return default_schedule(WIDE, config)


def test_a_temporary_is_private_to_the_deepest_loop_that_holds_it() -> None:
    schedule = tiles_first()
    top = schedule.body[0]
    assert top.name == "j0" and top.annotation == "parallel"
    origin = Op("add", (Op("mul", (Int(16), Var("j0"))), Op("mul", (Int(64), Var("i0")))))
    assert private_temporaries(schedule) == (Private("Y", "i0", origin, 64, 24, (4, 16), ("j0",)),)


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_nested_private_temporary_takes_the_parallel_threads_slices(threads: int) -> None:
    """The row blocks inside a parallel column tile reuse the slice of the thread that
    runs the tile: the result matches the reference, and only those slices are written."""
    rng = np.random.default_rng(3)
    inputs = {
        "A": rng.standard_normal((24, 32)).astype(np.float32),
        "B": rng.standard_normal((32, 64)).astype(np.float32),
    }
    for piece in run_with_nan(tiles_first(), inputs, threads, "Y"):
        assert not np.isnan(piece).any()


def test_a_window_under_a_strided_loop_is_bounded() -> None:
    """Offsets 0..i at even loop values v = 2i: the window's width is v/2, integer but
    with a rational coefficient, which isl's max_val refuses; the widest is 10."""
    offsets = ih.parse_map("{ [v] -> [j] : exists (i: v = 2i and 0 <= i < 10 and 0 <= j <= i) }")
    window = ih.offset_window(offsets)
    assert window is not None and window[1] == 10


#: WIDE with a batch of one: the batch loop sits between the parallel column tiles and
#: the row blocks, where isl emits it without a `for` (ResNet-50's tuned 3x3 convs)
BATCHED = kernel(
    "Y[n, i, j] += A[n, i, k] * B[k, j]",
    "C[n, i, j] = max(Y[n, i, j], 0)",
    A=(1, 24, 32),
    B=(32, 64),
)
BATCHED_TRACE = [
    {"kind": "split", "args": {"loop": "j", "factors": [None, 16]}},
    {"kind": "split", "args": {"loop": "i", "factors": [None, 4]}},
    {"kind": "reorder", "args": {"order": ["j0", "n", "i0", "k", "i1", "j1"]}},
    {"kind": "decompose_reduction", "args": {"stmt": "Y", "loop": "k"}},
    {"kind": "reverse_compute_at", "args": {"stmt": "C", "loop": "i0"}},
    {"kind": "vectorize", "args": {"loop": "j1"}},
    {"kind": "unroll", "args": {"loop": "i1"}},
    {"kind": "parallel", "args": {"loop": "j0"}},
]


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_loop_of_one_iteration_is_looked_through(threads: int) -> None:
    schedule = T.replay(BATCHED, BATCHED_TRACE)
    assert "// loop n runs once" in explain(schedule)
    origin = Op("add", (Op("mul", (Int(16), Var("j0"))), Op("mul", (Int(64), Var("i0")))))
    # the row block's 4 x 16 tile, not the column tile's 24 x 16 strip
    assert private_temporaries(schedule) == (
        Private("Y", "i0", origin, 64, 24, (1, 4, 16), ("j0",)),
    )
    rng = np.random.default_rng(4)
    inputs = {
        "A": rng.standard_normal((1, 24, 32)).astype(np.float32),
        "B": rng.standard_normal((32, 64)).astype(np.float32),
    }
    for piece in run_with_nan(schedule, inputs, threads, "Y"):
        assert not np.isnan(piece).any()
