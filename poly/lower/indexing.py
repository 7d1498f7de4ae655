"""Compute definitions of the indexing ops: Gather, GatherElements, GatherND (indirect
loads), ScatterElements and ScatterND (reductions over the updates), OneHot, TopK,
Trilu and EyeLike.

A gather loads its indices and uses the value as an indirect index (an `Expr` entry of a
`Load`), plus the axis size where it may be negative. Run-time indices are checked
against their axes before the kernel runs (`polytile.compiler`), compile-time ones by
the frontend, so an indirect load never leaves its tensor.

A scatter never writes through an index read from a tensor: every statement writes its
own output position, and the updates meeting a position are found by comparing the
indices with that position, as a reduction over the updates. With a reduction (add,
mul, max, min) the output starts at `data` and combines `select(hit, update, identity)`
(the combiner is associative and commutative, so every order the search may choose
gives the same result up to float rounding). Without one, the last update hitting a
position wins (onnxruntime's order; ONNX leaves duplicates undefined): a max reduction
finds the last hitting update's number (-1 for none), and a second statement selects
that update or `data`. Indices out of range hit nothing, so a scatter reads no memory
outside its tensors even unchecked. The cost is the output's positions times the
updates, not the updates alone: right for the small scatters of models (attention
masks, cache rows, most folded at compile time), quadratic for large ones. A write
through a run-time index would cost the updates alone, but statements store at affine
indices only (the dependences, every transformation, inlining and codegen's register
accumulators rely on it), so a scatter above `SCATTER_COMPARISONS` compare-points is
refused by name rather than compiled into a kernel whose cost is out of all proportion.

TopK picks its k elements in k passes over the axis, O(k*n) per row: TopK's order is total
(by value, NaN above every number as onnxruntime orders them, ties by the lower position),
so the elements left at pass p are exactly those after pass p-1's pick, and the pick is
the first of them. Kernel statements run one after the other, so a pass is one reduction
statement over (pass, phase, element): its phases find the first class (NaN or number),
the extreme value in it, then the lowest position holding that value, each reading the
phases before it and the previous pass's pick from the accumulator. These reads of its
own accumulator are flow dependences the poly layer keeps (rfactor and register
promotion refuse such a statement), so passes and phases stay in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import islpy as isl
import numpy as np

from polytile.frontend.ops.indexing import (
    onehot_axis,
    onehot_depth,
    scatter_reduction,
    topk_facts,
    trilu_k,
)
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Expr, Iter, binary, identity, select, unary
from polytile.poly.ir.kernel import Statement
from polytile.poly.lower.base import LowerContext, as_dtype, lowering, reduction

COMBINER = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}
#: the most (output position, update) pairs a scatter compares, e.g. 10 000 positions
#: against 10 000 updates; 2048 tokens written into a (1, 32, 2048, 128) cache with index
#: tuples of 3 would be 65 536 x 65 536 = 4.3e9
SCATTER_COMPARISONS = 10**8


def _axis(ctx: LowerContext, rank: int, default: int = 0) -> int:
    return ctx.infer_context().axis(int(ctx.attr("axis", default)), rank)  # type: ignore[arg-type]


def _wrapped(ctx: LowerContext, position: Expr, size: int, input_index: int) -> Expr:
    """An index value as int64, plus `size` where it is negative (only when it may be)."""
    position = as_dtype(position, "int64")
    known = ctx.constant(input_index)
    if known is not None and not np.any(np.asarray(known) < 0):
        return position
    zero, n = ctx.const(0, "int64"), ctx.const(size, "int64")
    return select(binary("lt", position, zero), binary("add", position, n), position)


def _assign(
    ctx: LowerContext, dims: Sequence[str], shape: Sequence[int], expr: Expr, where: str = ""
) -> Statement:
    """output[dims] = expr over the output's box (restricted by `where`)."""
    name = ctx.statement_name()
    domain = ctx.domain(name, dims, shape, where)
    return Statement(name, tuple(dims), domain, ctx.output(), tuple(dims), expr)


def _pieces(
    ctx: LowerContext, dims: Sequence[str], shape: Sequence[int], parts: Sequence[tuple[str, Expr]]
) -> list[Statement]:
    """One statement per (constraint, value) piece of the output, empty pieces left out
    (but one kept for an empty output, so that the kernel has a statement)."""
    found = [_assign(ctx, dims, shape, expr, where) for where, expr in parts]
    kept = [s for s in found if not isl.Set(s.domain, context=ih.CTX).is_empty()]
    return kept or found[:1]


# --- gathers ------------------------------------------------------------------------------


@lowering("Gather")
def _gather(ctx: LowerContext) -> list[Statement]:
    """Y[a..., j..., b...] = X[a..., idx, b...] with idx = indices[j...]."""
    x, indices = ctx.input_type(0), ctx.input_type(1)
    axis = _axis(ctx, x.rank)
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    q = indices.rank
    position = ctx.load(ctx.node.inputs[1], dims[axis : axis + q])
    index: list[str | Expr] = [
        *dims[:axis],
        _wrapped(ctx, position, x.shape[axis], 1),
        *dims[axis + q :],
    ]
    return [_assign(ctx, dims, out.shape, ctx.load(ctx.node.inputs[0], index))]


@lowering("GatherElements")
def _gather_elements(ctx: LowerContext) -> list[Statement]:
    """Y[p] = X[p with p[axis] = indices[p]]."""
    x = ctx.input_type(0)
    axis = _axis(ctx, x.rank)
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    position = _wrapped(ctx, ctx.load(ctx.node.inputs[1], dims), x.shape[axis], 1)
    index: list[str | Expr] = list(dims)
    index[axis] = position
    return [_assign(ctx, dims, out.shape, ctx.load(ctx.node.inputs[0], index))]


@lowering("GatherND")
def _gather_nd(ctx: LowerContext) -> list[Statement]:
    """Y[b..., i..., r...] = X[b..., indices[b..., i..., 0..m-1], r...]."""
    x, indices = ctx.input_type(0), ctx.input_type(1)
    b = int(ctx.attr("batch_dims", 0))  # type: ignore[arg-type]
    m = indices.shape[-1]
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    lead = dims[: indices.rank - 1]  # the batch and index dims
    rest = dims[indices.rank - 1 :]
    tuple_index: list[str | Expr] = [
        _wrapped(ctx, ctx.load(ctx.node.inputs[1], [*lead, str(k)]), x.shape[b + k], 1)
        for k in range(m)
    ]
    index = [*lead[:b], *tuple_index, *rest]
    return [_assign(ctx, dims, out.shape, ctx.load(ctx.node.inputs[0], index))]


# --- scatters -----------------------------------------------------------------------------


def ctx_const(value: int) -> Expr:
    return LowerContext.const(value, "int64")


def _linear(dims: Sequence[str], shape: Sequence[int]) -> Expr:
    """The row-major number of the point `dims` in a box of `shape`, as an int64 Expr."""
    total: Expr | None = None
    stride = 1
    for dim, size in reversed(list(zip(dims, shape, strict=True))):
        term: Expr = Iter(dim, "int64")
        if stride != 1:
            term = binary("mul", term, ctx_const(stride))
        total = term if total is None else binary("add", term, total)
        stride *= size
    return total if total is not None else ctx_const(0)


def _unlinear(number: Expr, shape: Sequence[int]) -> list[Expr]:
    """The point of a box of `shape` whose row-major number is `number` (>= 0)."""
    found = []
    stride = math.prod(shape)
    for size in shape:
        stride //= size
        entry = binary("div", number, ctx_const(stride)) if stride != 1 else number
        found.append(binary("mod", entry, ctx_const(size)) if size != 1 else ctx_const(0))
    return found


def _all(terms: Sequence[Expr]) -> Expr:
    result = terms[0]
    for term in terms[1:]:
        result = binary("and", result, term)
    return result


Box = tuple[Sequence[str], Sequence[int]]


def _affordable(ctx: LowerContext, positions: int, updates: int) -> None:
    """Refuse a scatter comparing more than `SCATTER_COMPARISONS` pairs (see the module
    doc), naming the node and its sizes."""
    pairs = positions * updates
    if pairs > SCATTER_COMPARISONS:
        raise ctx.unsupported(
            f"scattering into data {list(ctx.input_type(0).shape)} compares {positions} "
            f"output positions with {updates} run-time updates each ({pairs:.2g} pairs, "
            f"more than {SCATTER_COMPARISONS:.0e}); writes through run-time indices are "
            "not supported"
        )


def _combine(
    ctx: LowerContext, out: Box, j: Box, hit: Expr, update: Expr, how: str, where: Sequence[str]
) -> list[Statement]:
    """Y[out] = data[out] combined (`how`) with `update` of every update j that hits."""
    dtype = ctx.input_type(0).dtype
    combiner = COMBINER[how]
    skip = ctx.const(identity(combiner, dtype), dtype)  # type: ignore[arg-type]
    return reduction(
        ctx,
        f"{ctx.node.name}_{how}",
        out,
        j,
        ctx.output(),
        out[0],
        select(hit, update, skip),
        combiner,
        where=where,
        start=ctx.load(ctx.node.inputs[0], out[0]),
    )


def _last(ctx: LowerContext, q: Box, j: Box, hit: Expr, where: Sequence[str]) -> list[Statement]:
    """last[q] = the row-major number of the last update j hitting q, -1 for none."""
    last = ctx.temp("last", q[1], "int64")
    number = select(hit, _linear(*j), ctx_const(-1))
    return reduction(
        ctx, f"{ctx.node.name}_last", q, j, last, q[0], number, "max", where, ctx_const(-1)
    )


def _chosen(ctx: LowerContext, last: str, q: Sequence[str], update: Sequence[str | Expr]) -> Expr:
    """updates[update] where last[q] names an update, else data (the update's index is
    built from max(last, 0), so the load stays inside `updates` either way)."""
    found = ctx.load_temp(last, q)
    dims = ctx.dims(ctx.input_type(0).rank)
    return select(
        binary("ge", found, ctx_const(0)),
        ctx.load(ctx.node.inputs[2], update),
        ctx.load(ctx.node.inputs[0], dims),
    )


@lowering("ScatterElements")
def _scatter_elements(ctx: LowerContext) -> list[Statement]:
    """Y = data; Y[p with p[axis] = indices[u]] op= updates[u] for every u, where u and p
    agree off the axis."""
    data, indices = ctx.input_type(0), ctx.input_type(1)
    axis = _axis(ctx, data.rank)
    dims = ctx.dims(data.rank)
    source = tuple("j" if a == axis else d for a, d in enumerate(dims))
    position = _wrapped(ctx, ctx.load(ctx.node.inputs[1], source), data.shape[axis], 1)
    hit = binary("eq", position, Iter(dims[axis], "int64"))
    # only positions inside the updates' box off the axis can be hit
    inside = [
        f"{d} < {indices.shape[a]}"
        for a, d in enumerate(dims)
        if a != axis and indices.shape[a] < data.shape[a]
    ]
    how = scatter_reduction(ctx.infer_context())
    reach = [
        min(n, m) if a != axis else n
        for a, (n, m) in enumerate(zip(data.shape, indices.shape, strict=True))
    ]
    _affordable(ctx, math.prod(reach), indices.shape[axis])
    out: Box = (dims, data.shape)
    j: Box = (("j",), (indices.shape[axis],))
    if how != "none":
        return _combine(ctx, out, j, hit, ctx.load(ctx.node.inputs[2], source), how, inside)
    statements = _last(ctx, out, j, hit, inside)
    last = statements[-1].tensor
    update: list[str | Expr] = list(dims)
    update[axis] = binary("max", ctx.load_temp(last, dims), ctx_const(0))
    parts: list[tuple[str, Expr]] = [(" and ".join(inside), _chosen(ctx, last, dims, update))]
    original = ctx.load(ctx.node.inputs[0], dims)
    for n, bound in enumerate(inside):  # the positions no update reaches keep data
        parts.append((" and ".join([*inside[:n], bound.replace("<", ">=")]), original))
    return statements + _pieces(ctx, dims, data.shape, parts)


@lowering("ScatterND")
def _scatter_nd(ctx: LowerContext) -> list[Statement]:
    """Y = data; Y[indices[u], r...] op= updates[u, r...] for every index tuple u."""
    data, indices = ctx.input_type(0), ctx.input_type(1)
    m = indices.shape[-1]
    dims = ctx.dims(data.rank)
    q_dims, rest_dims = dims[:m], dims[m:]
    u_shape = indices.shape[:-1]
    u_dims = ctx.dims(len(u_shape), "j")
    hit = _all(
        [
            binary(
                "eq",
                _wrapped(ctx, ctx.load(ctx.node.inputs[1], [*u_dims, str(c)]), data.shape[c], 1),
                Iter(q_dims[c], "int64"),
            )
            for c in range(m)
        ]
    )
    how = scatter_reduction(ctx.infer_context())
    # with a reduction every element combines; without, a position's last update is found
    _affordable(ctx, math.prod(data.shape if how != "none" else data.shape[:m]), math.prod(u_shape))
    j: Box = (u_dims, u_shape)
    if how != "none":
        update = ctx.load(ctx.node.inputs[2], [*u_dims, *rest_dims])
        return _combine(ctx, (dims, data.shape), j, hit, update, how, ())
    statements = _last(ctx, (q_dims, data.shape[:m]), j, hit, ())
    last = statements[-1].tensor
    number = binary("max", ctx.load_temp(last, q_dims), ctx_const(0))
    value = _chosen(ctx, last, q_dims, [*_unlinear(number, u_shape), *rest_dims])
    return [*statements, _assign(ctx, dims, data.shape, value)]


# --- OneHot, TopK, Trilu, EyeLike -----------------------------------------------------------


@lowering("OneHot")
def _onehot(ctx: LowerContext) -> list[Statement]:
    """Y[a..., d, b...] = values[1] if wrap(indices[a..., b...]) == d else values[0]; an
    index outside [-depth, depth-1] matches no d (an all-off row, as ONNX says)."""
    info = ctx.infer_context()
    depth, axis = onehot_depth(info), onehot_axis(info)
    out = ctx.output_type()
    dims = ctx.dims(out.rank)
    values = ctx.input_type(2)
    raw = ctx.load(ctx.node.inputs[0], [d for a, d in enumerate(dims) if a != axis])
    position = as_dtype(raw, "int64")
    zero, n = ctx.const(0, "int64"), ctx.const(depth, "int64")
    position = select(binary("lt", position, zero), binary("add", position, n), position)
    flat = ["0"] * (values.rank - 1)
    on = ctx.load(ctx.node.inputs[2], [*flat, "1"])
    off = ctx.load(ctx.node.inputs[2], [*flat, "0"])
    value = select(binary("eq", position, Iter(dims[axis], "int64")), on, off)
    return [_assign(ctx, dims, out.shape, value)]


def _order(a: Expr, b: Expr, largest: bool) -> tuple[Expr, Expr]:
    """(a comes before b, a ties with b) in TopK's total order: by value, NaN above every
    number (onnxruntime's order: first when largest, last when smallest), NaNs equal."""
    if np.dtype(a.dtype).kind != "f":
        return binary("gt" if largest else "lt", a, b), binary("eq", a, b)
    a_nan, b_nan = binary("ne", a, a), binary("ne", b, b)
    if largest:
        first = binary("or", binary("gt", a, b), binary("and", a_nan, unary("not", b_nan)))
    else:
        first = binary("or", binary("lt", a, b), binary("and", b_nan, unary("not", a_nan)))
    return first, binary("or", binary("eq", a, b), binary("and", a_nan, b_nan))


def _topk_layout(x_dtype: str, largest: bool) -> tuple[str, str, int]:
    """(accumulator dtype, combiner, phases): float64 holds every float value and the
    positions exactly; integers keep their signedness in 64 bits; floats have a class
    phase for NaN."""
    kind = np.dtype(x_dtype).kind
    acc = (
        "float64"
        if kind == "f" or x_dtype == "bfloat16"
        else ("uint64" if kind == "u" else "int64")
    )
    return acc, "max" if largest else "min", 3 if acc == "float64" else 2


@lowering("TopK")
def _topk(ctx: LowerContext) -> list[Statement]:
    """T[.., p + 1, .., phase] over pass p and element j (T[.., 0, .., last] = 0 is the
    pick before the first); I[.., r, ..] = the position in T[.., r + 1, .., last];
    V = x[I]."""
    x = ctx.input_type(0)
    axis, k, largest = topk_facts(ctx.infer_context())
    n = x.shape[axis]
    acc, combiner, phases = _topk_layout(x.dtype, largest)
    dims = ctx.dims(x.rank)
    outer = [d for a, d in enumerate(dims) if a != axis]
    outer_shape = [e for a, e in enumerate(x.shape) if a != axis]
    out_shape = [k if a == axis else e for a, e in enumerate(x.shape)]

    def slot(place: str, phase: str) -> tuple[str, ...]:
        return (*(place if a == axis else d for a, d in enumerate(dims)), phase)

    table = ctx.temp(
        "picks", [*[k + 1 if a == axis else e for a, e in enumerate(x.shape)], phases], acc
    )
    last = str(phases - 1)

    def position(stored: Expr) -> Expr:
        """The position a stored pick names (its encoding makes the lowest position win
        under the combiner), kept inside the axis whatever the value."""
        value = as_dtype(stored, "int64")
        if largest:
            value = binary("sub", ctx_const(n - 1), value)
        return binary("min", binary("max", value, ctx_const(0)), ctx_const(n - 1))

    def element(place: Expr | str) -> Expr:
        return ctx.load(ctx.node.inputs[0], [place if a == axis else d for a, d in enumerate(dims)])

    statements: list[Statement] = []
    if k > 0 and math.prod(outer_shape) > 0:
        # the pick before the first: any position, never compared (pass 0 takes all)
        name = ctx.statement_name(f"{ctx.node.name}_start")
        domain = ctx.domain(name, outer, outer_shape)
        start = Statement(name, tuple(outer), domain, table, slot("0", last), ctx.const(0, acc))
        statements.append(start)
        previous = position(ctx.load_temp(table, slot("p", last)))
        mine = element("j")
        before, tie = _order(element(previous), mine, largest)
        later = binary("and", tie, binary("lt", previous, Iter("j")))
        eligible = binary("or", binary("eq", Iter("p"), ctx_const(0)), binary("or", before, later))
        skip = ctx.const(identity(combiner, acc), acc)  # type: ignore[arg-type]
        number = as_dtype(Iter("j"), acc)
        if largest:
            number = binary("sub", ctx.const(n - 1, acc), number)
        value = as_dtype(mine, acc)
        found = [ctx.load_temp(table, slot("p + 1", str(ph))) for ph in range(phases)]
        if phases == 3:
            nan = binary("ne", mine, mine)
            kind = select(nan, ctx.const(1, acc), ctx.const(0, acc))
            in_class = binary("and", eligible, binary("eq", kind, found[0]))
            best = select(binary("and", in_class, unary("not", nan)), value, skip)
            hit = binary("or", nan, binary("eq", value, found[1]))
            parts = [
                select(eligible, kind, skip),
                best,
                select(binary("and", in_class, hit), number, skip),
            ]
        else:
            hit = binary("and", eligible, binary("eq", value, found[0]))
            parts = [select(eligible, value, skip), select(hit, number, skip)]
        expr = parts[-1]
        for ph in range(phases - 2, -1, -1):
            expr = select(binary("eq", Iter("phase"), ctx_const(ph)), parts[ph], expr)
        statements += reduction(
            ctx,
            f"{ctx.node.name}_pass",
            ((*outer, "p", "phase"), (*outer_shape, k, phases)),
            (("j",), (n,)),
            table,
            slot("p + 1", "phase"),
            expr,
            combiner,
        )
    picked = position(ctx.load_temp(table, slot(f"{dims[axis]} + 1", last)))
    for out, value in ((1, picked), (0, element(picked))):
        name = ctx.statement_name()
        domain = ctx.domain(name, dims, out_shape)
        statements.append(Statement(name, dims, domain, ctx.output(out), dims, value))
    return statements


@lowering("Trilu")
def _trilu(ctx: LowerContext) -> list[Statement]:
    """The kept triangle copied, the other zeroed: two pieces of the output."""
    x = ctx.input_type(0)
    k = trilu_k(ctx.infer_context())
    dims = ctx.dims(x.rank)
    i, j = dims[-2:]
    upper = bool(int(ctx.attr("upper", 1)))  # type: ignore[arg-type]
    keep = f"{j} - {i} >= {k}" if upper else f"{j} - {i} <= {k}"
    drop = f"{j} - {i} < {k}" if upper else f"{j} - {i} > {k}"
    zero = ctx.const(0, x.dtype)
    copy = ctx.load(ctx.node.inputs[0], dims)
    return _pieces(ctx, dims, x.shape, [(keep, copy), (drop, zero)])


@lowering("EyeLike")
def _eyelike(ctx: LowerContext) -> list[Statement]:
    """Ones on the k-th diagonal, zeros elsewhere: three pieces of the output."""
    out = ctx.output_type()
    k = int(ctx.attr("k", 0))  # type: ignore[arg-type]
    dims = ctx.dims(2)
    i, j = dims
    one, zero = ctx.const(1, out.dtype), ctx.const(0, out.dtype)
    parts = [(f"{j} = {i} + {k}", one), (f"{j} < {i} + {k}", zero), (f"{j} > {i} + {k}", zero)]
    return _pieces(ctx, dims, out.shape, parts)
