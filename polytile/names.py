"""Fresh names, shared by every stage: the frontend names graph values and nodes, the
poly layer names statements, loops and packed tensors. A base module like `errors`:
it imports nothing of polytile."""

from __future__ import annotations


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_N` for the smallest N that is free; records the result in `taken`."""
    name = base
    index = 1
    while name in taken:
        name = f"{base}_{index}"
        index += 1
    taken.add(name)
    return name
