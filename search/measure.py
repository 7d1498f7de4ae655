"""Isolated, verified measurement of candidates.

Each candidate is built and run in a worker process (spawned, so LLVM and libgomp state
never leak into the tuner). A candidate that fails to replay or build, crashes the
worker or exceeds the timeout becomes an error record; a crashed or hung worker is
killed and replaced, and tuning goes on. Every measured candidate's outputs are
compared with the default schedule's outputs on the same random inputs: a wrong result
is an error record and can never become the best.

Timing: `warmup` runs, then `repeat` measurements of `number` runs each; `number` grows
until one measurement lasts `min_repeat_ms`; with `flush_cache` a buffer larger than the
last-level cache is written before each measurement.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from polytile.codegen.target import Target
from polytile.poly.kernel import Kernel

from .records import Record


@dataclass(frozen=True)
class MeasureConfig:
    number: int = 2
    repeat: int = 3
    min_repeat_ms: float = 0.0
    warmup: int = 1
    timeout: float = 60.0
    flush_cache: bool = False
    rtol: float = 1e-3
    atol: float = 1e-4


@dataclass(frozen=True)
class _Job:
    trace: list[Mapping[str, Any]]


def _tolerance_ok(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> bool:
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    scale = scale or 1.0
    return bool(np.allclose(got / scale, want / scale, rtol=rtol, atol=atol, equal_nan=True))


def _time(native: Any, buffers: dict, config: MeasureConfig) -> list[float]:
    flush = np.zeros(64 * 2**20 // 8) if config.flush_cache else None
    for _ in range(config.warmup):
        native.run_on(buffers)
    number = config.number
    results = []
    for _ in range(config.repeat):
        while True:
            if flush is not None:
                flush += 1.0
            start = time.perf_counter()
            for _ in range(number):
                native.run_on(buffers)
            elapsed = time.perf_counter() - start
            if elapsed * 1e3 >= config.min_repeat_ms or number >= 1 << 20:
                break
            number *= 2
        results.append(elapsed / number)
    return results


def _worker(conn: Connection) -> None:
    """Serve jobs: ('init', target, config) first; ('task', kernel, inputs, expected) sets
    the task; ('run', trace) measures one candidate and answers (error, message,
    latencies)."""
    from polytile.codegen.native import NativeKernel
    from polytile.errors import IllegalSchedule
    from polytile.poly.transform import replay

    kernel = inputs = expected = None
    _, target, config = conn.recv()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        if message[0] == "task":
            _, kernel, inputs, expected = message
            conn.send(("ok",))
            continue
        trace = message[1]
        try:
            schedule = replay(kernel, trace)
        except IllegalSchedule as err:
            conn.send(("illegal", str(err), ()))
            continue
        try:
            native = NativeKernel(schedule, target)
        except Exception as err:  # a build failure is a result of the candidate
            conn.send(("build", f"{type(err).__name__}: {err}", ()))
            continue
        try:
            buffers = native.buffers(inputs)
            native.run_on(buffers)
            for name, want in expected.items():
                if not _tolerance_ok(buffers[name], want, config.rtol, config.atol):
                    raise _WrongResult(f"output {name} differs from the default schedule")
            latencies = _time(native, buffers, config)
        except _WrongResult as err:
            conn.send(("wrong_result", str(err), ()))
            continue
        except Exception:
            conn.send(("runtime", traceback.format_exc(limit=3), ()))
            continue
        conn.send((None, "", tuple(latencies)))


class _WrongResult(Exception):
    pass


class Measurer:
    """One worker process measuring the candidates of one task at a time."""

    def __init__(self, target: Target, config: MeasureConfig | None = None) -> None:
        self.target = target
        self.config = config or MeasureConfig()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._task: tuple[Kernel, dict, dict] | None = None
        #: the caller's key of the task the worker holds (set_task is skipped when equal)
        self.task_key: str | None = None

    def _start(self) -> None:
        """A fresh interpreter running this module as the worker (not multiprocessing's
        spawn, which re-imports the caller's main script)."""
        parent, child = mp.Pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "polytile.search.measure", str(child.fileno())],
            pass_fds=(child.fileno(),),
        )
        child.close()
        self._conn = parent
        parent.send(("init", self.target, self.config))
        if self._task is not None:
            self._send(("task", *self._task), self.config.timeout + 60)

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(5)
        self._proc = self._conn = None

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("stop",))
        self._stop()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: tuple, timeout: float) -> tuple:
        assert self._conn is not None
        self._conn.send(message)
        if not self._conn.poll(timeout):
            raise TimeoutError
        return self._conn.recv()

    def set_task(self, kernel: Kernel, inputs: dict, expected: dict) -> None:
        self._task = (kernel, inputs, expected)
        if not self._alive():
            self._start()
        else:
            self._send(("task", kernel, inputs, expected), self.config.timeout + 60)

    def measure(
        self, workload: str, traces: Sequence[list[Mapping[str, Any]]], seed: int = 0
    ) -> list[Record]:
        records = []
        for trace in traces:
            if not self._alive():
                self._start()
            try:
                error, message, latencies = self._send(("run", trace), self.config.timeout)
            except TimeoutError:
                error, message, latencies = "timeout", f"over {self.config.timeout} s", ()
                self._stop()
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                code = self._proc.poll() if self._proc is not None else None
                error, message, latencies = "crash", f"worker died (exit code {code})", ()
                self._stop()
            records.append(
                Record(
                    workload=workload,
                    target=self.target.key(),
                    trace=tuple(trace),
                    latencies=tuple(latencies),
                    error=error,
                    message=message[:2000],
                    seed=seed,
                )
            )
        return records


if __name__ == "__main__":
    _worker(Connection(int(sys.argv[1])))
