"""The rules of the default's matrix-product plan: which loop it blocks in registers and
how many rows (`register_block`, `window_block`), how many vectors a row holds
(`row_vectors`), its cache tiles (`cache_tiles`, `cache_rows`), which inputs it packs
(`packed_inputs`) and whether its vector tiles go outermost (`tiles_first`,
`weights_first`, `tile_band`). Each derives one decision of the sketch
(`poly.default.decide`) from the kernel and the target's settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from polytile.poly.default.steps import (
    DefaultConfig,
    depends,
    moving_reductions,
    operand_bytes,
    uniform_in_blocks,
)
from polytile.poly.ir.expr import Load, loads
from polytile.poly.ir.kernel import Kernel, Role, Statement


def register_block(
    vec_loads: list[Load],
    spatial: list[str],
    dim_of: Mapping[str, str],
    extent: Mapping[str, int],
    config: DefaultConfig,
) -> tuple[str | None, int]:
    """The loop a matrix-product plan blocks in registers, and its rows: the innermost
    spatial loop (the vector loop aside, loops that run once skipped) that no operand of
    the vectors moves with, in `gemm_block` rows where it holds two blocks of
    `config.rows`. Or one that they move with only by group, as a grouped conv's input
    channel `68*floor(m/68) + c`, in the most rows that never straddle a group
    (ShuffleNet's grouped 1x1 convs, 68 channels a group). A loop the operands do not
    move with that is too short for two blocks is one block of all its rows (a product
    of 7 rows: each weight read once, not once a row). (None, `config.rows`) when none
    holds."""
    for name in reversed(spatial[:-1]):
        dim, length = dim_of[name], extent[name]
        if length == 1:  # a loop that runs once (a [50, 1, 768] operand's middle axis)
            continue
        if all(not depends(ld.index, dim) for ld in vec_loads):
            if length >= 2 * config.rows:
                return name, gemm_block(length, config)
            if length >= 2:  # too short for two blocks: all its rows in one
                return name, length
            break
        for rows in range(gemm_block(length, config), 1, -1):
            if length >= 2 * rows and all(
                uniform_in_blocks(ld.index, dim, rows) for ld in vec_loads
            ):
                return name, rows
    return None, config.rows


def window_block(
    main: Statement,
    spatial: list[str],
    reduce: list[str],
    dim_of: dict[str, str],
    extent: Mapping[str, int],
    rows: int,
) -> str | None:
    """The loop a pooling window blocks in registers: the outermost spatial loop long
    enough for two blocks that the window does not slide along (the channels). No
    operand is reused across it, but its `rows` accumulators are independent chains of
    loads and max / sum over separate planes, where one row's window is a serial chain.
    None for other reductions (no reduction loop moves along the vector loop)."""
    if not moving_reductions(main, reduce, dim_of, spatial[-1]):
        return None
    return next(
        (
            n
            for n in spatial[:-1]
            if extent[n] >= 2 * rows and not moving_reductions(main, reduce, dim_of, n)
        ),
        None,
    )


def row_vectors(extent: int, width: int, config: DefaultConfig, rows: int = 0) -> int:
    """Vectors a register-blocked row holds: two where the row has four or more (twice
    the independent accumulators), even when they do not divide it, since the AST
    generator emits the full tiles apart and the remainder costs less than the chains
    gain (see benchmarks/results/models-*.md). Three where a block of
    `rows` (0: none) still leaves a weight broadcast and the row's operand vectors in
    registers (`config.wide_rows`, 32 registers: 8 rows x 3): each loaded weight feeds
    more FMAs."""
    # 3 x rows accumulators, three operand vectors, a broadcast and four spare
    if (
        config.row_vector_limit == 3
        and rows > 0
        and 3 * rows + 8 <= config.vector_registers
        and extent >= 6 * width
    ):
        return 3
    return 2 if extent >= 4 * width else 1


def cache_tiles(
    reduce_extents: list[int], vec_tiles: int, config: DefaultConfig
) -> tuple[int, int] | None:
    """A long single reduction (a big GEMM's k) under many vector tiles: the reduction
    split by `cache_reduction` and the vector tiles grouped by `cache_columns`, so one
    panel of the streamed operand (cache_reduction × cache_columns vectors) stays in
    L2 while the rows walk over it. None when the kernel is too small to need it."""
    if len(reduce_extents) != 1 or reduce_extents[0] < 2 * config.cache_reduction:
        return None
    if vec_tiles < 2 * config.cache_columns:
        return None
    return config.cache_reduction, config.cache_columns


def cache_rows(blocks: int, config: DefaultConfig) -> int:
    """Register blocks of rows that walk over one cache tile (`cache_tiles`: a panel of B,
    cache_reduction x cache_columns vectors) before the next tile, or 0 for no bands.
    With the row blocks outside the tiles every block re-reads all of B, from L3 once it
    outgrows L2; a band of `config.cache_rows` blocks reads each panel from L2 instead,
    as BLAS's row panel of A does (see benchmarks/results/gemm-*.md). Where one band
    holds every block (a transformer's MLP over 50 tokens) the blocks all sit below the
    tile: with them outside, each re-read all of B, which outgrows L2."""
    return config.cache_rows if config.cache_rows > 0 and blocks > 1 else 0


def packed_inputs(
    kernel: Kernel,
    main: Statement,
    vec_dim: str,
    block_dim: str | None,
    panel_rows: int,
    reuse: int,
    config: DefaultConfig,
) -> tuple[str, ...]:
    """The input operands a matrix-product plan copies into vector panels (`poly.pack`,
    as BLAS packs B). An operand read along the vectors' dim but not the blocks' is
    re-read as a panel of `panel_rows` rows (the reduction's cache tile) by each of
    `reuse` register blocks. Packed, a panel is one contiguous stream. It pays where:
    - the vectors run across its rows (a transposed operand): every lane is a load of
      its own;
    - or its rows lie so nearly a multiple of L1's way apart that at least four times
      its ways of panel rows share one set (1024 floats apart: all 256 in one), and it
      outgrows L2 (smaller ones stay there, so the copy only costs). ResNet-50's 1x1
      convs over 56x56 pixels, rows 3136 floats apart, put 16 rows in each of 16 sets
      and lose time packed, so they are left alone.
    And only when at least `pack_reuse` blocks re-read it: the copy is one more pass,
    which a few blocks do not repay (see benchmarks/results/gemm-*.md)."""
    found = []
    for ld in loads(main.expr):
        t = kernel.tensors.get(ld.tensor)
        if t is None or t.role is not Role.INPUT or len(t.shape) < 2 or vec_dim not in ld.index:
            continue
        if block_dim is not None and depends(ld.index, block_dim):
            continue
        size = np.dtype(t.dtype).itemsize
        strides = [math.prod(t.shape[a + 1 :]) * size for a in range(len(t.shape))]
        gathered = ld.index.index(vec_dim) != len(t.shape) - 1
        rows = [strides[a] for a, e in enumerate(ld.index) if e in main.reduction_dims]
        way = config.l1_way_bytes
        aliased = any(panel_rows * math.gcd(r, way) // way >= 4 * config.l1_ways for r in rows)
        large = math.prod(t.shape) * size > config.cache_bytes
        if (gathered or (aliased and large)) and reuse >= config.pack_reuse:
            found.append(t.name)
    return tuple(found)


def tiles_first(
    kernel: Kernel, stmt: str, vec_dim: str, block_dim: str, config: DefaultConfig
) -> bool:
    """Whether the vector tiles go outside the register blocks. An operand indexed by
    the vectors' dim but not the blocks' (a 1x1 conv's input, B of a matrix product) is
    read whole once per block; larger than L2, it then streams from memory each time,
    while one tile of it stays in cache across all the blocks (ResNet-50's 256-channel
    1x1 convs at 56x56, 3.2 MB)."""
    return operand_bytes(kernel, stmt, vec_dim, block_dim) > config.cache_bytes


def tile_band(kernel: Kernel, main: Statement, tiles: int, config: DefaultConfig) -> int:
    """Vector tiles a band holds when a matrix-product plan walks its tiles first and its
    output outgrows L2 (0: no bands): each register block then writes a band of tiles,
    one run of `band` tiles a row, before the next block, where a single tile left its
    output (and a residual read in place) as pieces of a few lines in each of hundreds of
    rows, too many streams for the prefetchers. The band count splits evenly among the
    threads; among those sizes, the one nearest `config.band_tiles`. Where the output
    fits L2 (ResNet-50's 256->64 convs at 56x56, its 28x28 convs) bands only cost, so
    there are none."""
    if not config.band_tiles:
        return 0
    out = kernel.tensors[main.tensor]
    if math.prod(out.shape) * np.dtype(out.dtype).itemsize <= config.cache_bytes:
        return 0
    threads = max(1, config.threads)

    def longest(size: int) -> int:  # the most tiles a thread's bands hold
        bands = -(-tiles // size)
        return min(tiles, -(-bands // threads) * size)

    sizes = range(max(2, config.band_tiles // 2), 2 * config.band_tiles + 1)
    best = min(sizes, key=lambda b: (longest(b), abs(b - config.band_tiles)))
    return best if -(-tiles // best) >= threads else 0


def weights_first(
    kernel: Kernel,
    stmt: str,
    tiles: tuple[str, int],
    blocks: tuple[str, int],
    config: DefaultConfig,
) -> bool:
    """Whether a matrix-product plan walks its vector tiles outermost, without cache
    tiles: the operand read along the row blocks but not the vectors (a 1x1 conv's
    weights) fits a quarter of L2, the one read along the vectors but not the blocks
    (its input) outgrows an eighth, and re-reading the first per vector tile moves fewer
    bytes than re-reading the second per block. The weights then come from L2 for every
    pixel tile while each tile of the input stays in L1; with the blocks outside, every
    block re-reads the whole input. The bounds exclude where it lost: weights of half of
    L2 (the 1x1 convs at 14x14) and operands under an eighth of it (the transformer's
    attention); see benchmarks/results/models-*.md and gemm-*.md."""
    if not config.stream_weights:
        return False
    (vec_dim, vec_tiles), (block_dim, row_blocks) = tiles, blocks
    weights = operand_bytes(kernel, stmt, block_dim, vec_dim)
    streamed = operand_bytes(kernel, stmt, vec_dim, block_dim)
    fits = weights <= config.cache_bytes // 4 < 2 * streamed
    return fits and weights * vec_tiles < streamed * row_blocks


def gemm_block(extent: int, config: DefaultConfig) -> int:
    """Rows in registers of a matrix-product plan: twice `config.rows` (with AVX-512 8
    accumulators of one vector a row, 16 of two), enough independent FMA chains for two
    full-width pipes; `config.rows` when the loop cannot hold two such blocks."""
    rows = config.rows
    return 2 * rows if extent >= 4 * rows else rows
