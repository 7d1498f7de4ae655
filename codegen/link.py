"""Linking a model's scheduled kernels into one native module, and where each tensor lives.

- Functions (`functions`): one LLVM function per distinct code. Every kernel is emitted
  under one placeholder name, so identical code gives identical IR text: groups that
  differ only in tensor names or constant values (their constants are arguments) share
  the function of the text they hash to. Each distinct function then gets a name unique
  in the model (its symbol must not clash with another model's in this process).
- Layout (`layout`): each kernel argument resolved to a slot: the caller's input or output
  table, the constants table, or an offset in one arena that intermediate tensors share
  by liveness (`plan`), an output taking over the bytes of an input read for the last
  time at its step where the kernel allows it. Graph outputs no kernel writes are copies;
  run-time index checks read their tensor at its slot.
- `link`: both, plus the entry function that runs the calls in order (`module.add_entry`),
  compiled to machine code in parallel parts.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from polytile.errors import CodegenError, PolytileError
from polytile.frontend import Graph
from polytile.frontend.fusion import Group
from polytile.frontend.ops import InferContext
from polytile.frontend.ops.indexing import (
    IndexBound,
    bounds_of,
    first_out_of_range,
    out_of_range_message,
)
from polytile.frontend.symbolic import Dim, shape_texts
from polytile.frontend.symbolic import bounds_of as size_bounds
from polytile.frontend.symbolic_graph import derived_sizes
from polytile.poly.ast.build import AstNode
from polytile.poly.ir.deps import may_share
from polytile.poly.ir.kernel import Extent, Kernel, Role
from polytile.poly.ir.schedule import Schedule
from polytile.poly.lower.base import extent

from . import cache
from .dynamic import SPECIAL_ENTRIES, ArenaTensor, DynamicPlan
from .dynamic_plan import plan_module
from .jit import Part, compile_parts, finalize, forked_map
from .module import IndexCheck, KernelCall, Slot, add_entry, kernel_module, new_module
from .plan import Lifetime, plan_memory
from .special import Specialized, specialized, trampoline_module
from .target import Target, with_hints

#: the entry function of a linked model
ENTRY = "polytile_run"
#: the name every kernel function is emitted under before it gets its own
PLACEHOLDER = "polytile_kernel"


@dataclass(frozen=True)
class OutputCopy:
    """Output `index` is a copy of an input, a constant or an earlier output."""

    index: int
    kind: str
    source: int


@dataclass(frozen=True)
class PendingCheck:
    """An index tensor known only at run time, checked before `step` (the kernel reading
    it) against `bound`; `node` labels the indexing node for the error message."""

    step: int
    node: str
    tensor: str
    bound: IndexBound


@dataclass(frozen=True)
class Functions:
    """The distinct kernel functions of a model: for each step the name of the function it
    calls; each function's IR text (in order of first use) and argument count."""

    names: tuple[str, ...]
    texts: tuple[str, ...]
    arity: Mapping[str, int]
    #: step → why its symbolic kernel's code was refused (`codegen.special`; its name '')
    refused: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """Where every tensor of the model lives: the kernel calls in order with their
    arguments' slots (arena slots as byte offsets), the constants table, the outputs that
    are copies, the run-time index checks and the arena's size."""

    calls: tuple[KernelCall, ...]
    constants: tuple[np.ndarray, ...]
    copies: tuple[OutputCopy, ...]
    checks: tuple[IndexCheck, ...]
    arena_bytes: int
    #: bytes the arena's tensors would take without sharing
    unshared_bytes: int
    #: for a model compiled for all sizes: its sizes and arena, planned per run (its
    #: arena slots are `dynamic`, `arena_bytes` is 0)
    dynamic: DynamicPlan | None = None


@dataclass(frozen=True)
class Linked:
    """A linked model: its layout, its machine code in parts (the entry module first),
    how many distinct kernel functions it has and the entry function's name."""

    layout: Layout
    parts: tuple[Part, ...]
    functions: int
    entry: str = ENTRY
    #: the kernels compiled per size, in step order (`codegen.special`)
    specials: tuple[Specialized, ...] = ()


def link(
    graph: Graph,
    schedules: Sequence[Schedule | Specialized],
    workloads: Sequence[str],
    target: Target,
    asts: Sequence[AstNode | None] | None = None,
    checks: Sequence[PendingCheck] = (),
    workers: int | None = None,
    groups: Sequence[Group] | None = None,
) -> Linked:
    """The native module of a graph whose groups (in order) run the given schedules;
    `workloads` are the groups' workload keys (a trace that inlines rewrites its
    schedule's kernel, so the key cannot be taken from the schedule). Every schedule's
    AST is checked already; `asts` holds those at hand (None where not), which need not
    be built again. `checks` are the run-time index tensors (`index_bounds`).

    In a model compiled for all sizes, a step may be `Specialized` (compiled per size
    at run time, called through a trampoline); with the graph's `groups`, a symbolic
    kernel whose code is refused becomes one too."""
    prefix = f"pt{hashlib.sha256(graph.name.encode()).hexdigest()[:8]}"
    emitted = functions(schedules, target, prefix, asts, workers)
    steps = list(schedules)
    for step, reason in emitted.refused.items():
        if groups is None:
            raise CodegenError(reason)
        steps[step] = specialized(graph, groups[step], reason)
    specials = [s for s in steps if isinstance(s, Specialized)]
    names = list(emitted.names)
    arity = dict(emitted.arity)
    for number, special in enumerate(specials):
        names[special.step] = f"{prefix}_s{number}_step{special.step}"
        arity[names[special.step]] = len(special.inputs) + len(special.outputs)
    placed = layout(graph, steps, names, workloads, checks)
    entry = new_module(graph.name, target)
    constant_bytes = [c.nbytes for c in placed.constants]
    add_entry(
        entry,
        ENTRY,
        placed.calls,
        arity,
        constant_bytes,
        placed.checks,
        dynamic=placed.dynamic is not None,
    )
    texts = [finalize(entry.module, target), *emitted.texts]
    if specials:
        counts = [(len(s.inputs), len(s.outputs)) for s in specials]
        module = trampoline_module(f"{prefix}_specials", [names[s.step] for s in specials], counts)
        texts.append(finalize(module, target))
    parts = compile_parts(texts, target, workers)
    if placed.dynamic is not None:  # the memory plan per call, native (`dynamic_plan`):
        # straight-line integer code that runs in microseconds unoptimized, so LLVM's
        # pipeline is skipped (it cost more compile time than it saves in calls)
        ins, outs = (
            [shape_texts(graph.types[n].shape) for n in tensors]
            for tensors in (graph.inputs, graph.outputs)
        )
        planner = finalize(plan_module(placed.dynamic, ins, outs), target)
        parts += compile_parts([planner], replace(target, opt_level=0), 1)
    return Linked(placed, tuple(parts), len(emitted.texts), specials=tuple(specials))


#: distinct kernels below which emitting them serially beats forking workers
PARALLEL_EMIT = 8


def functions(
    schedules: Sequence[Schedule | Specialized],
    target: Target,
    prefix: str,
    asts: Sequence[AstNode | None] | None = None,
    workers: int | None = None,
) -> Functions:
    """Each schedule's kernel function, emitted once per distinct IR text and named
    `<prefix>_k<n>_<kernel>`, each with its schedule's codegen hints over the target's
    defaults. The same workload under the same trace is the same code, taken without
    emitting it again. A symbolic kernel whose code is refused is named '' and listed
    in `refused`; `Specialized` steps are named '' too."""
    keys = {
        step: (s.kernel.workload_key(), s.trace_hash())
        for step, s in enumerate(schedules)
        if isinstance(s, Schedule)
    }
    first_of: dict[tuple[str, str], int] = {}
    for step, key in keys.items():
        first_of.setdefault(key, step)
    first = list(first_of.values())  # each distinct key's first step, in order
    memo_keys = [(*keys[step], repr(with_hints(target, schedules[step].hints))) for step in first]  # type: ignore[union-attr]
    missing = [job for job, key in enumerate(memo_keys) if cache.EMITTED.get(key) is None]

    def emit(job: int) -> tuple[str, int] | str:
        step = first[missing[job]]
        schedule = schedules[step]
        assert isinstance(schedule, Schedule)
        ast = asts[step] if asts is not None else None
        hinted = with_hints(target, schedule.hints)
        try:
            mc, fn = kernel_module(schedule, PLACEHOLDER, hinted, verify=False, ast=ast)
        except PolytileError as err:
            if not schedule.kernel.params:
                raise
            return f"its code cannot stay symbolic: {err}"
        return finalize(mc.module, hinted), len(fn.params)

    # Python builds the IR: forked workers emit the kernels side by side
    workers = 1 if len(missing) < PARALLEL_EMIT else workers
    refused_keys: dict[tuple[str, str], str] = {}
    for job, found in zip(missing, forked_map(emit, len(missing), workers), strict=True):
        if isinstance(found, str):
            refused_keys[keys[first[job]]] = found
        else:
            cache.EMITTED.put(memo_keys[job], found)
    by_text: dict[str, str] = {}  # IR text's hash -> function name
    known: dict[tuple[str, str], str] = {}  # (workload, trace) -> function name
    texts: list[str] = []
    arity: dict[str, int] = {}
    for step, memo in zip(first, memo_keys, strict=True):
        if keys[step] in refused_keys:
            known[keys[step]] = ""
            continue
        text, params = cache.EMITTED.get(memo)  # type: ignore[misc]
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in by_text:
            name = f"{prefix}_k{len(by_text)}_{_short(schedules[step].kernel)}"  # type: ignore[union-attr]
            by_text[digest] = name
            arity[name] = params
            texts.append(_renamed(text, name))
        known[keys[step]] = by_text[digest]
    names = tuple(known[keys[step]] if step in keys else "" for step in range(len(schedules)))
    refused = {step: refused_keys[key] for step, key in keys.items() if key in refused_keys}
    return Functions(names, tuple(texts), arity, refused)


def _short(kernel: Kernel) -> str:
    return kernel.name.rsplit("_", 1)[-1][:24]


def _renamed(text: str, name: str) -> str:
    """A kernel module's IR text with its function, emitted as `PLACEHOLDER`, named
    `name`. The symbol occurs exactly once, where the function is defined (nothing in its
    own module calls the kernel); anything else is an emitter bug, not renamed blindly."""
    symbol = f'@"{PLACEHOLDER}"'
    found = text.count(symbol)
    if found != 1:
        raise CodegenError(
            f"kernel function {name}: its IR names {symbol} {found} times instead of once"
        )
    return text.replace(symbol, f'@"{name}"')


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
                found.append(PendingCheck(step_of[node.name], node.label, tensor, bound))
                continue
            bad = first_out_of_range(value, bound.sizes)
            if bad is not None:
                shape = graph.types[tensor].shape
                raise ctx.error(out_of_range_message(tensor, shape, bound, *bad))
    return found


def layout(
    graph: Graph,
    schedules: Sequence[Schedule | Specialized],
    names: Sequence[str],
    workloads: Sequence[str],
    checks: Sequence[PendingCheck] = (),
) -> Layout:
    """Where the tensors of the graph's kernels live when step i calls the function
    `names[i]` on `schedules[i]`'s kernel (see the module's docstring); a `Specialized`
    step's arguments are its group's inputs, then its outputs."""
    specials = [s for s in schedules if isinstance(s, Specialized)]
    places = _Places(
        graph,
        bool(specials) or any(s.kernel.params for s in schedules),  # type: ignore[union-attr]
    )
    args = [
        tuple(places.tensor_slot(step, n) for n in (*s.inputs, *s.outputs))
        if isinstance(s, Specialized)
        else tuple(places.slot(step, t.name, s.kernel) for t in s.kernel.tensors.values())
        for step, s in enumerate(schedules)
    ]
    shared = places.in_place(schedules)
    if places.dynamic:
        return _dynamic_layout(graph, schedules, names, workloads, checks, places, args, shared)
    plan = plan_memory(places.lifetimes, shared)

    def placed(slot: Slot) -> Slot:
        if slot.kind == "arena":
            return Slot("arena", plan.offsets[places.arena_names[slot.index]])
        return slot

    calls = tuple(
        KernelCall(function, tuple(placed(s) for s in slots), workload)
        for function, slots, workload in zip(names, args, workloads, strict=True)
    )
    # one scan per index tensor and step when several nodes there index alike with it
    found: dict[tuple[int, Slot, tuple[int, ...]], IndexCheck] = {}
    for c in checks:
        guard = places.check(c, lambda name: Slot("arena", plan.offsets[name]))
        found.setdefault((guard.step, guard.slot, guard.sizes), guard)
    copies = places.copies()
    return Layout(
        calls,
        tuple(places.constants),
        copies,
        tuple(found.values()),
        plan.arena_bytes,
        plan.unshared_bytes,
    )


def _dynamic_layout(
    graph: Graph,
    schedules: Sequence[Schedule | Specialized],
    names: Sequence[str],
    workloads: Sequence[str],
    checks: Sequence[PendingCheck],
    places: _Places,
    args: Sequence[tuple[Slot, ...]],
    shared: Mapping[str, str],
) -> Layout:
    """`layout` for kernels with symbolic sizes: arena offsets and sizes come from the
    entry's dynamic table, which `codegen.dynamic` fills per run."""
    named, derived = symbolic_sizes(graph)
    counted = tuple(
        (tuple(extent(d) for d in graph.types[c.tensor].shape), tuple(map(extent, c.bound.sizes)))
        for c in checks
    )
    plan = DynamicPlan(
        named,
        derived,
        tuple(
            ArenaTensor(name, *places.shapes[name], life.first, life.last)
            for name, life in ((n, places.lifetimes[n]) for n in places.arena_names)
        ),
        shared,
        counted,
        {n: size_bounds(n) for n in named},
        sum(isinstance(s, Specialized) for s in schedules),
    )

    def arena(name: str) -> Slot:
        return Slot("dynamic", len(plan.sizes) + places.arena_index[name])

    entry = len(plan.sizes) + len(plan.arena)  # each check's count, then its bounds
    guards = []
    for c, (_, sizes) in zip(checks, counted, strict=True):
        guards.append(places.check(c, arena, entry))
        entry += 1 + len(sizes)
    position = {name: i for i, name in enumerate(plan.sizes)}
    kernels = [s.kernel for s in schedules if isinstance(s, Schedule)]
    missing = sorted({p for k in kernels for p in k.params} - set(position))
    if missing:
        raise CodegenError(
            f"model '{graph.name}': kernels use sizes {missing} that its inputs do not give"
        )

    def placed(slot: Slot) -> Slot:
        return Slot("dynamic", len(plan.sizes) + slot.index) if slot.kind == "arena" else slot

    specials = [s.step for s in schedules if isinstance(s, Specialized)]
    special_number = {step: number for number, step in enumerate(specials)}

    def sizes(step: int, schedule: Schedule | Specialized) -> tuple[int, ...]:
        """The table entries a call takes: its kernel's sizes, or a specialized
        kernel's function, constants and arena (`codegen.special`)."""
        if isinstance(schedule, Specialized):
            first = plan.special_entry(special_number[step])
            return tuple(range(first, first + SPECIAL_ENTRIES))
        return tuple(position[p] for p in schedule.kernel.params)

    calls = tuple(
        KernelCall(function, tuple(placed(s) for s in slots), workload, sizes(step, schedule))
        for step, (function, slots, workload, schedule) in enumerate(
            zip(names, args, workloads, schedules, strict=True)
        )
    )
    copies = places.copies()
    return Layout(calls, tuple(places.constants), copies, tuple(guards), 0, 0, plan)


def symbolic_sizes(graph: Graph) -> tuple[tuple[str, ...], dict[str, str]]:
    """The named sizes of a graph's input shapes (in order of appearance) and the derived
    sizes its tensors' isl forms use (each a product of sizes, as `Dim` text)."""
    named: dict[str, None] = {}
    for name in graph.inputs:
        for d in graph.types[name].shape:
            if isinstance(d, Dim):
                named.update(dict.fromkeys(sorted(d.params)))
    return tuple(named), {k: str(v) for k, v in derived_sizes(graph).items()}


class _Places:
    """`layout`'s bookkeeping as the kernels' tensors are met: caller tables, constants
    and arena tensors with their lifetimes. With symbolic sizes (`dynamic`), an arena
    tensor's size is its element size and shape (`shapes`), and its lifetime's `size`
    a number standing for that pair (equal pairs, equal numbers: what sharing compares)."""

    def __init__(self, graph: Graph, dynamic: bool = False) -> None:
        self.graph = graph
        self.dynamic = dynamic
        self.shapes: dict[str, tuple[int, tuple[Extent, ...]]] = {}
        self._sizes: dict[tuple[int, tuple[Extent, ...]], int] = {}
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

    def _symbolic(self, name: str, itemsize: int, shape: tuple[Extent, ...]) -> int:
        """The stand-in size of a tensor of symbolic shape (see the class)."""
        key = (itemsize, shape)
        self.shapes.setdefault(name, key)
        return self._sizes.setdefault(key, len(self._sizes) + 1)

    def slot(self, step: int, tensor: str, kernel: Kernel) -> Slot:
        """The slot of a kernel's tensor at `step` (arena slots by arena name's index)."""
        t = kernel.tensors[tensor]
        itemsize = np.dtype(t.dtype).itemsize
        if self.dynamic and t.role is Role.TEMP:
            name = f"{kernel.name}/{step}/{tensor}"
            return self._arena(name, self._symbolic(name, itemsize, t.shape), step)
        if self.dynamic and t.role is not Role.CONSTANT:
            source = self.source(t.source)
            if source not in self.inputs and source not in self.outputs:
                self.held.setdefault(step, {})[tensor] = source
                shape = tuple(extent(d) for d in self.graph.types[source].shape)
                return self._arena(source, self._symbolic(source, itemsize, shape), step)
        if t.role is Role.CONSTANT:
            assert t.value is not None
            self.constants.append(np.ascontiguousarray(np.asarray(t.value, dtype=t.dtype)))
            return Slot("constant", len(self.constants) - 1)
        if t.role is Role.TEMP:
            nbytes = int(np.prod(t.shape, dtype=np.int64)) * itemsize
            return self._arena(f"{kernel.name}/{step}/{tensor}", nbytes, step)
        source = self.source(t.source)
        if source in self.inputs:
            return Slot("input", self.inputs[source])
        if source in self.outputs:
            return Slot("output", self.outputs[source])
        source_type = self.graph.types[source]
        self.held.setdefault(step, {})[tensor] = source
        return self._arena(source, source_type.nbytes, step)

    def tensor_slot(self, step: int, tensor: str) -> Slot:
        """The slot of a graph tensor a specialized kernel reads or writes at `step`."""
        source = self.source(tensor)
        if source in self.inputs:
            return Slot("input", self.inputs[source])
        if source in self.outputs:
            return Slot("output", self.outputs[source])
        t = self.graph.types[source]
        itemsize = np.dtype(t.dtype).itemsize
        shape = tuple(extent(d) for d in t.shape)
        return self._arena(source, self._symbolic(source, itemsize, shape), step)

    def check(
        self, pending: PendingCheck, arena: Callable[[str], Slot], count_entry: int = -1
    ) -> IndexCheck:
        """The run-time check of an index tensor, at the slot where it lives (`arena`:
        an arena tensor's); `count_entry`: the dynamic table's entry of its count."""
        source = self.source(pending.tensor)
        if source in self.inputs:
            slot = Slot("input", self.inputs[source])
        elif source in self.outputs:
            slot = Slot("output", self.outputs[source])
        elif source in self.arena_index:
            slot = arena(source)
        else:  # fusion keeps index producers out of their consumer's group
            raise CodegenError(
                f"{pending.node} in model '{self.graph.name}': index input '{pending.tensor}' "
                f"is computed inside its kernel and cannot be checked before it"
            )
        t = self.graph.types[pending.tensor]  # a view's shape: positions as the node sees them
        bound = pending.bound
        shape, sizes = tuple(map(extent, t.shape)), tuple(map(extent, bound.sizes))
        return IndexCheck(
            pending.step, slot, t.dtype, shape, sizes, pending.node, pending.tensor,
            bound.data, bound.axis, count_entry,
        )  # fmt: skip

    def in_place(self, schedules: Sequence[Schedule | Specialized]) -> dict[str, str]:
        """Outputs that take over the bytes of an input read for the last time at their
        step, where the kernel allows it (`may_share`): the first such input of each
        (none for a kernel compiled per size)."""
        shared: dict[str, str] = {}
        for step, schedule in enumerate(schedules):
            if isinstance(schedule, Specialized):
                continue
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
        """Graph outputs no kernel writes: inputs, constants, repeated outputs (a constant
        output joins the constants table after the kernels' constants)."""
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
