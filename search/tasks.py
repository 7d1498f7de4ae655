"""Tuning tasks: the distinct kernels of a model (identical groups, by canonical workload
key, are one task weighted by how often the model runs it). A model with symbolic sizes
gives kernels with parameters (`search.dynamic` tunes them), lowered from the graph that
`polytile.compiler.imported` gives, inside its block (where the sizes' bounds hold)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from polytile.codegen.configs import lower_config
from polytile.codegen.native import index_limits
from polytile.codegen.target import host
from polytile.frontend import Graph, import_model, optimize, partition
from polytile.frontend.fusion import Group
from polytile.frontend.importer import ModelSource
from polytile.frontend.symbolic import Dim, bounds_of
from polytile.frontend.symbolic_graph import derived_sizes
from polytile.poly.default.schedule import representative_sizes
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
    #: what writes its inputs in the model, in model order (none for model inputs, nor
    #: for a kernel with symbolic sizes)
    producers: tuple[Producer, ...] = ()
    #: the bounds of the named sizes its symbolic sizes depend on, (low, high) each, as
    #: the model's import had them
    bounds: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: its derived sizes (isl parameters standing for products of named sizes,
    #: `batch__seq`) and what each stands for
    derived: Mapping[str, Dim] = field(default_factory=dict)
    #: the sizes `compile` makes its default decisions at (`representative_sizes`), of
    #: its parameters and named sizes
    at: Mapping[str, int] = field(default_factory=dict)


def extract_tasks(
    model: ModelSource | Graph,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    lowering: LowerConfig | None = None,
) -> list[Task]:
    """The model's distinct kernels as `compile` lowers them: with `lowering`, by default
    this machine's (`codegen.configs.lower_config`). A model with symbolic sizes is passed
    as the graph `polytile.compiler.imported` gives, from inside its block: its kernels
    keep the sizes as parameters, and their FLOPs are counted at the sizes' lower bounds
    (the tuner counts them again at the sizes it times)."""
    if lowering is None:
        lowering = lower_config(host())
    graph = model if isinstance(model, Graph) else import_model(model, input_shapes=input_shapes)
    graph = optimize(graph)
    found: dict[str, Task] = {}
    lowered: dict[int, tuple[Kernel, Mapping[str, str]]] = {}
    representative = representative_sizes(graph)
    derived = derived_sizes(graph)  # products of sizes that kernels take as parameters
    groups = partition(graph).groups
    writer = {t: g.index for g in groups for t in g.outputs}
    for group in groups:
        lowered[group.index] = canonicalize(kernel_of(graph, group, lowering))
        kernel = lowered[group.index][0]
        key = kernel.workload_key()
        if key in found:
            found[key] = replace(found[key], weight=found[key].weight + 1)
        elif kernel.params:
            mine = {p: derived[p] for p in kernel.params if p in derived}
            named = {p for p in kernel.params if p not in mine}
            named.update(n for d in mine.values() for n in d.params)
            bounds = {p: bounds_of(p) for p in sorted(named)}
            low = {p: lo for p, (lo, _) in bounds.items()}  # counting points enumerates them
            flops = kernel.at(low | {p: d.evaluate(low) for p, d in mine.items()}).flops()
            at = {p: representative[p] for p in (*kernel.params, *bounds) if p in representative}
            task = Task(len(found), key, kernel, 1, flops, group.kind, (), bounds, mine, at)
            found[key] = task
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
        if into is None or out is None or into.role is not Role.INPUT or producer.params:
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
