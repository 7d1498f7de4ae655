"""Small typed helpers around islpy; the rest of polytile never builds isl objects from
strings itself. Dimensions are always named, and spaces are aligned before combining."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import islpy as isl

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


def box(name: str, dims: Sequence[str], extents: Sequence[int], extra: str = "") -> str:
    """`{ name[d0, d1] : 0 <= d0 < e0 and 0 <= d1 < e1 [and extra] }` as isl text."""
    bounds = [f"0 <= {d} < {e}" for d, e in zip(dims, extents, strict=True)]
    if extra:
        bounds.append(f"({extra})")
    where = " and ".join(bounds)
    return f"{{ {name}[{', '.join(dims)}]{' : ' + where if where else ''} }}"


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
