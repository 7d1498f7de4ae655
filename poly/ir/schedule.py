"""Schedules: a tree of named loops over a kernel's statements, always convertible to an
isl schedule tree, which decides legality and generates the AST.

A `Loop` maps every statement below it to an isl piecewise affine function of that
statement's dimensions (the loop's value for that instance); the children of a loop (or of
the root) run in sequence. Loops carry names, so that transformations and the researcher
API can refer to them, and an annotation (parallel / vector / unroll) that becomes an isl
mark node. A `Schedule` is the tree plus the trace of steps that produced it from the
kernel's initial schedule (whose `hint` steps give the codegen hints, `HINTS`).
"""

from __future__ import annotations

import copyreg
import hashlib
import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import islpy as isl

from polytile.errors import IllegalSchedule
from polytile.names import unique_name
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.deps import ordering_touching
from polytile.poly.ir.kernel import Kernel, mentions

ANNOTATIONS = ("", "parallel", "vector", "unroll")


def _read_only(items: dict) -> MappingProxyType:
    return MappingProxyType(items)


# the IR's read-only mappings pickle as dicts: schedules travel from forked workers
# (`polytile.compiler` schedules distinct kernels side by side)
copyreg.pickle(MappingProxyType, lambda m: (_read_only, (dict(m),)))

#: the codegen hints a schedule may carry (`poly.transform.steps.hint`) and their JSON
#: types: the machine-dependent prefetch choices of one kernel, named as the fields of
#: `codegen.target.Target` they override. `input_ahead`: reduction steps ahead its input
#: rows are asked for (0: none); `panel_ahead`: whether a stencil's parallel iteration
#: asks for the next one's weight panel; `prefetch_panel`: the largest weight panel (bytes)
#: asked for ahead of the next parallel iteration.
HINTS: Mapping[str, str] = MappingProxyType(
    {"input_ahead": "int", "panel_ahead": "bool", "prefetch_panel": "int"}
)


@dataclass(frozen=True)
class Leaf:
    stmt: str


@dataclass(frozen=True)
class Loop:
    name: str
    #: statement → isl PwAff text `{ S[dims] -> [(value)] }`
    exprs: Mapping[str, str]
    body: tuple[Node, ...]
    annotation: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.exprs, MappingProxyType):
            object.__setattr__(self, "exprs", MappingProxyType(dict(self.exprs)))
        object.__setattr__(self, "body", tuple(self.body))
        if self.annotation not in ANNOTATIONS:
            raise ValueError(f"loop {self.name}: unknown annotation {self.annotation}")


Node = Leaf | Loop


@dataclass(frozen=True)
class Step:
    """One transformation with its parameters: JSON-serialisable and replayable."""

    kind: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "args": dict(self.args)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Step:
        """The step of a JSON object; anything else is an illegal step (the poly layer's
        one legality error), which the search records as such."""
        if not isinstance(data, Mapping) or not isinstance(data.get("kind"), str):
            raise IllegalSchedule(f"a trace step must be an object with a 'kind', got {data!r}")
        args = data.get("args", {})
        if not isinstance(args, Mapping):
            raise IllegalSchedule(f"step '{data['kind']}': 'args' must be an object, got {args!r}")
        return Step(data["kind"], _freeze(args))


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Schedule:
    kernel: Kernel
    body: tuple[Node, ...]
    trace: tuple[Step, ...] = ()

    @property
    def hints(self) -> Mapping[str, Any]:
        """The codegen hints over the target's defaults (`HINTS`) that the trace's `hint`
        steps recorded, a later one over an earlier (read from the trace, which every
        step keeps, so no step can drop them). They never change a value."""
        found: dict[str, Any] = {}
        for step in self.trace:
            if step.kind == "hint":
                found.update(step.args)
        return MappingProxyType(found)

    # --- queries --------------------------------------------------------------------
    def loops(self) -> Iterator[tuple[Loop, tuple[Loop, ...]]]:
        """Every loop with the loops enclosing it (outermost first)."""

        def visit(nodes: tuple[Node, ...], outer: tuple[Loop, ...]) -> Iterator:
            for node in nodes:
                if isinstance(node, Loop):
                    yield node, outer
                    yield from visit(node.body, (*outer, node))

        yield from visit(self.body, ())

    def loop(self, name: str) -> Loop:
        for loop, _ in self.loops():
            if loop.name == name:
                return loop
        raise IllegalSchedule(f"kernel {self.kernel.name}: no loop named '{name}'")

    def enclosing(self, name: str) -> tuple[Loop, ...]:
        for loop, outer in self.loops():
            if loop.name == name:
                return outer
        raise IllegalSchedule(f"kernel {self.kernel.name}: no loop named '{name}'")

    def loop_names(self) -> list[str]:
        return [loop.name for loop, _ in self.loops()]

    def loops_of(self, stmt: str) -> list[Loop]:
        """The loops around a statement, outermost first."""

        def visit(nodes: tuple[Node, ...], outer: list[Loop]) -> list[Loop] | None:
            for node in nodes:
                if isinstance(node, Leaf) and node.stmt == stmt:
                    return outer
                if isinstance(node, Loop):
                    found = visit(node.body, [*outer, node])
                    if found is not None:
                        return found
            return None

        found = visit(self.body, [])
        if found is None:
            raise IllegalSchedule(f"kernel {self.kernel.name}: no statement '{stmt}'")
        return found

    # --- trace ----------------------------------------------------------------------
    def trace_json(self) -> list[dict[str, Any]]:
        return [{"kind": s.kind, "args": _thaw(s.args)} for s in self.trace]

    def trace_hash(self) -> str:
        blob = json.dumps(
            {"workload": self.kernel.workload_key(), "trace": self.trace_json()},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_step(self, body: tuple[Node, ...], step: Step) -> Schedule:
        return replace(self, body=tuple(body), trace=(*self.trace, step))


def statements_below(node: Node) -> list[str]:
    if isinstance(node, Leaf):
        return [node.stmt]
    return [s for child in node.body for s in statements_below(child)]


def loop_dims(loop: Loop, stmt: str, dims: tuple[str, ...]) -> list[str]:
    """The statement's dims that the loop's value for it moves with (`floor(m/8)`: m)."""
    value = loop.exprs[stmt].split("->", 1)[1]
    return [d for d in dims if mentions(value, d)]


def identity_expr(stmt: str, dims: tuple[str, ...], dim: str) -> str:
    return f"{{ {stmt}[{', '.join(dims)}] -> [({dim})] }}"


def initial_schedule(kernel: Kernel) -> Schedule:
    """Each statement in its own loop nest over its dimensions, in program order.

    A reduction's init gets its own nest too, so the reduction's nest is perfectly nested
    and can be split and reordered; `decompose_reduction` later places the init inside
    it (TVM's order of steps)."""
    taken: set[str] = set()
    names: dict[tuple[str, str], str] = {}
    # main statements take the plain dim names; init nests are suffixed `_init`
    for s in sorted(kernel.statements, key=lambda s: s.init_of is not None):
        for dim in s.dims:
            names[s.name, dim] = unique_name(f"{dim}_init" if s.init_of else dim, taken)
    body: list[Node] = []
    for s in kernel.statements:
        nest: Node = Leaf(s.name)
        for dim in reversed(s.dims):
            expr = {s.name: identity_expr(s.name, s.dims, dim)}
            nest = Loop(names[s.name, dim], expr, (nest,))
        body.append(nest)
    return Schedule(kernel, tuple(body))


# --- conversion to isl -----------------------------------------------------------------


def mark_id(loop: Loop) -> str:
    return f"{loop.name}:{loop.annotation or 'serial'}"


def parse_mark(text: str) -> tuple[str, str]:
    name, _, annotation = text.rpartition(":")
    return name, "" if annotation == "serial" else annotation


def to_isl(schedule: Schedule) -> isl.Schedule:
    """The isl schedule tree: sequences with filters, one-member bands, marks with names."""
    kernel = schedule.kernel
    root = isl.Schedule.from_domain(kernel.domain()).get_root().child(0)
    node = _insert(root, schedule.body, kernel)
    return node.get_schedule()


def _filter(kernel: Kernel, stmts: list[str]) -> isl.UnionSet:
    return ih.union_set([kernel.statement[s].domain_set() for s in stmts])


def _insert(node: isl.ScheduleNode, nodes: tuple[Node, ...], kernel: Kernel) -> isl.ScheduleNode:
    """Insert `nodes` (a sequence) at the leaf `node`; return a node of the same tree."""
    if len(nodes) > 1:
        filters = isl.UnionSetList.alloc(ih.CTX, len(nodes))
        for child in nodes:
            filters = filters.add(_filter(kernel, statements_below(child)))
        node = node.insert_sequence(filters)
        for index, child in enumerate(nodes):
            node = _insert(node.child(index).child(0), (child,), kernel)
            node = node.parent().parent()
        return node
    if not nodes:
        return node
    only = nodes[0]
    if isinstance(only, Leaf):
        return node
    parts = [ih.parse_union_pw_aff(text) for text in only.exprs.values()]
    upa = parts[0]
    for part in parts[1:]:
        upa = upa.union_add(part)
    mupa = isl.MultiUnionPwAff.from_union_pw_aff(upa)
    band = node.insert_partial_schedule(mupa)
    mark = band.insert_mark(isl.Id(mark_id(only), context=ih.CTX))
    inner = _insert(mark.child(0).child(0), only.body, kernel)
    return inner.parent().parent()


# --- legality ------------------------------------------------------------------------


def schedule_map(schedule: Schedule) -> isl.UnionMap:
    return to_isl(schedule).get_map()


def check_order(schedule: Schedule, step: str, changed: Collection[str] | None = None) -> None:
    """Every dependence source still runs before its sink; else IllegalSchedule. Given
    `changed`, the step changed only those statements' accesses or loops, in a schedule
    that kept every dependence before: only the dependences with an end in one of them
    are checked (`ordering_touching`)."""
    violated = reversed_dependences(schedule, changed)
    if not violated.is_empty():
        raise IllegalSchedule(
            f"kernel {schedule.kernel.name}: step {step} reverses the dependence "
            f"{_sample(violated)}"
        )


def reversed_dependences(
    schedule: Schedule, changed: Collection[str] | None = None
) -> isl.UnionMap:
    """Dependences whose sink the schedule does not run strictly after the source (of
    those with an end in `changed`, if given).

    Each dependence is mapped into schedule time (one flat space for the whole tree) and
    compared there, which avoids building the lexicographic order of every pair of
    statements (`lex_lt_union_map`)."""
    if changed is None:
        deps = schedule.kernel.dependences.ordering()
    else:
        deps = ordering_touching(schedule.kernel, changed)
    if deps.is_empty():
        return deps
    sched = schedule_map(schedule)
    timed = deps.apply_domain(sched).apply_range(sched)
    if timed.is_empty():
        return timed
    flat = isl.Map.from_union_map(timed)
    not_after = flat.intersect(isl.Map.lex_ge(flat.get_space().domain()))
    if not_after.is_empty():
        return isl.UnionMap.empty(deps.get_space())
    pairs = sched.apply_range(isl.UnionMap.from_map(not_after)).apply_range(sched.reverse())
    return deps.intersect(pairs)


def carried(schedule: Schedule, name: str, include_reductions: bool = True) -> isl.UnionMap:
    """Dependences carried by loop `name`: same values of the enclosing loops, different
    values of this one."""
    return _carried(schedule, _LoopPairs.of(schedule, name), include_reductions)


@dataclass(frozen=True)
class _LoopPairs:
    """What `carried` compares dependences with for one loop, worked out once for the
    checks that ask about the loop with and without reductions: the instances under it,
    the pairs of them at the same values of the enclosing loops (None: there are none),
    and the pairs at the same values of the loop too."""

    under: isl.UnionSet
    together: isl.UnionMap | None
    same: isl.UnionMap

    @staticmethod
    def of(schedule: Schedule, name: str) -> _LoopPairs:
        loop = schedule.loop(name)
        outer = schedule.enclosing(name)
        inside = _outer_map(schedule, (*outer, loop), loop)
        together = None
        if outer:
            prefix = _outer_map(schedule, outer, loop)
            together = prefix.apply_range(prefix.reverse())
        return _LoopPairs(inside.domain(), together, inside.apply_range(inside.reverse()))


def _carried(schedule: Schedule, pairs: _LoopPairs, include_reductions: bool) -> isl.UnionMap:
    deps = schedule.kernel.dependences
    relation = deps.ordering()
    if include_reductions:
        relation = relation.union(deps.reduction)
    relation = relation.intersect_domain(pairs.under).intersect_range(pairs.under)
    if pairs.together is not None:
        relation = relation.intersect(pairs.together)
    return relation.subtract(pairs.same)


def _outer_map(schedule: Schedule, outer: tuple[Loop, ...], loop: Loop) -> isl.UnionMap:
    """Instances of the statements under `loop` → the values of the loops `outer`."""
    stmts = statements_below(loop)
    maps = []
    for stmt in stmts:
        affs = [ih.parse_pw_aff(o.exprs[stmt]) for o in outer]
        mpa = isl.PwMultiAff.from_pw_aff(affs[0])
        for aff in affs[1:]:
            mpa = mpa.flat_range_product(isl.PwMultiAff.from_pw_aff(aff))
        maps.append(
            isl.Map.from_pw_multi_aff(mpa).intersect_domain(
                schedule.kernel.statement[stmt].domain_set()
            )
        )
    return ih.union_map(maps)


def _sample(relation: isl.UnionMap) -> str:
    found: list[str] = []
    relation.foreach_map(lambda m: found.append(str(m.sample())) if not found else None)
    return found[0] if found else str(relation)


def check_not_carried(schedule: Schedule, loop: str, step: str) -> None:
    """IllegalSchedule (naming `step`) when the loop carries a dependence."""
    deps = carried(schedule, loop, include_reductions=True)
    if not deps.is_empty():
        raise IllegalSchedule(f"{step}: loop {loop} carries the dependence {_sample(deps)}")


_IN = isl.dim_type.in_


def check_vectorizable(schedule: Schedule, name: str, step: str) -> None:
    """IllegalSchedule (naming `step`) when the loop carries a dependence other than a
    reduction into an element all its iterations share (`S[i] += X[i, j]` along j):
    codegen gives such a reduction one partial result a lane and combines the lanes at
    the end (reassociating it, as any blocked reduction)."""
    pairs = _LoopPairs.of(schedule, name)
    deps: isl.UnionMap | None = None
    if _carried(schedule, pairs, include_reductions=False).is_empty():
        loop = schedule.loop(name)
        shared: list[str] = []

        def check(relation: isl.Map) -> None:
            stmt = schedule.kernel.statement[relation.get_tuple_name(_IN)]
            value = ih.parse_map(loop.exprs[stmt.name])
            dims = [d for p, d in enumerate(stmt.dims) if value.involves_dims(_IN, p, 1)]
            if stmt.reduction is None or any(mentions(i, d) for i in stmt.index for d in dims):
                shared.append(stmt.name)

        deps = _carried(schedule, pairs, include_reductions=True)
        deps.foreach_map(check)
        if not shared:
            return
    if deps is None:
        deps = _carried(schedule, pairs, include_reductions=True)
    if not deps.is_empty():  # `check_not_carried`, on the pairs at hand
        raise IllegalSchedule(f"{step}: loop {name} carries the dependence {_sample(deps)}")


def check_marks(schedule: Schedule, step: str) -> Schedule:
    """After loops moved or statements changed, the parallel / vector marks must still be
    legal."""
    for loop, _ in schedule.loops():
        where = f"{step} (keeping {loop.annotation} on {loop.name})"
        if loop.annotation == "parallel":
            check_not_carried(schedule, loop.name, where)
        elif loop.annotation == "vector":
            check_vectorizable(schedule, loop.name, where)
    return schedule
