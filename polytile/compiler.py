"""`compile`: an ONNX model → one native module (all kernels + an entry function over a
static memory plan) wrapped in a `CompiledModel`.

The pipeline, one reason per stage:
- import, optimize, partition (frontend): a typed, folded graph of fused groups;
- lower each group to a kernel (poly): exact statements and dependences, canonical names
  so that identical groups share one workload key;
- schedule each workload once (default heuristic: tiled, vectorized, parallel, weights
  packed) and transplant the loops onto identical groups (their own weights packed);
- plan memory: intermediate tensors share one arena by liveness;
- check indices: each index tensor read at run time (Gather, Scatter, ...) is scanned
  once by the entry function before the kernel that reads it (`codegen.module`), so a
  bad index stops the run with an error naming the node instead of reading outside a
  tensor; compile-time index tensors are checked here;
- emit one LLVM function per distinct schedule (identical groups share code, their
  constants are arguments) and the entry function; optimize and JIT it.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polytile.codegen.jit import JitModule, compile_parts, finalize
from polytile.codegen.module import (
    IndexCheck,
    KernelCall,
    Slot,
    add_entry,
    kernel_module,
    new_module,
)
from polytile.codegen.plan import Lifetime, plan_memory
from polytile.codegen.target import Target, host
from polytile.errors import CodegenError, IllegalSchedule, InputError
from polytile.frontend import Graph, import_model, partition
from polytile.frontend import optimize as optimize_graph
from polytile.frontend.fusion import Group
from polytile.frontend.importer import ModelSource
from polytile.frontend.ops import InferContext
from polytile.frontend.ops.indexing import (
    IndexBound,
    bounds_of,
    first_out_of_range,
    out_of_range_message,
)
from polytile.poly.ast.build import AstNode
from polytile.poly.ast.check import verify_ast
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.ir.deps import may_share
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.lower.base import LowerConfig
from polytile.poly.transform.canonical import canonicalize, transplant
from polytile.poly.transform.flatten import kernel_of
from polytile.poly.transform.steps import replay

from .runtime import CompiledModel, IOSpec, Manifest, OutputCopy

ENTRY = "polytile_run"
PLACEHOLDER = "polytile_kernel"


@dataclass
class CompileStats:
    """Where compile time went, in seconds, and what was built."""

    frontend: float = 0.0
    lower: float = 0.0
    schedule: float = 0.0
    llvm: float = 0.0
    kernels: int = 0
    functions: int = 0
    arena_bytes: int = 0
    unshared_bytes: int = 0

    @property
    def total(self) -> float:
        return self.frontend + self.lower + self.schedule + self.llvm


def compile(
    model: ModelSource | Graph,
    records: object = None,
    opt_level: int = 3,
    num_threads: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    target: Target | None = None,
    progress: Callable[[int, int], None] | None = None,
    lowering: LowerConfig | None = None,
) -> CompiledModel:
    """Compile an ONNX model (path, bytes, ModelProto or an imported Graph) for this CPU.

    `num_threads` defaults to the machine's cores; `opt_level` is LLVM's (0-3);
    `lowering` chooses between compute definitions (Winograd convs or direct ones; the
    target's `lower_config` by default), and tuning records apply to the kernels of the
    default choice.
    """
    stats = CompileStats()
    start = time.perf_counter()
    graph = model if isinstance(model, Graph) else import_model(model, input_shapes=input_shapes)
    graph = optimize_graph(graph)
    parts = partition(graph)
    stats.frontend = time.perf_counter() - start
    target = target or host(num_threads, opt_level)
    config = default_config(target)
    lowering = lowering or lower_config(target)
    tuned = tuned_records(records, target)
    schedules: list[Schedule] = []
    workloads: list[str] = []
    by_workload: dict[str, Schedule] = {}
    asts: list[AstNode | None] = []
    for done, group in enumerate(parts.groups):
        t0 = time.perf_counter()
        kernel, _ = canonicalize(kernel_of(graph, group, lowering))
        t1 = time.perf_counter()
        key = kernel.workload_key()
        workloads.append(key)
        if key in by_workload:  # an identical group: same loops, its own weights
            schedules.append(transplant(by_workload[key], kernel))
            asts.append(None)
        else:
            chosen = replay_record(kernel, tuned.get(key)) or default_schedule(kernel, config)
            by_workload[key], ast = _verified(chosen)
            schedules.append(by_workload[key])
            asts.append(ast)
        stats.lower += t1 - t0
        stats.schedule += time.perf_counter() - t1
        if progress is not None:
            progress(done + 1, len(parts.groups))
    checks = index_bounds(graph, parts.groups)
    return build(graph, schedules, workloads, target, stats, asts=asts, checks=checks)


#: an index input to check at run time: (the step of the kernel reading it, the node's
#: label, the index tensor, its bound)
PendingCheck = tuple[int, str, str, IndexBound]


def index_bounds(graph: Graph, groups: Sequence[Group]) -> list[PendingCheck]:
    """The index inputs of the graph's indexing nodes that are known only at run time,
    with the step of the group that reads them; compile-time ones (constants, some
    folded only by the optimization passes) are checked now, a ShapeError naming the
    node and the value."""
    step_of = {name: g.index for g in groups for name in g.nodes}
    found = []
    for node in graph.nodes:
        if node.name not in step_of:
            continue
        ctx = InferContext(
            node,
            [graph.types.get(i) if i else None for i in node.inputs],
            [graph.constants.get(i) if i else None for i in node.inputs],
            graph.opset,
            graph.name,
        )
        for bound in bounds_of(ctx):
            tensor = node.inputs[bound.input]
            value = graph.constants.get(graph.aliases.get(tensor, tensor))
            if value is None:
                found.append((step_of[node.name], node.label, tensor, bound))
                continue
            bad = first_out_of_range(value, bound.sizes)
            if bad is not None:
                shape = graph.types[tensor].shape
                raise ctx.error(out_of_range_message(tensor, shape, bound, *bad))
    return found


def default_config(target: Target) -> DefaultConfig:
    """The default schedules' settings for a target: its vector width, threads and L2."""
    return DefaultConfig(
        vector_width=target.lanes("float32"),
        threads=target.num_threads,
        cache_bytes=target.l2_bytes,
    )


def lower_config(target: Target) -> LowerConfig:
    """The compute definitions for a target: Winograd convs only with at least 32 vectors
    of channels in and out. Its transforms move every input and output pixel through
    memory again while its matrix product saves work per channel pair, and the wider the
    vectors the faster the direct conv already is: on a 2-vCPU Intel AVX-512 host,
    against the direct conv in the same run (`benchmarks/conv_bench.py`: ResNet-50's and
    VGG-19's shapes), 64, 128, 256 and 512 channels took 1.79-1.91, 1.32-1.52, 1.03-1.04
    and 0.82-0.85x its time with 16 lanes (two runs) and 1.23-1.38, 1.16, 0.80 and 0.76x
    with AVX2's 8 (`--avx2`)."""
    return LowerConfig(winograd_channels=32 * target.lanes("float32"))


def tuned_records(records: object, target: Target) -> dict[str, Any]:
    """The best verified record per workload for this target (none without records)."""
    if records is None:
        return {}
    from polytile.search.records import RecordFile, best_records

    if isinstance(records, str | os.PathLike):
        if not Path(records).is_file():
            raise InputError(f"records file '{records}' does not exist")
        return best_records(RecordFile(records), target.key())
    if isinstance(records, RecordFile):
        return best_records(records, target.key())
    return best_records(list(records), target.key())  # type: ignore[call-overload]


def _verified(schedule: Schedule) -> tuple[Schedule, AstNode]:
    """The schedule and its AST if the AST runs every instance exactly once, else (an isl
    AST-generation bug; see `poly.ast_check`) the kernel's initial schedule and its."""
    try:
        return schedule, verify_ast(schedule)
    except IllegalSchedule as err:
        warnings.warn(f"{err}; using the kernel's initial schedule instead", stacklevel=3)
        fallback = initial_schedule(schedule.kernel)
        return fallback, verify_ast(fallback)


def replay_record(kernel: Kernel, record: Any) -> Schedule | None:
    """The record's schedule replayed on the kernel (legality checked again), or None."""
    if record is None:
        return None
    try:
        return replay(kernel, record.trace)
    except IllegalSchedule as err:
        warnings.warn(
            f"kernel {kernel.name}: a tuning record no longer applies ({err})", stacklevel=3
        )
        return None


def build(
    graph: Graph,
    schedules: Sequence[Schedule],
    workloads: Sequence[str],
    target: Target,
    stats: CompileStats | None = None,
    workers: int | None = None,
    asts: Sequence[AstNode | None] | None = None,
    checks: Sequence[PendingCheck] = (),
) -> CompiledModel:
    """The native module of a graph whose groups (in order) run the given schedules;
    `workloads` are the groups' workload keys (a trace that inlines rewrites its
    schedule's kernel, so the key cannot be taken from the schedule). Every schedule's
    AST is checked already; `asts` holds those at hand (None where not), which codegen
    then need not build again. `checks` are the run-time index tensors to check before
    the steps that read them (`index_bounds`)."""
    stats = stats or CompileStats()
    start = time.perf_counter()
    layout = _Layout(graph)
    prefix = f"pt{hashlib.sha256(graph.name.encode()).hexdigest()[:8]}"
    functions: dict[str, str] = {}
    arity: dict[str, int] = {}
    texts: list[str] = []
    calls: list[KernelCall] = []
    emitted: dict[tuple[str, str], str] = {}
    for step, schedule in enumerate(schedules):
        # identical code is compiled once: groups differing only in tensor names or
        # constant values share a function (their constants are arguments). The same
        # workload under the same trace is the same code without emitting it again.
        known = (schedule.kernel.workload_key(), schedule.trace_hash())
        if known in emitted:
            key = emitted[known]
        else:
            ast = asts[step] if asts is not None else None
            mc, fn = kernel_module(schedule, PLACEHOLDER, target, verify=False, ast=ast)
            text = finalize(mc.module, target)
            key = emitted[known] = hashlib.sha256(text.encode()).hexdigest()
            if key not in functions:
                name = f"{prefix}_k{len(functions)}_{_short(schedule.kernel)}"
                functions[key] = name
                arity[name] = len(fn.params)
                texts.append(text.replace(f'@"{PLACEHOLDER}"', f'@"{name}"'))
        kernel = schedule.kernel
        args = tuple(layout.slot(step, t.name, kernel) for t in kernel.tensors.values())
        calls.append(KernelCall(functions[key], args, workloads[step]))
    plan = plan_memory(layout.lifetimes, layout.in_place(schedules))
    calls = [
        KernelCall(c.function, tuple(_placed(s, layout, plan.offsets) for s in c.args), c.workload)
        for c in calls
    ]
    # one scan per index tensor and step when several nodes there index alike with it
    found = {}
    for c in checks:
        guard = layout.check(c, plan.offsets)
        found.setdefault((guard.step, guard.slot, guard.sizes), guard)
    guards = tuple(found.values())
    entry = new_module(graph.name, target)
    add_entry(entry, ENTRY, calls, arity, [c.nbytes for c in layout.constants], guards)
    parts = compile_parts([finalize(entry.module, target), *texts], target, workers)
    jit = JitModule(parts, target)
    stats.llvm = time.perf_counter() - start
    stats.kernels = len(schedules)
    stats.functions = len(functions)
    stats.arena_bytes = plan.arena_bytes
    stats.unshared_bytes = plan.unshared_bytes
    manifest = Manifest(
        name=graph.name,
        inputs=tuple(IOSpec(n, graph.types[n].dtype, graph.types[n].shape) for n in graph.inputs),
        outputs=tuple(IOSpec(n, graph.types[n].dtype, graph.types[n].shape) for n in graph.outputs),
        entry=ENTRY,
        arena_bytes=plan.arena_bytes,
        copies=layout.copies(),
        target=target.key(),
        calls=tuple(calls),
        checks=guards,
    )
    return CompiledModel(manifest, layout.constants, jit, parts, target, stats)


def _short(kernel: Kernel) -> str:
    return kernel.name.rsplit("_", 1)[-1][:24]


def _placed(slot: Slot, layout: _Layout, offsets: Mapping[str, int]) -> Slot:
    if slot.kind == "arena":
        return Slot("arena", offsets[layout.arena_names[slot.index]])
    return slot


class _Layout:
    """Where each tensor of the model lives: caller tables, constants or the arena."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.inputs = {n: i for i, n in enumerate(graph.inputs)}
        self.outputs: dict[str, int] = {}
        for i, n in enumerate(graph.outputs):
            self.outputs.setdefault(n, i)
        self.constants: list[np.ndarray] = []
        self.arena_names: list[str] = []
        self.arena_index: dict[str, int] = {}
        self.lifetimes: dict[str, Lifetime] = {}
        #: per step, the arena name of each kernel input and output there
        self.held: dict[int, dict[str, str]] = {}

    def source(self, onnx_name: str) -> str:
        return self.graph.aliases.get(onnx_name, onnx_name)

    def _arena(self, name: str, nbytes: int, step: int) -> Slot:
        if name not in self.arena_index:
            self.arena_index[name] = len(self.arena_names)
            self.arena_names.append(name)
            self.lifetimes[name] = Lifetime(nbytes, step, step)
        life = self.lifetimes[name]
        self.lifetimes[name] = Lifetime(
            max(life.size, nbytes), min(life.first, step), max(life.last, step)
        )
        return Slot("arena", self.arena_index[name])

    def slot(self, step: int, tensor: str, kernel: Kernel) -> Slot:
        t = kernel.tensors[tensor]
        nbytes = int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
        if t.role is Role.CONSTANT:
            assert t.value is not None
            self.constants.append(np.ascontiguousarray(np.asarray(t.value, dtype=t.dtype)))
            return Slot("constant", len(self.constants) - 1)
        if t.role is Role.TEMP:
            return self._arena(f"{kernel.name}/{step}/{tensor}", nbytes, step)
        source = self.source(t.source)
        if source in self.inputs:
            return Slot("input", self.inputs[source])
        if source in self.outputs:
            return Slot("output", self.outputs[source])
        source_type = self.graph.types[source]
        self.held.setdefault(step, {})[tensor] = source
        return self._arena(source, source_type.nbytes, step)

    def check(self, pending: PendingCheck, offsets: Mapping[str, int]) -> IndexCheck:
        """The run-time check of an index tensor, at the slot where it lives."""
        step, label, tensor, bound = pending
        source = self.source(tensor)
        if source in self.inputs:
            slot = Slot("input", self.inputs[source])
        elif source in self.outputs:
            slot = Slot("output", self.outputs[source])
        elif source in self.arena_index:
            slot = Slot("arena", offsets[source])
        else:  # fusion keeps index producers out of their consumer's group
            raise CodegenError(
                f"{label} in model '{self.graph.name}': index input '{tensor}' is computed "
                f"inside its kernel and cannot be checked before it"
            )
        t = self.graph.types[tensor]  # a view's shape: positions as the node sees them
        return IndexCheck(
            step, slot, t.dtype, t.shape, bound.sizes, label, tensor, bound.data, bound.axis
        )

    def in_place(self, schedules: Sequence[Schedule]) -> dict[str, str]:
        """Outputs that take over the bytes of an input read for the last time at their
        step, where the kernel allows it (`may_share`): the first such input of each."""
        shared: dict[str, str] = {}
        for step, schedule in enumerate(schedules):
            held = self.held.get(step, {})
            kernel = schedule.kernel
            holders = Counter(held.values())
            for out in kernel.outputs():
                name = held.get(out.name)
                if name is None or self.lifetimes[name].first != step:
                    continue
                for inp in kernel.inputs():
                    owner = held.get(inp.name)
                    if (
                        owner is not None
                        and holders[owner] == 1
                        and owner not in shared.values()
                        and self.lifetimes[owner].last == step
                        and self.lifetimes[owner].first < step
                        and self.lifetimes[owner].size == self.lifetimes[name].size
                        and may_share(kernel, inp.name, out.name)
                    ):
                        shared[name] = owner
                        break
        return shared

    def copies(self) -> tuple[OutputCopy, ...]:
        """Graph outputs no kernel writes: inputs, constants, repeated outputs."""
        found = []
        for i, name in enumerate(self.graph.outputs):
            first = self.outputs[name]
            if first != i:
                found.append(OutputCopy(i, "output", first))
            elif name in self.inputs:
                found.append(OutputCopy(i, "input", self.inputs[name]))
            elif name in self.graph.constants:
                self.constants.append(np.ascontiguousarray(self.graph.constants[name]))
                found.append(OutputCopy(i, "constant", len(self.constants) - 1))
        return tuple(found)
