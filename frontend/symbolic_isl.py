"""Symbolic sizes as isl expressions: the quasi-affine parts written for isl's parser, and
each product of sizes (not affine) named as a derived isl parameter that the runtime
computes from the sizes. See `to_isl` for the rule."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from polytile.errors import SymbolicShapeError

from .symbolic import (
    Dim,
    DimLike,
    Monomial,
    Param,
    atom_text,
    bounds_of,
    names_of,
    terms_of,
    value_range,
)

__all__ = ["IslForm", "derived_name", "to_isl"]


@dataclass(frozen=True)
class IslForm:
    """Sizes as quasi-affine isl expressions over `params` (named sizes, then derived
    parameters); `derived` maps each derived parameter to the size it stands for."""

    exprs: tuple[str, ...]
    params: tuple[str, ...]
    derived: Mapping[str, Dim]
    #: the parameters' bounds (those in force at `to_isl`), derived ones included, as an
    #: isl set: `[params] -> { : lo <= p <= hi and ... }`
    context: str

    def multi_pw_aff(self) -> str:
        """`[params] -> { [e0, e1, ...] }`, readable by isl.MultiPwAff."""
        return f"[{', '.join(self.params)}] -> {{ [{', '.join(f'({e})' for e in self.exprs)}] }}"

    def pw_aff(self, index: int = 0) -> str:
        return f"[{', '.join(self.params)}] -> {{ [({self.exprs[index]})] }}"


def derived_name(mono: Monomial) -> str:
    """The isl parameter standing for a non-affine monomial: its factors joined by '__'
    when they are named sizes (batch*seq -> batch__seq, seq*seq -> seq__seq), else
    'nl_' and a digest of its canonical text."""
    if all(isinstance(a, Param) for a in mono):
        return "__".join(a.name for a in mono)  # type: ignore[union-attr]
    digest = hashlib.blake2b("*".join(atom_text(a) for a in mono).encode(), digest_size=4)
    return f"nl_{digest.hexdigest()}"


def to_isl(dims: Sequence[DimLike]) -> IslForm:
    """Sizes as isl quasi-affine expressions.

    The rule: a term c*p of one named size is affine; floor(e/c) of an expression e is
    quasi-affine (isl's floor), e converted by the same rule; a monomial of two or more
    factors (batch*seq, seq*seq, batch*(seq//2)) is not affine, so it becomes one derived
    isl parameter (`derived_name`) whose value the runtime computes from the sizes before
    a call (`IslForm.derived[name].evaluate(sizes)`); isl sees it as an independent
    parameter bounded by its factors' bounds, and for a product of two sizes by the affine
    envelope of the product (`IslForm.context`).
    """
    base: dict[str, None] = {}
    derived: dict[str, Dim] = {}

    def expr(value: DimLike) -> str:
        parts = []
        for mono, c in terms_of(value):
            if not mono:
                parts.append(("- " if c < 0 else "+ ") + str(abs(c)))
                continue
            if len(mono) > 1:
                name = derived_name(mono)
                derived[name] = Dim(((mono, 1),))
                for n in names_of(derived[name]):
                    base.setdefault(n)
                atom = name
            elif isinstance(mono[0], Param):
                atom = mono[0].name
                base.setdefault(atom)
            else:
                atom = f"floor(({expr(mono[0].num)})/{mono[0].den})"
            parts.append(("- " if c < 0 else "+ ") + (atom if abs(c) == 1 else f"{abs(c)}*{atom}"))
        text = " ".join(parts)
        return text[2:] if text.startswith("+") else "-" + text[2:] if text else "0"

    exprs = tuple(expr(d) for d in dims)
    clash = sorted(set(base) & set(derived))
    if clash:
        raise SymbolicShapeError(
            f"the derived isl parameter(s) {', '.join(clash)} clash with sizes of that name",
            tuple(clash),
        )
    params = (*sorted(base), *sorted(derived))
    parts = []
    for name in params:
        lo, hi = value_range(derived[name]) if name in derived else bounds_of(name)
        parts.append(f"{lo} <= {name} <= {hi}")
        if name in derived:
            parts.extend(_envelope(name, derived[name]))
    context = f"[{', '.join(params)}] -> {{ : {' and '.join(parts) or 'true'} }}"
    return IslForm(exprs, params, MappingProxyType(derived), context)


def _envelope(name: str, product: Dim) -> list[str]:
    """Affine constraints tying a derived parameter x*y (two named sizes) to its factors:
    McCormick's envelope, (x - xl)(y - yl) >= 0 and the like, so isl knows that batch*seq
    >= seq, say, although the product itself is not affine."""
    ((mono, _),) = product.terms
    if len(mono) != 2 or not all(isinstance(a, Param) for a in mono):
        return []
    x, y = (a.name for a in mono)  # type: ignore[union-attr]
    (xl, xu), (yl, yu) = bounds_of(x), bounds_of(y)
    return [
        f"{name} >= {xl}*{y} + {yl}*{x} - {xl * yl}",
        f"{name} >= {xu}*{y} + {yu}*{x} - {xu * yu}",
        f"{name} <= {xu}*{y} + {yl}*{x} - {xu * yl}",
        f"{name} <= {xl}*{y} + {yu}*{x} - {xl * yu}",
    ]
