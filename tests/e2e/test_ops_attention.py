"""Attention and RotaryEmbedding (opset 23) compiled to native code on cases the ONNX node
tests miss (grouped-query heads with a causal frontier and a run-time bool mask, 3-D
inputs with a cache and a short mask, every qk_matmul_output_mode with softcap, fully
masked rows, per-batch nonpad_kv_seqlen with causal and window frontiers, partial
interleaved rotation of 3-D input), against onnxruntime and onnx's
reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import polytile as pt
from polytile.errors import PolytileError

from peers import one_node_model, ort_run, reference

RNG = np.random.default_rng(23)


def model(
    node: onnx.NodeProto, inputs: dict[str, np.ndarray], outputs: list[str], opset: int = 23
) -> onnx.ModelProto:
    return one_node_model(
        node, inputs, dict.fromkeys(outputs, onnx.TensorProto.FLOAT), opset=opset, ir_version=10
    )


def close(got: list[np.ndarray], want: list[np.ndarray], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_gqa_causal_with_bool_mask_against_onnxruntime() -> None:
    feeds = {
        "Q": normal(2, 8, 5, 16),
        "K": normal(2, 2, 7, 16),
        "V": normal(2, 2, 7, 12),
        "mask": RNG.random((2, 1, 5, 7)) > 0.3,
    }
    feeds["mask"][:, :, :, 0] = True  # no row fully masked (onnxruntime gives NaN there)
    node = helper.make_node("Attention", ["Q", "K", "V", "mask"], ["Y"], is_causal=1)
    m = model(node, feeds, ["Y"])
    got = pt.compile(m).run(feeds)
    close(got, reference(m, feeds))
    close(got, ort_run(m, feeds), 1e-4)


def test_3d_gqa_with_cache_and_short_float_mask() -> None:
    """The mask covers fewer keys than past + new: the rest are masked (-inf)."""
    feeds = {
        "Q": normal(1, 3, 4 * 8),
        "K": normal(1, 3, 2 * 8),
        "V": normal(1, 3, 2 * 6),
        "mask": normal(3, 7),
        "past_key": normal(1, 2, 5, 8),
        "past_value": normal(1, 2, 5, 6),
    }
    node = helper.make_node(
        "Attention",
        ["Q", "K", "V", "mask", "past_key", "past_value"],
        ["Y", "present_key", "present_value"],
        q_num_heads=4,
        kv_num_heads=2,
        scale=0.3,
    )
    m = model(node, feeds, ["Y", "present_key", "present_value"])
    close(pt.compile(m).run(feeds), reference(m, feeds))


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_qk_matmul_output_modes_with_softcap(mode: int) -> None:
    feeds = {"Q": normal(2, 3, 4, 8) * 3, "K": normal(2, 3, 6, 8) * 3, "V": normal(2, 3, 6, 8)}
    feeds["mask"] = normal(4, 6)
    node = helper.make_node(
        "Attention",
        ["Q", "K", "V", "mask"],
        ["Y", "", "", "qk"],
        softcap=1.5,
        qk_matmul_output_mode=mode,
    )
    m = model(node, feeds, ["Y", "qk"])
    got = pt.compile(m).run(feeds)
    want = reference(m, feeds)
    if mode == 0:
        # the spec's mode 0 is Q·Kᵀ scaled, before softcap (onnx's reference caps it too)
        q, k = feeds["Q"].astype(np.float64), feeds["K"].astype(np.float64)
        want[1] = (q @ k.transpose(0, 1, 3, 2) / np.sqrt(8)).astype(np.float32)
    close(got, want)


def test_fully_masked_row_gives_zeros() -> None:
    feeds = {"Q": normal(1, 2, 3, 4), "K": normal(1, 2, 5, 4), "V": normal(1, 2, 5, 4)}
    mask = RNG.random((3, 5)) > 0.5
    mask[1] = False
    mask[0, 0] = mask[2, 0] = True
    feeds["mask"] = mask
    node = helper.make_node("Attention", ["Q", "K", "V", "mask"], ["Y"])
    m = model(node, feeds, ["Y"])
    (got,) = pt.compile(m).run(feeds)
    assert np.all(got[:, :, 1] == 0)
    close([got], reference(m, feeds))


@pytest.mark.parametrize("causal", [0, 1])
def test_gqa_nonpad_kv_seqlen_against_onnxruntime(causal: int) -> None:
    """Per-batch valid key counts (an external cache): padding keys never attend, and the
    causal frontier ends each batch's block at its own length."""
    feeds = {
        "Q": normal(3, 4, 3, 8),
        "K": normal(3, 2, 7, 8),
        "V": normal(3, 2, 7, 6),
        "lengths": np.array([4, 7, 3], np.int64),
    }
    node = helper.make_node(
        "Attention", ["Q", "K", "V", "", "", "", "lengths"], ["Y"], is_causal=causal
    )
    m = model(node, feeds, ["Y"], opset=24)
    got = pt.compile(m).run(feeds)
    close(got, reference(m, feeds))
    close(got, ort_run(m, feeds), 1e-4)
    # padding keys are ignored: changing them changes nothing
    feeds["K"][0, :, 4:] = 100.0
    feeds["V"][2, :, 3:] = -100.0
    close(pt.compile(m).run(feeds), got)


def test_3d_nonpad_with_float_mask_window_and_scores() -> None:
    """3-D inputs, a short float mask, a left window moving with each batch's length, and
    qk_matmul_output with the bias (mode 2); a batch with length 0 gives zero rows."""
    feeds = {
        "Q": normal(2, 2, 12),
        "K": normal(2, 6, 6),
        "V": normal(2, 6, 4),
        "mask": normal(2, 5),
        "lengths": np.array([5, 0], np.int64),
    }
    node = helper.make_node(
        "Attention",
        ["Q", "K", "V", "mask", "", "", "lengths"],
        ["Y", "", "", "scores"],
        q_num_heads=4,
        kv_num_heads=2,
        is_causal=1,
        left_window_size=2,
        qk_matmul_output_mode=2,
    )
    m = model(node, feeds, ["Y", "scores"], opset=25)
    got = pt.compile(m).run(feeds)
    assert np.all(got[0][1] == 0)
    close(got, reference(m, feeds))


def test_nonpad_kv_seqlen_with_past_key_is_an_error() -> None:
    feeds = {"Q": normal(1, 1, 2, 4), "K": normal(1, 1, 3, 4), "V": normal(1, 1, 3, 4)}
    feeds |= {"pk": normal(1, 1, 2, 4), "pv": normal(1, 1, 2, 4)}
    feeds["lengths"] = np.array([2], np.int64)
    node = helper.make_node("Attention", ["Q", "K", "V", "", "pk", "pv", "lengths"], ["Y"])
    with pytest.raises(PolytileError, match="nonpad_kv_seqlen"):
        pt.compile(model(node, feeds, ["Y"], opset=24))


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_3d_partial_rotation_against_onnxruntime(interleaved: int) -> None:
    batch, seq, heads, head = 2, 5, 3, 8
    positions = np.arange(32)[:, None] * (1.0 / 10000 ** (np.arange(2) / 2))[None, :]
    feeds = {
        "x": normal(batch, seq, heads * head),
        "cos": np.cos(positions).astype(np.float32),
        "sin": np.sin(positions).astype(np.float32),
        "ids": RNG.integers(0, 32, size=(batch, seq)).astype(np.int64),
    }
    node = helper.make_node(
        "RotaryEmbedding",
        ["x", "cos", "sin", "ids"],
        ["y"],
        num_heads=heads,
        rotary_embedding_dim=4,
        interleaved=interleaved,
    )
    m = model(node, feeds, ["y"])
    got = pt.compile(m).run(feeds)
    close(got, reference(m, feeds))
    close(got, ort_run(m, feeds))


def test_rotary_position_out_of_range_is_an_error() -> None:
    """position_ids index the caches through a checked Gather: never a read outside."""
    feeds = {
        "x": normal(1, 2, 3, 4),
        "cos": normal(6, 2),
        "sin": normal(6, 2),
        "ids": np.array([[0, 1, 2]], np.int64),
    }
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "ids"], ["y"])
    compiled = pt.compile(model(node, feeds, ["y"]))
    close(compiled.run(feeds), reference(model(node, feeds, ["y"]), feeds))
    feeds["ids"] = np.array([[0, 6, 2]], np.int64)
    with pytest.raises(PolytileError, match="out of range"):
        compiled.run(feeds)
