"""Inlining of elementwise / injective producers (Ansor's "inline" rule): the statements
that write a temporary are substituted into every load of it, so the consumer recomputes
each element where it needs it instead of reading it back from memory.

    P[i, j]  = exp(A[j, i])                 becomes    Y[i] += exp(A[k, i]) * 2
    Y[i]    += P[i, k] * 2

The producer's index is inverted exactly (each index entry is `±d + c` of its own dim d),
so the substitution is a rewrite of index text. A temporary written in pieces (Pad: an
interior copy and a border of constants) becomes a select on the consumer's position: the
piece whose condition is hardest to state goes last, unguarded. Native code evaluates both
sides of a select, so the loads of a guarded expression are wrapped into the tensor
(`e mod n`) wherever they could leave it; the wrapped value is never selected.

Legal only when the result is exactly the materialized program's: see `inline`. The
schedule step removes the producers' leaves and keeps every other loop and its name, so
the steps after it in a trace refer to the same loops.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import islpy as isl

from polytile.errors import IllegalSchedule
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    Iter,
    Load,
    Select,
    loads,
    rewrite,
    walk,
)
from polytile.poly.ir.kernel import Kernel, Role, Statement
from polytile.poly.ir.schedule import Leaf, Loop, Node, Schedule, Step, check_marks, check_order


def inline(kernel: Kernel, statement: str) -> Kernel:
    """The kernel with `statement` (and every other statement writing its temporary, the
    pieces of one tensor) substituted into the loads of that temporary, and without them.

    Legal when: the writers are neither reductions nor inits and write a TEMP tensor that
    they do not read; each writer's index is `±d + c` per entry, every dim in exactly one
    entry (so each element is written once and the index inverts exactly); the writers'
    ranges are disjoint; the writers read no iteration values, and pieced writers no
    indirect index; every consumer load of the temporary has an affine index inside the
    writers' ranges (else it would read what was never written); the consumers come after
    the writers, and nothing is written between them to a tensor the writers read.
    Otherwise `IllegalSchedule` names the kernel, the statement and the reason."""
    where = f"kernel {kernel.name}: inline({statement})"

    def refuse(reason: str) -> IllegalSchedule:
        return IllegalSchedule(f"{where}: {reason}")

    if statement not in kernel.statement:
        raise refuse(f"no statement '{statement}'")
    temp = kernel.tensors[kernel.statement[statement].tensor]
    if temp.role is not Role.TEMP:
        raise refuse(f"it writes {temp.name} ({temp.role.value}), not a temporary")
    order = {s.name: n for n, s in enumerate(kernel.statements)}
    writers = [s for s in kernel.statements if s.tensor == temp.name]
    for w in sorted(writers, key=lambda w: w.name != statement):  # the named one first
        if w.reduction is not None or w.init_of is not None:
            kind = "a reduction" if w.reduction is not None else "an init"
            if w.name == statement:
                raise refuse(f"{statement} is {kind}")
            raise refuse(f"{temp.name} is also written by {kind} ({w.name})")
        if any(ld.tensor == temp.name for ld in loads(w.expr)):
            raise refuse(f"{w.name} reads the temporary {temp.name} it writes")
        if any(isinstance(e, Iter) for e in walk(w.expr)):
            raise refuse(f"{w.name} reads iteration values, which have no substitute")
    inverses = {w.name: _inverse(w, refuse) for w in writers}
    ranges = [w.write_map().range() for w in writers]
    for a in range(len(writers)):
        for b in range(a + 1, len(writers)):
            if not ranges[a].intersect(ranges[b]).is_empty():
                raise refuse(f"{writers[a].name} and {writers[b].name} write the same elements")
    written = ranges[0]
    for r in ranges[1:]:
        written = written.union(r)
    consumers = [
        s.name
        for s in kernel.statements
        if s.tensor != temp.name and any(ld.tensor == temp.name for ld in loads(s.expr))
    ]
    if not consumers:
        raise refuse(f"nothing reads {temp.name}")
    first, last = min(order[w.name] for w in writers), max(order[w.name] for w in writers)
    for c in consumers:
        if order[c] < last:
            raise refuse(f"{c} reads {temp.name} before it is written")
    for tensor in {ld.tensor for w in writers for ld in loads(w.expr)}:
        late = [s.name for s in kernel.statements if s.tensor == tensor and order[s.name] >= first]
        if late:
            raise refuse(f"{late[0]} writes {tensor}, which the producer reads, after it starts")
    if len(writers) > 1 and any(
        not isinstance(i, str) for w in writers for ld in loads(w.expr) for i in ld.index
    ):
        raise refuse(f"{temp.name} is written in pieces with an indirect load")

    def substitute(consumer: Statement) -> Callable[[Expr], Expr | None]:
        def fn(e: Expr) -> Expr | None:
            if not isinstance(e, Load) or e.tensor != temp.name:
                return None
            if not all(isinstance(i, str) for i in e.index):
                raise refuse(f"{consumer.name} reads {temp.name} at an indirect index")
            index: tuple[str, ...] = e.index  # type: ignore[assignment]
            read = consumer._load_map(Load(temp.name, index, temp.dtype))
            if not read.range().is_subset(written):
                outside = read.subtract_range(written)
                raise refuse(
                    f"{consumer.name} reads {temp.name} outside what its producers write "
                    f"({outside.sample()})"
                )
            pieces = []
            for w, r in zip(writers, ranges, strict=True):
                cond = read.intersect_range(r).domain()
                if not cond.is_empty():
                    pieces.append((w, cond.gist(consumer.domain_set())))
            return _combine(kernel, consumer, e, pieces, inverses, refuse)

        return fn

    statements = tuple(
        replace(s, expr=rewrite(s.expr, substitute(s))) if s.name in consumers else s
        for s in kernel.statements
        if s.tensor != temp.name
    )
    tensors = {k: t for k, t in kernel.tensors.items() if k != temp.name}
    return Kernel(kernel.name, tensors, statements)


def _inverse(
    w: Statement, refuse: Callable[[str], IllegalSchedule]
) -> dict[str, tuple[int, int, int]]:
    """Each dim of `w` as (entry, sign, constant): the entry of the written index that is
    `sign * dim + constant`, so that `dim = sign * (entry - constant)` exactly."""
    found: dict[str, tuple[int, int, int]] = {}
    for position, entry in enumerate(w.index):
        form = ih.linear(w.dims, entry)
        if form is None:
            raise refuse(f"{w.name} writes at '{entry}', which is not affine")
        coefficients, constant = form
        if len(coefficients) > 1 or any(abs(c) != 1 for c in coefficients.values()):
            raise refuse(f"{w.name} writes at '{entry}', which does not invert to one dim")
        for dim, sign in coefficients.items():
            if dim in found:
                raise refuse(f"{w.name} uses {dim} in two entries of its index")
            found[dim] = (position, sign, constant)
    missing = [d for d in w.dims if d not in found]
    if missing:
        raise refuse(f"{w.name}'s dims {missing} are not in its index (elements written twice)")
    return found


def _combine(
    kernel: Kernel,
    consumer: Statement,
    load: Load,
    pieces: list[tuple[Statement, isl.Set]],
    inverses: dict[str, dict[str, tuple[int, int, int]]],
    refuse: Callable[[str], IllegalSchedule],
) -> Expr:
    """The value of `load` from the pieces that it reads: one expression, or a select
    chain over the pieces' conditions with the most complex one last (unguarded)."""
    index: tuple[str, ...] = load.index  # type: ignore[assignment]
    if not pieces:  # an empty domain (a reduction over nothing) reads no element
        raise refuse(f"{consumer.name} reads no element of {load.tensor} that is written")

    def value(w: Statement) -> Expr:
        bound = {}
        for dim, (position, sign, constant) in inverses[w.name].items():
            entry = index[position]
            if constant:
                entry = f"({entry}) {'-' if constant > 0 else '+'} {abs(constant)}"
            bound[dim] = entry if sign == 1 else f"-({entry})"
        expr = rewrite(w.expr, _rename(bound, kernel, consumer, wrap=len(pieces) > 1))
        return expr if expr.dtype == load.dtype else Cast(expr, load.dtype)

    if len(pieces) == 1:
        return value(pieces[0][0])
    conditions = []
    for w, cond in pieces:
        form = ih.conjunctions(cond)
        if form is None:
            raise refuse(f"the part of {consumer.name} that reads {w.name} needs a division")
        conditions.append((w, form))
    # the condition with the most disjuncts, then constraints, is the one left unstated
    conditions.sort(key=lambda wc: (len(wc[1]), sum(len(c) for c in wc[1])))
    expr = value(conditions[-1][0])
    for w, form in reversed(conditions[:-1]):
        expr = Select(_condition(form), value(w), expr, load.dtype)
    return expr


def _rename(
    bound: dict[str, str], kernel: Kernel, consumer: Statement, wrap: bool
) -> Callable[[Expr], Expr | None]:
    """Loads over the producer's dims → over the consumer's (all dims at once, each
    replacement parenthesized); with `wrap`, entries that may leave the tensor on the
    consumer's domain are taken modulo its size (selected only where they stay inside)."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, bound)) + r")(?![\w.])")

    def text(entry: str) -> str:
        return pattern.sub(lambda m: f"({bound[m.group(1)]})", entry) if bound else entry

    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Load):
            return None
        shape = kernel.tensors[e.tensor].shape
        index: list[str | Expr] = []
        for size, entry in zip(shape, e.index, strict=True):
            if isinstance(entry, str):
                entry = text(entry)
                if wrap:
                    lo, hi = ih.value_range(consumer.domain_set(), entry)
                    if lo < 0 or hi >= size:
                        entry = f"({entry}) - {size}*floor(({entry})/{size})"
            index.append(entry)
        return Load(e.tensor, tuple(index), e.dtype)

    return fn


def _sum(terms: list[tuple[str, int]], constant: int) -> Expr:
    """`Σ c·dim + constant` with positive coefficients, as an int64 expression."""
    total: Expr | None = None
    for dim, c in terms:
        term: Expr = Iter(dim) if c == 1 else Binary("mul", Const(c, "int64"), Iter(dim), "int64")
        total = term if total is None else Binary("add", total, term, "int64")
    if total is None:
        return Const(constant, "int64")
    return Binary("add", total, Const(constant, "int64"), "int64") if constant else total


def _constraint(form: ih.Linear, equality: bool) -> Expr:
    """`Σ c·d + k >= 0` (or `= 0`) as `positive terms >= negative terms - k`."""
    coefficients, constant = form
    plus = [(d, c) for d, c in coefficients.items() if c > 0]
    minus = [(d, -c) for d, c in coefficients.items() if c < 0]
    if plus:
        return Binary("eq" if equality else "ge", _sum(plus, 0), _sum(minus, -constant), "bool")
    return Binary("eq" if equality else "le", _sum(minus, 0), Const(constant, "int64"), "bool")


def _condition(form: list[list[tuple[ih.Linear, bool]]]) -> Expr:
    """A disjunction of conjunctions of affine constraints as a boolean expression."""
    disjuncts = [_join("and", [_constraint(f, eq) for f, eq in c], True) for c in form]
    return _join("or", disjuncts, False)


def _join(op: str, items: list[Expr], empty: bool) -> Expr:
    if not items:
        return Const(empty, "bool")
    out = items[0]
    for item in items[1:]:
        out = Binary(op, out, item, "bool")
    return out


# --- the schedule step ---------------------------------------------------------------------


def inline_statement(schedule: Schedule, stmt: str) -> Schedule:
    """The step: inline `stmt` (see `inline`) and drop its leaves from the tree, keeping
    every other loop; the result must keep every dependence and every mark legal."""
    step = f"inline({stmt})"
    kernel = inline(schedule.kernel, stmt)
    gone = set(schedule.kernel.statement) - set(kernel.statement)
    body = _prune(schedule.body, gone)
    result = replace(
        schedule, kernel=kernel, body=body, trace=(*schedule.trace, Step("inline", {"stmt": stmt}))
    )
    # only the consumers' accesses changed, and their loops did not: the dependences
    # between two other statements are the old kernel's, kept by the old schedule
    changed = [s.name for s in kernel.statements if schedule.kernel.statement[s.name] != s]
    check_order(result, step, changed)
    return check_marks(result, f"kernel {kernel.name}: {step}")


def _prune(nodes: tuple[Node, ...], gone: set[str]) -> tuple[Node, ...]:
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, Leaf):
            if node.stmt not in gone:
                out.append(node)
            continue
        body = _prune(node.body, gone)
        if body:
            exprs = {s: e for s, e in node.exprs.items() if s not in gone}
            out.append(Loop(node.name, exprs, body, node.annotation))
    return tuple(out)
