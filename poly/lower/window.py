"""Sliding-window indexing shared by the convolutions (`nn`) and pooling (`pool`): the
names of spatial dimensions, and each window tap's input position with the domain
constraints keeping it inside the input (the padding is outside the domain)."""

from __future__ import annotations

from collections.abc import Sequence

from polytile.frontend.ops.nn import Window
from polytile.poly.lower.base import affine_text


def spatial_dims(rank: int, prefix: str) -> tuple[str, ...]:
    """Names of spatial dimensions: `oh, ow` for prefix 'o' in 2-D, `kd, kh, kw` in 3-D."""
    letters = {1: "w", 2: "hw", 3: "dhw"}.get(rank)
    if letters is not None:
        return tuple(prefix + letter for letter in letters)
    return tuple(f"{prefix or 's'}{i}" for i in range(rank))


def within(index: str, low: int, high: int, lowest: int, highest: int) -> list[str]:
    """Constraints keeping `index` (ranging over [lowest, highest]) in [low, high)."""
    where = []
    if lowest < low:
        where.append(f"{index} >= {low}")
    if highest >= high:
        where.append(f"{index} < {high}")
    return where


def window_taps(
    window: Window,
    spatial: Sequence[int],
    out_dims: Sequence[str],
    taps: Sequence[str],
    lows: Sequence[int] | None = None,
    highs: Sequence[int] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Input index `o*s + k*d - p` of each spatial axis of a sliding window (`o*s - p` where
    the window is one tap wide, so a 1×1 window reads bare output positions) and, per
    axis, the domain constraints keeping it inside the input (or inside [lows, highs))."""
    n = len(spatial)
    lows = [0] * n if lows is None else lows
    highs = spatial if highs is None else highs
    index, where = [], []
    for i in range(n):
        s, d, p = window.strides[i], window.dilations[i], window.pads[i]
        tap = [(d, taps[i])] if window.kernel[i] > 1 else []
        pos = affine_text([(s, out_dims[i]), *tap], -p)
        index.append(pos)
        highest = (window.out[i] - 1) * s + (window.kernel[i] - 1) * d - p
        where.append(within(pos, lows[i], highs[i], -p, highest))
    return index, where
