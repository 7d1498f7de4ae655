"""Run-time index checks: an index read from a run-time tensor outside its axis stops the
compiled model with an `IndexOutOfRangeError` naming the model, node, input, value and
position -- never a read outside a tensor -- on one and two threads, after save/load,
and through `InferenceSession` and `polytile.backend`, also while another Python thread
runs the same model; valid (also negative) indices give onnxruntime's results.

The models run in a child process (this file run as a script): a crash there fails the
tests instead of killing pytest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

F32, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, tuple[int, ...]]],
    outputs: dict[str, tuple[int, tuple[int, ...]]],
    constants: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "checked",
        [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(v, n) for n, v in (constants or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _floats(*shape: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def cases() -> dict[str, tuple[onnx.ModelProto, dict, list[tuple[dict, str]]]]:
    """id → (model, valid feeds, [(bad feeds, the message's expected fragment)])."""
    node = helper.make_node
    found: dict[str, Any] = {}
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    found["gather_embedding"] = (
        _model(
            [node("Gather", ["table", "ids"], ["y"], name="embed")],
            {"ids": (I64, (2, 3))},
            {"y": (F32, (2, 3, 4))},
            {"table": table},
        ),
        {"ids": np.array([[0, 9, -10], [-1, 3, 5]])},
        [
            ({"ids": np.array([[0, 1, 2], [3, 10, 5]])}, "index 10 .* position \\[1, 1\\]"),
            ({"ids": np.array([[0, -11, 2], [3, 4, 5]])}, "index -11 .* position \\[0, 1\\]"),
            ({"ids": np.full((2, 3), 1 << 40)}, f"index {1 << 40} .* position \\[0, 0\\]"),
        ],
    )
    found["gather_int32_axis1"] = (
        _model(
            [node("Gather", ["x", "ids"], ["y"], name="pick", axis=1)],
            {"x": (F32, (3, 5, 2)), "ids": (I32, (4,))},
            {"y": (F32, (3, 4, 2))},
        ),
        {"x": _floats(3, 5, 2), "ids": np.array([4, -5, 0, -1], np.int32)},
        [({"x": _floats(3, 5, 2), "ids": np.array([0, 1, 5, 2], np.int32)}, "index 5 .*axis 1")],
    )
    # indices computed by another kernel: checked in the workspace arena
    found["gather_computed_indices"] = (
        _model(
            [
                node("Add", ["ids", "one"], ["shifted"], name="shift"),
                node("Gather", ["table", "shifted"], ["y"], name="embed"),
            ],
            {"ids": (I64, (5,))},
            {"y": (F32, (5, 4))},
            {"table": table, "one": np.array(1, np.int64)},
        ),
        {"ids": np.array([0, 8, -1, -11, 3])},
        [({"ids": np.array([0, 8, 9, 1, 3])}, "index 10 .* input 'shifted'")],
    )
    # a view of the indices: positions as the node sees them
    found["gather_reshaped_indices"] = (
        _model(
            [
                node("Reshape", ["ids", "shape"], ["grid"], name="view"),
                node("Gather", ["table", "grid"], ["y"], name="embed"),
            ],
            {"ids": (I64, (6,))},
            {"y": (F32, (2, 3, 4))},
            {"table": table, "shape": np.array([2, 3], np.int64)},
        ),
        {"ids": np.array([0, 9, -10, 2, 3, -1])},
        [
            (
                {"ids": np.array([0, 1, 2, 3, 4, 12])},
                "index 12 .* position \\[1, 2\\] of input 'grid'",
            )
        ],
    )
    found["gather_elements"] = (
        _model(
            [node("GatherElements", ["x", "i"], ["y"], name="ge", axis=-1)],
            {"x": (F32, (3, 4)), "i": (I64, (3, 2))},
            {"y": (F32, (3, 2))},
        ),
        {"x": _floats(3, 4), "i": np.array([[0, -4], [3, -1], [2, 1]])},
        [({"x": _floats(3, 4), "i": np.array([[0, 1], [2, 3], [4, 0]])}, "index 4 .*axis 1")],
    )
    found["gather_nd_batch"] = (
        _model(
            [node("GatherND", ["x", "i"], ["y"], name="gnd", batch_dims=1)],
            {"x": (F32, (2, 3, 4, 5)), "i": (I64, (2, 2, 2))},
            {"y": (F32, (2, 2, 5))},
        ),
        {"x": _floats(2, 3, 4, 5), "i": np.array([[[2, 3], [-3, -4]], [[0, 0], [1, -1]]])},
        [
            (
                {"x": _floats(2, 3, 4, 5), "i": np.array([[[2, 3], [0, 0]], [[0, 4], [1, 1]]])},
                "index 4 is out of range for axis 2 of 'x' \\(size 4.* position \\[1, 0, 1\\]",
            )
        ],
    )
    found["scatter_elements_add"] = (
        _model(
            [node("ScatterElements", ["x", "i", "u"], ["y"], name="se", reduction="add")],
            {"x": (F32, (3, 4)), "i": (I64, (2, 4)), "u": (F32, (2, 4))},
            {"y": (F32, (3, 4))},
        ),
        {"x": _floats(3, 4), "i": np.array([[0, 1, 2, -1], [0, -3, 1, 2]]), "u": _floats(2, 4)},
        [
            (
                {
                    "x": _floats(3, 4),
                    "i": np.array([[0, 1, 2, 0], [0, 1, -4, 0]]),
                    "u": _floats(2, 4),
                },
                "index -4 .*axis 0 .* position \\[1, 2\\]",
            )
        ],
    )
    found["scatter_nd"] = (
        _model(
            [node("ScatterND", ["x", "i", "u"], ["y"], name="snd")],
            {"x": (F32, (4, 3)), "i": (I64, (2, 1)), "u": (F32, (2, 3))},
            {"y": (F32, (4, 3))},
        ),
        {"x": _floats(4, 3), "i": np.array([[3], [-4]]), "u": _floats(2, 3)},
        [({"x": _floats(4, 3), "i": np.array([[1], [7]]), "u": _floats(2, 3)}, "index 7 .*'i'")],
    )
    # OneHot reads indices as values: out of range gives an all-off row, as ONNX says
    found["onehot_out_of_range_is_off"] = (
        _model(
            [node("OneHot", ["i", "depth", "values"], ["y"], name="hot")],
            {"i": (I64, (4,))},
            {"y": (F32, (4, 3))},
            {"depth": np.array(3, np.int64), "values": np.array([0.0, 1.0], np.float32)},
        ),
        {"i": np.array([0, -1, 7, -4])},
        [],
    )
    return found


# --- the child process --------------------------------------------------------------------


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _outcome(run: Any, feeds: dict) -> dict:
    import polytile as pt

    try:
        run(feeds)
    except pt.errors.PolytileError as err:
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None, "message": ""}


def _largest_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest absolute difference (inf when the shapes or dtypes differ)."""
    if len(got) != len(want):
        return float("inf")
    errors = [0.0]
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return float("inf")
        if g.size:
            errors.append(float(np.max(np.abs(g.astype(np.float64) - w))))
    return max(errors)


def concurrent_child(rounds: int) -> None:
    """Two Python threads call `run` on one compiled model at once, `rounds` times each:
    one with an index out of range (a different value and position every round), one
    with valid indices (different every round). Prints what each saw, as JSON."""
    import threading

    import polytile as pt

    model, _, _ = cases()["gather_embedding"]
    table = numpy_helper.to_array(model.graph.initializer[0])
    compiled = pt.compile(model, num_threads=2)
    start = threading.Barrier(2)
    seen: dict[str, list] = {"bad": [], "good": []}

    def bad() -> None:
        start.wait()
        for r in range(rounds):
            ids = np.zeros((2, 3), np.int64)
            ids[r % 2, r % 3] = 10 + r
            seen["bad"].append([r, _outcome(compiled.run, {"ids": ids})])

    def good() -> None:
        rng = np.random.default_rng(5)
        start.wait()
        for _ in range(rounds):
            ids = rng.integers(-10, 10, (2, 3))
            want = table[np.where(ids < 0, ids + 10, ids)]
            try:
                (got,) = compiled.run({"ids": ids})
                seen["good"].append(_largest_error([got], [want]))
            except pt.errors.PolytileError as err:
                seen["good"].append(str(err))

    threads = [threading.Thread(target=bad), threading.Thread(target=good)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(seen), flush=True)


def child(names: list[str]) -> None:
    """Compile each case on one and two threads, run it, print one JSON line per case."""
    import polytile as pt
    import polytile.backend as backend

    table = cases()
    for name in names:
        model, good, bad = table[name]
        report: dict[str, Any] = {"case": name, "runs": []}
        want = _reference(model, good)
        for threads in (1, 2):
            compiled = pt.compile(model, num_threads=threads)
            error = _largest_error(compiled.run(good), want)
            report["runs"].append({"threads": threads, "error": error})
            report.setdefault("bad", []).append([_outcome(compiled.run, feeds) for feeds, _ in bad])
        with tempfile.TemporaryDirectory() as tmp:
            compiled.save(Path(tmp) / "m.ptm")
            loaded = pt.load(Path(tmp) / "m.ptm", num_threads=2)
            report["loaded"] = [_outcome(loaded.run, feeds) for feeds, _ in bad]
            report["loaded_error"] = _largest_error(loaded.run(good), want)
        session = pt.InferenceSession(model.SerializeToString())
        report["session"] = [_outcome(partial(session.run, None), feeds) for feeds, _ in bad]
        prepared = backend.prepare(model)
        order = [i.name for i in model.graph.input]
        report["backend"] = [
            _outcome(lambda f, rep=prepared, names=order: rep.run([f[n] for n in names]), feeds)
            for feeds, _ in bad
        ]
        print(json.dumps(report), flush=True)


# --- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    done = subprocess.run(
        [sys.executable, __file__, *cases()],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            found[report["case"]] = report
    found["_status"] = {"code": done.returncode, "stderr": done.stderr[-3000:]}
    return found


@pytest.mark.parametrize("name", list(cases()))
def test_index_checks(reports: dict[str, dict], name: str) -> None:
    status = reports["_status"]
    assert name in reports, f"the child process stopped (status {status['code']}): {status}"
    report = reports[name]
    model, _, bad = cases()[name]
    node = model.graph.node[-1]
    for run in report["runs"]:
        assert run["error"] < 1e-5, f"{run['threads']} thread(s): wrong results"
    assert report["loaded_error"] < 1e-5, "wrong results after save and load"
    outcomes = [*report["bad"], report["loaded"], report["session"], report["backend"]]
    for found in outcomes:
        for outcome, (_, fragment) in zip(found, bad, strict=True):
            assert outcome["error"] == "IndexOutOfRangeError", outcome
            message = outcome["message"]
            assert message.startswith(f"model 'checked': node '{node.name}' ({node.op_type})")
            assert re.search(fragment, message), f"{fragment!r} not in {message!r}"


def test_messages_name_model_node_and_input(reports: dict[str, dict]) -> None:
    (outcome,) = reports["gather_int32_axis1"]["bad"][0]
    assert outcome["message"] == (
        "model 'checked': node 'pick' (Gather): index 5 is out of range for axis 1 of 'x' "
        "(size 5; valid indices are -5..4), at position [2] of input 'ids'"
    )


def test_indices_folded_by_the_passes_are_checked_at_compile_time() -> None:
    """Indices too large to propagate at import are folded later, and checked then."""
    import polytile as pt

    count = 70000
    base = np.zeros(count, np.int64)
    base[-1] = 9
    model = _model(
        [
            helper.make_node("Add", ["base", "one"], ["ids"], name="shift"),
            helper.make_node("Gather", ["table", "ids"], ["y"], name="embed"),
        ],
        {"x": (F32, (1,))},
        {"y": (F32, (count, 4))},
        {"base": base, "one": np.array(1, np.int64), "table": np.zeros((10, 4), np.float32)},
    )
    with pytest.raises(pt.errors.ShapeError, match=r"node 'embed' \(Gather\).*index 10 .*69999"):
        pt.compile(model, num_threads=1)


def test_a_checked_model_keeps_its_checks_in_the_manifest(tmp_path: Path) -> None:
    import polytile as pt

    model, good, _ = cases()["gather_nd_batch"]
    compiled = pt.compile(model, num_threads=1)
    (check,) = compiled.manifest.checks or ()
    assert (check.input, check.sizes, check.axis, check.slot.kind) == ("i", (3, 4), 1, "input")
    manifest = json.loads((compiled.save(tmp_path / "m.ptm") / "manifest.json").read_text())
    assert manifest["checks"][0]["node"] == "node 'gnd' (GatherND)"
    feeds = compiled.random_inputs(3)
    assert np.all(feeds["i"] >= 0) and np.all(feeds["i"] < 3)
    for given in (feeds, good):
        got, want = compiled.run(given), _reference(model, given)
        assert _largest_error(got, want) < 1e-6


def test_a_model_saved_without_checks_still_loads(tmp_path: Path) -> None:
    """Manifests written before the checks have no "checks": their entry returns nothing."""
    import polytile as pt

    model, good, _ = cases()["gather_embedding"]
    path = pt.compile(model, num_threads=1).save(tmp_path / "m.ptm")
    data = json.loads((path / "manifest.json").read_text())
    assert data.pop("checks")
    (path / "manifest.json").write_text(json.dumps(data))
    loaded = pt.load(path)
    assert loaded.manifest.checks is None
    np.testing.assert_array_equal(loaded.run(good)[0], _reference(model, good)[0])
    # saved again, it still has no checks (an empty list would read a status it never set)
    again = pt.load(loaded.save(tmp_path / "again.ptm"))
    assert again.manifest.checks is None
    assert "checks" not in json.loads((tmp_path / "again.ptm" / "manifest.json").read_text())
    np.testing.assert_array_equal(again.run(good)[0], _reference(model, good)[0])


def test_concurrent_runs_each_name_their_own_index() -> None:
    """One compiled model, two Python threads running it at once: every call with a bad
    index raises naming that call's value and position, and every call with good ones
    returns numpy's result (the fault position and value are per call, not shared)."""
    rounds = 200
    done = subprocess.run(
        [sys.executable, __file__, "--concurrent", str(rounds)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the child process stopped (status {done.returncode}): {done.stderr[-3000:]}"
    seen = json.loads(lines[-1])
    assert len(seen["bad"]) == len(seen["good"]) == rounds
    for r, outcome in seen["bad"]:
        assert outcome["error"] == "IndexOutOfRangeError", outcome
        expected = f"index {10 + r} is out of range .* position \\[{r % 2}, {r % 3}\\]"
        assert re.search(expected, outcome["message"]), (r, outcome["message"])
    for error in seen["good"]:
        assert error == 0.0, error


if __name__ == "__main__":
    if sys.argv[1:2] == ["--concurrent"]:
        concurrent_child(int(sys.argv[2]))
    else:
        child(sys.argv[1:])
