"""Tile footprints from isl: exact work and elements per tile at each loop depth."""

from __future__ import annotations

from polytile.poly.analysis.footprint import footprints
from polytile.poly.dsl import kernel
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.transform import steps as T


def test_matmul_tile_footprints() -> None:
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(8, 6), B=(6, 8))
    schedule = initial_schedule(k)
    schedule, (j0, j1) = T.split_named(schedule, "j", (None, 4))
    schedule = T.reorder(schedule, "i", j0, "k", j1)
    tiles = {t.loop: t for t in footprints(schedule, "Y")}
    # one i: a row of Y (8), a row of A (6) and all of B (48); 48 instances
    assert (tiles["i"].work, tiles["i"].elements, tiles["i"].written) == (48, 8 + 6 + 48, 8)
    # one (i, j0): 4 outputs, a row of A, a 6 x 4 block of B; 24 instances
    assert (tiles[j0].work, tiles[j0].elements) == (24, 4 + 6 + 24)
    # one (i, j0, k): 4 instances reading 1 element of A and 4 of B into 4 outputs
    assert (tiles["k"].work, tiles["k"].elements, tiles["k"].written) == (4, 4 + 1 + 4, 4)
    assert (tiles[j1].work, tiles[j1].elements) == (1, 3)


def test_cache_lines_and_innermost_strides() -> None:
    from polytile.poly.analysis.footprint import innermost_strides

    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(8, 16), B=(16, 32))
    schedule = initial_schedule(k)
    tiles = {t.loop: t for t in footprints(schedule, "Y")}
    # one i: a row of Y (32 floats: 2 lines), a row of A (1 line), all of B (16 rows x 2)
    assert tiles["i"].lines == 2 + 1 + 32
    # one (i, j): Y (1 line), a row of A (1 line), a column of B (16 rows, 1 line each)
    assert tiles["j"].lines == 1 + 1 + 16
    # along k: Y stays, A moves by one element, B by a row of 32
    assert innermost_strides(schedule, "Y") == [0, 1, 32]
    swapped = T.reorder(schedule, "i", "k", "j")
    assert innermost_strides(swapped, "Y") == [1, 0, 1]
