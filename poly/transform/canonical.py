"""Canonical names: kernels that differ only in the names of their tensors and statements
(two identical conv groups of one model, or of two models) become equal, so they share a
workload key, a tuning task, a record and compiled code. Dimension names already come
from the op's compute definition, so loop names — and therefore traces — carry over.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from polytile.errors import IllegalSchedule
from polytile.poly.ir.expr import Expr, Load, rewrite
from polytile.poly.ir.kernel import Kernel, Statement
from polytile.poly.ir.schedule import Schedule, initial_schedule


def _fresh(prefix: str, index: int, taken: set[str]) -> str:
    name = f"{prefix}{index}"
    while name in taken:
        name = f"_{name}"
    return name


#: a tuple name in an isl text (`s3[` in `{ s3[i, j] : ... }`): one compiled pattern for
#: every statement (a pattern per name misses `re`'s cache on large models)
_TUPLE_NAME = re.compile(r"(?<![\w.])([A-Za-z_][\w]*)\[")


def canonicalize(kernel: Kernel) -> tuple[Kernel, Mapping[str, str]]:
    """The kernel with tensors named t0, t1, ... and statements s0, s1, ... in order; also
    the renaming (old name → new name) of both."""
    dims = {d for s in kernel.statements for d in s.dims}
    tensors = {old: _fresh("t", i, dims) for i, old in enumerate(kernel.tensors)}
    stmts = {s.name: _fresh("s", i, dims) for i, s in enumerate(kernel.statements)}

    def load(e: Expr) -> Expr | None:
        if isinstance(e, Load):
            return Load(tensors[e.tensor], e.index, e.dtype)
        return None

    def domain(text: str, old: str, new: str) -> str:
        return _TUPLE_NAME.sub(lambda m: f"{new}[" if m.group(1) == old else m.group(0), text)

    statements = tuple(
        Statement(
            stmts[s.name],
            s.dims,
            domain(s.domain, s.name, stmts[s.name]),
            tensors[s.tensor],
            s.index,
            rewrite(s.expr, load),
            s.reduction,
            stmts[s.init_of] if s.init_of is not None else None,
        )
        for s in kernel.statements
    )
    renamed = {tensors[t.name]: replace(t, name=tensors[t.name]) for t in kernel.tensors.values()}
    return Kernel(kernel.name, renamed, statements), {**tensors, **stmts}


#: steps that rewrite the kernel (constants, statements) rather than only the loops
KERNEL_STEPS = frozenset({"pack", "rfactor", "inline"})


def transplant(schedule: Schedule, kernel: Kernel) -> Schedule:
    """`schedule`'s loops on another kernel of the same canonical structure (same
    workload key; constant values may differ) without re-checking legality, which the
    structure decides: kernel-rewriting steps (weight packing) are redone on the new
    kernel's values, the loop tree is reused."""
    from polytile.poly.transform import steps as T

    moved = initial_schedule(kernel)
    try:
        for step in schedule.trace:
            if step.kind in KERNEL_STEPS:
                moved = T.apply_step(moved, step)
    except IllegalSchedule as err:
        raise ValueError(f"kernel {kernel.name} has another structure ({err})") from None
    if moved.kernel.workload_key() != schedule.kernel.workload_key():
        raise ValueError(f"kernel {kernel.name} has another structure than the schedule's")
    return replace(moved, body=schedule.body, trace=schedule.trace)
