"""Schedule transformations: each is executed (AST interpreter) and compared with the
untransformed kernel (program-order executor) and numpy; illegal requests raise
IllegalSchedule naming the step and the dependence; traces replay identically."""

from __future__ import annotations

import gc
import json
from dataclasses import replace

import numpy as np
import pytest

from polytile.codegen.native import NativeKernel
from polytile.errors import IllegalSchedule
from polytile.explanation import explain
from polytile.handle import ScheduleHandle
from polytile.poly.ast.build import Block, build_ast
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import pack as P
from polytile.poly.transform import steps as T
from polytile.poly.transform.contract import private_temporaries
from polytile.search.space import SearchSpace

from kernels import assert_equivalent, mm_relu, prefix_sum, random_inputs, softmax_rows, stencil


def test_mlc_mm_relu_tutorial() -> None:
    """TVM's MLC course mm_relu, step by step, through the researcher handle."""
    kernel = mm_relu(16, 16, 8)
    sch = ScheduleHandle(kernel)
    i, j, k = sch.get_loops("Y")
    j0, j1 = sch.split(j, [None, 4])
    assert (j0, j1) == ("j0", "j1")
    sch.reorder(j0, k, j1)
    sch.reverse_compute_at("C", j0)
    sch.decompose_reduction("Y", k)
    sch.vectorize(j1)
    sch.parallel(i)
    sch.unroll(k)
    code = sch.show()
    assert "// vector" in code and "// parallel" in code and "// unroll" in code
    assert code.index("C[") < code.rindex("}")  # C is computed inside the tile
    assert [s["kind"] for s in sch.trace] == [
        "split",
        "reorder",
        "reverse_compute_at",
        "decompose_reduction",
        "vectorize",
        "parallel",
        "unroll",
    ]
    assert_equivalent(sch.schedule)
    inputs = random_inputs(kernel)
    out = run_schedule(sch.schedule, inputs)["C"]
    np.testing.assert_allclose(out, np.maximum(inputs["A"] @ inputs["B"], 0), rtol=1e-5)


def test_illegal_requests_raise_at_the_call() -> None:
    sch = ScheduleHandle(mm_relu())
    _, _, k = sch.get_loops("Y")
    with pytest.raises(IllegalSchedule, match=r"parallel\(k\).*Y\[") as info:
        sch.parallel(k)
    assert "carries" in str(info.value)
    with pytest.raises(IllegalSchedule, match="innermost"):
        sch.vectorize(sch.get_loops("Y")[0])
    assert sch.trace == []  # a refused request leaves the handle unchanged


def test_reordering_a_flow_dependence_is_illegal() -> None:
    """C reads Y: moving C's nest before Y's reduction finishes breaks the flow."""
    schedule = initial_schedule(mm_relu())
    with pytest.raises(IllegalSchedule, match="compute_at"):
        T.compute_at(schedule, "C", "k")


def test_carried_dependence_blocks_parallel_and_vector() -> None:
    schedule = initial_schedule(prefix_sum())
    (loop,) = [lp.name for lp in schedule.loops_of("P")]
    for fn in (T.parallel, T.vectorize):
        with pytest.raises(IllegalSchedule, match="carries"):
            fn(schedule, loop)
    assert_equivalent(T.unroll(schedule, loop))


@pytest.mark.parametrize("factors", [(None, 4), (None, 3), (2, None), (2, 2, None), (None, 5)])
def test_split_preserves_results_even_with_remainders(factors) -> None:
    schedule = T.split(initial_schedule(mm_relu(7, 10, 5)), "j", factors)
    assert_equivalent(schedule)


def test_tile_and_fuse() -> None:
    schedule = T.tile(initial_schedule(mm_relu(8, 12, 4)), ["i", "j"], [4, 3])
    names = [lp.name for lp in schedule.loops_of("Y")]
    assert names == ["i0", "j0", "i1", "j1", "k"]
    schedule = T.fuse(schedule, "i0", "j0")
    schedule = T.parallel(schedule, schedule.loops_of("Y")[0].name)
    assert_equivalent(schedule)


def test_compute_at_producer_into_consumer() -> None:
    schedule = T.compute_at(initial_schedule(softmax_rows()), "E", "j_2")
    assert_equivalent(schedule)


def test_softmax_stages_fused_per_row() -> None:
    schedule = initial_schedule(softmax_rows())
    rows = next(lp.name for lp in schedule.loops_of("Y"))
    for stmt in ("S", "S_init", "E", "M", "M_init"):  # each producer of what is inside
        schedule = T.compute_at(schedule, stmt, rows)
    schedule = T.parallel(schedule, rows)
    code = explain(schedule)
    assert code.count("// parallel") == 1
    assert_equivalent(schedule)


def test_stencil_vectorized() -> None:
    schedule = initial_schedule(stencil(35))
    (loop,) = [lp.name for lp in schedule.loops_of("B")]
    schedule = T.split(schedule, loop, (None, 8))
    schedule = T.vectorize(schedule, f"{loop}1")
    assert_equivalent(schedule)


def test_trace_roundtrip_and_hash() -> None:
    kernel = mm_relu(8, 8, 8)
    schedule = default_schedule(kernel)
    text = json.dumps(schedule.trace_json())
    again = T.replay(kernel, json.loads(text))
    assert again.body == schedule.body
    assert again.trace_hash() == schedule.trace_hash()
    assert T.replay(kernel, []).trace_hash() != schedule.trace_hash()
    with pytest.raises(IllegalSchedule, match="unknown step"):
        T.replay(kernel, [{"kind": "teleport", "args": {}}])


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("split i by 4", "must be an object with a 'kind'"),
        ({"args": {"loop": "i"}}, "must be an object with a 'kind'"),
        ({"kind": "unroll", "args": ["i"]}, "'args' must be an object"),
        ({"kind": "split", "args": {"loop": "i"}}, "lacks its argument 'factors'"),
        ({"kind": "split", "args": {"loop": "i", "factors": "4"}}, "must be a list of integers"),
        ({"kind": "split", "args": {"loop": 0, "factors": [None, 4]}}, "'loop' must be a name"),
        ({"kind": "pack", "args": {"tensor": "B", "axis": 1.5, "factor": 4}}, "an integer"),
        ({"kind": "unroll", "args": {"loop": "i", "depth": 2}}, "unknown argument"),
        ({"kind": "reorder", "args": {"order": []}}, "no loops given"),
        ({"kind": "fuse", "args": {"loops": []}}, "no loops given"),
    ],
)
def test_malformed_steps_are_illegal_and_named(step: object, message: str) -> None:
    """A trace edited by hand or from another version fails replay with the legality
    error naming the step, which the search records as illegal (not a crash)."""
    with pytest.raises(IllegalSchedule, match=message):
        T.replay(mm_relu(8, 8, 8), [step])  # type: ignore[list-item]


@pytest.mark.parametrize("build", [mm_relu, softmax_rows, stencil, prefix_sum])
def test_default_schedule_is_legal_and_equivalent(build) -> None:
    schedule = default_schedule(build())
    assert_equivalent(schedule)


def test_default_matmul_schedule_is_register_blocked() -> None:
    schedule = default_schedule(mm_relu(64, 64, 32))
    kinds = [s.kind for s in schedule.trace]
    assert {
        "split",
        "reorder",
        "decompose_reduction",
        "reverse_compute_at",
        "vectorize",
        "parallel",
    } <= set(kinds)
    loops = [(lp.name, lp.annotation) for lp in schedule.loops_of("Y")]
    assert loops[-1][1] == "vector" and loops[0][1] == "parallel"


@pytest.mark.parametrize(("columns", "lanes"), [(64, 16), (40, 16), (24, 8)])
def test_default_rows_hold_two_vectors_where_the_row_has_four(columns: int, lanes: int) -> None:
    """Two vectors a row (of 8 lanes) wherever the row holds four or more, also when
    they do not divide it (40 columns: two full tiles of 16 and a tail of 8, emitted
    apart); one where it is shorter. Each matches the reference."""
    config = DefaultConfig(vector_width=8, threads=2, min_parallel_work=0)
    schedule = default_schedule(mm_relu(16, columns, 32), config)
    (vector,) = [lp.name for lp in schedule.loops_of("Y") if lp.annotation == "vector"]
    assert T.loop_extent(schedule, vector) == lanes
    space = SearchSpace(schedule.kernel, lanes=8, threads=2)
    assert space.default_decisions()["vec"] == lanes
    assert_equivalent(schedule)


@pytest.mark.parametrize(("cache_bytes", "first"), [(1 << 20, "i0"), (4096, "j0")])
def test_default_walks_vector_tiles_outside_blocks_when_b_outgrows_the_cache(
    cache_bytes: int, first: str
) -> None:
    """B (32 x 64 floats, 8 KB) is read whole once per block of rows of A. Larger than
    the cache, the column tiles go outermost so each tile of B stays in cache across
    the row blocks; the result still matches the reference, and Y's register tile is
    private to the row block's iteration."""
    kernel = mm_relu(24, 64, 32)
    config = DefaultConfig(
        vector_width=8, register_block=4, threads=2, min_parallel_work=0, cache_bytes=cache_bytes
    )
    schedule = default_schedule(kernel, config)
    loops = schedule.loops_of("Y")
    assert loops[0].name.startswith(first) and loops[0].annotation == "parallel"
    inputs = random_inputs(kernel)
    want = run_program_order(kernel, inputs)["C"]
    got = NativeKernel(schedule)(inputs)["C"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if first == "j0":  # 8 rows of a column tile, private to the row block's iteration
        assert [(p.tensor, p.shape) for p in private_temporaries(schedule)] == [("Y", (8, 16))]


def constant_b(kernel: Kernel, seed: int = 1) -> Kernel:
    """mm_relu with B a constant (weights), as after lowering a Gemm / MatMul."""
    b = np.random.default_rng(seed).standard_normal(kernel.tensors["B"].shape).astype("f")
    tensors = {**kernel.tensors, "B": replace(kernel.tensors["B"], role=Role.CONSTANT, value=b)}
    return replace(kernel, tensors=tensors)


@pytest.mark.parametrize(("axis", "factor"), [(1, 4), (1, 3), (0, 2)])
def test_pack_constant_keeps_results(axis: int, factor: int) -> None:
    kernel = constant_b(mm_relu(5, 10, 6))
    packed = T.pack(initial_schedule(kernel), "B", axis, factor)
    blocks = -(-kernel.tensors["B"].shape[axis] // factor)
    new = packed.kernel.tensors["B_packed"]
    assert new.shape[0] == blocks and new.shape[-1] == factor
    inputs = random_inputs(kernel)
    want = run_program_order(kernel, inputs)["C"]
    got = run_schedule(packed, inputs)["C"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert T.replay(kernel, packed.trace_json()).kernel.tensors["B_packed"].shape == new.shape


def test_pack_layout_is_blocked_outer() -> None:
    value = np.arange(24).reshape(2, 12)
    packed = P.pack_constant(value, 1, 4)
    assert packed.shape == (3, 2, 4)
    np.testing.assert_array_equal(packed[1, 0], value[0, 4:8])


def test_candidates_packing_a_weight_alike_share_one_read_only_copy() -> None:
    """A search builds thousands of candidates; each holding its own packed copy of the
    weights made the tuner's memory grow by about 10 MB a trial on ResNet-50. Candidates
    that pack alike share one array; another layout is another array; the cache lets go
    of a weight that is gone."""
    kernel = constant_b(mm_relu(5, 10, 6))
    first = T.pack(initial_schedule(kernel), "B", 1, 4).kernel.tensors["B_packed"].value
    again = T.pack(initial_schedule(kernel), "B", 1, 4).kernel.tensors["B_packed"].value
    other = T.pack(initial_schedule(kernel), "B", 1, 2).kernel.tensors["B_packed"].value
    assert first is again and other is not first and not first.flags.writeable
    np.testing.assert_array_equal(first, P.pack_constant(kernel.tensors["B"].value, 1, 4))
    weight = np.ones((8, 8), dtype=np.float32)
    key = id(weight)
    P.packed_constant(weight, 0, 4)
    assert key in P._PACKED
    del weight
    gc.collect()
    assert key not in P._PACKED


def test_pack_refuses_tensors_the_kernel_writes() -> None:
    with pytest.raises(IllegalSchedule, match=r"pack\(Y, .*constant or input"):
        T.pack(initial_schedule(mm_relu()), "Y", 0, 2)
    with pytest.raises(IllegalSchedule, match=r"pack\(C, .*constant or input"):
        T.pack(initial_schedule(mm_relu()), "C", 1, 4)


def test_default_schedule_packs_weights() -> None:
    kernel = constant_b(mm_relu(16, 32, 8))
    schedule = default_schedule(kernel)
    assert "pack" in [s.kind for s in schedule.trace]
    inputs = random_inputs(kernel)
    np.testing.assert_allclose(
        run_schedule(schedule, inputs)["C"], run_program_order(kernel, inputs)["C"], rtol=1e-5
    )


def test_an_ast_past_the_operation_limit_is_illegal(monkeypatch: pytest.MonkeyPatch) -> None:
    """isl's AST generator can run away on some tilings; past its operation budget a
    schedule is illegal (the search skips it), and the budget does not outlive the call."""
    import polytile.poly.ast.build as A

    schedule = default_schedule(mm_relu(16, 32, 8))
    monkeypatch.setattr(A, "AST_OPERATIONS", 50)
    with pytest.raises(IllegalSchedule, match="AST generator gave up"):
        A.build_ast(schedule)
    monkeypatch.undo()
    assert A.build_ast(schedule) is not None
    assert_equivalent(schedule)


def test_an_ast_check_past_its_operation_limit_is_illegal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checking an AST's pieces can explode too (on fused parallel loops); past its
    budget a fuse is illegal, not a hang, and the budget does not outlive the call."""
    import polytile.poly.ast.check as C

    schedule = default_schedule(mm_relu(16, 32, 8))
    plain = initial_schedule(schedule.kernel)
    first, second = (lp.name for lp in plain.loops_of("C")[:2])
    monkeypatch.setattr(C, "CHECK_OPERATIONS", 5)
    with pytest.raises(IllegalSchedule, match="isl operations"):
        C.verify_ast(schedule)
    with pytest.raises(IllegalSchedule, match=r"fuse.*isl operations"):
        T.fuse(plain, first, second)
    monkeypatch.undo()
    assert C.verify_ast(schedule) is not None
    fused = T.fuse(plain, first, second)
    assert_equivalent(fused)


def test_fuse_checks_only_its_own_top_level_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fuse checks the AST of the top-level nest it changed, with that nest's statements
    only: isl generates a top sequence's children apart, so that AST is the whole one's
    part for the nest. The other nests are not built again; a fuse in a one-nest
    schedule checks it whole."""
    import polytile.poly.ast.check as C

    k = kernel("Y[i, j] = A[i, j] + 1", "Z[i, j] = B[i, j] * 2", A=(6, 10), B=(4, 12))
    plain = initial_schedule(k)
    y0, y1 = (lp.name for lp in plain.loops_of("Y"))
    checked: list[tuple[str, ...]] = []
    verify = C.verify_ast

    def spy(schedule: Schedule, ast: object = None) -> object:
        checked.append(tuple(s.name for s in schedule.kernel.statements))
        return verify(schedule, ast)

    monkeypatch.setattr(T, "verify_ast", spy)
    fused = T.fuse(plain, y0, y1)
    assert checked == [("Y",)]
    cut = T._top_nest_alone(fused, fused.loops_of("Y")[0].name)
    whole = build_ast(fused)
    assert isinstance(whole, Block) and build_ast(cut) == whole.items[0]
    assert_equivalent(fused)
    single = initial_schedule(kernel("Y[i, j] = A[i, j] + 1", A=(6, 10)))
    checked.clear()
    T.fuse(single, *(lp.name for lp in single.loops_of("Y")))
    assert checked == [("Y",)]


@pytest.mark.parametrize(
    ("width", "rows", "block"),
    [(16, 24, 8), (16, 12, 4), (16, 7, 7), (8, 24, 6), (8, 12, 6), (8, 7, 3), (8, 5, 5)],
)
def test_default_register_block_is_twice_the_rows_where_two_fit(
    width: int, rows: int, block: int | None
) -> None:
    """Twice the register block of rows (enough independent FMA chains for two pipes)
    when the rows hold two such blocks, else one block, else all the rows in one: blocks
    of 4 with AVX-512's 32 registers, of 3 with AVX's 16 (6 rows of two vectors: 12
    accumulators beside the operands, where 8 rows spilled). Each matches the reference."""
    kernel = mm_relu(rows, 4 * width, 32)
    config = DefaultConfig(vector_width=width, threads=2, min_parallel_work=0)
    assert config.rows == (4 if width == 16 else 3)
    assert DefaultConfig(vector_width=width, register_block=2).rows == 2
    schedule = default_schedule(kernel, config)
    unrolled = [lp.name for lp in schedule.loops_of("Y") if lp.annotation == "unroll"]
    got = [T.loop_extent(schedule, n) for n in unrolled]
    assert got == ([block] if block else [])
    assert_equivalent(schedule)
