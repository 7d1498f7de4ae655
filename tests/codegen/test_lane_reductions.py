"""Vector loops that carry a reduction into one element all their iterations share
(`S[i] += X[i, j]` vectorized along j): each lane keeps a partial result, the lanes in
use are combined at the end of each vector. Against numpy, at sizes that leave partial
vectors, and with the loop's size symbolic."""

from __future__ import annotations

import numpy as np
import pytest

from polytile.codegen.native import NativeKernel
from polytile.errors import IllegalSchedule
from polytile.poly.default.schedule import default_schedule
from polytile.poly.dsl import kernel
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.transform import steps as T

#: combiner → (statement, numpy reduction along axis 1)
COMBINERS = {
    "sum": ("S[i] += exp(X[i, j])", lambda x: np.exp(x).sum(1)),
    "max": ("S[i] max= X[i, j]", lambda x: x.max(1)),
    "min": ("S[i] min= X[i, j]", lambda x: x.min(1)),
    "prod": ("S[i] *= X[i, j]", lambda x: x.prod(1)),
}


def _schedules(statement: str, columns: int | str) -> list:
    """The reduction loop vectorized whole, and split by 16 with the inner part vectorized."""
    k = kernel(statement, X=(5, columns))
    whole = T.vectorize(initial_schedule(k), "j")
    split = T.split(initial_schedule(k), "j", [None, 16])
    return [whole, T.vectorize(split, "j1")]


@pytest.mark.parametrize("combiner", sorted(COMBINERS))
@pytest.mark.parametrize("columns", [37, 3, "p"])
def test_vector_reduction_into_one_element_matches_numpy(combiner: str, columns: int | str) -> None:
    statement, reference = COMBINERS[combiner]
    rng = np.random.default_rng(7)
    for schedule in _schedules(statement, columns):
        native = NativeKernel(schedule)
        for width in (37, 16, 5, 1) if columns == "p" else (columns,):
            # values near 1 keep a product of 37 of them finite
            x = (1 + 0.1 * rng.standard_normal((5, width))).astype(np.float32)
            x[0] -= 3  # the max and min are not where a masked lane's garbage would be
            got = native.outputs({"X": x})["S"]
            np.testing.assert_allclose(
                got, reference(x), rtol=2e-5, err_msg=f"{schedule.trace_json()} at {width}"
            )


def test_a_nan_in_any_lane_comes_out_of_a_max() -> None:
    (schedule, _) = _schedules("S[i] max= X[i, j]", 37)
    x = np.zeros((5, 37), np.float32)
    x[1, 0] = x[2, 17] = x[3, 36] = np.nan
    got = NativeKernel(schedule).outputs({"X": x})["S"]
    np.testing.assert_array_equal(np.isnan(got), [False, True, True, True, False])


def test_only_a_reduction_into_a_shared_element_may_be_carried() -> None:
    """A loop that carries anything else stays scalar, such as a plain overwrite of one
    element (the last iteration's value wins). A column sum vectorized down its column
    (lanes rows apart, all adding into one element) is a reduction like a row's."""
    k = kernel("S[i] = X[i, j]", X=(5, 37))
    with pytest.raises(IllegalSchedule, match="carries the dependence"):
        T.vectorize(initial_schedule(k), "j")
    k = kernel("Y[j] += X[i, j]", X=(6, 8))
    schedule = T.vectorize(T.reorder(initial_schedule(k), "j", "i"), "i")
    x = np.random.default_rng(2).standard_normal((6, 8)).astype(np.float32)
    np.testing.assert_allclose(NativeKernel(schedule).outputs({"X": x})["Y"], x.sum(0), rtol=1e-5)


def test_default_schedule_vectorizes_softmax_sum_along_its_row() -> None:
    """Softmax's sum of exponentials, a statement after the row's max: its row loop is now
    a vector loop (before, one `exp` at a time)."""
    k = kernel("M[i] max= X[i, j]", "S[i] += exp(X[i, j] - M[i])", X=(8, "p"))
    schedule = default_schedule(k)
    vector = [lp.name for lp in schedule.loops_of("S") if lp.annotation == "vector"]
    assert vector, schedule.trace_json()
    native = NativeKernel(schedule)
    for width in (1, 7, 40):
        x = np.random.default_rng(width).standard_normal((8, width)).astype(np.float32)
        want = np.exp(x - x.max(1, keepdims=True)).sum(1)
        np.testing.assert_allclose(native.outputs({"X": x})["S"], want, rtol=1e-5)


@pytest.mark.parametrize("combiner", ["sum", "max"])
def test_a_promoted_row_reduction_keeps_a_vector_of_partial_results(combiner: str) -> None:
    """Along a promoted reduction loop the accumulator is a vector (its lanes combined
    once, after the loop), not a scalar the lanes are combined into at every vector;
    a scalar remainder piece adds into the same element."""
    statement, reference = COMBINERS[combiner]
    _, split = _schedules(statement, 70)
    native = NativeKernel(split)
    assert "alloca <16 x float>" in native.ir
    x = np.random.default_rng(5).standard_normal((5, 70)).astype(np.float32)
    np.testing.assert_allclose(native.outputs({"X": x})["S"], reference(x), rtol=2e-5)
