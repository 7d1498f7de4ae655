"""Partial tiles: full tiles generated apart (constant trip counts for the vector and
unrolled loops inside), parallel loops kept whole, the default schedule not fusing a
loop of uneven tiles into its parallel loop; checked on the AST and against numpy."""

from __future__ import annotations

import multiprocessing
from collections import defaultdict
from collections.abc import Callable

import islpy as isl
import numpy as np
import pytest
from onnx import helper

from polytile.codegen.ast_facts import vars_of
from polytile.codegen.native import NativeKernel
from polytile.errors import IllegalSchedule
from polytile.poly.ast.build import (
    AstNode,
    Block,
    Call,
    For,
    If,
    Int,
    Mark,
    Op,
    Var,
    build_ast,
    unswitch_partial_trips,
)
from polytile.poly.ast.check import verify_ast
from polytile.poly.ast.tiles import has_partial_tiles
from polytile.poly.default.schedule import DefaultConfig, parallelize_outer
from polytile.poly.dsl import kernel_from_node
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T

from kernels import check_mm_relu, mm_relu, random_inputs


def register_tile(n: int, m: int, k: int, outer: str = "") -> Schedule:
    """Y = A @ B with j split by 8 into a serial tile loop j0 (or `outer`-annotated) and
    an unrolled j1 inside the reduction loop k: the conv's register tile."""
    schedule = T.split(initial_schedule(mm_relu(n, m, k)), "j", (None, 8))
    schedule = T.reorder(schedule, "i", "j0", "k", "j1")
    schedule = T.unroll(schedule, "j1")
    if outer == "parallel":
        schedule = T.parallel(schedule, "j0")
    return schedule


def loops_named(node: AstNode, name: str) -> list[For]:
    """The `for` nodes the AST emits for one schedule loop, in program order."""
    if isinstance(node, For):
        return ([node] if node.loop == name else []) + loops_named(node.body, name)
    if isinstance(node, Block):
        return [f for item in node.items for f in loops_named(item, name)]
    if isinstance(node, If):
        found = loops_named(node.then, name)
        return found + (loops_named(node.orelse, name) if node.orelse is not None else [])
    if isinstance(node, Mark):
        return loops_named(node.body, name)
    return []


def constant_bound(loop: For) -> int | None:
    """`n` when the loop's condition is `var <= n` (or `var < n + 1`)."""
    cond = loop.cond
    if isinstance(cond, Op) and cond.op in ("le", "lt") and isinstance(cond.args[1], Int):
        return cond.args[1].value - (cond.op == "lt")
    return None


def test_full_tiles_are_generated_apart_with_constant_trip_counts() -> None:
    schedule = register_tile(3, 21, 5)
    ast = verify_ast(schedule)
    tiles = loops_named(ast, "j0")
    assert len(tiles) == 1 and constant_bound(tiles[0]) == 1  # j0 = 0, 1: the full tiles
    unrolled = loops_named(ast, "j1")
    bounds = [constant_bound(loop) for loop in unrolled]
    # the full tiles' j1 runs 0..7; the rest (j = 16..20) is its own loop with 0..4
    assert bounds == [7, 4]
    assert all(isinstance(loop.init, Int) for loop in unrolled)
    check_mm_relu(schedule)


@pytest.mark.parametrize(("width", "pieces"), [(28, 2), (56, 3), (44, 3)])
def test_a_padded_windows_border_tiles_are_generated_apart(width: int, pieces: int) -> None:
    """A padded 3-wide window under an unrolled row block of 14: the window columns' range
    at the border depends on the tile (`max(0, 1 - 14 * ow0 - ow1)`); the first and last
    tiles are emitted apart (the middle ones, and a partial tail, each once), so every
    unrolled copy's kw loop has bounds in ow1 alone, which codegen folds to constants
    (as ResNet-50's 3x3 stride-2 conv with 14-row blocks needs). The outputs match the
    reference."""
    w = np.random.default_rng(1).standard_normal((8, 3, 3, 3)).astype(np.float32)
    conv = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
        {"x": (1, 3, 2, width)},
        initializers={"w": w},
    )
    schedule = initial_schedule(conv)
    main = max(conv.statements, key=lambda st: len(st.dims)).name
    n, m, oh, ow, c, kh, kw = (lp.name for lp in schedule.loops_of(main))
    schedule = T.split(schedule, ow, (None, 14))
    schedule = T.reorder(schedule, n, m, oh, f"{ow}0", c, kh, f"{ow}1", kw)
    schedule = T.unroll(schedule, f"{ow}1")
    ast = verify_ast(schedule)
    windows = loops_named(ast, kw)
    # the first tile, the middle ones (56: tiles 1-2; 44: 1-2), the last (44: a tail of 2)
    assert len(windows) == pieces
    for loop in windows:
        assert vars_of(loop.init) | vars_of(loop.cond) <= {f"{ow}1", kw}
    inputs = random_inputs(conv)
    want = run_program_order(conv, inputs)
    for got in (run_schedule(schedule, inputs), NativeKernel(schedule)(inputs)):
        for t in conv.outputs():
            assert got[t.name].shape == want[t.name].shape
            assert got[t.name].dtype == want[t.name].dtype
            np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-5, atol=1e-5)


def test_without_partial_tiles_nothing_is_duplicated() -> None:
    ast = build_ast(register_tile(3, 16, 5))
    assert [constant_bound(loop) for loop in loops_named(ast, "j1")] == [7]
    assert constant_bound(loops_named(ast, "j0")[0]) == 1


def test_tails_in_two_serial_loops_are_both_set_apart() -> None:
    """With tails in i and in j (one thread, nothing parallel), isolating i's full tiles
    must not stop j's: inside them j's full tiles also get constant trip counts."""
    schedule = T.split(initial_schedule(mm_relu(6, 21, 5)), "i", (None, 4))
    schedule = T.split(schedule, "j", (None, 8))
    schedule = T.reorder(schedule, "i0", "j0", "k", "i1", "j1")
    schedule = T.unroll(T.unroll(schedule, "i1"), "j1")
    ast = verify_ast(schedule)
    assert [constant_bound(loop) for loop in loops_named(ast, "i1")] == [3, 3, 1, 1]
    # i's full tile: j's full tiles (j1 to 7) and j's tail (to 4); i's tail: j unsplit,
    # its full tiles under a hoisted test (to 7), the rest where the test fixes j0 = 2
    # (to 4, `facts.prune_decided`)
    assert [constant_bound(loop) for loop in loops_named(ast, "j1")] == [7, 4, 7, 4]
    check_mm_relu(schedule)


def test_a_parallel_tile_loop_stays_one_loop() -> None:
    schedule = register_tile(3, 13, 5, outer="parallel")
    ast = verify_ast(schedule)
    (tiles,) = loops_named(ast, "j0")
    assert tiles.annotation == "parallel" and constant_bound(tiles) == 1
    check_mm_relu(schedule)


def test_partial_tiles_are_detected_per_loop() -> None:
    uneven, even = register_tile(3, 13, 5), register_tile(3, 16, 5)
    assert has_partial_tiles(uneven, "j0")
    assert not has_partial_tiles(even, "j0")
    assert not has_partial_tiles(uneven, "j1")  # nothing inside it varies
    assert not has_partial_tiles(uneven, "no_such_loop")
    # a loop that is neither vector nor unrolled may vary without harm
    plain = T.reorder(
        T.split(initial_schedule(mm_relu(3, 13, 5)), "j", (None, 8)), "i", "j0", "k", "j1"
    )
    assert not has_partial_tiles(plain, "j0")


@pytest.mark.parametrize(
    ("n", "m", "parallel"), [(4, 13, "i"), (4, 16, "i"), (1, 16, "i_j0_f"), (1, 13, "i_j0_f")]
)
def test_parallel_fusion_stops_at_tile_loops(n: int, m: int, parallel: str) -> None:
    """With i's iterations enough for 2 threads, j's tile loop is not fused in: fused, its
    tiles are indexed through a modulo (and uneven ones guard their vector loops). With
    one i, the threads need j0's tiles."""
    schedule = T.split(initial_schedule(mm_relu(n, m, 5)), "j", (None, 8))
    schedule = T.vectorize(T.reorder(schedule, "i", "j0", "k", "j1"), "j1")
    config = DefaultConfig(threads=2, min_parallel_work=0)
    schedule = parallelize_outer(schedule, "Y", config)
    assert [lp.name for lp in schedule.loops_of("Y") if lp.annotation == "parallel"] == [parallel]
    check_mm_relu(schedule)


def test_an_explicit_parallel_depth_fuses_uneven_tiles_as_asked() -> None:
    """The search's `parallel_depth` is a decision to measure, not a hint."""
    schedule = T.split(initial_schedule(mm_relu(4, 13, 5)), "j", (None, 8))
    schedule = T.vectorize(T.reorder(schedule, "i", "j0", "k", "j1"), "j1")
    config = DefaultConfig(threads=2, min_parallel_work=0)
    schedule = parallelize_outer(schedule, "Y", config, depth=2)
    parallel = [lp.name for lp in schedule.loops_of("Y") if lp.annotation == "parallel"]
    assert parallel == ["i_j0_f"]
    check_mm_relu(schedule)


def test_the_ast_check_reads_a_loop_reusing_an_outer_iterator_name() -> None:
    """isl may name an inner loop's iterator like one outside it; the outer loop's
    bounds still hold for every instance below."""
    schedule = initial_schedule(mm_relu(1, 4, 1))
    calls = {
        "Y_init": Call("Y_init", (Int(0), Var("x"))),
        "Y": Call("Y", (Int(0), Var("x"), Int(0))),
        "C": Call("C", (Int(0), Var("x"))),
    }

    def nests(outer_last: int) -> Block:
        """Each statement under `for x in 0..outer_last: for x in 0..3` (the inner x
        shadows the outer one)."""
        return Block(
            tuple(
                For(
                    "x",
                    Int(0),
                    Op("le", (Var("x"), Int(outer_last))),
                    Int(1),
                    For("x", Int(0), Op("le", (Var("x"), Int(3))), Int(1), calls[s]),
                )
                for s in ("Y_init", "Y", "C")
            )
        )

    once = nests(0)
    assert verify_ast(schedule, once) is once
    # the outer loop's two values run every instance twice: the check must see it
    with pytest.raises(IllegalSchedule, match="twice"):
        verify_ast(schedule, nests(1))


def test_trip_counts_under_a_strided_outer_loop_are_bounded() -> None:
    """An outer loop taking even values (2i) over a triangle (j <= i): the inner trip
    count is i0/2 on even i0, integer but with a rational coefficient, which isl's
    max_val refuses; the partial trips are every row but the last."""
    domain = "0 <= i < 10 and 0 <= j <= i"
    outer = ih.parse_map(f"{{ S[i, j] -> [2i] : {domain} }}")
    inner = ih.parse_map(f"{{ S[i, j] -> [2i, j] : {domain} }}")
    found = ih.partial_trip_region(isl.UnionMap.from_map(outer), isl.UnionMap.from_map(inner))
    assert found is not None
    assert found.is_equal(ih.parse_set("{ [v] : v mod 2 = 0 and 0 <= v <= 16 }"))


#: a conv's output channels m and pixels p fused through modulos into a parallel loop t
#: and its lanes r, with p split by 16 inside (fuzz sample 6391, densenet121, pixels
#: doubled): isl's parametric lexmin/lexmax of p's tile position ran for minutes on it
FUSED = (
    "0 <= m <= 127 and 0 <= p <= 391 and (r - m) mod 10 = 0 and 0 <= r <= 9"
    " and -5 + 98m + 5p - 10t <= 98r <= 98m + 5p - 10t"
)


def test_trip_counts_of_a_loop_fused_through_modulos_are_found_quickly() -> None:
    """Every (t, r) holds a few pixels; the spans of their positions in the 16-pixel
    tiles differ: the region is the (t, r) whose span is below the widest, as counted
    pixel by pixel here, and it is worked out in well under the guard's time."""
    outer = ih.parse_map(f"{{ S[m, p] -> [t, r] : {FUSED} }}")
    inner = ih.parse_map(
        f"{{ S[m, p] -> [t, r, m, p0, p1] : {FUSED} and (p1 - p) mod 16 = 0"
        " and 0 <= p1 <= 15 and -15 + p <= 16p0 <= p }"
    )

    def region() -> str:
        found = ih.partial_trip_region(isl.UnionMap.from_map(outer), isl.UnionMap.from_map(inner))
        return found.to_str() if found is not None else "none"

    answer = _in_child(region, seconds=20)
    assert answer != "none"
    found = ih.parse_set(answer)
    points: list[tuple[int, ...]] = []
    found.foreach_point(
        lambda pt: points.append(
            tuple(pt.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(2))
        )
    )
    positions: dict[tuple[int, int], list[int]] = defaultdict(list)
    for m in range(128):
        for p in range(392):
            r = m % 10
            positions[((98 * (m - r) + 5 * p) // 10, r)].append(p % 16)
    spans = {key: max(ps) - min(ps) for key, ps in positions.items()}
    widest = max(spans.values())
    want = {key for key, span in spans.items() if span < widest}
    assert want and len(want) < len(spans)  # some (t, r) have full spans, some not
    assert sorted(points) == sorted(want)


def _in_child(run: Callable[[], str], seconds: float) -> str:
    """`run()` in a forked process; the test fails when no answer comes within `seconds`
    (a runaway isl call cannot be interrupted in this process)."""
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    child = fork.Process(target=lambda: send.send(run()))
    child.start()
    try:
        if not receive.poll(seconds):
            pytest.fail(f"no answer within {seconds} s")
        return receive.recv()
    finally:
        child.kill()
        child.join()


def _unrolled_rows(m: int, i0: Var) -> For:
    """`for m1 <= min(5, m - 1 - 6 * i0)` (unrolled) around one call."""
    rest = Op("sub", (Int(m - 1), Op("mul", (Int(6), i0))))
    call = Call("S", (Var("m1"),))
    return For(
        "m1", Int(0), Op("le", (Var("m1"), Op("min", (Int(5), rest)))), Int(1), call, "m1", "unroll"
    )


def test_a_partial_trip_is_hoisted_around_the_body_of_the_innermost_loop_it_uses() -> None:
    """`m1 <= min(5, 255 - 6 * m0)` inside the reduction c: the test goes around m0's
    body (the whole reduction), under the parallel p, not around the rows."""
    rows = _unrolled_rows(256, Var("m0"))
    reduction = For("c", Int(0), Op("le", (Var("c"), Int(1023))), Int(1), rows, "c")
    blocks = For("m0", Int(0), Op("le", (Var("m0"), Int(42))), Int(1), reduction, "m0")
    tile = For("p", Int(0), Op("le", (Var("p"), Int(12))), Int(1), blocks, "p", "parallel")
    out = unswitch_partial_trips(tile)
    assert isinstance(out, For) and isinstance(out.body, For)  # p and m0 stay loops
    test = out.body.body
    assert isinstance(test, If) and test.orelse == reduction  # the general case as it was
    assert test.cond == Op("ge", (Op("sub", (Int(255), Op("mul", (Int(6), Var("m0"))))), Int(5)))
    assert isinstance(test.then, For) and test.then.loop == "c"
    assert [constant_bound(loop) for loop in loops_named(test.then, "m1")] == [5]


def test_a_partial_trip_that_varies_with_a_loop_is_not_hoisted_above_it() -> None:
    rows = _unrolled_rows(256, Var("c"))  # varies with the reduction loop itself
    reduction = For("c", Int(0), Op("le", (Var("c"), Int(1023))), Int(1), rows, "c")
    out = unswitch_partial_trips(reduction)
    assert isinstance(out, For) and isinstance(out.body, If)  # the test inside c
    assert [constant_bound(loop) for loop in loops_named(out.body.then, "m1")] == [5]
    assert unswitch_partial_trips(Block((Call("S", (Int(0),)),))) == Block((Call("S", (Int(0),)),))


def test_a_constant_that_ends_the_domain_rather_than_the_tile_is_not_hoisted() -> None:
    """`j from 4 * j0 to min(9, 4 * j0 + 3)`: the constant 9 is where the domain ends, so
    taking it as the bound leaves the trip count moving with j0; nothing is hoisted."""
    start = Op("mul", (Int(4), Var("j0")))
    bound = Op("min", (Int(9), Op("add", (start, Int(3)))))
    j = For("j", start, Op("le", (Var("j"), bound)), Int(1), Call("S", (Var("j"),)), "j", "vector")
    tiles = For("j0", Int(0), Op("le", (Var("j0"), Int(2))), Int(1), j, "j0")
    assert unswitch_partial_trips(tiles) == tiles


def test_rows_of_a_parallel_loops_partial_tile_get_constant_trip_counts() -> None:
    """A tail in the parallel j loop and in the unrolled rows: isl leaves j's last tile
    with rows `i1 <= min(5, 15 - 6 * i0)` in every block; hoisted, its full blocks
    unroll all six rows (and keep them in registers) and the results are unchanged."""
    schedule = T.split(initial_schedule(mm_relu(16, 36, 5)), "j", (None, 16))
    schedule = T.split(schedule, "i", (None, 6))
    schedule = T.reorder(schedule, "j0", "i0", "k", "i1", "j1")
    schedule = T.vectorize(T.unroll(T.parallel(schedule, "j0"), "i1"), "j1")
    ast = verify_ast(schedule)
    tests = [n for n in _walk_ifs(ast) if n.cond.op == "ge" and n.cond.args[1] == Int(5)]
    assert len(tests) == 1
    assert [constant_bound(loop) for loop in loops_named(tests[0].then, "i1")] == [5]
    assert [constant_bound(loop) for loop in loops_named(tests[0].then, "j1")] == [3]
    # the rest: i0 = 2 there, so its rows end at a constant (`facts.prune_decided`)
    assert [constant_bound(loop) for loop in loops_named(tests[0].orelse, "i1")] == [3]
    check_mm_relu(schedule)


def _walk_ifs(node: AstNode) -> list[If]:
    if isinstance(node, If):
        rest = _walk_ifs(node.orelse) if node.orelse is not None else []
        return [node, *_walk_ifs(node.then), *rest]
    if isinstance(node, For | Mark):
        return _walk_ifs(node.body)
    if isinstance(node, Block):
        return [f for item in node.items for f in _walk_ifs(item)]
    return []
