"""One vocabulary (issue 43): the default schedule is the sketch under the default's
decisions, and the search space builds exactly it from `default_decisions`; those
decisions are a record like any other (JSON, `complete`), and each of them matters."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.ir.kernel import Kernel
from polytile.poly.transform.flatten import flatten_planes
from polytile.search.space import SearchSpace

RNG = np.random.default_rng(0)


def _conv(x: tuple[int, ...], w: tuple[int, ...], flat: bool = False, **attrs: object) -> Kernel:
    k = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], **attrs),
        {"x": x},
        initializers={"w": RNG.standard_normal(w).astype(np.float32)},
    )
    return flatten_planes(k) if flat else k


KERNELS = {
    # the conv plan: a padded window below the row block
    "conv3x3": lambda: _conv((1, 8, 6, 14), (32, 8, 3, 3), pads=[1, 1, 1, 1]),
    # MobileNetV3's squeeze-excite 1x1 conv over a 1x1 image: a row that runs once
    "se_conv": lambda: _conv((1, 64, 1, 1), (16, 64, 1, 1), flat=True),
    # a 1x1 conv whose pixels stream: the matrix-product plan
    "conv1x1": lambda: _conv((1, 32, 16, 16), (64, 32, 1, 1), flat=True),
    "grouped": lambda: _conv((1, 64, 8, 8), (64, 16, 1, 1), flat=True, group=4),
    "mm_relu": lambda: kernel(
        "Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(6, 10), B=(10, 19)
    ),
    # long enough for cache tiles and bands of row blocks
    "gemm": lambda: kernel("Y[i, j] += A[i, k] * B[k, j]", A=(64, 1024), B=(1024, 512)),
    "maxpool": lambda: kernel_from_node(
        helper.make_node(
            "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        {"x": (1, 16, 14, 14)},
    ),
    "mean": lambda: kernel_from_node(
        helper.make_node("GlobalAveragePool", ["x"], ["y"]), {"x": (1, 32, 7, 7)}
    ),
    "softmax": lambda: kernel_from_node(helper.make_node("Softmax", ["x"], ["y"]), {"x": (3, 40)}),
    "chain": lambda: kernel(
        "T[i, j] = A[j, i] - 1", "U[i, j] = exp(T[i, j])", "Y[i, j] = U[i, j] * 2", A=(9, 64)
    ),
}
CONFIGS = {
    "avx512": DefaultConfig(vector_width=16, threads=2, min_parallel_work=0),
    "avx2": DefaultConfig(vector_width=8, threads=4),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_space_builds_the_default_schedule_from_its_default_decisions(
    name: str, config: str
) -> None:
    k = KERNELS[name]()
    cfg = CONFIGS[config]
    space = SearchSpace(k, config=cfg)
    want = default_schedule(k, cfg).trace_json()
    decisions = space.default_decisions()
    assert space.build(decisions).trace == want
    # a record of them (JSON, made whole by `complete`) builds the same schedule
    record = space.complete(json.loads(json.dumps(decisions)))
    assert record == decisions
    assert space.build(record).trace == want


def test_every_default_decision_of_a_conv_is_one_the_search_can_change() -> None:
    """The default's decisions are options of the space (a row that runs once is a block
    too), and changing one changes the schedule: the default is no separate path."""
    k = KERNELS["se_conv"]()
    space = SearchSpace(k, config=CONFIGS["avx512"])
    decisions = space.default_decisions()
    choices = space.choices()
    assert all(decisions[key] in choices[key] for key in decisions)
    assert decisions["block_loop"] is not None and decisions["block"] == 1
    want = space.build(decisions).trace
    assert {"kind": "unroll", "args": {"loop": decisions["block_loop"]}} in want
    for key, value in (("unroll", False), ("block_loop", None), ("pack", False)):
        assert space.build({**decisions, key: value}).trace != want, key
