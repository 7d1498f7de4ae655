"""The conv plan of the default schedule: a convolution-like reduction (a constant
operand, the weights, depends on an output dim, the channels, that no other operand
depends on) puts those channels in vectors, so every tile is full whatever the image
width, stride or padding, and blocks an output row dim in registers, so one loaded weight
vector feeds several accumulators, each a broadcast input element.

Its output rows go outside the channel blocks when its input outgrows half of L2 and its
weights are cheaper to re-read (`rows_first`); over few pixels it reduces a chunk of
channels at a time over all its pixel tiles (`panel_chunk`); a 1×1 convolution with a
long reduction fills the registers and tiles its channels (`stream_tile`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from polytile.poly.default.steps import (
    DefaultConfig,
    depends,
    gathered_loops,
    main_statement,
    moving_reductions,
    operand_bytes,
    uniform_in_blocks,
)
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Kernel, Role, Statement
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.transform import steps as T


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
    return plan_of(schedule, main, spatial, dim_of, config, streaming=streaming)


def plan_of(
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
    # a padded window's moving reductions go below the row block (`poly.default.sketch`), so
    # the block holds one weight vector per window column besides its accumulators: one
    # register of channels a row, and twice the rows, keeps them in registers, as the
    # tuner's best records choose for most such convs (AlexNet's grouped 5x5 conv,
    # ResNet-50's stem and 3x3 convs; see benchmarks/results/resnet50_tuned-*.md)
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
                and all(uniform_in_blocks(o.index, dim, w) for o in others)
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
    row loop long enough to share among the threads (four iterations each; fewer lost
    time), so that it is parallel alone (a padded row fused into the parallel loop would
    take guards). It pays for the stride-2 stems and convs whose input outgrows L2
    (SqueezeNet, ZFNet-512, AlexNet, ResNet-50, ShuffleNet); stride-1 3x3 convs break
    even. An input over half of L2 counts as outgrowing it: in the model each thread's
    L2 holds it beside its weights, and the threads of the kernel before wrote it in
    halves (see benchmarks/results/models-*.md)."""
    channel = dim_of[plan.channel]
    for name in spatial:
        if name in (plan.channel, plan.row) or extent[name] < 4 * config.threads:
            continue
        if not any(depends(ld.index, dim_of[name]) for ld in loads(main.expr)):
            continue
        streamed = operand_bytes(kernel, main.name, dim_of[name], channel)
        if streamed <= config.cache_bytes // 2:  # the input stays in cache
            return None
        weights = operand_bytes(kernel, main.name, channel, dim_of[name])
        blocks = -(-extent[plan.channel] // plan.lanes)
        rows = extent[name]
        if weights <= config.cache_bytes // 2 or weights * rows < streamed * blocks:
            return name
        return None
    return None


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
    whose accumulators are reloaded per chunk (ResNet-50's 512->2048 and 2048->512 1x1
    convs over 7x7). Only a single unpadded reduction: 3x3 convs lost time chunked."""
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
    accumulators in the channel loop (1024->256 over 14x14 pixels); tiles of 64, 128 or
    256 channels all avoid it."""
    if len(reduce) != 1 or T.loop_extent(schedule, reduce[0]) <= config.cache_reduction:
        return 0
    return config.cache_reduction


def row_tiles(extent: Mapping[str, int], plan: ConvPlan) -> int:
    """The register blocks a conv plan's row loop takes (the last one partial)."""
    return -(-extent[plan.row] // plan.block)


def _long_reduction(schedule: Schedule, reduce: list[str], config: DefaultConfig) -> bool:
    """Whether a 1×1 conv on channel vectors reduces over enough channels
    (`config.stream_reduction`) to fill the registers (`_stream_rows`) and tile its
    channels (`stream_tile`), as ResNet-50's 1x1 convs over 7x7 pixels gain from. Over
    more pixels, where the matrix-product plan streams them, channel vectors lose
    (ResNet-50's 128->512 and 512->256 convs at 28x28)."""
    extent = math.prod(T.loop_extent(schedule, r) for r in reduce)
    return 0 < config.stream_reduction <= extent


def _stream_rows(config: DefaultConfig) -> int:
    """Pixels in registers of a 1×1 conv's channel plan with a long reduction: two
    registers of channels each, beside the two weight vectors, a broadcast and a spare
    (14 with AVX-512's 32 registers: 28 accumulators), which beat 8 pixels on ResNet-50's
    2048->512 1x1 conv over 7x7; 7 pixels by four registers spilled an accumulator."""
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


def _row_block(extent: int, largest: int, lanes: int, *, divisors: bool = True) -> int:
    """The whole row when it is short, else a register block of at most `largest` rows that
    a vector of `lanes` divides or that divides one: the init and the epilogue in the
    block's tile run in vectors along the row, cut at multiples of `lanes` over the whole
    row, so a block of 3 or 6 splits them into guarded pieces in every tile (the stems
    of SqueezeNet, ZFNet-512 and AlexNet lost most). Among those, one that divides the
    row (no partial tile) if `divisors`, else the largest. A padded window takes the
    largest: its tiles at the border are emitted apart anyway (`poly.tiles`), and
    ResNet-50's 3x3 conv at 56x56 ran faster with 16 rows than with 14."""
    if extent <= largest + largest // 2:
        return extent
    sizes = [n for n in range(largest, 0, -1) if n % lanes == 0 or lanes % n == 0]
    if divisors:
        for size in sizes:
            if size >= largest // 2 and extent % size == 0:
                return size
    return sizes[0]
