"""A model zoo: real architectures with seeded random weights, built offline.

Benchmarks, examples and end-to-end tests need realistic models, but pretrained weights
are gigabytes behind a network download. Three sources, none needing the network:

- `onnx-light`: the nine 2012-2016 CNNs the onnx wheel ships (`backend/test/data/light`);
- `modern`: today's torchvision / timm / Hugging Face exports (`models/` beside this file,
  with the README that says how they were made), static, with symbolic batch / sequence
  dimensions (`__dyn`) and int8-quantized (`__qdq`, `__qop`, `__int8dyn`);
- `generated`: a BERT-style encoder layer and an MLP built here.

The light files replace large weights by `ConstantOfShape` fills; `weights.py` turns them
into seeded random initializers that keep activations of order 1.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from polytile.errors import InputError, ModelError, ShapeError

from . import generated
from .calibrate import scale_layers
from .weights import legacy_roles, modern_roles, randomize_light, rng_for

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

Source = Literal["onnx-light", "modern", "generated"]
#: a dimension: its size, or the name of a symbolic dimension
Dim = int | str


@dataclass(frozen=True)
class ModelInfo:
    """What a zoo model is, without building it (the CLI lists these)."""

    name: str
    description: str
    source: Source
    inputs: tuple[tuple[str, tuple[Dim, ...]], ...]  # true graph inputs: (name, shape)
    #: the model's int8 form ('qdq', 'qop', 'int8dyn'), or '' for float models
    quantized: str = ""

    @property
    def symbolic(self) -> tuple[str, ...]:
        """Names of the symbolic dimensions of its inputs (e.g. 'batch', 'seq')."""
        dims = (d for _, shape in self.inputs for d in shape if isinstance(d, str))
        return tuple(dict.fromkeys(dims))


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

# Today's architectures (the `models/` directory): name -> description. Variants
# `<name>__dyn` (symbolic batch / sequence), `__qdq`, `__qop`, `__int8dyn` (int8) are
# described from their base.
_MODERN: dict[str, str] = {
    "bart_enc_small": "BART encoder (Hugging Face), 2 layers, d=256, seq 64",
    "bert_small": "BERT (Hugging Face), 4 layers, d=256, seq 128, attention mask",
    "clip_text_small": "CLIP text encoder (Hugging Face), 2 layers, causal mask, 77 tokens",
    "convnext_small": "ConvNeXt-S (torchvision), 7x7 depthwise, channels-last LayerNorm",
    "efficientnet_b1": "EfficientNet-B1 (torchvision), 240x240, depthwise, SiLU, SE",
    "efficientnet_v2_s": "EfficientNetV2-S (torchvision), fused MBConv, SE",
    "gpt2_2l": "GPT-2 (Hugging Face), 2 layers, d=512, causal mask, Gemm + GELU(tanh)",
    "inception_v3": "Inception-v3 (torchvision), 299x299, asymmetric convs",
    "llama_small": "Llama (Hugging Face), 2 layers, RMSNorm, rotary, grouped-query, SiLU",
    "lraspp_mbv3": "LR-ASPP MobileNetV3 (torchvision), segmentation, bilinear Resize",
    "maxvit_t": "MaxViT-T (torchvision), MBConv + block / grid attention",
    "mobilenet_v3_large": "MobileNetV3-Large (torchvision), depthwise, hard-swish, SE",
    "qwen2_small": "Qwen2 (Hugging Face, dynamo export), 2 layers, rotary, grouped-query",
    "regnet_x_400mf": "RegNetX-400MF (torchvision), grouped convs",
    "resnet34": "ResNet-34 (torchvision, dynamo export), 224x224",
    "roberta_small": "RoBERTa (Hugging Face), 4 layers, d=256, CumSum positions",
    "shufflenet_v2_x0_5": "ShuffleNetV2 x0.5 (torchvision), channel split and shuffle",
    "squeezenet1_1": "SqueezeNet 1.1 (torchvision), fire modules",
    "swin_v2_t": "Swin-V2-T (torchvision), 256x256, shifted windows, cosine attention",
    "timm_levit_128s": "LeViT-128S (timm), attention with conv stem, hard-swish",
    "timm_mixer_s16": "MLP-Mixer S/16 (timm), token and channel MLPs",
    "timm_repvgg_a0": "RepVGG-A0 (timm), 3x3 + 1x1 branches",
    "vit_b_32": "ViT-B/32 (torchvision, dynamo export), 12 layers",
    "wav2vec2_small": "wav2vec 2.0 (Hugging Face), conv feature encoder, 2 layers",
}
_VARIANTS = {
    "dyn": "symbolic batch (and sequence)",
    "qdq": "int8 static quantization, QDQ format",
    "qop": "int8 static quantization, QOperator format",
    "int8dyn": "int8 dynamic quantization",
}
_MODELS_DIR = Path(__file__).parent / "models"
_MODERN_FILES = tuple(sorted(p.stem for p in _MODELS_DIR.glob("*.onnx")))

NAMES: tuple[str, ...] = (*_LIGHT, *_MODERN_FILES, *generated.GENERATED)

_LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
#: bumped when a filling rule changes, so cached models of the old rules are not reused
_FILL_VERSION = 3


_QUANTIZED = ("qdq", "qop", "int8dyn")
#: how many seeded inputs the weights are scaled on, and where their seeds start (apart
#: from the small seeds users draw test inputs with)
_CALIBRATION = 4
_CALIBRATION_SEEDS = 1 << 20
#: sizes of symbolic dimensions for the inputs the weights are scaled on
_CALIBRATION_DIMS = {"batch": 1, "seq": 32}


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise InputError(f"unknown zoo model {name!r}; valid names: {', '.join(NAMES)}")


def _check_seed(seed: int) -> None:
    # default_rng rejects negative entropy; a bool seed is almost surely a caller bug.
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InputError(f"zoo seed must be a non-negative integer, got {seed!r}")


def _split(name: str) -> tuple[str, str]:
    """A modern model's base architecture and variant ('' for the plain export)."""
    base, _, variant = name.partition("__")
    return base, variant


@functools.cache
def _file_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ModelError(f"zoo: cannot read {path}: {exc}") from exc


def _light_path(name: str) -> Path:
    if name in _LIGHT:
        return _LIGHT_DIR / f"light_{_LIGHT[name][0]}.onnx"
    return _MODELS_DIR / f"{name}.onnx"


def _load_light(name: str) -> onnx.ModelProto:
    """The light file of a legacy or modern zoo model (weights still fills)."""
    model = onnx.ModelProto()
    model.ParseFromString(_file_bytes(_light_path(name)))
    return model


def _shape(value_info: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    dims = value_info.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims)


def _true_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs a caller feeds: with IR version 3 every initializer is also an input."""
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def _info(name: str) -> ModelInfo:
    if name in generated.GENERATED:
        description, shape = generated.GENERATED[name]
        return ModelInfo(name, description, "generated", (("x", shape),))
    graph = _load_light(name).graph
    inputs = tuple((i.name, _shape(i)) for i in _true_inputs(graph))
    if name in _LIGHT:
        return ModelInfo(name, _LIGHT[name][1], "onnx-light", inputs)
    base, variant = _split(name)
    description = _MODERN.get(base, base)
    if variant:
        description += f"; {_VARIANTS.get(variant, variant)}"
    quantized = variant if variant in _QUANTIZED else ""
    return ModelInfo(name, description, "modern", inputs, quantized)


def list_models() -> list[ModelInfo]:
    """Every zoo model with its true inputs; cheap (builds no weights)."""
    return [_info(name) for name in NAMES]


def model_info(name: str) -> ModelInfo:
    _check_name(name)
    return _info(name)


def _build_unchecked(name: str, seed: int) -> onnx.ModelProto:
    _check_name(name)
    _check_seed(seed)
    if name in generated.GENERATED:
        return generated.build(name, seed)
    model = _load_light(name)
    if name in _LIGHT:
        doc = f"polytile zoo model {name!r}: onnx light architecture, random weights seed={seed}"
        return randomize_light(model, seed, legacy_roles(model.graph), doc)
    doc = f"polytile zoo model {name!r}: modern export, random weights seed={seed}"
    model = randomize_light(model, seed, modern_roles(model.graph), doc)
    if _split(name)[1] in _QUANTIZED:
        return model  # its weights are int8 data of quantization ops polytile refuses
    seeds = [_CALIBRATION_SEEDS + seed * _CALIBRATION + k for k in range(_CALIBRATION)]
    return scale_layers(model, [random_inputs(model, s, dims=_CALIBRATION_DIMS) for s in seeds])


def _check(name: str, model: onnx.ModelProto | bytes) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:  # the light files of this onnx changed?
        raise ModelError(
            f"zoo model {name!r} fails onnx.checker (onnx {onnx.__version__}): {exc}"
        ) from exc


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model `name` in memory with weights seeded by `seed` (nothing on disk).

    The result passes onnx.checker (checked here: it costs a serialisation, a large part
    of a big model's build, but the light files come from whatever onnx is installed).
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
    """Write `<cache>/<name>-seed<seed>-v<rules>.onnx` once and return its path.

    Tools that take a file (the CLI, onnxruntime, benchmarks) then share one copy. The
    file appears atomically (temp file in the same directory, then os.replace), so a
    concurrent reader or an interrupted build never sees a truncated model.
    """
    _check_name(name)
    _check_seed(seed)
    directory = cache_dir(cache_root)
    path = directory / f"{name}-seed{int(seed)}-v{_FILL_VERSION}.onnx"
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


_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
_INT_TYPES = {
    TensorProto.INT8,
    TensorProto.INT16,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.UINT8,
    TensorProto.UINT16,
    TensorProto.UINT32,
    TensorProto.UINT64,
}
#: ops that pass an index tensor on unchanged (up to shape and integer type)
_INDEX_PASS = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity"})


def _index_bound(graph: onnx.GraphProto, name: str) -> int | None:
    """The row count of the table an integer input indexes (an embedding's vocabulary),
    following it through reshapes and casts to a Gather's indices; None if it indexes
    nothing (an attention mask)."""
    shapes: dict[str, tuple[int, ...]] = {t.name: tuple(t.dims) for t in graph.initializer}
    for node in graph.node:  # light fills: the weight's shape is its __SHAPE initializer
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            init = next(t for t in graph.initializer if t.name == node.input[0])
            shapes[node.output[0]] = tuple(int(d) for d in numpy_helper.to_array(init))
    frontier, seen = [name], set()
    while frontier:
        tensor = frontier.pop()
        seen.add(tensor)
        for node in graph.node:
            if tensor not in node.input:
                continue
            if node.op_type == "Gather" and list(node.input).index(tensor) == 1:
                table = shapes.get(node.input[0])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if table:
                    return int(table[axis])
            elif node.op_type in _INDEX_PASS and node.output[0] not in seen:
                frontier.append(node.output[0])
    return None


def random_inputs(
    model: onnx.ModelProto, seed: int = 0, dims: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Seeded feeds for the model's true inputs (seeded per input name like the weights).

    Floats are N(0, 1); an integer input that indexes a table (token ids into an
    embedding) is uniform over the table's rows, any other integer input (a mask) is all
    ones. `dims` gives the sizes of symbolic dimensions ({'batch': 1, 'seq': 64}).
    """
    _check_seed(seed)
    dims = dict(dims or {})
    feeds: dict[str, np.ndarray] = {}
    for value_info in _true_inputs(model.graph):
        elem_type = value_info.type.tensor_type.elem_type
        shape = []
        for dim in _shape(value_info):
            if isinstance(dim, str):
                if dim not in dims:
                    raise ShapeError(
                        f"random_inputs: input '{value_info.name}' has symbolic dimension "
                        f"'{dim}'; give its size in dims={{'{dim}': ...}}"
                    )
                dim = dims[dim]
            shape.append(int(dim))
        rng = rng_for(seed, value_info.name)
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        if elem_type in _FLOAT_TYPES:
            feeds[value_info.name] = rng.standard_normal(shape).astype(dtype)
        elif elem_type in _INT_TYPES:
            bound = _index_bound(model.graph, value_info.name)
            values = rng.integers(0, bound, shape) if bound else np.ones(shape)
            feeds[value_info.name] = values.astype(dtype)
        elif elem_type == TensorProto.BOOL:
            feeds[value_info.name] = np.ones(shape, dtype=bool)
        else:
            type_name = TensorProto.DataType.Name(elem_type)
            raise InputError(
                f"random_inputs: input '{value_info.name}' has type {type_name}, which "
                "cannot be filled with random values"
            )
    return feeds
