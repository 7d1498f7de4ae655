"""Scale-out on a Dask cluster (the optional extra `polytile[dask]`): the candidates of a
tuning task are built on the cluster's workers, and the models of a batch are compiled
there, one task per model. Measuring never leaves this host: candidates are verified and
timed here, one at a time, in `measure`'s worker processes, so every record names this
host's CPU and features.

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
- A model of a batch: its zoo name (materialized on the worker) or its ONNX bytes and this
  host's `Target` go out; the files of its saved `.ptm` come back and are written to the
  output directory, loadable here without recompiling.

Dask workers should run one thread each (`dask worker ADDR --nthreads 1 --nworkers N`):
builds in one worker process are serialized anyway. A build that kills its worker is a
crash record once the scheduler gives up on the task (`distributed.scheduler.allowed-
failures`, 3 retries by default; 0 fails fast). Only this module imports `distributed`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import tempfile
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from polytile.codegen.jit import Part
from polytile.codegen.native import build_part
from polytile.codegen.target import Target, host
from polytile.errors import IllegalSchedule, InputError, PolytileError
from polytile.poly.ir.kernel import Kernel

from .records import Record

#: seconds to reach a scheduler and to find a worker there
CONNECT_TIMEOUT = 10.0
EXTRA = "pip install 'polytile[dask]'"


def _distributed(purpose: str) -> ModuleType:
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
    distributed = _distributed(f"the Dask scheduler {address!r}")
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

    from polytile import __version__
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
        comm = _distributed("a Dask scheduler").comm
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
        distributed = _distributed("a Dask scheduler")
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
        distributed = _distributed("a Dask scheduler")
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


# --- batch compilation ------------------------------------------------------------------


@dataclass(frozen=True)
class CompileResult:
    """One model of a batch: where it was saved, or the error that stopped it."""

    name: str
    path: Path | None = None
    error: BaseException | None = None
    #: compile time, where it ran
    seconds: float = 0.0
    #: the compiler's `CompileStats`
    stats: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _sources(models: Sequence[str]) -> dict[str, str | Path]:
    """Name → zoo name or .onnx path, like the command line's model arguments."""
    from polytile import zoo

    named: dict[str, str | Path] = {}
    for model in models:
        path = Path(model)
        if path.suffix == ".onnx" or path.exists():
            if not path.is_file():
                raise InputError(f"model file '{model}' does not exist")
            name, source = path.stem, path
        elif model in zoo.NAMES:
            name, source = model, model
        else:
            raise InputError(
                f"'{model}' is neither a model file nor a zoo model (zoo: {', '.join(zoo.NAMES)})"
            )
        if name in named:
            raise InputError(f"two models of the batch would both be saved as '{name}.ptm'")
        named[name] = source
    return named


def _compile(
    source: str | Path | bytes,
    seed: int,
    target: Target,
    input_shapes: Mapping[str, Sequence[int]] | None,
    records: Any,
) -> tuple[Any, float]:
    """A model compiled for `target` and the seconds it took; a str source is a zoo name."""
    import polytile as pt
    from polytile import zoo

    start = time.perf_counter()
    if isinstance(source, str):
        model: str | bytes = str(zoo.materialize(source, seed=seed))
    else:
        model = str(source) if isinstance(source, Path) else source
    compiled = pt.compile(model, records=records, input_shapes=input_shapes, target=target)
    return compiled, time.perf_counter() - start


@contextlib.contextmanager
def _may_fork() -> Iterator[None]:
    """Let this process fork a pool, as the compiler does to compile a model's modules in
    parallel: a Dask worker under a nanny is a daemonic process, which multiprocessing
    forbids to have children (the pool's are joined before this returns)."""
    process = multiprocessing.current_process()
    daemon = process.daemon
    process.daemon = False
    try:
        yield
    finally:
        process.daemon = daemon


def compile_remote(
    source: str | bytes,
    seed: int,
    target: Target,
    input_shapes: Mapping[str, Sequence[int]] | None,
    records: Any,
) -> tuple[dict[str, bytes], Any, float]:
    """On a Dask worker: compile one model for `target` and return its saved `.ptm` files
    (relative path → bytes), its compile stats and the seconds it took."""
    with _may_fork():
        compiled, seconds = _compile(source, seed, target, input_shapes, records)
    with tempfile.TemporaryDirectory() as tmp:
        saved = compiled.save(Path(tmp) / "model.ptm")
        files = {
            str(p.relative_to(saved)): p.read_bytes()
            for p in sorted(saved.rglob("*"))
            if p.is_file()
        }
    return files, compiled.stats, seconds


def _write_saved(files: Mapping[str, bytes], path: Path) -> None:
    """Write a saved model's files as `path`, replacing it whole (as `CompiledModel.save`)."""
    from polytile.runtime import replace_directory

    def write(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)

    replace_directory(path, write)


def compile_many(
    models: Sequence[str],
    out_dir: str | os.PathLike[str],
    scheduler: str | None = None,
    *,
    seed: int = 0,
    num_threads: int | None = None,
    opt_level: int = 3,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    records: str | os.PathLike[str] | None = None,
    progress: Callable[[CompileResult], None] | None = None,
) -> list[CompileResult]:
    """Compile models (zoo names or .onnx paths) to `out_dir/<name>.ptm`: each as one Dask
    task on the cluster at `scheduler`, else one after the other here. A model that fails is
    a result holding its error, and the others go on. Every model is compiled for this
    host's CPU (`num_threads`, `opt_level`), so the artifacts load here without recompiling.
    `progress` gets each result as it is done; the list is in the order of `models`."""
    named = _sources(models)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = host(num_threads, opt_level)
    # the best record of each workload for this host, read once for every model (and
    # what travels to the cluster)
    from polytile.compiler import tuned_records

    best = list(tuned_records(records, target).values()) if records is not None else None
    report = progress or (lambda result: None)
    results: dict[str, CompileResult] = {}
    if scheduler is None:
        for name, source in named.items():
            try:
                compiled, seconds = _compile(source, seed, target, input_shapes, best)
                path = compiled.save(out / f"{name}.ptm")
                results[name] = CompileResult(name, path, None, seconds, compiled.stats)
            except Exception as err:  # one model's failure, reported with its name
                results[name] = CompileResult(name, error=err)
            report(results[name])
    else:
        for result in _compile_on_cluster(named, out, scheduler, seed, target, input_shapes, best):
            results[result.name] = result
            report(result)
    return [results[name] for name in named]


def _compile_on_cluster(
    named: Mapping[str, str | Path],
    out: Path,
    scheduler: str,
    seed: int,
    target: Target,
    input_shapes: Mapping[str, Sequence[int]] | None,
    best: list[Record] | None,
) -> Iterator[CompileResult]:
    """Yield each model's result as its task ends. Zoo models are materialized on the
    workers; files travel as bytes (a worker cannot read this host's paths); the records
    travel as the best record of each workload for this host."""
    distributed = _distributed(f"the Dask scheduler {scheduler!r}")
    client = connect(scheduler)
    try:
        futures = {}
        for name, source in named.items():
            payload = source.read_bytes() if isinstance(source, Path) else source
            future = client.submit(
                compile_remote,
                payload,
                seed,
                target,
                None if input_shapes is None else dict(input_shapes),
                best,
                pure=False,
                key=f"polytile-compile-{name}-{uuid.uuid4().hex}",
            )
            futures[future] = name
        for future in distributed.as_completed(futures, loop=client.loop):
            name = futures[future]
            try:
                files, stats, seconds = future.result()
                path = out / f"{name}.ptm"
                _write_saved(files, path)
                yield CompileResult(name, path, None, seconds, stats)
            except distributed.KilledWorker as err:
                died = PolytileError(f"the Dask worker compiling it died: {err}")
                yield CompileResult(name, error=died)
            except Exception as err:  # the model's own error, raised again here
                yield CompileResult(name, error=err)
    finally:
        client.close()
