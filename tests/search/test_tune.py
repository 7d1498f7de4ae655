"""tune: records every measurement, resumes without repeating a candidate, and compile
applies the best verified record per workload (and ignores another target's)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.errors import InputError
from polytile.search.measure import MeasureConfig
from polytile.search.records import RecordFile
from polytile.search.tasks import extract_tasks, select_tasks
from polytile.search.tune import tune

RNG = np.random.default_rng(0)
#: candidates built in the test's process: tests of the tuner's logic start no build
#: workers (`test_builder.py` tests them)
HERE = MeasureConfig(build_timeout=None)
W = RNG.standard_normal((32, 48)).astype(np.float32)


def model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_tasks_are_deduplicated_and_selectable() -> None:
    tasks = extract_tasks(model())
    assert len(tasks) >= 1 and all(t.weight >= 1 and t.flops > 0 for t in tasks)
    assert select_tasks(tasks, "0") == tasks[:1]
    with pytest.raises(InputError, match="no task"):
        select_tasks(tasks, "0-99")


def test_tune_records_resumes_and_compile_applies(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    result = tune(
        model(), trials=6, records=str(path), seed=3, batch=3, progress=False, measure=HERE
    )
    records = RecordFile(path).read()
    assert result.trials == len(records) == 6
    assert records[0].ok  # the default schedule, measured first as the baseline
    keys = [r.trace_key() for r in records]
    assert len(set(keys)) == len(keys)
    assert "estimated model latency" in result.table()
    again = tune(
        model(), trials=3, records=str(path), seed=3, batch=3, progress=False, measure=HERE
    )
    records = RecordFile(path).read()
    assert again.trials == 3 and len(records) == 9
    assert len({r.trace_key() for r in records}) == 9  # nothing measured twice
    x = RNG.standard_normal((24, 32)).astype(np.float32)
    want = 1 / (1 + np.exp(-np.maximum(x @ W, 0)))
    tuned = pt.compile(model(), records=str(path))
    np.testing.assert_allclose(tuned.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_resuming_records_timed_another_way_warns(tmp_path: Path) -> None:
    """Each record says how its timed runs started; a tune resuming a file whose
    candidates were timed otherwise (warm here, cold there) says that their latencies
    are compared as they are. Resumed the same way, it says nothing."""
    import warnings

    path = tmp_path / "r.jsonl"
    tune(model(), trials=2, records=str(path), seed=0, batch=2, progress=False, measure=HERE)
    assert {r.start for r in RecordFile(path).read()} == {"warm"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tune(model(), trials=1, records=str(path), seed=0, batch=1, progress=False, measure=HERE)
    assert not [w for w in caught if "were timed" in str(w.message)]
    cold = MeasureConfig(flush_cache=True, number=1, repeat=1, build_timeout=None)
    with pytest.warns(UserWarning, match="timed warm, this run times them weights"):
        tune(model(), trials=1, records=str(path), seed=0, batch=1, progress=False,
             measure=cold)  # fmt: skip
    assert [r.start for r in RecordFile(path).read()] == ["warm"] * 3 + ["weights"]


def test_compile_ignores_records_of_another_target(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    tune(model(), trials=2, records=str(path), seed=0, batch=2, progress=False, measure=HERE)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line["target"]["cpu"] = "another-cpu"
        line["trace"] = [{"kind": "split", "args": {"loop": "nope", "factors": [2, None]}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    x = RNG.standard_normal((24, 32)).astype(np.float32)
    compiled = pt.compile(model(), records=str(path))  # the bogus traces are never applied
    assert compiled.run({"x": x})[0].shape == (24, 48)
    with pytest.raises(InputError, match="does not exist"):
        pt.compile(model(), records=str(tmp_path / "missing.jsonl"))


def test_same_seed_and_records_propose_the_same_candidates(tmp_path: Path) -> None:
    from polytile.codegen.target import host
    from polytile.search.cost_model import RandomModel
    from polytile.search.tune import Tuner

    tasks = extract_tasks(model())
    records = RecordFile(tmp_path / "r.jsonl")

    def proposals(seed: int, strategy: str) -> list[str]:
        tuner = Tuner(
            tasks, records, host(1), seed, strategy, model=RandomModel(seed), measure=HERE
        )
        return [json.dumps(c.trace) for c in tuner.propose(tuner.states[0], 6)]

    for strategy in ("random", "evolutionary"):
        first = proposals(5, strategy)
        assert len(first) == 6 and len(set(first)) == 6
        assert proposals(5, strategy) == first
    assert proposals(6, "random") != proposals(5, "random")


def test_a_batch_measuring_the_default_never_proposes_it_again(tmp_path: Path) -> None:
    """The first batch of a task measures the default schedule; mutations of the default
    decisions often rebuild its trace, which must not be measured a second time in that
    batch (the run round passes the batch's traces as excluded)."""
    from polytile.codegen.target import host
    from polytile.search.cost_model import RandomModel
    from polytile.search.records import trace_key
    from polytile.search.tune import Tuner

    tasks, records = extract_tasks(model()), RecordFile(tmp_path / "r.jsonl")
    # one candidate built per slot (no ranking): the mutations of the default show at once
    tuner = Tuner(tasks, records, host(1), 0, model=RandomModel(0), pool=1, measure=HERE)
    state = tuner.states[0]

    def hits(exclude: frozenset[str]) -> int:
        rounds = (tuner.propose(state, 6, exclude) for _ in range(3))
        return sum(state.default_key in [trace_key(c.trace) for c in r] for r in rounds)

    assert hits(frozenset()) > 0  # the collision is real for this seed
    assert hits(frozenset({state.default_key})) == 0


KILL_SCRIPT = """
import sys
from polytile.search.measure import MeasureConfig
from polytile.search.tune import tune
tune(sys.argv[1], trials=40, records=sys.argv[2], seed=1, batch=3, progress=False,
     measure=MeasureConfig(min_repeat_ms=150, repeat=2))
"""


def _lines(path: Path) -> list[str]:
    """The complete (newline-terminated) lines: what was committed."""
    text = path.read_text() if path.exists() else ""
    return text.splitlines(keepends=True)[: text.count("\n")]


def test_sigkill_mid_batch_loses_no_committed_record(tmp_path: Path) -> None:
    """Killed mid-batch on a model of two tasks, then resumed: every committed line is
    still there and no (task, candidate) is measured twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    onnx.save(two_matmuls(), tmp_path / "m.onnx")
    path = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "m.onnx"), str(path)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while len(_lines(path)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        # each candidate times for ≥ 0.3 s, so the second batch of 3 is in flight now
        time.sleep(0.5)
        assert proc.poll() is None, "the tuner finished before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    committed = _lines(path)
    assert 3 <= len(committed) < 40
    tune(two_matmuls(), trials=6, records=str(path), seed=1, batch=3, progress=False, measure=HERE)
    after = _lines(path)
    assert after[: len(committed)] == committed  # no committed record lost
    records = RecordFile(path).read()
    assert len(records) == len(committed) + 6
    assert len({r.workload for r in records}) == 2
    keys = [(r.workload, r.trace_key()) for r in records]
    assert len(set(keys)) == len(keys)  # no candidate measured twice


def test_resuming_restores_the_population_and_pretrains_the_model(tmp_path: Path) -> None:
    from polytile.codegen.target import host
    from polytile.search.cost_model import GBModel
    from polytile.search.tune import Tuner

    path = tmp_path / "r.jsonl"
    tune(model(), trials=10, records=str(path), seed=2, batch=5, progress=False, measure=HERE)
    records = RecordFile(path).read()
    assert all(r.decisions is not None for r in records[1:])
    fresh = GBModel(seed=0)
    tuner = Tuner(extract_tasks(model()), RecordFile(path), host(), 2, model=fresh)
    state = tuner.states[0]
    assert state.trials == 10 and len(state.measured) == 10
    assert all(m.row is not None for m in state.measured)  # replayed and featurized
    assert fresh.trained  # pre-trained on the 10 earlier measurements
    best = min((r for r in records if r.ok and r.decisions), key=lambda r: r.latency)
    assert tuner._parents(state)[0] == best.decisions


@pytest.mark.parametrize("kind", ["regression", "ranking"])
def test_cost_models_rank_held_out_rows_and_survive_save_and_load(
    kind: str, tmp_path: Path
) -> None:
    from polytile.errors import TuningError
    from polytile.search.cost_model import MODELS, load_model

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((120, 5))
    scores = np.exp(rows[:, 0] - 0.5 * rows[:, 1] ** 2)  # a smooth "throughput"
    trained = MODELS[kind](seed=3)
    trained.fit_rows(rows[:80].tolist(), scores[:80].tolist(), ["t"] * 80)
    pred, truth = trained.predict_rows(rows[80:].tolist()), scores[80:]
    pairs = [(i, j) for i in range(40) for j in range(i + 1, 40)]
    right = sum((pred[i] - pred[j]) * (truth[i] - truth[j]) > 0 for i, j in pairs)
    assert right / len(pairs) > 0.8  # random scores rank half the pairs right
    trained.save(tmp_path / "m.pkl")
    loaded = load_model(tmp_path / "m.pkl")
    assert type(loaded) is type(trained)
    np.testing.assert_array_equal(loaded.predict_rows(rows[80:]), pred)
    (tmp_path / "bad.pkl").write_bytes(b"not a pickle")
    with pytest.raises(TuningError, match=r"bad\.pkl"):
        load_model(tmp_path / "bad.pkl")


def test_task_scheduler_warms_up_then_follows_the_gradient(tmp_path: Path) -> None:
    from dataclasses import replace

    from polytile.codegen.target import host
    from polytile.search.records import Record
    from polytile.search.tune import ALPHA, Tuner

    (task,) = extract_tasks(model())
    tasks = [task, replace(task, index=1, weight=4)]
    tuner = Tuner(
        tasks, RecordFile(tmp_path / "r.jsonl"), host(), 0, task_epsilon=0.0, measure=HERE
    )
    assert tuner.next_task() is tuner.states[0]  # warm-up: no baseline yet

    def measure(state: object, latencies: list[float]) -> None:
        for i, latency in enumerate(latencies):
            trace = state.default_trace if i == 0 else [{"kind": "nop", "args": {"i": i}}]
            state.add(Record(task.key, {}, tuple(trace), (latency,)), None, None)
        state.rounds += 1

    first, second = tuner.states
    measure(first, [2e-3] * 8)
    assert tuner.next_task() is second  # still warming up
    measure(second, [2e-3] * 8)
    # the same curves: the heavier task (weight 4) gains the model more per trial
    assert tuner.next_task() is second
    assert tuner.gradient(second) == pytest.approx(4 * tuner.gradient(first))
    # equal weights, trials and latencies: the task still improving wins
    tuner = Tuner(tasks[:1] * 2, RecordFile(tmp_path / "r.jsonl"), host(), 0, task_epsilon=0.0,
                  measure=HERE)  # fmt: skip
    first, second = tuner.states
    measure(first, [2e-3] * 8 + [2e-3 - k * 1.25e-4 for k in range(1, 9)])
    measure(second, [1e-3] * 16)
    assert first.latency == second.latency and first.trials == second.trials
    assert tuner.gradient(first) < tuner.gradient(second)
    assert tuner.next_task() is first
    # tasks that only move data (a transpose: no FLOPs) have no throughput to reach; the
    # gradient falls back to the latency per trial instead of dividing by zero
    data = replace(task, index=2, kind="injective", flops=0)
    tuner = Tuner([data, replace(data, index=3)], RecordFile(tmp_path / "r.jsonl"), host(),
                  0, task_epsilon=0.0, measure=HERE)  # fmt: skip
    first, second = tuner.states
    measure(first, [2e-3] * 4)
    measure(second, [1e-3] * 4)
    assert tuner.gradient(first) == pytest.approx((1 - ALPHA) * -2e-3 / 4)  # flat: no slope
    assert tuner.next_task() is first


def test_the_population_starts_from_the_default_decisions_unless_ablated(
    tmp_path: Path,
) -> None:
    from polytile.codegen.target import host
    from polytile.search.tune import Tuner

    tasks = extract_tasks(model())
    records = RecordFile(tmp_path / "r.jsonl")
    seeded = Tuner(tasks, records, host(), 0, measure=HERE)
    state = seeded.states[0]
    assert seeded._parents(state) == [state.space.default_decisions()]
    ablated = Tuner(tasks, records, host(), 0, start_from_default=False, measure=HERE)
    assert ablated._parents(state) == []


def two_matmuls() -> onnx.ModelProto:
    w2 = RNG.standard_normal((48, 40)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(W, "w"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_task_tries_the_best_decisions_of_its_kind_from_the_other_tasks(
    tmp_path: Path,
) -> None:
    import random

    from polytile.codegen.target import host
    from polytile.search.cost_model import RandomModel
    from polytile.search.records import Record, trace_key
    from polytile.search.tune import Tuner

    tasks = extract_tasks(two_matmuls())
    assert len(tasks) == 2 and tasks[0].kind == tasks[1].kind
    tuner = Tuner(tasks, RecordFile(tmp_path / "r.jsonl"), host(), 0, model=RandomModel(0),
                  measure=HERE)  # fmt: skip
    first, second = tuner.states
    rng = random.Random(3)
    samples = [first.space.sample(rng) for _ in range(40)]
    good, bad = (
        next(d for d in samples if d["vec_loop"] == loop and d["block"] > 2) for loop in ("j", None)
    )
    for decisions, latency in ((bad, 2e-3), (good, 1e-3)):
        trace = tuple(first.space.build(decisions).trace)
        first.add(Record(first.task.key, {}, trace, (latency,)), decisions, None)
    wanted = tuner._build(second, second.space.complete(good))
    proposed = tuner.propose(second, 6)
    keys = [trace_key(c.trace) for c in proposed]
    assert len(proposed) == 6 and len(set(keys)) == 6
    # the other task's best (not its worse candidate), in this task's space, measured first
    assert keys[0] == trace_key(wanted.trace) and proposed[0].decisions == wanted.decisions
    # once measured it is not proposed again
    second.add(Record(second.task.key, {}, tuple(wanted.trace), (1e-3,)), wanted.decisions, None)
    assert tuner._borrowed(second) == []
    assert trace_key(wanted.trace) not in [trace_key(c.trace) for c in tuner.propose(second, 6)]


def test_early_stop_waits_for_an_estimate_then_for_progress() -> None:
    from polytile.search.tune import MIN_GAIN, EarlyStop

    stop = EarlyStop(trials=4)
    assert not stop.stop(float("inf"), 3)  # a task without its baseline yet
    assert not stop.stop(1.0, 6) and not stop.stop(1.0, 9)
    assert stop.stop(1.0, 10)  # four trials after the first estimate, none better
    stop = EarlyStop(trials=4)
    assert not stop.stop(1.0, 2)
    assert not stop.stop(1.0 * (1 - MIN_GAIN / 2), 5)  # noise is not progress
    assert not stop.stop(0.9, 6)  # progress: four more trials from here
    assert not stop.stop(0.9, 9) and stop.stop(0.9, 10)


def test_tune_stops_early_when_no_candidate_improves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate timed as slow as the default: the search ends `early_stopping`
    trials after every task has its estimate, far below its budget, and says so."""
    from dataclasses import replace

    from polytile.search.measure import Measurer

    real = Measurer.measure

    def flat(self: Measurer, *args: object, **kwargs: object) -> list:
        records = real(self, *args, **kwargs)  # type: ignore[arg-type]
        return [replace(r, latencies=(1e-3,)) if r.ok else r for r in records]

    monkeypatch.setattr(Measurer, "measure", flat)
    path = tmp_path / "r.jsonl"
    result = tune(
        model(), trials=60, records=str(path), seed=0, batch=3, progress=False, early_stopping=4,
        measure=HERE,
    )  # fmt: skip
    tasks = len(result.tasks)
    assert result.stopped_early and "stopped early" in result.table()
    # the warm-up gives every task a round of 3; then rounds until 4 trials without progress
    assert result.trials == len(RecordFile(path).read()) <= 3 * tasks + 6 < 60
    with pytest.raises(InputError, match="early_stopping"):
        tune(model(), trials=6, records=str(path), progress=False, measure=HERE, early_stopping=0)


def test_the_tuners_hint_decisions_start_from_its_targets_choices(tmp_path: Path) -> None:
    """A target built by hand (rows fetched 8 steps ahead where this machine's L2 says
    otherwise) is what the sketch's default hint decisions follow."""
    from dataclasses import replace

    from polytile.codegen.target import host, machine_defaults
    from polytile.search.cost_model import RandomModel
    from polytile.search.tune import Tuner

    ahead = 8 if machine_defaults(host().l2_bytes).input_ahead != 8 else 24
    target = replace(host(1), input_ahead=ahead)
    tuner = Tuner(extract_tasks(model()), RecordFile(tmp_path / "r.jsonl"), target, 0,
                  model=RandomModel(0), measure=HERE)  # fmt: skip
    assert {s.space.machine.input_ahead for s in tuner.states} == {ahead}


def test_a_budget_below_a_batch_per_task_still_measures_every_default(tmp_path: Path) -> None:
    """Four tasks, a batch of 8 and 10 trials: the warm-up shares the trials (2 or 3 a
    task) instead of spending two batches on two tasks, so every task has its baseline
    and the model's estimate is known."""
    rng = np.random.default_rng(3)
    widths = (16, 24, 40, 32, 8)
    nodes, inits, x = [], [], "x"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
        x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, widths[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
        initializer=inits,
    )
    chain = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert len(extract_tasks(chain)) == 4
    result = tune(chain, trials=10, records=str(tmp_path / "r.jsonl"), batch=8,
                  progress=False, measure=HERE)  # fmt: skip
    assert result.trials == 10
    assert all(t.trials >= 2 for t in result.tasks), [t.trials for t in result.tasks]
    assert np.isfinite(result.estimated_ms(tuned=True))
