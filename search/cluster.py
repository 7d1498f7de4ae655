"""Scale-out on a Dask cluster (the optional extra `polytile[dask]`): the candidates of a
tuning task are built on the cluster's workers, and the models of a batch are compiled
there, one task per model (`polytile.batch`, through `connect`). Measuring never leaves
this host: candidates are verified and timed here, one at a time, in `measure`'s worker
processes, so every record names this host's CPU and features.

What travels, and why:

- A candidate: the task's kernel (submitted once per task), the trace and this host's
  `Target` go out; the kernel function's machine code (`codegen.jit.Part`) and its
  argument order come back. The cluster compiles for this host's CPU, not its own (LLVM
  generates code for any CPU of its architecture), so the code timed here is the code
  built there and nothing is compiled again: loading an object takes milliseconds, while
  optimizing and generating code, the expensive part, is what the cluster takes off this
  host. Shipping bitcode instead would leave code generation here.
- Verification happens here, when a measuring worker loads the candidate, not on the
  cluster: it must run the very machine code that is timed, on a CPU that has the
  target's features (a cluster node without AVX-512 would die of SIGILL), and a kernel
  that hangs is killed here with its process, which Dask cannot do to a task's thread.
  One run is cheap next to a build.
- A model of a batch (`polytile.batch`): its zoo name or its ONNX bytes and this host's
  `Target` go out; the files of its saved `.ptm` come back.

Dask workers should run one thread each (`dask worker ADDR --nthreads 1 --nworkers N`):
builds in one worker process are serialized anyway. A build that kills its worker is a
crash record once the scheduler gives up on the task (`distributed.scheduler.allowed-
failures`, 3 retries by default; 0 fails fast). `distributed` is imported only through
`require_distributed`, which names the extra when it is missing.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from polytile.codegen.jit import Part
from polytile.codegen.native import build_part
from polytile.codegen.target import Target
from polytile.errors import IllegalSchedule, InputError
from polytile.poly.ir.kernel import Kernel
from polytile.version import __version__

#: seconds to reach a scheduler and to find a worker there
CONNECT_TIMEOUT = 10.0
EXTRA = "pip install 'polytile[dask]'"


def require_distributed(purpose: str) -> ModuleType:
    """The `distributed` package, or an InputError naming the extra that installs it."""
    try:
        import distributed
    except ImportError:
        raise InputError(f"{purpose} needs the optional extra: {EXTRA}") from None
    return distributed


def connect(address: str, timeout: float | None = None) -> Any:
    """A `distributed.Client` of the scheduler at `address` that has a worker, within
    `timeout` seconds (default `CONNECT_TIMEOUT`), whose workers can build for this host
    (`check_workers`); else an InputError naming the address or the worker. It is never the
    default client: a user's own Dask code is left alone."""
    distributed = require_distributed(f"the Dask scheduler {address!r}")
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    try:
        client = distributed.Client(address, timeout=timeout, set_as_default=False)
    except Exception as err:  # OSError, a malformed address, whatever a non-Dask peer causes
        raise InputError(
            f"cannot reach the Dask scheduler at {address!r}: {type(err).__name__}: {err}"
        ) from None
    try:
        client.wait_for_workers(1, timeout=timeout)
    except Exception:  # Dask's TimeoutError
        client.close()
        raise InputError(
            f"the Dask scheduler at {address!r} has no worker (waited {timeout:g} s)"
        ) from None
    try:
        check_workers(client, address)
    except BaseException:
        client.close()
        raise
    return client


def environment() -> dict[str, Any]:
    """What a Dask worker must share with this host for the code it builds to load and run
    here: polytile (the code generator), the architecture, and whether parallel loops call
    libgomp (code built where there is none runs serial; built where there is one, it
    cannot link here without one)."""
    import llvmlite.binding as llvm

    from polytile.codegen.target import openmp_library

    return {
        "polytile": __version__,
        "arch": llvm.get_process_triple().split("-")[0],
        "openmp": openmp_library() is not None,
    }


def check_workers(client: Any, address: str) -> None:
    """An InputError naming the first worker of the cluster that cannot build for this host."""
    here = environment()
    try:
        theirs = client.run(environment)
    except Exception as err:  # the workers cannot import polytile, or one died meanwhile
        raise InputError(
            f"the Dask workers of {address!r} cannot run polytile: {type(err).__name__}: {err}"
        ) from None
    for worker, env in sorted(theirs.items()):
        differs = {k: (v, here.get(k)) for k, v in env.items() if here.get(k) != v}
        if differs:
            detail = ", ".join(f"{k} {v!r} (here {h!r})" for k, (v, h) in differs.items())
            raise InputError(
                f"Dask worker {worker} of {address!r} differs from this host: {detail}"
            )


# --- candidates -----------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteBuild:
    """A Dask worker's answer for one candidate: an error kind and message, or the kernel
    function's machine code and the tensors its arguments take, in order; `span` is when
    the build ran, on the worker's clock."""

    error: str | None
    message: str = ""
    part: Part | None = None
    params: tuple[str, ...] = ()
    span: tuple[float, float] | None = None
    #: the kernel the code runs: the task's, rewritten by the trace's kernel steps
    #: (packed weights, inlined statements), whose tensors the arguments name
    kernel: Kernel | None = None


_BUILD_LOCK = threading.Lock()


def _held(kernel: Kernel) -> Kernel:
    """The task's kernel as a Dask task of its own: its candidates depend on it, and the
    scheduler recomputes it when the worker holding it dies (scattered data would be lost)."""
    return kernel


def build_candidate(
    kernel: Kernel, trace: Sequence[Mapping[str, Any]], target: Target, expected: dict
) -> RemoteBuild:
    """On a Dask worker: replay the trace and compile the kernel for `target`, this host's
    CPU, like `NativeKernel` does. Builds in one worker process take turns: llvmlite runs one
    call into LLVM at a time anyway, and that process's tasks share the kernel's isl objects.
    As in a local measuring worker, an exception other than an illegal schedule or a failed
    build escapes; the measurer makes it a crash record."""
    start = time.time()
    env = environment()
    if env != expected:
        return RemoteBuild("build", f"this Dask worker has {env}, the measuring host {expected}")
    from polytile.poly.transform.steps import replay

    with _BUILD_LOCK:
        try:
            schedule = replay(kernel, trace)
        except IllegalSchedule as err:
            return RemoteBuild("illegal", str(err))
        try:
            _, part, params = build_part(schedule, target)
        except Exception as err:  # a build failure is a result of the candidate
            return RemoteBuild("build", f"{type(err).__name__}: {err}")
    return RemoteBuild(None, "", part, params, (start, time.time()), schedule.kernel)


class RemoteBuilder:
    """Builds a task's candidates on a Dask cluster for `measure.Measurer`.

    At most one build per worker process runs at a time, so a build's `timeout` counts
    from about when it starts rather than from a place in the cluster's queue. A build past
    its timeout is given up and becomes a timeout record; Dask cannot stop a running task,
    so its worker stays busy until the build ends. `results` keeps every answer of the
    current batch (a candidate lost with a measuring worker is loaded again, not rebuilt).
    """

    def __init__(self, address: str, target: Target, timeout: float) -> None:
        self.address, self.target, self.timeout = address, target, timeout
        self._client = connect(address)
        try:
            #: a worker runs on this host: no build may then overlap a timed run
            self.colocated = self._colocated()
        except BaseException:
            self._client.close()
            raise
        self._env = environment()
        self._kernel: Any = None
        self._capacity = 1
        self._queue: deque[tuple[int, Sequence]] = deque()
        self._running: dict[int, tuple[Any, float]] = {}
        self.results: dict[int, RemoteBuild] = {}

    def _colocated(self) -> bool:
        comm = require_distributed("a Dask scheduler").comm
        here = {"localhost", "::1", socket.gethostname(), socket.getfqdn()}
        with contextlib.suppress(OSError):
            here.update(str(a[4][0]) for a in socket.getaddrinfo(socket.gethostname(), None))
        for worker in self._client.nthreads():
            scheme, location = comm.parse_address(worker)
            if scheme == "inproc":
                return True
            name = comm.parse_host_port(location)[0]
            if name in here or name.startswith("127."):
                return True
        return False

    def set_task(self, kernel: Kernel) -> None:
        self.cancel()
        self._kernel = self._client.submit(_held, kernel, pure=False, key=self._key("kernel"))

    def submit(self, traces: Mapping[int, Sequence]) -> None:
        """Queue the builds of a batch (job → trace), forgetting the previous batch."""
        self.cancel()
        self._capacity = max(1, len(self._client.nthreads()))
        self._queue.extend(traces.items())
        self.pump()

    def pump(self, start: bool = True) -> None:
        """Collect the builds that ended, give up those past their timeout and (with
        `start`) start queued ones on free workers. Never blocks for long."""
        now = time.monotonic()
        for job, (future, deadline) in list(self._running.items()):
            if future.done():
                self.results[job] = self._outcome(future)
            elif now >= deadline:
                future.cancel()
                message = f"building on the Dask cluster took over {self.timeout} s"
                self.results[job] = RemoteBuild("timeout", message)
            else:
                continue
            del self._running[job]
        while start and self._queue and len(self._running) < self._capacity:
            job, trace = self._queue.popleft()
            future = self._client.submit(
                build_candidate,
                self._kernel,
                list(trace),
                self.target,
                self._env,
                pure=False,
                key=self._key(f"build-{job}"),
            )
            self._running[job] = (future, time.monotonic() + self.timeout)

    def _key(self, what: str) -> str:
        return f"polytile-{what}-{uuid.uuid4().hex}"

    def _outcome(self, future: Any) -> RemoteBuild:
        distributed = require_distributed("a Dask scheduler")
        try:
            return future.result()
        except distributed.KilledWorker as err:
            return RemoteBuild("crash", f"the Dask worker building it died: {err}")
        except Exception as err:  # what escaped the build, or the cluster lost the task
            text = "".join(traceback.format_exception(err, limit=-3))
            return RemoteBuild("crash", f"building it on the Dask cluster failed:\n{text}")

    def wait(self) -> None:
        """Block until a running build ends or the first one is due."""
        if not self._running:
            return
        distributed = require_distributed("a Dask scheduler")
        due = min(deadline for _, deadline in self._running.values()) - time.monotonic()
        futures = [future for future, _ in self._running.values()]
        with self._client.as_current(), contextlib.suppress(TimeoutError):
            distributed.wait(futures, timeout=max(due, 0.0) + 0.01, return_when="FIRST_COMPLETED")

    def drain(self) -> None:
        """Let the running builds end (or time out), starting none."""
        while self._running:
            self.wait()
            self.pump(start=False)

    def cancel(self) -> None:
        """Drop the queued, running and finished builds of the batch."""
        for future, _ in self._running.values():
            future.cancel()
        self._running.clear()
        self._queue.clear()
        self.results.clear()

    def close(self) -> None:
        self.cancel()
        self._kernel = None
        self._client.close()
