"""The line flusher the tuner evicts a kernel's weights with (`codegen.flush`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from polytile.codegen.flush import LINE, LineFlusher, _module, line_flusher
from polytile.codegen.jit import emit_assembly, finalize, optimize
from polytile.codegen.target import host


def test_the_flusher_clflushes_line_by_line_and_then_fences() -> None:
    """The machine code is a loop of `clflush` a line apart, with a fence after it."""
    target = host()
    asm = emit_assembly(optimize(finalize(_module(), target), target), target)
    assert "clflush" in asm and "mfence" in asm
    assert f"${LINE}" in asm


def test_every_line_a_buffer_touches_is_flushed_and_its_data_kept() -> None:
    """A view starting inside a line: the flushed range starts at that line and reaches
    the line of the view's last byte; the buffer's values do not change."""
    flusher = line_flusher(host())
    assert isinstance(flusher, LineFlusher)
    data = np.arange(1000, dtype=np.float32)
    view = data[3:257]  # 12 bytes into a line (numpy aligns to at least 16)
    calls: list[tuple[int, int]] = []
    real = flusher._fn
    flusher._fn = lambda first, size: (calls.append((first, size)), real(first, size))[1]
    try:
        flusher(view)
    finally:
        flusher._fn = real
    ((first, size),) = calls
    start, end = view.ctypes.data, view.ctypes.data + view.nbytes
    assert first % LINE == 0 and first <= start < first + LINE
    assert first + size == end
    np.testing.assert_array_equal(data, np.arange(1000, dtype=np.float32))


def test_a_target_without_clflush_has_no_flusher() -> None:
    arm = dataclasses.replace(host(), triple="aarch64-unknown-linux-gnu")
    assert line_flusher(arm) is None
