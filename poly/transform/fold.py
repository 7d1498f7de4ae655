"""Folding an elementwise consumer into the writers of a temporary written at strides.

Winograd's output transform writes a conv's result in four pieces, one per pixel of each
2×2 block (`Y[m, 2*ty + p, 2*tx + q] = ...`); the bias, residual Add and Relu fused after
it read `Y[m, oh, ow]`. `inline` substitutes a producer into its readers, which needs the
producer's index inverted (`±d + c` per entry) and refuses these pieces. Here the other
direction: the consumer's expression moves into each writer, over the writer's own dims,

    Y[m, 2*ty + p, 2*tx + q] = f(...)
    Z[m, oh, ow] = max(Y[m, oh, ow] + R[m, oh, ow], 0)

becomes `Z[m, 2*ty + p, 2*tx + q] = max(f(...) + R[m, 2*ty + p, 2*tx + q], 0)`,

so the result is stored once, by the writers, and the temporary disappears. Kernels
whose writers inline (an index per entry `±d + c`) are left to `inline`: this pass does
not change them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace

from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Cast, Expr, Iter, Load, loads, rewrite, walk
from polytile.poly.ir.kernel import Kernel, Role, Statement


def fold_into_writers(kernel: Kernel) -> Kernel:
    """The kernel with every foldable consumer (see `_fold`) folded into its temporary's
    writers, repeatedly (a bias, then an Add, then a Relu)."""
    while True:
        for reader in kernel.statements:
            folded = _fold(kernel, reader)
            if folded is not None:
                kernel = folded
                break
        else:
            return kernel


def _strided(s: Statement) -> bool:
    """Whether some index entry of the statement's store is not a bare dim plus a
    constant (`2*ty + 1`): `inline` cannot invert it."""
    for entry in s.index:
        form = ih.linear(s.dims, entry)
        if form is None:
            return True
        coefficients, _ = form
        if len(coefficients) > 1 or any(abs(c) != 1 for c in coefficients.values()):
            return True
    return False


def _fold(kernel: Kernel, r: Statement) -> Kernel | None:
    """`r` folded into the writers of the temporary it reads, or None when that is not
    exactly the same program. Foldable: `r` is elementwise (neither reduction nor init,
    stores at its own dims, over a box the size of its tensor, reads no iteration
    values); it reads a temporary `Y` of its tensor's shape only at its own dims, and
    nothing else reads `Y`; `Y`'s writers are plain statements with affine indices, one
    of them strided, whose ranges are disjoint and cover `Y`; and nothing between the
    first writer and `r` touches `r`'s tensor or writes what `r` reads."""
    if r.reduction or r.init_of or tuple(r.index) != r.dims:
        return None
    out = kernel.tensors[r.tensor]
    if kernel.params:  # its coverage checks count points
        return None
    domain = r.domain_set()
    if not domain.is_box() or ih.box_volume(domain) != math.prod(out.shape):
        return None
    if any(isinstance(e, Iter) for e in walk(r.expr)):
        return None
    reads = loads(r.expr)
    if not all(isinstance(i, str) for ld in reads for i in ld.index):
        return None
    for y in dict.fromkeys(ld.tensor for ld in reads):
        temp = kernel.tensors[y]
        if temp.role is not Role.TEMP or temp.shape != out.shape:
            continue
        if any(ld.index != r.dims for ld in reads if ld.tensor == y):
            continue
        if any(y in {ld.tensor for ld in loads(s.expr)} for s in kernel.statements if s is not r):
            continue
        writers = [s for s in kernel.statements if s.tensor == y]
        if not writers or not any(_strided(w) for w in writers):
            continue
        if not all(_plain(w) for w in writers) or not _cover(writers, temp.shape):
            continue
        order = {s.name: n for n, s in enumerate(kernel.statements)}
        if any(order[w.name] > order[r.name] for w in writers):
            continue
        between = kernel.statements[order[writers[0].name] : order[r.name]]
        others = {ld.tensor for ld in reads if ld.tensor != y}
        if any(
            s.tensor in others | {r.tensor} or r.tensor in {ld.tensor for ld in loads(s.expr)}
            for s in between
            if s.tensor != y
        ):
            continue
        return _folded(kernel, r, y, writers)
    return None


def _plain(w: Statement) -> bool:
    """A writer whose store index is affine text and that reads no iteration values."""
    return (
        w.reduction is None
        and w.init_of is None
        and all(isinstance(i, str) and ih.linear(w.dims, i) is not None for i in w.index)
        and not any(isinstance(e, Iter) for e in walk(w.expr))
        and w.tensor not in {ld.tensor for ld in loads(w.expr)}
    )


def _cover(writers: list[Statement], shape: tuple[int, ...]) -> bool:
    """Whether the writers store every element of a tensor of `shape` exactly once."""
    images = [w.domain_set().apply(w.write_map()) for w in writers]
    if sum(ih.card(w.domain_set()) for w in writers) != math.prod(shape):
        return False
    union = images[0]
    for image in images[1:]:
        union = union.union(image)
    return ih.card(union) == math.prod(shape)


def _folded(kernel: Kernel, r: Statement, y: str, writers: list[Statement]) -> Kernel:
    by_name = {w.name: w for w in writers}
    statements = []
    for s in kernel.statements:
        if s is r:
            continue
        w = by_name.get(s.name)
        if w is None:
            statements.append(s)
            continue
        bound = dict(zip(r.dims, w.index, strict=True))

        statements.append(replace(w, tensor=r.tensor, expr=rewrite(r.expr, _moved(y, w, bound))))
    tensors = {n: t for n, t in kernel.tensors.items() if n != y}
    return Kernel(kernel.name, tensors, tuple(statements))


def _moved(y: str, w: Statement, bound: dict[str, str]) -> Callable[[Expr], Expr | None]:
    """The reader's loads as the writer `w` sees them: `y` is what `w` computes, and the
    reader's dims are the entries of `w`'s store index (`bound`)."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, bound)) + r")(?![\w.])")

    def entry(text: str) -> str:
        if text in bound:
            return bound[text]
        return pattern.sub(lambda m: f"({bound[m.group(1)]})", text)

    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Load):
            return None
        if e.tensor == y:
            return w.expr if w.expr.dtype == e.dtype else Cast(w.expr, e.dtype)
        return Load(e.tensor, tuple(entry(i) for i in e.index), e.dtype)  # type: ignore[arg-type]

    return fn
