"""tune: records every measurement, resumes without repeating a candidate, and compile
applies the best verified record per workload (and ignores another target's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.errors import InputError
from polytile.search.records import RecordFile
from polytile.search.tasks import extract_tasks, select_tasks
from polytile.search.tune import tune

RNG = np.random.default_rng(0)
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
    result = tune(model(), trials=6, records=str(path), seed=3, batch=3, progress=False)
    records = RecordFile(path).read()
    assert result.trials == len(records) == 6
    assert records[0].ok  # the default schedule, measured first as the baseline
    keys = [r.trace_key() for r in records]
    assert len(set(keys)) == len(keys)
    assert "estimated model latency" in result.table()
    again = tune(model(), trials=3, records=str(path), seed=3, batch=3, progress=False)
    records = RecordFile(path).read()
    assert again.trials == 3 and len(records) == 9
    assert len({r.trace_key() for r in records}) == 9  # nothing measured twice
    x = RNG.standard_normal((24, 32)).astype(np.float32)
    want = 1 / (1 + np.exp(-np.maximum(x @ W, 0)))
    tuned = pt.compile(model(), records=str(path))
    np.testing.assert_allclose(tuned.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_compile_ignores_records_of_another_target(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    tune(model(), trials=2, records=str(path), seed=0, batch=2, progress=False)
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
        tuner = Tuner(tasks, records, host(1), seed, strategy, model=RandomModel(seed))
        return [json.dumps(c.trace) for c in tuner.propose(tuner.states[0], 6)]

    for strategy in ("random", "evolutionary"):
        first = proposals(5, strategy)
        assert len(first) == 6 and len(set(first)) == 6
        assert proposals(5, strategy) == first
    assert proposals(6, "random") != proposals(5, "random")
