"""Budgets of building schedules (issue 43): a search candidate whose build runs out of
its isl operations or seconds is a `budget` record, never built again, and the tune goes
on; a kernel whose default schedule runs out of its budget compiles with a simpler
legal schedule and a warning. The budgets are made tiny by monkeypatching."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_tune import model as matmul_model

import polytile as pt
from polytile.errors import BudgetExceeded
from polytile.poly.default import schedule as D
from polytile.poly.dsl import kernel_from_node
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.oracle.interp import run_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.search import budget as B
from polytile.search.measure import MeasureConfig
from polytile.search.records import RecordFile
from polytile.search.space import SearchSpace
from polytile.search.state import decisions_key
from polytile.search.tune import tune

RNG = np.random.default_rng(0)
CONV_W = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)


def conv_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(CONV_W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CONV = kernel_from_node(conv_model())


def test_a_candidate_over_budget_raises_with_its_trace_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    space = SearchSpace(CONV, lanes=8)
    decisions = space.sample(random.Random(1))
    whole = space.build(decisions)
    monkeypatch.setattr(B, "BUILD_OPERATIONS", 50)
    with pytest.raises(BudgetExceeded, match="building the candidate went over") as caught:
        space.build(decisions)
    assert caught.value.resource == "isl operations"
    assert len(caught.value.trace) < len(whole.trace)  # it stopped on the way
    assert ih.CTX.get_max_operations() == 0
    monkeypatch.undo()
    again = space.build(decisions)  # the space's caches kept nothing of the refused build
    assert again.trace == whole.trace


def test_a_candidate_over_its_seconds_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    space = SearchSpace(CONV, lanes=8)
    monkeypatch.setattr(B, "BUILD_SECONDS", 0.0)
    with pytest.raises(BudgetExceeded, match="seconds") as caught:
        space.build(space.default_decisions())
    assert caught.value.resource == "seconds"


def test_a_tune_whose_builds_all_go_over_budget_records_them_and_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(B, "BUILD_OPERATIONS", 50)
    path = tmp_path / "r.jsonl"
    result = tune(matmul_model(), trials=6, records=str(path), seed=2, batch=3, progress=False)
    records = RecordFile(path).read()
    assert result.trials == len(records) == 6
    # the default schedule (not a search candidate) is measured; the rest went over budget
    assert [r.ok for r in records].count(True) == 1
    over = [r for r in records if r.error == "budget"]
    assert len(over) == 5 and all("isl operations" in r.message for r in over)
    keys = [decisions_key(r.decisions) for r in over if r.decisions is not None]
    assert len(keys) == len(over) == len(set(keys))  # each refused once, with its decisions


def test_refused_decisions_are_never_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some builds over budget (those that unroll): recorded, the others measured, and
    neither this run nor a resumed one builds a refused candidate again."""
    built: list[str] = []
    original = SearchSpace.build

    def build(self: SearchSpace, decisions: dict) -> object:
        built.append(decisions_key(decisions))
        if decisions["unroll"]:
            raise BudgetExceeded("kernel k: over budget (test)", "seconds", "test", ())
        return original(self, decisions)

    monkeypatch.setattr(SearchSpace, "build", build)
    path = tmp_path / "r.jsonl"
    here = MeasureConfig(build_timeout=None)  # built in this process: the patch applies
    tune(matmul_model(), trials=12, records=str(path), seed=5, batch=4, progress=False,
         measure=here)  # fmt: skip
    records = RecordFile(path).read()
    refused = {decisions_key(r.decisions) for r in records if r.error == "budget"}
    assert refused and any(r.ok for r in records[1:])
    assert len(built) == len(set(built))  # nothing built twice (the tuner keeps builds)
    built.clear()
    tune(matmul_model(), trials=8, records=str(path), seed=6, batch=4, progress=False,
         measure=here)  # fmt: skip
    assert not refused & set(built)
    assert len(RecordFile(path).read()) == len(records) + 8


def test_a_default_schedule_over_budget_falls_back_to_a_legal_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(D, "DEFAULT_OPERATIONS", 50)
    with pytest.warns(UserWarning, match=rf"kernel {CONV.name}: its default schedule went over"):
        schedule = D.default_schedule(CONV)
    assert schedule.trace == D.fallback_schedule(CONV).trace
    assert any(step.kind == "parallel" for step in schedule.trace)
    inputs = {t.name: RNG.standard_normal(t.shape).astype(t.dtype) for t in CONV.inputs()}
    expected = run_program_order(CONV, inputs)
    got = run_schedule(schedule, inputs)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


def test_an_outer_budget_running_out_is_not_the_default_schedules_to_handle() -> None:
    with (
        pytest.raises(BudgetExceeded, match="outer"),
        ih.operation_budget(50, "outer"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")  # no fallback, no warning
        D.default_schedule(CONV)


@pytest.mark.parametrize("make", [matmul_model, conv_model])
def test_compile_with_default_schedules_over_budget_is_correct(
    make: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make()  # type: ignore[operator]
    monkeypatch.setattr(D, "DEFAULT_OPERATIONS", 50)
    with pytest.warns(UserWarning, match="default schedule went over budget"):
        compiled = pt.compile(model)
    x = RNG.standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    ).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled.run({"x": x})[0], expected, rtol=1e-4, atol=1e-5)
