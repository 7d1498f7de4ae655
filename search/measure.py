"""Isolated, verified measurement of candidates.

Each candidate is built and run in a worker process (a fresh interpreter, so LLVM and
libgomp state never leak into the tuner). A candidate that fails to replay or build,
crashes its worker or exceeds the timeout becomes an error record; a crashed or hung
worker is killed and replaced, and tuning goes on. Every measured candidate's outputs
are compared with the default schedule's outputs on the same random inputs: a wrong
result is an error record and can never become the best.

Builds may run in parallel; timed runs are serialized per machine. With `workers` K, a
batch is measured in two phases (per chunk of `HOLD_PER_WORKER` × K candidates, which
bounds the memory a worker holds): first the K workers replay, build and verify
candidates in parallel, each taking the next one as soon as it is free and keeping what
it built; then the built candidates are timed one at a time, each dropped once timed,
while every other worker waits idle (a single worker times each candidate as soon as it
is built). The timeout applies per candidate and phase. A worker that dies takes the
candidates it held with it: they are built again.

With `scheduler` (a Dask scheduler's address; the extra `polytile[dask]`), the candidates
are replayed and compiled for this host's target on the cluster instead (`cluster`), as
many at a time as it has workers, and phase one loads each into a worker here and verifies
it as soon as it arrives; timing stays here and serialized. A failed, crashed or overdue
build on the cluster is an error record of the same kind as here. When a Dask worker runs
on this host, the cluster builds nothing while a candidate is timed.

Timing: `warmup` runs, then `repeat` measurements of `number` runs each; `number` grows
until one measurement lasts `min_repeat_ms`. With `flush_cache` every timed run starts
cold instead, and `number` stays as given. By default (`cold="weights"`) the kernel's
constant operands are evicted line by line (`codegen.flush`) and its activations stay
where its last run left them. With `cold="producer"` the kernels that write the task's
inputs in the model (`tasks.Producer`, under their default schedules) run first, writing
into the candidate's input buffers, and then its weights are evicted: it meets its
inputs as a model's kernel does, just written by other kernels' threads (for a task no
kernel feeds, as "weights"). With `cold="all"` (or where the host has no `clflush`) a
buffer larger than the last-level cache is written.

Timed after their producers, stand-alone latencies come closer to the in-model ones, but
the search found no faster kernels for the model with them: the difference between the
modes was within the spread between tunes, so "weights" stays the default
(`benchmarks/resnet50_tune_bench.py` compares them).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import subprocess
import sys
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from polytile.codegen.target import Target
from polytile.errors import InputError
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import Schedule

from .records import Record

if TYPE_CHECKING:
    from .cluster import RemoteBuilder
    from .tasks import Producer

#: built candidates a worker holds at most before they are timed (each keeps its buffers)
HOLD_PER_WORKER = 8
#: seconds between looks at the cluster while workers here are busy
POLL = 0.05


#: what `MeasureConfig.cold` may name
COLD = ("producer", "weights", "all")


@dataclass(frozen=True)
class MeasureConfig:
    number: int = 2
    repeat: int = 3
    min_repeat_ms: float = 5.0
    warmup: int = 1
    timeout: float = 60.0
    flush_cache: bool = False
    #: how a timed run starts cold: "weights" (the constant operands are evicted),
    #: "producer" (the task's producers run first) or "all" (the caches are overwritten)
    cold: str = "weights"
    rtol: float = 1e-3
    atol: float = 1e-4
    #: worker processes building in parallel (timed runs are serialized regardless)
    workers: int = 1
    #: a Dask scheduler's address ("tcp://10.0.0.5:8786"): build candidates on its cluster
    scheduler: str | None = None
    #: seconds the tuner's construction of one candidate (sketch steps, checks, AST) may
    #: take in its worker process before the worker is killed (`search.builder`); None
    #: builds in the tuner's process, under the isl budgets only
    build_timeout: float | None = 60.0
    #: processes constructing the tuner's candidates in parallel (the tuner waits for
    #: them, the measuring workers are idle meanwhile)
    build_workers: int = 2

    @property
    def start(self) -> str:
        """How timed runs start, as records keep it: "warm", or the cold mode."""
        return self.cold if self.flush_cache else "warm"

    @property
    def runs_producers(self) -> bool:
        """Whether timed runs start after the task's producers (`Measurer.set_task`)."""
        return self.flush_cache and self.cold == "producer"

    def __post_init__(self) -> None:
        if self.cold not in COLD:
            raise InputError(f"MeasureConfig: cold must be one of {COLD}, got {self.cold!r}")
        if self.build_timeout is not None and not self.build_timeout > 0:
            raise InputError(
                f"MeasureConfig: build_timeout must be > 0 or None, not {self.build_timeout}"
            )
        if min(self.workers, self.build_workers) < 1:
            raise InputError("MeasureConfig: workers and build_workers must be at least 1")
        if self.scheduler is not None and not (
            isinstance(self.scheduler, str) and self.scheduler.strip()
        ):
            raise InputError(
                f"MeasureConfig: scheduler must be a Dask scheduler address, got {self.scheduler!r}"
            )


class Span(NamedTuple):
    """What a worker reported doing: a phase ("build" or "time"; "remote" for a build on a
    Dask worker, on its clock) of the candidate at `job` (its index in `measure`'s traces)
    between two `time.time()` instants."""

    phase: str
    job: int
    start: float
    end: float


class _Reply(NamedTuple):
    """A worker's answer for one candidate and phase (`span`: its wall-clock start and
    end in the worker; none when the worker crashed or hung)."""

    error: str | None
    message: str = ""
    latencies: tuple[float, ...] = ()
    span: tuple[float, float] | None = None


class Prelude(NamedTuple):
    """A task's producer as a worker runs it before each timed run: its kernel, its
    default schedule's trace, its tensor the task reads and the task's tensor that is."""

    kernel: Kernel
    trace: tuple[Mapping[str, Any], ...]
    output: str
    input: str


def preludes(
    producers: Sequence[Producer], target: Target, cache: dict[str, tuple] | None = None
) -> tuple[Prelude, ...]:
    """The producers under their default schedules (`cache`: traces by workload key,
    shared by the tasks one kernel feeds)."""
    from polytile.codegen.configs import default_config
    from polytile.poly.default.schedule import default_schedule

    cache = {} if cache is None else cache
    found = []
    for p in producers:
        key = p.kernel.workload_key()
        if key not in cache:
            schedule = default_schedule(p.kernel, default_config(target))
            cache[key] = tuple(schedule.trace_json())
        found.append(Prelude(p.kernel, cache[key], p.output, p.input))
    return tuple(found)


def reference_outputs(
    schedule: Schedule, target: Target, seed: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Seeded random inputs of a kernel and its outputs under `schedule` (the default
    schedule): what `Measurer.set_task` verifies every candidate against."""
    from polytile.codegen.native import NativeKernel, random_inputs

    inputs = random_inputs(schedule.kernel, seed)
    buffers = NativeKernel(schedule, target)(inputs)
    return inputs, {t.name: buffers[t.name] for t in schedule.kernel.outputs()}


# --- the worker process ------------------------------------------------------------------


def _tolerance_ok(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> bool:
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    scale = scale or 1.0
    return bool(np.allclose(got / scale, want / scale, rtol=rtol, atol=atol, equal_nan=True))


#: bytes written to flush the caches: twice a 32 MiB last-level cache
FLUSH_BYTES = 64 * 2**20


def _flush(buffer: np.ndarray) -> None:
    buffer += 1.0


#: a prelude built in a worker: its kernel's machine code and buffers, its tensor the
#: task reads and the task's tensor that is
Ready = tuple[Any, dict, str, str]


def _time(
    native: Any, buffers: dict, config: MeasureConfig, ready: Sequence[Ready] = ()
) -> list[float]:
    """Seconds per run, one figure per repeat. With `flush_cache`, every timed run starts
    cold, as a kernel of a model meets its inputs and weights (TVM's
    `enable_cpu_cache_flush`, `MeasureConfig.cold`; `ready`: the task's producers, built):
    the `number` runs are timed one by one, the producers and flushes left out, and
    `min_repeat_ms` does not apply (each run costs a flush)."""
    if config.runs_producers and ready:
        # the candidate reads what its producers write: their output buffers
        buffers = dict(buffers)
        for _, made, output, into in ready:
            buffers[into] = made[output].reshape(buffers[into].shape)
    for _ in range(config.warmup):
        native.run_on(buffers)
    if config.flush_cache:
        return _time_cold(native, buffers, config, ready)
    number = config.number
    results = []
    for _ in range(config.repeat):
        while True:
            start = time.perf_counter()
            for _ in range(number):
                native.run_on(buffers)
            elapsed = time.perf_counter() - start
            if elapsed * 1e3 >= config.min_repeat_ms or number >= 1 << 20:
                break
            number *= 2
        results.append(elapsed / number)
    return results


def _cold(
    native: Any, buffers: dict, config: MeasureConfig, ready: Sequence[Ready] = ()
) -> Callable[[], None]:
    """What makes a timed run start cold (`MeasureConfig.cold`): running the producers
    (`ready`) then evicting the constant operands' lines, or only evicting them, else
    overwriting the caches."""
    if config.cold in ("producer", "weights"):
        from polytile.codegen.flush import line_flusher

        flusher = line_flusher(native.target)
        if flusher is not None:
            tensors = native.kernel.tensors
            constants = [b for n, b in buffers.items() if tensors[n].role is Role.CONSTANT]
            if config.cold == "weights" or not ready:
                return lambda: flusher(*constants)
            runs = [(made_by.run_on, made) for made_by, made, _, _ in ready]

            def produce_then_evict() -> None:
                for run, made in runs:
                    run(made)
                flusher(*constants)

            return produce_then_evict
    buffer = np.zeros(FLUSH_BYTES // 8)
    return lambda: _flush(buffer)


def _time_cold(
    native: Any, buffers: dict, config: MeasureConfig, ready: Sequence[Ready] = ()
) -> list[float]:
    """`_time` with a flush before every timed run (its time left out)."""
    flush = _cold(native, buffers, config, ready)
    results = []
    for _ in range(config.repeat):
        elapsed = 0.0
        for _ in range(config.number):
            flush()
            start = time.perf_counter()
            native.run_on(buffers)
            elapsed += time.perf_counter() - start
        results.append(elapsed / config.number)
    return results


def _build(
    task: tuple, target: Target, config: MeasureConfig, trace: list, verify: Any = None
) -> tuple:
    """Replay, build and run a candidate once against the outputs expected (`verify`):
    (error, message, (native, buffers) when it is ready to be timed)."""
    from polytile.codegen.native import NativeKernel
    from polytile.errors import IllegalSchedule
    from polytile.poly.transform.steps import replay

    try:
        schedule = replay(task[0], trace)
    except IllegalSchedule as err:
        return "illegal", str(err), None
    try:
        native = NativeKernel(schedule, target)
    except Exception as err:  # a build failure is a result of the candidate
        return "build", f"{type(err).__name__}: {err}", None
    return (verify or _verify)(native, task, config)


def _load(
    task: tuple,
    target: Target,
    config: MeasureConfig,
    part: Any,
    params: tuple,
    kernel: Kernel,
    verify: Any = None,
) -> tuple:
    """Load a candidate the cluster built from `kernel` (the task's, rewritten by its
    trace), then verify it as `_build` does."""
    from polytile.codegen.native import LoadedKernel

    try:
        native = LoadedKernel(kernel, part, params, target)
    except Exception as err:  # machine code that does not load is a build failure
        return "build", f"{type(err).__name__}: {err}", None
    return (verify or _verify)(native, task, config)


def _verify(native: Any, task: tuple, config: MeasureConfig, sizes: Any = None) -> tuple:
    _, inputs, expected, _ = task
    try:
        buffers = native.buffers(inputs, sizes)
        native.run_on(buffers)
        tol = config.rtol, config.atol
        wrong = [n for n, want in expected.items() if not _tolerance_ok(buffers[n], want, *tol)]
    except Exception:
        return "runtime", traceback.format_exc(limit=3), None
    if wrong:
        return "wrong_result", f"output {wrong[0]} differs from the default schedule", None
    return None, "", (native, buffers)


def _keep(held: dict, job: int, result: tuple) -> tuple:
    error, message, built = result
    if built is not None:
        held[job] = built
    return error, message, ()


def _ready(preludes: Sequence[Prelude], target: Target, config: MeasureConfig) -> tuple:
    """The task's producers built and run once (none unless timed runs start from them):
    (the built ones, a message naming any that failed to build, which are left out)."""
    if not config.runs_producers:
        return (), ""
    from polytile.codegen.native import NativeKernel, random_inputs
    from polytile.poly.transform.steps import replay

    ready, failed = [], []
    for i, p in enumerate(preludes):
        try:
            made_by = NativeKernel(replay(p.kernel, list(p.trace)), target)
            made = made_by.buffers(random_inputs(p.kernel, i))
            made_by.run_on(made)
        except Exception as err:  # the default schedule of a model's kernel: a bug
            failed.append(f"{p.kernel.name}: {type(err).__name__}: {err}")
            continue
        ready.append((made_by, made, p.output, p.input))
    message = f"producers not run before timed runs: {'; '.join(failed)}" if failed else ""
    return tuple(ready), message


def _time_built(
    built: tuple[Any, dict], config: MeasureConfig, ready: Sequence[Ready] = ()
) -> tuple:
    """Time a built candidate; it is freed on return, before the answer is sent, so that
    freeing it never overlaps another worker's timed run."""
    try:
        return None, "", tuple(_time(*built, config, ready))
    except Exception:
        return "runtime", traceback.format_exc(limit=3), ()


def _worker(conn: Connection, choose: Callable[[tuple], tuple] | None = None) -> None:
    """Serve: ('init', target, config) first; ('task', kernel, inputs, expected,
    preludes) sets the task (answer ('ok', message)); ('build', job, trace) builds and
    keeps a candidate, ('load', job, part, params) loads one built on the cluster and
    keeps it, ('time', job) times and drops it, each answering (error, message,
    latencies, (start, end)); `choose(task)`: the build, load and time functions."""
    _, target, config = conn.recv()
    task: tuple = (None, None, None, ())
    ready: tuple = ()
    held: dict[int, tuple[Any, dict]] = {}
    while True:
        try:
            kind, *args = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        if kind == "task":
            task, held = tuple(args), {}
            ready, message = _ready(task[3], target, config)
            conn.send(("ok", message))
            continue
        start = time.time()
        build, load, time_built = choose(task) if choose else (_build, _load, _time_built)
        if kind == "build":
            answer = _keep(held, args[0], build(task, target, config, args[1]))
        elif kind == "load":
            answer = _keep(held, args[0], load(task, target, config, *args[1:]))
        else:
            answer = time_built(held.pop(args[0]), config, ready)
        conn.send((*answer, (start, time.time())))


# --- the tuner's side --------------------------------------------------------------------


class _Worker:
    """One worker process and the pipe to it. A fresh interpreter runs this module (not
    multiprocessing's spawn, which re-imports the caller's main script)."""

    #: the interpreter's arguments before the pipe's descriptor (tests run a worker that
    #: dies on demand, to check that a crashed worker costs only its candidate)
    command: tuple[str, ...] = ("-m", "polytile.search.measure")

    def __init__(self, target: Target, config: MeasureConfig) -> None:
        parent, child = mp.Pipe()
        self.proc = subprocess.Popen(
            [sys.executable, *self.command, str(child.fileno())],
            pass_fds=(child.fileno(),),
        )
        child.close()
        self.conn = parent
        parent.send(("init", target, config))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: tuple) -> None:
        """Send; a dead worker shows up as a crash when its answer is read."""
        with contextlib.suppress(OSError):
            self.conn.send(message)

    def recv(self, timeout: float) -> tuple | None:
        """The answer, None after `timeout` seconds; EOFError or OSError if it died."""
        return self.conn.recv() if self.conn.poll(timeout) else None

    def stop(self, grace: float = 0.0) -> int | None:
        """Kill (after `grace` seconds to exit by itself) and reap it: no zombie.
        Returns the exit code it had if it exited by itself."""
        try:
            code = self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            code = None
            self.proc.kill()
            self.proc.wait(5)
        self.conn.close()
        return code


class Measurer:
    """`config.workers` worker processes measuring the candidates of one task at a time
    (built on the Dask cluster of `config.scheduler` when it names one: the scheduler is
    reached here, an InputError naming it when it cannot be; `worker`: their class)."""

    worker: type[_Worker] = _Worker

    def __init__(self, target: Target, config: MeasureConfig | None = None) -> None:
        self.target = target
        self.config = config or MeasureConfig()
        self._remote: RemoteBuilder | None = None
        if self.config.scheduler is not None:
            from .cluster import RemoteBuilder

            self._remote = RemoteBuilder(self.config.scheduler, target, self.config.timeout)
        self._workers: list[_Worker | None] = [None] * self.config.workers
        self._task: tuple[Kernel, dict, dict, tuple[Prelude, ...]] | None = None
        #: the default traces of the tasks' producers, by workload key (`preludes`)
        self._producer_traces: dict[str, tuple] = {}
        #: the caller's key of the task the workers hold (set_task is skipped when equal)
        self.task_key: str | None = None
        #: the builds and timed runs the workers reported during the last `measure`
        self.spans: list[Span] = []

    # --- workers ----------------------------------------------------------------------
    def _start(self, slots: Iterable[int], resend: bool = False) -> None:
        """Start the workers of `slots` that are not running, all at once, and give them
        the task; with `resend` the running ones get the task too."""
        ready = []
        for slot in slots:
            worker = self._workers[slot]
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.stop()
                worker = self._workers[slot] = self.worker(self.target, self.config)
            elif not resend:
                continue
            ready.append(worker)
        if self._task is None:
            return
        for worker in ready:
            worker.conn.send(("task", *self._task))
        warned = False
        for worker in ready:  # an idle worker is one that has acknowledged the task
            answer = worker.recv(self.config.timeout + 60)
            if answer is None:
                raise TimeoutError("a measurement worker did not take the task")
            if answer[1] and not warned:
                warnings.warn(f"task of kernel {self._task[0].name}: {answer[1]}", stacklevel=3)
                warned = True

    def _live(self, slot: int) -> _Worker:
        self._start([slot])
        worker = self._workers[slot]
        assert worker is not None
        return worker

    def close(self) -> None:
        """Stop every worker (and leave the cluster)."""
        self._stop_workers()
        if self._remote is not None:
            self._remote.close()
            self._remote = None

    def _stop_workers(self) -> None:
        workers = [w for w in self._workers if w is not None]
        for worker in workers:
            worker.send(("stop",))
        for worker in workers:
            worker.stop(grace=1.0)
        self._workers = [None] * self.config.workers

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def preludes(self, producers: Sequence[Producer]) -> tuple[Prelude, ...]:
        """A task's producers as `set_task` takes them: under their default schedules
        where timed runs start after them (`MeasureConfig.runs_producers`), else none."""
        if not self.config.runs_producers:
            return ()
        return preludes(producers, self.target, self._producer_traces)

    def set_task(
        self, kernel: Kernel, inputs: dict, expected: dict, preludes: Sequence[Prelude] = ()
    ) -> None:
        """The kernel whose candidates come next, its verification oracle (`inputs` and the
        default schedule's `expected` outputs) and its producers (`preludes`)."""
        self._task = (kernel, inputs, expected, tuple(preludes))
        if self._remote is not None:
            self._remote.set_task(kernel)
        self._start(range(self.config.workers), resend=True)

    # --- measuring --------------------------------------------------------------------
    def measure(
        self, workload: str, traces: Sequence[list[Mapping[str, Any]]], seed: int = 0
    ) -> list[Record]:
        """One record per trace, in the order of `traces`."""
        self.spans = []
        replies: dict[int, _Reply] = {}
        # one worker gains nothing from holding candidates: it times each once built
        size = 1 if self.config.workers == 1 else self.config.workers * HOLD_PER_WORKER
        if self._remote is not None:
            self._remote.submit(dict(enumerate(traces)))
        try:
            for first in range(0, len(traces), size):
                chunk = range(first, min(first + size, len(traces)))
                self._measure_chunk(chunk, traces, replies)
        except BaseException:  # a busy worker's late answer must not reach the next batch
            self._stop_workers()
            raise
        finally:
            if self._remote is not None:
                built = sorted(self._remote.results.items())
                self.spans += [Span("remote", j, *r.span) for j, r in built if r.span]
                self._remote.cancel()
        return [self._record(workload, t, replies[j], seed) for j, t in enumerate(traces)]

    def _measure_chunk(self, jobs: Iterable[int], traces: Sequence, replies: dict) -> None:
        """Build in parallel, then time one at a time; candidates lost with a worker that
        died in the timing phase are built again (each round settles at least one)."""
        todo = list(jobs)
        while todo:
            settled = len(replies)
            lost = self._time_all(self._build_all(todo, traces, replies), replies)
            if lost and len(replies) == settled:  # only external kills: give up on them
                replies.update((j, _Reply("crash", "its worker died holding it")) for j in lost)
                return
            todo = lost

    def _build_all(self, jobs: list[int], traces: Sequence, replies: dict) -> dict:
        """Phase 1: replay, build and verify on all workers at once (with a cluster: load
        and verify each candidate it built as soon as it arrives). Failures are settled in
        `replies`; returns job → the worker holding the built candidate."""
        waiting, queue, held = list(jobs), deque[tuple[int, tuple]](), {}
        busy: dict[int, tuple[_Worker, int, float]] = {}  # slot → (worker, job, deadline)
        while waiting or queue or busy:
            waiting = self._arrived(waiting, traces, queue, replies)
            for slot in range(self.config.workers):
                if queue and slot not in busy:
                    (job, message), worker = queue.popleft(), self._live(slot)
                    worker.send(message)
                    busy[slot] = (worker, job, time.monotonic() + self.config.timeout)
            if not busy:
                if waiting and self._remote is not None:
                    self._remote.wait()
                continue
            first_deadline = min(deadline for _, _, deadline in busy.values())
            timeout = first_deadline - time.monotonic()
            wait([w.conn for w, _, _ in busy.values()], min(timeout, POLL) if waiting else timeout)
            for slot, (worker, job, deadline) in list(busy.items()):
                if not worker.conn.poll(0) and time.monotonic() < deadline:
                    continue
                del busy[slot]
                reply = self._answer(worker, 0.0, "build", job)
                if reply.error is None:
                    held[job] = worker
                else:
                    replies[job] = reply
        return held

    def _arrived(
        self, waiting: list[int], traces: Sequence, queue: deque, replies: dict
    ) -> list[int]:
        """Queue a message for a worker for each job of `waiting` that can go: at once
        here; with a cluster, once it built the job (a failed build settles it in
        `replies`). Returns the jobs still waiting."""
        if self._remote is None:
            queue.extend((job, ("build", job, traces[job])) for job in waiting)
            return []
        self._remote.pump()
        still = []
        for job in waiting:
            built = self._remote.results.get(job)
            if built is None:
                still.append(job)
            elif built.error is not None:
                replies[job] = _Reply(built.error, built.message)
            else:
                queue.append((job, ("load", job, built.part, built.params, built.kernel)))
        return still

    def _time_all(self, held: dict[int, _Worker], replies: dict) -> list[int]:
        """Phase 2: time the built candidates one at a time, in input order, while every
        other worker is idle (and the cluster, if it has a worker on this host). Returns the
        jobs whose holder died before timing them."""
        remote = self._remote
        if remote is not None and remote.colocated:
            remote.drain()
        lost = []
        for job in sorted(held):
            if remote is not None and not remote.colocated:
                remote.pump()
            worker = held[job]
            if not worker.alive():
                lost.append(job)
                continue
            worker.send(("time", job))
            replies[job] = self._answer(worker, self.config.timeout, "time", job)
        return lost

    def _answer(self, worker: _Worker, timeout: float, phase: str, job: int) -> _Reply:
        """The worker's answer within `timeout`; a hung or dead worker is stopped and the
        answer is a timeout or crash error."""
        try:
            answer = worker.recv(timeout)
        except (EOFError, OSError):
            code = worker.stop(grace=1.0)
            return _Reply("crash", f"worker died (exit code {code})")
        if answer is None:
            worker.stop()
            return _Reply("timeout", f"over {self.config.timeout} s")
        reply = _Reply(*answer)
        if reply.span is not None:
            self.spans.append(Span(phase, job, *reply.span))
        return reply

    def _record(self, workload: str, trace: Sequence, reply: _Reply, seed: int) -> Record:
        return Record(
            workload=workload,
            target=self.target.key(),
            trace=tuple(trace),
            latencies=tuple(reply.latencies),
            error=reply.error,
            message=reply.message[:2000],
            seed=seed,
            start=self.config.start,
        )


if __name__ == "__main__":
    _worker(Connection(int(sys.argv[1])))
