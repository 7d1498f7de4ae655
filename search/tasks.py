"""Tuning tasks: the distinct kernels of a model (identical groups, by canonical workload
key, are one task weighted by how often the model runs it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polytile.codegen.configs import lower_config
from polytile.codegen.native import index_limits
from polytile.codegen.target import host
from polytile.frontend import Graph, import_model, optimize, partition
from polytile.frontend.fusion import Group
from polytile.frontend.importer import ModelSource
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.lower.base import LowerConfig, identifier
from polytile.poly.transform.canonical import canonicalize
from polytile.poly.transform.flatten import kernel_of


@dataclass(frozen=True)
class Producer:
    """A kernel that writes one of a task's inputs in the model. The tuner runs a task's
    producers, in model order, before every timed run (`MeasureConfig.cold="producer"`),
    so that its inputs sit in the caches as the model leaves them: written in pieces by
    the producer's threads, some of it in the other core's cache."""

    kernel: Kernel
    #: its tensor the task reads, and the task's tensor that is (same bytes, same dtype)
    output: str
    input: str


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
    #: what writes its inputs in the model, in model order (none for model inputs)
    producers: tuple[Producer, ...] = ()


def extract_tasks(
    model: ModelSource | Graph,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    lowering: LowerConfig | None = None,
) -> list[Task]:
    """The model's distinct kernels as `compile` lowers them: with `lowering`, by default
    this machine's (`codegen.configs.lower_config`)."""
    if lowering is None:
        lowering = lower_config(host())
    graph = model if isinstance(model, Graph) else import_model(model, input_shapes=input_shapes)
    graph = optimize(graph)
    found: dict[str, Task] = {}
    lowered: dict[int, tuple[Kernel, Mapping[str, str]]] = {}
    groups = partition(graph).groups
    writer = {t: g.index for g in groups for t in g.outputs}
    for group in groups:
        lowered[group.index] = canonicalize(kernel_of(graph, group, lowering))
        kernel = lowered[group.index][0]
        key = kernel.workload_key()
        if key in found:
            t = found[key]
            found[key] = Task(t.index, key, t.kernel, t.weight + 1, t.flops, t.kind, t.producers)
        else:
            producers = _producers(graph, group, writer, lowered)
            found[key] = Task(len(found), key, kernel, 1, kernel.flops(), group.kind, producers)
    return list(found.values())


def _producers(
    graph: Graph,
    group: Group,
    writer: Mapping[str, int],
    lowered: Mapping[int, tuple[Kernel, Mapping[str, str]]],
) -> tuple[Producer, ...]:
    """The producers of the group's inputs, in model order: those whose kernels write
    the input whole, in the same bytes and dtype (whatever shape each kernel gives it;
    not a slice of a larger tensor)."""
    kernel, names = lowered[group.index]
    found = []
    for tensor in group.inputs:
        source = graph.aliases.get(tensor, tensor)
        index = writer.get(source)
        if tensor in graph.constants or index is None or index == group.index:
            continue
        producer, producer_names = lowered[index]
        into = kernel.tensors.get(names.get(identifier(tensor), ""))
        out = producer.tensors.get(producer_names.get(identifier(source), ""))
        if into is None or out is None or into.role is not Role.INPUT:
            continue
        if out.role is not Role.OUTPUT or into.dtype != out.dtype:
            continue
        if into.name in index_limits(kernel):  # its values would be the producer's random
            continue  # ones, and a kernel timed alone has no index check before it
        if np.prod(into.shape) == np.prod(out.shape):
            found.append((index, Producer(producer, out.name, into.name)))
    return tuple(p for _, p in sorted(found, key=lambda f: f[0]))


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
