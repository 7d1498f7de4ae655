"""The search space: sampled candidates are legal, replayable traces that compute the
kernel's result (checked with the AST interpreter), for several kernel kinds."""

from __future__ import annotations

import random

import numpy as np
import pytest
from onnx import helper

from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.interp import run_schedule
from polytile.poly.kernel import Role
from polytile.poly.reference import run_program_order
from polytile.poly.transform import replay
from polytile.search.space import SearchSpace

RNG = np.random.default_rng(0)
KERNELS = {
    "mm_relu": kernel(
        "Y[i, j] += A[i, k] * B[k, j]", "C[i, j] = max(Y[i, j], 0)", A=(6, 10), B=(10, 19)
    ),
    "conv": kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
        {"x": (1, 3, 6, 7)},
        initializers={"w": RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)},
    ),
    "softmax": kernel_from_node(helper.make_node("Softmax", ["x"], ["y"]), {"x": (3, 11)}),
    "elementwise": kernel("Y[i, j] = exp(A[i, j]) * 2", A=(5, 21)),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_sampled_and_mutated_candidates_are_correct(name: str) -> None:
    k = KERNELS[name]
    space = SearchSpace(k, lanes=8)
    rng = random.Random(0)
    inputs = {
        t.name: RNG.standard_normal(t.shape).astype(t.dtype)
        for t in k.tensors.values()
        if t.role is Role.INPUT
    }
    want = run_program_order(k, inputs)
    decisions = space.sample(rng)
    traces = set()
    for _ in range(12):
        candidate = space.build(decisions)
        assert replay(k, candidate.trace).body == candidate.schedule.body
        got = run_schedule(candidate.schedule, inputs)
        for t in k.outputs():
            np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-5, atol=1e-5)
        traces.add(str(candidate.trace))
        decisions = space.mutate(decisions, rng)
    if name in ("mm_relu", "conv"):
        assert len(traces) >= 2  # mutations change the program


def test_sampling_is_seeded() -> None:
    space = SearchSpace(KERNELS["mm_relu"])
    a = [space.sample(random.Random(7)) for _ in range(3)]
    b = [space.sample(random.Random(7)) for _ in range(3)]
    assert a == b
