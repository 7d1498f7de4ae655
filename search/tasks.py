"""Tuning tasks: the distinct kernels of a model (identical groups, by canonical workload
key, are one task weighted by how often the model runs it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polytile.frontend import Graph, import_model, optimize, partition
from polytile.frontend.importer import ModelSource
from polytile.poly.canonical import canonicalize
from polytile.poly.flatten import kernel_of
from polytile.poly.kernel import Kernel
from polytile.poly.lower.base import LowerConfig


@dataclass(frozen=True)
class Task:
    index: int
    key: str
    kernel: Kernel
    #: how many groups of the model run this kernel
    weight: int
    flops: int
    #: the fused op kind, for the summary table
    kind: str


def extract_tasks(
    model: ModelSource | Graph,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    lowering: LowerConfig | None = None,
) -> list[Task]:
    """The model's distinct kernels as `compile` lowers them: with `lowering`, by default
    this machine's (`polytile.compiler.lower_config`)."""
    if lowering is None:
        from polytile.codegen.target import host
        from polytile.compiler import lower_config

        lowering = lower_config(host())
    graph = model if isinstance(model, Graph) else import_model(model, input_shapes=input_shapes)
    graph = optimize(graph)
    found: dict[str, Task] = {}
    for group in partition(graph).groups:
        kernel, _ = canonicalize(kernel_of(graph, group, lowering))
        key = kernel.workload_key()
        if key in found:
            t = found[key]
            found[key] = Task(t.index, key, t.kernel, t.weight + 1, t.flops, t.kind)
        else:
            found[key] = Task(len(found), key, kernel, 1, kernel.flops(), group.kind)
    return list(found.values())


def select_tasks(tasks: Sequence[Task], spec: str | None) -> list[Task]:
    """`"0,2-5"` → those task indices (all tasks when spec is None)."""
    if not spec:
        return list(tasks)
    from polytile.errors import InputError

    wanted: set[int] = set()
    for part in spec.split(","):
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                wanted.update(range(lo, hi + 1))
            else:
                wanted.add(int(part))
        except ValueError:
            raise InputError(f"--tasks takes indices like 0,2-5, not '{spec}'") from None
    bad = sorted(i for i in wanted if not 0 <= i < len(tasks))
    if bad:
        raise InputError(f"--tasks: no task {bad} (the model has {len(tasks)} tasks)")
    return [t for t in tasks if t.index in wanted]
