"""The prefetcher (`codegen.prefetch.Prefetcher`) as a collaborator of the loop emitter:
it emits through the `codegen.emission.Emitter` interface only, and a target that asks
for no prefetch gets code without any."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from llvmlite import ir

from polytile.codegen.emission import KernelState
from polytile.codegen.llvm_types import PTR, ModuleContext
from polytile.codegen.native import NativeKernel, build_part, random_inputs
from polytile.codegen.prefetch import Prefetcher
from polytile.codegen.target import Target, host
from polytile.poly.ast.build import AstExpr, For, build_ast
from polytile.poly.ast.check import verify_ast
from polytile.poly.dsl import kernel
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform import steps as T
from polytile.poly.transform.contract import private_temporaries

from natives import avx512_ir, inputs_for

WEIGHTS = np.random.default_rng(8).standard_normal((64, 64)).astype(np.float32)


def _gemm(weights: np.ndarray, parallel: bool, pack: bool = False) -> Schedule:
    """A register-tiled GEMM of 4 rows by constant `weights` (depth x 64), whose weight
    panel (depth x 16 floats; 4 KB for WEIGHTS) changes with each iteration of the outer
    loop: what `prefetch_next` asks ahead for when that loop is parallel. `pack` packs
    the weights' panels."""
    k = kernel("Y[j, i] += X[j, k] * W[k, i]", X=(4, weights.shape[0]), W=weights)
    steps: list[tuple[str, dict[str, object]]] = [("split", {"loop": "i", "factors": (None, 16)})]
    if pack:
        steps.append(("pack", {"tensor": "W", "axis": 1, "factor": 16}))
    steps += [
        ("reorder", {"order": ("i0", "k", "j", "i1")}),
        ("decompose_reduction", {"stmt": "Y", "loop": "k"}),
        ("vectorize", {"loop": "i1"}),
        ("unroll", {"loop": "j"}),
    ]
    if parallel:
        steps.append(("parallel", {"loop": "i0"}))
    return T.replay(k, [{"kind": kind, "args": args} for kind, args in steps])


def _target(**fields: object) -> Target:
    return replace(Target("skylake-avx512", "", host().triple, 512, num_threads=2), **fields)


def test_a_target_that_asks_for_no_prefetch_gets_none() -> None:
    """The same parallel register tile: with the next panel, the window and rows ahead
    all off, its IR holds no prefetch; with the defaults, it asks for lines. Values match
    numpy either way."""
    schedule = _gemm(WEIGHTS, parallel=True)
    off = _target(prefetch_weights=False, prefetch_panel=0, input_ahead=0, panel_ahead=False)
    assert "llvm.prefetch" not in build_part(schedule, off)[0]
    assert "llvm.prefetch" in build_part(schedule, _target())[0]
    inputs = random_inputs(schedule.kernel, 0)
    want = inputs["X"] @ WEIGHTS
    for target in (replace(host(), prefetch_weights=False, prefetch_panel=0), host()):
        got = NativeKernel(schedule, target)(inputs)["Y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


class _Function:
    """The smallest `Emitter`: a builder at the end of an empty function."""

    def __init__(self, schedule: Schedule, target: Target) -> None:
        module = ir.Module("m")
        self.mc = ModuleContext(module, target, threading=True)
        self.kernel = schedule.kernel
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * 3), name="f")
        self.ptrs = dict(zip(schedule.kernel.tensors, fn.args, strict=True))
        self.shift: dict[str, ir.Value] = {}
        self.enclosing: list[For] = []
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.state = KernelState(schedule, target)

    def int(self, e: AstExpr, env: dict[str, ir.Value]) -> ir.Value:
        raise AssertionError("no integer expression is needed")

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.state.shape(tensor)


def _parallel_loop(schedule: Schedule) -> For:
    stack = [build_ast(schedule)]
    while stack:
        node = stack.pop()
        if isinstance(node, For) and node.annotation == "parallel":
            return node
        stack.extend(getattr(node, "items", ()) or ())
        for name in ("body", "then", "orelse"):
            child = getattr(node, name, None)
            if child is not None:
                stack.append(child)
    raise AssertionError("no parallel loop")


def test_a_prefetcher_outside_a_window_emits_nothing() -> None:
    """Without a window (a target that neither fetches weights across kernels nor
    panels ahead), a parallel iteration's body is its inner body unchanged, a window
    step emits no instruction, and outside a parallel loop no reduction fetches the
    next iteration's constants."""
    schedule = _gemm(WEIGHTS, parallel=True)
    verify_ast(schedule)
    target = _target(prefetch_weights=False, panel_ahead=False)
    em = _Function(schedule, target)
    prefetcher = Prefetcher(em, em.state)
    assert not prefetcher.fetches_next()
    prefetcher.window_step()
    assert list(em.b.block.instructions) == []

    def inner(env: object) -> None:
        raise AssertionError("not run here")

    zero = ir.Constant(ir.IntType(64), 0)
    loop = _parallel_loop(schedule)
    assert prefetcher.parallel_body(loop, zero, zero, zero, inner) is inner
    assert list(em.b.block.instructions) == []
    assert prefetcher.window is None and not prefetcher.panel
    assert prefetcher.parallel == (loop.var, loop.loop, 1)
    # a reduction directly in the parallel iteration runs once per iteration: it fetches
    em.enclosing = [loop]
    assert prefetcher.fetches_next()


@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize(
    ("depth", "pack", "parallel", "panel", "fetched"),
    [
        (64, False, True, 1 << 16, True),
        (64, True, True, 1 << 16, True),
        (1100, True, True, 1 << 16, False),
        (1100, True, True, 1 << 17, True),
        (64, False, False, 1 << 16, False),
    ],
)
def test_the_next_parallel_iterations_weights_are_fetched_ahead(
    depth: int, pack: bool, parallel: bool, panel: int, fetched: bool, window: bool
) -> None:
    """A register tile reduction that reads a block of constant weights per iteration of
    the parallel loop asks for the next iteration's lines (into L2) while it computes;
    a panel above the target's `prefetch_panel` (1100 × 16 floats packed, 70 KB, against
    64 KB; not against 128 KB) and a serial loop nest are not prefetched. On a target
    that prefetches weights, every parallel one also asks for a line of the prefetch
    window (the model's next kernel's weights, locality 1) per reduction step; outside a
    model the window is empty (a line of its own). Values match the reference either way."""
    weights = np.random.default_rng(4).standard_normal((depth, 64)).astype(np.float32)
    schedule = _gemm(weights, parallel, pack)
    # (locality 2: the next iteration's weights; the prefetch window asks with 1)
    ir_text = avx512_ir(schedule, window, panel).replace('"', "")
    steps_asked = re.findall(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 1, i32 1\)", ir_text)
    assert bool(steps_asked) is (parallel and window)
    assert (
        bool(re.search(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 2, i32 1\)", ir_text)) is fetched
    )
    inputs = inputs_for(schedule.kernel)
    got = NativeKernel(schedule)(inputs)["Y"]
    assert got.shape == (4, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, inputs["X"] @ weights, rtol=1e-4, atol=1e-4)


#: a prefetch into L1 (locality 3), as `codegen.prefetch.Prefetcher` asks
ROW_AHEAD = re.compile(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 3, i32 1\)")


@pytest.mark.parametrize(
    ("constant", "row", "ahead", "asked"),
    [
        # a 1x1 conv over pixel vectors: a new row of the input (A) each channel, four
        # lines of it; the weights (W) are broadcast
        ("W", 64, 16, 4),
        ("W", 64, 0, 0),
        # rows of one line: still a new line a step
        ("W", 16, 16, 1),
        # the rows are constants: left to prefetch_next
        ("A", 64, 16, 0),
        # both computed: only A's rows (W is a broadcast)
        ("", 64, 16, 4),
    ],
)
def test_a_reduction_asks_for_its_input_rows_some_steps_ahead(
    constant: str, row: int, ahead: int, asked: int
) -> None:
    """`Target.input_ahead`: a register tile reduction that reads a vector from a new row
    of a computed tensor each step asks for the lines of the row `ahead` steps on, once
    per line (not once per unrolled copy that reads it); constants and broadcast scalars
    are not asked for. The last steps ask past the tensor's end, which a prefetch may;
    values match numpy with and without."""
    depth = 40
    rng = np.random.default_rng(5)
    # W's rows are a line long too, but it is read as scalars
    shapes = {"W": (depth, 16), "A": (depth, row)}
    arrays = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
    given = {n: arrays[n] if n == constant else shapes[n] for n in shapes}
    k = kernel("Y[j, i] += W[k, j] * A[k, i]", **given)
    steps: list[tuple[str, dict[str, object]]] = [
        ("split", {"loop": "i", "factors": (None, row)}),
        ("reorder", {"order": ("i0", "k", "j", "i1")}),
        ("decompose_reduction", {"stmt": "Y", "loop": "k"}),
        ("vectorize", {"loop": "i1"}),
        ("unroll", {"loop": "j"}),
    ]
    schedule = T.replay(k, [{"kind": kind, "args": args} for kind, args in steps])
    ir_text = avx512_ir(schedule, prefetch_weights=False, input_ahead=ahead).replace('"', "")
    assert len(ROW_AHEAD.findall(ir_text)) == asked
    inputs = inputs_for(k)
    values = {**arrays, **inputs}
    want = values["W"].T @ values["A"]
    for target in (replace(host(), input_ahead=16), replace(host(), input_ahead=0)):
        got = NativeKernel(schedule, target)(inputs)["Y"]
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_of_a_private_temporary_are_asked_for_in_the_threads_slice(threads: int) -> None:
    """A temporary computed per parallel tile (T, a slice of 32 × 16 per thread) is a
    computed tensor read a row a step: the reduction asks for its rows ahead (offsets
    moved to the running thread's slice, as its loads are); values match numpy."""
    weights = np.random.default_rng(6).standard_normal((8, 32)).astype(np.float32)
    k = kernel("T[k, i] = A[k, i] * 2", "C[j, i] += W[j, k] * T[k, i]", A=(32, 64), W=weights)
    steps = [
        ("split", {"loop": "i_1", "factors": (None, 16)}),
        ("reorder", {"order": ("i_10", "k_1", "j", "i_11")}),
        ("decompose_reduction", {"stmt": "C", "loop": "k_1"}),
        ("compute_at", {"stmt": "T", "loop": "i_10"}),
        ("vectorize", {"loop": "i_11"}),
        ("unroll", {"loop": "j"}),
        ("parallel", {"loop": "i_10"}),
    ]
    schedule = T.replay(k, [{"kind": kind, "args": args} for kind, args in steps])
    assert [p.tensor for p in private_temporaries(schedule)] == ["T"]
    ir_text = avx512_ir(schedule, prefetch_weights=False, input_ahead=16).replace('"', "")
    assert len(ROW_AHEAD.findall(ir_text)) == 1
    inputs = inputs_for(k)
    native = NativeKernel(schedule, replace(host(), input_ahead=16))
    native.set_threads(threads)
    got = native(inputs)["C"]
    assert got.shape == (8, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, weights @ (inputs["A"] * 2), rtol=1e-4, atol=1e-4)


#: a line of the window (locality 1) and a line of the next iteration's weights asked for
#: per load (`prefetch_next`, locality 2)
WINDOW_LINE = re.compile(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 1, i32 1\)")
NEXT_LINE = re.compile(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 2, i32 1\)")


@pytest.mark.parametrize(
    ("stencil", "panel_ahead", "l2_bytes", "window"),
    [
        (True, True, 1 << 20, True),
        (True, False, 1 << 20, False),
        # a 1x1 reduction (4 KB panels) reads its panel in order: left to prefetch_next
        (False, True, 1 << 20, False),
        # activations (X 8.5 KB, Y 8 KB) and two 12 KB panels pass a 32 KB L2
        (True, True, 1 << 15, False),
    ],
)
def test_a_stencil_reduction_fetches_the_next_iterations_weight_panel(
    stencil: bool, panel_ahead: bool, l2_bytes: int, window: bool
) -> None:
    """`Target.panel_ahead`: a parallel iteration of a stencil reduction (a 1-D conv of
    width 3 over 64 channels; its weights packed in panels of 16 output channels, 12 KB
    each) asks for the next iteration's panel a line per reduction step, and no longer
    per load (`prefetch_next`). Not for a 1x1 reduction, nor where the kernel's
    activations and two panels pass L2. Values match numpy on one and two threads."""
    width = 3 if stencil else 1
    weights = np.random.default_rng(7).standard_normal((64, 64, width)).astype(np.float32)
    if stencil:
        k = kernel("Y[m, o] += W[m, c, r] * X[c, o + r]", X=(64, 34), W=weights, extents={"o": 32})
        order = ("m0", "o0", "c", "r", "o1", "m1")
    else:
        k = kernel("Y[m, o] += W[m, c] * X[c, o]", X=(64, 32), W=weights[:, :, 0])
        order = ("m0", "o0", "c", "o1", "m1")
    steps = [
        ("split", {"loop": "m", "factors": (None, 16)}),
        ("pack", {"tensor": "W", "axis": 0, "factor": 16}),
        ("split", {"loop": "o", "factors": (None, 8)}),
        ("reorder", {"order": order}),
        ("decompose_reduction", {"stmt": "Y", "loop": "c"}),
        ("vectorize", {"loop": "m1"}),
        ("unroll", {"loop": "o1"}),
        ("parallel", {"loop": "m0"}),
    ]
    schedule = T.replay(k, [{"kind": kind, "args": args} for kind, args in steps])
    ir_text = avx512_ir(
        schedule, prefetch_weights=False, panel_ahead=panel_ahead, l2_bytes=l2_bytes
    ).replace('"', "")
    assert len(WINDOW_LINE.findall(ir_text)) == (1 if window else 0)
    assert len(NEXT_LINE.findall(ir_text)) == (0 if window else 1)
    inputs = inputs_for(k)
    rows = np.lib.stride_tricks.sliding_window_view(inputs["X"], width, axis=1)
    want = np.einsum("mcr,cor->mo", weights, rows)
    for threads in (1, 2):
        native = NativeKernel(schedule, replace(host(), panel_ahead=panel_ahead))
        native.set_threads(threads)
        got = native(inputs)["Y"]
        assert got.shape == (64, 32) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
