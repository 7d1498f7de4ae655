"""The model zoo: seeded random weights on the onnx light architectures + generated models.

The zoo feeds benchmarks and end-to-end tests, so it must be exactly reproducible per seed,
valid ONNX, and numerically meaningful (finite outputs, a softmax that is neither one-hot
nor uniform), or differential tests against onnxruntime would prove little.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polytile import zoo
from polytile.errors import InputError, ShapeError
from polytile.zoo.weights import legacy_roles, randomize_light

LIGHT = [i.name for i in zoo.list_models() if i.source == "onnx-light"]
MODERN = [i.name for i in zoo.list_models() if i.source == "modern"]
BIG = {"alexnet", "vgg19", "zfnet512"}  # 250-575 MB each: a few seconds to build
SMALL = ["squeezenet", "shufflenet", "mlp", "transformer"]


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # IR-3 models list initializers as inputs: ORT warns
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


# ---------------------------------------------------------------------------------------
# Catalogue and errors
# ---------------------------------------------------------------------------------------


def test_names_and_list_models_agree() -> None:
    infos = zoo.list_models()
    assert tuple(i.name for i in infos) == zoo.NAMES
    assert len(LIGHT) == 9 and len(MODERN) == 32
    assert len(zoo.NAMES) == 9 + 32 + 3
    by_name = {i.name: i for i in infos}
    for name in LIGHT:
        assert by_name[name].source == "onnx-light"
        ((_, shape),) = by_name[name].inputs
        assert shape == (1, 3, 224, 224)
    assert by_name["transformer"].source == by_name["mlp"].source == "generated"
    assert by_name["transformer"].inputs == (("x", (1, 128, 256)),)
    assert by_name["transformer_base"].inputs == (("x", (1, 128, 768)),)
    assert by_name["mlp"].inputs == (("x", (8, 784)),)
    assert all(i.description for i in infos)
    with pytest.raises(dataclasses.FrozenInstanceError):
        infos[0].name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("call", [zoo.build, zoo.materialize, zoo.load])
def test_unknown_name_lists_valid_names(call, tmp_path: Path) -> None:
    kwargs = {} if call is zoo.build else {"cache_root": tmp_path / "cache"}
    with pytest.raises(InputError) as info:
        call("resnet18", **kwargs)
    message = str(info.value)
    assert "resnet18" in message
    assert all(name in message for name in zoo.NAMES)
    assert not (tmp_path / "cache").exists()  # rejected before touching the cache


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed_is_an_input_error(seed) -> None:
    with pytest.raises(InputError, match="seed"):
        zoo.build("mlp", seed)


# ---------------------------------------------------------------------------------------
# Structure of the built models
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in zoo.NAMES]
)
def test_every_model_builds_and_passes_checker(name: str, zoo_model) -> None:
    model = zoo.build(name) if name in BIG else zoo_model(name)
    if name not in BIG:  # the big ones: build() already ran the (cheap) checker
        onnx.checker.check_model(model, full_check=True)
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    true_inputs = [i.name for i in graph.input if i.name not in inits]
    info = {i.name: i for i in zoo.list_models()}[name]
    assert true_inputs == [n for n, _ in info.inputs]
    assert not any(n.endswith("__SHAPE") for n in inits)
    assert not any(i.name.endswith("__SHAPE") for i in graph.input)
    assert not any(
        node.op_type == "ConstantOfShape" and node.input[0] in inits for node in graph.node
    )
    weights = _weights(model)
    assert all(np.isfinite(a).all() for a in weights.values() if a.dtype.kind == "f")
    if name in LIGHT:
        assert model.ir_version == 3
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 9)]
        # IR 3: every initializer is a graph input too (the checker insists).
        assert inits <= {i.name for i in graph.input}


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "densenet121"])
def test_weights_have_the_shapes_of_the_fills(name: str, zoo_model) -> None:
    stem = zoo._LIGHT[name][0]
    light = onnx.load(Path(onnx.__file__).parent / f"backend/test/data/light/light_{stem}.onnx")
    shapes = {t.name: numpy_helper.to_array(t) for t in light.graph.initializer}
    weights = _weights(zoo_model(name))
    fills = [n for n in light.graph.node if n.op_type == "ConstantOfShape"]
    assert fills
    for node in fills:
        expected = tuple(int(d) for d in shapes[node.input[0]])
        assert weights[node.output[0]].shape == expected, node.output[0]
        assert weights[node.output[0]].dtype == np.float32
    # Same graph otherwise: every non-fill node is still there, in order.
    kept = [(n.op_type, list(n.input), list(n.output)) for n in light.graph.node]
    kept = [k for k in kept if k[0] != "ConstantOfShape"]
    built = [(n.op_type, list(n.input), list(n.output)) for n in zoo_model(name).graph.node]
    assert built == kept


@pytest.mark.parametrize("name", ["resnet50", "shufflenet", "densenet121", "inception_v2"])
def test_batchnorm_variances_are_positive(name: str, zoo_model) -> None:
    model = zoo_model(name)
    weights = _weights(model)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert bns
    for node in bns:
        var = weights[node.input[4]]
        assert var.min() >= 0.5 and var.max() < 1.5, node.output[0]


def test_resnet_residual_branches_are_tamed(zoo_model) -> None:
    """The last BN of each residual branch has a small gamma; projections do not."""
    model = zoo_model("resnet50")
    weights, producer = _weights(model), _producers(model)
    tamed, projections = 0, 0
    for merge in (n for n in model.graph.node if n.op_type == "Sum"):
        for name in merge.input:
            bn = producer[name]
            if bn.op_type != "BatchNormalization":
                continue
            gamma = weights[bn.input[1]]
            # ResNet-50 (Caffe2) names them: res<stage>_<block>_branch2c (residual) and
            # res<stage>_0_branch1 (projection shortcut).
            if "branch2c" in bn.input[1]:
                tamed += 1
                assert gamma.min() >= 0.1 and gamma.max() < 0.3
            else:
                assert "branch1" in bn.input[1]
                projections += 1
                assert gamma.min() >= 0.5 and gamma.max() < 1.0
    assert (tamed, projections) == (16, 4)


def test_expanded_batchnorm_keeps_identity_affine(zoo_model) -> None:
    """DenseNet's BN nodes keep scale 1 / B 0: their affine part is the Mul / Add after."""
    model = zoo_model("densenet121")
    weights = _weights(model)
    for node in (n for n in model.graph.node if n.op_type == "BatchNormalization"):
        np.testing.assert_array_equal(weights[node.input[1]], 1.0)
        np.testing.assert_array_equal(weights[node.input[2]], 0.0)
    producer = _producers(model)
    muls = [n for n in model.graph.node if n.op_type == "Mul"]
    for mul in muls:
        scale = weights[producer[mul.input[1]].input[0]]  # Unsqueeze(scale)
        assert scale.min() >= 0.625 and scale.max() < 1.25


def test_role_distributions(zoo_model) -> None:
    weights = _weights(zoo_model("resnet50"))
    conv = weights["gpu_0/res5_0_branch2b_w_0"]  # (512, 512, 3, 3): fan-in 4608
    assert conv.shape == (512, 512, 3, 3)
    assert abs(conv.std() / math.sqrt(2 / 4608) - 1) < 0.01
    assert abs(conv.mean()) < 1e-3
    fc = weights["gpu_0/pred_w_0"]  # Gemm transB=1: (1000, 2048), fan-in 2048
    assert fc.shape == (1000, 2048)
    assert abs(fc.std() / math.sqrt(2 / 2048) - 1) < 0.01
    bias = weights["gpu_0/pred_b_0"]
    assert abs(bias.std() / 0.01 - 1) < 0.1
    mean = weights["gpu_0/res5_0_branch2b_bn_rm_0"]
    assert abs(mean.std() / 0.05 - 1) < 0.15


def test_gemm_without_transb_takes_fan_in_from_rows() -> None:
    """A synthetic light-style model: weights as ConstantOfShape of `<w>__SHAPE`."""
    fill = numpy_helper.from_array(np.array([0.02], np.float32))
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["w__SHAPE"], ["w"], value=fill),
            helper.make_node("ConstantOfShape", ["b__SHAPE"], ["b"], value=fill),
            helper.make_node("Gemm", ["x", "w", "b"], ["y"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 400]),
            helper.make_tensor_value_info("w__SHAPE", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("b__SHAPE", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1000])],
        initializer=[
            numpy_helper.from_array(np.array([400, 1000], np.int64), "w__SHAPE"),
            numpy_helper.from_array(np.array([1000], np.int64), "b__SHAPE"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    out = randomize_light(model, 0, legacy_roles(model.graph), "synthetic")
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Gemm"]
    assert [i.name for i in out.graph.input] == ["x", "w", "b"]
    weights = _weights(out)
    assert weights.keys() == {"w", "b"}
    assert weights["w"].shape == (400, 1000)
    assert abs(weights["w"].std() / math.sqrt(2 / 400) - 1) < 0.02  # fan-in 400, not 1000
    assert abs(weights["b"].std() / 0.01 - 1) < 0.1


# ---------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL)
def test_weights_are_deterministic_per_seed_and_differ_across_seeds(name: str, zoo_model) -> None:
    a, again = _weights(zoo_model(name)), _weights(zoo.build(name, 0))
    other = _weights(zoo_model(name, 1))
    assert a.keys() == again.keys() == other.keys()
    for key, value in a.items():
        np.testing.assert_array_equal(value, again[key])
    random_tensors = [k for k, v in a.items() if v.dtype == np.float32 and v.size > 1]
    assert random_tensors
    assert all(not np.array_equal(a[k], other[k]) for k in random_tensors if np.ptp(a[k]) > 0)


def test_weights_do_not_depend_on_node_order(zoo_model) -> None:
    light = zoo._load_light("shufflenet")
    nodes = list(light.graph.node)
    fills = [n for n in nodes if n.op_type == "ConstantOfShape"]
    random.Random(0).shuffle(fills)  # fills have no node inputs: any order is valid
    del light.graph.node[:]
    light.graph.node.extend(fills + [n for n in nodes if n.op_type != "ConstantOfShape"])
    shuffled = _weights(randomize_light(light, 0, legacy_roles(light.graph), "shufflenet"))
    reference = _weights(zoo_model("shufflenet"))
    assert shuffled.keys() == reference.keys()
    for key, value in reference.items():
        np.testing.assert_array_equal(value, shuffled[key])


def test_random_inputs(zoo_model) -> None:
    model = zoo_model("squeezenet")
    feeds = zoo.random_inputs(model, seed=3)
    assert list(feeds) == ["data_0"]
    x = feeds["data_0"]
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    np.testing.assert_array_equal(x, zoo.random_inputs(model, seed=3)["data_0"])
    assert not np.array_equal(x, zoo.random_inputs(model, seed=4)["data_0"])


def _model_with(input_info: onnx.ValueInfoProto, *nodes: onnx.NodeProto) -> onnx.ModelProto:
    out = nodes[-1].output[0] if nodes else "y"
    nodes = nodes or (helper.make_node("Identity", [input_info.name], ["y"]),)
    graph = helper.make_graph(
        list(nodes),
        "g",
        [input_info],
        [helper.make_tensor_value_info(out, TensorProto.UNDEFINED, None)],
        initializer=[numpy_helper.from_array(np.zeros((7, 3), np.float32), "table")],
    )
    return helper.make_model(graph)


def test_random_inputs_symbolic_dims_and_unsupported_types() -> None:
    dynamic = _model_with(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]))
    with pytest.raises(ShapeError, match=r"'x'.*'N'"):
        zoo.random_inputs(dynamic)
    assert zoo.random_inputs(dynamic, dims={"N": 3})["x"].shape == (3, 4)
    strings = _model_with(helper.make_tensor_value_info("s", TensorProto.STRING, [2]))
    with pytest.raises(InputError, match="'s'"):
        zoo.random_inputs(strings)


def test_random_inputs_integer_indices_stay_inside_their_table() -> None:
    """Token ids reach an embedding through casts and reshapes: they are drawn over its
    rows; an integer input that indexes nothing (a mask) is all ones."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [4, 50])
    cast = helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64)
    gather = helper.make_node("Gather", ["table", "ids64"], ["y"], axis=0)
    feeds = zoo.random_inputs(_model_with(ids, cast, gather), seed=3)
    assert feeds["ids"].dtype == np.int32
    assert feeds["ids"].min() == 0 and feeds["ids"].max() == 6  # 200 draws over 7 rows
    mask = _model_with(helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 5]))
    np.testing.assert_array_equal(zoo.random_inputs(mask)["mask"], np.ones((2, 5)))


# ---------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------


def test_cache_dir_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert zoo.cache_dir() == tmp_path / "xdg" / "polytile" / "zoo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo.cache_dir() == tmp_path / "home" / ".cache" / "polytile" / "zoo"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # invalid per the XDG spec
    assert zoo.cache_dir() == tmp_path / "home" / ".cache" / "polytile" / "zoo"
    assert zoo.cache_dir(tmp_path / "explicit") == tmp_path / "explicit"


def test_materialize_writes_once(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "nested"
    path = zoo.materialize("mlp", seed=2, cache_root=root)
    assert path == root / "mlp-seed2-v3.onnx" and path.is_file()
    assert [p.name for p in root.iterdir()] == ["mlp-seed2-v3.onnx"]  # no temp file left
    past = path.stat().st_mtime_ns - 10**10  # make a rewrite visible on any filesystem
    os.utime(path, ns=(past, past))
    assert zoo.materialize("mlp", seed=2, cache_root=root) == path
    assert path.stat().st_mtime_ns == past
    loaded = zoo.load("mlp", seed=2, cache_root=root)
    assert path.stat().st_mtime_ns == past
    assert loaded.SerializeToString() == zoo.build("mlp", 2).SerializeToString()


def test_materialize_uses_the_session_cache(zoo_cache_root: Path, zoo_model) -> None:
    path = zoo.materialize("squeezenet", cache_root=zoo_cache_root)
    assert path.parent == zoo_cache_root
    model = onnx.load(path)
    onnx.checker.check_model(str(path))
    assert _weights(model).keys() == _weights(zoo_model("squeezenet")).keys()


# ---------------------------------------------------------------------------------------
# Numerics under onnxruntime
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("squeezenet", (1, 1000, 1, 1)),
        ("shufflenet", (1, 1000)),
        ("mlp", (8, 10)),
    ],
)
def test_classifiers_have_a_non_degenerate_softmax(name: str, shape, zoo_model) -> None:
    model = zoo_model(name)
    (y,) = _run_ort(model, zoo.random_inputs(model))
    assert y.shape == shape
    assert np.isfinite(y).all()
    probs = y.reshape(shape[0], shape[1])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
    assert probs.max() < 0.999  # not one-hot: logits are not blown up
    assert probs.max(axis=1).min() > 2.0 / shape[1]  # not uniform: signal gets through


def test_transformer_output_is_layer_normalized(zoo_model) -> None:
    model = zoo_model("transformer")
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    ops = {n.op_type for n in model.graph.node}
    assert {"LayerNormalization", "Softmax", "Erf", "MatMul", "Transpose", "Reshape"} <= ops
    (y,) = _run_ort(model, zoo.random_inputs(model))
    assert y.shape == (1, 128, 256)
    assert np.isfinite(y).all()
    per_token_std = y.std(axis=-1)
    assert per_token_std.min() > 0.9 and per_token_std.max() < 1.1  # LN scale ~ 1
    assert abs(y.mean()) < 0.05
