"""Resize with antialias=1 (the filter widened by 1 / scale when downsampling): the
lowered kernels against onnx's reference evaluator over the coordinate modes, scales and
sizes, exclude_outside, axes, integer data and the extrapolation of tf_crop_and_resize;
and linear Resize one axis at a time with affine source indices."""

from __future__ import annotations

import numpy as np
import pytest
from test_lower_injective import COORDINATES, _resize, check, statements_of

from polytile.poly.ir.expr import Load, walk
from polytile.poly.lower.resize import Axis, antialias_taps


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
def test_antialias_coordinate_modes(mode: str, coordinates: str) -> None:
    """Down by non-integer factors in both spatial axes (windows of 4 to 10 taps)."""
    m, inputs = _resize(
        (1, 2, 9, 11),
        scales=[1, 1, 0.6, 0.45],
        mode=mode,
        antialias=1,
        coordinate_transformation_mode=coordinates,
    )
    kernels = check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)
    assert sum(s.reduction == "sum" for s in statements_of(kernels)) == 2  # one per axis


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_up_in_one_axis_down_in_the_other_with_exclude_outside(mode: str) -> None:
    m, inputs = _resize((2, 7, 5), scales=[1, 0.4, 1.7], mode=mode, antialias=1, exclude_outside=1)
    check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)


def test_antialias_sizes_not_larger_over_axes() -> None:
    m, inputs = _resize(
        (2, 3, 10, 8),
        sizes=[4, 5],
        mode="cubic",
        antialias=1,
        axes=[3, 2],
        keep_aspect_ratio_policy="not_larger",
        cubic_coeff_a=-0.5,
    )
    check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)


def test_antialias_tf_crop_and_resize_extrapolates() -> None:
    m, inputs = _resize(
        (1, 1, 8, 8),
        sizes=[1, 1, 3, 5],
        roi=[0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3],
        mode="linear",
        antialias=1,
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=7.5,
    )
    check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)


def test_antialias_uint8_rounds_half_to_even() -> None:
    m, inputs = _resize(
        (1, 1, 6, 6), scales=[1, 1, 0.5, 0.5], dtype="uint8", mode="linear", antialias=1
    )
    feeds = {"x": np.random.default_rng(5).integers(0, 256, (1, 1, 6, 6)).astype(np.uint8)}
    check(m, inputs, oracle="reference", feeds=feeds)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_taps_cover_the_window(mode: str) -> None:
    """Each output position's weights sum to 1 and its window is centred on the source
    coordinate: the taps with non-zero weight lie within 2 / scale (cubic: 4 / scale)."""
    axis = Axis(20, 7, (("add", 0.5), ("div", 0.35), ("sub", 0.5)), scale=0.35)
    first, weights = antialias_taps(axis, mode, -0.75, False)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    reach = (1 if mode == "linear" else 2) / 0.35
    centre = axis.coordinates()
    taps = first[:, None] + np.arange(weights.shape[1])[None, :]
    used = weights != 0
    assert np.all(np.abs(taps - centre[:, None])[used] < reach)
    assert used[:, 0].any() and weights.shape[1] == 2 * int(np.ceil(reach))


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("scales", [[1, 1, 8, 8], [1, 1, 1.5, 2.5], [1, 1, 0.6, 3]])
def test_linear_resize_one_axis_at_a_time_with_affine_indices(
    coordinates: str, scales: list[float]
) -> None:
    """Up and down by integer and fractional factors: one float64 pass per resized axis
    (the innermost first), every source index affine (no indirect load), the clamped ends
    pieces of their own, and the values the reference evaluator's."""
    m, inputs = _resize(
        (1, 3, 5, 7), scales=scales, mode="linear", coordinate_transformation_mode=coordinates
    )
    kernels = check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)
    statements = statements_of(kernels)
    assert not any(s.reduction for s in statements)
    loads = [e for s in statements for e in walk(s.expr) if isinstance(e, Load)]
    assert loads and all(isinstance(i, str) for ld in loads for i in ld.index)
    temps = {t.name for k in kernels for t in k.tensors.values() if t.dtype == "float64"}
    assert len(temps) == 1  # the innermost axis' pass
