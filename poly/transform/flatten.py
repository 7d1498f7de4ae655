"""Flattening whole planes: when a kernel's statements touch the two trailing axes of some
tensors only as whole, bare planes (`X[n, c, h, w]` for every h < H and w < W), they may
read those tensors as `X[n, c, h_w]` with `h_w = h*W + w` and walk one loop instead of two.

Memory is unchanged (row-major order is the same), so the compiled model binds the same
bytes; what changes is what the scheduler sees. A 1×1 convolution becomes the matrix
product it is (`Y[m, p] = Σ_c W[m, c] X[c, p]`), whose contiguous axis is the whole image
rather than one row of it: vectors and register tiles stay full on 7×7 and 14×14 images,
and an epilogue fused into the tile streams along rows instead of striding across channel
planes. A pooling over whole planes becomes a reduction along one contiguous axis.

A prologue (a statement before the kernel's first reduction, which computes its input) that
cannot merge its dims, because it gathers from another tensor at a stride, still writes
the flattened temporary: its index becomes the row-major `h*W + w`. A strided 1×1 conv's
sampled input (`frontend.passes.sample_strided_1x1_convs`) is such a prologue. What it
reads stays as it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Expr, Iter, Load, rewrite, walk
from polytile.poly.ir.kernel import Kernel, Statement, Tensor, mentions
from polytile.poly.lower.base import affine_text

if TYPE_CHECKING:
    from polytile.frontend.fusion import Group
    from polytile.frontend.graph import Graph
    from polytile.poly.lower.base import LowerConfig


def kernel_of(graph: Graph, group: Group, config: LowerConfig | None = None) -> Kernel:
    """A fused group's kernel as `compile`, task extraction and `explain` see it: lowered,
    its elementwise consumers of strided pieces folded into them, then its whole planes
    flattened: the trailing ones (NCHW images), then axes 1 and 2 (the h and w of the
    [n, h, w, c] activations of channels-last blocks and of their [n, h, w] statistics,
    then one loop of rows for a matrix product's register blocks)."""
    from polytile.poly.lower import lower
    from polytile.poly.transform.fold import fold_into_writers

    kernel = flatten_planes(fold_into_writers(lower(graph, group, config)))
    merged = flatten_planes(kernel, first=1)
    four_d = [n for n, t in kernel.tensors.items() if len(t.shape) >= 4]
    if any(merged.tensors[n].shape != kernel.tensors[n].shape for n in four_d):
        return merged
    return kernel  # [n, c, h*w] images and [n, s, d] sequences keep their axes


def _accesses(s: Statement) -> list[tuple[str, tuple[str | Expr, ...]]]:
    """Every (tensor, index) the statement writes or reads."""
    found: list[tuple[str, tuple[str | Expr, ...]]] = [(s.tensor, s.index)]
    found += [(e.tensor, e.index) for e in walk(s.expr) if isinstance(e, Load)]
    return found


_Plane = tuple[str, str, int, int]


def _start(rank: int, first: int | None) -> int:
    """The first of the two axes that merge: `first`, or the last two (None)."""
    return rank - 2 if first is None else first


def _pair(index: tuple, first: int | None) -> tuple:
    """The two entries of `index` that merge."""
    start = _start(len(index), first)
    return index[start : start + 2]


def _rest(index: tuple, first: int | None) -> tuple:
    """`index` without its `_pair`."""
    start = _start(len(index), first)
    return (*index[:start], *index[start + 2 :])


def _plane(kernel: Kernel, s: Statement, flat: set[str], first: int | None) -> _Plane | None:
    """The statement's pair of dims walking the merging axes (`_start`) of the tensors of
    `flat` it touches and their extents, when it touches them only that way (else None:
    none of them may flatten)."""
    accesses = _accesses(s)
    pairs = {_pair(index, first) for tensor, index in accesses if tensor in flat}
    if len(pairs) != 1:
        return None
    a, b = next(iter(pairs))  # two distinct dims of `s` (`flatten_planes` made sure)
    for tensor, index in accesses:
        rest = _rest(index, first) if tensor in flat else index
        for entry in rest:
            if not isinstance(entry, str) or mentions(entry, a) or mentions(entry, b):
                return None
    if any(isinstance(e, Iter) and e.name in (a, b) for e in walk(s.expr)):
        return None
    extents = ih.separable_box(s.domain_set(), [s.dims.index(a), s.dims.index(b)])
    if extents is None:
        return None
    shapes = [kernel.tensors[t].shape for t, _ in accesses if t in flat]
    if any(_pair(shape, first) != tuple(extents) for shape in shapes):
        return None
    return a, b, extents[0], extents[1]


def _prologue(kernel: Kernel) -> set[str]:
    """Statements before the first reduction (or init) that are neither: they may write a
    flattened tensor through a row-major index instead of merging their own dims."""
    found: set[str] = set()
    for s in kernel.statements:
        if s.reduction is not None or s.init_of is not None:
            return found
        found.add(s.name)
    return set()  # no reduction: an elementwise kernel merges or stays as it is


def flatten_planes(kernel: Kernel, first: int | None = None) -> Kernel:
    """The kernel with every tensor of rank ≥ 3 that all its statements touch as whole
    bare planes merged along two axes, its last two or (`first`) axes first and first + 1
    (the kernel itself when none is); a prologue statement that cannot merge writes such
    a tensor row-major."""
    linear = _prologue(kernel)
    low = 3 if first is None else max(3, first + 2)
    flat = {t.name for t in kernel.tensors.values() if len(t.shape) >= low}
    for s in kernel.statements:  # a tensor not indexed by two bare dims there stays
        for tensor, index in _accesses(s):
            pair = _pair(index, first)
            if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(s.dims):
                flat.discard(tensor)
    planes: dict[str, _Plane] = {}
    while flat:  # a statement that cannot flatten pins every tensor it touches: start over
        planes = {}
        for s in kernel.statements:
            touched = {t for t, _ in _accesses(s)} & flat
            if not touched:
                continue
            pair = _plane(kernel, s, flat, first)
            if pair is not None:
                planes[s.name] = pair
                continue
            pinned = touched - {s.tensor} if s.name in linear else touched
            if pinned:
                flat -= pinned
                break
        else:
            break
    # a tensor only linearized statements touch gains nothing from flattening
    flat &= {t for s in kernel.statements if s.name in planes for t, _ in _accesses(s)}
    if not flat:
        return kernel
    tensors = {n: _flat_tensor(t, first) if n in flat else t for n, t in kernel.tensors.items()}
    statements = tuple(
        _flat_statement(s, planes[s.name], flat, first)
        if s.name in planes
        else _linear_statement(s, kernel, flat, first)
        for s in kernel.statements
    )
    return Kernel(kernel.name, tensors, statements)


def _flat_tensor(t: Tensor, first: int | None) -> Tensor:
    a = _start(len(t.shape), first)
    shape = (*t.shape[:a], t.shape[a] * t.shape[a + 1], *t.shape[a + 2 :])
    value = t.value.reshape(shape) if t.value is not None else None
    return replace(t, shape=shape, value=value)


def _flat_statement(s: Statement, plane: _Plane, flat: set[str], first: int | None) -> Statement:
    a, b, height, width = plane
    merged = f"{a}_{b}"
    while merged in s.dims:
        merged = f"_{merged}"
    at_a, at_b = s.dims.index(a), s.dims.index(b)
    new_domain = ih.merge_dims(s.domain_set(), at_a, at_b, merged, height * width)
    dims = tuple(merged if d == a else d for d in s.dims if d != b)

    def index(tensor: str, old: tuple[str | Expr, ...]) -> tuple[str | Expr, ...]:
        if tensor not in flat:
            return old
        start = _start(len(old), first)
        return (*old[:start], merged, *old[start + 2 :])

    def load(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor in flat:
            return Load(e.tensor, index(e.tensor, e.index), e.dtype)
        return None

    return replace(
        s,
        dims=dims,
        domain=str(new_domain),
        index=tuple(str(i) for i in index(s.tensor, s.index)),
        expr=rewrite(s.expr, load),
    )


def _linear_statement(s: Statement, kernel: Kernel, flat: set[str], first: int | None) -> Statement:
    """`s` with its accesses of flattened tensors row-major, `[.., h, w]` → `[.., h*W + w]`
    (the same element: flattening keeps memory as it is); its own dims stay."""

    def index(tensor: str, old: tuple) -> tuple:
        if tensor not in flat:
            return old
        start = _start(len(old), first)
        width = kernel.tensors[tensor].shape[start + 1]
        merged = affine_text([(width, old[start]), (1, old[start + 1])])
        return (*old[:start], merged, *old[start + 2 :])

    def load(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor in flat:
            return Load(e.tensor, index(e.tensor, e.index), e.dtype)
        return None

    return replace(s, index=index(s.tensor, s.index), expr=rewrite(s.expr, load))
