"""Schedule transformations: pure functions `Schedule -> Schedule` that append their step
to the trace. Each checks legality against the kernel's dependences and raises
`IllegalSchedule` naming the step and the dependence it would break.

Steps: split, tile, reorder, fuse, compute_at, reverse_compute_at, decompose_reduction,
parallel, vectorize, unroll, pack (a constant or input tensor into a blocked layout,
`poly.pack`), and hint (codegen hints: the machine-dependent choices of one kernel).
`replay` re-applies a trace to a kernel's initial schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import islpy as isl

from polytile.errors import IllegalSchedule
from polytile.names import unique_name
from polytile.poly.ast.check import verify_ast
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import (
    HINTS,
    Leaf,
    Loop,
    Node,
    Schedule,
    Step,
    _outer_map,
    check_marks,
    check_not_carried,
    check_order,
    check_vectorizable,
    initial_schedule,
    statements_below,
)
from polytile.poly.transform.inline import inline_statement
from polytile.poly.transform.pack import pack
from polytile.poly.transform.rfactor import rfactor

# --- tree surgery ------------------------------------------------------------------------


def _map_tree(
    nodes: tuple[Node, ...], fn: Callable[[Loop], Node | tuple[Node, ...]]
) -> tuple[Node, ...]:
    """Rebuild the tree bottom-up; `fn` may replace a loop by a node or several nodes."""
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, Leaf):
            out.append(node)
            continue
        node = replace(node, body=_map_tree(node.body, fn))
        result = fn(node)
        out.extend(result if isinstance(result, tuple) else (result,))
    return tuple(out)


def _taken(schedule: Schedule) -> set[str]:
    return set(schedule.loop_names())


def _pw(text: str) -> isl.PwAff:
    return ih.parse_pw_aff(text)


def _val(n: int) -> isl.Val:
    return isl.Val.int_from_si(ih.CTX, n)


def loop_bounds(
    schedule: Schedule, name: str, upper: bool = True, sizes: Mapping[str, int] | None = None
) -> tuple[int, int]:
    """The smallest and largest value the loop takes over all its statements (and all
    symbolic sizes, or at `sizes`); IllegalSchedule when a symbolic size leaves one
    unbounded (with `upper=False`, the largest is not asked for and comes back as -1)."""
    loop = schedule.loop(name)
    lo, hi = math.inf, -math.inf
    for stmt, text in loop.exprs.items():
        domain = schedule.kernel.statement[stmt].domain_set()
        if sizes is not None:
            domain = ih.fix_params(domain, sizes)
        values = isl.Map.from_pw_aff(_pw(text)).intersect_domain(domain).range()
        if values.is_empty():
            continue
        low = values.dim_min_val(0)
        high = values.dim_max_val(0) if upper else isl.Val.int_from_si(ih.CTX, -1)
        if not (low.is_int() and high.is_int()):
            raise IllegalSchedule(
                f"kernel {schedule.kernel.name}: loop {name} has no bound over all sizes "
                f"{list(schedule.kernel.params)}"
            )
        lo, hi = min(lo, low.to_python()), max(hi, high.to_python())
    if lo is math.inf:
        return 0, -1
    return int(lo), int(hi)


def loop_extent(schedule: Schedule, name: str, sizes: Mapping[str, int] | None = None) -> int:
    """The loop's trip count over all sizes (IllegalSchedule if unbounded) or at `sizes`."""
    lo, hi = loop_bounds(schedule, name, sizes=sizes)
    return hi - lo + 1


# --- split / tile / reorder / fuse -----------------------------------------------------


def split(schedule: Schedule, loop: str, factors: Sequence[int | None]) -> Schedule:
    """Split a loop into len(factors) nested loops; one factor may be None (inferred).
    Names are `<loop>0`, `<loop>1`, ... (outermost first, made unique)."""
    return split_named(schedule, loop, factors)[0]


def split_named(
    schedule: Schedule, loop: str, factors: Sequence[int | None]
) -> tuple[Schedule, list[str]]:
    """`split`, also returning the new loops' names."""
    target = schedule.loop(loop)
    if len(factors) < 2 or sum(f is None for f in factors) > 1:
        raise IllegalSchedule(f"split of {loop}: give two or more factors, at most one None")
    if any(f is not None and f < 1 for f in factors):
        raise IllegalSchedule(f"split of {loop}: factors must be positive, got {list(factors)}")
    # the outermost factor shapes no loop's value: only an inner one left to infer needs
    # the extent (which a symbolic size may leave unbounded)
    inferred = None in factors[1:]
    lo, hi = loop_bounds(schedule, loop, upper=inferred)
    if lo < 0:
        raise IllegalSchedule(f"split of {loop}: the loop starts below 0 (at {lo})")
    extent = hi + 1  # tiles are aligned to multiples of the factors, counted from 0
    known = math.prod(f for f in factors if f is not None)
    sizes = [f if f is not None else max(1, -(-extent // known)) for f in factors]
    taken = _taken(schedule)
    names = [unique_name(f"{loop}{i}", taken) for i in range(len(sizes))]
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    loops_exprs: list[dict[str, str]] = [{} for _ in sizes]
    for stmt, text in target.exprs.items():
        value = _pw(text)
        for level, stride in enumerate(strides):
            part = value.scale_down_val(_val(stride)).floor() if stride > 1 else value
            if level > 0:
                part = part.mod_val(_val(sizes[level]))
            loops_exprs[level][stmt] = str(part)

    def rebuild(node: Loop) -> Node:
        if node.name != loop:
            return node
        inner: tuple[Node, ...] = node.body
        for level in reversed(range(len(sizes))):
            annotation = node.annotation if level == len(sizes) - 1 else ""
            inner = (Loop(names[level], loops_exprs[level], inner, annotation),)
        return inner[0]

    body = _map_tree(schedule.body, rebuild)
    step = Step("split", {"loop": loop, "factors": tuple(factors)})
    return schedule.with_step(body, step), names


def _chain(schedule: Schedule, names: Sequence[str], step: str) -> list[Loop]:
    """The perfectly nested path of loops from the outermost to the innermost of `names`."""
    if not names:
        raise IllegalSchedule(f"{step}: no loops given")
    if len(set(names)) != len(names):
        raise IllegalSchedule(f"{step}: loops {list(names)} are not distinct")
    depth = {n: len(schedule.enclosing(n)) for n in names}
    top = min(names, key=depth.__getitem__)
    path = [schedule.loop(top)]
    wanted = set(names) - {top}
    while wanted:
        current = path[-1]
        inner = [c for c in current.body if isinstance(c, Loop)]
        if len(current.body) != 1 or len(inner) != 1:
            raise IllegalSchedule(
                f"{step}: loops {list(names)} are not perfectly nested (loop {current.name} "
                f"holds {len(current.body)} children)"
            )
        path.append(inner[0])
        wanted.discard(inner[0].name)
    return path


def reorder(schedule: Schedule, *order: str) -> Schedule:
    """Permute loops of one perfectly nested chain into the given order."""
    step = f"reorder{tuple(order)}"
    path = _chain(schedule, order, step)
    positions = [i for i, loop in enumerate(path) if loop.name in order]
    by_name = {loop.name: loop for loop in path}
    new_at = dict(zip(positions, (by_name[n] for n in order), strict=True))
    new_path = [new_at.get(i, loop) for i, loop in enumerate(path)]
    leaf_body = path[-1].body
    inner: tuple[Node, ...] = leaf_body
    for loop in reversed(new_path):
        inner = (Loop(loop.name, loop.exprs, inner, loop.annotation),)
    top = path[0].name

    body = _replace_top(schedule.body, top, inner[0])
    result = schedule.with_step(body, Step("reorder", {"order": tuple(order)}))
    check_order(result, step)
    return check_marks(result, step)


def _replace_top(nodes: tuple[Node, ...], name: str, new: Node) -> tuple[Node, ...]:
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, Loop):
            node = (
                new if node.name == name else replace(node, body=_replace_top(node.body, name, new))
            )
        out.append(node)
    return tuple(out)


def tile(schedule: Schedule, loops: Sequence[str], sizes: Sequence[int]) -> Schedule:
    """Split each loop by its size, then move all outer parts outside all inner parts."""
    if len(loops) != len(sizes):
        raise IllegalSchedule(f"tile: {len(loops)} loops but {len(sizes)} sizes")
    outer, inner = [], []
    for loop, size in zip(loops, sizes, strict=True):
        schedule, (o, i) = split_named(schedule, loop, (None, size))
        outer.append(o)
        inner.append(i)
    return reorder(schedule, *outer, *inner)


def fuse(schedule: Schedule, *names: str, check_ast: bool = True) -> Schedule:
    """Fuse perfectly nested consecutive loops into one (for a parallel outer band)."""
    return fuse_named(schedule, *names, check_ast=check_ast)[0]


def fuse_named(schedule: Schedule, *names: str, check_ast: bool = True) -> tuple[Schedule, str]:
    """`fuse`, also returning the fused loop's name. The fused nest's AST is checked
    (isl's AST generator can drop instances of a fused nest, `poly.ast.check`), unless
    `check_ast` is False: for a caller that checks the whole schedule's AST at the end and
    fuses again with checks where that fails (`poly.default.schedule.checked_default`)."""
    step = f"fuse{tuple(names)}"
    path = _chain(schedule, names, step)
    if [loop.name for loop in path] != list(names):
        raise IllegalSchedule(f"{step}: loops must be consecutive, outermost first")
    for n in names:
        if loop_bounds(schedule, n, upper=False)[0] != 0:
            raise IllegalSchedule(f"{step}: loop {n} does not start at 0")
    # the outermost loop's extent is not needed (it may be symbolic); the others' are
    extents = [0, *(loop_extent(schedule, n) for n in names[1:])]
    stmts = statements_below(path[0])
    exprs = {}
    for stmt in stmts:
        value = _pw(path[0].exprs[stmt])
        for loop, extent in zip(path[1:], extents[1:], strict=True):
            value = value.scale_val(_val(extent)).add(_pw(loop.exprs[stmt]))
        exprs[stmt] = str(value)
    name = unique_name("_".join(names) + "_f", _taken(schedule))
    fused = Loop(name, exprs, path[-1].body, "")
    body = _replace_top(schedule.body, path[0].name, fused)
    result = schedule.with_step(body, Step("fuse", {"loops": tuple(names)}))
    # no dependence or mark to check again: every inner loop starts at 0 and stays below
    # its extent, so (a, b) -> a*extent + b is a bijection that keeps the lexicographic
    # order of the instances, and the loops below keep the same pairs of instances at
    # equal enclosing values (`test_fuse_keeps_the_order_of_every_pair_of_instances`)
    if not check_ast:
        return result, name
    try:
        verify_ast(_top_nest_alone(result, name))
    except IllegalSchedule as err:
        raise IllegalSchedule(f"{step}: {err}") from None
    return result, name


def _top_nest_alone(schedule: Schedule, loop: str) -> Schedule:
    """The schedule cut to the top-level nest holding `loop` and its statements. isl
    generates the children of the top sequence apart, so this nest's AST is the whole
    one's part for it; checking only it spares rebuilding the other nests (a DenseNet
    conv's default schedule fuses the parallel loops of its five prologue nests)."""
    if len(schedule.body) == 1:
        return schedule
    outer = schedule.enclosing(loop)
    nest = outer[0] if outer else schedule.loop(loop)
    below = set(statements_below(nest))
    kernel = schedule.kernel
    cut = Kernel(
        kernel.name, kernel.tensors, tuple(s for s in kernel.statements if s.name in below)
    )
    return Schedule(cut, (nest,), schedule.trace)


# --- moving statements -----------------------------------------------------------------


def _detach(schedule: Schedule, stmt: str) -> tuple[tuple[Node, ...], Node]:
    """Remove the statement with the loops that hold only it; return (tree, its nest)."""
    nest: list[Node] = []

    def strip(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        out: list[Node] = []
        for node in nodes:
            if statements_below(node) == [stmt]:
                nest.append(node)
                continue
            if isinstance(node, Loop):
                node = replace(node, body=strip(node.body))
                if not node.body:
                    continue
            out.append(node)
        return tuple(out)

    body = strip(schedule.body)
    if not nest:
        raise IllegalSchedule(f"kernel {schedule.kernel.name}: no statement '{stmt}'")
    return body, nest[0]


def _anchor_exprs(schedule: Schedule, stmt: str, path: tuple[Loop, ...], after: bool) -> list[str]:
    """The values of the loops `path` for each instance of `stmt`: the last (after=True)
    or first iteration among the instances under path[-1] it depends on / feeds."""
    deps = schedule.kernel.dependences.ordering()
    others = _outer_map(schedule, path, path[-1])
    domain = schedule.kernel.statement[stmt].domain_set()
    stmt_space = isl.UnionSet.from_set(domain)
    # stmt → the instances it reads from (after) or feeds (before)
    rel = deps.intersect_range(stmt_space).reverse() if after else deps.intersect_domain(stmt_space)
    values = rel.apply_range(others)
    values = values.lexmax() if after else values.lexmin()
    if values.is_empty():
        raise IllegalSchedule(
            f"compute_at of {stmt} at {path[-1].name}: {stmt} exchanges no data with the "
            f"statements under that loop"
        )
    found: list[isl.Map] = []
    values.foreach_map(found.append)
    relation = found[0]
    covered = relation.domain()
    if not domain.is_subset(covered):
        raise IllegalSchedule(
            f"compute_at of {stmt} at {path[-1].name}: instances {domain.subtract(covered)} "
            f"exchange no data with the statements under that loop"
        )
    pma = relation.lexmax_pw_multi_aff() if after else relation.lexmin_pw_multi_aff()
    return [str(pma.get_pw_aff(i)) for i in range(len(path))]


def _place(
    schedule: Schedule,
    stmt: str,
    loop: str,
    after: bool,
    position: str | None,
    kind: str,
    check: bool = True,
) -> Schedule:
    step = f"{kind}({stmt}, {loop})"
    target = schedule.loop(loop)
    if stmt in statements_below(target):
        raise IllegalSchedule(f"{step}: {stmt} is already under {loop}")
    path = (*schedule.enclosing(loop), target)
    exprs = _anchor_exprs(schedule, stmt, path, after)
    body, nest = _detach(schedule, stmt)
    on_path = {p.name: e for p, e in zip(path, exprs, strict=True)}

    def rebuild(node: Loop) -> Node:
        if node.name not in on_path:
            return node
        node = replace(node, exprs={**node.exprs, stmt: on_path[node.name]})
        if node.name != loop:
            return node
        children = list(node.body)
        if position is not None:
            index = next(
                (i for i, c in enumerate(children) if isinstance(c, Loop) and c.name == position),
                None,
            )
            if index is None:
                raise IllegalSchedule(f"{step}: {position} is not directly under {loop}")
            children.insert(index, nest)
        elif after:
            children.append(nest)
        else:
            children.insert(0, nest)
        return replace(node, body=tuple(children))

    new_body = _map_tree(body, rebuild)
    args: dict[str, Any] = {"stmt": stmt, "loop": loop}
    if position is not None:
        args["before"] = position
    result = schedule.with_step(new_body, Step(kind, args))
    if not check:
        return result
    check_order(result, step)
    return check_marks(result, step)


def compute_at(schedule: Schedule, stmt: str, loop: str) -> Schedule:
    """Move a producer under `loop`, computing each instance in the first iteration that
    needs it (before the loop's other statements)."""
    return _place(schedule, stmt, loop, after=False, position=None, kind="compute_at")


def reverse_compute_at(schedule: Schedule, stmt: str, loop: str) -> Schedule:
    """Move a consumer under `loop`, computing each instance in the last iteration that
    produces its inputs (after the loop's other statements). A reduction takes its init
    along, placed right before its nest (as TVM's blocks carry their init): left in a
    nest of its own after the loop, it would run after the reduction."""
    below = set(statements_below(schedule.loop(loop)))
    inits = [
        s.name
        for s in schedule.kernel.statements
        if s.init_of == stmt and s.name not in below and stmt not in below
    ]
    if not inits:
        return _place(schedule, stmt, loop, after=True, position=None, kind="reverse_compute_at")
    step = f"reverse_compute_at({stmt}, {loop})"
    moved = _place(schedule, stmt, loop, after=True, position=None, kind="", check=False)
    head = next((c for c in moved.loop(loop).body if stmt in statements_below(c)), None)
    for init in inits:
        before = head.name if isinstance(head, Loop) else None
        moved = _place(moved, init, loop, after=False, position=before, kind="", check=False)
    args = {"stmt": stmt, "loop": loop}
    result = schedule.with_step(moved.body, Step("reverse_compute_at", args))
    check_order(result, step)
    return check_marks(result, step)


def decompose_reduction(schedule: Schedule, stmt: str, loop: str) -> Schedule:
    """Place the init of reduction `stmt` right before `loop`, inside the loops around it."""
    kernel = schedule.kernel
    inits = [s.name for s in kernel.statements if s.init_of == stmt]
    if not inits:
        raise IllegalSchedule(f"decompose_reduction: {stmt} has no init statement")
    enclosing = schedule.enclosing(loop)
    if not enclosing:
        body, nest = _detach(schedule, inits[0])
        index = next(i for i, n in enumerate(body) if isinstance(n, Loop) and n.name == loop)
        new = (*body[:index], nest, *body[index:])
        result = schedule.with_step(new, Step("decompose_reduction", {"stmt": stmt, "loop": loop}))
        check_order(result, f"decompose_reduction({stmt}, {loop})")
        return result
    placed = _place(
        schedule,
        inits[0],
        enclosing[-1].name,
        after=False,
        position=loop,
        kind="decompose_reduction",
    )
    trace = (*schedule.trace, Step("decompose_reduction", {"stmt": stmt, "loop": loop}))
    return replace(placed, trace=trace)


# --- annotations -----------------------------------------------------------------------


def _annotate(schedule: Schedule, loop: str, annotation: str) -> Schedule:
    def rebuild(node: Loop) -> Node:
        return replace(node, annotation=annotation) if node.name == loop else node

    body = _map_tree(schedule.body, rebuild)
    kind = {"parallel": "parallel", "vector": "vectorize", "unroll": "unroll"}[annotation]
    return schedule.with_step(body, Step(kind, {"loop": loop}))


def parallel(schedule: Schedule, loop: str) -> Schedule:
    """Run the loop's iterations on several threads: it must carry no dependence."""
    schedule.loop(loop)
    check_not_carried(schedule, loop, f"parallel({loop})")
    return _annotate(schedule, loop, "parallel")


def vectorize(schedule: Schedule, loop: str) -> Schedule:
    """SIMD over an innermost loop that carries no dependence but, possibly, a
    reduction into an element its iterations share (`check_vectorizable`)."""
    target = schedule.loop(loop)
    if any(isinstance(c, Loop) for c in target.body):
        raise IllegalSchedule(f"vectorize({loop}): only an innermost loop can be vectorized")
    check_vectorizable(schedule, loop, f"vectorize({loop})")
    return _annotate(schedule, loop, "vector")


def unroll(schedule: Schedule, loop: str) -> Schedule:
    schedule.loop(loop)
    return _annotate(schedule, loop, "unroll")


def hint(schedule: Schedule, **hints: int | bool) -> Schedule:
    """Record codegen hints for the kernel (`poly.ir.schedule.HINTS`: prefetch distances
    and windows), which codegen applies over the target's defaults. Always legal: a hint
    changes which lines are asked for early, never a value or the loop tree. A later
    hint of the same name overrides an earlier one."""
    if not hints:
        raise IllegalSchedule("hint: give at least one of " + ", ".join(HINTS))
    for name, value in hints.items():
        if name not in HINTS:
            raise IllegalSchedule(f"hint: unknown hint '{name}' (known: {', '.join(HINTS)})")
        if not _fits(value, HINTS[name]) or (HINTS[name] == "int" and value < 0):
            raise IllegalSchedule(
                f"hint: '{name}' must be {_KINDS[HINTS[name]]}, got {value!r}"
                + (" (at least 0)" if HINTS[name] == "int" else "")
            )
    return schedule.with_step(schedule.body, Step("hint", dict(sorted(hints.items()))))


# --- traces ------------------------------------------------------------------------------

STEPS: Mapping[str, Callable[..., Schedule]] = {
    "split": lambda s, a: split(s, a["loop"], list(a["factors"])),
    "tile": lambda s, a: tile(s, list(a["loops"]), list(a["sizes"])),
    "reorder": lambda s, a: reorder(s, *a["order"]),
    "fuse": lambda s, a: fuse(s, *a["loops"]),
    "compute_at": lambda s, a: compute_at(s, a["stmt"], a["loop"]),
    "reverse_compute_at": lambda s, a: reverse_compute_at(s, a["stmt"], a["loop"]),
    "decompose_reduction": lambda s, a: decompose_reduction(s, a["stmt"], a["loop"]),
    "parallel": lambda s, a: parallel(s, a["loop"]),
    "vectorize": lambda s, a: vectorize(s, a["loop"]),
    "unroll": lambda s, a: unroll(s, a["loop"]),
    "pack": lambda s, a: pack(s, a["tensor"], a["axis"], a["factor"]),
    "rfactor": lambda s, a: rfactor(s, a["stmt"], a["dim"], a["factor"]),
    "inline": lambda s, a: inline_statement(s, a["stmt"]),
    "hint": lambda s, a: hint(s, **a),
}


#: each step's arguments and their JSON types ("names": a list of strings, "ints": a list
#: of integers or nulls)
STEP_ARGS: Mapping[str, Mapping[str, str]] = {
    "split": {"loop": "name", "factors": "ints"},
    "tile": {"loops": "names", "sizes": "ints"},
    "reorder": {"order": "names"},
    "fuse": {"loops": "names"},
    "compute_at": {"stmt": "name", "loop": "name"},
    "reverse_compute_at": {"stmt": "name", "loop": "name"},
    "decompose_reduction": {"stmt": "name", "loop": "name"},
    "parallel": {"loop": "name"},
    "vectorize": {"loop": "name"},
    "unroll": {"loop": "name"},
    "pack": {"tensor": "name", "axis": "int", "factor": "int"},
    "rfactor": {"stmt": "name", "dim": "name", "factor": "int"},
    "inline": {"stmt": "name"},
    "hint": HINTS,
}
assert set(STEP_ARGS) == set(STEPS), "every step kind needs its argument spec"
#: steps whose arguments are each optional (a hint names only the choices it sets)
OPTIONAL_ARGS = frozenset({"hint"})


_KINDS = {
    "name": "a name",
    "int": "an integer",
    "names": "a list of names",
    "ints": "a list of integers",
    "bool": "true or false",
}


def _fits(value: Any, kind: str) -> bool:
    def integer(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if kind == "name":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return integer(value)
    if not isinstance(value, tuple | list):
        return False
    if kind == "names":
        return all(isinstance(v, str) for v in value)
    return all(v is None or integer(v) for v in value)


def apply_step(schedule: Schedule, step: Step) -> Schedule:
    """The step applied; a step of an unknown kind or with malformed arguments (a trace
    from elsewhere, or edited by hand) is illegal, like any step that does not apply."""
    if step.kind not in STEPS:
        raise IllegalSchedule(f"unknown step kind '{step.kind}'")
    expected = STEP_ARGS[step.kind]
    for name, kind in expected.items():
        if name not in step.args:
            if step.kind in OPTIONAL_ARGS:
                continue
            raise IllegalSchedule(f"step '{step.kind}' lacks its argument '{name}'")
        if not _fits(step.args[name], kind):
            raise IllegalSchedule(
                f"step '{step.kind}': argument '{name}' must be {_KINDS[kind]}, "
                f"got {step.args[name]!r}"
            )
    extra = sorted(set(step.args) - set(expected))
    if extra:
        raise IllegalSchedule(f"step '{step.kind}' has unknown argument(s) {extra}")
    kernel = schedule.kernel
    for arg, known in (("stmt", kernel.statement), ("tensor", kernel.tensors)):
        if arg in step.args and step.args[arg] not in known:
            name = step.args[arg]
            raise IllegalSchedule(
                f"kernel {kernel.name}: {step.kind}({name}): no {arg.replace('stmt', 'statement')} "
                f"'{name}'"
            )
    return STEPS[step.kind](schedule, step.args)


def replay(kernel: Kernel, trace: Sequence[Step | Mapping[str, Any]]) -> Schedule:
    """The schedule a trace produces from the kernel's initial schedule."""
    schedule = initial_schedule(kernel)
    for step in trace:
        schedule = apply_step(schedule, step if isinstance(step, Step) else Step.from_json(step))
    return schedule
