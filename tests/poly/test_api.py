"""The researcher API from the top-level package: TVM's mm_relu tutorial written with
`pt.kernel`, scheduled with `pt.ScheduleHandle`, interpreted, built and timed, checked
against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.errors import IllegalSchedule
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.transform.steps import replay


def test_mm_relu_tutorial_from_the_package() -> None:
    k = pt.kernel(
        "Y[i, j] += A[i, k] * B[k, j]",
        "C[i, j] = max(Y[i, j], 0)",
        A=(32, 16),
        B=(16, 24),
        name="mm_relu",
    )
    sch = pt.ScheduleHandle(k)
    i, j, kk = sch.get_loops("Y")
    j0, j1 = sch.split(j, [None, 8])
    sch.reorder(j0, kk, j1)
    sch.reverse_compute_at("C", j0)
    sch.decompose_reduction("Y", kk)
    sch.vectorize(j1)
    sch.parallel(i)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((16, 24)).astype(np.float32)
    want = np.maximum(a.astype(np.float64) @ b, 0)
    interpreted = run_schedule(sch.schedule, {"A": a, "B": b})["C"]
    built = sch.build().outputs({"A": a, "B": b})["C"]
    for out in (interpreted, built):
        assert out.shape == (32, 24) and out.dtype == np.float32
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    timing = sch.benchmark({"A": a, "B": b}, repeat=3)
    assert len(timing.results) == 3 and timing.min > 0
    assert replay(k, sch.trace).trace_hash() == sch.schedule.trace_hash()
    with pytest.raises(IllegalSchedule):
        sch.parallel(kk)


def test_default_schedule_from_the_package() -> None:
    k = pt.kernel("Y[i, j] += A[i, k] * B[k, j]", A=(16, 8), B=(8, 32))
    schedule = pt.default_schedule(k)
    assert any(loop.annotation == "vector" for loop, _ in schedule.loops())


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError, match="compile_everything"):
        pt.compile_everything  # noqa: B018
