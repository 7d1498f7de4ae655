"""In-process memos of the two costly steps of linking, so that compiling a model again
with most kernels unchanged (tuning's whole-model validation, `compile_many` over models
sharing layers, a recompile with one record more) emits and compiles only what changed.

Keys hold everything the result depends on: an emitted kernel's IR text depends on its
workload, its trace and the target it is emitted for (constants are arguments, not code);
an object file on its IR text, the target and the relocation model."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """A dict that forgets its least recently used entries past `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: Hashable, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


#: (workload, trace hash, target) -> (IR text under the placeholder name, parameters)
EMITTED: Memo[tuple[str, int]] = Memo(512)
#: (IR text digest, target, pic) -> compiled part
COMPILED: Memo[object] = Memo(512)
