"""A small model zoo: real architectures with seeded random weights, built offline.

Benchmarks, examples and end-to-end tests need realistic models, but the pretrained ONNX
model zoo is gigabytes behind a network download. The onnx wheel already ships the nine
"light" model-zoo architectures (`backend/test/data/light`), whose large weights were
replaced by `ConstantOfShape` fills of a `<weight>__SHAPE` initializer. This module turns
those fills back into real initializers holding seeded random values, so every compiler
stage sees the true weight shapes and constant tensors, and the outputs stay numerically
meaningful (finite, with non-degenerate softmax). Two generated models, one BERT-style
transformer encoder layer and an MLP, cover MatMul / LayerNormalization / GELU workloads.

Weights are drawn per tensor from `numpy.random.default_rng([seed, crc32(tensor name)])`,
so a tensor's values depend only on the seed and its name, never on node order.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from polytile.errors import InputError, ModelError, ShapeError

__all__ = [
    "NAMES",
    "ModelInfo",
    "build",
    "cache_dir",
    "list_models",
    "load",
    "materialize",
    "random_inputs",
]


@dataclass(frozen=True)
class ModelInfo:
    """What a zoo model is, without building it (the CLI lists these)."""

    name: str
    description: str
    source: Literal["onnx-light", "generated"]  # architecture from the onnx wheel, or ours
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # true graph inputs: (name, static shape)


# Short name -> (file stem under onnx's light directory, description).
_LIGHT: dict[str, tuple[str, str]] = {
    "alexnet": ("bvlc_alexnet", "AlexNet (BVLC Caffe), 224x224, LRN + 3 large Gemm"),
    "densenet121": ("densenet121", "DenseNet-121, 224x224, BN expanded to Mul/Add, Concat"),
    "inception_v1": ("inception_v1", "GoogLeNet / Inception-v1, 224x224, LRN, Concat"),
    "inception_v2": ("inception_v2", "Inception-v2 (BN-Inception), 224x224, BN as Mul/Add"),
    "resnet50": ("resnet50", "ResNet-50 v1 (Caffe2), 224x224, BN + residual Sum"),
    "shufflenet": ("shufflenet", "ShuffleNet v1, 224x224, grouped Conv, channel shuffle"),
    "squeezenet": ("squeezenet", "SqueezeNet 1.0, 224x224, fire modules, GlobalAveragePool"),
    "vgg19": ("vgg19", "VGG-19, 224x224, ~144M parameters (~550 MB)"),
    "zfnet512": ("zfnet512", "ZFNet-512, 224x224, LRN + 3 large Gemm"),
}

_TRANSFORMER_SHAPE = (1, 128, 256)
_TRANSFORMER_HEADS = 4
_TRANSFORMER_FFN = 1024
_MLP_SHAPE = (8, 784)
_MLP_WIDTHS = (784, 512, 256, 10)

_GENERATED: dict[str, tuple[str, tuple[int, ...]]] = {
    "transformer": (
        "BERT-style encoder layer (opset 17): 4-head attention, LayerNorm, Erf-GELU FFN",
        _TRANSFORMER_SHAPE,
    ),
    "mlp": ("MLP 784-512-256-10 (opset 13): Gemm + Relu, Softmax", _MLP_SHAPE),
}

NAMES: tuple[str, ...] = (*_LIGHT, *_GENERATED)

_LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise InputError(f"unknown zoo model {name!r}; valid names: {', '.join(NAMES)}")


def _check_seed(seed: int) -> None:
    # default_rng rejects negative entropy; a bool seed is almost surely a caller bug.
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InputError(f"zoo seed must be a non-negative integer, got {seed!r}")


def _rng(seed: int, tensor_name: str) -> np.random.Generator:
    """A generator that depends only on (seed, tensor name), so node order never matters."""
    return np.random.default_rng([int(seed), zlib.crc32(tensor_name.encode("utf-8"))])


@functools.cache
def _light_model_bytes(stem: str) -> bytes:
    path = _LIGHT_DIR / f"light_{stem}.onnx"
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ModelError(f"zoo: cannot read {path} shipped with onnx: {exc}") from exc


def _load_light(stem: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.ParseFromString(_light_model_bytes(stem))
    return model


def _static_shape(value_info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    dims = value_info.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _true_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs a caller feeds: with IR version 3 every initializer is also an input."""
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def list_models() -> list[ModelInfo]:
    """Every zoo model with its true inputs; cheap (builds no weights)."""
    infos = []
    for name, (stem, description) in _LIGHT.items():
        graph = _load_light(stem).graph
        inputs = tuple((i.name, _static_shape(i) or ()) for i in _true_inputs(graph))
        infos.append(ModelInfo(name, description, "onnx-light", inputs))
    for name, (description, shape) in _GENERATED.items():
        infos.append(ModelInfo(name, description, "generated", (("x", shape),)))
    return infos


# ---------------------------------------------------------------------------------------
# Light models: ConstantOfShape fills -> seeded random initializers
# ---------------------------------------------------------------------------------------

# A sampler takes (rng, shape) and returns float32 values (float32 generation is ~2x faster
# than float64 for the ~144M weights of VGG-19).
_Sampler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _normal(std: float, mean: float = 0.0) -> _Sampler:
    def sample(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        values += np.float32(mean)
        return values

    return sample


def _uniform(low: float, high: float) -> _Sampler:
    def sample(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        values = rng.random(shape, dtype=np.float32)  # [0, 1): low is reached, high is not
        values *= np.float32(high - low)
        values += np.float32(low)
        return values

    return sample


def _he_normal(fan_in: int) -> _Sampler:
    # He init keeps the second moment of activations roughly constant through Conv/Gemm +
    # ReLU, so deep plain nets (VGG-19) neither vanish nor overflow.
    return _normal(math.sqrt(2.0 / max(fan_in, 1)))


_DEFAULT = _normal(0.05)
_BIAS = _normal(0.01)
_BN_ROLES: dict[int, _Sampler] = {
    1: _uniform(0.5, 1.0),  # scale (gamma)
    2: _normal(0.05),  # B (beta)
    3: _normal(0.05),  # running mean
    4: _uniform(0.5, 1.5),  # running variance: strictly positive
}
# DenseNet / Inception-v2 keep BN's affine part outside the BN node (Unsqueeze -> Mul /
# Add; see _expanded_affine_bns). Those nets are deep plain stacks with no residual trunk,
# and BN with fixed random statistics does not renormalise: with scale ~ U(0.5, 1.0) every
# layer has an rms gain of ~0.8 (E[s^2] * E[1/var] = 7/12 * ln 3 = 0.64), which compounds
# to a logit std of ~0.1 and a uniform softmax. Their Mul scale is drawn gain-neutral
# instead, U(0.625, 1.25) (= 1.25 * U(0.5, 1.0), E[s^2] * E[1/var] = 1.0), which gives a
# logit std of ~2-5. A gain-neutral gamma everywhere was tried and rejected: it makes the
# residual nets too peaky (ShuffleNet, seed 1: max softmax 0.9995).
_EXPANDED_SCALE = _uniform(0.625, 1.25)
# Residual taming (ResNet-50, and ShuffleNet which has the same Sum merges). BN with fixed
# random statistics does not renormalise, so every residual block adds its branch's
# variance to the trunk. Measured over seeds 0-3 with gamma ~ U(0.5, 1) everywhere:
# ResNet-50 logit std 10-13, max softmax up to 0.9989; ShuffleNet logit std 40-300, max
# softmax 1.0. As in zero-gamma / Fixup initialisation, the last BN of each residual
# branch (found structurally by _residual_branch_bns) gets gamma ~ U(0.1, 0.3), so each
# block starts close to identity: logit std then 1.0-1.3 (ResNet-50), 1.1-5.2
# (ShuffleNet) over seeds 0-15. Projection shortcuts keep the ordinary gamma.
_RESIDUAL_GAMMA = _uniform(0.1, 0.3)


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, slot))
    return uses


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


_CHAIN_OPS = frozenset({"BatchNormalization", "Conv", "Relu", "Reshape", "Transpose"})


def _residual_branch_bns(graph: onnx.GraphProto) -> set[str]:
    """Output names of the BatchNormalization nodes that end a residual branch.

    A residual merge is a Sum/Add fed by a BN. Walking back from that BN through the
    Conv / BN / Relu (and ShuffleNet's Reshape / Transpose) chain counts the branch's
    Convs: a residual branch has several (ResNet bottleneck: 3), a projection shortcut
    has one (Conv + BN on the block input) and keeps the ordinary gamma.
    """
    producer = {out: node for node in graph.node for out in node.output}
    ends: set[str] = set()
    for merge in graph.node:
        if merge.op_type not in ("Sum", "Add"):
            continue
        for name in merge.input:
            bn = producer.get(name)
            if bn is None or bn.op_type != "BatchNormalization":
                continue
            convs, node = 0, bn
            while node is not None and node.op_type in _CHAIN_OPS:
                convs += node.op_type == "Conv"
                node = producer.get(node.input[0])
            if convs >= 2:
                ends.add(bn.output[0])
    return ends


def _expanded_affine_bns(
    graph: onnx.GraphProto, uses: dict[str, list[tuple[onnx.NodeProto, int]]]
) -> set[str]:
    """Output names of BatchNormalization nodes whose affine part follows as Mul / Add.

    Caffe2's DenseNet and Inception-v2 export SpatialBN without affine, then a Scale
    layer as Unsqueeze -> Mul and Unsqueeze -> Add: the BN node's own scale and B are
    exactly 1 and 0 (the few that the light files kept with their values say so).
    """
    producer = {out: node for node in graph.node for out in node.output}
    expanded: set[str] = set()
    for node in graph.node:
        if node.op_type != "BatchNormalization":
            continue
        for user, slot in uses.get(node.output[0], []):
            other = producer.get(user.input[1 - slot]) if len(user.input) == 2 else None
            if user.op_type == "Mul" and other is not None and other.op_type == "Unsqueeze":
                expanded.add(node.output[0])
    return expanded


def _constant(value: float) -> _Sampler:
    return lambda rng, shape: np.full(shape, value, dtype=np.float32)


def _role_sampler(
    name: str,
    shape: tuple[int, ...],
    uses: dict[str, list[tuple[onnx.NodeProto, int]]],
    residual_ends: set[str],
    expanded_bns: set[str],
) -> _Sampler:
    """The distribution of a weight, from the op and input slot that consume it."""
    for node, slot in uses.get(name, []):
        op = node.op_type
        if op == "BatchNormalization" and node.output[0] in expanded_bns and slot in (1, 2):
            # Keep the exported identity: scale 1, B 0 (drawing them too would apply a
            # second random gain to every layer).
            return _constant(1.0 if slot == 1 else 0.0)
        if op == "Conv" and slot == 1:
            return _he_normal(math.prod(shape[1:]))
        if op == "Gemm" and slot == 1:
            # B is (K, N) or, with transB, (N, K); K is the fan-in.
            fan_in = shape[-1] if _attr_int(node, "transB", 0) else shape[0]
            return _he_normal(fan_in)
        if op in ("Conv", "Gemm") and slot == 2:
            return _BIAS
        if op == "BatchNormalization" and slot in _BN_ROLES:
            if slot == 1 and node.output[0] in residual_ends:
                return _RESIDUAL_GAMMA
            return _BN_ROLES[slot]
        if op == "Unsqueeze":
            # DenseNet / Inception-v2: BN's affine part exported as Unsqueeze -> Mul / Add.
            for user, _ in uses.get(node.output[0], []):
                if user.op_type == "Mul":
                    return _EXPANDED_SCALE
                if user.op_type == "Add":
                    return _BN_ROLES[2]
        if op == "Mul":
            return _EXPANDED_SCALE
        if op == "Add":
            return _BN_ROLES[2]
    return _DEFAULT


def _fill_value(node: onnx.NodeProto) -> np.ndarray:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
    return np.zeros(1, dtype=np.float32)  # the operator's default fill


def _copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    return copy


def _randomize_light(model: onnx.ModelProto, seed: int, model_name: str) -> onnx.ModelProto:
    """Turn every weight of a light model into a seeded random initializer, in place.

    Weights are the `ConstantOfShape` fills of a shape initializer, plus the few small
    float initializers the onnx authors left with their trained values (biases, BN
    statistics). Those are re-drawn too: trained statistics next to random weights wreck
    the numerics (ShuffleNet's stem BN has running variances down to 5e-14, a gain of ~15
    that leaves a one-hot softmax; DenseNet's include denormals such as 5.6e-45), and a
    zoo model should depend on the seed alone. Int64 shape tensors (Reshape targets) and
    initializers no node reads are kept as they are.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses = _consumers(graph)
    residual_ends = _residual_branch_bns(graph)
    expanded_bns = _expanded_affine_bns(graph, uses)

    # Plan first, sample last: each weight is drawn straight into its place in the graph,
    # so the ~550 MB of VGG-19 are not copied between protobuf messages again and again.
    # A plan entry is (tensor name, shape, fill): a float fill means "draw by role" (its
    # dtype is the tensor's), an integer fill is repeated exactly, None keeps the tensor.
    weights: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}  # shape init -> weight
    kept_nodes = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            kept_nodes.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).ravel())
        weights[node.input[0]] = (node.output[0], shape, _fill_value(node))
    del graph.node[:]
    graph.node.extend(kept_nodes)

    # Shape initializers nothing reads any more go; in IR version 3 every initializer is
    # also a graph input, so the weight takes the input slot its shape tensor had.
    still_read = {name for node in graph.node for name in node.input}
    dead = {name for name in weights if name not in still_read}
    plan: list[tuple[str, tuple[int, ...], np.ndarray | None]] = []
    for tensor in graph.initializer:
        if tensor.name in dead:
            continue
        array = numpy_helper.to_array(tensor)
        if tensor.name in still_read and np.issubdtype(array.dtype, np.floating):
            plan.append((tensor.name, array.shape, array.ravel()[:1]))  # a trained leftover
        else:
            plan.append((tensor.name, array.shape, None))  # kept as it is
    plan += weights.values()

    keep = {name for name, _, fill in plan if fill is None}
    kept = {t.name: _copy(t) for t in graph.initializer if t.name in keep}  # all small
    del graph.initializer[:]
    for name, shape, fill in plan:
        tensor = graph.initializer.add()
        if fill is None:
            tensor.CopyFrom(kept[name])
            continue
        if np.issubdtype(fill.dtype, np.floating):
            sampler = _role_sampler(name, shape, uses, residual_ends, expanded_bns)
            values = sampler(_rng(seed, name), shape).astype(fill.dtype, copy=False)
        else:  # a ConstantOfShape that is not a weight: keep its fill exact
            values = np.full(shape, fill.ravel()[0], dtype=fill.dtype)
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(values.dtype)
        tensor.dims.extend(shape)
        raw = np.ascontiguousarray(values, values.dtype.newbyteorder("<")).tobytes()
        del values  # VGG-19's fc6 alone is 411 MB: keep at most two copies alive
        tensor.raw_data = raw

    inputs: list[onnx.ValueInfoProto] = []
    for value_info in graph.input:
        if value_info.name in weights:
            name, shape, fill = weights[value_info.name]
            elem_type = helper.np_dtype_to_tensor_dtype(fill.dtype)
            inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        if value_info.name not in dead:
            inputs.append(value_info)
    del graph.input[:]
    graph.input.extend(inputs)
    graph.doc_string = (
        f"polytile zoo model {model_name!r}: onnx light architecture, random weights seed={seed}"
    )
    return model


# ---------------------------------------------------------------------------------------
# Generated models
# ---------------------------------------------------------------------------------------


class _GraphBuilder:
    """Collects nodes and initializers; every random tensor is seeded by its own name."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, values: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(values, name))
        return name

    def random(self, name: str, shape: tuple[int, ...], sampler: _Sampler) -> str:
        return self.const(name, sampler(_rng(self.seed, name), shape))

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output


def _finish(
    b: _GraphBuilder,
    name: str,
    x_shape: tuple[int, ...],
    y: str,
    y_shape: tuple[int, ...],
    opset: int,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        b.nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, y_shape)],
        initializer=b.inits,
        doc_string=f"polytile zoo model {name!r}: generated, random weights seed={b.seed}",
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="polytile.zoo"
    )
    # Pin a modest IR version so older onnxruntime builds still load the model.
    model.ir_version = 8
    return model


def _build_transformer(seed: int) -> onnx.ModelProto:
    """One post-LN BERT encoder layer, written the way PyTorch exports it (opset 17)."""
    batch, seq, hidden = _TRANSFORMER_SHAPE
    heads, ffn = _TRANSFORMER_HEADS, _TRANSFORMER_FFN
    head_dim = hidden // heads
    b = _GraphBuilder(seed)
    w, bias = _normal(0.02), _normal(0.02)
    ln_scale, ln_bias = _normal(0.02, mean=1.0), _normal(0.02)

    def linear(prefix: str, x: str, n_in: int, n_out: int) -> str:
        mm = b.op("MatMul", [x, b.random(f"{prefix}.weight", (n_in, n_out), w)], f"{prefix}.mm")
        return b.op("Add", [mm, b.random(f"{prefix}.bias", (n_out,), bias)], f"{prefix}.out")

    def layer_norm(prefix: str, x: str, output: str) -> str:
        scale = b.random(f"{prefix}.weight", (hidden,), ln_scale)
        shift = b.random(f"{prefix}.bias", (hidden,), ln_bias)
        return b.op("LayerNormalization", [x, scale, shift], output, axis=-1, epsilon=1e-5)

    heads_shape = b.const("attn.heads_shape", np.array([batch, seq, heads, head_dim], np.int64))
    merged_shape = b.const("attn.merged_shape", np.array([batch, seq, hidden], np.int64))

    def split_heads(name: str, x: str, perm: list[int]) -> str:
        r = b.op("Reshape", [x, heads_shape], f"attn.{name}.heads")
        return b.op("Transpose", [r], f"attn.{name}.t", perm=perm)

    q = split_heads("q", linear("attn.q", "x", hidden, hidden), [0, 2, 1, 3])  # (B,H,S,D)
    k = split_heads("k", linear("attn.k", "x", hidden, hidden), [0, 2, 3, 1])  # (B,H,D,S)
    v = split_heads("v", linear("attn.v", "x", hidden, hidden), [0, 2, 1, 3])  # (B,H,S,D)
    scores = b.op("MatMul", [q, k], "attn.scores")
    inv_sqrt_d = b.const("attn.inv_sqrt_d", np.array(1.0 / math.sqrt(head_dim), np.float32))
    scaled = b.op("Mul", [scores, inv_sqrt_d], "attn.scaled")
    probs = b.op("Softmax", [scaled], "attn.probs", axis=-1)
    context = b.op("MatMul", [probs, v], "attn.context")
    context = b.op("Transpose", [context], "attn.context.t", perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, merged_shape], "attn.context.merged")
    attn_out = linear("attn.out", context, hidden, hidden)
    h = layer_norm("attn.ln", b.op("Add", [attn_out, "x"], "attn.residual"), "attn.ln.out")

    up = linear("ffn.up", h, hidden, ffn)
    sqrt2 = b.const("ffn.sqrt2", np.array(math.sqrt(2.0), np.float32))
    one = b.const("ffn.one", np.array(1.0, np.float32))
    half = b.const("ffn.half", np.array(0.5, np.float32))
    erf = b.op("Erf", [b.op("Div", [up, sqrt2], "ffn.gelu.div")], "ffn.gelu.erf")
    gelu = b.op("Mul", [up, b.op("Add", [erf, one], "ffn.gelu.add")], "ffn.gelu.mul")
    gelu = b.op("Mul", [gelu, half], "ffn.gelu.out")
    down = linear("ffn.down", gelu, ffn, hidden)
    layer_norm("ffn.ln", b.op("Add", [down, h], "ffn.residual"), "y")
    return _finish(b, "transformer", _TRANSFORMER_SHAPE, "y", _TRANSFORMER_SHAPE, 17)


def _build_mlp(seed: int) -> onnx.ModelProto:
    """A 3-layer perceptron on flattened MNIST-sized inputs, weights stored (out, in)."""
    b = _GraphBuilder(seed)
    x = "x"
    last = len(_MLP_WIDTHS) - 2
    for i, (n_in, n_out) in enumerate(itertools.pairwise(_MLP_WIDTHS)):
        weight = b.random(f"fc{i + 1}.weight", (n_out, n_in), _he_normal(n_in))
        bias = b.random(f"fc{i + 1}.bias", (n_out,), _BIAS)
        x = b.op("Gemm", [x, weight, bias], f"fc{i + 1}.out", transB=1)
        if i < last:
            x = b.op("Relu", [x], f"fc{i + 1}.relu")
    b.op("Softmax", [x], "y", axis=1)
    return _finish(b, "mlp", _MLP_SHAPE, "y", (_MLP_SHAPE[0], _MLP_WIDTHS[-1]), 13)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def _build_unchecked(name: str, seed: int) -> onnx.ModelProto:
    _check_name(name)
    _check_seed(seed)
    if name in _LIGHT:
        return _randomize_light(_load_light(_LIGHT[name][0]), seed, name)
    if name == "transformer":
        return _build_transformer(seed)
    return _build_mlp(seed)


def _check(name: str, model: onnx.ModelProto | bytes) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:  # the light files of this onnx changed?
        raise ModelError(
            f"zoo model {name!r} fails onnx.checker (onnx {onnx.__version__}): {exc}"
        ) from exc


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model `name` in memory with weights seeded by `seed` (nothing on disk).

    The result passes onnx.checker (checked here: it costs a serialisation, ~2.5 s of the
    ~6 s for VGG-19, but the light files come from whatever onnx is installed).
    """
    model = _build_unchecked(name, seed)
    _check(name, model)
    return model


def cache_dir(cache_root: Path | None = None) -> Path:
    """Where materialized models live: the argument, else the XDG user cache.

    The environment is read at call time, never at import, so configuration stays
    explicit and tests can redirect it.
    """
    if cache_root is not None:
        return Path(cache_root)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says relative paths are invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "polytile" / "zoo"


def materialize(name: str, seed: int = 0, cache_root: Path | None = None) -> Path:
    """Write `<cache>/<name>-seed<seed>.onnx` once and return its path.

    Tools that take a file (the CLI, onnxruntime, benchmarks) then share one copy. The
    file appears atomically (temp file in the same directory, then os.replace), so a
    concurrent reader or an interrupted build never sees a truncated model.
    """
    _check_name(name)
    _check_seed(seed)
    directory = cache_dir(cache_root)
    path = directory / f"{name}-seed{int(seed)}.onnx"
    if path.is_file():
        return path
    data = _build_unchecked(name, seed).SerializeToString()  # vgg19: 575 MB, below 2 GB
    _check(name, data)  # on the bytes: VGG-19 is not serialised twice
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load(name: str, seed: int = 0, cache_root: Path | None = None) -> onnx.ModelProto:
    """Load zoo model `name` from the cache, building it there first if needed."""
    return onnx.load(materialize(name, seed, cache_root))


_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """N(0, 1) feeds for the model's true inputs, seeded per input name like the weights."""
    _check_seed(seed)
    feeds: dict[str, np.ndarray] = {}
    for value_info in _true_inputs(model.graph):
        elem_type = value_info.type.tensor_type.elem_type
        if elem_type not in _FLOAT_TYPES:
            type_name = TensorProto.DataType.Name(elem_type)
            raise InputError(
                f"random_inputs: input '{value_info.name}' has type {type_name}; "
                "only float inputs can be filled with N(0, 1)"
            )
        shape = _static_shape(value_info)
        if shape is None:
            raise ShapeError(
                f"random_inputs: input '{value_info.name}' has no static shape; "
                "give it fixed dimensions first"
            )
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        feeds[value_info.name] = _rng(seed, value_info.name).standard_normal(shape).astype(dtype)
    return feeds
