"""Kernels with symbolic sizes (isl parameters), compiled once and run at many sizes.

Random kernels of each kind (elementwise, reductions, matrix products, batched attention
products, convolutions with symbolic spatial sizes, softmax) take random legal schedules:
the search space's samples for the kernel's instance at one size, replayed on the
symbolic kernel (every step checked again for all sizes). Each compiled kernel then runs
at random sizes, smaller than a tile and not multiples of a vector among them, against
numpy.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping

import numpy as np
import pytest

from polytile.codegen.jit import optimize
from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.errors import IllegalSchedule, InputError
from polytile.explanation import explain
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel
from polytile.poly.ir.kernel import Kernel, mentions
from polytile.poly.ir.schedule import initial_schedule
from polytile.poly.transform import steps as T
from polytile.poly.transform.contract import private_temporaries
from polytile.poly.transform.steps import loop_extent, replay
from polytile.search.space import SearchSpace

Reference = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _conv_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3×3 convolution with one pixel of zero padding: x [k, n, m], w [c, k, 3, 3]."""
    k, n, m = x.shape
    padded = np.zeros((k, n + 2, m + 2), x.dtype)
    padded[:, 1:-1, 1:-1] = x
    out = np.zeros((w.shape[0], n, m), np.float64)
    for r in range(3):
        for s in range(3):
            out += np.einsum("ck,khw->chw", w[:, :, r, s], padded[:, r : r + n, s : s + m])
    return out


#: name → (kernel, numpy reference)
CASES: dict[str, tuple[Kernel, Reference]] = {
    "broadcast": (
        kernel("Y[i, j] = X[i, j] * B[j] + 1.0", X=("n", 37), B=(37,)),
        lambda d: {"Y": d["X"] * d["B"] + 1},
    ),
    "inner": (
        kernel("Y[i, j] = max(X[i, j], 0.0)", X=(5, "n")),
        lambda d: {"Y": np.maximum(d["X"], 0)},
    ),
    "row_sum": (kernel("Y[i] += X[i, j]", X=(13, "n")), lambda d: {"Y": d["X"].sum(1)}),
    "column_max": (kernel("Y[j] max= X[i, j]", X=("n", 33)), lambda d: {"Y": d["X"].max(0)}),
    "matmul": (
        kernel("Y[i, j] += A[i, k] * B[k, j]", A=("m", "q"), B=("q", "p")),
        lambda d: {"Y": d["A"] @ d["B"]},
    ),
    "attention": (
        kernel("S[b, i, j] += Q[b, i, e] * K[b, j, e]", Q=("h", "s", 16), K=("h", "s", 16)),
        lambda d: {"S": np.einsum("bie,bje->bij", d["Q"], d["K"])},
    ),
    "conv": (
        kernel(
            "Y[c, h, w] += X[k, h + r - 1, w + t - 1] * W[c, k, r, t] "
            "if 0 <= h + r - 1 < n and 0 <= w + t - 1 < m",
            X=(4, "n", "m"),
            W=(8, 4, 3, 3),
            extents={"h": "n", "w": "m"},
        ),
        lambda d: {"Y": _conv_same(d["X"], d["W"])},
    ),
    "batched_matmul": (
        kernel("Y[b, i, j] += A[b, i, k] * B[k, j]", A=("batch", "seq", 24), B=(24, 40)),
        lambda d: {"Y": d["A"] @ d["B"]},
    ),
    "batched_conv": (
        kernel(
            "T[b, c, h, w] += X[b, k, h + r - 1, w + t - 1] * W[c, k, r, t] "
            "if 0 <= h + r - 1 < 10 and 0 <= w + t - 1 < 10",
            "Y[b, c, h, w] = max(T[b, c, h, w], 0.0)",
            X=("batch", 4, 10, 10),
            W=(16, 4, 3, 3),
            extents={"h": 10, "w": 10},
            outputs=["Y"],
        ),
        lambda d: {"Y": np.maximum(np.stack([_conv_same(x, d["W"]) for x in d["X"]]), 0)},
    ),
    "softmax": (
        kernel(
            "M[i] max= X[i, j]",
            "E[i, j] = exp(X[i, j] - M[i])",
            "S[i] += E[i, j]",
            "Y[i, j] = E[i, j] / S[i]",
            X=("n", "p"),
            outputs=["Y"],
        ),
        lambda d: {"Y": _softmax(d["X"])},
    ),
}

#: sizes a run draws from: below a tile, around and off vector multiples, larger ones
SIZES = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64, 70)
#: the size the search space's samples are made for
SAMPLED_AT = 24


def _schedules(k: Kernel, count: int, seed: int) -> list:
    """The default schedule, then random legal schedules of the search space: each
    sample of the instance at `SAMPLED_AT` replayed on the symbolic kernel (a sample
    whose steps do not hold for all sizes is refused, as the search would)."""
    space = SearchSpace(k.at({p: SAMPLED_AT for p in k.params}))
    rng = random.Random(seed)
    schedules = [default_schedule(k)]
    tries = 0
    while len(schedules) < count + 1 and tries < 8 * count:
        tries += 1
        try:
            trace = space.build(space.sample(rng)).trace
            schedules.append(replay(k, trace))
        except IllegalSchedule:
            continue
    return schedules


@pytest.mark.parametrize("name", sorted(CASES))
def test_symbolic_kernel_matches_numpy_at_every_size(name: str) -> None:
    k, reference = CASES[name]
    assert k.params, "the case has symbolic sizes"
    rng = random.Random(name)
    for number, schedule in enumerate(_schedules(k, count=2, seed=len(name))):
        native = NativeKernel(schedule)
        for run in range(3):
            sizes = {p: rng.choice(SIZES) for p in k.params}
            inputs = native.random_inputs(seed=run, sizes=sizes)
            got = native.outputs(inputs)
            for out, want in reference(inputs).items():
                assert got[out].shape == want.shape
                np.testing.assert_allclose(
                    got[out],
                    want,
                    rtol=1e-4,
                    atol=1e-4,
                    err_msg=f"{name}, schedule {number} {schedule.trace_json()}, sizes {sizes}",
                )


def test_symbolic_kernel_reuses_one_compile_for_all_sizes() -> None:
    """One function serves every size: the sizes are arguments, not constants."""
    k, reference = CASES["matmul"]
    native = NativeKernel(default_schedule(k))
    assert "i64 %" in native.ir.split("define", 1)[1].split("\n", 1)[0]
    for sizes in ({"m": 1, "q": 1, "p": 1}, {"m": 7, "q": 70, "p": 33}):
        inputs = native.random_inputs(seed=3, sizes=sizes)
        np.testing.assert_allclose(
            native.outputs(inputs)["Y"], reference(inputs)["Y"], rtol=1e-4, atol=1e-4
        )


def test_instance_at_sizes_is_the_static_kernel() -> None:
    k, _ = CASES["matmul"]
    static = kernel("Y[i, j] += A[i, k] * B[k, j]", A=(3, 4), B=(4, 5))
    instance = k.at({"m": 3, "q": 4, "p": 5})
    assert not instance.params
    assert {n: t.shape for n, t in instance.tensors.items()} == {
        n: t.shape for n, t in static.tensors.items()
    }
    for mine, theirs in zip(instance.statements, static.statements, strict=True):
        assert mine.domain_set().is_equal(theirs.domain_set())


def test_bad_sizes_name_the_size_or_input() -> None:
    k, _ = CASES["matmul"]
    native = NativeKernel(default_schedule(k))
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(InputError, match="'B' axis 0 must be q = 4, got 5"):
        native.outputs({"A": a, "B": np.zeros((5, 2), np.float32)})
    with pytest.raises(InputError, match="size 'm' must be at least 1"):
        native.outputs({"A": a, "B": np.zeros((4, 2), np.float32)}, sizes={"m": 0})
    with pytest.raises(ValueError, match="unset or below 1"):
        k.at({"m": 3})


def test_default_parallel_loop_has_work_at_a_batch_of_one() -> None:
    """The default's decisions are made at a representative size (a batch of 128), but its
    parallel loop must not be the batch loop alone: at a batch of 1, one thread would do
    all the work."""
    k, _ = CASES["batched_matmul"]
    sizes = {"batch": 1, "seq": 64}
    schedule = default_schedule(k, DefaultConfig(threads=2))
    parallel = [lp.name for lp, _ in schedule.loops() if lp.annotation == "parallel"]
    assert parallel, schedule.trace_json()
    assert all(loop_extent(schedule, lp, sizes) >= 2 for lp in parallel), schedule.trace_json()


def test_symbolic_temporary_is_private_to_its_tile() -> None:
    """A temporary of symbolic size whose tile fits at the smallest sizes lives in one
    tile's slice (per thread), not in a buffer as large as the whole tensor."""
    k, _ = CASES["batched_conv"]
    private = private_temporaries(default_schedule(k))
    assert [p.tensor for p in private] == ["T"]
    assert private[0].span < 16 * 10 * 10


def test_llvm_unrolls_constant_trips_but_not_run_time_ones() -> None:
    """Each loop of a symbolic kernel carries its own loop ID refusing runtime unrolling
    (a remainder loop per loop tripled the code); loops with constant trip counts (a
    conv's 3 taps) are still LLVM's to unroll, which register tiles need."""
    k, _ = CASES["batched_conv"]
    ir_text = NativeKernel(default_schedule(k)).ir
    ids = re.findall(r"!llvm\.loop (!\d+)", ir_text)
    assert ids and len(set(ids)) == len(ids)
    for name in ids:
        node = re.search(rf"^{name} = distinct !{{{name}, (!\d+)}}$", ir_text, re.M)
        assert node, f"loop ID {name} is not a distinct self-reference"
        assert f'{node.group(1)} = !{{ !"llvm.loop.unroll.runtime.disable" }}' in ir_text
    # LLVM's runtime unrolling leaves `xtraiter` counts and `.prol` remainder loops
    unrolled = str(optimize(re.sub(r", !llvm\.loop !\d+", "", ir_text), host()))
    assert "xtraiter" in unrolled and ".prol" in unrolled
    optimized = str(optimize(ir_text, host()))
    assert "xtraiter" not in optimized and ".prol" not in optimized


def test_parallel_tiles_of_a_symbolic_size_keep_constant_trips() -> None:
    """Inside a parallel loop over the tiles of a symbolic size, the full tiles are set
    apart from the last, partial one: their unrolled rows keep a constant trip count (a
    register tile) instead of a guard that depends on the size."""
    k = kernel("Y[i, j] += A[i, k] * B[k, j]", A=("m", 16), B=(16, 32))
    schedule, (i0, i1) = T.split_named(initial_schedule(k), "i", [None, 4])
    schedule = T.reorder(schedule, i0, "k", i1, "j")
    schedule = T.vectorize(T.unroll(T.parallel(schedule, i0), i1), "j")
    text = explain(schedule)
    assert f"for (int {i1} = 0; ({i1} <= 3); {i1} += 1) {{  // unroll" in text, text
    native = NativeKernel(schedule)
    for m in (1, 4, 7, 13):
        inputs = native.random_inputs(seed=m, sizes={"m": m})
        np.testing.assert_allclose(
            native.outputs(inputs)["Y"], inputs["A"] @ inputs["B"], rtol=1e-5, atol=1e-5
        )


def test_a_symbolic_size_s_tiles_run_in_parallel_without_a_fused_modulo() -> None:
    """Rows of a symbolic size in tiles of registers: the parallel loop is the row tiles'
    alone. Fused with the column tiles, every tile would reach its rows through a modulo
    and keep the last tile's guard in its unrolled rows (no register tile)."""
    k = kernel("Y[b, i, j] += A[b, i, k] * B[k, j]", A=("batch", "seq", 64), B=(64, 256))
    schedule = default_schedule(k, DefaultConfig(threads=2), {"batch": 1, "seq": 128})
    parallel = [lp for lp, _ in schedule.loops() if lp.annotation == "parallel"]
    assert parallel
    for loop in parallel:
        values = [e.split("->")[-1].split(":")[0] for e in loop.exprs.values()]
        assert not any(mentions(v, "j") for v in values), loop.exprs
    assert re.search(r"\((i\w*) <= \d+\); \1 \+= 1\) \{  // unroll", explain(schedule))
