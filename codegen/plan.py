"""The static memory plan of a model: every intermediate tensor gets an offset in one
workspace arena, reusing the bytes of tensors that are no longer live.

Lifetimes are intervals of kernel steps (first write, last read); two tensors share bytes
only when their intervals do not overlap. Placement is greedy, largest first, at the
lowest aligned offset that fits between the live neighbours (the usual best-fit plan of
TVM's and onnxruntime's static allocators).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ALIGN = 64


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


def plan_memory(lifetimes: Mapping[str, Lifetime]) -> MemoryPlan:
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, lifetime)
    offsets: dict[str, int] = {}
    order = sorted(lifetimes, key=lambda n: (-lifetimes[n].size, lifetimes[n].first, n))
    for name in order:
        life = lifetimes[name]
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
    total = max((end for _, end, _ in placed), default=0)
    unshared = sum(_aligned(max(life.size, 1)) for life in lifetimes.values())
    return MemoryPlan(offsets, total, unshared)
