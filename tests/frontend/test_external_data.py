"""Models whose weights live in external data files: loaded relative to the model's
folder by every entry point; a missing, short or escaping file is a ModelError naming the
file and the tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.errors import ModelError
from polytile.frontend import importer, loading

#: 96 KB: over the size past which the skeleton checked above 2 GB drops a tensor's bytes
W = np.arange(256 * 96, dtype=np.float32).reshape(256, 96) / 1e4
X = np.linspace(-1, 1, 512, dtype=np.float32).reshape(2, 256)


def _save(folder: Path, location: str = "weights.bin") -> Path:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 96])],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location=location, size_threshold=0)
    return path


def test_external_weights_load_from_the_models_folder(tmp_path: Path, monkeypatch) -> None:
    path = _save(tmp_path / "m")
    monkeypatch.chdir(tmp_path)  # not the model's folder: paths resolve against the model's
    (y,) = pt.compile(path).run({"x": X})
    np.testing.assert_allclose(y, X @ W, rtol=1e-5)
    (y,) = pt.InferenceSession(str(path)).run(None, {"x": X})
    np.testing.assert_allclose(y, X @ W, rtol=1e-5)


def test_a_missing_external_file_names_the_file_and_the_tensor(tmp_path: Path) -> None:
    path = _save(tmp_path)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelError, match=r"tensor 'w'.*weights\.bin.*does not exist"):
        pt.compile(path)
    with pytest.raises(ModelError, match=r"tensor 'w'.*weights\.bin"):
        pt.InferenceSession(str(path))


def test_a_short_external_file_names_the_file_and_the_tensor(tmp_path: Path) -> None:
    path = _save(tmp_path)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[:100])
    with pytest.raises(ModelError, match=r"tensor 'w'.*weights\.bin.*only 100 bytes"):
        pt.compile(path)


def test_an_external_file_outside_the_models_folder_is_refused(tmp_path: Path) -> None:
    path = _save(tmp_path / "m")
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../outside.bin"
    (tmp_path / "outside.bin").write_bytes((tmp_path / "m" / "weights.bin").read_bytes())
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match=r"tensor 'w'.*outside\.bin.*outside the model's folder"):
        pt.compile(path)


def test_a_model_proto_without_its_external_data_is_refused(tmp_path: Path) -> None:
    model = onnx.load(str(_save(tmp_path)), load_external_data=False)
    with pytest.raises(ModelError, match=r"tensor 'w'.*weights\.bin.*not loaded"):
        pt.compile(model)


def test_model_bytes_never_read_external_data_from_the_working_folder(
    tmp_path: Path, monkeypatch
) -> None:
    """Bytes have no folder: their external data is not looked up where the process
    happens to run (a file there may hold anything)."""
    path = _save(tmp_path)
    monkeypatch.chdir(tmp_path)  # weights.bin is right here
    with pytest.raises(ModelError, match=r"tensor 'w'.*weights\.bin.*not loaded"):
        pt.compile(path.read_bytes())


def test_models_past_the_serialization_limit_are_checked_without_their_weights(
    tmp_path: Path, monkeypatch
) -> None:
    """Over 2 GB the checker cannot serialize the model: it checks a skeleton instead
    (the limit lowered here, so that the test stays small)."""
    path = _save(tmp_path)
    monkeypatch.setattr(loading, "_CHECK_LIMIT", 1000)
    skeleton = loading._skeleton(onnx.load(str(path)))
    assert list(skeleton.graph.initializer[0].dims) == [0]
    (y,) = pt.compile(path).run({"x": X})
    np.testing.assert_allclose(y, X @ W, rtol=1e-5)
    broken = onnx.load(str(path))
    broken.graph.node[0].input[1] = "nowhere"
    with pytest.raises(ModelError, match="checker"):
        importer.import_model(broken)
