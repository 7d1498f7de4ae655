"""What the tests and loops around an AST node tell about expressions: constant bounds
on linear forms, used to bound a run-time trip count (`rows`) and to drop tests whose
outcome is known (`prune_decided`).

A fact bounds the variable part of an affine expression: `a <= b` bounds `a - b`, its
constant moved to the bound, its coefficients divided by their gcd and their sign
normalized, so that `m - 6 * i0`, `6 * i0 - m` and `12 * i0 - 2 * m` share one entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from polytile.poly.ast.nodes import AstExpr, AstNode, Block, For, If, Int, Mark, Op, Var

Interval = tuple[int | None, int | None]
Terms = frozenset[tuple[str, int]]
Facts = Mapping[Terms, Interval]

_FLIP = {"le": "gt", "lt": "ge", "ge": "lt", "gt": "le"}


def parameter_facts(params: Iterable[str]) -> Facts:
    """Sizes are at least 1 (the AST's context)."""
    return {frozenset(((p, 1),)): (1, None) for p in params}


def in_loop(facts: Facts, loop: For) -> Facts:
    """The facts inside a loop's body: its iterator within its bounds."""
    return learn(learn(facts, Op("ge", (Var(loop.var), loop.init)), True), loop.cond, True)


def learn(facts: Facts, cond: AstExpr, holds: bool) -> Facts:
    """`facts` with the bounds `cond` gives where it holds (or where it does not)."""
    if not isinstance(cond, Op):
        return facts
    if cond.op in ("and", "or"):
        conjunction = (cond.op == "and") == holds  # every part is known to hold (or fail)
        if conjunction:
            for part in cond.args:
                facts = learn(facts, part, holds)
            return facts
        # the last undecided part decides when every other one is known not to
        others = cond.op == "and"
        found = [decide(a, facts) for a in cond.args]
        open_parts = [a for a, d in zip(cond.args, found, strict=True) if d is None]
        if len(open_parts) == 1 and all(d is others for d in found if d is not None):
            return learn(facts, open_parts[0], holds)
        return facts
    if cond.op not in _FLIP or len(cond.args) != 2:
        return facts
    op = cond.op if holds else _FLIP[cond.op]
    form = linear(Op("sub", cond.args))
    if form is None or not form[0]:
        return facts
    terms, constant = form
    # terms + constant OP 0, as terms in [low, high]
    if op in ("le", "lt"):
        interval: Interval = (None, -constant - (op == "lt"))
    else:
        interval = (-constant + (op == "gt"), None)
    key, scale = _normal(terms)
    low, high = _divide(interval, scale)
    old = facts.get(key, (None, None))
    low = low if old[0] is None else old[0] if low is None else max(low, old[0])
    high = high if old[1] is None else old[1] if high is None else min(high, old[1])
    return {**facts, key: (low, high)}


def decide(cond: AstExpr, facts: Facts) -> bool | None:
    """Whether `cond` holds wherever `facts` do (None when they do not tell)."""
    if isinstance(cond, Op) and cond.op in ("and", "or"):
        parts = [decide(a, facts) for a in cond.args]
        if cond.op == "and":
            return False if False in parts else True if all(parts) else None
        return True if True in parts else False if all(p is False for p in parts) else None
    if not isinstance(cond, Op) or cond.op not in (*_FLIP, "eq") or len(cond.args) != 2:
        return None
    low, high = bounds(Op("sub", cond.args), facts)
    op = cond.op
    if op in ("le", "lt"):
        limit = 0 if op == "le" else -1  # a - b <= limit
        if high is not None and high <= limit:
            return True
        if low is not None and low > limit:
            return False
    elif op in ("ge", "gt"):
        limit = 0 if op == "ge" else 1  # a - b >= limit
        if low is not None and low >= limit:
            return True
        if high is not None and high < limit:
            return False
    else:
        if low == high == 0:
            return True
        if (low is not None and low > 0) or (high is not None and high < 0):
            return False
    return None


def bounds(e: AstExpr, facts: Facts) -> Interval:
    """Constant bounds of an expression (None where unknown): interval arithmetic over
    its operators, narrowed by the facts known of its linear form."""
    low, high = _raw_bounds(e, facts)
    form = linear(e)
    if form is not None and form[0]:
        key, scale = _normal(form[0])
        known = facts.get(key)
        if known is not None:
            ends = [None if k is None else k * scale for k in known]
            k_low, k_high = ends if scale > 0 else ends[::-1]
            if k_low is not None:
                low = k_low + form[1] if low is None else max(low, k_low + form[1])
            if k_high is not None:
                high = k_high + form[1] if high is None else min(high, k_high + form[1])
    return low, high


def linear(e: AstExpr) -> tuple[Terms, int] | None:
    """An affine expression as its variables' coefficients and its constant."""
    if isinstance(e, Int):
        return frozenset(), e.value
    if isinstance(e, Var):
        return frozenset(((e.name, 1),)), 0
    if e.op == "mul" and isinstance(e.args[0], Int):
        inner = linear(e.args[1])
        return None if inner is None else _scaled(inner, e.args[0].value)
    if e.op == "minus":
        inner = linear(e.args[0])
        return None if inner is None else _scaled(inner, -1)
    if e.op in ("add", "sub") and len(e.args) == 2:
        a, b = linear(e.args[0]), linear(e.args[1])
        if a is None or b is None:
            return None
        if e.op == "sub":
            b = _scaled(b, -1)
        coefs = dict(a[0])
        for var, c in b[0]:
            coefs[var] = coefs.get(var, 0) + c
        return frozenset((v, c) for v, c in coefs.items() if c), a[1] + b[1]
    return None


def _scaled(form: tuple[Terms, int], factor: int) -> tuple[Terms, int]:
    return frozenset((v, c * factor) for v, c in form[0] if c * factor), form[1] * factor


def _normal(terms: Terms) -> tuple[Terms, int]:
    """The terms divided by `scale`, their gcd signed so that the first coefficient (by
    name) is positive: terms = scale · key."""
    g = math.gcd(*(c for _, c in terms))
    scale = g if min(terms)[1] > 0 else -g
    return frozenset((v, c // scale) for v, c in terms), scale


def _divide(interval: Interval, scale: int) -> Interval:
    """The values of x with scale · x in the interval (x an integer)."""
    low, high = interval
    if scale < 0:
        low, high, scale = (
            (None if high is None else -high),
            (None if low is None else -low),
            -scale,
        )
    return (None if low is None else -(-low // scale)), (None if high is None else high // scale)


def _raw_bounds(e: AstExpr, facts: Facts) -> Interval:
    if isinstance(e, Int):
        return e.value, e.value
    if isinstance(e, Var):
        return None, None
    parts = [bounds(a, facts) for a in e.args]
    if e.op == "add":
        return _sum(p[0] for p in parts), _sum(p[1] for p in parts)
    if e.op == "sub":
        (a, b), (c, d) = parts
        return _sum((a, None if d is None else -d)), _sum((b, None if c is None else -c))
    if e.op == "minus":
        a, b = parts[0]
        return (None if b is None else -b), (None if a is None else -a)
    if e.op in ("min", "max"):
        lows, highs = [p[0] for p in parts], [p[1] for p in parts]
        if e.op == "min":  # below every part's high, above the lowest low
            known = [h for h in highs if h is not None]
            return _fold(min, lows), (min(known) if known else None)
        known = [lo for lo in lows if lo is not None]
        return (max(known) if known else None), _fold(max, highs)
    divisor = e.args[1] if len(e.args) == 2 else None
    if not isinstance(divisor, Int) or divisor.value <= 0:
        return None, None
    d = divisor.value
    if e.op == "pdiv_r":
        return 0, d - 1
    if e.op == "zdiv_r":
        return -(d - 1), d - 1
    if e.op in ("fdiv_q", "pdiv_q", "div"):
        a, b = parts[0]
        return (None if a is None else a // d), (None if b is None else b // d)
    if e.op == "mul" and isinstance(e.args[0], Int):
        c, (a, b) = e.args[0].value, parts[1]
        ends = (None if a is None else c * a), (None if b is None else c * b)
        return ends if c >= 0 else (ends[1], ends[0])
    return None, None


def _fold(f: Callable[[list[int]], int], values: list[int | None]) -> int | None:
    return None if None in values else f(values)  # type: ignore[arg-type]


def _sum(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


# --- tests whose outcome is known ------------------------------------------------------


def _constant_end(loop: For, facts: Facts) -> AstExpr:
    """A loop's condition with its end written as the constant the facts fix it to:
    codegen expands a vector or unrolled loop only when its trip count is a constant."""
    cond = loop.cond
    if not (isinstance(cond, Op) and cond.op in ("lt", "le") and cond.args[0] == Var(loop.var)):
        return cond
    limit = cond.args[1]
    if linear(limit) is not None and not linear(limit)[0]:  # type: ignore[index]
        return cond  # already a constant
    low, high = bounds(limit, facts)
    if low is None or low != high:
        return cond
    return Op(cond.op, (cond.args[0], Int(low)))


def prune_decided(node: AstNode, params: Iterable[str]) -> AstNode:
    """The AST without the branches of tests that the tests and loops around them
    decide: isl's case splits and `unswitch_partial_trips` leave branches that cannot
    run (`j0 <= 20` inside `-48 * j0 + 1023 < 47`), which would cost compile time; and
    with loop ends they fix written as constants (`i1 <= min(5, 15 - 6 * i0)` where
    `i0 = 2`)."""
    return _prune(node, parameter_facts(params))


def _prune(node: AstNode, facts: Facts) -> AstNode:
    if isinstance(node, For):
        node = replace(node, cond=_constant_end(node, facts))
        return replace(node, body=_prune(node.body, in_loop(facts, node)))
    if isinstance(node, Block):
        items = [_prune(item, facts) for item in node.items]
        return Block(tuple(i for i in items if i != Block(())))
    if isinstance(node, If):
        known = decide(node.cond, facts)
        if known is True:
            return _prune(node.then, facts)
        if known is False:
            return Block(()) if node.orelse is None else _prune(node.orelse, facts)
        then = _prune(node.then, learn(facts, node.cond, True))
        orelse = (
            None if node.orelse is None else _prune(node.orelse, learn(facts, node.cond, False))
        )
        return If(node.cond, then, orelse)
    if isinstance(node, Mark):
        return replace(node, body=_prune(node.body, facts))
    return node
