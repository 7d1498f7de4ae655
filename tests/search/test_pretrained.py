"""The pre-trained cost model: the shipped rows load with the code's feature format, a fit
on them ranks candidates of tasks it never saw better than chance, `tune` uses it by
default and refits it with its own measurements, and unusable rows fall back (with a
warning naming the file) to a model trained from scratch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile.codegen.target import host
from polytile.errors import TuningError
from polytile.search import cost_model as cm
from polytile.search.measure import MeasureConfig
from polytile.search.records import RecordFile
from polytile.search.tasks import extract_tasks

#: candidates built in the test's process (no build workers)
HERE = MeasureConfig(build_timeout=None)
W = np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32)


def model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pairwise(pred: np.ndarray, truth: np.ndarray) -> float:
    """Share of the pairs of different truth that `pred` orders as `truth` does."""
    i, j = np.triu_indices(len(truth), 1)
    differ = truth[i] != truth[j]
    return float(((pred[i] - pred[j]) * (truth[i] - truth[j]) > 0)[differ].mean())


def test_shipped_rows_load_with_the_declared_format() -> None:
    from polytile.poly.default.schedule import default_schedule

    data = cm.load_shipped()
    meta = data.meta
    assert meta["format"] == cm.MODEL_FORMAT
    kernel = extract_tasks(model())[0].kernel
    width = len(cm.trace_features(default_schedule(kernel)))
    assert data.features.shape == (meta["rows"], width) == (len(data.targets), meta["width"])
    assert np.isfinite(data.features).all()
    # throughput normalized per task: every task's best is 1, failures 0
    assert ((data.targets >= 0) & (data.targets <= 1)).all()
    for task in np.unique(data.groups):
        assert data.targets[data.groups == task].max() == pytest.approx(1.0)
    assert len(np.unique(data.groups)) == meta["tasks"] >= 20
    assert meta["cpu"] and meta["features"] and meta["date"] and meta["held_out"]
    assert not set(meta["held_out"]) & set(meta["models"])
    assert Path(cm.SHIPPED).stat().st_size < 5 * 2**20


def test_a_fit_on_the_shipped_rows_ranks_unseen_tasks_better_than_chance() -> None:
    data = cm.load_shipped()
    tasks = np.unique(data.groups)
    held = np.isin(data.groups, tasks[::4])  # whole tasks, never trained on

    def accuracy(features: np.ndarray, targets: np.ndarray) -> float:
        fit = cm._regressor(features[~held], targets[~held], 0)
        found = []
        for task in tasks[::4]:
            mask = data.groups == task
            if len(set(data.targets[mask].tolist())) > 1:
                found.append(pairwise(cm._predict(fit, data.features[mask]), data.targets[mask]))
        return float(np.mean(found))

    rng = np.random.default_rng(0)
    learned = accuracy(data.features, data.targets)
    scrambled = accuracy(data.features, rng.permutation(data.targets))
    chance = np.mean(
        [
            pairwise(rng.random(int(m.sum())), data.targets[m])
            for m in (data.groups == t for t in tasks[::4])
            if len(set(data.targets[m].tolist())) > 1
        ]
    )
    assert learned > 0.57 and learned > chance + 0.06 and learned > scrambled + 0.05


def test_tune_uses_the_pretrained_model_by_default_and_refits_with_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polytile.search import tune as tune_module

    made = []

    class Watched(tune_module.Tuner):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(tune_module, "Tuner", Watched)
    tune_module.tune(
        model(), trials=6, records=str(tmp_path / "r.jsonl"), seed=1, batch=3,
        progress=False, measure=HERE,
    )  # fmt: skip
    (tuner,) = made
    assert tuner.model.kind == "pretrained"
    shipped = len(cm.load_shipped().targets)
    measured = [m for s in tuner.states for m in s.measured if m.row is not None]
    assert len(measured) == 6
    assert tuner.model.fitted_rows == shipped + 6  # the last refit had every new row
    # a Tuner made directly has the same default
    records = RecordFile(tmp_path / "direct.jsonl")
    direct = tune_module.Tuner(extract_tasks(model()), records, host(), 0, measure=HERE)
    assert isinstance(direct.model, cm.PretrainedModel)


def test_unusable_shipped_rows_warn_and_train_from_scratch(tmp_path: Path) -> None:
    bad = tmp_path / "bad_rows.npz"
    shutil.copy(cm.SHIPPED, bad)
    meta = json.loads(Path(cm.SHIPPED).with_suffix(".json").read_text())
    bad.with_suffix(".json").write_text(json.dumps({**meta, "format": cm.MODEL_FORMAT + 1}))
    with pytest.raises(TuningError, match=r"bad_rows\.npz.*feature format"):
        cm.load_shipped(bad)
    rng = np.random.default_rng(0)
    rows, scores = rng.standard_normal((20, 5)), rng.random(20)
    for path in (bad, tmp_path / "missing.npz"):
        fallback = cm.PretrainedModel(seed=2, data=path)
        with pytest.warns(UserWarning, match=rf"{path.stem}\.npz.*from scratch"):
            fallback.fit_rows(rows, scores)
        scratch = cm.GBModel(seed=2)
        scratch.fit_rows(rows, scores)
        assert fallback.fitted_rows == 20
        np.testing.assert_array_equal(fallback.predict_rows(rows), scratch.predict_rows(rows))
