"""The default schedule of a kernel, without search: what `compile` uses when no tuning
record applies. It is the kernel's sketch (`poly.default.sketch`) under the default
decisions (`poly.default.decide`): the same template the search samples from, so the
default is one record of decisions like any other.

For the main statement (the largest reduction: conv, matmul, pooling, norms) the
decisions make a register-blocked tile in the CPU style. A convolution-like reduction
puts its channels in vectors (`poly.default.conv`), unless its rows are long contiguous
streams (a 1×1 convolution on flattened planes, `poly.flatten`); the others take the
matrix-product plan (`poly.default.rules`). Epilogue statements chained through
temporaries (bias, residual add, ReLU) are inlined into one first, and computed inside
the output tile; the outer loops are fused into one parallel loop
(`poly.default.steps`). Other statements, and elementwise kernels, get a parallel outer
loop (when there is enough work) and a vectorized inner loop. Every step is checked; an
illegal one is skipped.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace

from polytile.errors import BudgetExceeded, IllegalSchedule
from polytile.frontend.graph import Graph
from polytile.frontend.symbolic import Dim, bounds_of
from polytile.frontend.symbolic_graph import derived_sizes
from polytile.poly.ast.build import AstNode
from polytile.poly.ast.check import verify_ast
from polytile.poly.default.decide import default_decisions
from polytile.poly.default.rules import (
    cache_rows,
    cache_tiles,
    gemm_block,
    packed_inputs,
    register_block,
    row_vectors,
    tile_band,
    tiles_first,
    weights_first,
    window_block,
)
from polytile.poly.default.sketch import Sketch
from polytile.poly.default.steps import (
    DefaultConfig,
    attempt,
    gathered_loops,
    main_statement,
    parallelize_for_all_sizes,
    parallelize_outer,
)
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Loop, Schedule, initial_schedule
from polytile.poly.transform import steps as T

#: the rules' and steps' names other modules import from here
__all__ = [
    "DefaultConfig",
    "cache_rows",
    "cache_tiles",
    "checked_default",
    "default_schedule",
    "fallback_schedule",
    "gathered_loops",
    "gemm_block",
    "main_statement",
    "packed_inputs",
    "parallelize_outer",
    "register_block",
    "representative_sizes",
    "row_vectors",
    "tile_band",
    "tiles_first",
    "weights_first",
    "window_block",
]

#: isl operations and seconds one kernel's default schedule may take: as a search
#: candidate's build (`search.budget`), far above what the zoo's kernels take
DEFAULT_OPERATIONS = 40_000_000
DEFAULT_SECONDS = 60.0
#: isl operations the fallback may spend proving outer loops parallel (a dependence check
#: a nest, far cheaper than an AST generation's budget)
FALLBACK_OPERATIONS = 4_000_000


#: the value every symbolic size takes when the default's decisions are made for a kernel
#: with symbolic sizes and no representative sizes are given
REPRESENTATIVE_SIZE = 128


def representative_sizes(graph: Graph) -> dict[str, int]:
    """The sizes a model compiled for all sizes has its kernels' default decisions made
    at (`default_schedule`'s `sizes`), within the bounds in force: a model input's
    leading size (ONNX's batch) at 1, the others at `REPRESENTATIVE_SIZE`, and derived
    sizes (batch*seq) at their values. Decisions made for one element of a batch hold
    for each of several; made for a batch of 128, they blocked a pool's registers over
    the batch, every register but one idle at a batch of 1."""
    leading = set()
    for name in graph.inputs:
        shape = graph.types[name].shape
        if len(shape) >= 2 and isinstance(shape[0], Dim) and str(shape[0]) in shape[0].params:
            leading.add(str(shape[0]))
    sizes: dict[str, int] = {}
    for t in graph.types.values():
        for d in t.shape:
            if not isinstance(d, Dim):
                continue
            for p in sorted(d.params - set(sizes)):
                lo, hi = bounds_of(p)
                sizes[p] = min(max(1 if p in leading else REPRESENTATIVE_SIZE, lo), hi)
    sizes.update({k: v.evaluate(sizes) for k, v in derived_sizes(graph).items()})
    return sizes


def default_schedule(
    kernel: Kernel, config: DefaultConfig | None = None, sizes: Mapping[str, int] | None = None
) -> Schedule:
    """The kernel's default schedule, under a budget (`DEFAULT_OPERATIONS`,
    `DEFAULT_SECONDS`): a kernel whose default scheduling runs out of it gets
    `fallback_schedule`, with a warning naming it, rather than a hang.

    A kernel with symbolic sizes gets the decisions made for its static instance at
    `sizes` (default: `REPRESENTATIVE_SIZE` each), replayed on it: each step is checked
    again for all sizes, and those that do not hold are skipped."""
    if kernel.params:
        return _for_all_sizes(kernel, config, sizes)
    refusal = f"kernel {kernel.name}: its default schedule went over budget"
    try:
        with ih.operation_budget(DEFAULT_OPERATIONS, refusal, DEFAULT_SECONDS, "default schedule"):
            sketch = Sketch(kernel, config or DefaultConfig())
            return sketch.apply(default_decisions(sketch))
    except BudgetExceeded as err:
        ih.check_budget("default schedule")  # an outer budget ran out: not ours to handle
        warnings.warn(
            f"{err}; using a simpler schedule instead (the initial one, its outer loops "
            "parallel where legal)",
            stacklevel=2,
        )
        return fallback_schedule(kernel)


def _for_all_sizes(
    kernel: Kernel, config: DefaultConfig | None, sizes: Mapping[str, int] | None
) -> Schedule:
    """The static instance's default steps replayed on the symbolic kernel, each one
    that does not hold for all sizes skipped (a fuse through a symbolic extent, a pack
    of a symbolic tensor), as the default skips an illegal step. The parallel loops are
    chosen again (`parallelize_for_all_sizes`): the instance's may be a batch loop, which
    leaves a batch of 1 on one thread."""
    config = config or DefaultConfig()
    chosen = {p: (sizes or {}).get(p, REPRESENTATIVE_SIZE) for p in kernel.params}
    instance = default_schedule(kernel.at(chosen), config)
    refusal = f"kernel {kernel.name}: its default schedule went over budget"
    try:
        with ih.operation_budget(DEFAULT_OPERATIONS, refusal, DEFAULT_SECONDS, "default schedule"):
            schedule = initial_schedule(kernel)
            # a statement under each of the instance's parallel loops
            under = {lp.name: next(iter(lp.exprs)) for lp, _ in instance.loops()}
            parallel = []
            for step in instance.trace:
                if step.kind == "parallel":
                    if step.args["loop"] in under:
                        parallel.append(under[step.args["loop"]])
                    continue
                schedule = attempt(schedule, lambda s, step=step: _replayed(s, step, config))
            smallest = {p: bounds_of(p)[0] for p in kernel.params}
            for stmt in parallel:
                if not any(lp.annotation == "parallel" for lp in schedule.loops_of(stmt)):
                    schedule = parallelize_for_all_sizes(schedule, stmt, config, smallest, chosen)
            if not parallel or any(lp.annotation == "parallel" for lp, _ in schedule.loops()):
                return schedule
            return _outer_parallel(schedule)
    except BudgetExceeded as err:
        ih.check_budget("default schedule")
        warnings.warn(f"{err}; using a simpler schedule instead", stacklevel=3)
        return fallback_schedule(kernel)


def _replayed(schedule: Schedule, step: T.Step, config: DefaultConfig) -> Schedule:
    """The instance's step applied to the symbolic kernel; a fuse checks its nest's AST
    as the config says."""
    if step.kind == "fuse" and not config.check_fused_ast:
        return T.fuse(schedule, *step.args["loops"], check_ast=False)
    return T.apply_step(schedule, step)


def checked_default(
    kernel: Kernel, config: DefaultConfig | None = None, sizes: Mapping[str, int] | None = None
) -> tuple[Schedule, AstNode]:
    """The default schedule and its checked AST (`poly.ast.check.verify_ast`), checking
    one AST for the whole schedule instead of one per fused nest: its fuses go unchecked,
    and only where the whole AST fails the check is the default made again with each
    fuse checked (a failing fuse then falls back to a shorter one, as in
    `default_schedule`). If that one fails too (isl's AST generator, or a check over its
    budget), the kernel's initial schedule, with a warning. The same schedule as
    `default_schedule` wherever isl's AST of each fused nest is right."""
    config = config or DefaultConfig()
    unchecked = default_schedule(kernel, replace(config, check_fused_ast=False), sizes)
    try:
        return unchecked, verify_ast(unchecked)
    except IllegalSchedule:
        pass
    checked = default_schedule(kernel, replace(config, check_fused_ast=True), sizes)
    try:
        return checked, verify_ast(checked)
    except IllegalSchedule as err:
        warnings.warn(f"{err}; using the kernel's initial schedule instead", stacklevel=2)
        fallback = initial_schedule(kernel)
        return fallback, verify_ast(fallback)


def _outer_parallel(schedule: Schedule) -> Schedule:
    """Each top-level nest's outermost loop parallel where that is legal."""
    for node in schedule.body:
        if isinstance(node, Loop):
            schedule = attempt(schedule, lambda s, n=node.name: T.parallel(s, n))
    return schedule


def fallback_schedule(kernel: Kernel) -> Schedule:
    """The initial schedule with each nest's outermost loop parallel where that is legal
    (and proved within the budget; else the initial schedule as it is)."""
    schedule = initial_schedule(kernel)
    refusal = f"kernel {kernel.name}: its fallback schedule went over budget"
    try:
        with ih.operation_budget(FALLBACK_OPERATIONS, refusal, DEFAULT_SECONDS, "fallback"):
            return _outer_parallel(schedule)
    except BudgetExceeded:
        ih.check_budget("fallback schedule")
        return schedule
