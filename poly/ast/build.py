"""The loop AST of a schedule: isl's AST generator output converted to frozen dataclasses,
with iterators renamed after the schedule's loops and marks kept as annotations, and the
partial-tile bounds that do not vary in a loop hoisted into a test around it
(`unswitch_partial_trips`) and partial register tiles run in blocks of constant
heights (`rows.split_partial_rows`).

Codegen, the AST interpreter and `explain` consume this AST, never islpy objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

import islpy as isl

from polytile.poly.ast.facts import prune_decided
from polytile.poly.ast.nodes import (
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
    expr_vars,
    map_exprs,
)
from polytile.poly.ast.rows import split_partial_rows
from polytile.poly.ast.tiles import CONSTANT_TRIPS, isolate_full_tiles
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.kernel import Kernel, Statement
from polytile.poly.ir.schedule import Schedule, parse_mark, to_isl

_OPS = {
    isl.ast_expr_op_type.add: "add",
    isl.ast_expr_op_type.sub: "sub",
    isl.ast_expr_op_type.mul: "mul",
    isl.ast_expr_op_type.minus: "minus",
    isl.ast_expr_op_type.min: "min",
    isl.ast_expr_op_type.max: "max",
    isl.ast_expr_op_type.div: "div",
    isl.ast_expr_op_type.fdiv_q: "fdiv_q",
    isl.ast_expr_op_type.pdiv_q: "pdiv_q",
    isl.ast_expr_op_type.pdiv_r: "pdiv_r",
    isl.ast_expr_op_type.zdiv_r: "zdiv_r",
    isl.ast_expr_op_type.select: "select",
    isl.ast_expr_op_type.cond: "select",
    isl.ast_expr_op_type.eq: "eq",
    isl.ast_expr_op_type.le: "le",
    isl.ast_expr_op_type.lt: "lt",
    isl.ast_expr_op_type.ge: "ge",
    isl.ast_expr_op_type.gt: "gt",
    isl.ast_expr_op_type.and_: "and",
    isl.ast_expr_op_type.or_: "or",
    isl.ast_expr_op_type.and_then: "and",
    isl.ast_expr_op_type.or_else: "or",
}


#: isl operations one AST generation may take: several times what the largest default
#: schedule of the zoo needs (VGG-19's Winograd convs, with AVX-512 and with AVX2), room
#: for the search's candidates of such kernels. isl's AST generator can blow up
#: (minutes) on fused loops over guarded, non-divisible tiles; such a schedule is
#: illegal rather than a hang.
AST_OPERATIONS = 4_000_000


def build_ast(schedule: Schedule) -> AstNode:
    """isl's AST for the schedule, converted and with loop names as iterators."""
    params = schedule.kernel.params
    context = f"[{', '.join(params)}] -> {{ : {' and '.join(f'{p} >= 1' for p in params)} }}"
    build = isl.AstBuild.from_context(isl.Set(context if params else "{ : }"))
    refusal = (
        f"kernel {schedule.kernel.name}: isl's AST generator gave up on the schedule "
        "(too many guarded pieces)"
    )
    with ih.operation_budget(AST_OPERATIONS, refusal, step="AST generation"):
        tree = isolate_full_tiles(to_isl(schedule))
        node = build.node_from_schedule(tree)
    ast = unswitch_partial_trips(_node(node, {}))
    ast = prune_decided(ast, params)  # branches the tests around them rule out
    return split_partial_rows(ast, schedule.kernel)


def marked_loops(node: AstNode) -> set[str]:
    """Loops that isl emitted without a `for` somewhere (a piece that runs once)."""
    if isinstance(node, Mark):
        return {node.loop} | marked_loops(node.body)
    if isinstance(node, Block):
        return set().union(*(marked_loops(item) for item in node.items))
    if isinstance(node, For):
        return marked_loops(node.body)
    if isinstance(node, If):
        marked = marked_loops(node.then)
        return marked if node.orelse is None else marked | marked_loops(node.orelse)
    return set()


def parameter_expr(value: isl.PwAff, names: str | Sequence[str]) -> AstExpr | None:
    """A function of loop iterators as an expression in the variables `names` (one per
    input dim); None unless it is one quasi-affine piece with integer coefficients.
    (isl's own `expr_from_pw_aff`, from a build without loops, failed with "spaces don't
    match" on AlexNet's origin, which has a modulo.)"""
    variables = [names] if isinstance(names, str) else list(names)
    pieces: list[isl.Aff] = []
    value.foreach_piece(lambda _where, aff: pieces.append(aff))
    if not pieces or any(not p.plain_is_equal(pieces[0]) for p in pieces[1:]):
        return None
    aff = pieces[0]
    if aff.dim(isl.dim_type.in_) != len(variables):
        return None
    local = aff.get_domain_local_space()
    divs: list[AstExpr] = []
    for k in range(aff.dim(isl.dim_type.div)):
        inner = local.get_div(k)
        denominator = inner.get_denominator_val()
        numerator = _affine_terms(inner, denominator, variables, divs)
        if numerator is None:
            return None
        divs.append(Op("fdiv_q", (numerator, Int(int(denominator.to_python())))))
    return _affine_terms(aff, isl.Val.one(aff.get_ctx()), variables, divs)


def _affine_terms(
    aff: isl.Aff, scale: isl.Val, variables: list[str], divs: list[AstExpr]
) -> AstExpr | None:
    """`scale` times the aff, over its dims and the divisions in `divs`; None when a
    coefficient is not an integer or the aff uses a division not in `divs`."""
    values = [aff.get_constant_val()]
    values += [aff.get_coefficient_val(isl.dim_type.in_, i) for i in range(len(variables))]
    values += [aff.get_coefficient_val(isl.dim_type.div, k) for k in range(len(divs))]
    scaled = [v.mul(scale) for v in values]
    later = range(len(divs), aff.dim(isl.dim_type.div))
    if not all(v.is_int() for v in scaled) or any(
        not aff.get_coefficient_val(isl.dim_type.div, k).is_zero() for k in later
    ):
        return None
    constant, *coefficients = (int(v.to_python()) for v in scaled)
    terms: list[AstExpr] = [
        term if coefficient == 1 else Op("mul", (Int(coefficient), term))
        for coefficient, term in zip(coefficients, [*map(Var, variables), *divs], strict=True)
        if coefficient
    ]
    if constant or not terms:
        terms.append(Int(constant))
    expr = terms[0]
    for term in terms[1:]:
        expr = Op("add", (expr, term))
    return expr


def _expr(e: isl.AstExpr, names: Mapping[str, str]) -> AstExpr:
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return Int(int(e.get_val().to_python()))
    if kind == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        return Var(names.get(name, name))
    op = e.get_op_type()
    if op not in _OPS:
        raise NotImplementedError(f"isl AST operator {op}")
    args = tuple(_expr(e.get_op_arg(i), names) for i in range(e.get_op_n_arg()))
    return Op(_OPS[op], args)


def _node(n: isl.AstNode, names: Mapping[str, str]) -> AstNode:
    kind = n.get_type()
    if kind == isl.ast_node_type.for_:
        var = n.for_get_iterator().get_id().get_name()
        return For(
            names.get(var, var),
            _expr(n.for_get_init(), names),
            _expr(n.for_get_cond(), names),
            _expr(n.for_get_inc(), names),
            _node(n.for_get_body(), names),
        )
    if kind == isl.ast_node_type.if_:
        orelse = _node(n.if_get_else_node(), names) if n.if_has_else_node() else None
        return If(_expr(n.if_get_cond(), names), _node(n.if_get_then_node(), names), orelse)
    if kind == isl.ast_node_type.block:
        children = n.block_get_children()
        return Block(tuple(_node(children.get_at(i), names) for i in range(children.n_ast_node())))
    if kind == isl.ast_node_type.mark:
        loop, annotation = parse_mark(n.mark_get_id().get_name())
        return _claim(n.mark_get_node(), loop, annotation, names)
    if kind == isl.ast_node_type.user:
        call = n.user_get_expr()
        stmt = call.get_op_arg(0).get_id().get_name()
        args = tuple(_expr(call.get_op_arg(i), names) for i in range(1, call.get_op_n_arg()))
        return Call(stmt, args)
    raise NotImplementedError(f"isl AST node {kind}")


def _claim(n: isl.AstNode, loop: str, annotation: str, names: Mapping[str, str]) -> AstNode:
    """The code isl generated for a marked loop: its `for` nodes take the loop's name and
    annotation. isl may emit the loop in pieces (an isolated loop's full tiles and the
    rest, or one piece per guard); where a piece runs once there is no `for`, and a
    `Mark` keeps the annotation."""
    kind = n.get_type()
    if kind == isl.ast_node_type.for_:
        var = n.for_get_iterator().get_id().get_name()
        body = _node(n, {**names, var: loop})
        assert isinstance(body, For)
        return For(body.var, body.init, body.cond, body.inc, body.body, loop, annotation)
    if kind == isl.ast_node_type.block:
        children = n.block_get_children()
        return Block(
            tuple(
                _claim(children.get_at(i), loop, annotation, names)
                for i in range(children.n_ast_node())
            )
        )
    if kind == isl.ast_node_type.if_:
        orelse = (
            _claim(n.if_get_else_node(), loop, annotation, names) if n.if_has_else_node() else None
        )
        then = _claim(n.if_get_then_node(), loop, annotation, names)
        return If(_expr(n.if_get_cond(), names), then, orelse)
    return Mark(loop, annotation, _node(n, names))


# --- printing ------------------------------------------------------------------------

_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "eq": "==",
    "le": "<=",
    "lt": "<",
    "ge": ">=",
    "gt": ">",
    "and": "&&",
    "or": "||",
    "div": "/",
    "pdiv_q": "/",
    "pdiv_r": "%",
    "zdiv_r": "%",
}


def expr_str(e: AstExpr) -> str:
    if isinstance(e, Int):
        return str(e.value)
    if isinstance(e, Var):
        return e.name
    a = [expr_str(x) for x in e.args]
    if e.op in _INFIX:
        return f"({a[0]} {_INFIX[e.op]} {a[1]})"
    if e.op == "minus":
        return f"-{a[0]}"
    if e.op == "fdiv_q":
        return f"floord({a[0]}, {a[1]})"
    if e.op == "select":
        return f"({a[0]} ? {a[1]} : {a[2]})"
    return f"{e.op}({', '.join(a)})"


def statement_text(stmt: Statement, args: tuple[AstExpr, ...]) -> str:
    """The statement with its dims replaced by the AST's argument expressions."""
    values = {d: expr_str(a) for d, a in zip(stmt.dims, args, strict=True)}

    def subst(text: str) -> str:
        return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: values.get(m.group(0), m.group(0)), text)

    op = {"sum": "+=", "prod": "*=", "max": "max=", "min": "min="}.get(stmt.reduction or "", "=")
    lhs = f"{stmt.tensor}[{', '.join(subst(i) for i in stmt.index)}]"
    return f"{lhs} {op} {subst(str(stmt.expr))};"


def to_c(node: AstNode, kernel: Kernel, indent: int = 0) -> str:
    """C-like code of an AST, with statement bodies written out."""
    pad = "  " * indent
    if isinstance(node, For):
        note = f"  // {node.annotation}" if node.annotation else ""
        head = (
            f"{pad}for (int {node.var} = {expr_str(node.init)}; {expr_str(node.cond)}; "
            f"{node.var} += {expr_str(node.inc)}) {{{note}\n"
        )
        return head + to_c(node.body, kernel, indent + 1) + f"{pad}}}\n"
    if isinstance(node, If):
        text = f"{pad}if ({expr_str(node.cond)}) {{\n" + to_c(node.then, kernel, indent + 1)
        if node.orelse is not None:
            text += f"{pad}}} else {{\n" + to_c(node.orelse, kernel, indent + 1)
        return text + f"{pad}}}\n"
    if isinstance(node, Block):
        return "".join(to_c(item, kernel, indent) for item in node.items)
    if isinstance(node, Mark):
        note = f"  // {node.annotation}" if node.annotation else ""
        return f"{pad}// loop {node.loop} runs once{note}\n" + to_c(node.body, kernel, indent)
    return f"{pad}{statement_text(kernel.statement[node.stmt], node.args)}\n"


# --- partial-tile guards hoisted out of loops ----------------------------------------
#
# `tiles.isolate_full_tiles` sets full tiles apart band by band, but a parallel loop is
# left whole, so inside its last, partial iteration the inner bands keep bounds like
# `m1 <= min(5, 255 - 6 * m0)` on their unrolled and vector loops. There codegen can
# neither unroll nor keep the accumulators in registers for every row, and the thread
# that runs that iteration takes the longest (ResNet-50's 1024→256 1×1 conv over 14×14
# pixels: its last pixel tile, four columns, kept two of six rows in memory through 1,024
# reduction steps). The guard's other side `e` only uses loops outside the reduction,
# so the body of the innermost of them (`m0`) is emitted twice: under `if (e >= 5)`
# with the bound a constant, and as it was.


def unswitch_partial_trips(node: AstNode) -> AstNode:
    """The AST with each `min(constant, e)` bound of an unrolled or vector loop hoisted
    into a test around the body of the innermost loop `e` uses."""
    return _walk(node, frozenset())


def _walk(node: AstNode, bound: frozenset[str]) -> AstNode:
    if isinstance(node, For):
        return replace(node, body=_hoist(node.body, bound | {node.var}))
    if isinstance(node, Block):
        return Block(tuple(_walk(item, bound) for item in node.items))
    if isinstance(node, If):
        orelse = _walk(node.orelse, bound) if node.orelse is not None else None
        return If(node.cond, _walk(node.then, bound), orelse)
    if isinstance(node, Mark):
        return replace(node, body=_walk(node.body, bound))
    return node


def _hoist(body: AstNode, bound: frozenset[str]) -> AstNode:
    """A loop's body with each guard that only uses `bound` (its loop and those outside)
    tested once around the whole body: an init nest and its reduction stay side by side
    in each branch (codegen starts the accumulators from the init's values there). The
    general branch is kept as isl gave it."""
    guard = _invariant_guard(body, bound)
    if guard is None:
        return _walk(body, bound)
    limit, rest = guard
    return If(Op("ge", (rest, limit)), _hoist(_fix(body, limit, rest), bound), body)


def _invariant_guard(node: AstNode, bound: frozenset[str]) -> tuple[Int, AstExpr] | None:
    """The first `min(constant, e)` in the bound of an unrolled or vector loop in `node`
    whose `e` only uses the loops of `bound` and whose start does not use them: there
    the constant makes the trip count constant."""
    for loop in _loops(node):
        if loop.annotation not in CONSTANT_TRIPS:
            continue
        for e in _subexprs(loop.cond):
            if isinstance(e, Op) and e.op == "min" and len(e.args) == 2:
                ints = [a for a in e.args if isinstance(a, Int)]
                rest = [a for a in e.args if not isinstance(a, Int)]
                if len(ints) == 1 and len(rest) == 1:
                    used = expr_vars(rest[0])
                    # the constant is a full trip only where the start does not move
                    # with `e` (`j from 4 * j0 to min(9, 4 * j0 + 3)`: 9 is the end)
                    if used and used <= bound and not used & expr_vars(loop.init):
                        return ints[0], rest[0]
    return None


def _loops(node: AstNode) -> list[For]:
    found: list[For] = []
    if isinstance(node, For):
        found.append(node)
        found += _loops(node.body)
    elif isinstance(node, Block):
        for item in node.items:
            found += _loops(item)
    elif isinstance(node, If):
        found += _loops(node.then)
        if node.orelse is not None:
            found += _loops(node.orelse)
    elif isinstance(node, Mark):
        found += _loops(node.body)
    return found


def _subexprs(e: AstExpr) -> list[AstExpr]:
    if isinstance(e, Op):
        return [e, *(s for a in e.args for s in _subexprs(a))]
    return [e]


def _fix(node: AstNode, limit: Int, rest: AstExpr) -> AstNode:
    """`node` with every `min(limit, rest)` replaced by `limit` (true where rest >= limit)."""

    def expr(e: AstExpr) -> AstExpr:
        if isinstance(e, Op):
            if e.op == "min" and set(e.args) == {limit, rest} and len(e.args) == 2:
                return limit
            return Op(e.op, tuple(expr(a) for a in e.args))
        return e

    return map_exprs(node, expr)
