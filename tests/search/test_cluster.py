"""Scale-out on a Dask cluster (a `LocalCluster` of one worker process): candidates built
there are verified and timed here with the same error kinds as local builds, a Dask worker
that dies is a crash record, an unreachable scheduler or a missing extra is a clear error,
and a batch compiled on the cluster matches one compiled here."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, save
from test_measure import GATHER, ILLEGAL, matmul_traces, set_matmul

import polytile as pt
from polytile import cli, zoo
from polytile.batch import compile_many
from polytile.codegen.target import host
from polytile.errors import InputError, ModelError
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel
from polytile.search import cluster as pc
from polytile.search.measure import MeasureConfig, Measurer, Span
from polytile.search.records import RecordFile

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

#: not schedule steps: a local worker fails to replay them, a hooked Dask worker dies on
#: the first and takes `SLOW_SECONDS` over the second
DIE = [{"kind": "die", "args": {}}]
SLOW = [{"kind": "slow", "args": {}}]
SLOW_SECONDS = 4.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One worker process, so that a build can kill it; the scheduler gives a task up at
    the first worker it kills (its default retries it on three more)."""
    cache = tmp_path_factory.mktemp("worker-cache")
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        local = distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env={"XDG_CACHE_HOME": str(cache)},
        )
    try:
        yield local
    finally:
        local.close()


def config(scheduler: str | None = None, workers: int = 1) -> MeasureConfig:
    return MeasureConfig(number=1, repeat=2, timeout=60, workers=workers, scheduler=scheduler)


@pytest.fixture(scope="module")
def here() -> Iterator[Measurer]:
    with Measurer(host(1), config()) as m:
        yield m


@pytest.fixture(scope="module")
def remote(cluster: Any) -> Iterator[Measurer]:
    """Built on the cluster, loaded and verified here by two workers."""
    with Measurer(host(1), config(cluster.scheduler_address, workers=2)) as m:
        yield m


def overlap(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


def test_cluster_builds_give_the_records_of_local_builds(here: Measurer, remote: Measurer) -> None:
    traces = matmul_traces(4)
    traces[2:2] = [ILLEGAL]
    kinds = []
    for m in (here, remote):
        set_matmul(m)
        records = m.measure("w", traces)
        assert [list(r.trace) for r in records] == traces
        assert all(r.target == host(1).key() for r in records)
        assert all(r.latency > 0 for r in records if r.error is None)
        kinds.append([r.error for r in records])
    assert kinds[0] == kinds[1] == [None, None, "illegal", None, None]
    built = {s.job for s in remote.spans if s.phase == "remote"}
    assert built == {0, 1, 3, 4}  # the illegal trace built nothing
    timed = [s for s in remote.spans if s.phase == "time"]
    assert len(timed) == 4
    # the LocalCluster's worker runs on this host: it builds nothing during a timed run
    assert not any(overlap(t, b) for t in timed for b in remote.spans if b.phase == "remote")


def test_a_candidate_that_rewrites_its_kernel_runs_on_the_rewritten_kernel(
    here: Measurer, remote: Measurer
) -> None:
    """Packing the weights adds a tensor the task's kernel does not have: the loaded code
    gets the buffers of the kernel it was built from."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    k = kernel("Y[i, j] += A[i, k] * W[k, j]", A=a.shape, W=w)
    trace = default_schedule(k, DefaultConfig(vector_width=16)).trace_json()
    assert "pack" in [step["kind"] for step in trace]
    errors = []
    for m in (here, remote):
        m.set_task(k, {"A": a}, {"Y": a @ w})
        (record,) = m.measure("w", [trace])
        errors.append((record.error, record.message))
    assert errors == [(None, ""), (None, "")]
    assert any(s.phase == "remote" for s in remote.spans)


def test_wrong_results_and_crashing_kernels_are_caught_here(
    here: Measurer, remote: Measurer
) -> None:
    trace = default_schedule(GATHER).trace_json()
    a = np.arange(8, dtype=np.float32)
    good = {"A": a, "I": np.array([3, 1, 0, 7], dtype=np.int64)}
    far = {"A": a, "I": np.array([1 << 40] * 4, dtype=np.int64)}  # reads far outside A
    for m in (here, remote):
        m.set_task(GATHER, good, {"Y": a[[3, 1, 0, 6]]})
        assert [r.error for r in m.measure("w", [trace])] == ["wrong_result"]
        m.set_task(GATHER, far, {"Y": a[:4]})
        assert [r.error for r in m.measure("w", [trace, trace])] == ["crash", "crash"]
        m.set_task(GATHER, good, {"Y": a[[3, 1, 0, 7]]})
        (ok,) = m.measure("w", [trace])
        assert ok.ok and ok.latency > 0


def hook_markers() -> None:
    """In a Dask worker: replaying DIE kills the worker's process, SLOW takes seconds.
    (Importing the builder here also spares the first build its imports.)"""
    import polytile.search.cluster  # noqa: F401
    from polytile.poly.transform import steps as transform

    replay = transform.replay

    def hooked(kernel: Any, trace: Any) -> Any:
        if list(trace) == DIE:
            os._exit(3)
        if list(trace) == SLOW:
            time.sleep(SLOW_SECONDS)
        return replay(kernel, trace)

    transform.replay = hooked


def hook_workers(cluster: Any) -> None:
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        client.run(hook_markers)


def test_a_build_past_its_timeout_is_a_timeout_record(cluster: Any) -> None:
    hook_workers(cluster)
    slow = MeasureConfig(
        number=1, repeat=1, timeout=SLOW_SECONDS / 2, scheduler=cluster.scheduler_address
    )
    with Measurer(host(1), slow) as m:
        set_matmul(m)
        # last: the worker stays busy with it, and a build queued behind it could time out
        good, late = m.measure("w", [matmul_traces(1)[0], SLOW])
    assert good.ok and late.error == "timeout"
    assert "Dask cluster" in late.message


def test_a_dask_worker_dying_mid_build_is_a_crash_record(cluster: Any, remote: Measurer) -> None:
    hook_workers(cluster)
    traces = matmul_traces(2)
    set_matmul(remote)
    records = remote.measure("w", [traces[0], DIE, traces[1]])
    assert [r.error for r in records] == [None, "crash", None]
    assert "died" in records[1].message
    assert records[2].latency > 0  # built on the restarted worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_scheduler_is_a_quick_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pc, "CONNECT_TIMEOUT", 1.0)
    address = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(InputError, match=f"cannot reach the Dask scheduler at '{address}'"):
        Measurer(host(1), config(address))
    assert time.monotonic() - start < 10


def test_without_the_extra_the_error_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    extra = r"needs the optional extra: pip install 'polytile\[dask\]'"
    with pytest.raises(InputError, match=extra):
        Measurer(host(1), config("tcp://127.0.0.1:8786"))
    model = write_model(tmp_path / "relu.onnx", "Relu")
    with pytest.raises(InputError, match=extra):
        compile_many([str(model)], tmp_path / "out", "tcp://127.0.0.1:8786")


def test_the_scheduler_must_be_an_address() -> None:
    with pytest.raises(InputError, match="scheduler"):
        MeasureConfig(scheduler="")


# --- batch compilation --------------------------------------------------------------------


def write_model(path: Path, op: str, shape: tuple[int, ...] = (4, 37)) -> Path:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])],
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_batch_compiled_on_the_cluster_matches_one_compiled_here(
    cluster: Any, tmp_path: Path
) -> None:
    models = [
        write_model(tmp_path / "relu.onnx", "Relu"),
        write_model(tmp_path / "tanh.onnx", "Tanh"),
    ]
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    batch = [str(models[0]), str(broken), str(models[1])]
    seen: list[str] = []
    outputs = {}
    for where, scheduler in (("here", None), ("cluster", cluster.scheduler_address)):
        results = compile_many(
            batch,
            tmp_path / where,
            scheduler,
            num_threads=1,
            progress=lambda r: seen.append(r.name),
        )
        assert [r.name for r in results] == ["relu", "broken", "tanh"]
        assert isinstance(results[1].error, ModelError) and results[1].path is None
        assert all(r.ok and r.stats.kernels >= 1 for r in (results[0], results[2]))
        x = np.random.default_rng(0).standard_normal((4, 37)).astype(np.float32)
        outputs[where] = [
            pt.load(r.path, num_threads=1).run({"x": x})[0] for r in (results[0], results[2])
        ]
    assert sorted(seen) == sorted(["relu", "broken", "tanh"] * 2)
    for mine, theirs in zip(outputs["here"], outputs["cluster"], strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_cli_compiles_the_zoo_and_tunes_on_the_cluster(
    cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    address = cluster.scheduler_address
    out = tmp_path / "compiled"
    argv = ["compile", "--zoo", "mlp", "-o", str(out), "--threads", "1", "--scheduler", address]
    assert cli.main(argv) == 0
    assert "compiled mlp in" in capsys.readouterr().out
    remote = pt.load(out / "mlp.ptm", num_threads=1)
    local = pt.compile(str(zoo.materialize("mlp")), num_threads=1)
    feeds = local.random_inputs(0)
    for mine, theirs in zip(local.run(feeds), remote.run(feeds), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    model = write_model(tmp_path / "relu.onnx", "Relu", (64, 48))
    assert cli.main(["compile", str(model), "--scheduler", address]) == cli.EXIT_BAD_INPUT
    assert "--zoo" in capsys.readouterr().err
    records = tmp_path / "r.jsonl"
    argv = ["tune", str(model), "--trials", "2", "--batch", "2", "--records", str(records)]
    assert cli.main([*argv, "--threads", "1", "--scheduler", address]) == 0
    measured = [r for r in RecordFile(records).read() if r.timing == "kernel"]
    assert len(measured) == 2 and all(r.ok for r in measured)  # then validated in the model
