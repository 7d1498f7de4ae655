"""`tune`: search schedules for every task of a model and append the measurements to a
records file, which `compile(records=...)` applies.

Per round, the task scheduler picks a task (round-robin warm-up, then the task whose
weighted best latency is largest: where a gain shortens the model most, Ansor's greedy
allocation), the strategy proposes a batch of new candidates (never one already in the
records), the measurer builds, verifies and times them, and the records are appended and
fsynced. The default schedule is measured first for every task: it is the baseline and
the reference every candidate's outputs are checked against.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import Target, host
from polytile.errors import InputError, TuningError
from polytile.frontend.importer import ModelSource
from polytile.poly.default import DefaultConfig, default_schedule
from polytile.poly.kernel import Role
from polytile.poly.schedule import Schedule

from .cost_model import CostModel, GBModel, features
from .measure import MeasureConfig, Measurer
from .records import Record, RecordFile, trace_key
from .space import Candidate, SearchSpace
from .tasks import Task, extract_tasks, select_tasks

STRATEGIES = ("evolutionary", "random")


@dataclass
class TaskState:
    task: Task
    space: SearchSpace
    #: the default schedule: the baseline and, run natively, the verification oracle
    default: Schedule
    seen: set[str] = field(default_factory=set)
    best: Record | None = None
    baseline: Record | None = None
    trials: int = 0
    #: candidates measured in this run: (candidate, normalized score, feature row)
    measured: list[tuple[Candidate, float, list[float]]] = field(default_factory=list)
    done: bool = False
    #: random inputs and the default schedule's outputs on them (the verification oracle)
    reference: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None

    @property
    def latency(self) -> float:
        return self.best.latency if self.best is not None else float("inf")

    @property
    def default_trace(self) -> list[dict[str, Any]]:
        return self.default.trace_json()


@dataclass(frozen=True)
class TaskSummary:
    index: int
    kind: str
    flops: int
    weight: int
    trials: int
    default_ms: float
    best_ms: float

    @property
    def gflops(self) -> float:
        return self.flops / (self.best_ms / 1e3) / 1e9 if self.best_ms > 0 else 0.0


@dataclass(frozen=True)
class TuneResult:
    tasks: tuple[TaskSummary, ...]
    trials: int
    seconds: float

    def estimated_ms(self, tuned: bool) -> float:
        """Σ weight × kernel latency: the model's latency as the tasks add it up."""
        return sum(t.weight * (t.best_ms if tuned else t.default_ms) for t in self.tasks)

    def table(self) -> str:
        head = (
            f"{'ID':>3} | {'kind':<18} | {'FLOPs':>12} | {'weight':>6} | {'GFLOPS':>8} | "
            f"{'default ms':>10} | {'best ms':>9} | {'trials':>6}"
        )
        lines = [head, "-" * len(head)]
        for t in self.tasks:
            lines.append(
                f"{t.index:>3} | {t.kind:<18.18} | {t.flops:>12} | {t.weight:>6} | "
                f"{t.gflops:>8.2f} | {t.default_ms:>10.4f} | {t.best_ms:>9.4f} | {t.trials:>6}"
            )
        lines.append(
            f"estimated model latency: default {self.estimated_ms(False):.3f} ms → "
            f"tuned {self.estimated_ms(True):.3f} ms ({self.trials} trials, {self.seconds:.0f} s)"
        )
        return "\n".join(lines)


def _inputs(task: Task, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    found = {}
    for t in task.kernel.tensors.values():
        if t.role is Role.INPUT:
            if np.dtype(t.dtype).kind == "f":
                found[t.name] = rng.standard_normal(t.shape).astype(t.dtype)
            else:
                found[t.name] = rng.integers(0, 3, t.shape).astype(t.dtype)
    return found


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
    ) -> None:
        if strategy not in STRATEGIES:
            raise InputError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
        self.records = records
        self.target = target
        self.seed = seed
        self.strategy = strategy
        self.measure_config = measure or MeasureConfig()
        self.batch = batch
        self.epsilon = epsilon
        self.rng = random.Random(seed)
        self.model: CostModel = model if model is not None else GBModel(seed=seed)
        lanes = target.lanes("float32")
        config = DefaultConfig(vector_width=lanes, threads=target.num_threads)
        self.states = []
        previous: dict[str, list[Record]] = {}
        for r in records.read(target=target.key()):
            previous.setdefault(r.workload, []).append(r)
        for task in tasks:
            state = TaskState(
                task,
                SearchSpace(task.kernel, lanes),
                default_schedule(task.kernel, config),
            )
            for r in previous.get(task.key, []):
                state.seen.add(r.trace_key())
                state.trials += 1
                if r.ok and (state.best is None or r.latency < state.best.latency):
                    state.best = r
                if r.ok and trace_key(r.trace) == trace_key(state.default_trace):
                    state.baseline = r
            self.states.append(state)

    # --- proposals --------------------------------------------------------------------
    def propose(self, state: TaskState, count: int) -> list[Candidate]:
        found: list[Candidate] = []
        keys: set[str] = set()
        pool = 4 * count if self.strategy == "evolutionary" else count
        attempts = 0
        parents = sorted(state.measured, key=lambda m: -m[1])[:8]
        while len(found) < pool and attempts < 40 * pool:
            attempts += 1
            if self.strategy == "evolutionary" and parents and self.rng.random() < 0.6:
                parent = self.rng.choice(parents)[0]
                decisions = state.space.mutate(parent.decisions, self.rng)
            else:
                decisions = state.space.sample(self.rng)
            candidate = state.space.build(decisions)
            key = trace_key(candidate.trace)
            if key in state.seen or key in keys:
                continue
            keys.add(key)
            found.append(candidate)
        if self.strategy == "random" or len(found) <= count:
            return found[:count]
        scores = self.model.predict_rows([features(state.space, c) for c in found])
        order = list(np.argsort(-scores))
        explore = round(self.epsilon * count)
        chosen = order[: count - explore]
        rest = order[count - explore :]
        self.rng.shuffle(rest)
        return [found[i] for i in [*chosen, *rest[:explore]]]

    def _retrain(self) -> None:
        rows, scores = [], []
        for state in self.states:
            for _, score, row in state.measured:
                rows.append(row)
                scores.append(score)
        self.model.fit_rows(rows, scores)

    # --- the loop ---------------------------------------------------------------------
    def next_task(self) -> TaskState | None:
        live = [s for s in self.states if not s.done]
        if not live:
            return None
        fresh = [s for s in live if s.best is None or s.baseline is None]
        if fresh:
            return fresh[0]
        return max(live, key=lambda s: s.task.weight * s.latency)

    def run_round(
        self, measurer: Measurer, state: TaskState, budget: int | None = None
    ) -> list[Record]:
        """Measure one batch (at most `budget` candidates) of a task's candidates."""
        batch = min(self.batch, budget) if budget is not None else self.batch
        task = state.task
        if state.reference is None:  # the default schedule's outputs, computed once
            inputs = _inputs(task, self.seed)
            native = NativeKernel(state.default, self.target)
            buffers = native(inputs)
            state.reference = (inputs, {t.name: buffers[t.name] for t in task.kernel.outputs()})
        if measurer.task_key != task.key:
            measurer.set_task(task.kernel, *state.reference)
            measurer.task_key = task.key
        traces: list[list[dict[str, Any]]] = []
        candidates: list[Candidate | None] = []
        if state.baseline is None:
            traces.append(state.default_trace)
            candidates.append(None)
        for candidate in self.propose(state, batch - len(traces)):
            traces.append(candidate.trace)
            candidates.append(candidate)
        if not traces:
            state.done = True
            return []
        records = measurer.measure(task.key, traces, self.seed)
        self.records.append(records)
        for record, candidate in zip(records, candidates, strict=True):
            state.seen.add(record.trace_key())
            state.trials += 1
            if candidate is None:
                if not record.ok:
                    raise TuningError(
                        f"task {task.index}: the default schedule failed ({record.error}: "
                        f"{record.message})"
                    )
                state.baseline = record
            if record.ok and (state.best is None or record.latency < state.best.latency):
                state.best = record
        best = state.latency
        for record, candidate in zip(records, candidates, strict=True):
            if candidate is not None:
                score = best / record.latency if record.ok else 0.0
                state.measured.append((candidate, score, features(state.space, candidate)))
        if self.strategy == "evolutionary":
            self._retrain()
        return records

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
        return TuneResult(tuple(rows), trials, seconds)


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
) -> TuneResult:
    """Tune a model's tasks for `trials` measurements (or `time_budget` seconds) in total,
    appending every measurement to the JSONL file `records`; resumes from it."""
    if trials < 1:
        raise InputError(f"tune: trials must be at least 1, got {trials}")
    target = host(num_threads)
    all_tasks = extract_tasks(model, input_shapes)
    tuner = Tuner(
        select_tasks(all_tasks, tasks), RecordFile(records), target, seed, strategy, measure, batch
    )
    start = time.perf_counter()
    used = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=trials, desc="tune", unit="trial")
    with Measurer(target, tuner.measure_config) as measurer:
        while used < trials:
            if time_budget is not None and time.perf_counter() - start > time_budget:
                break
            state = tuner.next_task()
            if state is None:
                break
            done = tuner.run_round(measurer, state, trials - used)
            used += len(done)
            if bar is not None:
                bar.update(len(done))
                bar.set_postfix(task=state.task.index, best_ms=f"{state.latency * 1e3:.3f}")
    if bar is not None:
        bar.close()
    return tuner.summary(time.perf_counter() - start, used)
