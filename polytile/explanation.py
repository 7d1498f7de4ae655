"""A kernel's schedule as C-like code: the isl AST with statement bodies, the tensors as a
header, and the temporaries codegen keeps in one slice per thread marked as such; and of
a compiled model, which of its kernels are compiled per size and why.

It sits in the public layer because it combines stages (the default scheduler, the AST,
array contraction) that the core IR must not import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from polytile.errors import PolytileError
from polytile.frontend import Graph
from polytile.frontend.fusion import Partition
from polytile.poly.ast.build import build_ast, to_c
from polytile.poly.default.schedule import default_schedule
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.lower.base import LowerConfig
from polytile.poly.transform.contract import private_temporaries
from polytile.poly.transform.flatten import kernel_of

from .special import describe

if TYPE_CHECKING:
    from .runtime import CompiledModel


def explain(kernel_or_schedule: Kernel | Schedule | CompiledModel) -> str:
    """C-like code of a schedule, or of a kernel under its default schedule; of a
    compiled model, its kernels compiled per size (`polytile.special`) and why."""
    if not isinstance(kernel_or_schedule, Kernel | Schedule):
        return explain_model(kernel_or_schedule)
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


def explain_model(model: CompiledModel) -> str:
    """Which sizes a compiled model serves, and which of its kernels are compiled per
    size on first use (with the sizes compiled so far) and why."""
    m = model.manifest
    lines = [f"// model {m.name}: {len(m.calls)} kernel calls"]
    if m.dynamic is None:
        lines.append("// compiled for its static input shapes")
        return "\n".join(lines) + "\n"
    lines.append(f"// compiled once for all sizes of {', '.join(m.dynamic.named)}")
    if not m.specials:
        lines.append("// every kernel serves every size")
        return "\n".join(lines) + "\n"
    lines.append(f"// {len(m.specials)} kernel(s) compiled per size instead:")
    lines += [f"//   {line}" for line in describe(m.specials)]
    compiled = model.specializations.compiled if model.specializations else {}
    for number, special in enumerate(m.specials):
        met = [sizes for (n, sizes) in compiled if n == number]
        if met:
            shown = "; ".join(", ".join(f"{p}={v}" for p, v in zip(special.params, sizes,
                                                                     strict=True))
                              for sizes in met)  # fmt: skip
            lines.append(f"//   {special.name} compiled so far at: {shown}")
    return "\n".join(lines) + "\n"


def per_size_groups(graph: Graph, parts: Partition, lowering: LowerConfig) -> Mapping[int, str]:
    """The groups of a graph with symbolic sizes whose lowering cannot stay symbolic
    (`compile` compiles them per size), each with the refusal; a schedule or code that
    cannot stay symbolic shows only when the kernel is scheduled (`explain --kernel`)."""
    found = {}
    for group in parts.groups:
        try:
            kernel_of(graph, group, lowering)
        except PolytileError as err:
            found[group.index] = f"its lowering cannot stay symbolic: {err}"
    return found
