"""The symbolic size algebra (`frontend/symbolic.py`) against Python ints: canonical forms
evaluate like the expressions they came from, floor division and modulo by positive
constants are Python's, decided comparisons hold at every size in bounds, and the isl
text evaluates to the same values in isl."""

from __future__ import annotations

import operator
import pickle
from collections.abc import Callable

import islpy as isl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polytile.errors import InputError, SymbolicShapeError
from polytile.frontend.symbolic import Dim, DimLike, assume, parse_dim, same, value_range
from polytile.frontend.symbolic_isl import to_isl

NAMES = ("batch", "seq", "heads")
B, S, H = (Dim.param(n) for n in NAMES)

# An expression is built twice from one recipe: as a Dim and as a function of the sizes.
Expr = tuple[DimLike, Callable[[dict[str, int]], int]]


def _leaf(draw: st.DrawFn) -> Expr:
    if draw(st.booleans()):
        name = draw(st.sampled_from(NAMES))
        return Dim.param(name), lambda env, n=name: env[n]
    k = draw(st.integers(-6, 6))
    return k, lambda env, k=k: k


@st.composite
def exprs(draw: st.DrawFn, depth: int = 3, ops: tuple[str, ...] = ("//", "%", "neg")) -> Expr:
    """A random expression; with ops=() a polynomial."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return _leaf(draw)
    op = draw(st.sampled_from(["+", "-", "*", *ops]))
    a, fa = draw(exprs(depth - 1, ops))
    if op == "neg":
        return -a, lambda env: -fa(env)
    if op in ("//", "%"):
        c = draw(st.integers(1, 7))
        fn = operator.floordiv if op == "//" else operator.mod
        return fn(a, c), lambda env: fn(fa(env), c)
    b, fb = draw(exprs(depth - 1, ops))
    fn = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op]
    return fn(a, b), lambda env: fn(fa(env), fb(env))


sizes = st.fixed_dictionaries({n: st.integers(1, 40) for n in NAMES})


def _value(d: DimLike, env: dict[str, int]) -> int:
    return d.evaluate(env) if isinstance(d, Dim) else d


@settings(max_examples=300, deadline=None)
@given(exprs(), st.lists(sizes, min_size=1, max_size=4))
def test_canonical_form_evaluates_like_the_expression(e: Expr, envs: list) -> None:
    dim, fn = e
    for env in envs:
        assert _value(dim, env) == fn(env)


@settings(max_examples=200, deadline=None)
@given(exprs(), st.integers(1, 9), sizes)
def test_floordiv_and_mod_are_pythons(e: Expr, c: int, env: dict[str, int]) -> None:
    dim, fn = e
    assert _value(dim // c, env) == fn(env) // c
    assert _value(dim % c, env) == fn(env) % c
    assert _value(-(-dim // c), env) == -(-fn(env) // c)  # ceil division


@settings(max_examples=200, deadline=None)
@given(exprs(), exprs(), exprs(), exprs(ops=()), st.integers(1, 6), st.integers(1, 6), sizes)
def test_rewritings_share_one_canonical_form(
    x: Expr, y: Expr, z: Expr, p: Expr, a: int, b: int, env: dict[str, int]
) -> None:
    """Ring identities, and nested floor divisions of a polynomial, give one form (floors
    of floors in general may not: (seq % 2)//2 is 0 but keeps its own form)."""
    (x, _), (y, _), (z, _), (p, _) = x, y, z, p
    pairs = [
        (x + y, y + x),
        (x * y, y * x),
        (x * (y + z), x * y + x * z),
        ((x + y) + z, x + (y + z)),
        ((x * a) // a, x),
        ((p // a) // b, p // (a * b)),
        ((x * a + y * a * b) // a, x + y * b),
        (x - x, 0),
        ((x * a) % a, 0),
    ]
    for left, right in pairs:
        assert same(left, right), (left, right)
        assert _value(left, env) == _value(right, env)


@settings(max_examples=200, deadline=None)
@given(exprs(), exprs(), sizes)
def test_equal_canonical_forms_have_equal_values(x: Expr, y: Expr, env: dict[str, int]) -> None:
    if same(x[0], y[0]):
        assert x[1](env) == y[1](env)


@settings(max_examples=200, deadline=None)
@given(exprs(), exprs())
def test_exact_division_by_a_symbolic_size_recovers_the_factor(x: Expr, y: Expr) -> None:
    (x, _), (y, _) = x, y
    try:
        if not isinstance(y, Dim) or y == 0:
            return
    except SymbolicShapeError:
        return  # y may be 0 at some sizes
    assert same((x * y) // y, x) and (x * y) % y == 0
    try:
        q = (x * y + 1) // y  # exact only where y divides 1 as a polynomial: never
    except SymbolicShapeError:
        return
    raise AssertionError(f"({x * y + 1}) // ({y}) = {q}")


def test_dims_are_immutable_values() -> None:
    d = B * S + (S + 1) // 2
    with pytest.raises(AttributeError):
        d.terms = ()  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(d))
    assert same(again, d) and hash(again) == hash(d) and {d: 1}[again] == 1


def test_examples_of_the_canonical_form() -> None:
    assert same(B * S, S * B) and hash(B * S) == hash(S * B)
    assert same((S * 2) // 2, S)
    assert same((2 * S + 3) // 2, S + 1)
    assert same((S * B * 256) // (B * 256), S)  # exact division by a product
    assert isinstance(S - S, int) and (S * 4) % 2 == 0
    assert str(B * S * 2 - (S + 1) // 2 + 3) == "2*batch*seq - ((seq + 1)//2) + 3"


bounded = st.fixed_dictionaries(
    {
        n: st.tuples(st.integers(1, 8), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1]))
        for n in NAMES
    }
)


@settings(max_examples=300, deadline=None)
@given(exprs(), bounded, st.sampled_from(["==", "<", "<=", ">", ">="]))
def test_decided_comparisons_hold_at_every_size_in_bounds(e: Expr, bounds: dict, rel: str) -> None:
    dim, fn = e
    if not isinstance(dim, Dim):
        return
    compare = {"==": operator.eq, "<": operator.lt, "<=": operator.le, ">": operator.gt,
               ">=": operator.ge}[rel]  # fmt: skip
    with assume(bounds):
        try:
            answer = compare(dim, 0)
        except SymbolicShapeError:
            return
        lo, hi = value_range(dim)
    grid = [
        {"batch": b, "seq": s, "heads": h}
        for b in range(bounds["batch"][0], bounds["batch"][1] + 1)
        for s in range(bounds["seq"][0], bounds["seq"][1] + 1)
        for h in range(bounds["heads"][0], bounds["heads"][1] + 1)
    ]
    for env in grid:
        assert compare(fn(env), 0) == answer, (dim, env)
        assert lo <= fn(env) <= hi


def test_undecidable_comparisons_raise_naming_the_sizes() -> None:
    with pytest.raises(SymbolicShapeError, match="seq == 1") as info:
        _ = S == 1
    assert info.value.dims == ("seq",)
    with pytest.raises(SymbolicShapeError, match="batch"):
        _ = B == S
    with pytest.raises(SymbolicShapeError, match=r"bounds=\{'seq': \(1, 512\)\}"):
        _ = S <= 512
    assert S != -1 and S >= 1 and S * B >= S and bool(S)  # true for every size
    assert 0 <= S % 4 < 4 and S + (4 - S % 4) % 4 >= S and (S + 3) // 4 * 4 >= S
    with assume({"seq": (1, 512)}):
        assert S <= 512 and min(S, 1024) is S
    with assume({"seq": (3, 3)}):
        assert S == 3  # bounds may pin a size
    with pytest.raises(SymbolicShapeError):
        int(S)
    with pytest.raises(SymbolicShapeError):
        _ = 6 // S
    with pytest.raises(SymbolicShapeError):
        _ = S // (S + 1)  # only exact divisions by a monomial


def test_bounds_are_checked() -> None:
    for bad in [(0, 3), (5, 2), (1,), ("a", 2)]:
        with pytest.raises(InputError), assume({"seq": bad}):
            pass
    with pytest.raises(InputError):
        Dim.param("2seq")
    with pytest.raises(InputError):
        Dim.param("floor")


@settings(max_examples=100, deadline=None)
@given(exprs())
def test_text_parses_back(e: Expr) -> None:
    assert same(parse_dim(str(e[0])), e[0])


def _isl_value(text: str, params: dict[str, int]) -> int:
    pa = isl.PwAff(text)
    space = pa.get_domain_space()
    point = isl.Set.universe(space.params())
    for name, value in params.items():
        pos = space.find_dim_by_name(isl.dim_type.param, name)
        point = point.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(space.get_ctx(), value))
    pa = pa.intersect_params(point)
    lo, hi = pa.min_val(), pa.max_val()
    assert lo.eq(hi)
    return lo.to_python()


@settings(max_examples=60, deadline=None)
@given(st.lists(exprs(), min_size=1, max_size=3), sizes)
def test_isl_text_evaluates_like_the_dims(es: list[Expr], env: dict[str, int]) -> None:
    form = to_isl([d for d, _ in es])
    isl.MultiPwAff(form.multi_pw_aff())
    isl.Set(form.context)
    params = {n: env[n] for n in form.params if n in env}
    params.update({n: d.evaluate(env) for n, d in form.derived.items()})
    for index, (_, fn) in enumerate(es):
        assert _isl_value(form.pw_aff(index), params) == fn(env)


def test_products_become_derived_parameters() -> None:
    form = to_isl([B * S * 2 + S, (S + 1) // 2, S * S])
    assert form.exprs == ("seq + 2*batch__seq", "floor((1 + seq)/2)", "seq__seq")
    assert form.params == ("batch", "seq", "batch__seq", "seq__seq")
    assert same(form.derived["batch__seq"], B * S)
    with assume({"seq": (1, 512), "batch": (1, 4)}):
        assert "1 <= batch__seq <= 2048" in to_isl([B * S]).context


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 6), st.integers(1, 40), st.integers(0, 40), st.data())
def test_the_context_of_a_product_holds_at_every_size_and_ties_it_to_its_factors(
    bl: int, bw: int, sl: int, sw: int, data: st.DataObject
) -> None:
    bounds = {"batch": (bl, bl + bw), "seq": (sl, sl + sw)}
    with assume(bounds):
        context = isl.Set(to_isl([B * S]).context)
    b = data.draw(st.integers(*bounds["batch"]))
    s = data.draw(st.integers(*bounds["seq"]))
    point = isl.Set(
        f"[batch, seq, batch__seq] -> {{ : batch = {b} and seq = {s} and batch__seq = {b * s} }}"
    )
    assert point.is_subset(context)
    smaller = isl.Set("[batch, seq, batch__seq] -> { : batch__seq < seq or batch__seq < batch }")
    assert context.intersect(smaller).is_empty()
