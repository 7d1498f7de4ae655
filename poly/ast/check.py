"""Check, exactly and without running it, that an AST executes every statement instance
exactly once: the last line of defence before codegen.

isl's AST generator has bugs: on a schedule tree whose inner band is degenerate given
an outer fused band involving a modulo (band `19i + j`, then band `j mod 8`) it emits
`c1 = <wrong closed form>` and silently skips instances (observed with islpy 2026.2).
So the AST is read back into isl: for every call, the iterators of the loops around it
with their bounds, strides and guards form a relation to the statement instances it
runs; the relations of one statement must be injective, pairwise disjoint, and cover
exactly the statement's domain.
"""

from __future__ import annotations

from collections.abc import Iterator

import islpy as isl

from polytile.errors import IllegalSchedule
from polytile.poly.ast.build import (
    AstExpr,
    AstNode,
    Block,
    Call,
    For,
    If,
    Int,
    Mark,
    Op,
    Var,
    build_ast,
)
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule

Piece = tuple[str, str]  # (condition, quasi-affine text)
#: isl operations the check of one AST may take (the sets' unions, intersections and
#: comparisons): ten times what the zoo's largest default schedule needs. A fused loop
#: over guarded tiles can make the pieces' sets explode (the tuner met one that took
#: gigabytes and minutes); such a schedule is illegal rather than a hang.
CHECK_OPERATIONS = 1_000_000
_TRUE = "(0 = 0)"


class _Unsupported(Exception):
    """An AST expression this reader cannot express in isl (then no check is made)."""


def _and(*parts: str) -> str:
    kept = [p for p in parts if p and p != _TRUE]
    return " and ".join(f"({p})" for p in kept) if kept else _TRUE


def _pieces(e: AstExpr, names: dict[str, str]) -> list[Piece]:
    """The expression as (condition, value) pairs: one per branch of its selects."""
    if isinstance(e, Int):
        return [(_TRUE, str(e.value))]
    if isinstance(e, Var):
        if e.name not in names:
            raise _Unsupported(e.name)
        return [(_TRUE, names[e.name])]
    op = e.op
    if op == "select":
        cond = _cond(e.args[0], names)
        return [
            *((_and(cond, c), t) for c, t in _pieces(e.args[1], names)),
            *((_and(f"not ({cond})", c), t) for c, t in _pieces(e.args[2], names)),
        ]
    if op in ("eq", "le", "lt", "ge", "gt", "and", "or"):
        raise _Unsupported(op)
    args = [_pieces(a, names) for a in e.args]
    if op in ("fdiv_q", "pdiv_q", "div", "pdiv_r", "zdiv_r"):
        if not isinstance(e.args[1], Int) or e.args[1].value <= 0:
            raise _Unsupported(f"{op} by a non-constant")
        args[1] = [(_TRUE, str(e.args[1].value))]
    out: list[Piece] = []
    for combo in _product(args):
        cond = _and(*(c for c, _ in combo))
        texts = [t for _, t in combo]
        if op == "add":
            text = f"({texts[0]}) + ({texts[1]})"
        elif op == "sub":
            text = f"({texts[0]}) - ({texts[1]})"
        elif op == "mul":
            if texts[0].lstrip("-").isdigit():
                text = f"{texts[0]}*({texts[1]})"
            elif texts[1].lstrip("-").isdigit():
                text = f"{texts[1]}*({texts[0]})"
            else:
                raise _Unsupported("a product of two non-constants")
        elif op == "minus":
            text = f"-({texts[0]})"
        elif op in ("min", "max"):
            text = texts[0]
            for t in texts[1:]:
                text = f"{op}({text}, {t})"
        elif op in ("fdiv_q", "pdiv_q", "div"):
            text = f"floor(({texts[0]})/{texts[1]})"
        elif op in ("pdiv_r", "zdiv_r"):
            text = f"(({texts[0]}) mod {texts[1]})"
        else:
            raise _Unsupported(op)
        out.append((cond, text))
    return out


def _product(lists: list[list[Piece]]) -> Iterator[tuple[Piece, ...]]:
    if not lists:
        yield ()
        return
    for first in lists[0]:
        for rest in _product(lists[1:]):
            yield (first, *rest)


_COMPARE = {"eq": "=", "le": "<=", "lt": "<", "ge": ">=", "gt": ">"}


def _cond(e: AstExpr, names: dict[str, str]) -> str:
    if isinstance(e, Op) and e.op in _COMPARE:
        options = [
            _and(ca, cb, f"({ta}) {_COMPARE[e.op]} ({tb})")
            for ca, ta in _pieces(e.args[0], names)
            for cb, tb in _pieces(e.args[1], names)
        ]
        return " or ".join(f"({o})" for o in options)
    if isinstance(e, Op) and e.op in ("and", "or"):
        return f" {e.op} ".join(f"({_cond(a, names)})" for a in e.args)
    options = [_and(c, f"({t}) != 0") for c, t in _pieces(e, names)]
    return " or ".join(f"({o})" for o in options)


def _calls(
    node: AstNode, names: dict[str, str], conds: tuple[str, ...]
) -> Iterator[tuple[Call, dict[str, str], tuple[str, ...]]]:
    if isinstance(node, Block):
        for item in node.items:
            yield from _calls(item, names, conds)
    elif isinstance(node, Mark):
        yield from _calls(node.body, names, conds)
    elif isinstance(node, If):
        cond = _cond(node.cond, names)
        yield from _calls(node.then, names, (*conds, cond))
        if node.orelse is not None:
            yield from _calls(node.orelse, names, (*conds, f"not ({cond})"))
    elif isinstance(node, For):
        v = f"v{len(names)}"
        inner = {**names, node.var: v}
        if node.var in names:
            # a loop reusing an outer loop's iterator name: the outer one stays in the
            # relation's tuple (its bounds are among the conditions) under a hidden key
            inner[f"{node.var}'{len(names)}"] = names[node.var]
        lower = " or ".join(f"({_and(c, f'{v} >= ({t})')})" for c, t in _pieces(node.init, names))
        step = []
        if not isinstance(node.inc, Int):
            raise _Unsupported("a loop step that is not a constant")
        if node.inc.value != 1:
            starts = _pieces(node.init, names)
            step.append(
                " or ".join(
                    f"({_and(c, f'({v} - ({t})) mod {node.inc.value} = 0')})" for c, t in starts
                )
            )
        yield from _calls(node.body, inner, (*conds, lower, _cond(node.cond, inner), *step))
    elif isinstance(node, Call):
        yield node, names, conds


def verify_ast(schedule: Schedule, ast: AstNode | None = None) -> AstNode:
    """The schedule's AST, checked to run each statement instance exactly once; raises
    IllegalSchedule (naming the statement) otherwise."""
    kernel: Kernel = schedule.kernel
    ast = ast if ast is not None else build_ast(schedule)
    try:
        relations: dict[str, list[isl.Map]] = {}
        for call, names, conds in _calls(ast, {}, ()):
            stmt = kernel.statement[call.stmt]
            iters = sorted(names.values(), key=lambda n: int(n[1:]))
            outs = [f"o{i}" for i in range(len(call.args))]
            equal = []
            for o, arg in zip(outs, call.args, strict=True):
                equal.append(
                    " or ".join(f"({_and(c, f'{o} = ({t})')})" for c, t in _pieces(arg, names))
                )
            text = (
                f"{{ [{', '.join(iters)}] -> {stmt.name}[{', '.join(outs)}] : "
                f"{_and(*conds, *equal)} }}"
            )
            relations.setdefault(stmt.name, []).append(isl.Map(text, context=ih.CTX))
    except _Unsupported:
        return ast
    refusal = (
        f"kernel {kernel.name}: checking isl's AST for this schedule took too many isl "
        "operations (too many guarded pieces to trust it)"
    )
    with ih.operation_budget(CHECK_OPERATIONS, refusal, step="AST check"):
        _check_relations(kernel, relations)
    return ast


def _check_relations(kernel: Kernel, relations: dict[str, list[isl.Map]]) -> None:
    """Each statement's calls: injective, pairwise disjoint, covering its domain."""
    for s in kernel.statements:
        maps = relations.get(s.name, [])
        domain = s.domain_set()
        if not maps:
            if domain.is_empty():
                continue
            raise IllegalSchedule(f"kernel {kernel.name}: the AST never runs {s.name}")
        ranges = [m.range() for m in maps]
        covered = ranges[0]
        for other in ranges[1:]:
            if not covered.intersect(other).is_empty():
                raise IllegalSchedule(f"kernel {kernel.name}: the AST runs {s.name} twice")
            covered = covered.union(other)
        if any(not m.is_injective() for m in maps):
            raise IllegalSchedule(f"kernel {kernel.name}: the AST runs {s.name} twice")
        if not covered.is_equal(domain):
            missing = domain.subtract(covered)
            extra = covered.subtract(domain)
            what = (
                f"misses {missing.sample_point()}"
                if not missing.is_empty()
                else (f"runs {extra.sample_point()} outside the domain")
            )
            raise IllegalSchedule(
                f"kernel {kernel.name}: isl's AST for this schedule {what} of {s.name}"
            )
