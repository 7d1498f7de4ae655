"""Facts about isl AST expressions and loops that codegen needs: bounds, constant trip
counts, which variables an index uses."""

from __future__ import annotations

from polytile.poly.ast.build import AstExpr, AstNode, Block, Call, For, If, Int, Mark, Op, Var
from polytile.poly.ast.nodes import loop_end


def calls_of(node: AstNode) -> list[Call] | None:
    """The calls of a loop body made of calls only, else None."""
    if isinstance(node, Call):
        return [node]
    if isinstance(node, Block) and all(isinstance(i, Call) for i in node.items):
        return list(node.items)  # type: ignore[arg-type]
    return None


def vars_of(e: AstExpr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Op):
        return set().union(*(vars_of(a) for a in e.args))
    return set()


def linear_in(e: AstExpr, var: str) -> bool:
    """`e` is `var` plus / minus terms without it, or an integer multiple of that: then
    distinct values of `var` give distinct values of `e`."""
    if e == Var(var):
        return True
    if isinstance(e, Op) and e.op in ("add", "sub"):
        a, c = e.args
        if var not in vars_of(c):
            return linear_in(a, var)
        return e.op == "add" and var not in vars_of(a) and linear_in(c, var)
    if isinstance(e, Op) and e.op == "mul":
        a, c = e.args
        if isinstance(a, Int) and a.value != 0:
            return linear_in(c, var)
        if isinstance(c, Int) and c.value != 0:
            return linear_in(a, var)
    return False


def linear_terms(e: AstExpr, values: dict[str, int] | None = None) -> tuple:
    """`e` with the variables of `values` replaced by them, as a canonical sum of terms:
    ((term, coefficient), ...), sorted, the constant under the term "" and any part that
    is not a sum of multiples (a floor, a min) as an opaque term. Equal results mean
    equal values for every value of the other variables."""
    terms: dict[object, int] = {}

    def add(x: AstExpr, scale: int) -> None:
        if isinstance(x, Int):
            terms[""] = terms.get("", 0) + scale * x.value
        elif isinstance(x, Var) and values is not None and x.name in values:
            terms[""] = terms.get("", 0) + scale * values[x.name]
        elif isinstance(x, Var):
            terms[x.name] = terms.get(x.name, 0) + scale
        elif isinstance(x, Op) and x.op in ("add", "sub"):
            add(x.args[0], scale)
            add(x.args[1], scale if x.op == "add" else -scale)
        elif isinstance(x, Op) and x.op == "minus":
            add(x.args[0], -scale)
        elif isinstance(x, Op) and x.op == "mul" and isinstance(x.args[0], Int):
            add(x.args[1], scale * x.args[0].value)
        elif isinstance(x, Op) and x.op == "mul" and isinstance(x.args[1], Int):
            add(x.args[0], scale * x.args[1].value)
        else:
            atom = repr(_substituted(x, values or {}))
            terms[atom] = terms.get(atom, 0) + scale

    add(e, 1)
    return tuple(sorted((t, c) for t, c in terms.items() if c != 0))


def _substituted(e: AstExpr, values: dict[str, int]) -> AstExpr:
    if isinstance(e, Var) and e.name in values:
        return Int(values[e.name])
    if isinstance(e, Op):
        return Op(e.op, tuple(_substituted(a, values) for a in e.args))
    return e


def upper(node: For) -> AstExpr | None:
    """The exclusive upper bound of a loop whose condition bounds its iterator above."""
    return loop_end(node.cond, node.var)


def constant_bound(e: AstExpr) -> int | None:
    """A constant upper bound of an expression built of ints, min and +."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Op) and e.op == "min":
        found = [constant_bound(a) for a in e.args]
        known = [f for f in found if f is not None]
        return min(known) if known else None
    if isinstance(e, Op) and e.op == "add":
        parts = [constant_bound(a) for a in e.args]
        if all(isinstance(a, Int) for a in e.args):
            return sum(p for p in parts if p is not None)
        if isinstance(e.args[1], Int) and parts[0] is not None:
            return parts[0] + e.args[1].value
    return None


def exact(e: AstExpr) -> int | None:
    """The value of an expression of integers only."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Op) and e.op == "add":
        parts = [exact(a) for a in e.args]
        return None if None in parts else sum(parts)  # type: ignore[arg-type]
    return None


def constant_lower(e: AstExpr) -> int | None:
    """A constant lower bound of an expression built of ints and max."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Op) and e.op == "max":
        known = [k for k in (constant_lower(a) for a in e.args) if k is not None]
        return max(known) if known else None
    return None


def fors(node: AstNode) -> list[For]:
    """Every loop in or below a node, outer ones first."""
    if isinstance(node, For):
        return [node, *fors(node.body)]
    if isinstance(node, Block):
        return [f for item in node.items for f in fors(item)]
    if isinstance(node, Mark):
        return fors(node.body)
    if isinstance(node, If):
        return [*fors(node.then), *(fors(node.orelse) if node.orelse is not None else [])]
    return []


def relative_trips(loop: For) -> int | None:
    """The trip count of a unit-step loop whose bound minus its start is a constant
    (a tile's loop `for (v = 8*t; v <= 8*t + 7; v++)`), else None."""
    bound = upper(loop)
    if bound is None or loop.inc != Int(1):
        return None
    terms = linear_terms(Op("sub", (bound, loop.init)))
    if not terms:
        return 0
    if len(terms) == 1 and terms[0][0] == "":
        return max(terms[0][1], 0)
    return None


def constant_trips(loop: For) -> int | None:
    """A loop's trip count when its bounds and step are constants, else None."""
    low = constant_lower(loop.init)
    bound = upper(loop)
    high = constant_bound(bound) if bound is not None else None
    if low is None or high is None or not isinstance(loop.inc, Int):
        return None
    return -(-(high - low) // loop.inc.value)
