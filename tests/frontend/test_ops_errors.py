"""Bad inputs to the nn, matmul and reduce op families raise errors that name the node
(and, for unsupported variants, list it in the error's `unsupported`)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import pytest
from onnx import TensorProto, helper

from polytile.errors import ShapeError, UnsupportedOpError
from polytile.frontend.importer import import_model


def _one_node(
    op: str,
    inputs: dict[str, tuple[int, ...]],
    attrs: dict | None = None,
    outputs: Sequence[str] = ("y",),
    opset: int = 17,
    elem: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    """A model of one node named 'bad' over inputs of the given shapes; its outputs have
    no shape, so polytile's inference meets the bad input first."""
    node = helper.make_node(op, list(inputs), list(outputs), name="bad", **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "errors",
        [helper.make_tensor_value_info(k, elem, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, elem, None) for o in outputs if o],
    )
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(
        graph, opset_imports=opsets, ir_version=max(helper.find_min_ir_version_for(opsets), 7)
    )


BAD = [
    ("Conv", {"x": (1, 3, 8, 8), "w": (4, 2, 3, 3)}, {}, ShapeError, "channels"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (3, 2, 3, 3)}, {"group": 2}, ShapeError, "group"),
    ("Conv", {"x": (1, 3, 8, 8), "w": (4, 3, 3)}, {}, ShapeError, "rank"),
    (
        "Conv",
        {"x": (1, 3, 8, 8), "w": (4, 3, 3, 3)},
        {"kernel_shape": [2, 2]},
        ShapeError,
        "kernel_shape",
    ),
    ("Conv", {"x": (1, 3, 2, 2), "w": (4, 3, 3, 3)}, {}, ShapeError, "larger than"),
    ("Conv", {"x": (1, 3, 8, 8), "w": (4, 3, 3, 3)}, {"strides": [1]}, ShapeError, "strides"),
    ("Conv", {"x": (1, 3, 8, 8), "w": (4, 3, 3, 3)}, {"auto_pad": "SAME"}, ShapeError, "auto_pad"),
    ("Conv", {"x": (1, 3, 8, 8), "w": (4, 3, 3, 3), "b": (3,)}, {}, ShapeError, "B has"),
    ("ConvTranspose", {"x": (1, 3, 8, 8), "w": (4, 2, 3, 3)}, {}, ShapeError, "channels"),
    ("MaxPool", {"x": (1, 3, 8, 8)}, {"kernel_shape": [2]}, ShapeError, "kernel_shape"),
    ("Einsum", {"a": (2, 3, 4), "b": (4, 5)}, {"equation": "...ij,...jk"}, ShapeError, "ellipsis"),
    (
        "AveragePool",
        {"x": (1, 3, 8, 8)},
        {"kernel_shape": [3, 3], "pads": [1, 1]},
        ShapeError,
        "pads",
    ),
    ("Gemm", {"a": (3, 4), "b": (5, 6)}, {}, ShapeError, "inner dimensions"),
    ("Gemm", {"a": (3, 4), "b": (4, 6), "c": (4,)}, {}, ShapeError, "broadcast"),
    ("Gemm", {"a": (3, 4, 1), "b": (4, 6)}, {}, ShapeError, "2-D"),
    ("MatMul", {"a": (2, 3, 4), "b": (5, 6)}, {}, ShapeError, "inner dimensions"),
    ("MatMul", {"a": (2, 3, 4), "b": (3, 4, 6)}, {}, ShapeError, "do not broadcast"),
    ("Einsum", {"a": (3, 4), "b": (5, 6)}, {"equation": "ij,jk->ik"}, ShapeError, "label 'j'"),
    ("Einsum", {"a": (3, 4)}, {"equation": "ijk->ik"}, ShapeError, "does not match"),
    ("Einsum", {"a": (3, 4)}, {"equation": "ij->iz"}, ShapeError, "'z'"),
    ("Einsum", {"a": (3, 4)}, {"equation": "ij,jk->ik"}, ShapeError, "operand"),
    ("Softmax", {"x": (3, 4)}, {"axis": 2}, ShapeError, "axis"),
    ("ReduceSum", {"x": (3, 4)}, {"axes": [2]}, ShapeError, "out of range"),
    ("ReduceMean", {"x": (3, 4)}, {"axes": [1, -1]}, ShapeError, "more than once"),
    ("ArgMax", {"x": (3, 4)}, {"axis": -3}, ShapeError, "axis"),
    ("InstanceNormalization", {"x": (1, 3, 4, 4), "s": (4,), "b": (3,)}, {}, ShapeError, "scale"),
    ("LayerNormalization", {"x": (2, 3, 4), "s": (5,)}, {}, ShapeError, "Scale"),
    (
        "BatchNormalization",
        {"x": (2, 3, 4), "s": (3,), "b": (3,), "m": (2,), "v": (3,)},
        {},
        ShapeError,
        "input_mean",
    ),
]


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "error", "text"), BAD, ids=[f"{b[0]}-{b[4]}" for b in BAD]
)
def test_bad_inputs_name_the_node(
    op: str, inputs: dict, attrs: dict, error: type[Exception], text: str
) -> None:
    opset = 11 if op in ("ReduceSum", "ReduceMean") else 17
    with pytest.raises(error) as info:
        import_model(_one_node(op, inputs, attrs, opset=opset))
    message = str(info.value)
    assert f"node 'bad' ({op})" in message
    assert text in message


UNSUPPORTED = [
    (
        "BatchNormalization",
        {"x": (2, 3, 4), "s": (3,), "b": (3,), "m": (3,), "v": (3,)},
        {},
        ("y", "mean", "var"),
        15,
        "training",
    ),
    (
        "BatchNormalization",
        {"x": (2, 3, 4), "s": (3,), "b": (3,), "m": (3,), "v": (3,)},
        {},
        ("y", "", "", "saved_mean", ""),
        9,
        "training",
    ),
    (
        "BatchNormalization",
        {"x": (2, 3, 4), "s": (3, 4), "b": (3, 4), "m": (3, 4), "v": (3, 4)},
        {"spatial": 0},
        ("y",),
        7,
        "spatial=0",
    ),
    (
        "LayerNormalization",
        {"x": (2, 3, 4), "s": (4,)},
        {"stash_type": 16},
        ("y",),
        17,
        "stash_type",
    ),
]


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "outputs", "opset", "text"),
    UNSUPPORTED,
    ids=[f"{u[0]}-{u[5]}" for u in UNSUPPORTED],
)
def test_unsupported_variants_name_the_node(
    op: str, inputs: dict, attrs: dict, outputs: tuple[str, ...], opset: int, text: str
) -> None:
    with pytest.raises(UnsupportedOpError) as info:
        import_model(_one_node(op, inputs, attrs, outputs, opset))
    assert f"node 'bad' ({op})" in str(info.value)
    assert text in str(info.value)
    assert info.value.unsupported[0][:2] == ("bad", op)


def test_unsupported_dtype_names_the_node() -> None:
    m = _one_node("Softmax", {"x": (2, 3)}, opset=13, elem=TensorProto.INT32)
    with pytest.raises(UnsupportedOpError, match=r"node 'bad' \(Softmax\).*int32"):
        import_model(m)
