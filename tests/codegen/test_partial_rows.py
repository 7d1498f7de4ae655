"""Partial register tiles in power-of-two blocks (`poly.ast.rows`): the last row tile of a
size its height does not divide (a symbolic size, or the last iteration of a parallel
loop) runs as blocks of constant heights, each with its accumulators in registers, and
equals numpy at every size."""

from __future__ import annotations

import re

import numpy as np
import pytest

import polytile.poly.ast.build as build
from polytile.codegen.native import NativeKernel
from polytile.poly.ast.build import AstNode, Block, Call, For, If, Int, Mark, Op, Var, build_ast
from polytile.poly.ast.check import verify_ast
from polytile.poly.ast.rows import split_partial_rows
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.transform import steps as T


def _row_tiles(k: Kernel, height: int) -> tuple[Schedule, str]:
    """Rows in unrolled tiles of `height` under the reduction, columns in vectors, the
    row tiles in parallel; and the name of the unrolled row loop."""
    schedule, (i0, i1) = T.split_named(initial_schedule(k), "i", [None, height])
    schedule, (j0, j1) = T.split_named(schedule, "j", [None, 16])
    schedule = T.reorder(schedule, i0, j0, "k", i1, j1)
    schedule = T.vectorize(T.unroll(schedule, i1), j1)
    return T.parallel(schedule, i0), i1


def _trips(loop: For) -> int | None:
    cond = loop.cond
    if isinstance(cond, Op) and cond.op in ("lt", "le") and isinstance(cond.args[1], Int):
        return cond.args[1].value + (cond.op == "le") if loop.init == Int(0) else None
    return None


def _fors(node: AstNode, loop: str) -> list[For]:
    if isinstance(node, For):
        return ([node] if node.loop == loop else []) + _fors(node.body, loop)
    if isinstance(node, Block):
        return [f for item in node.items for f in _fors(item, loop)]
    if isinstance(node, If):
        return _fors(node.then, loop) + (_fors(node.orelse, loop) if node.orelse else [])
    return _fors(node.body, loop) if isinstance(node, Mark) else []


def _promoted(ir_text: str, var: str) -> int:
    """Promoted reduction loops in the IR: each opens a block `<var>.acc`."""
    return len(re.findall(rf"^{var}\.acc(\.\d+)?:", ir_text, re.M))


@pytest.mark.parametrize("height", [6, 8, 16])
def test_symbolic_rows_match_numpy_at_every_count(height: int) -> None:
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=("m", 40), B=(40, 48))
    schedule, _ = _row_tiles(k, height)
    verify_ast(schedule)  # each instance once, for every m
    native = NativeKernel(schedule)
    for m in [*range(1, 2 * height + 2), 37]:
        inputs = native.random_inputs(seed=m, sizes={"m": m})
        np.testing.assert_allclose(
            native.outputs(inputs)["Y"],
            inputs["A"] @ inputs["B"],
            rtol=1e-5,
            atol=1e-5,
            err_msg=f"m = {m}",
        )


def test_every_reduction_of_a_symbolic_tile_keeps_registers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each reduction loop in the AST, the partial tile's blocks included, keeps its
    accumulators in registers; without the blocks the partial tile's does not."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=("m", 40), B=(40, 48))
    schedule, rows = _row_tiles(k, 8)
    ast = build_ast(schedule)
    reductions = _fors(ast, "k")
    # full tiles of 8 rows, the last one's a block for each count, each in a reduction
    assert {_trips(f) for f in _fors(ast, rows)} == {8, 7, 6, 5, 4, 3, 2, 1}
    assert _promoted(NativeKernel(schedule).ir, "k") == len(reductions) >= 4
    monkeypatch.setattr(build, "split_partial_rows", lambda node, kernel: node)
    plain = build_ast(schedule)
    assert len(_fors(plain, "k")) < len(reductions)
    assert _promoted(NativeKernel(schedule).ir, "k") < len(_fors(plain, "k"))


def test_static_sizes_keep_their_tiles() -> None:
    """A static size the height does not divide (13 rows in tiles of 6): isl already
    gives the last parallel iteration its single row; every reduction is promoted."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(13, 40), B=(40, 48))
    schedule, rows = _row_tiles(k, 6)
    assert {_trips(f) for f in _fors(build_ast(schedule), rows)} == {6}
    native = NativeKernel(schedule)
    assert _promoted(native.ir, "k") == len(_fors(build_ast(schedule), "k"))
    inputs = native.random_inputs(seed=1)
    np.testing.assert_allclose(
        native.outputs(inputs)["Y"], inputs["A"] @ inputs["B"], rtol=1e-5, atol=1e-5
    )


def _nest(*stmts: str, rows: int = 8) -> For:
    """`for k { for i1 < n % rows (unrolled) { calls } }`"""
    calls = Block(tuple(Call(s, (Var("i1"), Var("k"))) for s in stmts))
    loop = For(
        "i1",
        Int(0),
        Op("lt", (Var("i1"), Op("pdiv_r", (Var("n"), Int(rows))))),
        Int(1),
        calls,
        "i1",
        "unroll",
    )
    return For("k", Int(0), Op("lt", (Var("k"), Int(5))), Int(1), loop, "k")


def test_only_a_single_reduction_moves_its_rows() -> None:
    """Rows leave the reduction loop only when the nest runs one reduction that does not
    read its own tensor: its instances commute. A statement that reads what the nest
    writes (a running sum) keeps the loop order."""
    k = kernel("S[i] += X[i, k]", "P[i, k] = S[i] * X[i, k]", X=(7, 5))
    k_sum = kernel("S[i] += X[i, k]", X=(7, 5))
    split = split_partial_rows(_nest("S"), k_sum)
    assert isinstance(split, Block) and len(split.items) == 7  # a block per count, 7 to 1
    wide = split_partial_rows(_nest("S", rows=16), k_sum)
    assert isinstance(wide, Block) and len(wide.items) == 4  # up to 15 rows: 8, 4, 2, 1
    assert split_partial_rows(_nest("S", "P"), k) == _nest("S", "P")
    copy = kernel("P[i, k] = X[i, k] * 2.0", X=(7, 5))
    assert split_partial_rows(_nest("P"), copy) == _nest("P")


def test_counts_are_bounded_by_the_tests_around_them() -> None:
    """`i1 < n` is split under `if (n <= 5)` (a block per count) and not without a bound."""
    k = kernel("S[i] += X[i, k]", X=(7, 5))
    nest = _nest("S")
    rows = nest.body
    assert isinstance(rows, For)
    open_count = For(
        "k",
        Int(0),
        nest.cond,
        Int(1),
        For("i1", Int(0), Op("lt", (Var("i1"), Var("n"))), Int(1), rows.body, "i1", "unroll"),
        "k",
    )
    assert split_partial_rows(open_count, k) == open_count
    guarded = If(Op("le", (Var("n"), Int(5))), open_count)
    out = split_partial_rows(guarded, k)
    assert isinstance(out, If) and isinstance(out.then, Block) and len(out.then.items) == 5


@pytest.mark.parametrize("fewer", [1, 0])
def test_fewer_rows_than_two_blocks_are_one_register_block(fewer: int) -> None:
    """A product of fewer rows than two register blocks (a sequence of 7 where a block
    holds 4 rows) keeps all of them in one block, each weight read once, rather than one
    row at a time through memory."""
    config = DefaultConfig(threads=2)
    rows = 2 if fewer else 2 * config.rows - 1
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(rows, 64), B=(64, 96))
    schedule = default_schedule(k, config)
    ast = build_ast(schedule)
    unrolled = [f for n in ("i", "i1") for f in _fors(ast, n) if f.annotation == "unroll"]
    assert [_trips(f) for f in unrolled] == [rows], schedule.trace_json()
    native = NativeKernel(schedule)
    assert _promoted(native.ir, "k") == len(_fors(ast, "k"))
    inputs = native.random_inputs(seed=rows)
    np.testing.assert_allclose(
        native.outputs(inputs)["Y"], inputs["A"] @ inputs["B"], rtol=1e-5, atol=1e-5
    )


def test_a_guard_on_the_rows_is_their_count() -> None:
    """isl may bound the rows by a test in the unrolled loop (`i1 <= 6` holding
    `if (n % 8 >= i1 + 1)`): that is the same run-time count, split the same way."""
    k = kernel("S[i] += X[i, k]", X=(7, 5))
    calls = Call("S", (Var("i1"), Var("k")))
    guard = Op("ge", (Op("pdiv_r", (Var("n"), Int(8))), Op("add", (Var("i1"), Int(1)))))
    rows = For(
        "i1", Int(0), Op("le", (Var("i1"), Int(6))), Int(1), If(guard, calls), "i1", "unroll"
    )
    nest = For("k", Int(0), Op("lt", (Var("k"), Int(5))), Int(1), rows, "k")
    out = split_partial_rows(nest, k)
    assert isinstance(out, Block) and len(out.items) == 7
    first = out.items[0]
    assert isinstance(first, If) and isinstance(first.then, For)
    block = first.then.body
    assert isinstance(block, For) and block.cond == Op("lt", (Var("i1"), Int(7)))
    assert block.body == calls  # the guard is gone: the block's count is the test


def test_a_count_that_also_runs_full_tiles_takes_powers_of_two() -> None:
    """`i1 <= min(7, n - 8 * i0 - 1)` runs the full tiles of 8 rows and the last one: a
    block of 8 first, then 4, 2 and 1 (four copies, not eight)."""
    k = kernel("S[i] += X[i, k]", X=("n", 5))
    end = Op(
        "min", (Int(7), Op("sub", (Op("sub", (Var("n"), Op("mul", (Int(8), Var("i0"))))), Int(1))))
    )
    calls = Call("S", (Var("i1"), Var("k")))
    rows = For("i1", Int(0), Op("le", (Var("i1"), end)), Int(1), calls, "i1", "unroll")
    nest = For("k", Int(0), Op("lt", (Var("k"), Int(5))), Int(1), rows, "k")
    out = split_partial_rows(nest, k)
    assert isinstance(out, Block)
    sizes = []
    for item in out.items:
        assert isinstance(item, If) and isinstance(item.then, For)
        block = item.then.body
        assert isinstance(block, For) and isinstance(block.cond, Op)
        sizes.append(block.cond.args[1])
    assert sizes == [Int(8), Int(4), Int(2), Int(1)]
