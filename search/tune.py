"""`tune`: search schedules for every task of a model and append the measurements to a
records file, which `compile(records=...)` applies.

Per round, the task scheduler picks a task and the strategy proposes a batch of new
candidates (never one already in the records); the measurer builds, verifies and times
them; the records are appended and fsynced. The default schedule is measured first for
every task: it is the baseline and the reference every candidate's outputs are checked
against.

- Task scheduling (Ansor's gradient allocation): a round-robin warm-up gives every task
  its baseline and one batch (an equal share of the trials instead, when they cannot
  pay a batch for every task: `round_budget`); then, with probability `task_epsilon` a
  random task, else the task whose next trials are expected to shorten the model most:
  weight × (α × the recent slope of its best latency + (1 − α) × an optimistic guess,
  min(−latency / trials, β × FLOPs / best throughput of its kind − latency)).
- Evolutionary strategy: the population holds the measured candidates (those of earlier
  runs too, from the records' decisions) and the sketch's default decisions; a proposal
  mutates one of the best eight or is a fresh sample; `pool` × batch distinct legal
  proposals are built, the cost model ranks them, and the batch is its top ones plus an
  `epsilon` share picked at random. Up to `BORROW` places of each batch go to the best
  decisions of the other tasks of the same kind, completed into this task's space (the
  model's top ones of those not yet measured): tasks of one model share structure, and a
  lightly-weighted task gets few trials of its own. The model is retrained after every
  round on every measured candidate (normalized per task), and pre-trained from the
  records on resume.
- Random strategy: the batch is fresh samples, unranked (the comparison baseline).

Candidates are built (and their feature rows computed) in worker processes killed past
`MeasureConfig.build_timeout` (`builder`): a build hung in one long isl call costs its
candidate, a `budget` record, not the tune. Where the time goes (building, ranking,
measuring, refitting, ...) is kept per part (`summary.Clock`) and reported with the result.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polytile.codegen.configs import default_config, lower_config
from polytile.codegen.target import Target, host, machine_choices
from polytile.errors import BudgetExceeded, InputError, TuningError
from polytile.frontend.importer import ModelSource
from polytile.poly.default.schedule import default_schedule

from .builder import Built, SpaceSpec, make_builder
from .cost_model import MODELS, CostModel, GBModel, PretrainedModel, RandomModel, load_model
from .dynamic import SizesConfig, check_resumed, tune_sizes
from .measure import MeasureConfig, Measurer
from .records import Record, RecordFile, trace_key
from .space import Decisions, SearchSpace
from .state import TaskState, decisions_key
from .summary import MIN_GAIN as MIN_GAIN  # the early stop's, named here as before
from .summary import Clock, EarlyStop, TaskSummary, TuneResult
from .tasks import Task, extract_tasks, select_tasks
from .validate import ValidateConfig, validate

if TYPE_CHECKING:
    from polytile.frontend import Graph
    from polytile.runtime import CompiledModel

STRATEGIES = ("evolutionary", "random")
#: Ansor's task-gradient weights: the recent slope against the optimistic guess
ALPHA, BETA = 0.2, 2.0
#: trials in the backward window of the slope
WINDOW = 8
#: parents a mutation is drawn from, and how often a proposal mutates one
PARENTS, MUTATE = 8, 0.7
#: batch slots per round for the best decisions of the model's other tasks of the same
#: kind, tried on this one: another task's best can beat a task's own, above all for a
#: lightly-weighted task that gets few trials of its own
BORROW = 2
#: measured candidates of earlier runs replayed per task to pre-train the cost model
PRETRAIN = 256
#: built candidates kept per task (mutations revisit decisions)
BUILT_CACHE = 4096
#: rounds in a row with only builds over budget after which a task is left alone
IDLE = 3


class Tuner:
    def __init__(
        self,
        tasks: Sequence[Task],
        records: RecordFile,
        target: Target,
        seed: int = 0,
        strategy: str = "evolutionary",
        measure: MeasureConfig | None = None,
        batch: int = 8,
        epsilon: float = 0.2,
        model: CostModel | None = None,
        pool: int = 6,
        task_epsilon: float = 0.05,
        start_from_default: bool = True,
        sizes: SizesConfig | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InputError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
        if batch < 1 or pool < 1:
            raise InputError(f"tune: batch and pool must be at least 1, got {batch}, {pool}")
        self.records = records
        self.target = target
        self.seed = seed
        self.strategy = strategy
        self.measure_config = measure or MeasureConfig()
        self.batch = batch
        self.epsilon = epsilon
        self.pool = pool
        self.task_epsilon = task_epsilon
        #: the default schedule's decisions seed the population (off: samples only)
        self.start_from_default = start_from_default
        self.rng = random.Random(seed)
        # the shipped pre-trained model, as `tune` and the CLI use (pass one to choose)
        self.model: CostModel = model if model is not None else PretrainedModel(seed=seed)
        #: where candidates are built: killable workers unless `build_timeout` is None
        self.builder = make_builder(target, self.measure_config)
        #: where the tune's time goes (`summary.PARTS`)
        self.clock = Clock()
        #: where tasks with symbolic sizes are sampled and timed (`search.dynamic`)
        self.sizes = tune_sizes(tasks, sizes, seed)
        config = default_config(target)
        machine = machine_choices(target)
        self.states: list[TaskState] = []
        previous: dict[str, list[Record]] = {}
        for r in records.read(target=target.key()):
            if r.timing == "kernel":  # in-model times do not compare with the search's
                previous.setdefault(r.workload, []).append(r)
        others = sorted(
            {r.start or "unknown" for rs in previous.values() for r in rs if r.ok}
            - {self.measure_config.start}
        )
        if others:
            warnings.warn(
                f"tuning records {records.path}: some candidates were timed "
                f"{' or '.join(others)}, this run times them {self.measure_config.start}; "
                "their latencies are compared as they are",
                stacklevel=2,
            )
        check_resumed(previous, tasks, self.sizes, records.path)
        for task in tasks:
            task, kernel = self.sizes.task(task), self.sizes.instance(task.kernel)
            state = TaskState(
                task,
                SearchSpace(kernel, config=config, machine=machine),
                default_schedule(task.kernel, config, task.at),  # as compile's
            )
            self.builder.add(task.key, SpaceSpec(kernel, config, machine), state.space)
            self._resume(state, previous.get(task.key, []))
            self.states.append(state)
        if self.strategy == "evolutionary" and any(s.measured for s in self.states):
            self._retrain()

    def _resume(self, state: TaskState, records: list[Record]) -> None:
        """Earlier measurements of the task: never repeated, in the population, and (the
        latest PRETRAIN of them, replayed) training the cost model."""
        replayed = [
            i
            for i in range(max(0, len(records) - PRETRAIN), len(records))
            if self.strategy == "evolutionary" and records[i].error != "budget"
        ]
        # replayed where candidates are built (a replay is a build); None: not replayable
        made = self.builder.rows(state.task.key, [records[i].trace for i in replayed])
        rows = dict(zip(replayed, made, strict=True))
        for i, r in enumerate(records):
            row = rows.get(i)
            decisions = state.space.complete(r.decisions) if r.decisions is not None else None
            state.add(r, decisions, row)
        state.rounds = 1 if state.trials else 0

    # --- proposals --------------------------------------------------------------------
    def _parents(self, state: TaskState) -> list[Mapping[str, Any]]:
        ranked = sorted(
            (m for m in state.measured if m.decisions is not None and m.latency < float("inf")),
            key=lambda m: m.latency,
        )
        parents = [m.decisions for m in ranked[:PARENTS] if m.decisions is not None]
        if parents or not self.start_from_default:
            return parents
        return [state.space.default_decisions()]

    def _default_decisions(self, state: TaskState) -> Decisions | None:
        """The sketch's decisions that build the default schedule, if they do."""
        decisions = state.space.default_decisions()
        built = self._build(state, decisions)
        same = built is not None and trace_key(built.trace) == state.default_key
        return decisions if same else None

    def _build(self, state: TaskState, decisions: Decisions) -> Built | None:
        return self._build_many(state, [decisions])[0]

    def _build_many(
        self, state: TaskState, jobs: list[Decisions], limit: int | None = None
    ) -> list[Built | None]:
        """The candidates of `jobs` (each built once while kept; the new ones together, in
        the builder's workers); None where a build went over budget, now (its `budget`
        record appended, a trial of this round, unless `limit` such trials were reached
        already this round) or before."""
        todo: dict[str, Decisions] = {}
        for decisions in jobs:
            key = decisions_key(decisions)
            if key not in state.refused and key not in state.built and key not in state.held:
                todo.setdefault(key, decisions)
        if todo:
            if len(state.built) + len(todo) > BUILT_CACHE:  # bound the memory
                state.built.clear()
            with self.clock.part("build"):
                outcomes = self.builder.build(
                    state.task.key, list(todo.values()), self.strategy == "evolutionary"
                )
            for (key, decisions), outcome in zip(todo.items(), outcomes, strict=True):
                if isinstance(outcome, Built):
                    state.built[key] = outcome
                else:
                    state.held[key] = (decisions, outcome)
        for decisions in jobs:  # refusals in order, as many as this round has trials for
            key = decisions_key(decisions)
            if key in state.held and (limit is None or len(state.over) < limit):
                self._refuse(state, *state.held.pop(key))
        return [state.built.get(decisions_key(d)) for d in jobs]

    def _refuse(self, state: TaskState, decisions: Decisions, err: BudgetExceeded) -> None:
        """A build over budget: its record (a trial), and its decisions never built again."""
        record = Record(
            workload=state.task.key,
            target=self.target.key(),
            trace=tuple(err.trace),
            error="budget",
            message=str(err)[:2000],
            seed=self.seed,
            decisions=dict(decisions),
        )
        with self.clock.part("records"):
            self.records.append([record])
        state.add(record, decisions, None)
        state.over.append(record)

    def _borrowed(self, state: TaskState, exclude: frozenset[str] = frozenset()) -> list[Built]:
        """The best decisions of the other tasks of the same kind, as candidates of this
        one that were never measured nor are in `exclude` (one per distinct trace)."""
        jobs = []
        for other in self.states:
            if other is state or other.task.kind != state.task.kind:
                continue
            measured = [m for m in other.measured if m.decisions is not None]
            if not measured:
                continue
            best = min(measured, key=lambda m: m.latency)
            if best.latency == float("inf"):
                continue
            jobs.append(state.space.complete(best.decisions))
        found: dict[str, Built] = {}
        for candidate in self._build_many(state, jobs):
            if candidate is None:
                continue
            key = trace_key(candidate.trace)
            if key not in state.seen and key not in exclude:
                found.setdefault(key, candidate)
        return list(found.values())

    def propose(
        self, state: TaskState, count: int, exclude: frozenset[str] = frozenset()
    ) -> list[Built]:
        """`count` candidates never measured and not in `exclude` (the traces already in
        this batch), all distinct; fewer by the builds over budget meanwhile (trials too:
        once they fill the batch, proposing stops). The decisions still wanted are drawn
        together and built together (in parallel with several build workers)."""
        found: list[Built] = []
        keys: set[str] = set(exclude)
        evolutionary = self.strategy == "evolutionary"
        borrowed = self._borrowed(state, exclude) if evolutionary and count > 1 else []
        keys.update(trace_key(c.trace) for c in borrowed)
        pool = self.pool * count if evolutionary else count
        parents = self._parents(state) if evolutionary else []
        attempts = 0
        while len(found) < pool and attempts < 40 * pool and len(state.over) < count:
            jobs = []
            for _ in range(min(pool - len(found), 40 * pool - attempts)):
                attempts += 1
                if parents and self.rng.random() < MUTATE:
                    jobs.append(state.space.mutate(self.rng.choice(parents), self.rng))
                else:
                    jobs.append(state.space.sample(self.rng))
            for candidate in self._build_many(state, jobs, limit=count):
                if candidate is None:
                    continue
                key = trace_key(candidate.trace)
                if key in state.seen or key in keys:
                    continue
                keys.add(key)
                found.append(candidate)
        count -= min(len(state.over), count)
        if borrowed and count > 1:
            with self.clock.part("rank"):
                scores = self.model.predict_rows(self._features(borrowed))
            order = [int(i) for i in np.argsort(-scores, kind="stable")]
            taken = [borrowed[i] for i in order[: min(BORROW, count - 1)]]
            return [*taken, *self._ranked(found, count - len(taken))]
        if not evolutionary or len(found) <= count:
            return found[:count]
        return self._ranked(found, count)

    @staticmethod
    def _features(candidates: list[Built]) -> list[tuple[float, ...]]:
        """The candidates' feature rows (computed where they were built)."""
        rows = [c.row for c in candidates]
        assert all(r is not None for r in rows), "an evolutionary build has its features"
        return rows  # type: ignore[return-value]

    def _ranked(self, found: list[Built], count: int) -> list[Built]:
        """The cost model's top `count` of `found`, less an epsilon share picked at random."""
        if len(found) <= count:
            return found
        with self.clock.part("rank"):
            scores = self.model.predict_rows(self._features(found))
        order = [int(i) for i in np.argsort(-scores, kind="stable")]
        explore = round(self.epsilon * count)
        chosen = order[: count - explore]
        rest = order[count - explore :]
        self.rng.shuffle(rest)
        return [found[i] for i in [*chosen, *rest[:explore]]]

    def _retrain(self) -> None:
        """Fit every measured candidate's throughput, normalized by its task's best."""
        rows, scores, groups = [], [], []
        for state in self.states:
            best = state.latency
            for m in state.measured:
                if m.row is not None:
                    rows.append(m.row)
                    scores.append(best / m.latency if m.latency < float("inf") else 0.0)
                    groups.append(state.task.key)
        self.model.fit_rows(rows, scores, groups)

    # --- task scheduling --------------------------------------------------------------
    def gradient(self, state: TaskState) -> float:
        """Ansor's estimate of how fast the model's latency falls per trial spent on the
        task (negative: it falls)."""
        history = state.history
        trials = len(history)
        latency = history[-1]
        window = min(WINDOW, trials - 1)
        slope = (latency - history[-1 - window]) / window if window > 0 else 0.0
        kin = [s for s in self.states if s.task.kind == state.task.kind and s.best is not None]
        speed = max(s.task.flops / s.latency for s in kin)
        optimistic = -latency / trials
        if speed > 0:  # tasks that only move data (no FLOPs) have no throughput to reach
            optimistic = min(optimistic, BETA * state.task.flops / speed - latency)
        return state.task.weight * (ALPHA * slope + (1 - ALPHA) * optimistic)

    def estimate(self) -> float:
        """The model's latency as its tasks add up: Σ weight × best (inf before every task
        has been measured)."""
        return sum(s.task.weight * s.latency for s in self.states)

    def round_budget(self, state: TaskState, budget: int) -> int:
        """The trials `state`'s next round may take of the `budget` left. A warm-up round
        takes an equal share among the tasks still waiting for theirs (at least one: the
        baseline), so that a budget smaller than a batch per task still measures every
        task's default before the gradient allocates the rest."""
        waiting = sum(1 for s in self.states if not s.done and s.rounds == 0)
        if state.rounds == 0 and waiting:
            return min(budget, max(1, budget // waiting))
        return budget

    def next_task(self) -> TaskState | None:
        live = [s for s in self.states if not s.done]
        if not live:
            return None
        fresh = [s for s in live if s.baseline is None or s.rounds == 0]
        if fresh:
            return fresh[0]
        if self.rng.random() < self.task_epsilon:
            return self.rng.choice(live)
        return min(live, key=self.gradient)

    # --- the loop ---------------------------------------------------------------------
    def run_round(
        self, measurer: Measurer, state: TaskState, budget: int | None = None
    ) -> list[Record]:
        """Measure one batch (at most `budget` candidates) of a task's candidates."""
        batch = min(self.batch, budget) if budget is not None else self.batch
        task = state.task
        with self.clock.part("reference"):
            if state.reference is None:  # the default schedule's outputs, computed once
                state.reference = self.sizes.reference(state.default, self.target, self.seed)
            if measurer.task_key != task.key:
                before = measurer.preludes(task.producers)
                measurer.set_task(task.kernel, *state.reference, before)
                measurer.task_key = task.key
        state.over = []
        traces: list[list[dict[str, Any]]] = []
        candidates: list[Built | None] = []
        default_decisions = None
        if state.baseline is None:
            traces.append(state.default_trace)
            candidates.append(None)
            if self.start_from_default:  # built first: over budget, a trial of this batch
                default_decisions = self._default_decisions(state)
        batched = frozenset(trace_key(t) for t in traces)
        for candidate in self.propose(state, batch - len(traces), batched):
            traces.append(candidate.trace)
            candidates.append(candidate)
        state.rounds += 1
        state.idle = state.idle + 1 if not traces else 0
        if not traces:  # nothing left to measure, or for a while only builds over budget
            state.done = not state.over or state.idle >= IDLE
            return list(state.over)
        with self.clock.part("measure"):
            measured = measurer.measure(task.key, traces, self.seed)
        for span in measurer.spans:  # the workers' own parts of measuring
            if span.phase in ("build", "time"):
                self.clock.add("compile" if span.phase == "build" else "run", span.end - span.start)
        records = []
        for record, candidate in zip(measured, candidates, strict=True):
            if candidate is None:
                if not record.ok:
                    raise TuningError(
                        f"task {task.index}: the default schedule failed ({record.error}: "
                        f"{record.message})"
                    )
                decisions = default_decisions
            else:
                decisions = dict(candidate.decisions)
            records.append(replace(record, decisions=decisions))
            row = None
            if self.strategy == "evolutionary":  # built candidates have theirs already
                if candidate is not None:
                    row = self._features([candidate])[0]
                else:
                    with self.clock.part("build"):
                        row = self.builder.rows(task.key, [state.default_trace])[0]
            state.add(records[-1], decisions, row)
        with self.clock.part("records"):
            self.records.append(records)
        if self.strategy == "evolutionary":
            with self.clock.part("model"):
                self._retrain()
        return [*state.over, *records]

    def summary(self, seconds: float, trials: int) -> TuneResult:
        rows = []
        for s in self.states:
            default_ms = s.baseline.latency * 1e3 if s.baseline else float("nan")
            best_ms = s.best.latency * 1e3 if s.best else float("nan")
            rows.append(
                TaskSummary(
                    s.task.index, s.task.kind, s.task.flops, s.task.weight, s.trials,
                    default_ms, best_ms,
                )
            )  # fmt: skip
        return TuneResult(tuple(rows), trials, seconds, time=dict(self.clock.seconds))

    def close(self) -> None:
        """Stop the build workers."""
        self.builder.close()

    def __enter__(self) -> Tuner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tune(
    model: ModelSource,
    trials: int,
    records: str,
    seed: int = 0,
    tasks: str | None = None,
    time_budget: float | None = None,
    strategy: str = "evolutionary",
    num_threads: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    measure: MeasureConfig | None = None,
    batch: int = 8,
    progress: bool = True,
    cost_model: str | None = None,
    pool: int = 6,
    cost_model_kind: str = "pretrained",
    start_from_default: bool = True,
    validation: ValidateConfig | None = None,
    compile_model: Callable[..., CompiledModel] | None = None,
    early_stopping: int | None = None,
    sizes: SizesConfig | None = None,
    graph: Graph | None = None,
) -> TuneResult:
    """Tune a model's tasks for `trials` measurements (or `time_budget` seconds) in total,
    appending every measurement to the JSONL file `records`; resumes from it. Then, with
    `validation`, each task's best candidates (and a neighbour of its best, measured as a
    trial within `trials`) are timed inside the model and the fastest there is what
    `compile` applies (`search.validate`); `trials=0` only validates (and measures the
    neighbours beyond any budget). With
    `cost_model`, the model is loaded from that file when it exists (it is a pickle: load
    only your own) and saved there at the end; otherwise a new `cost_model_kind` model
    is trained: "pretrained" (the default: the shipped rows plus this tune's, see
    `cost_model.PretrainedModel`), "regression", "ranking" or "random".
    `start_from_default=False` makes the evolutionary population start from samples only
    (an ablation). Validation compiles the model with `compile_model` (`polytile.compile`,
    which `polytile.tune` passes: the compiler is a later stage than the search). With
    `early_stopping` N the search ends once the estimated model latency has not improved
    during N trials (`EarlyStop`); validation still follows.

    A model with symbolic sizes is tuned on `graph`, the graph `polytile.compiler.imported`
    gives (which `polytile.tune` passes, from inside its block), its tasks at `sizes`
    (`search.dynamic`: sampled at one size, each candidate timed at a few, its cost the
    geometric mean of their latencies), and validated in the model at those sizes."""
    if trials < 0 or (trials == 0 and validation is None):
        raise InputError(f"tune: trials must be at least 1 (0 only with validation), got {trials}")
    if early_stopping is not None and early_stopping < 1:
        raise InputError(f"tune: early_stopping must be at least 1 trial, got {early_stopping}")
    if validation is not None and compile_model is None:
        raise InputError(
            "tune: in-model validation compiles the model: pass compile_model "
            "(polytile.compile), or call polytile.tune"
        )
    target = host(num_threads)

    def variant(records: Sequence[Record]) -> CompiledModel:
        assert compile_model is not None
        return compile_model(model, records=records, input_shapes=input_shapes, target=target)

    setup = time.perf_counter()
    source = graph if graph is not None else model
    all_tasks = extract_tasks(source, input_shapes, lower_config(target))
    if trials == 0 and validation is not None:  # no search: no tuner to build and train
        start = time.perf_counter()
        chosen = select_tasks(all_tasks, tasks)
        at = tune_sizes(chosen, sizes, seed)
        checked = validate(
            chosen, RecordFile(records), target, variant, validation, measure, sizes=at
        )
        return TuneResult((), checked.trials, time.perf_counter() - start, checked)
    if cost_model_kind not in (*MODELS, "random"):
        raise InputError(
            f"tune: cost_model_kind must be one of {(*MODELS, 'random')}, not {cost_model_kind!r}"
        )
    learned: CostModel
    if cost_model is not None and Path(cost_model).exists():
        learned = load_model(cost_model)
    elif cost_model_kind == "random":
        learned = RandomModel(seed)
    else:
        learned = MODELS[cost_model_kind](seed)
    tuner = Tuner(
        select_tasks(all_tasks, tasks),
        RecordFile(records),
        target,
        seed,
        strategy,
        measure,
        batch,
        model=learned,
        pool=pool,
        start_from_default=start_from_default,
        sizes=sizes,
    )
    try:
        start = time.perf_counter()
        result = _search(tuner, target, trials, time_budget, validation, variant, progress,
                         cost_model, early_stopping)  # fmt: skip
    finally:
        tuner.close()
    return replace(result, setup=start - setup)


def _search(
    tuner: Tuner,
    target: Target,
    trials: int,
    time_budget: float | None,
    validation: ValidateConfig | None,
    variant: Callable[[Sequence[Record]], CompiledModel],
    progress: bool,
    cost_model: str | None,
    early_stopping: int | None,
) -> TuneResult:
    """`tune`'s search loop and validation, with `tuner` made."""
    start = time.perf_counter()
    used = 0
    # the validation's neighbours are trials too: one per task, at most a tenth of them
    neighbours = validation is not None and validation.neighbours
    search = trials - (min(len(tuner.states), trials // 10) if neighbours else 0)
    bar = None
    if progress and trials:
        from tqdm import tqdm

        bar = tqdm(total=search, desc="tune", unit="trial")
    plateau = EarlyStop(early_stopping) if early_stopping is not None else None
    stopped = False
    measurer = tuner.sizes.measurer(target, tuner.measure_config)
    try:
        while used < search:
            if time_budget is not None and time.perf_counter() - start > time_budget:
                break
            state = tuner.next_task()
            if state is None:
                break
            done = tuner.run_round(measurer, state, tuner.round_budget(state, search - used))
            used += len(done)
            if bar is not None:
                bar.update(len(done))
                bar.set_postfix(task=state.task.index, best_ms=f"{state.latency * 1e3:.3f}")
            if plateau is not None and plateau.stop(tuner.estimate(), used):
                stopped = True
                break
    finally:
        with tuner.clock.part("measure"):  # its workers stopped
            measurer.close()
    if bar is not None:
        bar.close()
    with tuner.clock.part("build"):  # the build workers are done: validation compiles
        tuner.close()
    if cost_model is not None and isinstance(tuner.model, GBModel):
        tuner.model.save(cost_model)
    checked = None
    if validation is not None:
        if progress:
            print("timing the best candidates inside the model ...", flush=True)
        chosen = [s.task for s in tuner.states]
        with tuner.clock.part("validate"):
            checked = validate(
                chosen, tuner.records, target, variant, validation, tuner.measure_config,
                budget=trials - used, sizes=tuner.sizes,
            )  # fmt: skip
        used += checked.trials
    summary = tuner.summary(time.perf_counter() - start, used)
    return replace(summary, validation=checked, stopped_early=stopped)
