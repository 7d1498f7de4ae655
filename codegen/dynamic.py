"""The run-time half of a model compiled once for all sizes.

Its kernels take their sizes as arguments and its intermediate tensors change size with
them, so what a static model fixes at link time is worked out per run here, from the
sizes the inputs' shapes give: the values of the derived sizes (products of named sizes,
`batch__seq`, which isl sees as parameters of their own), the memory plan (the same
lifetimes and sharing, placed by `plan.plan_memory` at the run's byte sizes), and the
table the entry reads them from (sizes first, then each arena tensor's offset). Plans are
cached per distinct sizes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from polytile.errors import InputError
from polytile.frontend.symbolic import DimLike, evaluate_shape, parse_dim
from polytile.poly.ir.kernel import Extent, size_of

from .plan import Lifetime, plan_memory

#: table entries per kernel compiled per size (`codegen.special.ENTRIES`)
SPECIAL_ENTRIES = 3
#: distinct sizes whose plans are kept
PLANS_KEPT = 64
#: a model's compiled planner (`codegen.dynamic_plan`): fills the table for the named
#: sizes and returns the arena bytes
NativePlan = Callable[[np.ndarray, np.ndarray], int]


@dataclass(frozen=True)
class ArenaTensor:
    """An intermediate tensor of a model compiled for all sizes: its element size, its
    shape in kernel extents (numbers and isl texts over the sizes) and its lifetime."""

    name: str
    itemsize: int
    shape: tuple[Extent, ...]
    first: int
    last: int

    def nbytes(self, sizes: Mapping[str, int]) -> int:
        return self.itemsize * math.prod(size_of(d, sizes) for d in self.shape)


@dataclass(frozen=True)
class DynamicPlan:
    """The sizes a model's calls take and its arena, for any sizes."""

    #: the named sizes the inputs give, in the order of the table
    named: tuple[str, ...]
    #: derived size → the product of named sizes it stands for (`Dim` text)
    derived: Mapping[str, str]
    arena: tuple[ArenaTensor, ...]
    #: arena tensor → the one whose bytes it takes over (`plan.plan_memory`)
    shared: Mapping[str, str] = field(default_factory=dict)
    #: per index tensor the entry checks, its shape and the sizes its values index:
    #: its element count and those sizes end the table (`module.IndexCheck`)
    counted: tuple[tuple[tuple[Extent, ...], tuple[Extent, ...]], ...] = ()
    #: named size → (lowest, highest) the model was compiled for, where given; an
    #: exported library's planner refuses others (`codegen.dynamic_plan`)
    bounds: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: kernels compiled per size (`codegen.special`): each takes `special.ENTRIES` entries
    #: at the table's end, which the runtime fills (zeros here)
    specials: int = 0
    #: named sizes → (table, arena bytes) worked out already
    _tables: dict[tuple[int, ...], tuple[np.ndarray, int, dict[str, int]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        for name in ("derived", "shared", "bounds"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def sizes(self) -> tuple[str, ...]:
        """Every size in the table's order: the named ones, then the derived ones."""
        return (*self.named, *self.derived)

    def values(self, named: Mapping[str, int]) -> dict[str, int]:
        """Every size's value, the derived ones computed from the named ones."""
        values = {n: int(named[n]) for n in self.named}
        for name, text in self.derived.items():
            values[name] = _value(text, values)
        return values

    @property
    def table_length(self) -> int:
        """The entries of the table: sizes, arena offsets, each check's count and bounds."""
        return max(1, self.special_entry(self.specials))

    def special_entry(self, number: int) -> int:
        """The table entry where specialized kernel `number`'s entries start."""
        counts = sum(1 + len(bounds) for _, bounds in self.counted)
        return len(self.sizes) + len(self.arena) + counts + SPECIAL_ENTRIES * number

    def table(
        self, named: Mapping[str, int], native: NativePlan | None = None
    ) -> tuple[np.ndarray, int, dict[str, int]]:
        """The entry's dynamic table at these sizes, the arena bytes it needs and every
        size's value (`values`), worked out once per distinct sizes: by the model's
        compiled planner where given (`native`), else by `plan_memory` here."""
        key = tuple(int(named[n]) for n in self.named)
        found = self._tables.get(key)
        if found is None:
            if len(self._tables) >= PLANS_KEPT:
                self._tables.pop(next(iter(self._tables)))
            sizes = dict(zip(self.named, key, strict=True))
            found = self._native(sizes, native) if native else self._plan(sizes)
            self._tables[key] = found
        return found

    def _native(
        self, named: Mapping[str, int], native: NativePlan
    ) -> tuple[np.ndarray, int, dict[str, int]]:
        table = np.zeros(self.table_length, np.int64)
        arena = native(np.array([named[n] for n in self.named], np.int64), table)
        table.flags.writeable = False
        return table, arena, self.values(named)

    def _plan(self, named: Mapping[str, int]) -> tuple[np.ndarray, int, dict[str, int]]:
        values = self.values(named)
        lifetimes = {t.name: Lifetime(t.nbytes(values), t.first, t.last) for t in self.arena}
        memory = plan_memory(lifetimes, self.shared)
        entries = [values[n] for n in self.sizes] + [memory.offsets[t.name] for t in self.arena]
        for shape, bounds in self.counted:
            entries.append(math.prod(size_of(d, values) for d in shape))
            entries += [size_of(d, values) for d in bounds]
        entries += [0] * (SPECIAL_ENTRIES * self.specials)
        table = np.array(entries or [0], dtype=np.int64)
        table.flags.writeable = False
        return table, memory.arena_bytes, values

    def to_json(self) -> dict[str, Any]:
        return {
            "named": list(self.named),
            "derived": dict(self.derived),
            "arena": [[t.name, t.itemsize, list(t.shape), t.first, t.last] for t in self.arena],
            "shared": dict(self.shared),
            "counted": [[list(shape), list(bounds)] for shape, bounds in self.counted],
            **({"bounds": {n: list(b) for n, b in self.bounds.items()}} if self.bounds else {}),
            **({"specials": self.specials} if self.specials else {}),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> DynamicPlan:
        arena = tuple(
            ArenaTensor(str(n), int(i), tuple(d if isinstance(d, str) else int(d) for d in s),
                        int(f), int(last))
            for n, i, s, f, last in data["arena"]
        )  # fmt: skip

        def extents(items: list) -> tuple[Extent, ...]:
            return tuple(d if isinstance(d, str) else int(d) for d in items)

        counted = tuple(
            (extents(shape), extents(bounds)) for shape, bounds in data.get("counted", ())
        )
        return DynamicPlan(
            tuple(data["named"]), dict(data["derived"]), arena, dict(data.get("shared", {})),
            counted,
            {str(n): (int(lo), int(hi)) for n, (lo, hi) in data.get("bounds", {}).items()},
            int(data.get("specials", 0)),
        )  # fmt: skip


def bind(
    model: str, specs: Sequence[tuple[str, tuple[int | str, ...]]], shapes: Sequence[tuple]
) -> dict[str, int]:
    """The named sizes that inputs of these shapes give (`specs`: each input's name and
    its shape, a size named or written as `Dim` text), checked: the rank, the static
    sizes, one value per name, each at least 1, and every other size agreeing."""
    found: dict[str, int] = {}
    for (name, spec), shape in zip(specs, shapes, strict=True):
        if len(shape) != len(spec):
            raise InputError(
                f"model '{model}': input '{name}' must have rank {len(spec)}, got {list(shape)}"
            )
        for want, got in zip(spec, shape, strict=True):
            if isinstance(want, str) and want.isidentifier():
                if got < 1:
                    raise InputError(
                        f"model '{model}': input '{name}' gives size '{want}' = {got}; "
                        "sizes must be at least 1"
                    )
                found.setdefault(want, int(got))
    for (name, spec), shape in zip(specs, shapes, strict=True):
        expected = shape_at(spec, found)
        if expected != tuple(shape):
            shown = ", ".join(str(d) for d in spec)
            raise InputError(
                f"model '{model}': input '{name}' must have shape [{shown}] = "
                f"{list(expected)} with {found}, got {list(shape)}"
            )
    return found


def shape_at(spec: tuple[int | str, ...], sizes: Mapping[str, int]) -> tuple[int, ...]:
    """A shape written with named sizes and `Dim` texts, at these sizes."""
    return tuple(d if isinstance(d, int) else _value(d, sizes) for d in spec)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> DimLike:
    """A size's `Dim` text parsed once (every run binds and shapes through it)."""
    return parse_dim(text)


def _value(text: str, sizes: Mapping[str, int]) -> int:
    return evaluate_shape((_parsed(text),), sizes)[0]
