"""The default schedule of a kernel, without search: what `compile` uses when no tuning
record applies.

For the main statement (the largest reduction: conv, matmul, pooling, norms) it builds a
register-blocked tile in the CPU style: the innermost output dimension split by the vector
width and vectorized, a second output dimension that the vectorized operand does not
depend on blocked by 4 and unrolled (so one loaded vector is reused by 4 accumulators),
the reduction loops between the tile loops and the register block, the init placed just
before the reduction loops, every epilogue statement computed inside the output tile, and
the outer loops fused into one parallel loop; its vector tiles go outermost when the
other operand stays cached and is cheaper to re-read (`weights_first`). A
convolution-like reduction puts its channels in vectors instead (`conv_plan`), unless its
rows are long contiguous streams (a 1×1 convolution on flattened planes,
`poly.flatten`); its output rows go outside the channel blocks when its input outgrows
L2 and its weights are cheaper to re-read (`rows_first`), over few pixels it reduces a
chunk of channels at a time over all its pixel tiles (`panel_chunk`), and a 1×1
convolution with a long reduction fills the registers and tiles its channels
(`stream_tile`). Epilogue
statements chained through temporaries (bias, residual add, ReLU) are inlined into one
first. Other statements, and elementwise kernels, get a parallel outer loop (when there
is enough work) and a vectorized inner loop. Every step is checked; an illegal one is
skipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polytile.errors import IllegalSchedule

from . import isl_helpers as ih
from . import transform as T
from .expr import Const, Load, loads
from .inline import inline_statement
from .kernel import Kernel, Role, Statement, mentions
from .schedule import Loop, Schedule, initial_schedule, statements_below
from .tiles import has_partial_tiles


@dataclass(frozen=True)
class DefaultConfig:
    vector_width: int = 8  # float32 lanes of a 256-bit vector
    #: rows of a register block (see `rows`); None: what the vector registers hold
    register_block: int | None = None
    threads: int = 2
    min_parallel_extent: int = 2
    #: statement instances below which a kernel runs on one thread: waking the others
    #: costs more than they would save
    min_parallel_work: int = 16384
    #: the cache tile of a long reduction and of the vector tiles (see `cache_tiles`)
    cache_reduction: int = 256
    cache_columns: int = 8
    #: register blocks of rows that walk over one cache tile before the next (see
    #: `cache_rows`; 0: all of them)
    cache_rows: int = 16
    #: an operand larger than this (a core's L2: compile gives the host's), re-read for
    #: every register block, is walked tile by tile instead (see `tiles_first`). A Zen 3's
    #: 512 KB against 1 MB: ResNet-50 1.26 -> 1.20x onnxruntime's latency, same turns
    cache_bytes: int = 1 << 20
    #: the chunk of a conv plan's weights that stays in L1 across its pixel tiles (see
    #: `panel_chunk`)
    panel_bytes: int = 8192
    #: a 1×1 conv on channel vectors (over few pixels) fills the registers and tiles its
    #: channels when it reduces over at least this many (see `_long_reduction`; 0: never)
    stream_reduction: int = 512
    #: a matrix-product plan may walk its vector tiles outermost (see `weights_first`)
    stream_weights: bool = True
    #: a matrix-product plan's register-blocked rows may hold three vectors (see
    #: `row_vectors`)
    wide_rows: bool = True
    #: L1 as the panels of an input operand see it: rows `l1_way_bytes` apart share a set,
    #: which holds `l1_ways` lines (32 KB, 8 ways on x86 cores; see `packed_inputs`)
    l1_way_bytes: int = 4096
    l1_ways: int = 8
    #: the fewest register blocks that must re-read a packed input's panels to repay the
    #: copy (see `packed_inputs`)
    pack_reuse: int = 4

    @property
    def vector_registers(self) -> int:
        """Vector registers of the ISA whose width this is: AVX-512 has 32, AVX and SSE 16."""
        return 32 if self.vector_width >= 16 else 16

    @property
    def rows(self) -> int:
        """Rows of a register block; plans take twice that where the loop is long enough
        (`gemm_block`, `conv_plan`), at two vectors a row. With 32 registers 4: 16
        accumulators. With 16 registers 3, as BLIS's 6x16 Haswell kernel: 12
        accumulators, two operand vectors and a broadcast. With 4 the accumulators alone
        filled the 16 registers and spilled (a 2-vCPU Zen 3, ResNet-50's 1x1 convs 0.89-
        2.69 -> 0.56-1.48 ms a call alone; the model 1.58-1.69 -> 1.26-1.30x onnxruntime's
        latency, same turns)."""
        if self.register_block is not None:
            return self.register_block
        return 4 if self.vector_registers >= 32 else 3


def _try(schedule: Schedule, fn: Callable[[Schedule], Schedule]) -> Schedule:
    try:
        return fn(schedule)
    except IllegalSchedule:
        return schedule


def depends(load_index: tuple, dim: str) -> bool:
    """Whether a load's index moves with `dim` (`2*oh + kh` does with oh)."""
    return any(mentions(str(i), dim) for i in load_index)


def main_statement(kernel: Kernel) -> Statement:
    """The statement doing the most work: the largest reduction, else the last one."""
    reductions = [s for s in kernel.statements if s.reduction]
    if reductions:
        return max(
            reductions,
            key=lambda s: (
                ih.box_volume(s.domain_set()),
                math.prod(kernel.tensors[s.tensor].shape),
            ),
        )
    return kernel.statements[-1]


def default_schedule(kernel: Kernel, config: DefaultConfig | None = None) -> Schedule:
    config = config or DefaultConfig()
    schedule = initial_schedule(kernel)
    main = main_statement(kernel)
    for stmt in chained_epilogue(kernel, main):
        schedule = _try(schedule, lambda s, st=stmt: inline_statement(s, st))
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
    conv = _conv_plan(schedule, main, spatial, dim_of, config)
    if conv is not None:
        return _schedule_conv(schedule, main, spatial, reduce, dim_of, conv, config)
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
            rows_tile = cache_rows(T.loop_extent(schedule, b0), config) if blocked else 0
            if rows_tile:  # a band of A's rows walks over the panel while it is in L2
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
    order = [*outer, *reduce_outer, *middle, *reduce_inner, *inner]
    if order != [loop.name for loop in schedule.loops_of(main.name)]:
        schedule = _try(schedule, lambda s: T.reorder(s, *order))
    current = [loop.name for loop in schedule.loops_of(main.name)]
    first_reduce = next((n for n in current if n in reduce), None)
    if first_reduce is not None:
        schedule = _try(schedule, lambda s: T.decompose_reduction(s, main.name, first_reduce))
    above = current[: current.index(first_reduce)] if first_reduce is not None else current
    tile_loop = gathered[-1] if gathered else [n for n in above if n not in inner][-1]
    for stmt in epilogue(schedule.kernel, main):
        schedule = _try(schedule, lambda s, st=stmt: T.reverse_compute_at(s, st, tile_loop))
    innermost = current[-1]
    if innermost in inner and innermost.startswith(vec):
        schedule = _try(schedule, lambda s: T.vectorize(s, innermost))
    if blocked is not None:
        # unrolled, its accumulators stay in registers, also where the vector loop was
        # too short to split (a pooling window over 7 columns: in memory, every window
        # element was a load, an add and a store, whose time also swung 2-3x between two
        # compilations of the same code; Inception v1 0.785 -> 0.726x and v2 1.613 ->
        # 1.548x onnxruntime's latency, in the same turns)
        schedule = _try(schedule, lambda s: T.unroll(s, blocked))
    for stmt in epilogue(schedule.kernel, main):
        schedule = vectorize_innermost(schedule, stmt, config.vector_width)
    init = next((s.name for s in schedule.kernel.statements if s.init_of == main.name), None)
    if init is not None:
        schedule = vectorize_innermost(schedule, init, config.vector_width)
    schedule = compute_prologue(schedule, main.name, config.vector_width)
    return parallelize_outer(schedule, main.name, config)


def compute_prologue(schedule: Schedule, main: str, width: int) -> Schedule:
    """The main statement's padded input (`padded_inputs`) made inside its outermost loop,
    vectorized: copied one tile (of channels) at a time, while it stays in cache, rather
    than in a pass over the whole input (Inception v2's 3x3 AveragePools over 14x14, from
    152-161 us a call without the copy: 58 us with it as a pass of its own, 45 us inside
    the tile)."""
    tile = next(
        (lp.name for lp in schedule.loops_of(main) if T.loop_extent(schedule, lp.name) > 1), None
    )
    for stmt in padded_inputs(schedule.kernel, main) if tile else []:
        schedule = _try(schedule, lambda s, st=stmt: T.compute_at(s, st, tile))
        schedule = vectorize_innermost(schedule, stmt, width)
    return schedule


def padded_inputs(kernel: Kernel, main: str) -> list[str]:
    """The writers of each temporary that only `main` reads and that holds a padded copy:
    every writer copies a tensor or fills in a constant, and one fills (a pool's padded
    input, a fused constant Pad). Other producers (a fused BatchNorm and ReLU before a
    conv) stay in their own nests: computed per tile they were not measured."""
    readers: dict[str, set[str]] = {}
    for s in kernel.statements:
        for ld in loads(s.expr):
            readers.setdefault(ld.tensor, set()).add(s.name)
    found = []
    for name, t in kernel.tensors.items():
        writers = [s for s in kernel.statements if s.tensor == name]
        if (
            t.role is Role.TEMP
            and readers.get(name) == {main}
            and all(isinstance(w.expr, Load | Const) and w.init_of is None for w in writers)
            and any(isinstance(w.expr, Const) for w in writers)
        ):
            found += [w.name for w in writers]
    return found


def register_block(
    vec_loads: list[Load],
    spatial: list[str],
    dim_of: Mapping[str, str],
    extent: Mapping[str, int],
    config: DefaultConfig,
) -> tuple[str | None, int]:
    """The loop a matrix-product plan blocks in registers, and its rows: the innermost
    spatial loop (the vector loop aside) that no operand of the vectors moves with, in
    `gemm_block` rows where it holds two blocks of `config.rows`. Or one that they move
    with only by group, as a grouped conv's input channel `68*floor(m/68) + c`, in the
    most rows that never straddle a group (ShuffleNet's grouped 1x1 convs, 68 channels a
    group: 133 -> 99 and 138 -> 112 us warm with 4 rows instead of none). (None,
    `config.rows`) when neither holds two blocks."""
    for name in reversed(spatial[:-1]):
        dim, length = dim_of[name], extent[name]
        if all(not depends(ld.index, dim) for ld in vec_loads):
            if length >= 2 * config.rows:
                return name, gemm_block(length, config)
            break
        for rows in range(gemm_block(length, config), 1, -1):
            if length >= 2 * rows and all(
                _uniform_in_blocks(ld.index, dim, rows) for ld in vec_loads
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
    loads and max / sum over separate planes, where one row's window is a serial chain
    (ResNet-50's 3x3 MaxPool over 64 channels: 0.24 -> 0.12 ms warm). None for other
    reductions (no reduction loop moves along the vector loop)."""
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
    generator emits the full tiles apart (default schedules, same turns: ResNet-50
    0.94x, SqueezeNet 0.93x the time with two only where they divided the row; its
    1000-class 1x1 conv over 169 pixels 0.60 -> 0.50 ms a call). Three where a block of
    `rows` (0: none) still leaves a weight broadcast and the row's operand vectors in
    registers (`config.wide_rows`, 32 registers: 8 rows x 3): each loaded weight feeds
    more FMAs."""
    # 3 x rows accumulators, three operand vectors, a broadcast and four spare
    if (
        config.wide_rows
        and rows > 0
        and 3 * rows + 8 <= config.vector_registers
        and extent >= 6 * width
    ):
        return 3
    return 2 if extent >= 4 * width else 1


def narrow_vector(extent: int, width: int) -> int:
    """The vector width for a loop of `extent`: halved (down to 4 lanes) until the loop
    holds two vectors, so a short row (a pooling output of 28 with 16 lanes) runs in
    vectors of 8 rather than in scalars."""
    while width > 4 and extent < 2 * width:
        width = 1 << ((width - 1).bit_length() - 1)  # a power of two (48 -> 32)
    return width


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
    cache_reduction x cache_columns vectors) before the next tile, or 0 for all of them.
    With the row blocks outside the tiles every block re-reads all of B, from L3 once it
    outgrows L2; a band of `config.cache_rows` blocks reads each panel from L2 instead,
    as BLAS's row panel of A does (on a 2-vCPU Intel AVX-512 host, A·B 1024³ 165 -> 261
    GFLOPS, 2048³ 169 -> 246, numpy 293-305; ResNet-50's 1x1 convs over 512 channels
    at 28x28 0.70 -> 0.64 and 1.26 -> 1.02 ms a call, the model 1.2-3.7% faster; the
    other zoo models even)."""
    return config.cache_rows if 0 < config.cache_rows < blocks else 0


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
      its own (on a 2-vCPU Zen 3, A·Bᵀ at 1024³ 16 -> 174 GFLOPS, at 128³ 64 -> 94);
    - or its rows lie so nearly a multiple of L1's way apart that at least four times
      its ways of panel rows share one set (1024 floats apart: all 256 in one), and it
      outgrows L2 (smaller ones stay there: 128³ lost 79 -> 73 GFLOPS). A·B 1024³
      112 -> 177, 512³ 137 -> 173, 2048³ 65 -> 155 GFLOPS (numpy 185). ResNet-50's 1x1
      convs over 56x56 pixels, rows 3136 floats apart, put 16 rows in each of 16 sets
      and lost 10-22% packed, so they are left alone.
    And only when at least `pack_reuse` blocks re-read it: the copy is one more pass
    (A·B with 1024² B: 16 rows lost 79 -> 71 GFLOPS, 32 rows 104 -> 108, 64 rows
    106 -> 132)."""
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
    1x1 convs at 56x56, 3.2 MB: cold 1.0 -> 0.64 ms and 2.6 -> 1.5 ms)."""
    return _bytes(kernel, stmt, vec_dim, block_dim) > config.cache_bytes


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
    block re-read the whole input. On a 2-vCPU Intel AVX-512 host (2 MB L2), calls in
    the model: ResNet-50's 512->128 1x1 convs at 28x28 0.65-0.79 -> 0.38-0.39 ms
    (onnxruntime 0.40), 64->64 at 56x56 0.20 -> 0.13, 512->256 at 28x28 0.93 -> 0.78;
    the model 1.205-1.208 -> 1.151-1.163x onnxruntime's latency, DenseNet-121 1.028 ->
    0.955x, SqueezeNet 1.675 -> 1.339x, ShuffleNet 1.358 -> 1.307x, Inception v1 0.777
    -> 0.753x, v2 and the transformer even (same turns); alone, A·B with
    few rows of A: 24x512x512 233 -> 304, 64x1024x1024 118 -> 213, 128x1024x2048 154 ->
    255 GFLOPS (16x2048x2048 128 -> 112). Weights of half of L2
    (1 MB: the 1x1 convs at 14x14) lost 0.45 -> 0.53 ms, and operands under an eighth
    of it (the transformer's attention) lost 0.03 -> 0.06 ms."""
    if not config.stream_weights:
        return False
    (vec_dim, vec_tiles), (block_dim, row_blocks) = tiles, blocks
    weights = _bytes(kernel, stmt, block_dim, vec_dim)
    streamed = _bytes(kernel, stmt, vec_dim, block_dim)
    fits = weights <= config.cache_bytes // 4 < 2 * streamed
    return fits and weights * vec_tiles < streamed * row_blocks


def rows_first(
    kernel: Kernel,
    main: Statement,
    spatial: list[str],
    dim_of: Mapping[str, str],
    extent: Mapping[str, int],
    plan: ConvPlan,
    config: DefaultConfig,
) -> str | None:
    """The row loop a conv plan walks outside its channel blocks, or None. Each channel
    block reads the whole input; larger than L2 (`tiles_first`), it streams from memory
    once per block, while one band of input rows stays in cache across every block. The
    price is the weights, read whole once per row instead: taken while they fit half of
    L2 or while they move fewer bytes (rows x weights against blocks x input). Only a
    row loop long enough to share among the threads (four iterations each: 7 rows on 2
    threads lost 8%), so that it is parallel alone (a padded row fused into the parallel
    loop would take guards). On a 2-vCPU Zen 3 (512 KB L2), alone: the stride-2 stems of
    SqueezeNet, ZFNet-512 and AlexNet 2.13 -> 1.01, 5.92 -> 3.53 and 1.47 -> 1.32 ms a
    call, ResNet-50's stride-2 1x1 convs 1.42-1.69 -> 1.31-1.45 ms (one of four pairs
    even; compile now samples their input first, `sample_strided_1x1_convs`); ZFNet-512
    0.84 -> 0.80x onnxruntime's latency (same turns). Padded: ResNet-50's stride-2 3x3
    conv at 56x56 1.74 -> 1.54 ms, ShuffleNet's stem 198 -> 127 us, the 7x7 stems 1-5%
    faster; 3x3 convs of stride 1 (VGG-19's, ResNet-50's at 56x56) even. An input
    over half of L2 counts as outgrowing it: in the model each thread's L2 holds it
    beside its weights, and the threads of the kernel before wrote it in halves. On a
    2-vCPU Intel AVX-512 host (2 MB L2), ResNet-50's stride-2 3x3 conv over 1.6 MB
    took 1.245 -> 0.968 ms a call in the model, the model 32.77 -> 32.51 ms (21
    turns); the zoo's other models even."""
    channel = dim_of[plan.channel]
    for name in spatial:
        if name in (plan.channel, plan.row) or extent[name] < 4 * config.threads:
            continue
        if not any(depends(ld.index, dim_of[name]) for ld in loads(main.expr)):
            continue
        streamed = _bytes(kernel, main.name, dim_of[name], channel)
        if streamed <= config.cache_bytes // 2:  # the input stays in cache
            return None
        weights = _bytes(kernel, main.name, channel, dim_of[name])
        blocks = -(-extent[plan.channel] // plan.lanes)
        rows = extent[name]
        if weights <= config.cache_bytes // 2 or weights * rows < streamed * blocks:
            return name
        return None
    return None


def _bytes(kernel: Kernel, stmt: str, along: str, not_along: str) -> int:
    """The size of the tensors `stmt` reads along dim `along` but not `not_along`."""
    tensors = {
        ld.tensor
        for ld in loads(kernel.statement[stmt].expr)
        if depends(ld.index, along) and not depends(ld.index, not_along)
    }
    return sum(
        math.prod(kernel.tensors[t].shape) * np.dtype(kernel.tensors[t].dtype).itemsize
        for t in tensors
    )


#: the most pixel tiles `panel_chunk` puts below a weight chunk (the search space's
#: largest outer tile)
MAX_PANEL_TILES = 32


def panel_chunk(
    kernel: Kernel,
    main: Statement,
    reduce: list[str],
    extent: Mapping[str, int],
    plan: ConvPlan,
    config: DefaultConfig,
) -> int | None:
    """The chunk of input channels a conv plan reduces over at a time with all its pixel
    tiles below, or None. A channel block reads its weights (`lanes` x channels) once
    per pixel tile; where they outgrow L1 but the block's outputs are few (a 1x1 conv
    over 7x7 pixels), a chunk of `panel_bytes` of them stays in L1 across the tiles,
    whose accumulators are reloaded per chunk. Only a single unpadded reduction (a 1x1
    conv; 3x3 convs lost 18-65% at chunks of 64 and 128). On a 2-vCPU Zen 3: ResNet-50's
    512->2048 and 2048->512 1x1 convs over 7x7 alone 0.86 -> 0.73 ms and 0.96 -> 0.73 ms
    a call; the model 1.18 -> 1.15x onnxruntime's latency, DenseNet-121 1.02 -> 1.01x
    (same turns)."""
    if len(reduce) != 1 or not main.domain_set().is_box():
        return None
    size = np.dtype(kernel.tensors[main.tensor].dtype).itemsize
    units = config.panel_bytes // (plan.lanes * size)
    if units < 4:
        return None
    chunk = min(1 << (units.bit_length() - 1), config.cache_reduction)
    pixels = math.prod(e for n, e in extent.items() if n not in (plan.channel, *reduce))
    if extent[reduce[0]] < 2 * chunk or not 2 <= row_tiles(extent, plan) <= MAX_PANEL_TILES:
        return None
    return chunk if 2 * plan.lanes * pixels * size <= config.panel_bytes else None


def stream_tile(reduce: list[str], schedule: Schedule, config: DefaultConfig) -> int:
    """The channel tile of a 1×1 conv's channel plan with a long reduction (0: none): its
    register block's accumulators are reloaded once per `config.cache_reduction`
    channels. Measured, not understood: without the tiles LLVM spilled two of the 28
    accumulators in the channel loop (1024->256 over 14x14 pixels, alone: 412 -> 350 us
    with tiles of 64, 128 or 256 channels)."""
    if len(reduce) != 1 or T.loop_extent(schedule, reduce[0]) <= config.cache_reduction:
        return 0
    return config.cache_reduction


def row_tiles(extent: Mapping[str, int], plan: ConvPlan) -> int:
    """The register blocks a conv plan's row loop takes (the last one partial)."""
    return -(-extent[plan.row] // plan.block)


def gemm_block(extent: int, config: DefaultConfig) -> int:
    """Rows in registers of a matrix-product plan: twice `config.rows` (with AVX-512 8
    accumulators of one vector a row, 16 of two), enough independent FMA chains for two
    full-width pipes; `config.rows` when the loop cannot hold two such blocks. On a 2-vCPU
    Zen 5 (warm, default schedules): ResNet-50's 1x1 convs with a residual at 56x56,
    28x28 and 14x14 went from 334, 413 and 466 us with 4 rows to 298, 326 and 332 us."""
    rows = config.rows
    return 2 * rows if extent >= 4 * rows else rows


@dataclass(frozen=True)
class ConvPlan:
    """How a convolution-like reduction is register-blocked (also the search space's
    structural hint)."""

    weight: str
    axis: int
    #: the loop over output channels (vectorized) and the row loop (register-blocked)
    channel: str
    row: str
    lanes: int
    block: int
    #: its rows are contiguous (a 1×1 conv on flattened planes), which the
    #: matrix-product plan may vectorize instead
    streams: bool = False
    #: the tile of its reduction (`stream_tile`; 0: none)
    tile: int = 0


def conv_plan(kernel: Kernel, config: DefaultConfig, *, streaming: bool = False) -> ConvPlan | None:
    """The conv plan of a kernel's main statement, None when it is not conv-like.
    `streaming`: also when its rows stream (a 1×1 conv whose flattened pixels the
    default vectorizes instead), the other orientation the search space samples."""
    schedule = initial_schedule(kernel)
    main = main_statement(kernel)
    if not main.reduction:
        return None
    names = [loop.name for loop in schedule.loops_of(main.name)]
    dim_of = dict(zip(names, main.dims, strict=True))
    spatial = [n for n in names if dim_of[n] not in main.reduction_dims]
    return _conv_plan(schedule, main, spatial, dim_of, config, streaming=streaming)


def moving_reductions(
    main: Statement, reduce: list[str], dim_of: dict[str, str], row: str
) -> list[str]:
    """Reduction loops that move along `row` (one index entry uses both, as `ow + kw`):
    below the row's register block, the block's own bounds stay constant."""
    row_dim = dim_of[row]
    return [
        r
        for r in reduce
        if any(
            mentions(str(i), row_dim) and mentions(str(i), dim_of[r])
            for ld in loads(main.expr)
            for i in ld.index
        )
    ]


def _conv_plan(
    schedule: Schedule,
    main: Statement,
    spatial: list[str],
    dim_of: dict[str, str],
    config: DefaultConfig,
    *,
    streaming: bool = False,
) -> ConvPlan | None:
    """Convolution-like reductions: a constant operand (the weights) depends on an
    output dim (the channels) that no other operand depends on. Vectorizing that dim
    makes every tile full (channel counts are multiples of the vector width) whatever
    the image width, stride or padding; the row dim is blocked so that one loaded weight
    vector feeds several accumulators, each a broadcast input element."""
    if len(spatial) < 2:
        return None
    lanes = config.vector_width
    row = spatial[-1]
    row_dim = dim_of[row]
    # an epilogue gathering across the result takes channel vectors: vectors along its
    # rows split each of its pieces into full and partial tiles, which together exhaust
    # isl's AST budget (a Winograd conv's four output pieces over 16x16 tiles)
    gathers = bool(gathered_loops(schedule.kernel, main, spatial, dim_of))
    reduce = [n for n, d in dim_of.items() if d in main.reduction_dims]
    if not streaming and not gathers and _streams(schedule, main, row, row_dim, lanes):
        return None
    flat = not gathers and _contiguous_rows(main, row_dim)
    padded = not main.domain_set().is_box()
    # a padded window's moving reductions go below the row block (`_schedule_conv`), so
    # the block holds one weight vector per window column besides its accumulators: one
    # register of channels a row, and twice the rows, keeps them in registers, as the
    # tuner's best records choose for most such convs (a call in the model, two registers
    # by 8 rows against one by 16: AlexNet's grouped 5x5 conv 4.4 -> 0.8 ms, ResNet-50's
    # stem 0.67 -> 0.47 ms, its 3x3 convs 0.45-0.69 -> 0.43-0.59 ms)
    window = padded and bool(moving_reductions(main, reduce, dim_of, row))
    widths = (lanes, lanes // 2) if window else (2 * lanes, lanes, lanes // 2)
    rows = config.vector_registers // 2 if window else 2 * config.rows
    for ld in loads(main.expr):
        t = schedule.kernel.tensors.get(ld.tensor)
        if t is None or t.role is not Role.CONSTANT or len(t.shape) < 2:
            continue
        for name in spatial[:-1]:
            dim = dim_of[name]
            if dim not in ld.index or depends(ld.index, row_dim):
                continue
            others = [o for o in loads(main.expr) if o is not ld]
            extent = T.loop_extent(schedule, name)
            # the widest vector (two registers, one, half of one) that divides the
            # channels: every tile full (1000 classifier channels take 8 lanes). Other
            # operands may depend on the channel only through its group (grouped conv:
            # floor(m/128)), when a vector never straddles two groups.
            fitting = [
                w
                for w in widths
                if w >= 4
                and extent % w == 0
                and all(_uniform_in_blocks(o.index, dim, w) for o in others)
            ]
            if not fitting:
                continue
            length = T.loop_extent(schedule, row)
            block = _row_block(length, rows, lanes, divisors=not window)
            tile = 0
            if flat and fitting[0] == 2 * lanes and _long_reduction(schedule, reduce, config):
                block = min(length, _stream_rows(config))
                tile = stream_tile(reduce, schedule, config)
            axis = ld.index.index(dim)
            return ConvPlan(ld.tensor, axis, name, row, fitting[0], block, flat, tile)
    return None


def _long_reduction(schedule: Schedule, reduce: list[str], config: DefaultConfig) -> bool:
    """Whether a 1×1 conv on channel vectors reduces over enough channels
    (`config.stream_reduction`) to fill the registers (`_stream_rows`) and tile its
    channels (`stream_tile`). On a 2-vCPU Intel AVX-512 host, calls in the model:
    ResNet-50's 1x1 convs over 7x7 pixels 0.53-0.57 -> 0.45-0.51 ms, its sampled
    stride-2 1024->2048 conv 1.11 -> 0.97 ms; the model 1.277 -> 1.256x onnxruntime's
    latency, DenseNet-121 and Inception v2 even (same turns). Over more pixels, where
    the matrix-product plan streams them, channel vectors lost alone (128->512 at
    28x28 361 -> 557 us) or in the model (512->256 at 28x28 0.96 -> 1.39 ms)."""
    extent = math.prod(T.loop_extent(schedule, r) for r in reduce)
    return 0 < config.stream_reduction <= extent


def _stream_rows(config: DefaultConfig) -> int:
    """Pixels in registers of a 1×1 conv's channel plan with a long reduction: two
    registers of channels each, beside the two weight vectors, a broadcast and a spare
    (14 with AVX-512's 32 registers: 28 accumulators). Alone, on a 2-vCPU Intel AVX-512
    host: ResNet-50's 2048->512 1x1 conv over 7x7 pixels 413 -> 366 us against 8 pixels;
    7 pixels by four registers spilled an accumulator (390 us)."""
    return (config.vector_registers - 4) // 2


def _streams(schedule: Schedule, main: Statement, row: str, row_dim: str, lanes: int) -> bool:
    """Whether the row is a contiguous stream of whole vectors (two or more) in the output
    and in every operand that moves with it (a 1×1 convolution whose planes are flattened: a
    matrix product). Its tiles then stream along memory, which beats vectors across
    channel planes; the matrix-product plan takes it. The AST generator isolates full
    tiles, so a last, partial vector costs only its unused lanes: a row that wastes more
    than an eighth of its lanes (a 7×7 image: 15 of 64) stays with channel vectors."""
    extent = T.loop_extent(schedule, row)
    if extent < 2 * lanes or 8 * (-extent % lanes) > extent:
        return False
    return _contiguous_rows(main, row_dim)


def _contiguous_rows(main: Statement, row_dim: str) -> bool:
    """Whether the row is contiguous in the output and in every operand that moves with
    it, and nothing else moves with it (a 1×1 convolution whose planes are flattened)."""
    if main.index[-1] != row_dim:
        return False
    moving = [ld for ld in loads(main.expr) if depends(ld.index, row_dim)]
    return bool(moving) and all(
        ld.index[-1] == row_dim and not depends(ld.index[:-1], row_dim) for ld in moving
    )


def _uniform_in_blocks(index: tuple, dim: str, width: int) -> bool:
    """The index does not change inside aligned blocks of `width` values of `dim`: it
    does not use `dim`, or only as `floor(dim/k)` with k a multiple of `width`."""
    for entry in index:
        text = str(entry)
        if not mentions(text, dim):
            continue
        grouped = re.fullmatch(rf"(.*)floor\({re.escape(dim)}/(\d+)\)(.*)", text)
        if grouped is None or mentions(grouped[1] + grouped[3], dim):
            return False
        if int(grouped[2]) % width:
            return False
    return True


def _row_block(extent: int, largest: int, lanes: int, *, divisors: bool = True) -> int:
    """The whole row when it is short, else a register block of at most `largest` rows that
    a vector of `lanes` divides or that divides one: the init and the epilogue in the
    block's tile run in vectors along the row, cut at multiples of `lanes` over the whole
    row, so a block of 3 or 6 splits them into guarded pieces in every tile (SqueezeNet's
    stem, 111 columns: 1.02 -> 0.48 ms warm with 4 rows instead of 3; ZFNet-512's and
    AlexNet's stems 0.60x and 0.88x; ZFNet-512's 5x5 conv 1.06x and ResNet-50's 1x1 convs
    over 7x7 pixels 0.88-1.09x, run to run, with 4 instead of 5 or 6). Among those, one
    that divides the row (no partial tile) if `divisors`, else the largest. A padded
    window takes the largest: its tiles at the border are emitted apart anyway
    (`poly.tiles`), and ResNet-50's 3x3 conv at 56x56 ran 0.52 ms a call in the model with
    16 rows against 0.60 ms with 14."""
    if extent <= largest + largest // 2:
        return extent
    sizes = [n for n in range(largest, 0, -1) if n % lanes == 0 or lanes % n == 0]
    if divisors:
        for size in sizes:
            if size >= largest // 2 and extent % size == 0:
                return size
    return sizes[0]


def _schedule_conv(
    schedule: Schedule,
    main: Statement,
    spatial: list[str],
    reduce: list[str],
    dim_of: dict[str, str],
    plan: ConvPlan,
    config: DefaultConfig,
) -> Schedule:
    extents = {n: T.loop_extent(schedule, n) for n in [*spatial, *reduce]}
    schedule = _try(schedule, lambda s: T.pack(s, plan.weight, plan.axis, plan.lanes))
    outer = list(spatial)
    c1 = plan.channel
    lead = []  # the channel tiles
    if T.loop_extent(schedule, plan.channel) > plan.lanes:
        schedule, (c0, c1) = T.split_named(schedule, plan.channel, (None, plan.lanes))
        outer[outer.index(plan.channel)] = c0
        lead = [c0]
    else:  # one vector holds every channel
        outer.remove(plan.channel)
    rows = plan.row
    row_inner = plan.row
    if T.loop_extent(schedule, plan.row) > plan.block:
        schedule, (rows, row_inner) = T.split_named(schedule, plan.row, (None, plan.block))
        outer[outer.index(plan.row)] = rows
    else:
        outer.remove(plan.row)
    gathered = [n for n in gathered_loops(schedule.kernel, main, spatial, dim_of) if n in outer]
    first = (
        None
        if gathered
        else rows_first(schedule.kernel, main, spatial, dim_of, extents, plan, config)
    )
    if first is not None:
        outer.remove(first)
        outer.insert(0, first)
    if gathered:
        outer = gather_inside(schedule, main, outer, gathered, lead, rows, config)
    # padding makes the reduction's range depend on the row: the row block goes above
    # the reduction loops that move along the row, so its own bounds stay constant
    padded = not main.domain_set().is_box()
    moving = moving_reductions(main, reduce, dim_of, plan.row) if padded else []
    still, middle, still_inner = [r for r in reduce if r not in moving], [], []
    chunk = panel_chunk(schedule.kernel, main, reduce, extents, plan, config)
    if chunk is None and plan.tile:
        try:
            schedule, (r0, r1) = T.split_named(schedule, reduce[0], (None, plan.tile))
            still, still_inner, reduce = [r0], [r1], [r0, r1]
        except IllegalSchedule:
            pass
    if chunk is not None and rows in outer:
        try:
            schedule, (r0, r1) = T.split_named(schedule, reduce[0], (None, chunk))
            outer.remove(rows)
            still, middle, still_inner = [r0], [rows], [r1]
            reduce = [r0, r1]
        except IllegalSchedule:
            pass
    order = [*outer, *still, *middle, *still_inner, row_inner, *moving, c1]
    schedule = _try(schedule, lambda s: T.reorder(s, *order))
    current = [loop.name for loop in schedule.loops_of(main.name)]
    first_reduce = next((n for n in current if n in reduce), None)
    if first_reduce is not None:
        schedule = _try(schedule, lambda s: T.decompose_reduction(s, main.name, first_reduce))
    above = current[: current.index(first_reduce)] if first_reduce is not None else current
    tile_loop = next((n for n in reversed(above) if n in outer), None)
    if gathered:  # the epilogue runs once every gathered point of the tile is computed
        tile_loop = gathered[-1]
    if tile_loop is not None:
        for stmt in epilogue(schedule.kernel, main):
            schedule = _try(schedule, lambda s, st=stmt: T.reverse_compute_at(s, st, tile_loop))
    schedule = _try(schedule, lambda s: T.vectorize(s, c1))
    schedule = _try(schedule, lambda s: T.unroll(s, row_inner))
    for stmt in epilogue(schedule.kernel, main):
        schedule = vectorize_innermost(schedule, stmt, config.vector_width)
    init = next((s.name for s in schedule.kernel.statements if s.init_of == main.name), None)
    if init is not None:
        schedule = vectorize_innermost(schedule, init, config.vector_width)
    # fusing a row loop into the parallel loop would turn padding bounds into guards
    return parallelize_outer(schedule, main.name, config, stop=set(spatial) if padded else set())


def pack_weights(
    schedule: Schedule,
    stmt: str,
    packs: Sequence[tuple[str | None, int]],
    inputs: Collection[str] = (),
) -> Schedule:
    """Constant operands (weights) of `stmt`, and the `inputs` named, get a blocked
    layout along the first of `packs` (dim, block size: the vector or register block the
    tile walks it in) that they use and that holds two blocks, so each block is
    contiguous in memory; an axis that is one block long and not the last is moved last
    (as the conv plan packs 32 channels of 32), so the block's elements are still
    contiguous. An input is copied at run time (`poly.pack`)."""
    for ld in loads(schedule.kernel.statement[stmt].expr):
        t = schedule.kernel.tensors.get(ld.tensor)
        if t is None or len(t.shape) < 2:
            continue
        if t.role is not Role.CONSTANT and not (t.role is Role.INPUT and t.name in inputs):
            continue
        for dim, factor in packs:
            if dim is None or dim not in ld.index:
                continue
            axis = ld.index.index(dim)
            whole = t.shape[axis] == factor and axis < len(t.shape) - 1
            if t.shape[axis] >= 2 * factor or whole:
                schedule = _try(
                    schedule, lambda s, n=ld.tensor, a=axis, f=factor: T.pack(s, n, a, f)
                )
                break
    return schedule


def gathered_loops(
    kernel: Kernel, main: Statement, spatial: list[str], dim_of: Mapping[str, str]
) -> list[str]:
    """The main statement's output loops that its epilogue reads across: an epilogue
    load of its result at a constant index where the main statement writes a dim
    (Winograd's output transform combines all 16 transformed points `e` of a tile,
    `M[0, m, ty, tx] + M[1, m, ty, tx] + ...`). Walked outside the epilogue's tile, such
    a loop would hold the whole result of every point in memory before the epilogue reads
    it back."""
    statements = {s.name: s for s in kernel.statements}
    dims = set()
    for name in epilogue(kernel, main):
        for ld in loads(statements[name].expr):
            if ld.tensor != main.tensor:
                continue
            for entry, written in zip(ld.index, main.index, strict=True):
                if str(entry).isdigit() and written in main.dims:
                    dims.add(written)
    return [n for n in spatial if dim_of[n] in dims]


def gather_inside(
    schedule: Schedule,
    main: Statement,
    outer: list[str],
    gathered: list[str],
    lead: list[str],
    row: str | None,
    config: DefaultConfig,
) -> list[str]:
    """The outer loops with `lead` (the channel tiles) first and the gathered loops right
    after them while one lead tile's result fits in L2, else last but outside the row
    tiles `row`: the epilogue, computed in the gathered loops' last iteration, then finds
    the result in cache, and every gathered point of the tile reuses its weights across
    the rows. A Winograd conv over 28x28 with 128 channels took 844 us with its 16 points
    outside the rows and 938 us inside; over 224x224 with 64 channels (12.8 MB of points
    a tile) 22.2 ms outside and 20.5 ms inside, where VGG-19 took 7.97x onnxruntime's time
    with the points' result in memory and the pieces across the row tiles."""
    rest = [n for n in outer if n not in gathered and n not in lead]
    t = schedule.kernel.tensors[main.tensor]
    tiles = math.prod(T.loop_extent(schedule, n) for n in lead)
    held = math.prod(t.shape) * np.dtype(t.dtype).itemsize // tiles
    at = rest.index(row) if held > config.cache_bytes and row in rest else 0
    return [*lead, *rest[:at], *gathered, *rest[at:]]


def epilogue(kernel: Kernel, main: Statement) -> list[str]:
    """Statements after the main one that read its result (directly or through others)."""
    produced = {main.tensor}
    found = []
    after = False
    for s in kernel.statements:
        if s.name == main.name:
            after = True
            continue
        if after and s.init_of is None and any(ld.tensor in produced for ld in loads(s.expr)):
            found.append(s.name)
            produced.add(s.tensor)
    return found


def chained_epilogue(kernel: Kernel, main: Statement) -> list[str]:
    """Epilogue statements whose result only feeds the next epilogue statement through a
    temporary (bias, then add, then ReLU): inlined into their reader, the chain is one
    statement, and the temporaries' round trips through memory disappear."""
    return [
        name
        for name in epilogue(kernel, main)
        if kernel.tensors[kernel.statement[name].tensor].role is Role.TEMP
    ]


def vectorize_innermost(schedule: Schedule, stmt: str, width: int) -> Schedule:
    """Vectorize the innermost loop that runs `stmt` alone: in vectors of `width` when
    they divide it, whole when it is short, and in vectors of `width` and a partial last
    one when it is long (a flattened 55×55 plane)."""
    loops = schedule.loops_of(stmt)
    own = [lp for lp in loops if statements_below(lp) == [stmt]]
    if not own:
        return schedule
    last = own[-1].name
    extent = T.loop_extent(schedule, last)
    if extent > 4 * width or (extent > width and extent % width == 0):
        try:
            schedule, (_, v1) = T.split_named(schedule, last, (None, width))
            return _try(schedule, lambda s: T.vectorize(s, v1))
        except IllegalSchedule:
            return schedule
    if 2 <= extent <= 4 * width:
        return _try(schedule, lambda s: T.vectorize(s, last))
    return schedule


def parallelize_outer(
    schedule: Schedule,
    stmt: str,
    config: DefaultConfig,
    stop: set[str] | None = None,
    depth: int | None = None,
) -> Schedule:
    """Parallelize the outermost loop, fused with the next ones while it is too short,
    or (given `depth`) with the next depth - 1, and more while none of them runs more
    than once. Once every thread has an iteration, `stop` loops are not fused in, nor
    (without a depth) tile loops and loops with partial tiles: each measured slower
    fused than a shorter parallel loop."""
    loops = schedule.loops_of(stmt)
    if not loops:
        return schedule
    if depth is None and _instances(schedule, stmt) < config.min_parallel_work:
        return schedule
    chain = [loops[0].name]
    extent = T.loop_extent(schedule, chain[0])
    # `depth` loops, at least one of which runs more than once (a batch of 1 alone
    # would leave the kernel serial)
    counted = int(extent > 1)
    for loop in loops[1:]:
        enough = (
            extent >= config.threads * 4 if depth is None else len(chain) >= depth and counted >= 1
        )
        if enough:
            break
        parent = schedule.loop(chain[-1])
        if len(parent.body) != 1 or loop.annotation:
            break
        if extent >= config.threads and (
            loop.name in (stop or ())
            or (depth is None and (_tiles(loop) or has_partial_tiles(schedule, loop.name)))
        ):
            # fused in, each is indexed through a modulo of the parallel loop: a padded
            # conv's rows take guards, a tile loop's register tile leaves the registers,
            # uneven tiles guard their vector loops (measured 5x, 8-20x slower: Inception
            # v1/v2, DenseNet); with fewer iterations than threads, idle threads cost more
            # (DenseNet's 32-channel convs: 2x). An explicit depth (the search's decision)
            # is taken as asked for tiles: the measurement judges it.
            break
        chain.append(loop.name)
        extent *= T.loop_extent(schedule, loop.name)
        counted += int(T.loop_extent(schedule, loop.name) > 1)
    # the longest prefix of the chain that fuses and runs in parallel (a reduction loop
    # fused in would make the whole loop serial)
    for end in range(len(chain), 0, -1):
        try:
            fused_schedule, loop = (
                T.fuse_named(schedule, *chain[:end]) if end > 1 else (schedule, chain[0])
            )
            if T.loop_extent(fused_schedule, loop) < config.min_parallel_extent:
                return schedule
            return T.parallel(fused_schedule, loop)
        except IllegalSchedule:
            continue
    return schedule


def _tiles(loop: Loop) -> bool:
    """Whether the loop walks the tiles of a split loop (its values are a floor)."""
    return any("floor(" in expr for expr in loop.exprs.values())


def _instances(schedule: Schedule, stmt: str) -> int:
    """The statement's instances, bounded by its domain's box (counting a padded
    convolution's domain exactly costs isl seconds)."""
    return ih.box_volume(schedule.kernel.statement[stmt].domain_set())


def _schedule_simple(schedule: Schedule, nest: str, config: DefaultConfig) -> Schedule:
    """A nest without a reduction to block: parallel outside, vector inside."""
    stmts = statements_below(schedule.loop(nest))
    for stmt in stmts:
        schedule = vectorize_innermost(schedule, stmt, config.vector_width)
    return parallelize_outer(schedule, stmts[0], config)
