"""The fuzzing campaign's checker (benchmarks/fuzz_bench.py) on a CI-sized sample: random
legal schedules of the kernels of two small models shaped like the zoos' (a CNN with
padded, strided, depthwise and 1×1 convs, pooling, a classifier; an encoder layer with
attention, LayerNorm and GELU), each built natively and compared with the kernel run in
program order by the oracle. Zero miscompiles and zero crashes; and the checker does catch
a schedule that breaks a dependence and an output off by a fraction of a percent."""

from __future__ import annotations

import json
import random
import signal
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile.codegen.target import host
from polytile.errors import InputError
from polytile.poly.ir.schedule import initial_schedule
from polytile.search import budget
from polytile.search.space import SearchSpace
from polytile.search.tasks import extract_tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fuzz_bench

RNG = np.random.default_rng(0)
#: samples of each kernel in the CI run
SAMPLES = 3


def _model(nodes: list, inputs: dict, weights: dict) -> object:
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]) or 1)).astype(np.float32)


def tiny_cnn() -> object:
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "dw"], ["c2"], pads=[1, 1, 1, 1], group=8),
        n("Clip", ["c2", "lo", "hi"], ["r2"]),
        n("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p", "w3"], ["c3"]),
        n("Add", ["c3", "p"], ["s"]),
        n("Relu", ["s"], ["r3"]),
        n("Conv", ["r3", "w4"], ["c4"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("AveragePool", ["c4"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("GlobalAveragePool", ["a"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "fc", "fb"], ["l"], transB=1),
        n("Softmax", ["l"], ["y"]),
    ]
    weights = {
        "w1": _w(8, 3, 3, 3), "b1": _w(8), "dw": _w(8, 1, 3, 3), "w3": _w(8, 8, 1, 1),
        "w4": _w(12, 8, 3, 3), "fc": _w(10, 12), "fb": _w(10),
        "lo": np.array(0, np.float32), "hi": np.array(6, np.float32),
    }  # fmt: skip
    return _model(nodes, {"x": (1, 3, 6, 6)}, weights)


def tiny_encoder() -> object:
    n = helper.make_node
    seq, hidden, heads = 6, 16, 2
    nodes = [
        n("MatMul", ["x", "wq"], ["q0"]),
        n("Add", ["q0", "bq"], ["q1"]),
        n("Reshape", ["q1", "heads"], ["q2"]),
        n("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
        n("MatMul", ["x", "wk"], ["k0"]),
        n("Reshape", ["k0", "heads"], ["k1"]),
        n("Transpose", ["k1"], ["k"], perm=[0, 2, 3, 1]),
        n("MatMul", ["q", "k"], ["qk"]),
        n("Mul", ["qk", "scale"], ["qs"]),
        n("Softmax", ["qs"], ["att"]),
        n("MatMul", ["att", "q"], ["ctx0"]),
        n("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx1", "merged"], ["ctx"]),
        n("Add", ["ctx", "x"], ["h0"]),
        n("LayerNormalization", ["h0", "ln_s", "ln_b"], ["h"], axis=-1),
        n("MatMul", ["h", "up"], ["u0"]),
        n("Div", ["u0", "sqrt2"], ["u1"]),
        n("Erf", ["u1"], ["u2"]),
        n("Add", ["u2", "one"], ["u3"]),
        n("Mul", ["u0", "u3"], ["u4"]),
        n("Mul", ["u4", "half"], ["gelu"]),
        n("MatMul", ["gelu", "down"], ["d"]),
        n("Add", ["d", "h"], ["e"]),
        n("ReduceMean", ["e", "axes"], ["y"], keepdims=1),
    ]
    f = np.float32
    weights = {
        "wq": _w(hidden, hidden), "bq": _w(hidden), "wk": _w(hidden, hidden),
        "heads": np.array([1, seq, heads, hidden // heads], np.int64),
        "merged": np.array([1, seq, hidden], np.int64), "scale": np.array(0.35, f),
        "ln_s": _w(hidden) + 1, "ln_b": _w(hidden), "up": _w(hidden, 2 * hidden),
        "sqrt2": np.array(np.sqrt(2), f), "one": np.array(1, f), "half": np.array(0.5, f),
        "down": _w(2 * hidden, hidden), "axes": np.array([-1], np.int64),
    }  # fmt: skip
    return _model(nodes, {"x": (1, seq, hidden)}, weights)


@pytest.fixture(scope="module")
def kernels() -> list[fuzz_bench.FuzzKernel]:
    found: dict[str, fuzz_bench.FuzzKernel] = {}
    for name, model in (("tiny_cnn", tiny_cnn()), ("tiny_encoder", tiny_encoder())):
        for t in extract_tasks(model):
            found.setdefault(t.key, fuzz_bench.FuzzKernel(t.key, t.kernel, t.kind, name))
    return list(found.values())


@pytest.fixture(scope="module")
def checkers(kernels: list[fuzz_bench.FuzzKernel]) -> list[fuzz_bench.Checker]:
    return [fuzz_bench.Checker(k.kernel, host(), seed=0) for k in kernels]


def test_random_legal_schedules_compute_the_reference(kernels: list, checkers: list) -> None:
    assert all(c.reference == "program order" for c in checkers)  # the oracle, not codegen
    kinds = {k.kind for k in kernels}
    assert {"Conv", "MaxPool", "AveragePool", "MatMul", "Softmax", "LayerNormalization"} <= kinds
    statuses: dict[str, int] = {}
    failures = []
    for n, (k, checker) in enumerate(zip(kernels, checkers, strict=True)):
        rng = random.Random(n)
        for _ in range(SAMPLES):
            outcome = checker.check(fuzz_bench.sample_decisions(checker.space, rng))
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
            if outcome.status in ("miscompile", "crash"):
                failures.append((k.kind, outcome.message[:400], outcome.trace))
    assert not failures, failures
    assert statuses.get("ok", 0) >= 0.9 * SAMPLES * len(kernels), statuses


def test_a_schedule_that_breaks_a_dependence_is_a_miscompile(kernels: list, checkers: list) -> None:
    """Softmax's nests (max, sum of exponentials, quotient) run last to first: legal
    code that reads values not yet written; the checker says so."""
    n = next(i for i, k in enumerate(kernels) if k.kind == "Softmax")
    checker = checkers[n]
    schedule = initial_schedule(kernels[n].kernel)
    assert len(schedule.body) >= 2
    assert checker.check_schedule(schedule).status == "ok"
    wrong = replace(schedule, body=tuple(reversed(schedule.body)))
    outcome = checker.check_schedule(wrong)
    assert outcome.status == "miscompile" and outcome.error > 1, outcome


def test_an_output_off_by_a_fraction_of_a_percent_is_a_miscompile(
    kernels: list, checkers: list
) -> None:
    """A conv candidate's output, one element moved by 0.1% of the output's largest
    value (reassociated sums stay far below that): caught; unchanged: not."""
    n = next(i for i, k in enumerate(kernels) if k.kind == "Conv")
    checker = checkers[n]
    candidate = checker.space.build(checker.space.sample(random.Random(0)))
    got = checker.outputs(candidate.schedule)
    assert checker.verdict(got).status == "ok"
    (name,) = got
    assert got[name].size > 100
    moved = got[name].copy()
    moved.flat[moved.size // 2] += 1e-3 * np.abs(moved).max()
    assert checker.verdict({name: moved}).status == "miscompile"


def _journaled(path: Path) -> list[int]:
    """The sample indices of a journal's lines, in order, repeats kept."""
    lines = path.read_text().splitlines()
    return [r["sample"] for r in map(json.loads, lines) if "sample" in r]


def test_a_campaign_stopped_and_resumed_journals_what_one_run_does(
    kernels: list, tmp_path: Path
) -> None:
    """Four samples in one run, and in two runs: the first stopped by SIGTERM after one
    sample, then killed while writing the next (a torn last line), the second resuming.
    The same outcomes sample by sample, each sample run once; other settings refused."""
    settings = fuzz_bench.journal_settings(kernels, ["tiny_cnn", "tiny_encoder"], 1 << 20, 0)
    # one thread: no libgomp team, whose threads a worker forked from this process (which
    # ran parallel kernels in the tests above) would not have
    target = host(1)
    whole_path, path = tmp_path / "whole.jsonl", tmp_path / "shards.jsonl"
    whole = fuzz_bench.campaign(kernels, 4, 1, target, whole_path, settings)

    def stop() -> bool:  # SIGTERM once a sample is journaled: a clean stop
        if _journaled(path) and not requested():
            signal.raise_signal(signal.SIGTERM)
        return requested()

    with fuzz_bench.stop_on_signal() as requested:
        first = fuzz_bench.campaign(kernels, 4, 1, target, path, settings, stop=stop)
    assert first["samples"] == 1 and first["runs"] == 1
    with path.open("a") as f:
        f.write('{"sample": 1, "run": 0, "t": 0.5, "mo')
    assert len(fuzz_bench.read_journal(path).samples) == 1
    resumed = fuzz_bench.campaign(kernels, 4, 1, target, path, settings, resume=True)
    assert _journaled(whole_path) == [0, 1, 2, 3]
    assert sorted(_journaled(path)) == [0, 1, 2, 3]
    assert resumed["runs"] == 2 and whole["runs"] == 1
    assert whole["ok"] >= 3 and whole["crashes"] == whole["miscompiles"] == 0, whole
    same = ("samples", "ok", "refusals", "miscompiles", "crashes", "kinds", "failures")
    assert {k: resumed[k] for k in same} == {k: whole[k] for k in same}
    outcomes = {
        p: {i: (r["workload"], r["status"], r["error"]) for i, r in j.samples.items()}
        for p, j in ((p, fuzz_bench.read_journal(p)) for p in (path, whole_path))
    }
    assert outcomes[path] == outcomes[whole_path]
    other = fuzz_bench.journal_settings(kernels, ["tiny_cnn", "tiny_encoder"], 1 << 20, 1)
    with pytest.raises(InputError, match="seed"):
        fuzz_bench.campaign(kernels, 5, 1, target, path, other, resume=True)
    assert sorted(_journaled(path)) == [0, 1, 2, 3]


def test_a_build_past_its_seconds_is_over_budget_and_the_campaign_goes_on(
    kernels: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sample 1's build never returns, busy as in one long isl call (the builds of the
    forked workers are this process's, patched): its worker is killed past the build's
    seconds, the sample is `budget` with its decisions, the others run, and resuming does
    not run it again. A build out of its isl operations is `budget` too."""
    sampler = fuzz_bench.Sampler(kernels, host(1), seed=0)
    checker = fuzz_bench.Checker(kernels[sampler.kernel_of(1)].kernel, host(1), seed=0)
    rng = fuzz_bench.sample_rng(0, 1)
    rng.randrange(len(kernels))
    hung = fuzz_bench.sample_decisions(checker.space, rng)
    build = SearchSpace.build

    def hanging(space: SearchSpace, decisions: dict) -> object:
        while space.kernel.name == checker.kernel.name and decisions == hung:
            pass  # holds the interpreter: only a kill stops it
        return build(space, decisions)

    monkeypatch.setattr(SearchSpace, "build", hanging)
    settings = fuzz_bench.journal_settings(
        kernels, ["tiny_cnn", "tiny_encoder"], 1 << 20, 0, build_seconds=0.5
    )
    path = tmp_path / "j.jsonl"
    result = fuzz_bench.campaign(kernels, 3, 1, host(1), path, settings)
    assert result["budgets"] == 1 and result["ok"] >= 1, result
    assert result["crashes"] == result["miscompiles"] == 0, result
    (over,) = result["over_budget"]
    assert over["sample"] == 1 and over["decisions"] == hung
    assert "took over 0.5 s: its worker was killed" in over["message"]
    resumed = fuzz_bench.campaign(kernels, 4, 1, host(1), path, settings, resume=True)
    assert sorted(_journaled(path)) == [0, 1, 2, 3] and resumed["budgets"] == 1
    monkeypatch.undo()
    monkeypatch.setattr(budget, "BUILD_OPERATIONS", 50)
    outcome = checker.check(checker.space.default_decisions())
    assert outcome.status == "budget" and "isl operations" in outcome.message, outcome
