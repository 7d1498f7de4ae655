"""A whole model as one LLVM module: its kernel functions plus an entry function

    i32 <entry>(ptr inputs, ptr outputs, ptr constants, ptr arena[, ptr dynamic])

that calls the kernels in order, each tensor argument resolved to a slot: an input or
output pointer from the caller's tables, a constant from the constants table, or an
offset into the workspace arena (see `plan`). A model compiled for all sizes takes a
fifth argument, an i64 table holding the sizes of the run, then the arena offsets the
memory plan gives at those sizes (`codegen.dynamic`): its arena slots are `dynamic`
(the offset is the table's entry) and each call passes its kernel's sizes from it.

Before a kernel that reads indices from a run-time tensor (Gather, Scatter, ...), the
entry scans that tensor once (`IndexCheck`): a value outside [-n, n-1] of the axis it
indexes stops the run before any kernel reads through it. The entry then stores the
position and the value in the globals `FAULT` and returns the check's number plus one;
it returns 0 when every check passed. The scan is one pass over the index tensor,
outside the kernels' loops."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llvmlite import ir

from polytile.poly.ast.build import AstNode
from polytile.poly.ast.check import verify_ast
from polytile.poly.ir.schedule import Schedule

from .kernel import KernelFunction, emit_kernel
from .llvm_types import I1, I32, I64, PTR, ModuleContext, memory_type
from .target import Target, openmp_library

SLOT_KINDS = ("input", "output", "constant", "arena", "dynamic")

#: the globals where the entry leaves a failed check's position and value (i64 each)
FAULT = ("polytile_fault_position", "polytile_fault_value")

#: constants smaller than this are not prefetched for the next call (they are few lines)
PREFETCH_MIN_BYTES = 1 << 16


@dataclass(frozen=True)
class Slot:
    kind: str
    #: table index (input / output / constant / dynamic: the entry holding the arena
    #: offset) or byte offset (arena)
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
    #: the entries of the dynamic table holding its kernel's sizes, in argument order
    sizes: tuple[int, ...] = ()

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "function": self.function,
            "args": [a.to_json() for a in self.args],
            "workload": self.workload,
        }
        if self.sizes:
            data["sizes"] = list(self.sizes)
        return data

    @staticmethod
    def from_json(data: dict) -> KernelCall:
        return KernelCall(
            str(data["function"]),
            tuple(Slot(str(k), int(i)) for k, i in data["args"]),
            str(data.get("workload", "")),
            tuple(int(i) for i in data.get("sizes", ())),
        )


@dataclass(frozen=True)
class IndexCheck:
    """Before call `step`, the index tensor at `slot` (`dtype`, `shape`) must hold values
    in [-n, n-1], n cycling over `sizes` along its last axis (one size: every value).
    `node`, `input`, `data` and `axis` name the indexing node, its index input and the
    (first) axis its values index, for the error message."""

    step: int
    slot: Slot
    dtype: str
    shape: tuple[int | str, ...]
    sizes: tuple[int | str, ...]
    node: str
    input: str
    data: str
    axis: int
    #: with symbolic sizes, the dynamic table's entry holding the element count, which
    #: the bounds follow (`shape` and `sizes` then hold isl texts); -1: none
    count_entry: int = -1

    @property
    def count(self) -> int:
        total = 1
        for d in self.shape:
            total *= d  # type: ignore[assignment]
        return total

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "slot": self.slot.to_json(),
            "dtype": self.dtype,
            "shape": list(self.shape),
            "sizes": list(self.sizes),
            "node": self.node,
            "input": self.input,
            "data": self.data,
            "axis": self.axis,
            **({"count_entry": self.count_entry} if self.count_entry >= 0 else {}),
        }

    @staticmethod
    def from_json(data: dict) -> IndexCheck:
        kind, index = data["slot"]
        return IndexCheck(
            int(data["step"]),
            Slot(str(kind), int(index)),
            str(data["dtype"]),
            tuple(d if isinstance(d, str) else int(d) for d in data["shape"]),
            tuple(n if isinstance(n, str) else int(n) for n in data["sizes"]),
            str(data["node"]),
            str(data["input"]),
            str(data["data"]),
            int(data["axis"]),
            int(data.get("count_entry", -1)),
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
    checks: Sequence[IndexCheck] = (),
    dynamic: bool = False,
) -> None:
    """The entry function; `arity` gives each kernel function's tensor argument count
    (kernels live in other modules and are declared here). With `constant_bytes` (each
    constant's size), on a target that prefetches weights, each call's parallel
    iterations prefetch the next call's largest constant. `checks` run before the calls
    they name; the entry returns 0, or the number of the failed check plus one.
    `dynamic`: the entry takes the dynamic table (a model compiled for all sizes)."""
    arguments = [PTR] * (5 if dynamic else 4)
    fn = ir.Function(mc.module, ir.FunctionType(I32, arguments), name=name)
    tables = dict(zip(("input", "output", "constant"), fn.args[:3], strict=True))
    arena = fn.args[3]
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def entry(index: int) -> ir.Value:
        """Entry `index` of the dynamic table (a size or an arena offset)."""
        at = b.gep(fn.args[4], [ir.Constant(I64, index)], inbounds=True, source_etype=I64)
        return b.load(at, typ=I64)
    window_at, window_lines = mc.prefetch_window()  # defined here either way
    targets = prefetch_targets(calls, constant_bytes) if mc.target.prefetch_weights else None

    def pointer(slot: Slot) -> ir.Value:
        if slot.kind in ("arena", "dynamic"):
            offset = ir.Constant(I64, slot.index) if slot.kind == "arena" else entry(slot.index)
            return b.gep(arena, [offset], inbounds=True, source_etype=ir.IntType(8))
        at = b.gep(
            tables[slot.kind], [ir.Constant(I64, slot.index)], inbounds=True, source_etype=PTR
        )
        return b.load(at, typ=PTR)

    fault = _fault_globals(mc) if checks else None
    for step, call in enumerate(calls):
        for number, check in enumerate(checks):
            if check.step == step:
                assert fault is not None
                table = None
                if check.count_entry >= 0:  # its count, then its bounds, in the table
                    table = b.gep(
                        fn.args[4], [ir.Constant(I64, check.count_entry)], source_etype=I64
                    )
                _emit_check(mc, b, fn, number, check, pointer(check.slot), fault, table)
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
        signature = [PTR] * arity[call.function] + [I64] * len(call.sizes)
        callee = mc.function(call.function, ir.VoidType(), signature)
        b.call(callee, [*(pointer(slot) for slot in call.args), *map(entry, call.sizes)])
    if targets is not None:
        b.store(ir.Constant(I64, 0), window_lines)
    b.ret(ir.Constant(I32, 0))
    mc.num_threads()  # always present, so the runtime can set it


def _fault_globals(mc: ModuleContext) -> tuple[ir.GlobalVariable, ...]:
    found = []
    for name in FAULT:
        fault = ir.GlobalVariable(mc.module, I64, name=name)
        fault.initializer = ir.Constant(I64, 0)
        found.append(fault)
    return tuple(found)


def _emit_check(
    mc: ModuleContext,
    b: ir.IRBuilder,
    fn: ir.Function,
    number: int,
    check: IndexCheck,
    data: ir.Value,
    fault: tuple[ir.GlobalVariable, ...],
    table: ir.Value | None = None,
) -> None:
    """if ((pos = scan(data)) >= 0) { FAULT = {pos, data[pos]}; return number + 1; }
    (`table`: where the dynamic table holds the count, then the bounds, of a check of
    symbolic sizes)"""
    scan = _scan_function(mc, check.dtype)
    sizes: ir.Value
    if table is None:
        bounds = ir.GlobalVariable(
            mc.module, ir.ArrayType(I64, len(check.sizes)), name=f"polytile_bounds{number}"
        )
        bounds.initializer = ir.Constant(
            bounds.value_type, [ir.Constant(I64, n) for n in check.sizes]
        )
        bounds.global_constant = True
        bounds.linkage = "private"
        sizes, count = bounds, ir.Constant(I64, check.count)
    else:
        count = b.load(table, typ=I64)
        sizes = b.gep(table, [ir.Constant(I64, 1)], source_etype=I64)
    period = ir.Constant(I64, len(check.sizes))
    position = b.call(scan, [data, count, period, sizes])
    failed = b.icmp_signed(">=", position, ir.Constant(I64, 0))
    with b.if_then(failed, likely=False):
        element = memory_type(check.dtype)
        at = b.gep(data, [position], inbounds=True, source_etype=element)
        value = b.sext(b.load(at, typ=element), I64) if element.width < 64 else b.load(at, typ=I64)
        for where, item in zip(fault, (position, value), strict=True):
            b.store(item, where)
        b.ret(ir.Constant(I32, number + 1))


def _scan_function(mc: ModuleContext, dtype: str) -> ir.Function:
    """i64 scan(ptr data, i64 count, i64 period, ptr sizes): the first position whose
    value v has not -n <= v < n (n = sizes[position mod period]), or -1. Defined once
    per index dtype in the entry module."""
    name = f"polytile_index_scan_{dtype}"
    found = mc.module.globals.get(name)
    if found is not None:
        return found
    fn = ir.Function(mc.module, ir.FunctionType(I64, [PTR, I64, I64, PTR]), name=name)
    fn.linkage = "private"
    data, count, period, sizes = fn.args
    element = memory_type(dtype)
    entry = fn.append_basic_block("entry")
    head = fn.append_basic_block("head")
    body = fn.append_basic_block("body")
    bad = fn.append_basic_block("bad")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, "i")
    c = b.phi(I64, "c")
    i.add_incoming(ir.Constant(I64, 0), entry)
    c.add_incoming(ir.Constant(I64, 0), entry)
    b.cbranch(b.icmp_signed("<", i, count), body, done)
    b.position_at_end(body)
    raw = b.load(b.gep(data, [i], inbounds=True, source_etype=element), typ=element)
    value = b.sext(raw, I64) if element.width < 64 else raw
    n = b.load(b.gep(sizes, [c], inbounds=True, source_etype=I64), typ=I64)
    low = b.icmp_signed("<", value, b.neg(n))
    high = b.icmp_signed(">=", value, n)
    outside: ir.Value = b.or_(low, high)
    assert outside.type == I1
    following = b.add(i, ir.Constant(I64, 1))
    step = b.add(c, ir.Constant(I64, 1))
    wrapped = b.select(b.icmp_signed("==", step, period), ir.Constant(I64, 0), step)
    i.add_incoming(following, body)
    c.add_incoming(wrapped, body)
    b.cbranch(outside, bad, head)
    b.position_at_end(bad)
    b.ret(i)
    b.position_at_end(done)
    b.ret(ir.Constant(I64, -1))
    return fn


def prefetch_targets(
    calls: Sequence[KernelCall], constant_bytes: Sequence[int]
) -> list[int | None]:
    """For each call, the constant its parallel iterations fetch ahead: the next call's
    largest, from `PREFETCH_MIN_BYTES` on. A model's weights come from memory once per
    inference while most kernels leave memory idle as they compute, so reading them
    during the call before shortens the model (see benchmarks/results/models-*.md).
    Asked for all at once per parallel iteration instead of a line per step, the lines
    gained nothing (dropped requests, likely)."""

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
