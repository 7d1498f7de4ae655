"""`init_fills_tile`: whether a reduction's init writes exactly its register tile's
elements in every iteration of the loops around the reduction (checked with isl)."""

from __future__ import annotations

import pytest

from polytile.poly.analysis.tile_init import init_fills_tile
from polytile.poly.dsl import kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform import steps as T

MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(32, 24), B=(24, 30))


def _tiled(decompose_at: str) -> Schedule:
    steps = [
        ("split", {"loop": "i", "factors": (None, 16)}),
        ("split", {"loop": "j", "factors": (None, 14)}),
        ("reorder", {"order": ("i0", "j0", "k", "j1", "i1")}),
        ("decompose_reduction", {"stmt": "Y", "loop": decompose_at}),
    ]
    return T.replay(MATMUL, [{"kind": kind, "args": args} for kind, args in steps])


@pytest.mark.parametrize(("decompose_at", "fills"), [("k", True), ("j0", False)])
def test_the_init_fills_the_tile_only_when_placed_in_it(decompose_at: str, fills: bool) -> None:
    # before `k`: the init of each (i0, j0) tile writes that tile (partial tiles too);
    # before `j0`: it runs once per row block, outside the pixel tiles the reduction uses
    assert init_fills_tile(_tiled(decompose_at), "Y_init", "Y", "k") is fills


def test_a_whole_reduction_without_loops_around_compares_the_written_sets() -> None:
    schedule = T.replay(
        MATMUL,
        [
            {"kind": "reorder", "args": {"order": ("k", "i", "j")}},
            {"kind": "decompose_reduction", "args": {"stmt": "Y", "loop": "k"}},
        ],
    )
    assert init_fills_tile(schedule, "Y_init", "Y", "k")
