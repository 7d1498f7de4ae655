"""What the default schedule's plans share: its settings (`DefaultConfig`), the main
statement and its epilogue, packing constant operands into blocks, and the last steps of
every plan (the init and epilogue vectorized, a padded input made inside the tile, the
outer loops fused into one parallel loop).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polytile.errors import IllegalSchedule
from polytile.poly.ast.tiles import has_partial_tiles
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Const, loads, walk
from polytile.poly.ir.kernel import Kernel, Role, Statement, mentions
from polytile.poly.ir.schedule import Loop, Schedule, loop_dims, statements_below
from polytile.poly.transform import steps as T


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
    #: every register block, is walked tile by tile instead (see `tiles_first`)
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
    #: vector tiles a band of a tiles-first matrix-product plan holds where its output
    #: outgrows L2 (see `tile_band`; 0: no bands)
    band_tiles: int = 8
    #: L1 as the panels of an input operand see it: rows `l1_way_bytes` apart share a set,
    #: which holds `l1_ways` lines (32 KB, 8 ways on x86 cores; see `packed_inputs`)
    l1_way_bytes: int = 4096
    l1_ways: int = 8
    #: the fewest register blocks that must re-read a packed input's panels to repay the
    #: copy (see `packed_inputs`)
    pack_reuse: int = 4
    #: whether each fuse checks its nest's AST (`poly.transform.steps.fuse_named`); off,
    #: the caller checks the whole schedule's AST instead (`checked_default`)
    check_fused_ast: bool = True

    @property
    def vector_registers(self) -> int:
        """Vector registers of the ISA whose width this is: AVX-512 has 32, AVX and SSE 16."""
        return 32 if self.vector_width >= 16 else 16

    @property
    def row_vector_limit(self) -> int:
        """The most vectors a register-blocked row may hold (`poly.default.row_vectors`):
        three with `wide_rows` on a 32-register ISA, else two."""
        return 3 if self.wide_rows and self.vector_registers >= 32 else 2

    @property
    def rows(self) -> int:
        """Rows of a register block; plans take twice that where the loop is long enough
        (`gemm_block`, `conv_plan`), at two vectors a row. With 32 registers 4: 16
        accumulators. With 16 registers 3, as BLIS's 6x16 AVX2 kernel: 12
        accumulators, two operand vectors and a broadcast. With 4 the accumulators alone
        fill the 16 registers and spill."""
        if self.register_block is not None:
            return self.register_block
        return 4 if self.vector_registers >= 32 else 3


def attempt(schedule: Schedule, fn: Callable[[Schedule], Schedule]) -> Schedule:
    try:
        return fn(schedule)
    except IllegalSchedule:
        return schedule


def split_init(
    schedule: Schedule, main: str, current: list[str], reduce: Collection[str]
) -> tuple[Schedule, list[str]]:
    """The init of `main` split off before its first reduction loop (in `current`, its
    loops' order): the schedule and the loops above that one (all, without one)."""
    first = next((n for n in current if n in reduce), None)
    if first is None:
        return schedule, current
    schedule = attempt(schedule, lambda s: T.decompose_reduction(s, main, first))
    return schedule, current[: current.index(first)]


def depends(load_index: tuple, dim: str) -> bool:
    """Whether a load's index moves with `dim` (`2*oh + kh` does with oh)."""
    return any(mentions(str(i), dim) for i in load_index)


def contiguous_reduction(
    main: Statement, reduce: Sequence[str], dim_of: Mapping[str, str]
) -> str | None:
    """The reduction loop whose dim is the whole last index of every load of the main
    statement that moves with it (x[n, c, k]: k), so that its vectors load rows, when
    those loads also move with every output dim: each row is read for one output point
    (a softmax's max, a norm's mean), not again for others (a matrix product's A·Bᵀ,
    whose operands a register tile reuses)."""
    spatial = [d for d in main.dims if d not in main.reduction_dims]
    found = None
    for loop in reduce:
        dim = dim_of[loop]
        moving = [ld for ld in loads(main.expr) if depends(ld.index, dim)]
        if moving and all(
            str(ld.index[-1]) == dim
            and not depends(ld.index[:-1], dim)
            and all(depends(ld.index, d) for d in spatial)
            for ld in moving
        ):
            found = loop
    return found


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


def compute_prologue(schedule: Schedule, main: str, width: int) -> Schedule:
    """The main statement's prologues (`tile_prologues`: a padded input, an activation
    read several times by a strided window) made inside its outermost loop, vectorized:
    one tile (of channels) at a time, while it stays in cache, rather than in a pass
    over the whole input (Inception v2's 3x3 AveragePools over 14x14 ran fastest so,
    then with the copy as a pass of its own, slowest without a copy). A prologue that
    every tile needs whole cannot move there (the parallel loop would carry it)."""
    tile = next(
        (lp for lp in schedule.loops_of(main) if T.loop_extent(schedule, lp.name) > 1), None
    )
    if tile is None:
        return schedule
    kernel = schedule.kernel
    reader = kernel.statement[main]
    tiled = loop_dims(tile, main, reader.dims)
    for stmt in tile_prologues(kernel, main):
        # per tile only what the tile reads (a channel tile's planes): a temporary every
        # tile reads whole (the channels a 1x1 conv sums) would be made in the first
        # tile, and the tile loop could no longer run in parallel
        tensor = kernel.statement[stmt].tensor
        reads = [ld for ld in loads(reader.expr) if ld.tensor == tensor]
        if not all(any(depends(ld.index, d) for d in tiled) for ld in reads):
            continue
        schedule = attempt(schedule, lambda s, st=stmt: T.compute_at(s, st, tile.name))
        schedule = vectorize_innermost(schedule, stmt, width)
    return schedule


def padded_inputs(kernel: Kernel, main: str) -> list[str]:
    """The `tile_prologues` that hold a padded copy: one of the temporary's writers fills
    in a constant (a pool's padded input, a fused constant Pad, a depthwise conv's padded
    input with the SiLU before it inlined)."""
    found = tile_prologues(kernel, main)
    padded = {
        kernel.statement[w].tensor for w in found if isinstance(kernel.statement[w].expr, Const)
    }
    return [w for w in found if kernel.statement[w].tensor in padded]


def tile_prologues(kernel: Kernel, main: str) -> list[str]:
    """The writers of each temporary that only `main` reads, each filling in a constant
    or computing element by element from the kernel's inputs and constants alone.
    Producers reading other temporaries stay in their own nests."""
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
            and all(_elementwise_from_inputs(kernel, w) for w in writers)
        ):
            found += [w.name for w in writers]
    return found


def _elementwise_from_inputs(kernel: Kernel, stmt: Statement) -> bool:
    return (
        stmt.init_of is None
        and stmt.reduction is None
        and all(
            kernel.tensors[ld.tensor].role in (Role.INPUT, Role.CONSTANT) for ld in loads(stmt.expr)
        )
    )


def operand_bytes(kernel: Kernel, stmt: str, along: str, not_along: str) -> int:
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


def narrow_vector(extent: int, width: int, masked: bool = False) -> int:
    """The vector width for a loop of `extent`: halved (down to 4 lanes) until the loop
    holds two vectors, so a short row (a pooling output of 28 with 16 lanes) runs in
    vectors of 8 rather than in scalars. `masked`: a row no longer than `width` is one
    vector of the power of two that covers it instead, its last lanes masked (7 → 8)."""
    if masked and extent <= width:
        return max(4, 1 << (max(extent, 2) - 1).bit_length())
    while width > 4 and extent < 2 * width:
        width = 1 << ((width - 1).bit_length() - 1)  # a power of two (48 -> 32)
    return width


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


def uniform_in_blocks(index: tuple, dim: str, width: int) -> bool:
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
                schedule = attempt(
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
    the rows. A small Winograd conv (28x28, 128 channels) gains from its 16 points
    outside the rows; a large one (VGG-19's 224x224 with 64 channels, 12.8 MB of points
    a tile) must keep them inside, or its points' result lives in memory in pieces across
    the row tiles (see benchmarks/results/conv-*.md)."""
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
        and not repeats_costly_work(kernel, kernel.statement[name])
    ]


#: operations that cost many times an add: inlined where their result is read several
#: times, they would be computed again for each read
COSTLY = frozenset({"exp", "log", "sqrt", "erf", "tanh", "sigmoid", "recip", "div", "pow"})


def repeats_costly_work(kernel: Kernel, stmt: Statement) -> bool:
    """Whether inlining `stmt` would compute its costly operations (`COSTLY`) again:
    several statements read its result (softmax's exponentials, read by the sum and the
    output), or a reader runs over more points (a reciprocal per row read by every
    element of the row)."""
    if not any(getattr(e, "op", None) in COSTLY for e in walk(stmt.expr)):
        return False
    readers = [
        s for s in kernel.statements if any(ld.tensor == stmt.tensor for ld in loads(s.expr))
    ]
    volume = ih.box_volume(stmt.domain_set())
    return len(readers) > 1 or any(ih.box_volume(r.domain_set()) > volume for r in readers)


def chained_prologue(kernel: Kernel, main: Statement) -> list[str]:
    """Elementwise statements before the main one whose temporary is read once, by another
    such statement over as many points (GELU's divide, erf, add and multiplies before a
    MatMul): inlined into their reader, the chain is one pass over memory instead of one
    per operator; also into an elementwise main statement (SiLU's sigmoid and multiply).
    What a reduction reads is left alone: inlined, it would be computed again for every
    point that reads it, unless it reads each point once (x² summed along a row for an
    RMS norm: the statement then streams into the sum)."""
    before = kernel.statements[: [s.name for s in kernel.statements].index(main.name)]
    readers: dict[str, list[Statement]] = {}
    for s in kernel.statements:
        for ld in loads(s.expr):
            readers.setdefault(ld.tensor, []).append(s)
    found = []
    for s in before:
        if s.reduction or s.init_of is not None:
            continue
        if kernel.tensors[s.tensor].role is not Role.TEMP:
            continue
        if sum(1 for w in kernel.statements if w.tensor == s.tensor) != 1:
            continue
        reads = readers.get(s.tensor, [])
        if len(reads) != 1:
            continue
        reader = reads[0]
        if reader.init_of is not None or (reader.reduction and not _reads_once(reader, s)):
            continue
        if ih.box_volume(reader.domain_set()) != ih.box_volume(s.domain_set()):
            continue
        found.append(s.name)
    return found


def _reads_once(reader: Statement, stmt: Statement) -> bool:
    """Whether each of the reader's instances reads its own point of `stmt`'s result:
    every load of it moves with every dim of the reader."""
    return all(
        all(depends(ld.index, d) for d in reader.dims)
        for ld in loads(reader.expr)
        if ld.tensor == stmt.tensor
    )


def default_inlines(kernel: Kernel, main: Statement) -> list[str]:
    """The statements the default schedule inlines, in program order."""
    chosen = set(chained_prologue(kernel, main)) | set(chained_epilogue(kernel, main))
    return [s.name for s in kernel.statements if s.name in chosen]


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
            return attempt(schedule, lambda s: T.vectorize(s, v1))
        except IllegalSchedule:
            return schedule
    if 2 <= extent <= 4 * width:
        return attempt(schedule, lambda s: T.vectorize(s, last))
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
            # uneven tiles guard their vector loops (each several times slower in
            # Inception v1/v2 and DenseNet); with fewer iterations than threads, idle
            # threads cost more (DenseNet's 32-channel convs). An explicit depth (the
            # search's decision) is taken as asked for tiles: the measurement judges it.
            break
        chain.append(loop.name)
        extent *= T.loop_extent(schedule, loop.name)
        counted += int(T.loop_extent(schedule, loop.name) > 1)
    # the longest prefix of the chain that fuses and runs in parallel (a reduction loop
    # fused in would make the whole loop serial)
    for end in range(len(chain), 0, -1):
        try:
            fused_schedule, loop = (
                T.fuse_named(schedule, *chain[:end], check_ast=config.check_fused_ast)
                if end > 1
                else (schedule, chain[0])
            )
            if T.loop_extent(fused_schedule, loop) < config.min_parallel_extent:
                return schedule
            return T.parallel(fused_schedule, loop)
        except IllegalSchedule:
            continue
    return schedule


def parallelize_for_all_sizes(
    schedule: Schedule,
    stmt: str,
    config: DefaultConfig,
    smallest: Mapping[str, int],
    typical: Mapping[str, int],
) -> Schedule:
    """`parallelize_outer` for a kernel with symbolic sizes: the parallel loop must have
    work for every thread at the `smallest` sizes as well as at `typical` ones. A loop
    over a symbolic size can be fused only as the outermost of the fused loops, so where
    the loops so far may run once (a batch of 1) and the next is over a symbolic size
    (the sequence), the parallel loop starts there instead, inside the outer ones."""
    loops = schedule.loops_of(stmt)
    chain: list[str] = []
    small = typ = 1
    symbolic_head = False  # the chain starts with the tiles of a symbolic size
    for loop in loops:
        if loop.annotation:
            break
        try:
            T.loop_bounds(schedule, loop.name)
            bounded = True
        except IllegalSchedule:
            bounded = False
        if chain:
            if small >= config.threads and typ >= config.threads * 4:
                break
            if len(schedule.loop(chain[-1]).body) != 1:
                break
            if not bounded:
                if small >= config.threads:
                    break
                chain, small, typ = [], 1, 1  # the outer loops stay serial
            elif (small >= config.threads or symbolic_head) and (
                _tiles(loop) or has_partial_tiles(schedule, loop.name)
            ):
                # as in `parallelize_outer`; behind a symbolic size's tiles, a fused
                # loop's modulo would keep the last tile's guards in every tile
                break
        if not chain:
            symbolic_head = not bounded and _tiles(loop)
        chain.append(loop.name)
        small *= T.loop_extent(schedule, loop.name, smallest)
        typ *= T.loop_extent(schedule, loop.name, typical)
    for end in range(len(chain), 0, -1):
        try:
            fused, name = (
                T.fuse_named(schedule, *chain[:end], check_ast=config.check_fused_ast)
                if end > 1
                else (schedule, chain[0])
            )
            return T.parallel(fused, name)
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
