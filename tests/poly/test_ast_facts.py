"""What tests and loops tell about expressions (`poly.ast.facts`): bounds, decisions, and
the pruning of branches that cannot run, checked against brute force over the values."""

from __future__ import annotations

import itertools

from polytile.poly.ast.facts import bounds, decide, in_loop, learn, parameter_facts, prune_decided
from polytile.poly.ast.nodes import AstExpr, Block, Call, For, If, Int, Op, Var
from polytile.poly.oracle.interp import eval_expr

J0, SEQ = Var("j0"), Var("seq")


def _affine(*terms: tuple[int, Var], constant: int = 0) -> AstExpr:
    e: AstExpr = Int(constant)
    for c, v in terms:
        e = Op("add", (e, Op("mul", (Int(c), v))))
    return e


#: `-48 * j0 + 1023 >= 47`: isl's test of a full column panel
FULL = Op("ge", (_affine((-48, J0), constant=1023), Int(47)))


def test_the_else_of_a_scaled_test_bounds_the_variable() -> None:
    facts = learn({}, FULL, False)  # -48 j0 + 1023 < 47: j0 >= 21 (977 / 48 rounded up)
    assert bounds(J0, facts) == (21, None)
    assert decide(Op("le", (J0, Int(20))), facts) is False
    assert decide(Op("ge", (J0, Int(21))), facts) is True
    assert decide(Op("ge", (J0, Int(22))), facts) is None
    assert bounds(J0, learn({}, FULL, True)) == (None, 20)


def test_the_else_of_a_conjunction_teaches_its_open_part() -> None:
    """not (seq >= 8 and j0 <= 20), with j0 <= 20 known: seq <= 7."""
    both = Op("and", (Op("ge", (SEQ, Int(8))), Op("le", (J0, Int(20)))))
    facts = learn(learn({}, FULL, True), both, False)
    assert bounds(SEQ, facts)[1] == 7
    assert bounds(SEQ, learn({}, both, False)) == (None, None)  # nothing known of j0


def test_bounds_hold_for_every_value() -> None:
    """Interval bounds of remainders, minimums and scaled sums under a loop's facts
    contain every value the expression takes there (brute force)."""
    loop = For("j0", Int(0), Op("le", (J0, Int(21))), Int(1), Block(()))
    facts = in_loop(parameter_facts(["seq"]), loop)
    facts = learn(facts, Op("le", (SEQ, Int(40))), True)
    exprs = [
        Op("pdiv_r", (SEQ, Int(8))),
        Op("min", (Int(7), _affine((1, SEQ), (-8, J0), constant=-1))),
        Op("max", (_affine((1, SEQ), constant=-3), Int(0))),
        _affine((-48, J0), constant=1023),
        Op("fdiv_q", (_affine((1, SEQ), constant=5), Int(4))),
    ]
    for e in exprs:
        low, high = bounds(e, facts)
        values = [
            eval_expr(e, {"seq": s, "j0": j}) for s, j in itertools.product(range(1, 41), range(22))
        ]
        assert low is None or low <= min(values), e
        assert high is None or high >= max(values), e
        assert low is not None or high is not None, e


def test_pruning_keeps_the_branches_that_can_run() -> None:
    """Under `if (full)`, the else of `seq >= 8 and j0 <= 20` is `seq <= 7`: its own test
    is decided and the last branch is gone; a loop whose end the tests fix is written
    with a constant end."""
    last = Call("L", (J0,))
    rows = For(
        "i",
        Int(0),
        Op("le", (Var("i"), _affine((-48, J0), constant=1010))),
        Int(1),
        Call("R", (Var("i"),)),
        "i",
        "unroll",
    )
    inner = If(
        Op("and", (Op("ge", (SEQ, Int(8))), Op("le", (J0, Int(20))))),
        Call("F", (J0,)),
        If(Op("le", (SEQ, Int(7))), Call("S", (J0,)), last),
    )
    loop = For("j0", Int(0), Op("le", (J0, Int(21))), Int(1), If(FULL, inner, Block((inner, rows))))
    out = prune_decided(loop, ["seq"])
    assert isinstance(out, For) and isinstance(out.body, If)
    then, orelse = out.body.then, out.body.orelse
    assert then == If(inner.cond, Call("F", (J0,)), Call("S", (J0,)))
    # j0 = 21 in the else: the full branch cannot run, the rows end at 1010 - 1008 = 2
    assert isinstance(orelse, Block) and orelse.items[0] == If(
        Op("le", (SEQ, Int(7))), Call("S", (J0,)), last
    )
    assert orelse.items[1] == For(
        "i", Int(0), Op("le", (Var("i"), Int(2))), Int(1), Call("R", (Var("i"),)), "i", "unroll"
    )
