"""A kernel's schedule as C-like code: the isl AST with statement bodies, the tensors as a
header, and the temporaries codegen keeps in one slice per thread marked as such.

It sits in the public layer because it combines stages (the default scheduler, the AST,
array contraction) that the core IR must not import."""

from __future__ import annotations

from polytile.poly.ast.build import build_ast, to_c
from polytile.poly.default.schedule import default_schedule
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform.contract import private_temporaries


def explain(kernel_or_schedule: Kernel | Schedule) -> str:
    """C-like code of a schedule, or of a kernel under its default schedule."""
    if isinstance(kernel_or_schedule, Kernel):
        schedule = default_schedule(kernel_or_schedule)
    else:
        schedule = kernel_or_schedule
    kernel = schedule.kernel
    tree = build_ast(schedule)
    private = {p.tensor: p for p in private_temporaries(schedule, tree)}
    header = [f"// kernel {kernel.name}"]
    for t in kernel.tensors.values():
        line = f"// {t.role.value:<9} {t.dtype}{list(t.shape)} {t.name}"
        if t.name in private:
            p = private[t.name]
            line += f" (private to each iteration of {p.loop}: {p.span} elements per thread)"
        header.append(line)
    return "\n".join(header) + "\n" + to_c(tree, kernel)
