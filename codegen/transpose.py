"""Register tiles whose vector runs across memory rows, moved as whole rows.

A register tile that keeps one output channel per lane (a convolution vectorized over
output channels) writes an NCHW tensor whose contiguous dimension is the tile's *other*
axis: each accumulator's lanes lie a row apart. Moved lane by lane, the `n` accumulators
of an unrolled pixel block cost `n × lanes` scalar loads and inserts before the
reduction and as many extracts and stores after it (a large share of the 7×7 stem
conv's time). Moved as rows instead, the block is `lanes` (masked) vector loads or stores
of `n` contiguous elements and a `lanes × lanes` transpose in registers: log2(lanes)
stages of two-source shuffles, `lanes` shuffles each."""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from .llvm_types import I1, I32, PTR, ModuleContext, constant, suffix


def transpose(b: ir.IRBuilder, vectors: Sequence[ir.Value | None]) -> list[ir.Value]:
    """The transpose of a square matrix given as its rows (`len(vectors)` lanes each, a
    power of two; a missing row is undefined): stage `k` swaps bit `k` of the row and
    column indices between pairs of rows `k` apart."""
    size = len(vectors)
    assert size & (size - 1) == 0
    vty = next(v.type for v in vectors if v is not None)
    rows = [v if v is not None else constant(vty, None) for v in vectors]
    step = 1
    while step < size:
        low = [c if not c & step else size + c - step for c in range(size)]
        high = [c + step if not c & step else size + c for c in range(size)]
        new = list(rows)
        for r in range(size):
            if r & step:
                continue
            new[r] = _shuffle(b, rows[r], rows[r + step], low)
            new[r + step] = _shuffle(b, rows[r], rows[r + step], high)
        rows = new
        step *= 2
    return rows


def rows_to_columns(b: ir.IRBuilder, rows: Sequence[ir.Value]) -> list[ir.Value]:
    """Columns (one vector of `len(rows)` lanes each) of rows of `width` lanes (a power
    of two dividing the row count): each block of `width` rows is transposed on its own
    and the blocks' pieces of a column concatenated."""
    width = rows[0].type.count
    blocks = [transpose(b, rows[r : r + width]) for r in range(0, len(rows), width)]
    return [_concat(b, [block[j] for block in blocks]) for j in range(width)]


def columns_to_rows(
    b: ir.IRBuilder, columns: Sequence[ir.Value | None], width: int
) -> list[ir.Value]:
    """The inverse of `rows_to_columns`: rows of `width` lanes (missing columns are
    undefined)."""
    lanes = next(c.type for c in columns if c is not None).count
    padded = [*columns, *[None] * (width - len(columns))]
    rows: list[ir.Value] = []
    for start in range(0, lanes, width):
        piece = list(range(start, start + width))
        rows.extend(
            transpose(b, [_shuffle(b, c, c, piece) if c is not None else None for c in padded])
        )
    return rows


def _concat(b: ir.IRBuilder, pieces: list[ir.Value]) -> ir.Value:
    while len(pieces) > 1:
        size = 2 * pieces[0].type.count
        pieces = [
            _shuffle(b, pieces[i], pieces[i + 1], list(range(size)))
            for i in range(0, len(pieces), 2)
        ]
    return pieces[0]


def _shuffle(b: ir.IRBuilder, a: ir.Value, c: ir.Value, picks: list[int]) -> ir.Value:
    return b.shuffle_vector(a, c, constant(ir.VectorType(I32, len(picks)), picks))


def _mask(size: int, count: int) -> ir.Constant:
    return constant(ir.VectorType(I1, size), [j < count for j in range(size)])


def load_row(
    mc: ModuleContext, b: ir.IRBuilder, ptr: ir.Value, vty: ir.VectorType, count: int, align: int
) -> ir.Value:
    """The first `count` elements at `ptr` in a vector of `vty`; memory past them is not
    touched (the rest of the vector is undefined)."""
    if count == vty.count:
        return b.load(ptr, typ=vty, align=align)
    fn = mc.function(
        f"llvm.masked.load.{suffix(vty)}.p0",
        vty,
        [PTR, I32, ir.VectorType(I1, vty.count), vty],
    )
    return b.call(
        fn, [ptr, ir.Constant(I32, align), _mask(vty.count, count), ir.Constant(vty, None)]
    )


def store_row(
    mc: ModuleContext, b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, count: int, align: int
) -> None:
    """Store the first `count` lanes of `value` at `ptr`, leaving memory past them alone."""
    vty = value.type
    if count == vty.count:
        b.store(value, ptr, align=align)
        return
    fn = mc.function(
        f"llvm.masked.store.{suffix(vty)}.p0",
        ir.VoidType(),
        [vty, PTR, I32, ir.VectorType(I1, vty.count)],
    )
    b.call(fn, [value, ptr, ir.Constant(I32, align), _mask(vty.count, count)])
