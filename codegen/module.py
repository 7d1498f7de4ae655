"""A whole model as one LLVM module: its kernel functions plus an entry function

    void <entry>(ptr inputs, ptr outputs, ptr constants, ptr arena)

that calls the kernels in order, each tensor argument resolved to a slot: an input or
output pointer from the caller's tables, a constant from the constants table, or an
offset into the workspace arena (see `plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llvmlite import ir

from polytile.poly.ast_check import verify_ast
from polytile.poly.schedule import Schedule

from .kernel import KernelFunction, emit_kernel
from .llvm_types import I64, PTR, ModuleContext
from .target import Target, openmp_library

SLOT_KINDS = ("input", "output", "constant", "arena")


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
    return mc


def kernel_module(
    schedule: Schedule, name: str, target: Target, verify: bool = True
) -> tuple[ModuleContext, KernelFunction]:
    """A module of its own for one kernel function, so kernels compile in parallel. The
    schedule's AST is first checked to run every instance exactly once (`verify=False`
    when the caller has checked it)."""
    if verify:
        verify_ast(schedule)
    mc = new_module(name, target, defines_runtime=False)
    return mc, emit_kernel(mc, schedule, name)


def add_entry(
    mc: ModuleContext, name: str, calls: Sequence[KernelCall], arity: Mapping[str, int]
) -> None:
    """The entry function; `arity` gives each kernel function's argument count (kernels
    live in other modules and are declared here)."""
    fn = ir.Function(mc.module, ir.FunctionType(ir.VoidType(), [PTR] * 4), name=name)
    tables = dict(zip(("input", "output", "constant"), fn.args[:3], strict=True))
    arena = fn.args[3]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    for call in calls:
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
    b.ret_void()
    mc.num_threads()  # always present, so the runtime can set it
