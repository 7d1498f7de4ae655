"""Batch compilation: models (zoo names or .onnx files) compiled one by one here, or each
as a task on a Dask cluster (`search.cluster` connects to it), saved as `.ptm` files.

On the cluster a model's zoo name (materialized on the worker) or its ONNX bytes, this
host's `Target` and the best tuning record of each workload go out; the files of its
saved `.ptm` come back and are written to the output directory, loadable here without
recompiling. A model that fails is a result holding its error; the others go on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from polytile import zoo
from polytile.codegen.target import Target, host
from polytile.errors import InputError, PolytileError
from polytile.search.cluster import connect, require_distributed
from polytile.search.records import Record, tuned_records

from .compiler import CompileStats, compile
from .runtime import CompiledModel, replace_directory


@dataclass(frozen=True)
class CompileResult:
    """One model of a batch: where it was saved, or the error that stopped it."""

    name: str
    path: Path | None = None
    error: BaseException | None = None
    #: compile time, where it ran
    seconds: float = 0.0
    stats: CompileStats | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _sources(models: Sequence[str]) -> dict[str, str | Path]:
    """Name → zoo name or .onnx path, like the command line's model arguments."""
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
    records: Sequence[Record] | None,
) -> tuple[CompiledModel, float]:
    """A model compiled for `target` and the seconds it took; a str source is a zoo name."""
    start = time.perf_counter()
    if isinstance(source, str):
        model: str | bytes = str(zoo.materialize(source, seed=seed))
    else:
        model = str(source) if isinstance(source, Path) else source
    compiled = compile(model, records=records, input_shapes=input_shapes, target=target)
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
    records: Sequence[Record] | None,
) -> tuple[dict[str, bytes], CompileStats | None, float]:
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
    distributed = require_distributed(f"the Dask scheduler {scheduler!r}")
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
