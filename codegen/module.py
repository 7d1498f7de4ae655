"""A whole model as one LLVM module: its kernel functions plus an entry function

    void <entry>(ptr inputs, ptr outputs, ptr constants, ptr arena)

that calls the kernels in order, each tensor argument resolved to a slot: an input or
output pointer from the caller's tables, a constant from the constants table, or an
offset into the workspace arena (see `plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llvmlite import ir

from polytile.poly.ast import AstNode
from polytile.poly.ast_check import verify_ast
from polytile.poly.schedule import Schedule

from .kernel import KernelFunction, emit_kernel
from .llvm_types import I64, PTR, ModuleContext
from .target import Target, openmp_library

SLOT_KINDS = ("input", "output", "constant", "arena")

#: constants smaller than this are not prefetched for the next call (they are few lines)
PREFETCH_MIN_BYTES = 1 << 16


@dataclass(frozen=True)
class Slot:
    kind: str
    #: table index (input / output / constant) or byte offset (arena)
    index: int

    def to_json(self) -> list[object]:
        return [self.kind, self.index]


@dataclass(frozen=True)
class KernelCall:
    function: str
    args: tuple[Slot, ...]
    #: the workload key of the call's kernel (what tuning records are keyed by; empty in
    #: models saved before it was kept)
    workload: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "function": self.function,
            "args": [a.to_json() for a in self.args],
            "workload": self.workload,
        }

    @staticmethod
    def from_json(data: dict) -> KernelCall:
        return KernelCall(
            str(data["function"]),
            tuple(Slot(str(k), int(i)) for k, i in data["args"]),
            str(data.get("workload", "")),
        )


def new_module(name: str, target: Target, defines_runtime: bool = True) -> ModuleContext:
    """A module; only the entry module defines the runtime's globals."""
    return ModuleContext(ir.Module(name), target, openmp_library() is not None, defines_runtime)


def runtime_module(target: Target) -> ModuleContext:
    """The module defining the runtime's globals (the thread count), for code built
    without an entry function."""
    mc = new_module("polytile_runtime", target)
    mc.num_threads()
    mc.prefetch_window()
    return mc


def kernel_module(
    schedule: Schedule,
    name: str,
    target: Target,
    verify: bool = True,
    ast: AstNode | None = None,
) -> tuple[ModuleContext, KernelFunction]:
    """A module of its own for one kernel function, so kernels compile in parallel. The
    schedule's AST is first checked to run every instance exactly once (`verify=False`
    when the caller has checked it; `ast`: the one it checked, so it is not rebuilt)."""
    if verify:
        ast = verify_ast(schedule, ast)
    mc = new_module(name, target, defines_runtime=False)
    return mc, emit_kernel(mc, schedule, name, ast)


def add_entry(
    mc: ModuleContext,
    name: str,
    calls: Sequence[KernelCall],
    arity: Mapping[str, int],
    constant_bytes: Sequence[int] = (),
) -> None:
    """The entry function; `arity` gives each kernel function's argument count (kernels
    live in other modules and are declared here). With `constant_bytes` (each constant's
    size), on a target that prefetches weights, each call's parallel iterations prefetch
    the next call's largest constant."""
    fn = ir.Function(mc.module, ir.FunctionType(ir.VoidType(), [PTR] * 4), name=name)
    tables = dict(zip(("input", "output", "constant"), fn.args[:3], strict=True))
    arena = fn.args[3]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    window_at, window_lines = mc.prefetch_window()  # defined here either way
    targets = prefetch_targets(calls, constant_bytes) if mc.target.prefetch_weights else None
    for step, call in enumerate(calls):
        ahead = targets[step] if targets is not None else None
        if targets is not None and ahead is None:
            # an empty window at the last one's start (a valid line)
            b.store(ir.Constant(I64, 0), window_lines)
        elif ahead is not None:
            at = b.gep(
                tables["constant"], [ir.Constant(I64, ahead)], inbounds=True, source_etype=PTR
            )
            b.store(b.load(at, typ=PTR), window_at)
            b.store(ir.Constant(I64, constant_bytes[ahead] // 64), window_lines)
        callee = mc.function(call.function, ir.VoidType(), [PTR] * arity[call.function])
        args = []
        for slot in call.args:
            if slot.kind == "arena":
                args.append(
                    b.gep(
                        arena,
                        [ir.Constant(I64, slot.index)],
                        inbounds=True,
                        source_etype=ir.IntType(8),
                    )
                )
            else:
                at = b.gep(
                    tables[slot.kind],
                    [ir.Constant(I64, slot.index)],
                    inbounds=True,
                    source_etype=PTR,
                )
                args.append(b.load(at, typ=PTR))
        b.call(callee, args)
    if targets is not None:
        b.store(ir.Constant(I64, 0), window_lines)
    b.ret_void()
    mc.num_threads()  # always present, so the runtime can set it


def prefetch_targets(
    calls: Sequence[KernelCall], constant_bytes: Sequence[int]
) -> list[int | None]:
    """For each call, the constant its parallel iterations fetch ahead: the next call's
    largest, from `PREFETCH_MIN_BYTES` on. A model's weights come from memory once per
    inference while most kernels leave memory idle as they compute: ResNet-50's calls
    took 4-6% less time in all with their weights read just before them, and with this
    window the model 0.977 instead of 1.016× onnxruntime's time (tuned; default
    schedules 1.118 instead of 1.205×). Asked for all at once per parallel iteration
    instead of a line per step, the lines gained nothing (dropped requests, likely)."""

    def target(call: KernelCall) -> int | None:
        sizes = [
            (constant_bytes[s.index], s.index)
            for s in call.args
            if s.kind == "constant" and s.index < len(constant_bytes)
        ]
        size, index = max(sizes, default=(0, None))
        return index if size >= PREFETCH_MIN_BYTES else None

    # the last call prefetches nothing
    return [target(after) for after in calls[1:]] + [None] * min(1, len(calls))
