"""Small typed helpers around islpy; the rest of polytile never builds isl objects from
strings itself. Dimensions are always named, and spaces are aligned before combining."""

from __future__ import annotations

import contextlib
import functools
import math
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import islpy as isl

from polytile.errors import BudgetExceeded

CTX = isl.DEFAULT_CONTEXT


@functools.lru_cache(maxsize=4096)
def parse_set(text: str) -> isl.Set:
    return isl.Set(text, context=CTX)


@functools.lru_cache(maxsize=4096)
def parse_map(text: str) -> isl.Map:
    return isl.Map(text, context=CTX)


@functools.lru_cache(maxsize=16384)
def parse_pw_aff(text: str) -> isl.PwAff:
    return isl.PwAff(text, context=CTX)


@functools.lru_cache(maxsize=16384)
def parse_union_pw_aff(text: str) -> isl.UnionPwAff:
    return isl.UnionPwAff(text, context=CTX)


def box(
    name: str,
    dims: Sequence[str],
    extents: Sequence[int | str],
    extra: str = "",
    params: Sequence[str] = (),
) -> str:
    """`{ name[d0, d1] : 0 <= d0 < e0 and 0 <= d1 < e1 [and extra] }` as isl text.

    An extent may be a symbolic size (an isl parameter's name). Every parameter, of the
    extents or of `params` (a kernel's others), is at least 1 in the set: a statement
    whose own extents are fixed still runs only when the kernel's sizes are not empty,
    which is what relates it to the statements around it."""
    names = sorted({*params, *(n for e in extents if isinstance(e, str) for n in names_in(e))})
    bounds = [f"0 <= {d} < {e}" for d, e in zip(dims, extents, strict=True)]
    bounds += [f"{p} >= 1" for p in names]
    if extra:
        bounds.append(f"({extra})")
    where = " and ".join(bounds)
    prefix = f"[{', '.join(names)}] -> " if names else ""
    return f"{prefix}{{ {name}[{', '.join(dims)}]{' : ' + where if where else ''} }}"


#: the words of isl's syntax that are not names of sizes
_KEYWORDS = frozenset({"floor", "ceil", "mod", "min", "max", "and", "or", "not", "exists"})


def names_in(text: str) -> list[str]:
    """The size names an extent's isl text uses (`floor((1 + seq)/2)`: seq)."""
    words = re.findall(r"[A-Za-z_]\w*", text)
    return list(dict.fromkeys(w for w in words if w not in _KEYWORDS))


def evaluate(text: str, sizes: Mapping[str, int]) -> int:
    """The value of an extent's quasi-affine isl text at these sizes."""
    names = names_in(text)
    at = fix_params(parse_set(f"[{', '.join(names)}] -> {{ [v] : v = {text} }}"), sizes)
    if not at.is_singleton():
        raise ValueError(f"'{text}' has no value at {dict(sizes)}")
    return int(at.dim_max_val(0).to_python())


def param_names(obj: isl.Set | isl.Map | isl.UnionSet | isl.UnionMap) -> list[str]:
    """The names of an isl object's parameters, in its space's order."""
    space = obj.get_space()
    return [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]


def fix_params(s: isl.Set, sizes: Mapping[str, int]) -> isl.Set:
    """The set with its parameters set to `sizes` and projected out: parameter-free."""
    for pos, name in enumerate(param_names(s)):
        if name not in sizes:
            raise KeyError(name)
        s = s.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(CTX, int(sizes[name])))
    return s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))


def access(stmt: str, dims: Sequence[str], tensor: str, index: Sequence[str]) -> str:
    """`{ stmt[dims] -> tensor[index] }` as isl text (index entries are affine in dims)."""
    return f"{{ {stmt}[{', '.join(dims)}] -> {tensor}[{', '.join(index)}] }}"


def dim_names(s: isl.Set | isl.BasicSet) -> list[str]:
    return [s.get_dim_name(isl.dim_type.set, i) for i in range(s.dim(isl.dim_type.set))]


def union_set(items: Sequence[isl.Set | isl.UnionSet]) -> isl.UnionSet:
    result = isl.UnionSet.empty(isl.Space.params_alloc(CTX, 0))
    for item in items:
        result = result.union(isl.UnionSet.from_set(item) if isinstance(item, isl.Set) else item)
    return result


def union_map(items: Sequence[isl.Map | isl.UnionMap]) -> isl.UnionMap:
    result = isl.UnionMap.empty(isl.Space.params_alloc(CTX, 0))
    for item in items:
        result = result.union(isl.UnionMap.from_map(item) if isinstance(item, isl.Map) else item)
    return result


def card(s: isl.Set | isl.UnionSet) -> int:
    """The number of integer points of a bounded, parameter-free set."""
    if isinstance(s, isl.UnionSet):
        counts: list[int] = []
        s.foreach_set(lambda part: counts.append(card(part)))
        return sum(counts)
    return int(s.count_val().to_python())


def box_extents(s: isl.Set) -> list[int]:
    """The extent of the set's bounding box along each dimension (zeros when empty)."""
    dims = s.dim(isl.dim_type.set)
    if s.is_empty():
        return [0] * dims
    found = []
    for pos in range(dims):
        lo = s.dim_min_val(pos).to_python()
        hi = s.dim_max_val(pos).to_python()
        found.append(max(0, int(hi) - int(lo) + 1))
    return found


def box_volume(s: isl.Set) -> int:
    """The volume of the set's bounding box: a cheap upper bound of `card`."""
    return math.prod(box_extents(s)) if not s.is_empty() else 0


def is_empty(obj: isl.UnionMap | isl.UnionSet | isl.Map | isl.Set) -> bool:
    return bool(obj.is_empty())


#: an affine form over named dimensions: (coefficient by dimension, constant)
Linear = tuple[dict[str, int], int]


def linear(dims: Sequence[str], text: str) -> Linear | None:
    """The integer coefficients and constant of an affine expression over `dims`; None
    when it is not one affine piece without integer division (so it can be inverted)."""
    pieces: list[isl.Aff] = []
    parse_pw_aff(f"{{ [{', '.join(dims)}] -> [({text})] }}").foreach_piece(
        lambda _where, aff: pieces.append(aff)
    )
    if len(pieces) != 1 or pieces[0].dim(isl.dim_type.div) > 0:
        return None
    aff = pieces[0]
    values = [aff.get_coefficient_val(isl.dim_type.in_, i) for i in range(len(dims))]
    constant = aff.get_constant_val()
    if not all(v.is_int() for v in (*values, constant)):
        return None
    coefficients = {d: int(v.to_python()) for d, v in zip(dims, values, strict=True)}
    return {d: c for d, c in coefficients.items() if c}, int(constant.to_python())


def conjunctions(s: isl.Set) -> list[list[tuple[Linear, bool]]] | None:
    """The set as a disjunction of conjunctions of constraints `form >= 0` (or `form = 0`
    when the flag is set) over its named dims; None when one needs an existential
    variable (an integer division), which has no affine form."""
    names = dim_names(s)
    found: list[list[tuple[Linear, bool]]] = []
    for part in s.get_basic_sets():
        if part.dim(isl.dim_type.div) > 0:
            return None
        conjunction = []
        for c in part.get_constraints():
            values = [c.get_coefficient_val(isl.dim_type.set, i) for i in range(len(names))]
            coefficients = {n: int(v.to_python()) for n, v in zip(names, values, strict=True)}
            form = (
                {n: v for n, v in coefficients.items() if v},
                int(c.get_constant_val().to_python()),
            )
            conjunction.append((form, bool(c.is_equality())))
        found.append(conjunction)
    return found


def value_range(domain: isl.Set, text: str) -> tuple[int, int]:
    """The smallest and largest value of a quasi-affine expression over the dims of a
    bounded, non-empty set."""
    name, dims = domain.get_tuple_name(), dim_names(domain)
    values = parse_map(f"{{ {name}[{', '.join(dims)}] -> [({text})] }}")
    found = values.intersect_domain(domain).range()
    return int(found.dim_min_val(0).to_python()), int(found.dim_max_val(0).to_python())


def separable_box(s: isl.Set, positions: Sequence[int]) -> list[int] | None:
    """The extents of the dims at `positions` when the set is the product of [0, extent)
    on each of them with what it says about the others (no constraint ties them to the
    rest), else None (also where a symbolic size bounds one)."""
    if s.is_empty():
        return None
    extents = []
    free = s
    for pos in positions:
        low, high = s.dim_min_val(pos), s.dim_max_val(pos)
        if not (low.is_int() and high.is_int()) or low.to_python() != 0:
            return None
        extents.append(int(high.to_python()) + 1)
        free = free.eliminate(isl.dim_type.set, pos, 1)
    for pos, extent in zip(positions, extents, strict=True):
        free = free.lower_bound_val(isl.dim_type.set, pos, isl.Val.int_from_si(CTX, 0))
        free = free.upper_bound_val(isl.dim_type.set, pos, isl.Val.int_from_si(CTX, extent - 1))
    return extents if free.is_equal(s) else None


def merge_dims(s: isl.Set, first: int, second: int, name: str, extent: int) -> isl.Set:
    """A separable set (see `separable_box`) with the dims at `first` and `second` replaced
    by one dim `name` in [0, extent), at the first one's place."""
    tuple_name = s.get_tuple_name()
    merged = s.eliminate(isl.dim_type.set, first, 1).eliminate(isl.dim_type.set, second, 1)
    merged = merged.project_out(isl.dim_type.set, second, 1)
    at = first if first < second else first - 1
    merged = merged.set_dim_name(isl.dim_type.set, at, name)
    merged = merged.lower_bound_val(isl.dim_type.set, at, isl.Val.int_from_si(CTX, 0))
    merged = merged.upper_bound_val(isl.dim_type.set, at, isl.Val.int_from_si(CTX, extent - 1))
    return merged.set_tuple_name(tuple_name)


@dataclass(eq=False)  # one budget is itself only (the stack removes it by identity)
class _Budget:
    """One budget in force: what to say when it runs out, and its limits."""

    refusal: str
    step: str
    operations: int | None
    #: isl's operation count at which it runs out (None: no operation limit)
    limit: int | None
    seconds: float | None
    deadline: float | None
    #: once it ran out: the message, what ran out and where (it stays spent)
    spent: tuple[str, str, str] | None = None


#: the budgets in force, outermost first (one isl context, so one stack)
_BUDGETS: list[_Budget] = []


@contextlib.contextmanager
def operation_budget(
    operations: int | None, refusal: str, seconds: float | None = None, step: str = ""
) -> Iterator[None]:
    """isl calls inside may take at most `operations` of its elementary steps, and the
    whole at most `seconds` (checked at `check_budget` calls and on exit); past either,
    the schedule at hand is refused (`refusal` says why, `step` names the work) with
    `BudgetExceeded` rather than a hang. Budgets nest: an outer one stays in force
    inside an inner one (isl's limit is the tightest remaining) and keeps counting; once
    spent it stays spent, so a step that catches the refusal and goes on is refused
    again at the next check and the outer block raises on exit. Outside, no limit."""
    check_budget(step)
    counting = any(b.limit is not None for b in _BUDGETS)
    if operations is not None and not counting:
        CTX.reset_operations()  # no budget in force reads the count
    start = _count() if operations is not None and counting else 0
    budget = _Budget(
        refusal,
        step,
        operations,
        start + operations if operations is not None else None,
        seconds,
        time.monotonic() + seconds if seconds is not None else None,
    )
    _BUDGETS.append(budget)
    _apply_limit()
    try:
        yield
        check_budget(step)  # also when isl's refusal was caught on the way
    except isl.Error:
        # isl says "maximal number of operations exceeded", or whatever the call that
        # could not allocate says (a parser: "syntax error"): ask isl once more
        if not _at_limit():
            raise
        raise _operations_ran_out() from None
    finally:
        _BUDGETS.remove(budget)
        _apply_limit()


def check_budget(where: str = "") -> None:
    """Raise `BudgetExceeded` if a budget in force has run out (its isl operations
    before, or its seconds by now): cheap, for between the steps of a long build."""
    if any(b.limit is not None for b in _BUDGETS) and _at_limit():
        raise _operations_ran_out()  # isl's refusal was caught on the way
    now = time.monotonic()
    for b in _BUDGETS:
        if b.spent is None and b.deadline is not None and now >= b.deadline:
            b.spent = (_refusal(b, f"{b.seconds:g} seconds", where), "seconds", where)
        if b.spent is not None:
            raise BudgetExceeded(b.spent[0], b.spent[1], b.spent[2])


def _operations_ran_out() -> BudgetExceeded:
    """isl refused an operation: the budgets at the tightest limit are spent; the
    outermost of them is the one to report (its whole block must stop)."""
    tightest = min((b.limit for b in _BUDGETS if b.limit is not None), default=None)
    where = _BUDGETS[-1].step
    spent = [b for b in _BUDGETS if b.limit == tightest]
    for b in spent:
        b.spent = b.spent or (
            _refusal(b, f"{b.operations} isl operations", where),
            "isl operations",
            where,
        )
    message, resource, at = spent[0].spent or ("", "", "")
    return BudgetExceeded(message, resource, at)


def _refusal(budget: _Budget, amount: str, where: str) -> str:
    at = f", at {where}" if where else ""
    return f"{budget.refusal} (its budget of {amount} ran out{at})"


def _at_limit() -> bool:
    """Whether isl refuses any operation now (the count reached the limit in force)."""
    try:
        isl.Val.int_from_si(CTX, 0)
    except isl.Error:
        return True
    return False


def _apply_limit() -> None:
    """isl's limit: the tightest of the budgets in force (0: none)."""
    limits = [b.limit for b in _BUDGETS if b.limit is not None]
    CTX.set_max_operations(min(limits) if limits else 0)


def _count() -> int:
    """isl's count of operations since its last reset. isl keeps the count private but
    refuses any operation once it reaches the limit, so it is found by bisection over
    limits, one allocation a probe (a probe that passes counts too: an estimate a few
    dozen operations high at most, nothing next to a budget)."""

    def reached(limit: int) -> bool:
        CTX.set_max_operations(limit)
        return _at_limit()

    low, high = 0, 1
    try:
        while reached(high):
            low, high = high, 2 * high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if reached(middle) else (low, middle)
    finally:
        _apply_limit()
    return high


def largest_value(value: isl.PwAff) -> isl.Val:
    """The largest value a function takes (infinity when unbounded), read from its graph
    rather than by `PwAff.max_val`: a loop with a stride gives functions like i/2 on even
    i, integer everywhere but with a rational coefficient, which max_val refuses
    ("expecting integer affine expression"; it stopped a ResNet-50 tuning run)."""
    return isl.Map.from_pw_aff(value).range().dim_max_val(0)


def partial_trip_region(outer: isl.UnionMap, inner: isl.UnionMap) -> isl.Set | None:
    """Where an inner loop runs less than its whole trip count.

    `outer` and `inner` are prefix schedules (domain → flat schedule values) of an outer
    loop and of a loop nested in it. The answer is the set of outer schedule values at
    which the inner loop's trip count (its largest minus its smallest value) stays below
    its maximum; None when the two schedules share no instance.

    The spans are read from the differences of pairs of inner values, one integer
    maximum and a subtraction, rather than from the inner values' parametric lexmin and
    lexmax: a loop fused through modulos leaves existentials that make those (and the
    comparison of the pieces they give) run for minutes inside isl, where no budget can
    stop them."""
    values = outer.reverse().apply_range(inner)
    if values.is_empty():
        return None
    pairs = isl.Map.from_union_map(values)
    last = pairs.dim(isl.dim_type.out) - 1
    trips = pairs.project_out(isl.dim_type.out, 0, last)
    spans = trips.flat_range_product(trips).apply_range(parse_map("{ [a, b] -> [b - a] }"))
    widest = spans.range().dim_max_val(0)
    if not widest.is_rat():  # the trip count grows with a symbolic size: no full tile
        return None
    at_widest = isl.Set.universe(spans.range().get_space()).fix_val(isl.dim_type.set, 0, widest)
    return _without_divs(trips.domain().subtract(spans.intersect_range(at_widest).domain()))


def _without_divs(s: isl.Set) -> isl.Set:
    """`s`, said without integer divisions where its modulos only hide an equality (a
    value 11 * i0 + i4 written `v mod 11 = i4` between 11 * i0 and 11 * i0 + 10): a
    region with divisions is not isolated (`has_divs`)."""
    if not has_divs(s):
        return s
    plain = s.detect_equalities()
    return plain if not has_divs(plain) else s


def varies_with(region: isl.Set, outer: isl.Set) -> bool:
    """Whether which values of its last dim `region` holds changes with the value of a
    loop, the loops outside it fixed. `region`'s dims are the loop's prefix (`outer`'s
    dims, the loop last), inner loops', then the dim asked about: a padded window's first
    tile leaves its first unrolled rows partial and its last tile its last rows."""
    depth = outer.dim(isl.dim_type.set)
    last = region.dim(isl.dim_type.set) - 1
    pair = region.project_out(isl.dim_type.set, depth, last - depth)
    spread = pair.eliminate(isl.dim_type.set, depth - 1, 1).intersect(extend_dims(outer, 1))
    return not spread.is_subset(pair)


def first_values(s: isl.Set) -> isl.Set:
    """The points of `s` with the smallest last dim for each value of the others."""
    depth = s.dim(isl.dim_type.set) - 1
    by_outer = isl.Map.from_range(s).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, depth)
    return by_outer.lexmin().wrap().flatten()


def extend_dims(s: isl.Set, count: int) -> isl.Set:
    """The set with `count` unconstrained dims appended (an outer loop's region seen
    from a loop nested in it)."""
    return s.add_dims(isl.dim_type.set, count)


def has_divs(s: isl.Set) -> bool:
    """Whether the set needs an integer division (an existential variable) to say."""
    return any(part.dim(isl.dim_type.div) > 0 for part in s.get_basic_sets())


def isolate_option(region: isl.Set, depth: int) -> isl.UnionSet:
    """isl's AST option `isolate[[outer] -> [band]]` for a one-member band below `depth`
    outer schedule dims: the region's instances are generated apart from the rest."""
    as_map = isl.Map.from_range(region).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, depth)
    return isl.UnionSet.from_set(as_map.wrap().set_tuple_name("isolate"))


def loop_value_map(expr: str, domain: isl.Set) -> isl.Map:
    """A statement's instances → the value of a loop (`{ S[dims] -> [(value)] }`)."""
    return isl.Map.from_pw_aff(parse_pw_aff(expr)).intersect_domain(domain)


def output_dim(relation: isl.Map, position: int) -> isl.Map:
    """`{ [v] -> [i0, ..., ik] }` kept to `{ [v] -> [i_position] }`."""
    rank = relation.dim(isl.dim_type.out)
    kept = relation.project_out(isl.dim_type.out, position + 1, rank - position - 1)
    return kept.project_out(isl.dim_type.out, 0, position)


def row_major_offset(index: Sequence[isl.PwAff], shape: Sequence[int]) -> isl.PwAff:
    """The row-major offset in `shape` of an index whose entries are functions of one
    domain."""
    terms = []
    stride = 1
    for value, size in zip(reversed(index), reversed(shape), strict=True):
        terms.append(value.scale_val(isl.Val.int_from_si(value.get_ctx(), stride)))
        stride *= size
    offset = terms[0]
    for term in terms[1:]:
        offset = offset.add(term)
    return offset.coalesce()


def offset_window(offsets: isl.Map) -> tuple[isl.PwAff, int] | None:
    """For `{ [v] -> [offset] }`: the smallest offset as a function of v, and the
    widest window from an iteration's smallest to its largest offset (elements); None
    when the offsets are unbounded."""
    low = offsets.dim_min(0).coalesce()
    widest = largest_value(offsets.dim_max(0).sub(low))
    if not widest.is_int():
        return None
    return low, int(widest.to_python()) + 1
