"""`compile`: an ONNX model → a `CompiledModel`, one native module of all its kernels.

The pipeline, one reason per stage:
- import, optimize, partition (frontend): a typed, folded graph of fused groups;
- lower each group to a kernel (poly): exact statements and dependences, canonical names
  so that identical groups share one workload key;
- schedule each workload once (its best tuning record for this target, else the default
  heuristic: tiled, vectorized, parallel, weights packed), distinct workloads on forked
  workers side by side, and transplant the loops onto identical groups (their own
  weights packed); each schedule's AST is checked to run every instance exactly once;
- in a compile for all sizes, a group whose lowering, schedule or code cannot stay
  symbolic (while it lowers at the representative sizes) is compiled per size on first
  use instead (`polytile.special`), the rest of the model staying symbolic;
- check indices (`codegen.link.index_bounds`): compile-time index tensors now, run-time
  ones by the entry function before the kernel that reads them, so that a bad index
  stops the run with an error naming the node instead of reading outside a tensor;
- link (`codegen.link`): one LLVM function per distinct code, the tensors placed in
  caller tables, constants and one arena shared by liveness, the entry function; compile
  the parts to machine code and load them.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import onnx

from polytile.codegen.configs import default_config, lower_config
from polytile.codegen.jit import JitModule, forked_map
from polytile.codegen.link import PendingCheck, index_bounds, link
from polytile.codegen.special import Specialized, specialized
from polytile.codegen.target import Target, host
from polytile.errors import IllegalSchedule, PolytileError
from polytile.frontend import Graph, import_model, partition
from polytile.frontend import optimize as optimize_graph
from polytile.frontend.fusion import Group
from polytile.frontend.importer import ModelSource
from polytile.frontend.loading import load_model
from polytile.frontend.symbolic import Dim, shape_texts
from polytile.frontend.symbolic_graph import at_sizes, compute_graph
from polytile.frontend.symbolic_import import import_symbolic
from polytile.poly.ast.build import AstNode
from polytile.poly.ast.check import verify_ast
from polytile.poly.default.schedule import checked_default, representative_sizes
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.lower.base import LowerConfig
from polytile.poly.transform.canonical import canonicalize, transplant
from polytile.poly.transform.flatten import kernel_of
from polytile.search.records import replay_record, tuned_records

from . import runtime
from .runtime import CompiledModel, IOSpec, Manifest

#: distinct kernels below which scheduling them serially beats forking workers
PARALLEL_SCHEDULE = 8

#: what scheduling one distinct kernel gives: its schedule and checked AST, its schedule
#: moved onto each identical group (`transplant`), and the warnings raised meanwhile
Scheduled = tuple[Schedule, AstNode, list[Schedule], list[tuple[type[Warning], str]]]


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
    dynamic: bool | None = None,
    bounds: Mapping[str, Sequence[int]] | None = None,
) -> CompiledModel:
    """Compile an ONNX model (path, bytes, ModelProto or an imported Graph) for this CPU.

    `num_threads` defaults to the machine's cores; `opt_level` is LLVM's (0-3);
    `lowering` chooses between compute definitions (Winograd convs or direct ones; the
    target's `lower_config` by default), and tuning records apply to the kernels of the
    default choice.

    `dynamic`: compile once for every value of the symbolic input sizes (ONNX
    `dim_param`s, or names in `input_shapes`), within `bounds` (`{"seq": (1, 512)}`):
    the model then runs at any of them without compiling again, but for a kernel that
    cannot stay symbolic, compiled at each of its sizes on first use (`polytile.special`;
    `explain(model)` names them). None (the default) does
    so when an input keeps a symbolic size; False asks for a static compile, which needs
    `input_shapes` with every size.
    """
    start = time.perf_counter()
    if isinstance(model, Graph):
        return _compile(model, start, records, opt_level, num_threads, target, progress, lowering)
    with imported(model, input_shapes, dynamic, bounds) as graph:
        return _compile(graph, start, records, opt_level, num_threads, target, progress, lowering)


@contextlib.contextmanager
def imported(
    model: ModelSource,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    dynamic: bool | None = None,
    bounds: Mapping[str, Sequence[int]] | None = None,
) -> Iterator[Graph]:
    """The graph `compile` works on (`dynamic` and `bounds` as there): imported with
    static shapes, or with symbolic sizes and its shape subgraphs folded away, the block
    then running with the sizes' comparisons decided under the model's bounds."""
    proto, _ = load_model(model)
    if not (dynamic or (dynamic is None and symbolic_inputs(proto, input_shapes))):
        yield import_model(proto, input_shapes=input_shapes)
        return
    symbolic = import_symbolic(proto, input_shapes, bounds)
    with symbolic.assumed():
        yield compute_graph(symbolic.graph, symbolic.values)


def _compile(
    graph: Graph,
    start: float,
    records: object,
    opt_level: int,
    num_threads: int | None,
    target: Target | None,
    progress: Callable[[int, int], None] | None,
    lowering: LowerConfig | None,
) -> CompiledModel:
    """`compile` of an imported graph (`start`: when the import began)."""
    stats = CompileStats()
    graph = optimize_graph(graph)
    parts = partition(graph)
    stats.frontend = time.perf_counter() - start
    target = target or host(num_threads, opt_level)
    config = default_config(target)
    lowering = lowering or lower_config(target)
    tuned = tuned_records(records, target)
    symbolic = is_symbolic(graph)
    sizes = representative_sizes(graph)
    kernels: list[Kernel | None] = []
    refused: dict[int, str] = {}  # step → why its kernel cannot stay symbolic
    for group in parts.groups:
        t0 = time.perf_counter()
        try:
            kernels.append(canonicalize(kernel_of(graph, group, lowering))[0])
        except PolytileError as err:
            if not symbolic:
                raise
            _static_lowering(graph, group, lowering, sizes, err)
            refused[group.index] = f"its lowering cannot stay symbolic: {err}"
            kernels.append(None)
        stats.lower += time.perf_counter() - t0
    t1 = time.perf_counter()
    workloads = [k.workload_key() if k else f"specialized:{s}" for s, k in enumerate(kernels)]
    first: dict[str, int] = {}
    copies: dict[str, list[int]] = {}  # the later groups of each workload
    for step, key in enumerate(workloads):
        if step not in refused and first.setdefault(key, step) != step:
            copies.setdefault(key, []).append(step)
    jobs = list(first.values())

    def schedule_one(job: int) -> Scheduled | str:
        kernel = kernels[jobs[job]]
        assert kernel is not None
        key = workloads[jobs[job]]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                chosen = replay_record(kernel, tuned.get(key))
                if chosen:
                    schedule, ast = _verified(chosen)
                else:  # one AST check for the kernel, not one per fused nest
                    schedule, ast = checked_default(kernel, config, sizes)
            except PolytileError as err:
                if not kernel.params:
                    raise
                return f"its schedule cannot stay symbolic: {err}"
            # identical groups: the same loops on their own weights
            moved = [transplant(schedule, kernels[step]) for step in copies.get(key, ())]  # type: ignore[arg-type]
        return schedule, ast, moved, [(w.category, str(w.message)) for w in caught]

    # scheduling is Python and isl work: forked workers take distinct kernels side by side
    workers = None if len(jobs) >= PARALLEL_SCHEDULE else 1
    scheduled = dict(zip(jobs, forked_map(schedule_one, len(jobs), workers), strict=True))
    found: dict[int, tuple[Schedule, AstNode | None]] = {}
    for step, result in scheduled.items():
        key = workloads[step]
        if isinstance(result, str):  # refused: the group and its copies compile per size
            refused.update((s, result) for s in (step, *copies.get(key, ())))
            continue
        schedule, ast, moved, caught = result
        for category, message in caught:  # the worker's warnings, raised here
            warnings.warn(message, category, stacklevel=2)
        found[step] = (schedule, ast)
        found.update((s, (m, None)) for s, m in zip(copies.get(key, ()), moved, strict=True))
    schedules: list[Schedule | Specialized] = [
        specialized(graph, group, refused[step]) if step in refused else found[step][0]
        for step, group in enumerate(parts.groups)
    ]
    asts = [found[step][1] if step in found else None for step in range(len(kernels))]
    if progress is not None:
        for step in range(len(kernels)):
            progress(step + 1, len(parts.groups))
    stats.schedule += time.perf_counter() - t1
    checks = index_bounds(graph, parts.groups)
    groups = parts.groups if symbolic else None
    return build(graph, schedules, workloads, target, stats, asts=asts, checks=checks,
                 groups=groups)  # fmt: skip


def is_symbolic(graph: Graph) -> bool:
    """Whether a tensor of the graph has a symbolic size (a compile for all sizes)."""
    return any(isinstance(d, Dim) for t in graph.types.values() for d in t.shape)


def _static_lowering(
    graph: Graph, group: Group, lowering: LowerConfig, sizes: Mapping[str, int], err: Exception
) -> None:
    """Raise `err` unless the group lowers at the representative `sizes`: a kernel is
    compiled per size only where its symbolic form is refused, not the op itself."""
    static = at_sizes(group.subgraph(graph), sizes)
    try:
        kernel_of(static, group, lowering)
    except PolytileError:
        raise err from None


def _verified(schedule: Schedule) -> tuple[Schedule, AstNode]:
    """The schedule and its AST if the AST runs every instance exactly once, else (an isl
    AST-generation bug; see `poly.ast.check`) the kernel's initial schedule and its."""
    try:
        return schedule, verify_ast(schedule)
    except IllegalSchedule as err:
        warnings.warn(f"{err}; using the kernel's initial schedule instead", stacklevel=3)
        fallback = initial_schedule(schedule.kernel)
        return fallback, verify_ast(fallback)


def build(
    graph: Graph,
    schedules: Sequence[Schedule | Specialized],
    workloads: Sequence[str],
    target: Target,
    stats: CompileStats | None = None,
    workers: int | None = None,
    asts: Sequence[AstNode | None] | None = None,
    checks: Sequence[PendingCheck] = (),
    groups: Sequence[Group] | None = None,
) -> CompiledModel:
    """The compiled model of a graph whose groups (in order) run the given schedules
    (`codegen.link.link`: `workloads`, `asts`, `checks` and `groups` as there; a
    `Specialized` step is compiled per size on first use, `polytile.special`)."""
    stats = stats or CompileStats()
    start = time.perf_counter()
    linked = link(graph, schedules, workloads, target, asts, checks, workers, groups)
    jit = JitModule(linked.parts, target)
    layout = linked.layout
    stats.llvm = time.perf_counter() - start
    stats.kernels = len(schedules)
    stats.functions = linked.functions
    stats.arena_bytes = layout.arena_bytes
    stats.unshared_bytes = layout.unshared_bytes
    manifest = Manifest(
        name=graph.name,
        inputs=tuple(_spec(graph, n) for n in graph.inputs),
        outputs=tuple(_spec(graph, n) for n in graph.outputs),
        entry=linked.entry,
        arena_bytes=layout.arena_bytes,
        copies=layout.copies,
        target=target.key(),
        calls=layout.calls,
        checks=layout.checks,
        dynamic=layout.dynamic,
        specials=linked.specials,
    )
    sources = [groups[s.step].subgraph(graph) for s in linked.specials] if groups else []
    return CompiledModel(
        manifest, layout.constants, jit, linked.parts, target, stats, sources, compile_static
    )


def compile_static(graph: Graph, target: Target) -> CompiledModel:
    """A kernel compiled per size at its sizes (`polytile.special`): its static graph."""
    return compile(graph, target=target)


def load(path: str | os.PathLike[str], num_threads: int | None = None) -> CompiledModel:
    """`pt.load`: a saved model (`runtime.load`) whose kernels compiled per size compile
    here on first use."""
    return runtime.load(path, num_threads, compile_static)


def _spec(graph: Graph, name: str) -> IOSpec:
    """A graph input's or output's spec, a symbolic size as its `Dim` text."""
    t = graph.types[name]
    return IOSpec(name, t.dtype, shape_texts(t.shape))


def symbolic_inputs(
    model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int | str]] | None
) -> bool:
    """Whether an input of the model keeps a symbolic size: a `dim_param` or an unknown
    size that `input_shapes` does not fix, or a name there."""
    given = dict(input_shapes or {})
    if any(isinstance(d, str) for shape in given.values() for d in shape):
        return True
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers or value.name in given:
            continue
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
            return True
    return False
