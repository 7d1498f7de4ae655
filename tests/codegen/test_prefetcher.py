"""The prefetcher (`codegen.prefetch.Prefetcher`) as a collaborator of the loop emitter:
it emits through the `codegen.emission.Emitter` interface only, and a target that asks
for no prefetch gets code without any."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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

WEIGHTS = np.random.default_rng(8).standard_normal((64, 64)).astype(np.float32)


def _gemm(parallel: bool) -> Schedule:
    """A register-tiled GEMM whose weight panel (64 x 16 floats, 4 KB) changes with each
    iteration of the outer loop: what `prefetch_next` asks ahead for when that loop is
    parallel."""
    k = kernel("Y[j, i] += X[j, k] * W[k, i]", X=(4, 64), W=WEIGHTS)
    steps = [
        ("split", {"loop": "i", "factors": (None, 16)}),
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
    schedule = _gemm(parallel=True)
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
    schedule = _gemm(parallel=True)
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
