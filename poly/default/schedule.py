"""The default schedule of a kernel, without search: what `compile` uses when no tuning
record applies.

For the main statement (the largest reduction: conv, matmul, pooling, norms) it builds a
register-blocked tile in the CPU style. A convolution-like reduction puts its channels in
vectors (`poly.default_conv`), unless its rows are long contiguous streams (a 1×1
convolution on flattened planes, `poly.flatten`). The others take the matrix-product plan
here: the innermost output dimension split by the vector width and vectorized (two or
three vectors a row, `row_vectors`), a second output dimension that the vectorized
operand does not depend on blocked in registers and unrolled (so one loaded vector is
reused by every row), the reduction loops between the tile loops and the register block,
a long reduction and the vector tiles cache-tiled (`cache_tiles`), the vector tiles
outermost when the other operand stays cached and is cheaper to re-read
(`weights_first`). Epilogue statements chained through temporaries (bias, residual add,
ReLU) are inlined into one first, and computed inside the output tile; the outer loops
are fused into one parallel loop (`poly.default_steps`). Other statements, and
elementwise kernels, get a parallel outer loop (when there is enough work) and a
vectorized inner loop. Every step is checked; an illegal one is skipped.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np

from polytile.errors import BudgetExceeded, IllegalSchedule
from polytile.poly.default.conv import plan_of, schedule_conv
from polytile.poly.default.steps import (
    DefaultConfig,
    attempt,
    compute_prologue,
    default_inlines,
    depends,
    epilogue,
    gather_inside,
    gathered_loops,
    main_statement,
    moving_reductions,
    narrow_vector,
    operand_bytes,
    pack_weights,
    parallelize_outer,
    split_init,
    uniform_in_blocks,
    vectorize_innermost,
)
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Load, loads
from polytile.poly.ir.kernel import Kernel, Role, Statement
from polytile.poly.ir.schedule import Loop, Schedule, initial_schedule, statements_below
from polytile.poly.transform import steps as T
from polytile.poly.transform.inline import inline_statement

#: isl operations and seconds one kernel's default schedule may take: as a search
#: candidate's build (`search.budget`), far above what the zoo's kernels take
DEFAULT_OPERATIONS = 40_000_000
DEFAULT_SECONDS = 60.0
#: isl operations the fallback may spend proving outer loops parallel (a dependence check
#: a nest, far cheaper than an AST generation's budget)
FALLBACK_OPERATIONS = 4_000_000


def default_schedule(kernel: Kernel, config: DefaultConfig | None = None) -> Schedule:
    """The kernel's default schedule, under a budget (`DEFAULT_OPERATIONS`,
    `DEFAULT_SECONDS`): a kernel whose default scheduling runs out of it gets
    `fallback_schedule`, with a warning naming it, rather than a hang."""
    refusal = f"kernel {kernel.name}: its default schedule went over budget"
    try:
        with ih.operation_budget(DEFAULT_OPERATIONS, refusal, DEFAULT_SECONDS, "default schedule"):
            return _default_schedule(kernel, config or DefaultConfig())
    except BudgetExceeded as err:
        ih.check_budget("default schedule")  # an outer budget ran out: not ours to handle
        warnings.warn(
            f"{err}; using a simpler schedule instead (the initial one, its outer loops "
            "parallel where legal)",
            stacklevel=2,
        )
        return fallback_schedule(kernel)


def fallback_schedule(kernel: Kernel) -> Schedule:
    """The initial schedule with each nest's outermost loop parallel where that is legal
    (and proved within the budget; else the initial schedule as it is)."""
    schedule = initial_schedule(kernel)
    refusal = f"kernel {kernel.name}: its fallback schedule went over budget"
    try:
        with ih.operation_budget(FALLBACK_OPERATIONS, refusal, DEFAULT_SECONDS, "fallback"):
            parallel = schedule
            for node in schedule.body:
                if isinstance(node, Loop):
                    parallel = attempt(parallel, lambda s, n=node.name: T.parallel(s, n))
            return parallel
    except BudgetExceeded:
        ih.check_budget("fallback schedule")
        return schedule


def _default_schedule(kernel: Kernel, config: DefaultConfig) -> Schedule:
    schedule = initial_schedule(kernel)
    main = main_statement(kernel)
    for stmt in default_inlines(kernel, main):
        schedule = attempt(schedule, lambda s, st=stmt: inline_statement(s, st))
    if main.reduction:
        schedule = _schedule_reduction(schedule, main, config)
    nest = _top_nest(schedule, main.name)
    done = set(statements_below(nest)) if nest is not None else {main.name}
    for nest in schedule.body:
        stmts = statements_below(nest)
        if isinstance(nest, Loop) and not set(stmts) & done:
            schedule = _schedule_simple(schedule, nest.name, config)
    if not main.reduction:  # an elementwise / injective kernel: its own nest too
        nest = _top_nest(schedule, main.name)
        if nest is not None and not any(lp.annotation for lp in schedule.loops_of(main.name)):
            schedule = _schedule_simple(schedule, nest.name, config)
    return schedule


def _top_nest(schedule: Schedule, stmt: str) -> Loop | None:
    """The outermost loop around `stmt`; None for a statement over a 0-d domain."""
    for node in schedule.body:
        if stmt in statements_below(node):
            return node if isinstance(node, Loop) else None
    raise IllegalSchedule(f"no nest holds {stmt}")


def _schedule_reduction(schedule: Schedule, main: Statement, config: DefaultConfig) -> Schedule:
    names = [loop.name for loop in schedule.loops_of(main.name)]
    dim_of = dict(zip(names, main.dims, strict=True))
    spatial = [n for n in names if dim_of[n] not in main.reduction_dims]
    reduce = [n for n in names if dim_of[n] in main.reduction_dims]
    if not spatial:
        return _schedule_simple(schedule, names[0], config)
    conv = plan_of(schedule, main, spatial, dim_of, config)
    if conv is not None:
        return schedule_conv(schedule, main, spatial, reduce, dim_of, conv, config)
    vec = spatial[-1]
    vec_dim = dim_of[vec]
    vec_loads = [ld for ld in loads(main.expr) if depends(ld.index, vec_dim)]
    width = narrow_vector(T.loop_extent(schedule, vec), config.vector_width)
    outer, inner = list(spatial), []
    v0 = vec
    extent = T.loop_extent(schedule, vec)
    extents = {n: T.loop_extent(schedule, n) for n in spatial}
    block, rows = register_block(vec_loads, spatial, dim_of, extents, config)
    factor = row_vectors(extent, width, config, rows if block is not None else 0) * width
    if block is None:  # no loop long enough for two register blocks of the matrix-product plan
        block = window_block(main, spatial, reduce, dim_of, extents, rows)
    block_dim = dim_of[block] if block is not None else None
    reduce_extents = [T.loop_extent(schedule, r) for r in reduce]
    tiles = cache_tiles(reduce_extents, -(-extent // factor) if extent >= 2 * width else 0, config)
    panel = tiles[0] if tiles is not None else math.prod(reduce_extents)
    blocks = -(-T.loop_extent(schedule, block) // rows) if block is not None else 1
    inputs = packed_inputs(schedule.kernel, main, vec_dim, block_dim, panel, blocks, config)
    schedule = pack_weights(
        schedule,
        main.name,
        ((vec_dim if extent >= 2 * width else None, factor), (block_dim, rows)),
        inputs,
    )
    if extent >= 2 * width:
        try:
            schedule, (v0, v1) = T.split_named(schedule, vec, (None, factor))
            outer[outer.index(vec)] = v0
            inner.append(v1)
        except IllegalSchedule:
            pass
    blocked = None
    if block is not None:
        try:
            schedule, (b0, blocked) = T.split_named(schedule, block, (None, rows))
            outer[outer.index(block)] = b0
            inner.insert(0, blocked)
        except IllegalSchedule:
            pass
    reduce_outer, middle, reduce_inner = list(reduce), [], []
    if v0 == vec:  # the vector loop was not split: no vector tiles to group
        tiles = None
    first = (
        v0 != vec
        and block is not None
        and weights_first(
            schedule.kernel, main.name, (vec_dim, -(-extent // factor)), (block_dim, blocks), config
        )
    )
    if first:  # the tiles outermost, each reading all the (cached) weights
        tiles = None
    if tiles is not None:  # B's panel stays in cache while the rows of A stream by
        try:
            schedule, (c0, c1) = T.split_named(schedule, v0, (None, tiles[1]))
            schedule, (r0, r1) = T.split_named(schedule, reduce[0], (None, tiles[0]))
            outer[outer.index(v0)] = c0
            reduce_outer, middle, reduce_inner = [r0], [c1], [r1]
            reduce = [r0, r1]
            row_blocks = T.loop_extent(schedule, b0) if blocked else 0
            rows_tile = cache_rows(row_blocks, config)
            if rows_tile >= row_blocks > 1:  # one band holds every block
                outer.remove(b0)
                middle.insert(0, b0)
            elif rows_tile:  # a band of A's rows walks over the panel while it is in L2
                schedule, (a0, a1) = T.split_named(schedule, b0, (None, rows_tile))
                outer[outer.index(b0)] = a0
                middle.insert(0, a1)
        except IllegalSchedule:
            pass
    gathered = [n for n in gathered_loops(schedule.kernel, main, spatial, dim_of) if n in outer]
    if gathered:  # the vector loop is the last spatial one: its tiles are the row tiles
        row = outer[len(spatial) - 1]
        outer = gather_inside(schedule, main, outer, gathered, [], row, config)
    elif (
        tiles is None
        and v0 != vec
        and block is not None
        and (first or tiles_first(schedule.kernel, main.name, vec_dim, dim_of[block], config))
    ):
        outer.remove(v0)
        outer.insert(0, v0)
        band = tile_band(schedule.kernel, main, T.loop_extent(schedule, v0), config) if first else 0
        if band:
            try:
                schedule, (v_band, v_tile) = T.split_named(schedule, v0, (None, band))
                outer = [v_band, *outer[1:], v_tile]
            except IllegalSchedule:
                pass
    order = [*outer, *reduce_outer, *middle, *reduce_inner, *inner]
    if order != [loop.name for loop in schedule.loops_of(main.name)]:
        schedule = attempt(schedule, lambda s: T.reorder(s, *order))
    current = [loop.name for loop in schedule.loops_of(main.name)]
    schedule, above = split_init(schedule, main.name, current, reduce)
    tile_loop = gathered[-1] if gathered else [n for n in above if n not in inner][-1]
    for stmt in epilogue(schedule.kernel, main):
        schedule = attempt(schedule, lambda s, st=stmt: T.reverse_compute_at(s, st, tile_loop))
    innermost = current[-1]
    if innermost in inner and innermost.startswith(vec):
        schedule = attempt(schedule, lambda s: T.vectorize(s, innermost))
    if blocked is not None:
        # unrolled, its accumulators stay in registers, also where the vector loop was
        # too short to split (a pooling window over 7 columns): in memory, every window
        # element is a load, an add and a store, and their time swings between two
        # compilations of the same code
        schedule = attempt(schedule, lambda s: T.unroll(s, blocked))
    for stmt in epilogue(schedule.kernel, main):
        schedule = vectorize_innermost(schedule, stmt, config.vector_width)
    init = next((s.name for s in schedule.kernel.statements if s.init_of == main.name), None)
    if init is not None:
        schedule = vectorize_innermost(schedule, init, config.vector_width)
    schedule = compute_prologue(schedule, main.name, config.vector_width)
    return parallelize_outer(schedule, main.name, config)


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
    (ShuffleNet's grouped 1x1 convs, 68 channels a group). (None, `config.rows`) when
    neither holds two blocks."""
    for name in reversed(spatial[:-1]):
        dim, length = dim_of[name], extent[name]
        if length == 1:  # a loop that runs once (a [50, 1, 768] operand's middle axis)
            continue
        if all(not depends(ld.index, dim) for ld in vec_loads):
            if length >= 2 * config.rows:
                return name, gemm_block(length, config)
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


def _schedule_simple(schedule: Schedule, nest: str, config: DefaultConfig) -> Schedule:
    """A nest without a reduction to block: parallel outside, vector inside."""
    stmts = statements_below(schedule.loop(nest))
    for stmt in stmts:
        schedule = vectorize_innermost(schedule, stmt, config.vector_width)
    return parallelize_outer(schedule, stmts[0], config)
