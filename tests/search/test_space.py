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


CONV = kernel_from_node(
    helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    {"x": (1, 8, 6, 14)},
    initializers={"w": RNG.standard_normal((32, 8, 3, 3)).astype(np.float32)},
)
MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(64, 96), B=(96, 128))


BIG_MATMUL = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(32, 512), B=(512, 512))


@pytest.mark.parametrize(
    "k", [CONV, MATMUL, BIG_MATMUL, KERNELS["softmax"]], ids=["conv", "mm", "cached-mm", "sm"]
)
def test_default_decisions_build_the_default_schedule(k: object) -> None:
    from polytile.poly.default import DefaultConfig, default_schedule

    space = SearchSpace(k, lanes=8, threads=2)
    built = space.build(space.default_decisions())
    assert built.trace == default_schedule(k, DefaultConfig(vector_width=8)).trace_json()


def test_conv_hint_puts_channels_in_vectors_and_rows_in_registers() -> None:
    space = SearchSpace(CONV, lanes=8)
    assert space.plan is not None and space.dim_of[space.plan.channel] == "m"
    hinted = [space.sample(random.Random(s)) for s in range(40)]
    channel = [d for d in hinted if d["vec_loop"] == space.plan.channel]
    assert len(channel) >= 20  # the hint (70%) plus random picks
    d = {**channel[0], "low_reduce": True, "block": 7, "unroll": True, "block2_loop": None}
    schedule = space.build(d).schedule
    loops = schedule.loops_of(space.main.name)
    marks = {lp.annotation for lp in loops}
    assert "vector" in marks and loops[-1].annotation == "vector"
    # the row block (unrolled) sits above the reduction that moves along the row (kw)
    names = [lp.name for lp in loops]
    row_block = next(lp.name for lp in loops if lp.annotation == "unroll")
    assert names.index(row_block) < names.index("kw")


def test_outer_tile_applies_to_a_blocked_loop() -> None:
    space = SearchSpace(MATMUL, lanes=8)
    d = {**space.default_decisions(), "otile_loop": "j", "otile": 4, "vec": 8}
    d.update(rtile_loop="k", rtile=32)
    trace = space.build(d).trace
    splits = [s["args"]["loop"] for s in trace if s["kind"] == "split"]
    assert "j0" in splits  # the vector loop's outer part, tiled again
    loops = [lp.name for lp in space.build(d).schedule.loops_of(space.main.name)]
    assert loops.index("k0") < loops.index("j01") < loops.index("k1")  # S R S R S


def test_rfactor_vectorizes_a_reduction_with_little_parallelism() -> None:
    k = kernel("Y[i] += A[i, k] * 2", A=(2, 512))
    space = SearchSpace(k, lanes=8)
    assert space.choices()["rfactor"] == (0, 8, 16, 32, 64)
    assert SearchSpace(MATMUL, lanes=8).choices()["rfactor"] == (0,)  # enough outputs
    candidate = space.build({**space.default_decisions(), "rfactor": 16, "vec": 8})
    assert candidate.trace[0]["kind"] == "rfactor"
    partial = next(s for s in candidate.schedule.kernel.statements if s.name.endswith("_rf_1"))
    assert candidate.schedule.loops_of(partial.name)[-1].annotation == "vector"
    a = RNG.standard_normal((2, 512)).astype(np.float32)
    got = run_schedule(replay(k, candidate.trace), {"A": a})["Y"]
    assert got.shape == (2,) and got.dtype == np.float32
    np.testing.assert_allclose(got, (a * 2).sum(axis=1), rtol=1e-5)


def test_decisions_of_an_older_space_are_completed() -> None:
    space = SearchSpace(MATMUL, lanes=8)
    old = {"vec_loop": "j", "vec": 8, "block": 3, "retired": 1, "otile": 999}
    d = space.complete(old)
    assert set(d) == set(space.choices())
    assert (d["vec"], d["block"]) == (8, 3)  # kept
    assert d["otile"] == space.default_decisions()["otile"]  # not an option any more
    assert space.build(d).trace  # buildable
