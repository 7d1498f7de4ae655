"""The static memory plan of a model: every intermediate tensor gets an offset in one
workspace arena, reusing the bytes of tensors that are no longer live.

Lifetimes are intervals of kernel steps (first write, last read); two tensors share bytes
only when their intervals do not overlap. Placement is greedy, largest first, at the
lowest aligned offset that fits between the live neighbours (the usual best-fit plan of
TVM's and onnxruntime's static allocators).

A kernel's output may also take over the bytes of an input it reads for the last time
(`shared`, when `poly.deps.may_share` allows it), as onnxruntime runs a residual `Add` in
place: the output's stores then hit lines the kernel has just read instead of fetching
cold ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polytile.poly.ir.buffers import BUFFER_ALIGN

#: every offset in the arena (itself allocated at this alignment)
ALIGN = BUFFER_ALIGN


@dataclass(frozen=True)
class Lifetime:
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class MemoryPlan:
    offsets: Mapping[str, int]
    arena_bytes: int
    #: bytes the tensors would take without reuse
    unshared_bytes: int


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _owner(name: str, shared: Mapping[str, str]) -> str:
    while name in shared:
        name = shared[name]
    return name


def plan_memory(
    lifetimes: Mapping[str, Lifetime], shared: Mapping[str, str] | None = None
) -> MemoryPlan:
    """Offsets for every tensor; `shared` maps a tensor to the one whose bytes it takes
    over (same size, its life starting at the step where the other's ends)."""
    shared = shared or {}
    if len(set(shared.values())) < len(shared):
        raise ValueError(f"two tensors take over the same bytes in {dict(shared)}")
    for name, owner in shared.items():
        a, b = lifetimes[name], lifetimes[owner]
        if a.size != b.size or not b.first < b.last == a.first:
            raise ValueError(f"tensor {name} cannot take over {owner}'s bytes: {a} after {b}")
    groups: dict[str, Lifetime] = {}
    for name, life in lifetimes.items():
        owner = _owner(name, shared)
        held = groups.get(owner, life)
        groups[owner] = Lifetime(life.size, min(life.first, held.first), max(life.last, held.last))
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, lifetime)
    offsets: dict[str, int] = {}
    order = sorted(groups, key=lambda n: (-groups[n].size, groups[n].first, n))
    for name in order:
        life = groups[name]
        size = _aligned(max(life.size, 1))
        live = sorted(
            (start, end)
            for start, end, other in placed
            if other.first <= life.last and life.first <= other.last
        )
        offset = 0
        for start, end in live:
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[name] = offset
        placed.append((offset, offset + size, life))
    for name in shared:
        offsets[name] = offsets[_owner(name, shared)]
    total = max((end for _, end, _ in placed), default=0)
    unshared = sum(_aligned(max(life.size, 1)) for life in lifetimes.values())
    return MemoryPlan(offsets, total, unshared)
