"""A model compiled for all sizes with one kernel that cannot stay symbolic: a Resize to
a size read from the batch (`sizes` from Shape) between symbolic convolutions. That
kernel is compiled per batch on first use and cached; the others serve every batch. Each
run is compared with onnxruntime, the compilations are counted, `explain` names the
kernel, a saved model compiles it again after loading, and a library export is refused
naming it."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
import polytile.compiler
import polytile.special
from polytile import cli
from polytile.codegen import cache, link
from polytile.errors import CodegenError, ShapeError
from polytile.explanation import explain
from polytile.frontend import Graph

from peers import ort_run


def resize_model() -> onnx.ModelProto:
    """Conv → Relu (symbolic), Resize to [batch, 8, 12, 12] → Conv (per size: the
    Resize's scale is the ratio of a size read from the batch to the batch), then a
    global average pool and a classifier (symbolic)."""
    rng = np.random.default_rng(11)
    inits = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
        for name, shape in [("w1", (8, 4, 3, 3)), ("w2", (6, 8, 1, 1)), ("w3", (6, 5))]
    ]
    inits.append(numpy_helper.from_array(np.array([12, 12], np.int64), "hw"))
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Shape", ["r1"], ["s"], name="shape", start=0, end=2),
        n("Concat", ["s", "hw"], ["sizes"], name="concat", axis=0),
        n("Resize", ["r1", "", "", "sizes"], ["up"], name="resize", mode="linear"),
        n("Conv", ["up", "w2"], ["c2"], name="conv2"),
        n("GlobalAveragePool", ["c2"], ["g"], name="pool"),
        n("Flatten", ["g"], ["f"], name="flatten"),
        n("MatMul", ["f", "w3"], ["y"], name="classifier"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "resize_special", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@functools.cache
def _compiled() -> pt.CompiledModel:
    return pt.compile(resize_model(), bounds={"batch": (1, 8)})


def _feeds(batch: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(batch).standard_normal((batch, 4, 6, 6)).astype(np.float32)
    return {"x": x}


def _check(compiled: pt.CompiledModel, batch: int) -> None:
    feeds = _feeds(batch)
    (got,) = compiled.run(feeds)
    (want,) = ort_run(resize_model(), feeds)
    assert got.shape == want.shape == (batch, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"at batch {batch}")


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the graphs compiled from now on (every compile goes through
    `_compile`)."""
    seen: list[str] = []
    real = polytile.compiler._compile

    def counted(graph: Graph, *args: Any, **kwargs: Any) -> pt.CompiledModel:
        seen.append(graph.name)
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(polytile.compiler, "_compile", counted)
    return seen


def test_only_the_kernel_that_cannot_stay_symbolic_is_compiled_per_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = _compiled()
    assert compiled.manifest.dynamic is not None
    (special,) = compiled.manifest.specials
    assert "node 'resize' (Resize)" in special.nodes
    assert special.params == ("batch",)
    assert "cannot stay symbolic" in special.reason
    # the kernels before and after it are symbolic: one call each, compiled once
    assert len(compiled.manifest.calls) >= 3
    seen = _counting(monkeypatch)
    for batch in (1, 3, 1, 8, 3, 1):
        _check(compiled, batch)
    assert len(seen) == 3  # one specialization per distinct batch, none again
    assert compiled.specializations is not None
    assert {(1,), (3,), (8,)} <= {sizes for _, sizes in compiled.specializations.compiled}


def test_explain_names_the_kernel_compiled_per_size_and_why() -> None:
    compiled = _compiled()
    _check(compiled, 2)
    text = explain(compiled)
    assert "compiled once for all sizes of batch" in text
    assert "node 'resize' (Resize)" in text
    assert "compiled per size (batch) on first use, because its lowering cannot stay" in text
    assert "compiled so far at: " in text and "batch=2" in text


def test_cli_explain_and_compile_name_the_group_compiled_per_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "resize.onnx"
    onnx.save(resize_model(), path)
    assert cli.main(["explain", str(path), "--groups", "--kernel", "all"]) == 0
    out = capsys.readouterr().out
    assert "is compiled per size on first use, because its lowering cannot stay symbolic" in out
    assert "Resize → Conv" in out and "(compiled per size)" in out
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "resize.ptm")]) == 0
    out = capsys.readouterr().out
    assert "1 kernel(s) compiled per size instead" in out and "node 'resize' (Resize)" in out


def test_a_saved_model_compiles_its_specializations_again_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = _compiled()
    _check(compiled, 2)
    loaded = pt.load(compiled.save(tmp_path / "special.ptm"))
    assert loaded.manifest.specials == compiled.manifest.specials
    assert loaded.manifest.dynamic == compiled.manifest.dynamic  # with its special entries
    assert loaded.manifest.dynamic is not None and loaded.manifest.dynamic.specials == 1
    loaded.set_num_threads(1)  # its specializations too, when they are compiled
    seen = _counting(monkeypatch)
    for batch in (2, 5, 2):
        _check(loaded, batch)
    assert len(seen) == 2


def test_export_library_refuses_naming_the_kernel(tmp_path: Path) -> None:
    with pytest.raises(CodegenError, match=r"cannot be exported.*node 'resize' \(Resize\)"):
        _compiled().export_library(tmp_path / "special.so")


def test_a_failed_specialization_names_the_kernel_and_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = pt.compile(resize_model(), bounds={"batch": (1, 8)})

    def refuse(*args: object, **kwargs: object) -> None:
        raise ShapeError("refused here")

    monkeypatch.setattr(polytile.special, "at_sizes", refuse)
    with pytest.raises(CodegenError, match=r"kernel \d+ \(node 'resize'.*at batch=4: refused"):
        model.run(_feeds(4))


def test_the_session_compiles_such_a_model_once_without_a_fallback_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no whole-model fallback
        sess = pt.InferenceSession(resize_model().SerializeToString())
    for batch in (1, 4):
        feeds = _feeds(batch)
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], ort_run(resize_model(), feeds)[0], rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize("stage", ["schedule", "code"])
def test_a_refused_schedule_or_code_is_compiled_per_size_too(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classifier's symbolic schedule (or its code) refused: it joins the Resize's
    kernel in being compiled per size, and every size still matches onnxruntime."""

    def refusing(real: Any) -> Any:
        def wrapped(schedule_or_kernel: Any, *args: Any, **kwargs: Any) -> Any:
            kernel = getattr(schedule_or_kernel, "kernel", schedule_or_kernel)
            if kernel.params and "MatMul" in kernel.name:
                raise CodegenError("refused for the test")
            return real(schedule_or_kernel, *args, **kwargs)

        return wrapped

    if stage == "schedule":
        monkeypatch.setattr(
            polytile.compiler, "checked_default", refusing(polytile.compiler.checked_default)
        )
    else:
        monkeypatch.setattr(link, "kernel_module", refusing(link.kernel_module))
        monkeypatch.setattr(cache, "EMITTED", cache.Memo(8))  # emitted afresh
    compiled = pt.compile(resize_model(), bounds={"batch": (1, 8)})
    specials = compiled.manifest.specials
    assert len(specials) == 2
    assert any("Resize" in label for label in specials[0].nodes)
    assert specials[1].nodes == ("node 'classifier' (MatMul)",)
    assert specials[1].reason == f"its {stage} cannot stay symbolic: refused for the test"
    monkeypatch.undo()
    for batch in (2, 6):
        _check(compiled, batch)
    assert compiled.specializations is not None
    assert compiled.specializations.compilations == 4


def slice_model() -> onnx.ModelProto:
    """MatMul (symbolic), then a Slice starting at seq // 2 (a start read from the sizes:
    its kernel is compiled per size), Relu and a MatMul fused after it."""
    rng = np.random.default_rng(12)
    inits = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
        for name, shape in [("w1", (8, 8)), ("w2", (8, 4))]
    ]
    inits += [
        numpy_helper.from_array(np.array([value], np.int64), name)
        for name, value in [("two", 2), ("end", 1 << 40), ("axis", 1)]
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h"], name="mm1"),
        n("Shape", ["x"], ["s"], name="shape", start=1, end=2),
        n("Div", ["s", "two"], ["half"], name="half"),
        n("Slice", ["h", "half", "end", "axis"], ["sl"], name="slice"),
        n("Relu", ["sl"], ["r"], name="relu"),
        n("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "slice_special", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_slice_starting_at_a_size_is_compiled_per_batch_and_sequence() -> None:
    compiled = pt.compile(slice_model(), bounds={"batch": (1, 8), "seq": (1, 64)})
    (special,) = compiled.manifest.specials
    assert special.nodes[0] == "node 'slice' (Slice)" and special.params == ("batch", "seq")
    for batch, seq in [(1, 4), (2, 7), (1, 4), (3, 33), (2, 7)]:
        x = np.random.default_rng(seq).standard_normal((batch, seq, 8)).astype(np.float32)
        (got,) = compiled.run({"x": x})
        (want,) = ort_run(slice_model(), {"x": x})
        assert got.shape == want.shape == (batch, seq - seq // 2, 4)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert compiled.specializations is not None
    assert compiled.specializations.compilations == 3
