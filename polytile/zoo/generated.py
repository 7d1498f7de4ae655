"""Generated zoo models: a BERT-style encoder layer and an MLP, built node by node."""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .weights import BIAS, Sampler, he_normal, normal, rng_for

TRANSFORMER_SHAPE = (1, 128, 256)
_TRANSFORMER_HEADS = 4
_TRANSFORMER_FFN = 1024
#: one layer of BERT-base's size: 768 hidden, 12 heads, 3,072 FFN, 128 tokens
TRANSFORMER_BASE_SHAPE = (1, 128, 768)
_TRANSFORMER_BASE_HEADS = 12
_TRANSFORMER_BASE_FFN = 3072
MLP_SHAPE = (8, 784)
_MLP_WIDTHS = (784, 512, 256, 10)


class _GraphBuilder:
    """Collects nodes and initializers; every random tensor is seeded by its own name."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, values: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(values, name))
        return name

    def random(self, name: str, shape: tuple[int, ...], sampler: Sampler) -> str:
        return self.const(name, sampler(rng_for(self.seed, name), shape))

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


def build_transformer(
    seed: int,
    shape: tuple[int, int, int] = TRANSFORMER_SHAPE,
    heads: int = _TRANSFORMER_HEADS,
    ffn: int = _TRANSFORMER_FFN,
    name: str = "transformer",
) -> onnx.ModelProto:
    """One post-LN BERT encoder layer, written the way PyTorch exports it (opset 17)."""
    batch, seq, hidden = shape
    head_dim = hidden // heads
    b = _GraphBuilder(seed)
    w, bias = normal(0.02), normal(0.02)
    ln_scale, ln_bias = normal(0.02, mean=1.0), normal(0.02)

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
    return _finish(b, name, shape, "y", shape, 17)


def build_mlp(seed: int) -> onnx.ModelProto:
    """A 3-layer perceptron on flattened MNIST-sized inputs, weights stored (out, in)."""
    b = _GraphBuilder(seed)
    x = "x"
    last = len(_MLP_WIDTHS) - 2
    for i, (n_in, n_out) in enumerate(itertools.pairwise(_MLP_WIDTHS)):
        weight = b.random(f"fc{i + 1}.weight", (n_out, n_in), he_normal(n_in))
        bias = b.random(f"fc{i + 1}.bias", (n_out,), BIAS)
        x = b.op("Gemm", [x, weight, bias], f"fc{i + 1}.out", transB=1)
        if i < last:
            x = b.op("Relu", [x], f"fc{i + 1}.relu")
    b.op("Softmax", [x], "y", axis=1)
    return _finish(b, "mlp", MLP_SHAPE, "y", (MLP_SHAPE[0], _MLP_WIDTHS[-1]), 13)


#: name -> (description, input shape) of the generated models
GENERATED: dict[str, tuple[str, tuple[int, ...]]] = {
    "transformer": (
        "BERT-style encoder layer (opset 17): 4-head attention, LayerNorm, Erf-GELU FFN",
        TRANSFORMER_SHAPE,
    ),
    "transformer_base": (
        "BERT-base-size encoder layer (opset 17): 768 hidden, 12 heads, 3072 FFN, 128 tokens",
        TRANSFORMER_BASE_SHAPE,
    ),
    "mlp": ("MLP 784-512-256-10 (opset 13): Gemm + Relu, Softmax", MLP_SHAPE),
}


def build(name: str, seed: int) -> onnx.ModelProto:
    """The generated model `name` with weights seeded by `seed`."""
    if name == "transformer":
        return build_transformer(seed)
    if name == "transformer_base":
        base = (_TRANSFORMER_BASE_HEADS, _TRANSFORMER_BASE_FFN)
        return build_transformer(seed, TRANSFORMER_BASE_SHAPE, *base, name=name)
    return build_mlp(seed)
