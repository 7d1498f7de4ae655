"""Seeded random weights for light ONNX files (graph only, `ConstantOfShape` fills).

A light file replaces every large weight by a `ConstantOfShape` of a `<weight>__SHAPE`
initializer. `randomize_light` draws each such weight from a distribution chosen by the
op and input slot that read it (its role), so activations stay of order 1 through the
network, as trained weights keep them. Two rule sets: `legacy_roles` for the onnx
wheel's 2012-2016 CNNs (whose few small leftovers are trained values and are re-drawn),
`modern_roles` for today's exports (convs, linear layers, embeddings, norms), whose
small tensors are the untrained model's own values and are kept, norms perturbed.

Weights are drawn per tensor from `numpy.random.default_rng([seed, crc32(tensor name)])`,
so a tensor's values depend only on the seed and its name, never on node order.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper


def rng_for(seed: int, tensor_name: str) -> np.random.Generator:
    """A generator that depends only on (seed, tensor name), so node order never matters."""
    return np.random.default_rng([int(seed), zlib.crc32(tensor_name.encode("utf-8"))])


# A sampler takes (rng, shape) and returns float32 values (drawn as float32: VGG-19 has
# ~144M weights).
Sampler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def normal(std: float, mean: float = 0.0) -> Sampler:
    def sample(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        values += np.float32(mean)
        return values

    return sample


def _uniform(low: float, high: float) -> Sampler:
    def sample(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        values = rng.random(shape, dtype=np.float32)  # [0, 1): low is reached, high is not
        values *= np.float32(high - low)
        values += np.float32(low)
        return values

    return sample


def he_normal(fan_in: int) -> Sampler:
    # He init keeps the second moment of activations roughly constant through Conv/Gemm +
    # ReLU, so deep plain nets (VGG-19) neither vanish nor overflow.
    return normal(math.sqrt(2.0 / max(fan_in, 1)))


_DEFAULT = normal(0.05)
BIAS = normal(0.01)
_BN_ROLES: dict[int, Sampler] = {
    1: _uniform(0.5, 1.0),  # scale (gamma)
    2: normal(0.05),  # B (beta)
    3: normal(0.05),  # running mean
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
# variance to the trunk: with gamma ~ U(0.5, 1) everywhere the logits grow large and the
# softmax saturates (ShuffleNet's most). As in zero-gamma / Fixup initialisation, the
# last BN of each residual branch (found structurally by _residual_branch_bns) gets
# gamma ~ U(0.1, 0.3), so each block starts close to identity and the logits stay near
# unit scale. Projection shortcuts keep the ordinary gamma.
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


def _constant(value: float) -> Sampler:
    return lambda rng, shape: np.full(shape, value, dtype=np.float32)


def _role_sampler(
    name: str,
    shape: tuple[int, ...],
    uses: dict[str, list[tuple[onnx.NodeProto, int]]],
    residual_ends: set[str],
    expanded_bns: set[str],
) -> Sampler:
    """The distribution of a weight, from the op and input slot that consume it."""
    for node, slot in uses.get(name, []):
        op = node.op_type
        if op == "BatchNormalization" and node.output[0] in expanded_bns and slot in (1, 2):
            # Keep the exported identity: scale 1, B 0 (drawing them too would apply a
            # second random gain to every layer).
            return _constant(1.0 if slot == 1 else 0.0)
        if op == "Conv" and slot == 1:
            return he_normal(math.prod(shape[1:]))
        if op == "Gemm" and slot == 1:
            # B is (K, N) or, with transB, (N, K); K is the fan-in.
            fan_in = shape[-1] if _attr_int(node, "transB", 0) else shape[0]
            return he_normal(fan_in)
        if op in ("Conv", "Gemm") and slot == 2:
            return BIAS
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


#: (tensor name, shape, whether it is a ConstantOfShape fill) -> its sampler, or None to
#: keep it as it is (a fill keeps its exact fill value)
Roles = Callable[[str, tuple[int, ...], bool], Sampler | None]


def legacy_roles(graph: onnx.GraphProto) -> Roles:
    """The onnx wheel's CNNs: every float weight is drawn, leftovers included.

    Their few small float initializers are trained values: trained statistics next to
    random weights wreck the numerics (ShuffleNet's stem BN has running variances down to
    5e-14; DenseNet's include denormals), and a zoo model should depend on the seed alone.
    """
    uses = _consumers(graph)
    residual_ends = _residual_branch_bns(graph)
    expanded_bns = _expanded_affine_bns(graph, uses)

    def roles(name: str, shape: tuple[int, ...], fill: bool) -> Sampler | None:
        return _role_sampler(name, shape, uses, residual_ends, expanded_bns)

    return roles


# Today's exports: linear layers get LeCun's fan-in scale (their activations are GELU /
# SiLU / softmax inputs, not ReLU); convs keep He's. Norm parameters are the untrained
# model's 1 and 0; they are perturbed gain-neutrally (E[gamma^2] * E[1/var] = 1) so a
# model whose folding mixes up scale, shift, mean or variance gives wrong results.
_EMBEDDING = normal(1.0)
_LINEAR_BIAS = normal(0.02)
_ELEMENTWISE_SCALE = _uniform(-1.0, 1.0)  # tables multiplied in (rotary cos / sin caches)
_NORM_ROLES: dict[str, dict[int, Sampler]] = {
    "BatchNormalization": {
        1: _uniform(0.8, 1.2),
        2: normal(0.05),
        3: normal(0.05),
        4: _uniform(0.9, 1.1),
    },
    "LayerNormalization": {1: _uniform(0.8, 1.2), 2: normal(0.05)},
    "InstanceNormalization": {1: _uniform(0.8, 1.2), 2: normal(0.05)},
    "GroupNormalization": {1: _uniform(0.8, 1.2), 2: normal(0.05)},
}
#: ops whose input 1 is a weight matrix, drawn by role even when small enough to ship
_LAYERS = frozenset({"Conv", "MatMul", "Gemm"})
#: ops that pass a weight on unchanged: its role is its readers' role
_PASS_THROUGH = frozenset({"Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Transpose"})


def _lecun_normal(fan_in: int) -> Sampler:
    return normal(math.sqrt(1.0 / max(fan_in, 1)))


def modern_roles(graph: onnx.GraphProto) -> Roles:
    """torchvision / timm / Hugging Face exports: weights by role (small conv / linear
    weights too), norm parameters perturbed, other small tensors kept.

    A fill read by none of the weight roles (Swin's attention-mask canvas, read by
    ScatterND) keeps its exact fill value: it is data of the graph, not a weight.
    """
    uses = _consumers(graph)

    def readers(name: str, depth: int = 0) -> list[tuple[onnx.NodeProto, int, str]]:
        found = []
        for node, slot in uses.get(name, []):
            if node.op_type in _PASS_THROUGH and slot == 0 and depth < 4:
                found += readers(node.output[0], depth + 1)
            else:
                found.append((node, slot, name))
        return found

    def weight_role(node: onnx.NodeProto, slot: int, shape: tuple[int, ...]) -> Sampler | None:
        op = node.op_type
        if op == "Conv" and slot == 1:
            return he_normal(math.prod(shape[1:]))
        if op == "MatMul" and slot == 1 and len(shape) >= 2:
            return _lecun_normal(shape[-2])
        if op == "Gemm" and slot == 1 and len(shape) == 2:
            return _lecun_normal(shape[1] if _attr_int(node, "transB", 0) else shape[0])
        if (op in ("Conv", "Gemm") and slot == 2) or op == "Add":
            return _LINEAR_BIAS
        if op == "Gather" and slot == 0:
            return _EMBEDDING
        if op == "Mul":
            return _ELEMENTWISE_SCALE
        return None

    def roles(name: str, shape: tuple[int, ...], fill: bool) -> Sampler | None:
        for node, slot, _ in readers(name):
            if fill or (node.op_type in _LAYERS and slot == 1):  # small convs are weights too
                sampler = weight_role(node, slot, shape)
            else:
                sampler = _NORM_ROLES.get(node.op_type, {}).get(slot)
            if sampler is not None:
                return sampler
        return None

    return roles


def _fill_value(node: onnx.NodeProto) -> np.ndarray:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
    return np.zeros(1, dtype=np.float32)  # the operator's default fill


def _copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    return copy


def randomize_light(model: onnx.ModelProto, seed: int, roles: Roles, doc: str) -> onnx.ModelProto:
    """Turn the weights of a light model into seeded random initializers, in place.

    Every `ConstantOfShape` fill of a shape initializer becomes an initializer: drawn by
    `roles` when it is a float weight, else its exact fill. Small float initializers are
    re-drawn where `roles` gives them a sampler. Int64 shape tensors (Reshape targets)
    and initializers no node reads are kept as they are.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}

    # Plan first, sample last: each weight is drawn straight into its place in the graph,
    # so the ~550 MB of VGG-19 are not copied between protobuf messages again and again.
    # A plan entry is (tensor name, shape, fill, is a fill): a float value means "draw by
    # role" (its dtype is the tensor's), an integer one is repeated exactly, None keeps
    # the tensor.
    weights: dict[str, tuple[str, tuple[int, ...], np.ndarray, bool]] = {}
    kept_nodes = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            kept_nodes.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).ravel())
        weights[node.input[0]] = (node.output[0], shape, _fill_value(node), True)
    del graph.node[:]
    graph.node.extend(kept_nodes)

    # Shape initializers nothing reads any more go; in IR version 3 every initializer is
    # also a graph input, so the weight takes the input slot its shape tensor had.
    still_read = {name for node in graph.node for name in node.input}
    dead = {name for name in weights if name not in still_read}
    plan: list[tuple[str, tuple[int, ...], np.ndarray | None, bool]] = []
    for tensor in graph.initializer:
        if tensor.name in dead:
            continue
        array = numpy_helper.to_array(tensor)
        if tensor.name in still_read and np.issubdtype(array.dtype, np.floating):
            plan.append((tensor.name, array.shape, array.ravel()[:1], False))  # small
        else:
            plan.append((tensor.name, array.shape, None, False))  # kept as it is
    plan += weights.values()

    keep = {name for name, _, value, _ in plan if value is None}
    kept = {t.name: _copy(t) for t in graph.initializer}  # the large ones are fills
    del graph.initializer[:]
    for name, shape, value, is_fill in plan:
        tensor = graph.initializer.add()
        sampler = None
        if value is not None and np.issubdtype(value.dtype, np.floating):
            sampler = roles(name, shape, is_fill)
        if sampler is None and (name in keep or not is_fill):
            tensor.CopyFrom(kept[name])
            continue
        if sampler is not None:
            values = sampler(rng_for(seed, name), shape).astype(value.dtype, copy=False)
        else:  # a fill that is not a weight: keep its value exact
            values = np.full(shape, value.ravel()[0], dtype=value.dtype)
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(values.dtype)
        tensor.dims.extend(shape)
        raw = np.ascontiguousarray(values, values.dtype.newbyteorder("<")).tobytes()
        del values  # VGG-19's fc6 alone is 411 MB: keep at most two copies alive
        tensor.raw_data = raw

    inputs: list[onnx.ValueInfoProto] = []
    for value_info in graph.input:
        if value_info.name in weights:
            name, shape, value, _ = weights[value_info.name]
            elem_type = helper.np_dtype_to_tensor_dtype(value.dtype)
            inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        if value_info.name not in dead:
            inputs.append(value_info)
    del graph.input[:]
    graph.input.extend(inputs)
    graph.doc_string = doc
    return model
