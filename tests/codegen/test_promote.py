"""Register accumulators (`codegen.promote`) under unrolled loops that the AST generator
split into pieces: each piece's accumulators are their own, keyed by the address they
write, natively equal to numpy. (Found by the fuzzing campaign, benchmarks/fuzz_bench.py:
a tile at `ow1` and the next at `ow1 + 7` shared the accumulators of equal `ow1`.)"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from polytile.codegen.ast_facts import linear_terms
from polytile.codegen.native import NativeKernel, random_inputs
from polytile.poly.ast.build import Int, Op, Var
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform.steps import replay

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(("width", "block"), [(14, 7), (14, 10)])
def test_unrolled_pixel_block_of_a_strided_padded_conv(width: int, block: int) -> None:
    """The tap loop `kw` below the unrolled block `ow1` has bounds that depend on it (the
    padding): the AST splits the row into a first tile and the rest."""
    k = kernel_from_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
        {"x": (1, 2, 4, 2 * width)},
        initializers={"w": RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)},
    )
    trace = [
        {"kind": "split", "args": {"loop": "m", "factors": [None, 4]}},
        {"kind": "split", "args": {"loop": "ow", "factors": [None, block]}},
        {
            "kind": "reorder",
            "args": {"order": ["n", "m0", "oh", "c", "kh", "ow0", "ow1", "kw", "m1"]},
        },
        {"kind": "vectorize", "args": {"loop": "m1"}},
        {"kind": "unroll", "args": {"loop": "ow1"}},
    ]
    schedule = replay(k, trace)
    inputs = random_inputs(k, 0)
    want = run_program_order(k, inputs)["y"]
    got = NativeKernel(schedule).outputs(inputs)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_unrolled_row_block_over_a_partial_vector_tile() -> None:
    """A product whose 48-wide vector tiles leave a partial one (n = 2*48 + 16), with its
    row block unrolled under a tiled reduction."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(64, 1024), B=(1024, 256))
    trace = [
        {"kind": "split", "args": {"loop": "j", "factors": [None, 48]}},
        {"kind": "split", "args": {"loop": "i", "factors": [None, 8]}},
        {"kind": "split", "args": {"loop": "j0", "factors": [None, 2]}},
        {"kind": "split", "args": {"loop": "k", "factors": [None, 256]}},
        {"kind": "reorder", "args": {"order": ["i0", "j00", "k0", "j01", "k1", "i1", "j1"]}},
        {"kind": "vectorize", "args": {"loop": "j1"}},
        {"kind": "unroll", "args": {"loop": "i1"}},
    ]
    inputs = random_inputs(k, 0)
    got = NativeKernel(replay(k, trace)).outputs(inputs)["Y"]
    want = inputs["A"].astype(np.float64) @ inputs["B"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_linear_terms_name_equal_addresses_alike() -> None:
    ow1, seven = Var("ow1"), Int(7)
    assert linear_terms(Op("add", (ow1, seven)), {"ow1": 0}) == linear_terms(ow1, {"ow1": 7})
    assert linear_terms(Op("add", (ow1, seven)), {"ow1": 0}) != linear_terms(ow1, {"ow1": 0})
    two_oh = Op("mul", (Int(2), Var("oh")))
    assert linear_terms(Op("add", (two_oh, Var("oh")))) == linear_terms(
        Op("mul", (Int(3), Var("oh")))
    )
