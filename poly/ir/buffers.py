"""Buffers as polytile allocates them: aligned to a cache line and a vector, constants
packed into one allocation, and a kernel's buffers set up for a run. Shared by the
runtime, native kernel runs and the oracles."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from polytile.errors import InputError
from polytile.poly.ir.kernel import Kernel, Role

#: byte alignment of every buffer polytile allocates: one cache line and one AVX-512
#: vector. numpy aligns to 16 bytes, so most tensors would start off a line and every
#: 64-byte vector load of them would span two.
BUFFER_ALIGN = 64


def aligned_empty(
    shape: tuple[int, ...], dtype: np.dtype | str, align: int = BUFFER_ALIGN
) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts at a multiple of `align`."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def aligned_copy(value: np.ndarray, align: int = BUFFER_ALIGN) -> np.ndarray:
    """A C-contiguous copy of `value` starting at a multiple of `align`."""
    out = aligned_empty(value.shape, value.dtype, align)
    out[...] = value
    return out


def aligned_block(values: Sequence[np.ndarray], align: int = BUFFER_ALIGN) -> list[np.ndarray]:
    """Copies of `values` packed into one allocation, each starting at a multiple of
    `align` (one allocation: a model's hundred constants are not scattered over the heap)."""
    sizes = [-(-max(v.nbytes, 1) // align) * align for v in values]
    block = aligned_empty((sum(sizes),), np.uint8, align)
    out = []
    start = 0
    for value, size in zip(values, sizes, strict=True):
        view = block[start : start + value.nbytes].view(value.dtype).reshape(value.shape)
        view[...] = value
        out.append(view)
        start += size
    return out


def allocate(kernel: Kernel, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Buffers for every tensor: inputs checked and copied, constants, zeroed others."""
    buffers = {}
    for t in kernel.tensors.values():
        if t.role is Role.INPUT:
            if t.name not in inputs:
                raise InputError(f"kernel '{kernel.name}': input '{t.name}' is missing")
            value = np.asarray(inputs[t.name])
            if value.shape != t.shape or value.dtype != np.dtype(t.dtype):
                raise InputError(
                    f"kernel '{kernel.name}': input '{t.name}' must be {t.dtype}{list(t.shape)}, "
                    f"got {value.dtype}{list(value.shape)}"
                )
            buffers[t.name] = aligned_copy(value)
        elif t.role is Role.CONSTANT:
            buffers[t.name] = aligned_copy(np.asarray(t.value, dtype=t.dtype).reshape(t.shape))
        else:
            buffers[t.name] = aligned_empty(t.shape, t.dtype)
            buffers[t.name][...] = 0
    return buffers
