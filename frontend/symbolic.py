"""Symbolic dimensions: sizes known only at run time (batch, seq), as exact expressions.

A `Dim` is an integer polynomial over atoms: named parameters (`Dim.param("seq")`) and
floor divisions of an expression by a positive constant. Sums, products (batch*seq, legal
here although isl cannot express it affinely), floor division and modulo by positive
constants stay exact; a value that turns out constant is a plain `int`, so a static shape
is a tuple of ints exactly as before.

Canonical form: terms merged and sorted; in a floor division the multiples of the divisor
are taken out (`(2*seq + 3)//2` is `seq + 1`), common factors divided out, a floor of a
floor merged (`(seq//2 + 1)//3` is `(seq + 2)//6`); `x % c` is `x - c*(x//c)`. Canonical
equality implies equal values for every assignment; the converse does not hold
(`s//2 + (s + 1)//2` equals `s` but is written differently).

Comparisons never guess. `==`, `<`, ... and `bool()` answer only what holds for every
size within the bounds in force (every parameter is in [1, MAX_DIM], narrowed by
`assume({"seq": (1, 512)})`); a question whose answer depends on the sizes (is seq == 1?)
raises `SymbolicShapeError` naming the dimensions. `same(a, b)` is structural equality.

isl: `symbolic_isl.to_isl` writes the quasi-affine form over isl parameters, products of
sizes becoming derived parameters.
"""

from __future__ import annotations

import ast
import contextlib
import keyword
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Union

import numpy as np

from polytile.errors import InputError, SymbolicShapeError

__all__ = [
    "ISL_KEYWORDS", "MAX_DIM", "Dim", "DimLike", "FloorDiv", "Monomial", "Param", "assume",
    "atom_text", "bounds_of", "check_bounds", "evaluate_shape", "is_static", "names_of",
    "parse_dim", "same", "terms_of", "value_range",
]  # fmt: skip

#: the largest value a parameter may take unless bounded tighter: the most elements
#: polytile lets a tensor have (frontend/importer.py MAX_ELEMENTS)
MAX_DIM = 1 << 34
#: words isl's parser reserves; a parameter cannot be named like one
ISL_KEYWORDS = frozenset(
    {"and", "or", "not", "implies", "mod", "floor", "ceil", "min", "max", "exists", "infty",
     "true", "false", "rat", "domain", "range", "params", "NaN", "cst"}
)  # fmt: skip
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

DimLike = Union[int, "Dim"]
Bounds = Mapping[str, tuple[int, int]]

_BOUNDS: ContextVar[Bounds] = ContextVar("polytile_dim_bounds", default=MappingProxyType({}))


def check_bounds(bounds: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, int]]:
    """User bounds as {name: (lo, hi)} with 1 <= lo <= hi <= MAX_DIM, or an InputError."""
    out = {}
    for name, pair in bounds.items():
        ok = isinstance(pair, Sequence) and len(pair) == 2
        lo, hi = pair if ok else (0, 0)
        if not (ok and all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi))):
            raise InputError(f"bounds['{name}'] must be a pair of ints (lo, hi), got {pair!r}")
        if not 1 <= lo <= hi <= MAX_DIM:
            raise InputError(
                f"bounds['{name}'] = ({lo}, {hi}) must satisfy 1 <= lo <= hi <= {MAX_DIM}"
            )
        out[name] = (lo, hi)
    return out


@contextlib.contextmanager
def assume(bounds: Mapping[str, Sequence[int]]) -> Iterator[None]:
    """Decide comparisons inside the block with these parameter bounds (others keep
    [1, MAX_DIM])."""
    token = _BOUNDS.set(MappingProxyType({**_BOUNDS.get(), **check_bounds(bounds)}))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def bounds_of(name: str) -> tuple[int, int]:
    """The bounds in force for parameter `name`."""
    return _BOUNDS.get().get(name, (1, MAX_DIM))


# --- atoms -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """A named size given at run time."""

    name: str

    @property
    def key(self) -> tuple:
        return (0, self.name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class FloorDiv:
    """floor(num / den): `num` reduced modulo `den` and sharing no factor with it."""

    num: Dim
    den: int

    def __eq__(self, other: object) -> bool:  # structural: atoms are compared as terms
        return isinstance(other, FloorDiv) and self.den == other.den and same(self.num, other.num)

    def __hash__(self) -> int:
        return hash((self.den, self.num))

    @property
    def key(self) -> tuple:
        return (1, self.den, self.num.key)

    def __str__(self) -> str:
        inner = str(self.num)
        if len(self.num.terms) > 1:
            inner = f"({inner})"
        return f"{inner}//{self.den}"


Atom = Param | FloorDiv
Monomial = tuple[Atom, ...]  # sorted by key, repeated for powers; () is the constant


def _mono_key(mono: Monomial) -> tuple:
    return (len(mono), tuple(a.key for a in mono))


def _comparison(relation: str, flip: bool) -> Callable[[Dim, object], bool]:
    def compare(self: Dim, other: object) -> bool:
        other = _coerce(other)
        if other is None:
            return NotImplemented
        return _decide(other, self, relation) if flip else _decide(self, other, relation)

    return compare


class Dim:
    """A symbolic size; build with `Dim.param`, arithmetic and `parse_dim`."""

    __slots__ = ("_hash", "terms")
    terms: tuple[tuple[Monomial, int], ...]

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]) -> None:
        object.__setattr__(self, "terms", terms)
        object.__setattr__(self, "_hash", hash(terms))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Dim is immutable")

    __delattr__ = __setattr__  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (Dim, (self.terms,))

    @staticmethod
    def param(name: str) -> Dim:
        if not _IDENT.match(name) or name in ISL_KEYWORDS or keyword.iskeyword(name):
            raise InputError(
                f"symbolic dimension name {name!r} must be an identifier (letters, digits, "
                f"'_') and not a reserved word"
            )
        return _atom_dim(Param(name))

    # --- construction -------------------------------------------------------------------
    @staticmethod
    def _make(coeffs: Mapping[Monomial, int]) -> DimLike:
        """The canonical value of a polynomial: an int when it is constant."""
        live = {m: c for m, c in coeffs.items() if c}
        if not live or list(live) == [()]:
            return live.get((), 0)
        return Dim(tuple(sorted(live.items(), key=lambda t: _mono_key(t[0]))))

    @property
    def key(self) -> tuple:
        return tuple((_mono_key(m), c) for m, c in self.terms)

    # --- arithmetic ---------------------------------------------------------------------
    def __add__(self, other: object) -> DimLike:
        other = _coerce(other)
        if other is None:
            return NotImplemented
        coeffs = dict(self.terms)
        for mono, c in terms_of(other):
            coeffs[mono] = coeffs.get(mono, 0) + c
        return Dim._make(coeffs)

    __radd__ = __add__

    def __neg__(self) -> DimLike:
        return Dim._make({m: -c for m, c in self.terms})

    def __pos__(self) -> Dim:
        return self

    def __sub__(self, other: object) -> DimLike:
        other = _coerce(other)
        return NotImplemented if other is None else self + (-other)

    def __rsub__(self, other: object) -> DimLike:
        other = _coerce(other)
        return NotImplemented if other is None else (-self) + other

    def __mul__(self, other: object) -> DimLike:
        other = _coerce(other)
        if other is None:
            return NotImplemented
        coeffs: dict[Monomial, int] = {}
        for ma, ca in self.terms:
            for mb, cb in terms_of(other):
                mono = tuple(sorted(ma + mb, key=lambda atom: atom.key))
                coeffs[mono] = coeffs.get(mono, 0) + ca * cb
        return Dim._make(coeffs)

    __rmul__ = __mul__

    def __pow__(self, exponent: int) -> DimLike:
        if not isinstance(exponent, int) or exponent < 0:
            return NotImplemented
        return math.prod([self] * exponent, start=1)  # type: ignore[arg-type]

    def __floordiv__(self, other: object) -> DimLike:
        other = _coerce(other)
        if isinstance(other, Dim):
            return self._exact_div(other)
        if other is None:
            return NotImplemented
        if other <= 0:
            raise SymbolicShapeError(
                f"{self} // {other}: symbolic sizes divide only by positive constants",
                names_of(self),
            )
        return _floordiv(self, other)

    def __mod__(self, other: object) -> DimLike:
        other = _coerce(other)
        if isinstance(other, Dim):
            self._exact_div(other)  # raises unless the division is exact
            return 0
        return NotImplemented if other is None else self - other * (self // other)

    def __rfloordiv__(self, other: object) -> DimLike:
        if _coerce(other) == 0 and self != 0:
            return 0  # 0 // n and 0 % n for a size that is never 0
        raise SymbolicShapeError(
            f"{other} // {self}: a division by a symbolic size is not expressible", names_of(self)
        )

    __rmod__ = __rfloordiv__

    def __truediv__(self, other: object) -> DimLike:
        raise SymbolicShapeError(
            f"{self} / {other}: symbolic sizes have no true division (use //)", names_of(self)
        )

    __rtruediv__ = __truediv__

    def _exact_div(self, other: Dim) -> DimLike:
        """self // other when `other` divides self as polynomials over the atoms (then the
        values divide for every size): multivariate division in graded lex order, which
        leaves no remainder exactly when the division is exact."""
        atoms = sorted({a for m, _ in self.terms + other.terms for a in m}, key=lambda a: a.key)

        def order(mono: Monomial) -> tuple:
            return (-len(mono), tuple(-sum(a == v for a in mono) for v in atoms))

        lead, lead_c = min(other.terms, key=lambda t: order(t[0]))  # greatest in grlex
        rest: DimLike = self
        quotient: DimLike = 0
        while isinstance(rest, Dim):
            mono, c = min(rest.terms, key=lambda t: order(t[0]))
            left = list(mono)
            for atom in lead:
                if atom not in left:
                    raise self._inexact(other)
                left.remove(atom)
            if c % lead_c:
                raise self._inexact(other)
            term = Dim._make({tuple(left): c // lead_c})
            quotient, rest = quotient + term, rest - term * other
        if rest:
            raise self._inexact(other)
        return quotient

    def _inexact(self, other: Dim) -> SymbolicShapeError:
        return SymbolicShapeError(
            f"({self}) // ({other}): only exact divisions by a symbolic size are expressible",
            names_of(self, other),
        )

    def __abs__(self) -> DimLike:
        return self if self >= 0 else -self

    def __ceil__(self) -> Dim:
        return self

    __floor__ = __trunc__ = __round__ = __ceil__

    def __int__(self) -> int:
        raise SymbolicShapeError(f"the size {self} is symbolic here, a static one is needed",
                                 names_of(self))  # fmt: skip

    __index__ = __int__

    # --- comparisons: decided for every size, or an error ------------------------------
    def __hash__(self) -> int:
        return self._hash

    __eq__ = _comparison("==", False)  # type: ignore[assignment]
    __lt__ = _comparison("<", False)
    __le__ = _comparison("<=", False)
    __gt__ = _comparison("<", True)
    __ge__ = _comparison("<=", True)

    def __ne__(self, other: object) -> bool:
        other = _coerce(other)
        return NotImplemented if other is None else not _decide(self, other, "==")

    def __bool__(self) -> bool:
        return not _decide(self, 0, "==")

    # --- inspection ----------------------------------------------------------------------
    @property
    def params(self) -> frozenset[str]:
        return frozenset(names_of(self))

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        """The value under an assignment {name: int} of every parameter it uses."""
        missing = sorted(self.params - set(sizes))
        if missing:
            raise InputError(f"evaluating {self} needs sizes for {', '.join(missing)}")
        return int(_fold(self, lambda atom: _atom_value(atom, sizes)))

    def __str__(self) -> str:
        if len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1:
            return str(self.terms[0][0][0])  # one atom: seq, (seq + 1)//2
        text = ""
        for mono, c in sorted(self.terms, key=lambda t: (-len(t[0]), _mono_key(t[0]))):
            body = "*".join(atom_text(a) for a in mono)
            body = f"{abs(c)}*{body}" if body and abs(c) != 1 else body or str(abs(c))
            text += (" - " if c < 0 else " + ") + body
        return "-" + text[3:] if text.startswith(" -") else text[3:]

    __repr__ = __str__


def _atom_dim(atom: Atom) -> Dim:
    return Dim((((atom,), 1),))


def atom_text(atom: Atom) -> str:
    return f"({atom})" if isinstance(atom, FloorDiv) else str(atom)


def _coerce(value: object) -> DimLike | None:
    """An int or Dim operand (numpy integers become ints), or None for anything else."""
    if isinstance(value, Dim | int):
        return value
    return int(value) if isinstance(value, np.integer) else None  # type: ignore[arg-type]


def terms_of(value: DimLike) -> tuple[tuple[Monomial, int], ...]:
    if isinstance(value, Dim):
        return value.terms
    return (((), int(value)),) if value else ()


def _absorbable(expr: Dim) -> FloorDiv | None:
    """A floor division x//a appearing in `expr` only as a term of coefficient 1."""
    for mono, c in expr.terms:
        atom = mono[0] if len(mono) == 1 and c == 1 else None
        if isinstance(atom, FloorDiv) and sum(atom in m for m, _ in expr.terms) == 1:
            return atom
    return None


def _floordiv(expr: DimLike, den: int) -> DimLike:
    """floor(expr / den), den > 0, in canonical form."""
    if isinstance(expr, int):
        return expr // den
    if den == 1:
        return expr
    quotient: dict[Monomial, int] = {}
    remainder: dict[Monomial, int] = {}
    for mono, c in expr.terms:
        quotient[mono], remainder[mono] = divmod(c, den)
    q, r = Dim._make(quotient), Dim._make(remainder)
    if isinstance(r, int):  # 0 <= r < den
        return q
    inner = _absorbable(r)
    if inner is not None:  # (p + x//a)//b == (a*p + x)//(a*b) for an integer p
        return q + _floordiv(inner.den * (r - _atom_dim(inner)) + inner.num, inner.den * den)
    # (g*y + k)//(g*d) == (y + k//g)//d for integers y: divide out the gcd g of den and
    # the non-constant coefficients
    k = dict(r.terms).get((), 0)
    g = math.gcd(den, *(c for m, c in r.terms if m))
    r, den = Dim._make({m: c // g for m, c in r.terms if m}) + k // g, den // g
    if den == 1 or (g > 1 and _absorbable(r) is not None):  # type: ignore[arg-type]
        return q + _floordiv(r, den)
    assert isinstance(r, Dim)
    return q + _atom_dim(FloorDiv(r, den))


def _fold(expr: DimLike, value: Callable[[Atom], object]) -> object:
    """The polynomial with each atom replaced by `value(atom)` (ints, or Dims)."""
    if isinstance(expr, int):
        return expr
    total: object = 0
    for mono, c in expr.terms:
        term: object = c
        for atom in mono:
            term = term * value(atom)  # type: ignore[operator]
        total = total + term  # type: ignore[operator]
    return total


def _atom_value(atom: Atom, sizes: Mapping[str, int]) -> int:
    if isinstance(atom, Param):
        return int(sizes[atom.name])
    return int(_fold(atom.num, lambda a: _atom_value(a, sizes))) // atom.den  # type: ignore[call-overload]


def names_of(*values: object) -> tuple[str, ...]:
    """Parameter names used by the values, in first-seen order."""
    found: dict[str, None] = {}

    def visit(value: object) -> None:
        if isinstance(value, Dim):
            for mono, _ in value.terms:
                for atom in mono:
                    if isinstance(atom, Param):
                        found.setdefault(atom.name)
                    else:
                        visit(atom.num)

    for v in values:
        visit(v)
    return tuple(found)


def same(a: DimLike, b: DimLike) -> bool:
    """Structural equality: True when both have the same canonical form (hence the same
    value for every size); never raises."""
    if isinstance(a, Dim) and isinstance(b, Dim):
        return a.terms == b.terms
    if isinstance(a, Dim) or isinstance(b, Dim):
        return False
    return a == b


def is_static(value: object) -> bool:
    return not isinstance(value, Dim)


# --- deciding comparisons ----------------------------------------------------------------


Ranges = Mapping[str, tuple[int, int]]  # bounds of the remainders floors introduce
#: at most this many floor divisions are eliminated to decide one comparison
_ELIMINATIONS = 8


def _atom_range(atom: Atom, extra: Ranges) -> tuple[int, int]:
    if isinstance(atom, Param):
        return extra.get(atom.name) or bounds_of(atom.name)
    lo, hi = _bounded(atom.num, extra, 0)
    return lo // atom.den, hi // atom.den


def _interval(expr: DimLike, extra: Ranges) -> tuple[int, int]:
    """Interval arithmetic (every parameter has finite bounds)."""
    lo = hi = 0
    for mono, c in terms_of(expr):
        r = (c, c)
        for atom in mono:
            products = [x * y for x in r for y in _atom_range(atom, extra)]
            r = (min(products), max(products))
        lo, hi = lo + r[0], hi + r[1]
    return lo, hi


def _shifted(expr: Dim, extra: Ranges) -> tuple[int, int] | None:
    """Bounds from substituting atom = low + t (t >= 0): the constant term bounds the
    polynomial from below when every other coefficient is >= 0 (from above when all are
    <= 0). Catches what intervals lose, e.g. batch*seq - seq >= 0."""
    shift: dict[Atom, DimLike] = {}
    for mono, _ in expr.terms:
        for atom in mono:
            if atom not in shift:
                low = _atom_range(atom, extra)[0]
                shift[atom] = low + _atom_dim(Param(f"%t{len(shift)}"))
    terms = dict(terms_of(_fold(expr, lambda atom: shift[atom])))  # type: ignore[arg-type]
    base = terms.pop((), 0)
    lo = base if all(c >= 0 for c in terms.values()) else None
    hi = base if all(c <= 0 for c in terms.values()) else None
    return None if lo is None and hi is None else (lo, hi)  # type: ignore[return-value]


def _without_floor(expr: Dim, atom: FloorDiv, rest: Param) -> tuple[DimLike, int]:
    """(d**k * expr, d**k) with atom = (num - rest)/d substituted, rest in [0, d-1]: an
    exact integer polynomial in which the floor division no longer appears."""
    d = atom.den
    k = max(mono.count(atom) for mono, _ in expr.terms)
    total: DimLike = 0
    for mono, c in expr.terms:
        others = tuple(a for a in mono if a != atom)
        term: DimLike = c * d ** (k - len(mono) + len(others))
        term = term * (Dim(((others, 1),)) if others else 1)
        for _ in range(len(mono) - len(others)):
            term = term * (atom.num - _atom_dim(rest))
        total = total + term
    return total, d**k


def _bounded(expr: DimLike, extra: Ranges, budget: int) -> tuple[int, int]:
    if isinstance(expr, int):
        return (expr, expr)
    lo, hi = _interval(expr, extra)
    if lo <= 0 <= hi:
        shifted = _shifted(expr, extra)
        if shifted is not None:
            lo = lo if shifted[0] is None else max(lo, shifted[0])
            hi = hi if shifted[1] is None else min(hi, shifted[1])
    floors = [a for mono, _ in expr.terms for a in mono if isinstance(a, FloorDiv)]
    if lo <= 0 <= hi and floors and budget > 0:
        rest = Param(f"%r{len(extra)}")  # not an identifier, so no size of that name
        new, scale = _without_floor(expr, floors[0], rest)
        lo2, hi2 = _bounded(new, {**extra, rest.name: (0, floors[0].den - 1)}, budget - 1)
        lo, hi = max(lo, -(-lo2 // scale)), min(hi, hi2 // scale)
    return lo, hi


def value_range(expr: DimLike) -> tuple[int, int]:
    """Bounds on the value of `expr` for every size within the bounds in force: interval
    arithmetic, shifted to the lower bounds, with floor divisions x//d eliminated as
    (x - r)/d for a remainder r in [0, d-1] when that decides more."""
    return _bounded(expr, {}, _ELIMINATIONS)


def _decide(a: object, b: object, relation: str) -> bool:
    diff = a - b  # type: ignore[operator]
    lo, hi = value_range(diff)
    if relation == "==":
        if isinstance(diff, int) or lo == hi:  # bounds may pin a size: seq in [1, 1]
            return lo == hi == 0
        if lo > 0 or hi < 0:
            return False
    elif relation == "<":
        if hi < 0 or lo >= 0:
            return hi < 0
    elif lo > 0 or hi <= 0:  # "<="
        return hi <= 0
    names = names_of(a, b)
    ranges = ", ".join(f"{n} in [{bounds_of(n)[0]}, {bounds_of(n)[1]}]" for n in names)
    hint = "bounds that decide it"
    limit = b if isinstance(b, int) else a
    if len(names) == 1 and isinstance(limit, int) and limit >= 1 and relation != "==":
        hint = f"bounds that decide it (e.g. bounds={{'{names[0]}': (1, {limit})}})"
    raise SymbolicShapeError(
        f"cannot decide whether {a} {relation} {b} for every size ({ranges}); give {hint} "
        f"or static sizes",
        names,
    )


# --- parsing -----------------------------------------------------------------------------


def shape_texts(shape: Sequence[object]) -> tuple[int | str, ...]:
    """A shape with its symbolic sizes as `Dim` texts (a manifest's, a header's)."""
    return tuple(str(d) if isinstance(d, Dim) else int(d) for d in shape)  # type: ignore[call-overload]


def parse_dim(text: str) -> DimLike:
    """A Dim from Python syntax: names, ints, + - * // % and parentheses."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise InputError(f"cannot parse the symbolic size {text!r}: {exc.msg}") from exc

    def build(node: ast.AST) -> DimLike:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return Dim.param(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = build(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            ops: dict[type, Callable[[DimLike, DimLike], DimLike]] = {
                ast.Add: lambda x, y: x + y,
                ast.Sub: lambda x, y: x - y,
                ast.Mult: lambda x, y: x * y,
                ast.FloorDiv: lambda x, y: x // y,
                ast.Mod: lambda x, y: x % y,
            }
            fn = ops.get(type(node.op))
            if fn is not None:
                return fn(build(node.left), build(node.right))
        raise InputError(f"cannot parse the symbolic size {text!r}: {ast.unparse(node)!r}")

    return build(tree)


def evaluate_shape(shape: Sequence[DimLike], sizes: Mapping[str, int]) -> tuple[int, ...]:
    """A symbolic shape at concrete sizes."""
    return tuple(d.evaluate(sizes) if isinstance(d, Dim) else int(d) for d in shape)
