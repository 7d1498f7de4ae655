"""Measurement in worker processes: a good candidate is timed, a wrong result, a crash and
a hang become error records, and the worker is replaced so measuring goes on. Several
workers build in parallel but time one at a time, and lose no candidate when one dies."""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from polytile.codegen.target import host
from polytile.errors import InputError
from polytile.poly.default.schedule import default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.buffers import allocate
from polytile.poly.ir.kernel import Role
from polytile.search.measure import MeasureConfig, Measurer, Span, _Worker
from polytile.search.space import SearchSpace

GATHER = kernel("Y[i] = A[I[i]]", A=(8,), I=(4,), dtypes={"I": "int64"})


@pytest.fixture(scope="module", autouse=True)
def dying_workers() -> Iterator[None]:
    """Workers that die on `KILLER` (and otherwise measure as the real ones do)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Worker, "command", DYING_WORKER)
        yield


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    with Measurer(host(1), MeasureConfig(number=1, repeat=2, timeout=60)) as m:
        yield m


def test_good_wrong_and_crashing_candidates(measurer: Measurer) -> None:
    trace = default_schedule(GATHER).trace_json()
    a = np.arange(8, dtype=np.float32)
    good = {"A": a, "I": np.array([3, 1, 0, 7], dtype=np.int64)}
    measurer.set_task(GATHER, good, {"Y": a[[3, 1, 0, 7]]})
    (ok,) = measurer.measure("w", [trace])
    assert ok.ok and len(ok.latencies) == 2 and ok.latency > 0
    measurer.set_task(GATHER, good, {"Y": a[[3, 1, 0, 6]]})
    (wrong,) = measurer.measure("w", [trace])
    assert wrong.error == "wrong_result" and not wrong.ok
    far = {"A": a, "I": np.array([1 << 40] * 4, dtype=np.int64)}  # reads far outside A
    measurer.set_task(GATHER, far, {"Y": a[:4]})
    crashed, again = measurer.measure("w", [trace, trace])
    assert crashed.error == "crash" and again.error == "crash"
    measurer.set_task(GATHER, good, {"Y": a[[3, 1, 0, 7]]})
    (recovered,) = measurer.measure("w", [trace])
    assert recovered.ok  # a fresh worker took over


def test_an_illegal_trace_is_an_error_record(measurer: Measurer) -> None:
    a = np.arange(8, dtype=np.float32)
    measurer.set_task(GATHER, {"A": a, "I": np.zeros(4, np.int64)}, {"Y": np.zeros(4, "f4")})
    (bad,) = measurer.measure(
        "w", [[{"kind": "split", "args": {"loop": "nope", "factors": [2, None]}}]]
    )
    assert bad.error == "illegal" and "nope" in bad.message


def test_a_hang_times_out() -> None:
    n = 1000  # the initial (scalar) schedule takes seconds per run
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(n, n), B=(n, n))
    inputs = {"A": np.ones((n, n), "f4"), "B": np.ones((n, n), "f4")}
    with Measurer(host(1), MeasureConfig(number=1, repeat=1, timeout=0.5)) as m:
        m.set_task(k, inputs, {"Y": np.full((n, n), n, "f4")})
        (slow,) = m.measure("w", [[]])
        assert slow.error == "timeout"


# --- parallel builds, serialized timing ----------------------------------------------------

N = 32
MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(N, N), B=(N, N))
A = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
B = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
ILLEGAL = [{"kind": "split", "args": {"loop": "nope", "factors": [2, None]}}]
#: the measuring workers of these tests (`dying_worker.py`) die while building it
KILLER = [{"kind": "die", "args": {}}]
DYING_WORKER = (str(Path(__file__).with_name("dying_worker.py")),)


def matmul_traces(count: int) -> list[list[dict]]:
    space, rng, traces = SearchSpace(MATMUL, 16), random.Random(0), [[]]
    while len(traces) < count:
        trace = space.build(space.sample(rng)).trace
        if trace not in traces:
            traces.append(trace)
    return traces


def set_matmul(m: Measurer) -> None:
    m.set_task(MATMUL, {"A": A, "B": B}, {"Y": A @ B})


@pytest.fixture(scope="module")
def parallel() -> Iterator[Measurer]:
    """Two workers; a timed run lasts ≥ 2 × 20 ms, so overlaps would show."""
    config = MeasureConfig(number=1, repeat=2, min_repeat_ms=20, timeout=60, workers=2)
    with Measurer(host(1), config) as m:
        yield m


def overlap(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


def test_two_workers_measure_like_one(measurer: Measurer, parallel: Measurer) -> None:
    traces = matmul_traces(5)
    traces.insert(2, ILLEGAL)
    kinds = []
    for m in (measurer, parallel):
        set_matmul(m)
        records = m.measure("w", traces)
        assert [list(r.trace) for r in records] == traces
        kinds.append([r.error for r in records])
        assert all(r.ok for i, r in enumerate(records) if i != 2)
    assert kinds[0] == kinds[1] == [None, None, "illegal", None, None, None]


def test_builds_overlap_but_timed_runs_never_overlap_anything(parallel: Measurer) -> None:
    set_matmul(parallel)
    records = parallel.measure("w", matmul_traces(6))
    assert all(r.ok for r in records)
    builds = [s for s in parallel.spans if s.phase == "build"]
    timed = sorted((s for s in parallel.spans if s.phase == "time"), key=lambda s: s.start)
    assert len(builds) == len(timed) == 6
    assert any(overlap(a, b) for a, b in itertools.combinations(builds, 2))
    assert all(a.end <= b.start for a, b in itertools.pairwise(timed))
    assert not any(overlap(t, b) for t in timed for b in builds)


def test_a_crash_amid_a_parallel_batch_spares_the_others(parallel: Measurer) -> None:
    traces = matmul_traces(5)
    traces.insert(2, KILLER)
    set_matmul(parallel)
    records = parallel.measure("w", traces)
    assert [r.error for r in records] == [None, None, "crash", None, None, None]
    assert all(r.ok for i, r in enumerate(records) if i != 2)


def test_crashing_inputs_crash_every_candidate_then_workers_recover(parallel: Measurer) -> None:
    a = np.arange(8, dtype=np.float32)
    far = {"A": a, "I": np.array([1 << 40] * 4, dtype=np.int64)}
    trace = default_schedule(GATHER).trace_json()
    parallel.set_task(GATHER, far, {"Y": a[:4]})
    assert [r.error for r in parallel.measure("w", [trace] * 3)] == ["crash"] * 3
    parallel.set_task(GATHER, {"A": a, "I": np.zeros(4, np.int64)}, {"Y": np.zeros(4, "f4")})
    assert all(r.ok for r in parallel.measure("w", [trace] * 3))


def test_a_worker_hung_while_timing_loses_no_candidate() -> None:
    # the timed runs never reach min_repeat_ms; three built candidates on two workers:
    # one worker held two, so its second is built again on its replacement
    config = MeasureConfig(number=1, repeat=5, min_repeat_ms=1e9, timeout=1.5, workers=2)
    with Measurer(host(1), config) as m:
        set_matmul(m)
        records = m.measure("w", matmul_traces(3))
        assert [r.error for r in records] == ["timeout"] * 3
        built = collections.Counter(s.job for s in m.spans if s.phase == "build")
        assert sorted(built) == [0, 1, 2] and max(built.values()) == 2


def test_workers_must_be_positive() -> None:
    with pytest.raises(InputError, match="workers"):
        MeasureConfig(workers=0)


@pytest.mark.parametrize("flush_cache", [False, True])
def test_with_flush_cache_every_timed_run_follows_a_flush(
    flush_cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TVM's cache flush: the caches are flushed before each timed run (not once per
    repeat, which would leave all but the first run warm), and never otherwise."""
    import polytile.search.measure as M

    events: list[str] = []
    monkeypatch.setattr(M, "_flush", lambda buffer: events.append("flush"))

    class Native:
        def run_on(self, buffers: dict) -> None:
            events.append("run")

    # with flushes, `number` never grows towards min_repeat_ms: each run costs a flush
    least = 1e6 if flush_cache else 1e-9
    config = MeasureConfig(
        number=3, repeat=2, min_repeat_ms=least, flush_cache=flush_cache, cold="all"
    )
    results = M._time(Native(), {}, config)
    assert len(results) == 2 and all(r >= 0 for r in results)
    timed = ["flush", "run"] * 6 if flush_cache else ["run"] * 6
    assert events == ["run", *timed]  # one warm-up run, then 2 repeats of 3 runs


@pytest.mark.parametrize("has_clflush", [True, False])
def test_a_cold_run_evicts_only_the_weights_where_the_host_can(
    has_clflush: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cold="weights"` (the default): before every timed run the kernel's constant
    operands, and only they, are evicted line by line, so its activations stay where its
    last run left them, as in a model; on a host without `clflush` the caches are
    overwritten instead."""
    import polytile.codegen.flush as F
    import polytile.search.measure as M

    events: list[object] = []
    monkeypatch.setattr(M, "_flush", lambda buffer: events.append("flush all"))
    evict = lambda *buffers: events.append(("evict", [b.shape for b in buffers]))  # noqa: E731
    monkeypatch.setattr(F, "line_flusher", lambda target: evict if has_clflush else None)
    conv = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"]),
        {"x": (1, 4, 3, 3)},
        initializers={"w": np.ones((2, 4, 1, 1), np.float32)},
    )
    roles = {t.name: t.role for t in conv.tensors.values()}
    assert Role.CONSTANT in roles.values() and Role.INPUT in roles.values()

    class Native:
        kernel = conv
        target = host()

        def run_on(self, buffers: dict) -> None:
            events.append("run")

    buffers = allocate(conv, {"x": np.zeros((1, 4, 3, 3), np.float32)})
    config = MeasureConfig(number=2, repeat=1, flush_cache=True)
    assert config.cold == "weights"
    M._time(Native(), buffers, config)
    flush = ("evict", [(2, 4, 1, 1)]) if has_clflush else "flush all"
    assert events == ["run", flush, "run", flush, "run"]


def test_cold_names_what_a_flush_evicts() -> None:
    with pytest.raises(InputError, match="cold"):
        MeasureConfig(cold="some")


def test_a_cold_run_follows_the_producers_and_reads_what_they_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cold="producer"`: before every timed run the task's producers run
    in model order, writing the candidate's inputs, and then its weights are evicted;
    the candidate reads each such input from its producer's output buffer (the same
    memory, whatever shape the producer gave it). Warm timing runs no producer."""
    import polytile.codegen.flush as F
    import polytile.search.measure as M

    events: list[object] = []
    evict = lambda *buffers: events.append(("evict", [b.shape for b in buffers]))  # noqa: E731
    monkeypatch.setattr(F, "line_flusher", lambda target: evict)
    conv = kernel_from_node(
        helper.make_node("Conv", ["x", "w", "b"], ["y"]),
        {"x": (1, 4, 3, 3), "b": (2,)},
        initializers={"w": np.ones((2, 4, 1, 1), np.float32)},
    )
    x, b = (
        next(t.name for t in conv.tensors.values() if t.shape == s) for s in [(1, 4, 3, 3), (2,)]
    )
    assert conv.tensors[x].role is Role.INPUT and conv.tensors[b].role is Role.INPUT

    class Producer:
        def __init__(self, name: str) -> None:
            self.name = name

        def run_on(self, buffers: dict) -> None:
            events.append(self.name)

    made = {"bias": np.zeros(2, np.float32), "out": np.zeros(36, np.float32)}

    class Native:
        kernel = conv
        target = host()
        shared = True

        def run_on(self, buffers: dict) -> None:
            assert buffers[x].shape == (1, 4, 3, 3)
            assert np.shares_memory(buffers[x], made["out"]) is self.shared
            assert np.shares_memory(buffers[b], made["bias"]) is self.shared
            events.append("run")

    ready = [(Producer("first"), made, "bias", b), (Producer("second"), made, "out", x)]
    buffers = allocate(conv, {x: np.zeros((1, 4, 3, 3), np.float32), b: np.zeros(2, np.float32)})
    config = MeasureConfig(number=2, repeat=1, flush_cache=True, cold="producer")
    M._time(Native(), buffers, config, ready)
    produced = ["first", "second", ("evict", [(2, 4, 1, 1)])]
    assert events == ["run", *produced, "run", *produced, "run"]
    events.clear()
    warm = Native()
    warm.shared = False
    M._time(warm, buffers, MeasureConfig(number=1, repeat=1, min_repeat_ms=0), ready)
    assert events == ["run"] * 2
