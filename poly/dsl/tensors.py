"""The tensor table of a kernel being built: declared inputs and constants, written
tensors as statements define them, and the roles they end up with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.errors import InputError
from polytile.poly.dsl.parse import ISL_WORDS
from polytile.poly.ir.kernel import Role, Tensor


@dataclass
class TensorEntry:
    """One tensor of the table; its shape is None until a statement writing it sets it."""

    name: str
    shape: tuple[int | str, ...] | None
    dtype: str
    value: np.ndarray | None = None
    writes: list[int] = field(default_factory=list)  # statement positions writing it
    reads: list[int] = field(default_factory=list)  # statement positions reading it


def declare(
    tensors: Mapping[str, Any], dtype: str, dtypes: Mapping[str, str], where: str
) -> dict[str, TensorEntry]:
    out = {}
    for name, spec in tensors.items():
        _check_name(name, "tensor", where)
        if isinstance(spec, np.ndarray):
            value = spec.astype(dtypes[name]) if name in dtypes else spec
            out[name] = TensorEntry(name, tuple(value.shape), value.dtype.name, np.array(value))
            continue
        shape = (spec,) if isinstance(spec, int | np.integer | str) else spec
        try:
            shape = tuple(_extent(d, where) for d in shape)
        except (TypeError, ValueError):
            raise InputError(
                f"{where}: tensor '{name}' must be given a shape (tuple of ints and size "
                f"names) or a numpy array, got {spec!r}"
            ) from None
        if any(isinstance(d, int) and d < 0 for d in shape):
            raise InputError(f"{where}: tensor '{name}' has a negative extent in {shape}")
        out[name] = TensorEntry(name, shape, dtype_name(dtypes.get(name, dtype), where))
    return out


def _extent(value: object, where: str) -> int | str:
    """An extent as given: a number, or a symbolic size's name (an isl parameter)."""
    if isinstance(value, str):
        _check_name(value, "symbolic size", where)
        return value
    return int(value)  # type: ignore[call-overload]


def params_of(table: Mapping[str, TensorEntry], extents: Mapping[str, int | str]) -> list[str]:
    """The symbolic sizes of the declared shapes and the given extents, sorted."""
    names = {e for e in extents.values() if isinstance(e, str)}
    for t in table.values():
        names.update(d for d in t.shape or () if isinstance(d, str))
    return sorted(names)


def dtype_name(value: str, where: str) -> str:
    try:
        return np.dtype(value).name
    except TypeError:
        raise InputError(f"{where}: unknown dtype {value!r}") from None


def _check_name(name: str, what: str, where: str) -> None:
    if not name.isidentifier() or name in ISL_WORDS:
        raise InputError(f"{where}: '{name}' cannot name a {what}")


def roles(
    table: Mapping[str, TensorEntry], outputs: Sequence[str] | None, where: str
) -> dict[str, Tensor]:
    if outputs is not None:
        for o in outputs:
            if o not in table or not table[o].writes:
                raise InputError(f"{where}: outputs names '{o}', which no statement writes")
    result = {}
    for t in table.values():
        assert t.shape is not None
        if t.value is not None:
            role = Role.CONSTANT
        elif not t.writes:
            if not t.reads:
                raise InputError(f"{where}: tensor '{t.name}' is declared but never used")
            role = Role.INPUT
        elif outputs is not None:
            role = Role.OUTPUT if t.name in outputs else Role.TEMP
        else:
            last = max(t.writes)
            role = Role.TEMP if any(r > last for r in t.reads) else Role.OUTPUT
        result[t.name] = Tensor(t.name, t.shape, t.dtype, role, t.value)
    return result
