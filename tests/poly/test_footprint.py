"""Tile footprints from isl: exact work and elements per tile at each loop depth."""

from __future__ import annotations

from polytile.poly import transform as T
from polytile.poly.dsl import kernel
from polytile.poly.footprint import footprints
from polytile.poly.schedule import initial_schedule


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
