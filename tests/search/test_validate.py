"""In-model validation: the tasks' best candidates are timed inside the model, and
compile applies the fastest there even when the search timed another one faster."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.codegen.configs import default_config
from polytile.codegen.target import Target, host
from polytile.errors import InputError
from polytile.poly.default.schedule import default_schedule
from polytile.search import builder
from polytile.search import tune as search
from polytile.search.measure import MeasureConfig
from polytile.search.records import Record, RecordFile, best_records, trace_key
from polytile.search.space import SearchSpace
from polytile.search.tasks import extract_tasks
from polytile.search.validate import (
    CompileVariant,
    ValidateConfig,
    _candidates,
    deal,
    validate,
)
from polytile.tuning import tune

RNG = np.random.default_rng(0)
W = RNG.standard_normal((256, 256)).astype(np.float32)
QUICK = ValidateConfig(top=2, rounds=3, repeat=3, neighbours=False)
#: candidates built in the tuner's process (the build workers are tests/search/test_builder.py's)
HERE = MeasureConfig(build_timeout=None)


def model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def variant(target: Target) -> CompileVariant:
    """The model compiled for `target` with the given records, as `pt.tune` has it."""
    return lambda records: pt.compile(model(), records=records, target=target)


def test_profiled_calls_name_their_tasks_workloads(tmp_path: Path) -> None:
    compiled = pt.compile(model())
    keys = {t.key for t in extract_tasks(model())}
    assert {c.workload for c in compiled.profile(repeat=1).calls} == keys
    loaded = pt.load(compiled.save(tmp_path / "m.ptm"))
    assert {c.workload for c in loaded.manifest.calls} == keys


def test_every_candidate_runs_in_each_context_beside_other_neighbours() -> None:
    sizes = {"a": 4, "b": 4, "c": 2}
    variants = deal(sizes, contexts=3, seed=0)
    assert len(variants) == 12
    for key, n in sizes.items():
        runs = [v[key] for v in variants]
        assert all(runs.count(i) >= 3 for i in range(n))
    contexts = [{tuple(sorted(v.items())) for v in variants[i : i + 4]} for i in (0, 4, 8)]
    assert contexts[0] != contexts[1] and contexts[1] != contexts[2]  # not copies
    assert deal(sizes, 3, seed=0) == variants  # seeded


def test_the_best_of_another_orientation_near_the_top_is_validated_too() -> None:
    target = host()
    (task,) = extract_tasks(model())
    default = default_schedule(task.kernel, default_config(target))

    def record(i: int, vec_loop: str | None, seconds: float) -> Record:
        trace = ({"kind": "vectorize", "args": {"loop": f"x{i}"}},)
        decisions = {"vec_loop": vec_loop} if vec_loop else None  # None: an older record
        return Record(task.key, target.key(), trace, (seconds,), decisions=decisions)

    rows = [record(0, "j", 1.0), record(1, "j", 1.01), record(2, "j", 1.02)]
    rows += [record(3, None, 1.05), record(4, "i", 1.1), record(5, "i", 1.12)]
    rows += [record(6, "k", 1.3)]
    found = _candidates(rows, default, top=2)
    assert [c.label for c in found] == ["#1", "#2", "#5", "default"]
    assert found[2].decisions == {"vec_loop": "i"}  # the best "i"; "k" is 30% slower
    assert [c.label for c in _candidates(rows[:3], default, top=2)] == ["#1", "#2", "default"]


def test_validation_overrules_a_search_timing_the_model_disagrees_with(tmp_path: Path) -> None:
    target = host()
    (task,) = extract_tasks(model())
    default = tuple(default_schedule(task.kernel, default_config(target)).trace_json())
    # the search's best by far, as recorded: the untransformed loop nest (scalar, serial)
    naive = Record(task.key, target.key(), (), (1e-9,))
    path = tmp_path / "r.jsonl"
    RecordFile(path).append([naive, Record(task.key, target.key(), default, (1e-3,))])
    assert best_records(RecordFile(path), target.key())[task.key].trace == ()
    found = validate([task], RecordFile(path), target, variant(target), QUICK)
    (row,) = found.tasks
    assert row.labels == ("#1", "default") and row.chosen == 1
    timed = [r for r in RecordFile(path).read() if r.timing == "model"]
    assert len(timed) == 2 and len({r.timestamp for r in timed}) == 1
    # each of the two candidates ran in `contexts` of the four variants, every turn
    assert all(len(r.latencies) == QUICK.contexts * QUICK.rounds for r in timed)
    assert best_records(RecordFile(path), target.key())[task.key].trace == default
    x = RNG.standard_normal((256, 256)).astype(np.float32)
    got = pt.compile(model(), records=str(path)).run({"x": x})[0]
    assert got.shape == (256, 256) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.maximum(x @ W, 0), rtol=1e-4, atol=1e-4)
    assert "*default" in found.table()


def test_tune_validates_after_the_search_and_resumes_without_model_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.jsonl"
    with pytest.raises(InputError, match="0 only with validation"):
        tune(model(), trials=0, records=str(path), progress=False, measure=HERE)
    result = tune(
        model(),
        trials=4,
        records=str(path),
        batch=2,
        progress=False,
        measure=HERE,
        validation=QUICK,
    )
    assert result.validation is not None and len(result.validation.tasks) == 1
    assert "in-model validation" in result.table()
    records = RecordFile(path).read()
    alone = [r for r in records if r.timing == "kernel"]
    assert len(alone) == 4 and len(records) > 4
    again = tune(model(), trials=2, records=str(path), batch=2, progress=False, measure=HERE)
    assert again.tasks[0].trials == 6  # the model records are not search trials
    only = tune(
        model(), trials=0, records=str(path), progress=False, measure=HERE, validation=QUICK
    )
    assert only.trials == 0 and only.validation is not None and only.validation.tasks
    assert only.table().startswith("in-model validation")
    # the search alone cannot compile the model: it says who can, before measuring
    kept = len(RecordFile(path).read())
    with pytest.raises(InputError, match="compile_model"):
        search.tune(
            model(), trials=1, records=str(path), progress=False, measure=HERE, validation=QUICK
        )
    assert len(RecordFile(path).read()) == kept


def test_validation_times_a_verified_neighbour_of_the_best_candidate(tmp_path: Path) -> None:
    """The best candidate's neighbour (epilogue per innermost tile, two loops in the
    parallel one) is measured and verified like a search trial, recorded, and timed in
    the model beside the others; a budget of 0 measures none, and `tune` spends at most a
    tenth of its trials on them."""
    target = host()
    (task,) = extract_tasks(model())
    space = SearchSpace(task.kernel, lanes=16, threads=2)
    decisions = {**space.default_decisions(), "epilogue_depth": 1, "parallel_depth": 1}
    best = Record(task.key, target.key(), tuple(space.build(decisions).trace), (1e-6,),
                  decisions=decisions)  # fmt: skip
    path = tmp_path / "r.jsonl"
    RecordFile(path).append([best])
    config = ValidateConfig(top=1, rounds=2, repeat=2)
    none = validate([task], RecordFile(path), target, variant(target), config, HERE, budget=0)
    assert none.trials == 0 and none.tasks[0].labels == ("#1", "default")
    found = validate([task], RecordFile(path), target, variant(target), config, HERE)
    assert found.trials == 1 and found.tasks[0].labels == ("#1", "nb", "default")
    again = validate(
        [task], RecordFile(path), target, variant(target), config, HERE
    )  # not measured twice
    assert again.trials == 0 and again.tasks[0].labels == ("#1", "nb", "default")
    alone = [r for r in RecordFile(path).read() if r.timing == "kernel"]
    assert len(alone) == 2 and alone[1].ok and alone[1].decisions is not None
    assert alone[1].decisions["epilogue_depth"] == 0 and alone[1].decisions["parallel_depth"] == 2
    timed = [r for r in RecordFile(path).read() if r.timing == "model"]
    default = tuple(default_schedule(task.kernel, default_config(target)).trace_json())
    assert {r.trace_key() for r in timed[-3:]} == {
        best.trace_key(),
        alone[1].trace_key(),
        trace_key(default),
    }
    x = RNG.standard_normal((256, 256)).astype(np.float32)
    got = pt.compile(model(), records=str(path)).run({"x": x})[0]
    np.testing.assert_allclose(got, np.maximum(x @ W, 0), rtol=1e-4, atol=1e-4)
    result = tune(model(), trials=10, records=str(tmp_path / "t.jsonl"), batch=4,
                  progress=False, validation=config, measure=HERE)  # fmt: skip
    kernel_records = [r for r in RecordFile(tmp_path / "t.jsonl").read() if r.timing == "kernel"]
    assert result.trials == len(kernel_records) <= 10


class _HangingWorker(builder._BuildWorker):
    command = (str(Path(__file__).with_name("hanging_builder.py")),)


def test_a_neighbour_whose_build_hangs_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The neighbour is built in a worker (as the search's candidates are): one stuck in
    its build is killed at the build timeout, and the validation goes on without it."""
    monkeypatch.setenv("HANG_LOG", str(tmp_path / "builds.log"))
    monkeypatch.setenv("HANG_MARK", str(tmp_path / "hung.json"))
    monkeypatch.setattr(builder.Builder, "worker", _HangingWorker)
    target = host()
    (task,) = extract_tasks(model())
    space = SearchSpace(task.kernel, lanes=16, threads=2)
    unrolled = {"unroll": True, "epilogue_depth": 1, "parallel_depth": 1}
    decisions = {**space.default_decisions(), **unrolled}
    best = Record(task.key, target.key(), tuple(space.build(decisions).trace), (1e-6,),
                  decisions=decisions)  # fmt: skip
    path = tmp_path / "r.jsonl"
    RecordFile(path).append([best])
    config = ValidateConfig(top=1, rounds=1, repeat=1)
    found = validate([task], RecordFile(path), target, variant(target), config,
                     MeasureConfig(build_timeout=1.0))  # fmt: skip
    assert (tmp_path / "hung.json").exists()  # the neighbour's build hung
    assert found.trials == 0 and found.tasks[0].labels == ("#1", "default")


def test_validation_times_fewer_candidates_where_the_variants_would_not_fit(
    tmp_path: Path,
) -> None:
    """Each variant holds its own weights: past `memory_bytes` the task's best candidates
    are cut (with a warning) down to the best one and the default."""
    target = host()
    (task,) = extract_tasks(model())
    default = tuple(default_schedule(task.kernel, default_config(target)).trace_json())
    space = SearchSpace(task.kernel, lanes=16, threads=2)
    rng = random.Random(1)
    other = next(
        t
        for t in (tuple(space.build(space.sample(rng)).trace) for _ in range(20))
        if trace_key(t) not in {trace_key(()), trace_key(default)}
    )
    path = tmp_path / "r.jsonl"
    RecordFile(path).append(
        [
            Record(task.key, target.key(), (), (1e-9,)),
            Record(task.key, target.key(), other, (2e-9,)),
        ]
    )
    roomy = validate([task], RecordFile(path), target, variant(target), QUICK)
    assert roomy.tasks[0].labels == ("#1", "#2", "default")
    with pytest.warns(UserWarning, match="memory budget"):
        tight = validate(
            [task], RecordFile(path), target, variant(target), replace(QUICK, memory_bytes=1)
        )
    assert tight.tasks[0].labels == ("#1", "default")
    assert ValidateConfig().memory_budget() > 256 * 256 * 4
    with pytest.raises(InputError, match="memory_bytes"):
        ValidateConfig(memory_bytes=0)
