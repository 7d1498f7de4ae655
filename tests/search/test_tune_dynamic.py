"""tune on a model with symbolic sizes: its tasks are the symbolic kernels `compile`
looks records up for, candidates are sampled on an instance and replayed for all sizes
(those that do not hold for all are `illegal` records), each is timed at the tune's
sizes (kept in its record), `compile` applies the records and the tuned model matches
onnxruntime at any size; a resumed tune measures no candidate twice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
import polytile.compiler
from polytile.codegen.target import host
from polytile.errors import IllegalSchedule, InputError
from polytile.frontend.symbolic import MAX_DIM
from polytile.poly.transform.steps import replay
from polytile.search.dynamic import SizesConfig, tune_sizes
from polytile.search.measure import MeasureConfig
from polytile.search.records import RecordFile, best_records
from polytile.search.tasks import Task
from polytile.search.validate import ValidateConfig
from polytile.tuning import tune

#: candidates built in the test's process, timed briefly
QUICK = MeasureConfig(build_timeout=None, repeat=2, min_repeat_ms=1.0)
BOUNDS = {"seq": (1, 64), "batch": (1, 4)}
SIZES = SizesConfig(sizes=({"batch": 1, "seq": 5}, {"batch": 2, "seq": 23}))


def model() -> onnx.ModelProto:
    """MatMul, Add, Relu on x[batch, seq, 32], then a second MatMul: two kernels."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((48, 16)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m"]),
        helper.make_node("Add", ["m", "b1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dyn_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w1, b1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _tune(path: Path, trials: int, seed: int = 1) -> None:
    tune(model(), trials=trials, records=str(path), bounds=BOUNDS, sizes=SIZES, seed=seed,
         batch=4, strategy="random", cost_model_kind="random", measure=QUICK,
         progress=False)  # fmt: skip


def _compiled(path: Path | None, monkeypatch: pytest.MonkeyPatch) -> tuple[pt.CompiledModel, dict]:
    """The dynamic model compiled with the records (if any), and the schedules `compile`
    chose, by workload key."""
    chosen: dict[str, list] = {}
    build = polytile.compiler.build

    def spy(graph: object, schedules: Sequence, workloads: Sequence[str], *a, **k):  # noqa: ANN002, ANN003, ANN202
        for key, schedule in zip(workloads, schedules, strict=True):
            chosen[key] = schedule.trace_json()
        return build(graph, schedules, workloads, *a, **k)

    monkeypatch.setattr(polytile.compiler, "build", spy)
    records = str(path) if path is not None else None
    return pt.compile(model(), records=records, bounds=BOUNDS), chosen


def test_a_dynamic_tune_records_symbolic_kernels_that_compile_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.jsonl"
    _tune(path, trials=8, seed=2)  # each task's warm-up round of 4 only: no timing decides
    records = RecordFile(path).read()
    assert len(records) == 8
    for r in records:  # timed at the given sizes, each kernel at those of its parameters
        assert r.sizes == SIZES.sizes
    _, plain = _compiled(None, monkeypatch)  # the baseline is compile's default schedule
    firsts = {r.workload: r for r in reversed(records)}
    assert {k: [dict(s) for s in r.trace] for k, r in firsts.items()} == plain
    # each task's first verified candidate after its default (measured first) made the
    # fastest, whatever the timings: compile must apply it
    picked = {}
    for r in records:
        if r.ok and r.workload in {q.workload for q in records[: records.index(r)]}:
            picked.setdefault(r.workload, replace(r, latencies=(1e-9,)))
    RecordFile(path).append(picked.values())
    compiled, kernels = _compiled(path, monkeypatch)
    assert {r.workload for r in records} == set(kernels) == set(picked)  # compile's keys
    best = best_records(RecordFile(path), host().key())
    for key, record in picked.items():  # the record's trace is the compiled kernel's
        assert best[key] == record
        assert kernels[key] == [dict(s) for s in record.trace]
    # an illegal candidate: legal on the instance it was sampled at, not for all sizes
    with polytile.compiler.imported(model(), bounds=BOUNDS) as graph:
        from polytile.search.tasks import extract_tasks

        found = extract_tasks(graph)
    symbolic = {t.key: t.kernel for t in found}
    # compile's default decisions are made at a batch of 1, the other sizes at 128 within
    # their bounds: the tasks' baselines and search spaces there too
    assert all(t.at == {"batch": 1, "seq": 64} for t in found)
    illegal = [r for r in records if r.error == "illegal"]
    assert illegal, "seed 2 samples a candidate that does not hold for all sizes"
    for r in illegal:
        kernel = symbolic[r.workload]
        with pytest.raises(IllegalSchedule):
            replay(kernel, r.trace)
        replay(kernel.at({"batch": 1, "seq": 64}), r.trace)

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model().SerializeToString(), options)
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 1), (2, 37), (3, 64)):  # 37: no multiple of a vector
        x = rng.standard_normal((batch, seq, 32)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(compiled.run({"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_a_resumed_dynamic_tune_measures_no_candidate_twice(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    _tune(path, trials=4)
    _tune(path, trials=3)
    records = RecordFile(path).read()
    assert len(records) == 7
    keys = [(r.workload, r.trace_key()) for r in records]
    assert len(set(keys)) == len(keys)
    # the same records resumed at other sizes: said, and compared as they are
    other = SizesConfig(sizes=({"batch": 1, "seq": 9},))
    with pytest.warns(UserWarning, match="timed at other sizes"):
        tune(model(), trials=1, records=str(path), bounds=BOUNDS, sizes=other, seed=1,
             strategy="random", cost_model_kind="random", measure=QUICK,
             progress=False)  # fmt: skip


def test_a_dynamic_tune_is_validated_in_the_model_at_its_sizes(tmp_path: Path) -> None:
    """Validation (alone, after a search) measures each task's neighbour of its best at
    the tune's sizes, then times every candidate inside the dynamic model at each of
    them: one "model" record per candidate, keeping the sizes."""
    path = tmp_path / "r.jsonl"
    _tune(path, trials=8, seed=2)
    config = ValidateConfig(top=1, contexts=1, rounds=1, repeat=2)
    result = tune(model(), trials=0, records=str(path), bounds=BOUNDS, sizes=SIZES, seed=2,
                  validation=config, measure=QUICK, progress=False)  # fmt: skip
    records = RecordFile(path).read()
    timed = [r for r in records if r.timing == "model"]
    assert result.validation is not None and len(result.validation.tasks) == 2
    # a neighbour per task measured as a search trial (unless the best's neighbour, which
    # the timings choose, is a candidate measured already)
    neighbours = [r for r in records[8:] if r.timing == "kernel"]
    assert result.trials == len(neighbours) <= 2
    assert len(records) == 8 + len(neighbours) + len(timed)
    assert all(r.sizes == SIZES.sizes for r in neighbours)
    for row in result.validation.tasks:  # the best, its neighbour if correct, the default
        mine = [r for r in timed if r.workload == row.workload]
        assert len(mine) == len(row.labels) >= 2 and row.labels[-1] == "default"
        assert all(r.ok and len(r.latencies) == 1 and r.sizes == SIZES.sizes for r in mine)


def _task(bounds: dict[str, tuple[int, int]]) -> Task:
    """A task whose kernel has the given symbolic sizes (only its params matter)."""
    from polytile.poly.dsl import kernel

    names = sorted(bounds)
    index = ", ".join(f"i{n}" for n in range(len(names)))
    k = kernel(f"Y[{index}] = X[{index}] + 1.0", X=tuple(names))
    return Task(0, k.workload_key(), k, 1, 0, "Add", (), bounds)


def test_sampled_sizes_are_seeded_within_bounds_small_to_large() -> None:
    task = _task({"batch": (1, MAX_DIM), "seq": (1, 512)})
    sizes = tune_sizes([task], None, seed=7)
    assert sizes == tune_sizes([task], None, seed=7) != tune_sizes([task], None, seed=8)
    assert sizes.at == {"batch": 128, "seq": 128}
    batch_of_one = replace(task, at={"batch": 1, "seq": 128})  # where compile decides
    assert tune_sizes([batch_of_one], None, seed=7).at == {"batch": 1, "seq": 128}
    seqs = [s["seq"] for s in sizes.measured]
    assert len(seqs) == 3 and seqs == sorted(seqs) and seqs[0] >= 1 and seqs[-1] <= 512
    assert seqs[-1] > 64 and seqs[0] <= 8  # a small, a medium and a large one
    assert all(1 <= s["batch"] <= 8 for s in sizes.measured)  # an open bound: at most 8
    alone = tune_sizes([_task({"seq": (1, 512)})], None, seed=7)  # a tune of some tasks
    assert [s["seq"] for s in alone.measured] == seqs
    narrow = tune_sizes([_task({"batch": (2, 3), "seq": (1, 16)})], None, seed=0)
    assert narrow.at == {"batch": 3, "seq": 16}  # the representative size within bounds
    assert all(2 <= s["batch"] <= 3 and s["seq"] <= 16 for s in narrow.measured)
    given = tune_sizes([task], SizesConfig(sizes=({"seq": 7},)), seed=0)
    assert given.measured == ({"batch": 1, "seq": 7},)  # a missing size: its lower bound
    with pytest.raises(InputError, match="outside"):
        tune_sizes([task], SizesConfig(sizes=({"seq": 600},)), seed=0)
    with pytest.raises(InputError, match="not a symbolic size"):
        tune_sizes([task], SizesConfig(at={"heads": 2}), seed=0)


def test_a_dynamic_candidate_is_verified_and_timed_at_every_size() -> None:
    """Compiled once, run at each size against the default schedule there: wrong at one
    size is a wrong result naming it; right at all, one latency per repeat, the sizes
    kept in the record."""
    from polytile.poly.default.schedule import default_schedule
    from polytile.poly.dsl import kernel

    k = kernel("Y[i, j] += A[i, q] * B[q, j]", A=("m", 24), B=(24, 40))
    task = Task(0, k.workload_key(), k, 1, 0, "MatMul", (), {"m": (1, 64)})
    sizes = tune_sizes([task], SizesConfig(sizes=({"m": 1}, {"m": 37})), seed=0)
    default = default_schedule(k)
    inputs, expected = sizes.reference(default, host(1), seed=0)
    assert [s for s, _ in inputs] == [{"m": 1}, {"m": 37}]
    want = inputs[1][1]["A"] @ inputs[1][1]["B"]  # float32 sums in another order: scaled atol
    np.testing.assert_allclose(expected[1]["Y"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    trace = default.trace_json()
    bad = (expected[0], {"Y": expected[1]["Y"] + 1})
    with sizes.measurer(host(1), QUICK) as measurer:
        measurer.set_task(k, inputs, bad)
        (wrong,) = measurer.measure(task.key, [trace])
        measurer.set_task(k, inputs, expected)
        (right,) = measurer.measure(task.key, [trace])
    assert wrong.error == "wrong_result" and "'m': 37" in wrong.message
    assert right.ok and len(right.latencies) == QUICK.repeat
    assert right.sizes == ({"m": 1}, {"m": 37})


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ([], None),
        (["--tune-sizes", "batch=1,seq=16 seq=77"], ({"batch": 1, "seq": 16}, {"seq": 77})),
    ],
)
def test_the_cli_passes_the_bounds_and_the_tune_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], want: object
) -> None:
    import polytile.tuning as tune_module
    from polytile import cli

    seen = {}

    def fake_tune(*args: object, bounds: object, sizes: object, **kwargs: object) -> object:
        seen.update(bounds=bounds, sizes=sizes)
        raise InputError("stop here")

    monkeypatch.setattr(tune_module, "tune", fake_tune)
    onnx.save(model(), tmp_path / "m.onnx")
    argv = ["tune", str(tmp_path / "m.onnx"), "--records", str(tmp_path / "r.jsonl")]
    assert cli.main([*argv, "--bounds", "seq=1:512", *flags]) == cli.EXIT_BAD_INPUT
    assert seen["bounds"] == {"seq": (1, 512)}
    assert (seen["sizes"].sizes if seen["sizes"] is not None else None) == want
    seen.clear()
    assert cli.main([*argv, "--tune-sizes", "seq=1:4"]) == cli.EXIT_BAD_INPUT
    assert not seen  # refused before tuning: a measured size is one value
