"""The prefetch decisions of a kernel's search space (`poly.ir.schedule.HINTS`): which
matter for it, and their options around the target's own choices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polytile.codegen.target import MachineChoices
from polytile.poly.default.steps import DefaultConfig
from polytile.poly.ir.kernel import Kernel, Role, Statement

#: reduction steps ahead input rows are asked for, the largest weight panel (bytes)
INPUT_AHEAD = (0, 8, 16, 24)
PREFETCH_PANELS = (0, 1 << 15, 1 << 16, 1 << 17, 1 << 18)


def hint_choices(
    kernel: Kernel,
    main: Statement,
    spatial: Sequence[str],
    reduce: Sequence[str],
    config: DefaultConfig,
    machine: MachineChoices,
) -> dict[str, tuple[Any, ...]]:
    """The prefetch choices that matter (`codegen.prefetch` reads them in register
    tiles): rows ahead, the panel size where the kernel reads constants, the next
    stencil panel (over two or more reduced dimensions) where the target fetches no
    weights across kernels (else its window holds them). With the target's values."""
    if not main.reduction or not spatial:
        return {}
    found: dict[str, tuple[Any, ...]] = {
        "input_ahead": tuple(sorted({*INPUT_AHEAD, machine.input_ahead}))
    }
    if any(t.role is Role.CONSTANT for t in kernel.tensors.values()):
        half = config.cache_bytes // 2
        found["prefetch_panel"] = tuple(sorted({*PREFETCH_PANELS, half, machine.prefetch_panel}))
        if len(reduce) >= 2 and not machine.prefetch_weights:
            found["panel_ahead"] = (False, True)
    return found
