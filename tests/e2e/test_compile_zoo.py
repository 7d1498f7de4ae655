"""Every zoo model (the nine light architectures with seeded random weights, the transformer
layer and the MLP), compiled to native code with the default schedules, gives
onnxruntime's outputs within rtol 1e-3 / atol 1e-4 of the output's scale."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import polytile as pt
from polytile import zoo

#: the modern zoo has its own end-to-end tests (test_modern_zoo.py)
CLASSIC = [i.name for i in zoo.list_models() if i.source != "modern"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSIC)
def test_zoo_model_matches_onnxruntime(name: str, zoo_model) -> None:
    model = zoo_model(name) if name != "vgg19" else zoo.build(name, 0)
    data = model.SerializeToString()
    compiled = pt.compile(data)
    feeds = compiled.random_inputs(seed=1)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(data, options).run(None, feeds)
    got = compiled.run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = float(np.max(np.abs(w))) or 1.0
        np.testing.assert_allclose(g / scale, w / scale, rtol=1e-3, atol=1e-4)
