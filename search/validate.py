"""In-model validation: each task's best candidates re-ranked by their time inside the
model.

The search times a kernel alone (caches flushed, or warm), where the model runs it after
other kernels: its input just written by every thread, its weights evicted, the cache
full of the previous kernels' lines. There candidates can rank otherwise: the search's
best can lose to a candidate it timed slower, or to the default schedule (a parallel loop
whose every thread reads all the weights, say), and the whole model gains from taking
the fastest in the model (`benchmarks/resnet50_tune_bench.py` measures it).

So after the search, `validate` times each task's best `top` distinct verified candidates
(and the best of each other orientation near them: `OTHER_ORIENTATION`), the neighbour
of its best (`NEIGHBOUR`, measured and verified first like a search trial) and its
default schedule in `contexts` × (a task's most candidates) compiled variants of the
model: every variant runs one candidate of each task (every other kernel as `compile`
would), each candidate runs in at least `contexts` variants, and the candidates are
dealt to the variants with a random offset per task and context (`deal`), so that a
candidate's neighbours (a kernel's time depends on the kernels before it) differ between
its variants and do not follow its rank (fewer candidates where the variants would
not fit in `ValidateConfig.memory_bytes`). The variants are profiled in turns; a
candidate's time is the median, over its variants and the turns, of its calls' mean
seconds. Every candidate's in-model time is appended as a "model" record, all with one
timestamp, and `best_records` takes the fastest of the latest validation, unless the
search measured the task again since.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from polytile.codegen.configs import default_config
from polytile.codegen.target import Target, machine_choices
from polytile.errors import InputError
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.ir.schedule import Schedule

from .builder import Built, SpaceSpec, make_builder
from .dynamic import TuneSizes, tune_sizes
from .measure import MeasureConfig, Measurer
from .records import Record, RecordFile, best_records, trace_key
from .space import SearchSpace
from .tasks import Task

if TYPE_CHECKING:
    from polytile.runtime import CompiledModel

#: the model compiled with the given records applied (the best of each workload), for
#: the validation's target: `polytile.compile` with the model bound (search comes before
#: the compiler, so its caller passes it)
CompileVariant = Callable[[Sequence[Record]], "CompiledModel"]


@dataclass(frozen=True)
class ValidateConfig:
    #: the best candidates per task timed in the model (beside the default schedule):
    #: alone and in the model they rank differently often enough that the best in the
    #: model is often not among the first three; validation time grows with `top`
    top: int = 8
    #: variants each candidate runs in (each with other neighbours)
    contexts: int = 2
    #: turns: each variant profiled once per turn
    rounds: int = 6
    #: inferences per profile (each call's time is its median over them)
    repeat: int = 10
    #: the random inputs' seed
    seed: int = 0
    #: also time a neighbour of each task's best: its epilogue per innermost tile and two
    #: loops fused into the parallel one (measured and verified first: one trial a task)
    neighbours: bool = True
    #: the most bytes the compiled variants (each with its own weights and arena) may
    #: take together; fewer candidates per task are timed when they would take more.
    #: None: half of the machine's memory (a large model's variants may not all fit)
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("top", "contexts", "rounds", "repeat"):
            if getattr(self, name) < 1:
                raise InputError(f"ValidateConfig: {name} must be at least 1")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise InputError(
                f"ValidateConfig: memory_bytes must be at least 1, got {self.memory_bytes}"
            )

    def memory_budget(self) -> int | None:
        """`memory_bytes`, else half of the machine's memory (None where unknown)."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
        except (ValueError, OSError, AttributeError):
            return None


@dataclass(frozen=True)
class ValidatedTask:
    index: int
    workload: str
    #: the candidates, best first by the search's timing: "#1", "#2", ..., "default"
    labels: tuple[str, ...]
    #: each candidate's median seconds per call in the model
    seconds: tuple[float, ...]
    chosen: int


@dataclass(frozen=True)
class Validation:
    tasks: tuple[ValidatedTask, ...]
    seconds: float
    #: neighbours measured (search trials spent by the validation)
    trials: int = 0

    def table(self) -> str:
        if not self.tasks:
            return "in-model validation: no task has a verified candidate beside its default"
        lines = [f"in-model validation ({self.seconds:.0f} s): ms per call, * = chosen"]
        for t in self.tasks:
            cells = "  ".join(
                f"{'*' if i == t.chosen else ' '}{label} {s * 1e3:.4f}"
                for i, (label, s) in enumerate(zip(t.labels, t.seconds, strict=True))
            )
            lines.append(f"{t.index:>3} | {cells}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Candidate:
    label: str
    trace: tuple[Mapping[str, Any], ...]
    decisions: Mapping[str, Any] | None


#: the best candidate of an orientation (the vectorized loop) that none of the `top`
#: has is timed in the model too, when alone it is at most this much slower than the
#: best: the orientations differ in what they leave in the cache for the next kernel,
#: which the search's timing does not see
OTHER_ORIENTATION = 1.15


def _candidates(records: Sequence[Record], default_of: Schedule, top: int) -> list[_Candidate]:
    """The task's best `top` distinct verified candidates timed alone, the best of each
    other orientation near them (`OTHER_ORIENTATION`), then the default."""
    default = tuple(default_of.trace_json())
    best: dict[str, Record] = {}
    for r in records:
        key = r.trace_key()
        if r.ok and r.timing == "kernel" and (key not in best or r.latency < best[key].latency):
            best[key] = r
    best.pop(trace_key(default), None)
    ranked = sorted(best.values(), key=lambda r: r.latency)
    found = [_Candidate(f"#{i + 1}", r.trace, r.decisions) for i, r in enumerate(ranked[:top])]
    seen = {_orientation(r) for r in ranked[:top]}
    for i, r in enumerate(ranked[top:], start=top):
        if r.latency > OTHER_ORIENTATION * ranked[0].latency:
            break
        if r.decisions is not None and _orientation(r) not in seen:
            seen.add(_orientation(r))
            found.append(_Candidate(f"#{i + 1}", r.trace, r.decisions))
    return [*found, _Candidate("default", default, None)]


def _orientation(record: Record) -> Any:
    """Which loop a candidate vectorizes (None: none, or a record without decisions)."""
    return (record.decisions or {}).get("vec_loop")


#: the neighbour of a task's best candidate: the kernel alone cannot see that a parallel
#: loop of few iterations waits on the slower of two threads when the host slows one
#: vCPU; its epilogue per row and one more loop in the parallel one give more, smaller
#: iterations
NEIGHBOUR = {"epilogue_depth": 0, "parallel_depth": 2}


def _neighbours(
    tasks: Sequence[Task],
    by_task: dict[str, list[_Candidate]],
    known: Mapping[str, Sequence[Record]],
    default_of: Mapping[str, Schedule],
    defaults: DefaultConfig,
    records: RecordFile,
    target: Target,
    measure: MeasureConfig | None,
    seed: int,
    budget: int | None,
    sizes: TuneSizes,
) -> int:
    """Measure (and verify) the neighbour of each task's best candidate (at most
    `budget`; one `known` from the records is not measured again), append its record and
    add it to the task's candidates when it is correct; returns how many were measured.
    Neighbours are built as the search's candidates are (`search.builder`: in a worker,
    killed past `measure.build_timeout`)."""
    measured = 0
    config = replace(measure or MeasureConfig(), build_workers=1)
    with contextlib.ExitStack() as stack:
        measurer: Measurer | None = None
        builder: Any = None
        for task in tasks:
            cands = by_task.get(task.key, [])
            if budget is not None and measured >= budget:
                break
            if not cands or cands[0].decisions is None:
                continue
            kernel = sizes.instance(task.kernel)  # a symbolic kernel's: its instance's
            machine = machine_choices(target)
            space = SearchSpace(kernel, config=defaults, machine=machine)
            decisions = {**space.complete(cands[0].decisions), **NEIGHBOUR}
            if builder is None:
                builder = make_builder(target, config)
                stack.callback(builder.close)
            builder.add(task.key, SpaceSpec(kernel, defaults, machine), space)
            (built,) = builder.build(task.key, [decisions], False)
            if not isinstance(built, Built):  # the search's rule: over budget, no candidate
                continue
            trace = tuple(built.trace)
            key = trace_key(trace)
            if key in {trace_key(c.trace) for c in cands}:
                continue
            earlier = [r for r in known.get(task.key, []) if r.trace_key() == key]
            if earlier:  # measured before (an earlier validation): never twice
                if any(r.ok and r.timing == "kernel" for r in earlier):
                    cands.insert(-1, _Candidate("nb", trace, decisions))
                continue
            if measurer is None:  # worker processes only when there is something to time
                measurer = stack.enter_context(sizes.measurer(target, measure))
            reference = sizes.reference(default_of[task.key], target, seed)
            measurer.set_task(task.kernel, *reference, measurer.preludes(task.producers))
            (record,) = measurer.measure(task.key, [list(trace)], seed)
            record = replace(record, decisions=decisions)
            records.append([record])
            measured += 1
            if record.ok:
                cands.insert(-1, _Candidate("nb", record.trace, decisions))
    return measured


def _per_call(model: CompiledModel, feeds: Mapping[str, Any], repeat: int) -> dict[str, float]:
    """Each workload's mean seconds per call in a profile of the model on `feeds`."""
    per_call: dict[str, list[float]] = {}
    for call in model.profile(feeds, repeat=repeat).calls:
        per_call.setdefault(call.workload, []).append(call.seconds)
    return {k: sum(calls) / len(calls) for k, calls in per_call.items()}


def _geomean(values: Sequence[float]) -> float:
    """Their geometric mean (the value itself for one)."""
    return values[0] if len(values) == 1 else math.exp(statistics.fmean(map(math.log, values)))


def deal(sizes: Mapping[str, int], contexts: int, seed: int) -> list[dict[str, int]]:
    """The variants: which candidate of each task (of `sizes[task]`) each one runs. Per
    context, the `max(sizes)` ranks are dealt to consecutive variants with a random
    offset per task and context, so every candidate runs in at least `contexts` variants
    and beside other candidates of the other tasks in each."""
    rng = random.Random(seed)
    ranks = max(sizes.values())
    variants: list[dict[str, int]] = []
    for _ in range(contexts):
        offset = {k: rng.randrange(ranks) for k in sizes}
        variants += [{k: (j + offset[k]) % n for k, n in sizes.items()} for j in range(ranks)]
    return variants


def validate(
    tasks: Sequence[Task],
    records: RecordFile,
    target: Target,
    compile_variant: CompileVariant,
    config: ValidateConfig | None = None,
    measure: MeasureConfig | None = None,
    budget: int | None = None,
    sizes: TuneSizes | None = None,
) -> Validation:
    """Time the tasks' best candidates (and their neighbours, measured with `measure`,
    at most `budget` of them) inside the model, append them as "model" records and
    return the table (tasks without a candidate beside the default are left out).
    `compile_variant` compiles the model for `target` with the given records applied.
    A model with symbolic sizes runs at each of `sizes.measured` (the search's; by
    default sampled as `search.dynamic.tune_sizes` does): a candidate's time per turn is
    the geometric mean over them of its seconds per call."""
    config = config or ValidateConfig()
    sizes = sizes or tune_sizes(tasks, None, config.seed)
    start = time.perf_counter()
    defaults = default_config(target)
    every = records.read(target=target.key())
    of_workload: dict[str, list[Record]] = {}
    for r in every:
        of_workload.setdefault(r.workload, []).append(r)
    default_of = {t.key: default_schedule(t.kernel, defaults, t.at) for t in tasks}
    by_task = {
        t.key: _candidates(of_workload.get(t.key, []), default_of[t.key], config.top) for t in tasks
    }
    measured = 0
    if config.neighbours:
        measured = _neighbours(
            tasks, by_task, of_workload, default_of, defaults, records, target, measure,
            config.seed, budget, sizes,
        )  # fmt: skip
    by_task = {k: c for k, c in by_task.items() if len(c) > 1}
    if not by_task:
        return Validation((), time.perf_counter() - start, measured)
    others = [r for k, r in best_records(every, target.key()).items() if k not in by_task]

    def variant(dealt: Mapping[str, int]) -> CompiledModel:
        # one record per workload: compile applies it whatever its latency says
        chosen = [
            Record(workload=k, target=target.key(), trace=c[dealt[k]].trace, latencies=(1.0,))
            for k, c in by_task.items()
        ]
        return compile_variant([*others, *chosen])

    def dealt_variants() -> list[dict[str, int]]:
        return deal({k: len(c) for k, c in by_task.items()}, config.contexts, config.seed)

    deals = dealt_variants()
    compiled = [variant(deals[0])]
    budget_bytes = config.memory_budget()
    size = compiled[0].manifest.arena_bytes + sum(c.nbytes for c in compiled[0].constants)
    if budget_bytes is not None and len(deals) * size > budget_bytes:
        ranks = max(2, budget_bytes // (size * config.contexts))
        warnings.warn(
            f"validate: {len(deals)} variants of the model at {size / 2**20:.0f} MB each "
            f"exceed the memory budget of {budget_bytes / 2**20:.0f} MB; timing each task's "
            f"best {ranks - 1} candidate(s) and its default instead",
            stacklevel=2,
        )
        by_task = {
            k: c if len(c) <= ranks else [*c[: ranks - 1], c[-1]] for k, c in by_task.items()
        }
        deals = dealt_variants()
        compiled = [variant(deals[0])]
    compiled += [variant(dealt) for dealt in deals[1:]]
    at = sizes.measured or ({},)
    feeds = [compiled[0].random_inputs(config.seed, s or None) for s in at]
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(config.rounds):
        for dealt, m in zip(deals, compiled, strict=True):
            per_feed = [_per_call(m, f, config.repeat) for f in feeds]
            for key in by_task:
                if all(key in per_call for per_call in per_feed):
                    seconds = [per_call[key] for per_call in per_feed]
                    samples.setdefault((key, dealt[key]), []).append(_geomean(seconds))
    stamp = time.time()
    rows, written = [], []
    for task in tasks:
        cands = by_task.get(task.key)
        if cands is None:
            continue
        if any((task.key, i) not in samples for i in range(len(cands))):
            warnings.warn(
                f"validate: task {task.index} ({task.kind}) ran in no profiled call; "
                "its candidates are left as they were",
                stacklevel=2,
            )
            continue
        times = [samples[(task.key, i)] for i in range(len(cands))]
        medians = [statistics.median(s) for s in times]
        chosen = min(range(len(cands)), key=medians.__getitem__)
        rows.append(ValidatedTask(task.index, task.key, tuple(c.label for c in cands),
                                  tuple(medians), chosen))  # fmt: skip
        timed = tuple(sizes.of(task.kernel)) if task.kernel.params else ()
        written += [
            Record(workload=task.key, target=target.key(), trace=c.trace, latencies=tuple(s),
                   seed=config.seed, timestamp=stamp, decisions=c.decisions, timing="model",
                   sizes=timed)
            for c, s in zip(cands, times, strict=True)
        ]  # fmt: skip
    records.append(written)
    return Validation(tuple(rows), time.perf_counter() - start, measured)
