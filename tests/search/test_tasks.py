"""Task extraction: each task knows the kernels that write its inputs in the model (its
producers), which the tuner runs before timing it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polytile.codegen.configs import default_config
from polytile.codegen.native import NativeKernel, index_limits
from polytile.codegen.target import host
from polytile.poly.default.schedule import default_schedule
from polytile.poly.ir.kernel import Role
from polytile.search.measure import MeasureConfig, Measurer, Prelude, preludes, reference_outputs
from polytile.search.records import RecordFile
from polytile.search.tasks import extract_tasks
from polytile.search.tune import tune

RNG = np.random.default_rng(3)


def chain() -> onnx.ModelProto:
    """x -> conv a -> conv b -> conv c + a: the last conv reads two kernels' outputs."""
    weights = {
        "w1": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "w2": RNG.standard_normal((16, 8, 1, 1)).astype(np.float32),
        "w3": RNG.standard_normal((8, 16, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["a", "w2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["b"]),
        helper.make_node("Conv", ["b", "w3"], ["c3"]),
        helper.make_node("Add", ["c3", "a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, n) for n, w in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CHAIN = chain()


def test_each_task_names_the_kernels_writing_its_inputs_in_model_order() -> None:
    tasks = extract_tasks(CHAIN)
    assert len(tasks) == 3
    first, second, third = tasks
    assert first.producers == ()  # it reads the model's input
    assert [p.kernel.workload_key() for p in second.producers] == [first.key]
    assert [p.kernel.workload_key() for p in third.producers] == [first.key, second.key]
    for task in tasks:
        for p in task.producers:
            out, into = p.kernel.tensors[p.output], task.kernel.tensors[p.input]
            assert out.role is Role.OUTPUT and into.role is Role.INPUT
            assert out.dtype == into.dtype and np.prod(out.shape) == np.prod(into.shape)


def test_a_kernel_that_computes_indices_is_not_a_producer_of_their_reader() -> None:
    """Run before a timed candidate on random inputs, it would leave indices outside the
    table, and a kernel timed alone has no index check before it: the reader times on
    the valid indices its own random inputs hold instead."""
    table = RNG.standard_normal((5, 3)).astype(np.float32)
    nodes = [
        helper.make_node("ArgMax", ["x"], ["ids"], axis=1, keepdims=0),
        helper.make_node("Gather", ["table", "ids"], ["g"], axis=0),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MatMul", ["g", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "indices",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(RNG.standard_normal((3, 4)).astype(np.float32), "w"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    readers = [t for t in extract_tasks(model) if index_limits(t.kernel)]
    assert readers  # the Gather's kernel, reading the ArgMax kernel's output as indices
    for task in readers:
        for producer in task.producers:
            assert producer.input not in index_limits(task.kernel)


def test_the_producers_outputs_feed_the_tasks_as_the_model_does() -> None:
    """Chaining the tasks' kernels through their producers' tensors computes the model:
    each producer's `output` is the very tensor the task reads as `input`."""
    tasks = extract_tasks(CHAIN)
    config = default_config(host())
    x = RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)
    written: dict[str, dict[str, np.ndarray]] = {}
    for task in tasks:
        inputs = {}
        for p in task.producers:
            shape = task.kernel.tensors[p.input].shape
            inputs[p.input] = written[p.kernel.workload_key()][p.output].reshape(shape)
        for t in task.kernel.tensors.values():
            if t.role is Role.INPUT and t.name not in inputs:
                inputs[t.name] = x.reshape(t.shape)
        native = NativeKernel(default_schedule(task.kernel, config), host())
        written[task.key] = native.outputs(inputs)
    (got,) = written[tasks[-1].key].values()
    (want,) = ReferenceEvaluator(CHAIN).run(None, {"x": x})
    assert got.size == want.size and got.dtype == want.dtype
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


def test_timed_runs_follow_the_producers_and_a_broken_one_is_left_out() -> None:
    """With `cold="producer"` the workers build the task's producers and time candidates
    after them; a producer that does not build is named in a warning and left out, and
    the candidates are still measured."""
    tasks = extract_tasks(CHAIN)
    task = tasks[-1]
    default = default_schedule(task.kernel, default_config(host()))
    before = preludes(task.producers, host())
    assert [p.kernel.workload_key() for p in before] == [t.key for t in tasks[:2]]
    broken = Prelude(
        before[0].kernel, ({"kind": "split", "args": {"loop": "nope"}},), *before[0][2:]
    )
    config = MeasureConfig(
        number=2, repeat=2, flush_cache=True, cold="producer", build_timeout=None
    )
    with Measurer(host(), config) as measurer:
        measurer.set_task(task.kernel, *reference_outputs(default, host(), 0), before)
        (ok,) = measurer.measure(task.key, [default.trace_json()])
        assert ok.ok and len(ok.latencies) == 2 and ok.start == "producer"
        with pytest.warns(UserWarning, match="producers not run"):
            measurer.set_task(task.kernel, *reference_outputs(default, host(), 0), (broken,))
        (still,) = measurer.measure(task.key, [default.trace_json()])
        assert still.ok


@pytest.mark.parametrize("cold", ["producer", "weights"])
def test_tuning_hands_the_workers_the_producers_only_when_timed_after_them(
    cold: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tune` with `cold="producer"` gives each task's measurement its producers under
    their default schedules (none for the task reading the model's input); with
    `cold="weights"` none. Either way every candidate is measured and verified."""
    given: dict[str, tuple] = {}
    set_task = Measurer.set_task

    def spy(self: Measurer, kernel, inputs, expected, before=()) -> None:
        given[kernel.workload_key()] = tuple(before)
        set_task(self, kernel, inputs, expected, before)

    monkeypatch.setattr(Measurer, "set_task", spy)
    tasks = extract_tasks(CHAIN)
    measure = MeasureConfig(number=1, repeat=1, flush_cache=True, cold=cold, build_timeout=None)
    result = tune(
        CHAIN,
        trials=6,
        records=str(tmp_path / "r.jsonl"),
        seed=0,
        batch=2,
        progress=False,
        measure=measure,
    )
    assert result.trials == 6 and set(given) == {t.key for t in tasks}
    for task in tasks:
        keys = [p.kernel.workload_key() for p in given[task.key]]
        want = [p.kernel.workload_key() for p in task.producers] if cold == "producer" else []
        assert keys == want
        for p in given[task.key]:
            default = default_schedule(p.kernel, default_config(host()))
            assert list(p.trace) == default.trace_json()
    records = RecordFile(str(tmp_path / "r.jsonl")).read()
    assert len(records) == 6 and all(r.ok for r in records)
