"""Candidate builds in killable worker processes.

Building a candidate (the sketch's steps, their legality checks, AST generation and its
checks) runs under the isl budgets of `search.budget`, but isl notices them only when it
allocates, and one long isl call (a lexmin) holds the interpreter: in the tuner's process
it would hang the tune. So candidates are built, and their cost-model features computed,
in worker processes (fresh interpreters running this module, like the measurer's), at
most `MeasureConfig.build_timeout` seconds each: past it the worker is killed and
replaced, and the candidate is over budget (`BudgetExceeded`, with no trace: where it
stopped is unknown), which the tuner records as a `budget` error and never builds again.

A worker receives each task's kernel and space settings once and rebuilds the
`SearchSpace` itself; a build sends back only the trace (JSON) and the feature row, so
nothing of isl crosses the pipe. Results are the same as building in the tuner's process
(`LocalBuilder`, used with `build_timeout=None`): both run `_build` and `_row`. A batch
of builds is spread over `build_workers` workers.
"""

from __future__ import annotations

import sys
import time
import traceback
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from polytile.codegen.target import MachineChoices, Target
from polytile.errors import BudgetExceeded, IllegalSchedule, TuningError
from polytile.poly.default.steps import DefaultConfig
from polytile.poly.ir.kernel import Kernel

from . import budget
from .measure import MeasureConfig, _Worker

#: seconds a worker may take to start (import polytile) before its first build
START = 60.0


@dataclass(frozen=True)
class Built:
    """A built candidate as the tuner keeps it: its decisions, its trace and (when asked)
    its cost-model feature row, computed where it was built."""

    decisions: Mapping[str, Any]
    trace: list[dict[str, Any]]
    row: tuple[float, ...] | None = None
    #: seconds the build and the features took where they ran
    seconds: float = 0.0


@dataclass(frozen=True)
class SpaceSpec:
    """What a worker needs to make a task's `SearchSpace`."""

    kernel: Kernel
    config: DefaultConfig
    machine: MachineChoices


#: a build's outcome: the candidate, or its refusal
Outcome = Built | BudgetExceeded


# --- what a build is, wherever it runs ----------------------------------------------------


def _space(spec: SpaceSpec) -> Any:
    from .space import SearchSpace

    return SearchSpace(spec.kernel, config=spec.config, machine=spec.machine)


def _build(space: Any, decisions: Mapping[str, Any], features: bool) -> tuple:
    """('ok', trace, row, seconds) or ('budget', message, resource, where, trace)."""
    from .cost_model import trace_features

    start = time.perf_counter()
    try:
        candidate = space.build(decisions)
    except BudgetExceeded as err:
        return "budget", str(err), err.resource, err.where, tuple(err.trace)
    row = tuple(trace_features(candidate.schedule)) if features else None
    return "ok", candidate.trace, row, time.perf_counter() - start


def _row(kernel: Kernel, trace: Sequence[Mapping[str, Any]]) -> tuple[float, ...] | None:
    """The feature row of a recorded trace; None when it does not replay (a trace of
    another polytile version)."""
    from polytile.poly.transform.steps import replay

    from .cost_model import trace_features

    try:
        return tuple(trace_features(replay(kernel, list(trace))))
    except (IllegalSchedule, KeyError, TypeError, ValueError):
        return None


def _outcome(reply: tuple, decisions: Mapping[str, Any], kernel: str) -> Outcome:
    if reply[0] == "ok":
        return Built(dict(decisions), list(reply[1]), reply[2], reply[3])
    if reply[0] == "budget":
        return BudgetExceeded(*reply[1:])
    if reply[0] == "timeout":
        return BudgetExceeded(
            f"kernel {kernel}: building the candidate took over {reply[1]} s: its worker "
            "was killed", "seconds", "build worker",
        )  # fmt: skip
    if reply[0] == "died":
        return BudgetExceeded(
            f"kernel {kernel}: building the candidate killed its worker (exit code "
            f"{reply[1]})", "worker", "build worker",
        )  # fmt: skip
    raise TuningError(f"kernel {kernel}: building a candidate failed:\n{reply[1]}")


# --- in the tuner's process ---------------------------------------------------------------


class LocalBuilder:
    """Builds in the tuner's process: no kill, the isl budgets only (tests, and a tune
    with `build_timeout=None`)."""

    def __init__(self) -> None:
        self._specs: dict[str, SpaceSpec] = {}
        self._spaces: dict[str, Any] = {}

    def add(self, key: str, spec: SpaceSpec, space: Any = None) -> None:
        """Register a task (`space`: its search space made already, to share)."""
        self._specs[key] = spec
        if space is not None:
            self._spaces[key] = space

    def build(self, key: str, jobs: Sequence[Mapping[str, Any]], features: bool) -> list[Outcome]:
        if key not in self._spaces:
            self._spaces[key] = _space(self._specs[key])
        space, name = self._spaces[key], self._specs[key].kernel.name
        return [_outcome(_build(space, d, features), d, name) for d in jobs]

    def rows(
        self, key: str, traces: Sequence[Sequence[Mapping[str, Any]]]
    ) -> list[tuple[float, ...] | None]:
        return [_row(self._specs[key].kernel, t) for t in traces]

    def close(self) -> None:
        pass


# --- in worker processes ------------------------------------------------------------------


class _BuildWorker(_Worker):
    command = ("-m", "polytile.search.builder")


def _stop_all(workers: list[_Worker | None]) -> None:
    running = [w for w in workers if w is not None]
    for worker in running:  # all told first: they exit together
        worker.send(("stop",))
    for worker in running:
        worker.stop(grace=1.0)


class Builder:
    """`config.build_workers` build workers, each build at most `config.build_timeout`
    seconds. Workers start on first use; a killed or dead one is replaced."""

    #: the worker class (tests run one whose builds hang on demand)
    worker: type[_Worker] = _BuildWorker

    def __init__(self, target: Target, config: MeasureConfig) -> None:
        assert config.build_timeout is not None
        self.target, self.config = target, config
        self.timeout: float = config.build_timeout
        self._specs: dict[str, SpaceSpec] = {}
        self._workers: list[_Worker | None] = [None] * config.build_workers
        #: the tasks each worker has made the space of
        self._known: list[set[str]] = [set() for _ in self._workers]
        #: workers killed past the timeout or found dead (and replaced)
        self.replaced = 0
        #: slots whose worker was started and has not said it is ready yet
        self._starting: set[int] = set()
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)
        self._spawn(range(len(self._workers)))  # they import while the tuner sets up

    def add(self, key: str, spec: SpaceSpec, space: Any = None) -> None:
        self._specs[key] = spec

    def build(self, key: str, jobs: Sequence[Mapping[str, Any]], features: bool) -> list[Outcome]:
        replies = self._run(key, [("build", key, dict(d), features) for d in jobs])
        name = self._specs[key].kernel.name
        return [_outcome(r, d, name) for r, d in zip(replies, jobs, strict=True)]

    def rows(
        self, key: str, traces: Sequence[Sequence[Mapping[str, Any]]]
    ) -> list[tuple[float, ...] | None]:
        replies = self._run(key, [("row", key, [dict(s) for s in t]) for t in traces])
        return [r[1] if r[0] == "ok" else None for r in replies]

    def close(self) -> None:
        _stop_all(self._workers)
        self._workers[:] = [None] * len(self._workers)
        self._starting.clear()

    def __enter__(self) -> Builder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, slots: Iterable[int]) -> None:
        """Start the workers of `slots` that are not running (without waiting for them)."""
        for slot in slots:
            worker = self._workers[slot]
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.stop()
                    self.replaced += 1
                self._workers[slot] = self.worker(self.target, self.config)
                self._starting.add(slot)
                self._known[slot] = set()

    def _start(self, count: int) -> None:
        """The first `count` slots' workers running and ready, started all at once."""
        self._spawn(range(count))
        for slot in sorted(self._starting & set(range(count))):
            worker = self._workers[slot]
            assert worker is not None
            try:
                ready = worker.recv(START)  # started and imported: builds count from now
            except (EOFError, OSError):
                ready = None
            if ready is None:
                raise TuningError(f"a build worker did not start within {START} s")
            worker.send(("budget", budget.BUILD_OPERATIONS, budget.BUILD_SECONDS))
            self._starting.discard(slot)

    def _live(self, slot: int, key: str) -> _Worker:
        """The slot's worker, started if need be, holding task `key`'s space."""
        self._start(slot + 1)
        worker = self._workers[slot]
        assert worker is not None
        if key not in self._known[slot]:
            worker.send(("space", key, self._specs[key]))
            self._known[slot].add(key)
        return worker

    def _run(self, key: str, jobs: list[tuple]) -> list[tuple]:
        """Every job's reply, in order: each on the next free worker, killed past the
        timeout (the reply is then ('timeout', seconds)) or ('died', exit code)."""
        replies: list[tuple | None] = [None] * len(jobs)
        queue = deque(range(len(jobs)))
        busy: dict[int, tuple[_Worker, int, float]] = {}  # slot → (worker, job, deadline)
        self._start(min(len(jobs), len(self._workers)))
        try:
            while queue or busy:
                for slot in range(len(self._workers)):
                    if queue and slot not in busy:
                        worker = self._live(slot, key)
                        job = queue.popleft()
                        worker.send(jobs[job])
                        busy[slot] = (worker, job, time.monotonic() + self.timeout)
                first = min(deadline for _, _, deadline in busy.values())
                wait([w.conn for w, _, _ in busy.values()], max(0.0, first - time.monotonic()))
                for slot, (worker, job, deadline) in list(busy.items()):
                    try:
                        ready = worker.conn.poll(0)
                        reply = worker.conn.recv() if ready else None
                    except (EOFError, OSError):
                        replies[job] = ("died", worker.stop(grace=1.0))
                    else:
                        if reply is None and time.monotonic() < deadline:
                            continue
                        if reply is None:
                            worker.stop()
                            replies[job] = ("timeout", self.timeout)
                        else:
                            replies[job] = reply
                    del busy[slot]
        except BaseException:  # a busy worker's late answer must not reach the next call
            for slot in busy:
                worker = self._workers[slot]
                if worker is not None:
                    worker.stop()
                self._workers[slot] = None
            raise
        return [r for r in replies if r is not None]


def _serve(conn: Connection) -> None:
    """Serve: ('init', target, config) first, answered ('ready',) once the space's
    modules are imported; then ('budget', operations, seconds) sets
    the build budgets (the tuner's), ('space', key, spec) makes a task's space, ('build',
    key, decisions, features) answers as `_build`, ('row', key, trace) answers ('ok',
    row); an unexpected error answers ('error', its traceback)."""
    conn.recv()
    from . import cost_model, space  # noqa: F401  (imported before the first build's clock)

    conn.send(("ready",))
    spaces: dict[str, Any] = {}
    specs: dict[str, SpaceSpec] = {}
    while True:
        try:
            kind, *args = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        if kind == "budget":  # this process's own budgets: the tuner's values
            budget.BUILD_OPERATIONS, budget.BUILD_SECONDS = args
            continue
        if kind == "space":
            specs[args[0]] = args[1]
            continue
        try:
            if kind == "build":
                key, decisions, features = args
                if key not in spaces:
                    spaces[key] = _space(specs[key])
                answer = _build(spaces[key], decisions, features)
            else:
                answer = ("ok", _row(specs[args[0]].kernel, args[1]))
        except Exception:  # a bug of the build: the tuner raises it
            answer = ("error", traceback.format_exc(limit=8))
        conn.send(answer)


def make_builder(target: Target, config: MeasureConfig) -> Builder | LocalBuilder:
    """Worker processes, or the tuner's own with `build_timeout=None`."""
    return LocalBuilder() if config.build_timeout is None else Builder(target, config)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
