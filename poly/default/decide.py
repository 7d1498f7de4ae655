"""The default decisions of a kernel's sketch (`poly.default.sketch`): what the default
schedule is, as a record of decisions like any the search makes. A convolution-like
reduction takes the conv plan (`poly.default.conv`: channels in vectors, rows in
registers), another reduction the matrix-product plan (`poly.default.rules`: the
innermost output dim in vectors, a second dim blocked in registers, long reductions and
the vector tiles cache-tiled, the vector tiles outermost where that streams less);
elementwise chains around the main statement are inlined (`default_inlines`), and every
other choice takes the default's rule (the epilogue in the output tile, unrolled
blocks, the outer loops fused into one parallel loop as `parallelize_outer` decides).
"""

from __future__ import annotations

import math
from typing import Any

from polytile.poly.default.conv import ConvPlan, panel_chunk, row_tiles, rows_first
from polytile.poly.default.rules import (
    cache_rows,
    cache_tiles,
    packed_inputs,
    register_block,
    row_vectors,
    tile_band,
    tiles_first,
    weights_first,
    window_block,
)
from polytile.poly.default.sketch import INLINE, OUTER_TILES, Decisions, Sketch
from polytile.poly.default.steps import default_inlines, depends, narrow_vector, pack_weights
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import mentions
from polytile.poly.ir.schedule import initial_schedule

#: the shortest row vectorized as one (masked) vector
MIN_WHOLE_ROW = 4


def default_decisions(sketch: Sketch) -> Decisions:
    """The default schedule's decisions for the sketch's kernel."""
    chained = default_inlines(sketch.kernel, sketch.main)
    vec_loop = sketch.spatial[-1] if sketch.spatial else None
    d: Decisions = {
        "vec_loop": vec_loop if vec_loop is not None and sketch.extent[vec_loop] > 2 else None,
        "vec": sketch.lanes,
        "pack": True,
        "block_loop": None,
        "block": sketch.config.rows,
        "block2_loop": None,
        "block2": 1,
        "low_reduce": False,
        "rtile_loop": None,
        "rtile": 0,
        "otile_loop": None,
        "otile": 0,
        "row_tile": 0,
        "outer_first": None,
        "band": 0,
        "epilogue_depth": 0,
        "unroll": True,
        "parallel_depth": None,
        "rfactor": 0,
        **{f"{INLINE}{s}": s in chained for s in sketch.inlinable},
    }
    if sketch.plan is not None:
        d.update(_conv(sketch, sketch.plan))
    elif sketch.main.reduction and sketch.spatial:
        d.update(_matrix_product(sketch))
    return d


def _conv(sketch: Sketch, plan: ConvPlan) -> dict[str, Any]:
    """The conv plan: channels in vectors, the row loop blocked in registers, padded
    windows below the block, the rows outermost where the input streams
    (`rows_first`), the channel tiles outside the gathered loops, the reduction chunked
    over few pixels (`panel_chunk`) or tiled where it is long (`stream_tile`)."""
    d: dict[str, Any] = {
        "vec_loop": plan.channel,
        "vec": plan.lanes,
        "block_loop": plan.row,
        "block": plan.block,
        "low_reduce": sketch.padded,
    }
    k, main, config = sketch.kernel, sketch.main, sketch.config
    d["outer_first"] = rows_first(
        k, main, sketch.spatial, sketch.dim_of, sketch.extent, plan, config
    )
    if sketch.gathered:  # the channel tiles outside the gathered loops
        d["outer_first"] = plan.channel
    chunk = panel_chunk(k, main, sketch.reduce, sketch.extent, plan, config)
    if chunk is not None:  # the pixel tiles all below the chunk
        tiles = row_tiles(sketch.extent, plan)
        d.update(rtile_loop=sketch.reduce[0], rtile=chunk)
        d.update(otile_loop=plan.row, otile=min(t for t in OUTER_TILES if t >= tiles))
    elif plan.tile:  # the channels in tiles
        d.update(rtile_loop=sketch.reduce[0], rtile=plan.tile)
    return d


def _matrix_product(sketch: Sketch) -> dict[str, Any]:
    """The matrix-product plan: the innermost output dim in vectors (`row_vectors` of
    them a row), a second one blocked in registers (`register_block`, else a pooling
    window's `window_block`), a long reduction and the vector tiles cache-tiled
    (`cache_tiles`, with bands of row blocks, `cache_rows`), or the vector tiles
    outermost (`weights_first`, `tiles_first`, in bands: `tile_band`)."""
    k, main, config = sketch.kernel, sketch.main, sketch.config
    vec = sketch.spatial[-1]
    vec_dim = sketch.dim_of[vec]
    extent = sketch.extent[vec]
    vec_loads = [ld for ld in loads(main.expr) if depends(ld.index, vec_dim)]
    # a row of a box domain that its operands hold contiguously may be one masked vector:
    # every tap's piece starts at the row's start, so all share its register accumulators
    # (a padded domain's edge pieces start apart, and their masked vectors' accumulators
    # would overlap; a row along channels, as a global pool reads them, gathers each lane)
    contiguous = all(mentions(str(ld.index[-1]), vec_dim) for ld in vec_loads)
    lane = sketch.lane_loop
    if not contiguous and lane is not None and sketch.extent[lane] >= sketch.lanes:
        # rows reduced along their contiguous dim (softmax's max, a norm's mean): the
        # vectors load the row and their lanes reduce into its element, rather than
        # gathering across rows
        width = narrow_vector(sketch.extent[lane], sketch.lanes, not sketch.padded)
        return {"vec_loop": lane, "vec": width, "block_loop": None, "pack": False}
    masked = not sketch.padded and contiguous
    width = narrow_vector(extent, sketch.lanes, masked)
    block, rows = register_block(vec_loads, sketch.spatial, sketch.dim_of, sketch.extent, config)
    factor = row_vectors(extent, width, config, rows if block is not None else 0) * width
    if block is None:  # no loop long enough for two register blocks
        spatial, reduce = sketch.spatial, sketch.reduce
        block = window_block(main, spatial, reduce, sketch.dim_of, sketch.extent, rows)
    split = extent >= 2 * width
    # a row no longer than one vector is that vector, masked past its end
    whole = masked and not split and MIN_WHOLE_ROW <= extent <= width
    vec_tiles = -(-extent // factor)
    reduce_extents = [sketch.extent[r] for r in sketch.reduce]
    tiles = cache_tiles(reduce_extents, vec_tiles, config) if split else None
    d: dict[str, Any] = {
        "vec_loop": vec if split or whole else None,
        "vec": factor,
        "block_loop": block,
        "block": rows,
    }
    blocks = -(-sketch.extent[block] // rows) if block is not None else 1
    block_dim = sketch.dim_of[block] if block is not None else None
    # the operands' sizes as packed (a panel's last vector padded whole) decide the order
    panel = tiles[0] if tiles is not None else math.prod(reduce_extents)
    inputs = packed_inputs(k, main, vec_dim, block_dim, panel, blocks, config)
    packs = ((vec_dim if split else None, factor), (block_dim, rows))
    k = pack_weights(initial_schedule(k), main.name, packs, inputs).kernel
    first = (
        split
        and block_dim is not None
        and weights_first(k, main.name, (vec_dim, vec_tiles), (block_dim, blocks), config)
    )
    if first:  # the tiles outermost, each reading all the (cached) weights
        tiles = None
    if tiles is not None:  # B's panel stays in cache while the rows of A stream by
        d.update(rtile_loop=sketch.reduce[0], rtile=tiles[0], otile_loop=vec, otile=tiles[1])
        if block is not None:
            d["row_tile"] = cache_rows(blocks, config)
    elif (
        split
        and block is not None
        and not sketch.gathered
        and (first or tiles_first(k, main.name, vec_dim, block_dim, config))
    ):
        d["outer_first"] = vec
        d["band"] = tile_band(k, main, vec_tiles, config) if first else 0
    return d
