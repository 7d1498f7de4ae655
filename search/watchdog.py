"""Forked worker processes whose samples and builds run under time limits: the fuzzing
campaign's (benchmarks/fuzz_bench.py; the tuner's builds run in `search.builder`'s).

Workers are forked from the campaign's process (they share its lowered kernels) and run
samples one after another. A sample's build (its candidate's construction: sketch steps,
legality checks, AST generation and its checks) may take `build_seconds`, as a tuner's
build may: isl's own budgets (`search.budget`) cannot stop one long isl call, which holds
the interpreter, so a worker whose build overruns is killed and replaced, and the sample
is over budget (status `budget`, with its decisions). The whole sample may take `timeout`
seconds: a worker that overruns them, or dies, is a crash.

A worker tells the pool when a build starts (with its decisions) and ends, over the pipe
its results come back on: one message each, nothing per isl call.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from .budget import BUILD_SECONDS

#: seconds a worker may spend on one sample (its build has `BUILD_SECONDS` of them)
SAMPLE_SECONDS = 300.0
#: samples a worker runs before it is replaced (bounds what leaks per JIT module)
RECYCLE = 400

#: what a sample's run is told as its build starts (its decisions) and ends (None)
Building = Callable[[Any], None]


def nothing(decisions: Any) -> None:
    """A build's start or end where no pool watches (a sample run in this process)."""


class Runner(Protocol):
    """What the pool's workers run: sample `index` (a `fuzz_bench.Sampler`)."""

    def kernel_of(self, index: int) -> int: ...

    def run(self, index: int, building: Building = nothing) -> tuple[int, Any]: ...


def outcome(status: str, message: str, decisions: Any = None) -> dict[str, Any]:
    """A `fuzz_bench.Outcome` as a dict: what the pool reports for a worker it killed."""
    return {"status": status, "message": message, "error": 0.0, "decisions": decisions,
            "trace": []}  # fmt: skip


def _worker(runner: Runner, conn: Connection, recycle: int) -> None:
    # the campaign's process decides when to stop; a Ctrl-C to the group must not kill a
    # worker mid-sample before the parent has written its journal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def building(decisions: Any) -> None:
        conn.send(("build", decisions))

    for _ in range(recycle):
        index = conn.recv()
        if index is None:
            break
        k, result = runner.run(index, building)
        conn.send(("done", index, k, asdict(result)))
    conn.close()


@dataclass
class _Busy:
    """A worker's sample under way: since when, and the deadline of its build under way
    (with its decisions)."""

    index: int
    kernel: int
    start: float
    build_end: float = math.inf
    decisions: Any = None


class Pool:
    """Worker processes forked from this one; a worker that dies or overruns its sample's
    `timeout` or its build's `build_seconds` is killed and replaced (`outcome`)."""

    def __init__(
        self,
        runner: Runner,
        jobs: int,
        timeout: float = SAMPLE_SECONDS,
        build_seconds: float = BUILD_SECONDS,
    ) -> None:
        self.runner = runner
        self.jobs = jobs
        self.timeout = timeout
        self.build_seconds = build_seconds
        self.context = multiprocessing.get_context("fork")
        self.workers: dict[Connection, Any] = {}
        self.busy: dict[Connection, _Busy] = {}

    def _start(self) -> Connection:
        parent, child = self.context.Pipe()
        proc = self.context.Process(target=_worker, args=(self.runner, child, RECYCLE), daemon=True)
        proc.start()
        child.close()
        self.workers[parent] = [proc, 0]
        return parent

    def _stop(self, conn: Connection, kill: bool) -> None:
        proc, _ = self.workers.pop(conn)
        if kill:
            proc.kill()
        proc.join(5)
        conn.close()

    def _hand_out(self, todo: list[int], deadline: float) -> None:
        while todo and time.monotonic() < deadline and len(self.busy) < self.jobs:
            idle = [c for c in self.workers if c not in self.busy]
            conn = idle[0] if idle else self._start()
            if self.workers[conn][1] >= RECYCLE:
                self._stop(conn, kill=False)
                conn = self._start()
            index = todo.pop()
            conn.send(index)
            self.workers[conn][1] += 1
            self.busy[conn] = _Busy(index, self.runner.kernel_of(index), time.monotonic())

    def _receive(self, conn: Connection) -> tuple | None:
        """A message of `conn`'s busy worker: its result (index, kernel, outcome dict),
        or None for a build's start or end (noted)."""
        busy = self.busy[conn]
        try:
            message = conn.recv()
        except (EOFError, OSError):
            code = self.workers[conn][0].exitcode
            self._stop(conn, kill=True)
            del self.busy[conn]
            died = outcome("crash", f"the worker died (exit {code})", busy.decisions)
            return busy.index, busy.kernel, died
        if message[0] == "build":
            if message[1] is None:  # built
                busy.build_end = math.inf
            else:
                busy.decisions = message[1]
                busy.build_end = time.monotonic() + self.build_seconds
            return None
        del self.busy[conn]
        return message[1:]

    def _overdue(self) -> Iterator[tuple]:
        """The results of the busy workers past a deadline, each killed; a worker with
        an unread message is left to say it first."""
        now = time.monotonic()
        for conn, busy in list(self.busy.items()):
            if (busy.build_end >= now and now - busy.start <= self.timeout) or conn.poll(0):
                continue
            del self.busy[conn]
            self._stop(conn, kill=True)
            if busy.build_end < now:
                message = (f"building the candidate took over {self.build_seconds:g} s: its "
                           "worker was killed")  # fmt: skip
                yield busy.index, busy.kernel, outcome("budget", message, busy.decisions)
            else:
                message = f"no result within {self.timeout:.0f} s (killed)"
                yield busy.index, busy.kernel, outcome("crash", message, busy.decisions)

    def run(
        self, indices: Sequence[int], deadline: float, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple]:
        """Yields (index, kernel, outcome dict) as samples finish; stops handing out
        samples after `deadline` (time.monotonic()), and returns at once, abandoning the
        samples under way, when `stop()` says so."""
        todo = list(reversed(indices))
        while (todo or self.busy) and not stop():
            self._hand_out(todo, deadline)
            if time.monotonic() >= deadline:
                todo.clear()
            if not self.busy:
                break
            first = min(min(b.start + self.timeout, b.build_end) for b in self.busy.values())
            for conn in wait(list(self.busy), timeout=min(1.0, max(0.0, first - time.monotonic()))):
                result = self._receive(conn)
                if result is not None:
                    yield result
                    if stop():
                        return
            yield from self._overdue()

    def close(self) -> None:
        """Stops the workers; busy ones are killed (their samples stay unjournaled)."""
        for conn in list(self.workers):
            busy = self.busy.pop(conn, None) is not None
            if not busy:
                with contextlib.suppress(OSError):
                    conn.send(None)
            self._stop(conn, kill=busy)
