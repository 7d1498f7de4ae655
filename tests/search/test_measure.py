"""Measurement in worker processes: a good candidate is timed, a wrong result, a crash and
a hang become error records, and the worker is replaced so measuring goes on."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from polytile.codegen.target import host
from polytile.poly.default import default_schedule
from polytile.poly.dsl import kernel
from polytile.search.measure import MeasureConfig, Measurer

GATHER = kernel("Y[i] = A[I[i]]", A=(8,), I=(4,), dtypes={"I": "int64"})


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
