"""Attention's `scale` at its edges: an explicit 0 is uniform attention (not the default
1/sqrt(head_size)), as onnx's reference evaluator computes it; a negative scale is
refused by name (onnxruntime refuses every scale <= 0; the reference gives NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_ops_attention import close, model, normal, ort_run, reference

import polytile as pt
from polytile.errors import UnsupportedOpError


def _case(scale: float | None) -> tuple:
    feeds = {"Q": normal(2, 3, 4, 8), "K": normal(2, 3, 6, 8), "V": normal(2, 3, 6, 5)}
    attrs = {} if scale is None else {"scale": scale}
    node = helper.make_node(
        "Attention", ["Q", "K", "V"], ["Y", "", "", "S"], name="attn", qk_matmul_output_mode=0
    )
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return model(node, feeds, ["Y", "S"]), feeds


@pytest.mark.parametrize("scale", [None, 0.3, 0.0])
def test_scale_multiplies_the_scores(scale: float | None) -> None:
    m, feeds = _case(scale)
    got = pt.compile(m).run(feeds)
    factor = 1 / np.sqrt(8) if scale is None else scale
    scores = np.einsum("bhqd,bhkd->bhqk", feeds["Q"], feeds["K"]) * factor
    close([got[1]], [scores])
    close(got, reference(m, feeds))
    if scale == 0.0:  # uniform attention: every row is the mean of V
        close([got[0]], [np.broadcast_to(feeds["V"].mean(2, keepdims=True), got[0].shape)])
    else:
        close(got, ort_run(m, feeds), 1e-4)


def test_a_negative_scale_is_refused_by_name() -> None:
    m, _ = _case(-0.25)
    with pytest.raises(UnsupportedOpError, match=r"attn.*scale -0\.25 is negative"):
        pt.compile(m)
