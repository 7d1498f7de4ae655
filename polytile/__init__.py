"""polytile: an optimizing compiler for ONNX models built on the polyhedral model.

`import polytile as pt` stays cheap: the heavier layers load on first use.
"""

from __future__ import annotations

from typing import Any

from polytile.version import __version__

#: public name → (module, attribute), imported on first access
_LAZY = {
    "kernel": ("polytile.poly.dsl", "kernel"),
    "kernel_from_node": ("polytile.poly.dsl", "kernel_from_node"),
    "ScheduleHandle": ("polytile.handle", "ScheduleHandle"),
    "explain": ("polytile.explanation", "explain"),
    "default_schedule": ("polytile.poly.default.schedule", "default_schedule"),
    "compile": ("polytile.compiler", "compile"),
    "LowerConfig": ("polytile.poly.lower.base", "LowerConfig"),
    "load": ("polytile.compiler", "load"),
    "CompiledModel": ("polytile.runtime", "CompiledModel"),
    "InferenceSession": ("polytile.session", "InferenceSession"),
    "SessionOptions": ("polytile.session", "SessionOptions"),
    "tune": ("polytile.tuning", "tune"),
    "symbolic_shapes": ("polytile.frontend.symbolic_import", "symbolic_shapes"),
    "import_symbolic": ("polytile.frontend.symbolic_import", "import_symbolic"),
}

__all__ = [
    "CompiledModel",
    "InferenceSession",
    "LowerConfig",
    "ScheduleHandle",
    "SessionOptions",
    "__version__",
    "compile",
    "default_schedule",
    "explain",
    "import_symbolic",
    "kernel",
    "kernel_from_node",
    "load",
    "symbolic_shapes",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'polytile' has no attribute '{name}'")
