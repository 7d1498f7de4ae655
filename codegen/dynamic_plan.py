"""The memory plan of a model compiled for all sizes as native code, for a C caller of an
exported library (who has no Python to run `DynamicPlan.table`).

The greedy planner (`plan.plan_memory`) cannot be written as one expression of the sizes,
so the library places tensors in a few fixed orders chosen here once (`placement`) and
keeps the one needing the fewest bytes: in an order, each owner of bytes (a tensor not
taking over another's, `DynamicPlan.shared`) starts at the highest end of the earlier
owners whose lifetimes overlap its own. That is valid at every size, and at sizes where
an order is the greedy plan's order by offset it needs no more than the greedy plan.
Byte counts are products of extents (numbers and `Dim` or isl texts over the sizes,
floor divisions included), emitted with overflow checks.

The library's functions (see `CompiledModel.export_library` for the C signatures):
`polytile_plan` fills the dynamic table and returns the arena bytes, or a negative
error; `polytile_input_shape` and `polytile_output_shape` give a tensor's shape from a
filled table; the globals `polytile_table_length` and `polytile_num_sizes` size the
caller's arrays.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llvmlite import ir

from polytile.errors import CodegenError
from polytile.frontend.symbolic import MAX_DIM
from polytile.poly.ir.kernel import Extent

from .dynamic import DynamicPlan
from .llvm_types import I1, I32, I64, PTR
from .plan import ALIGN, Lifetime, plan_memory

#: each named size at these values, clipped to its bounds, when choosing the order
SAMPLE_SIZES = (1, 7, 64, 512)
PLAN = "polytile_plan"
INPUT_SHAPE = "polytile_input_shape"
OUTPUT_SHAPE = "polytile_output_shape"
TABLE_LENGTH = "polytile_table_length"
NUM_SIZES = "polytile_num_sizes"


@dataclass(frozen=True)
class Placement:
    """Fixed placing orders of a dynamic plan's arena: at given sizes, the library places
    the tensors in each and keeps the one needing the fewest bytes (the first on ties)."""

    #: each order: the owners of bytes in placing order
    orders: tuple[tuple[str, ...], ...]
    #: per order, per owner, the earlier-placed owners whose lifetimes overlap its own
    below: tuple[Mapping[str, tuple[str, ...]], ...]
    #: every arena tensor → the owner of its bytes (itself, or whom it takes over)
    owner: Mapping[str, str]

    def place(self, nbytes: Mapping[str, int]) -> tuple[dict[str, int], int]:
        """Every tensor's offset and the arena bytes, given each owner's byte count: the
        computation `polytile_plan` makes, in Python."""
        best: tuple[dict[str, int], int] = ({t: 0 for t in self.owner}, 0)
        for number, (order, below) in enumerate(zip(self.orders, self.below, strict=True)):
            start: dict[str, int] = {}
            end: dict[str, int] = {}
            for name in order:
                start[name] = max((end[b] for b in below[name]), default=0)
                end[name] = start[name] + _aligned(max(nbytes[name], 1))
            arena = max(end.values(), default=0)
            if number == 0 or arena < best[1]:
                best = {t: start[o] for t, o in self.owner.items()}, arena
        return best


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _groups(plan: DynamicPlan) -> tuple[dict[str, str], dict[str, tuple[int, int]]]:
    """Each tensor's owner and each owner's lifetime (the union of its sharers'), as
    `plan.plan_memory` groups them."""
    owner = {}
    for t in plan.arena:
        name = t.name
        while name in plan.shared:
            name = plan.shared[name]
        owner[t.name] = name
    life: dict[str, tuple[int, int]] = {}
    for t in plan.arena:
        first, last = life.get(owner[t.name], (t.first, t.last))
        life[owner[t.name]] = (min(first, t.first), max(last, t.last))
    return owner, life


def _below(life: Mapping[str, tuple[int, int]], order: Sequence[str]) -> dict[str, tuple]:
    """Per owner, the earlier ones in `order` whose lifetimes overlap its own."""
    return {
        name: tuple(
            b for b in order[:i] if life[b][0] <= life[name][1] and life[name][0] <= life[b][1]
        )
        for i, name in enumerate(order)
    }


def _owner_bytes(plan: DynamicPlan, values: Mapping[str, int]) -> dict[str, int]:
    owner, _ = _groups(plan)
    return {t.name: t.nbytes(values) for t in plan.arena if owner[t.name] == t.name}


def placement(plan: DynamicPlan) -> Placement:
    """The placing orders for every size: the greedy plans' orders (by offset) at a few
    sample sizes within the bounds. At each of those sizes the library then needs no
    more bytes than the greedy plan: placed in its order, each tensor starts at or below
    its greedy offset."""
    owner, life = _groups(plan)
    orders: list[tuple[str, ...]] = []
    for value in SAMPLE_SIZES:
        named = {n: min(max(value, lo), hi) for n, (lo, hi) in bounds(plan).items()}
        nbytes = _owner_bytes(plan, plan.values(named))
        greedy = plan_memory({n: Lifetime(nbytes[n], *life[n]) for n in nbytes})
        order = tuple(sorted(nbytes, key=lambda n: (greedy.offsets[n], life[n], n)))
        if order not in orders:
            orders.append(order)
    return Placement(tuple(orders), tuple(_below(life, o) for o in orders), owner)


def bounds(plan: DynamicPlan) -> dict[str, tuple[int, int]]:
    """Each named size's bounds: the plan's, else those every symbolic size has."""
    return {n: tuple(plan.bounds.get(n, (1, MAX_DIM))) for n in plan.named}  # type: ignore[misc]


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise CodegenError(f"cannot read the size {text!r} to compute it in C") from None


class _Sizes:
    """Emits the value of extents over the sizes in `values` (named, then derived ones):
    integers of Python's `Dim` texts or isl's quasi-affine ones, with floor division
    rounding down as both do. Each add and multiply records whether it overflowed."""

    def __init__(self, b: ir.IRBuilder, values: dict[str, ir.Value]) -> None:
        self.b = b
        self.values = values
        self.overflow: ir.Value = ir.Constant(I1, 0)

    def extent(self, extent: Extent) -> ir.Value:
        if isinstance(extent, int):
            return ir.Constant(I64, extent)
        if extent in self.values:
            return self.values[extent]
        return self._expr(_parsed(extent), extent)

    def checked(self, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
        result = getattr(self.b, f"{op}_with_overflow")(x, y)
        self.overflow = self.b.or_(self.overflow, self.b.extract_value(result, 1))
        return self.b.extract_value(result, 0)

    def product(self, extents: Sequence[Extent], scale: int = 1) -> ir.Value:
        total: ir.Value = ir.Constant(I64, scale)
        for d in extents:
            total = self.checked("smul", total, self.extent(d))
        return total

    def floordiv(self, x: ir.Value, y: ir.Value) -> ir.Value:
        b = self.b
        q, r = b.sdiv(x, y), b.srem(x, y)
        zero = ir.Constant(I64, 0)
        signs = b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero))
        down = b.and_(b.icmp_signed("!=", r, zero), signs)
        return b.sub(q, b.zext(down, I64))

    def _expr(self, node: ast.expr, text: str) -> ir.Value:
        b = self.b
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return ir.Constant(I64, node.value)
        if isinstance(node, ast.Name) and node.id in self.values:
            return self.values[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = self._expr(node.operand, text)
            return self.checked("ssub", ir.Constant(I64, 0), value) if isinstance(
                node.op, ast.USub
            ) else value  # fmt: skip
        if _rounded(node):  # isl's floor(x/d), and ceil(x/d) = -floor(-x/d)
            arg = node.args[0]  # type: ignore[attr-defined]
            x, y = self._expr(arg.left, text), self._divisor(arg.right, text)
            if node.func.id == "floor":  # type: ignore[attr-defined]
                return self.floordiv(x, y)
            negated = self.checked("ssub", ir.Constant(I64, 0), x)
            return b.sub(ir.Constant(I64, 0), self.floordiv(negated, y))
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.FloorDiv | ast.Mod):
                x, y = self._expr(node.left, text), self._divisor(node.right, text)
                q = self.floordiv(x, y)
                return q if isinstance(node.op, ast.FloorDiv) else b.sub(x, b.mul(q, y))
            ops = {ast.Add: "sadd", ast.Sub: "ssub", ast.Mult: "smul"}
            op = ops.get(type(node.op))
            if op is not None:
                return self.checked(op, self._expr(node.left, text), self._expr(node.right, text))
        raise CodegenError(f"cannot compute the size {text!r} in C: {ast.unparse(node)!r}")

    def _divisor(self, node: ast.expr, text: str) -> ir.Value:
        """A division's divisor: a constant other than 0 (what sizes divide by)."""
        value = self._expr(node, text)
        if not isinstance(value, ir.Constant) or not value.constant:
            raise CodegenError(f"cannot compute the size {text!r} in C: it divides by a size")
        return value


def _rounded(node: ast.expr) -> bool:
    """Whether the node is isl's `floor(x/d)` or `ceil(x/d)`."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("floor", "ceil")
        and len(node.args) == 1
        and isinstance(node.args[0], ast.BinOp)
        and isinstance(node.args[0].op, ast.Div)
    )


def _max(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _at(b: ir.IRBuilder, array: ir.Value, index: int) -> ir.Value:
    return b.gep(array, [ir.Constant(I64, index)], inbounds=True, source_etype=I64)


def _global(module: ir.Module, name: str, value: int) -> None:
    g = ir.GlobalVariable(module, I64, name=name)
    g.initializer = ir.Constant(I64, value)
    g.global_constant = True


def plan_module(
    plan: DynamicPlan,
    inputs: Sequence[tuple[int | str, ...]],
    outputs: Sequence[tuple[int | str, ...]],
) -> ir.Module:
    """The library's planning functions and globals for this plan, the inputs' and the
    outputs' shapes (numbers and `Dim` texts over the named sizes)."""
    module = ir.Module(name="polytile_plan")
    _global(module, TABLE_LENGTH, plan.table_length)
    _global(module, NUM_SIZES, len(plan.named))
    _plan_function(module, plan)
    for name, shapes in ((INPUT_SHAPE, inputs), (OUTPUT_SHAPE, outputs)):
        _shape_function(module, name, plan, shapes)
    return module


def _plan_function(module: ir.Module, plan: DynamicPlan) -> None:
    """`int64_t polytile_plan(const int64_t *sizes, int64_t *table)`: -1 - i when named
    size i is outside its bounds, -1 - (the number of sizes) when a byte count overflows,
    else the table filled and the arena bytes returned."""
    fn = ir.Function(module, ir.FunctionType(I64, [PTR, PTR]), name=PLAN)
    given, table = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    values: dict[str, ir.Value] = {}
    error: ir.Value = ir.Constant(I64, 0)
    limits = bounds(plan)
    for i in reversed(range(len(plan.named))):  # the first size out of bounds is named
        name = plan.named[i]
        value = values[name] = b.load(_at(b, given, i), typ=I64)
        lo, hi = (ir.Constant(I64, v) for v in limits[name])
        bad = b.or_(b.icmp_signed("<", value, lo), b.icmp_signed(">", value, hi))
        error = b.select(bad, ir.Constant(I64, -1 - i), error)
    fail = fn.append_basic_block("fail")
    body = fn.append_basic_block("body")
    b.cbranch(b.icmp_signed("!=", error, ir.Constant(I64, 0)), fail, body)
    b.position_at_end(fail)
    b.ret(error)
    b.position_at_end(body)
    sizes = _Sizes(b, values)
    for name, text in plan.derived.items():
        values[name] = sizes.extent(text)
    entries = [values[n] for n in plan.sizes]
    fixed = placement(plan)
    tensors = {t.name: t for t in plan.arena}
    nbytes: dict[str, ir.Value] = {}
    for name in fixed.orders[0]:
        t = tensors[name]
        size = _max(b, sizes.product(t.shape, t.itemsize), ir.Constant(I64, 1))
        size = sizes.checked("sadd", size, ir.Constant(I64, ALIGN - 1))
        nbytes[name] = b.and_(size, ir.Constant(I64, -ALIGN))
    best: dict[str, ir.Value] = {}
    arena: ir.Value = ir.Constant(I64, 0)
    for number, (order, below) in enumerate(zip(fixed.orders, fixed.below, strict=True)):
        start: dict[str, ir.Value] = {}
        end: dict[str, ir.Value] = {}
        total: ir.Value = ir.Constant(I64, 0)
        for name in order:
            at: ir.Value = ir.Constant(I64, 0)
            for other in below[name]:
                at = _max(b, at, end[other])
            start[name], end[name] = at, sizes.checked("sadd", at, nbytes[name])
            total = _max(b, total, end[name])
        if number == 0:
            best, arena = start, total
        else:  # the fewest bytes win, the earlier order on ties
            fewer = b.icmp_signed("<", total, arena)
            best = {n: b.select(fewer, start[n], best[n]) for n in order}
            arena = b.select(fewer, total, arena)
    entries += [best[fixed.owner[t.name]] for t in plan.arena]
    for shape, limits_of in plan.counted:
        entries.append(sizes.product(shape))
        entries += [sizes.extent(d) for d in limits_of]
    for index, value in enumerate(entries):
        b.store(value, _at(b, table, index))
    b.ret(b.select(sizes.overflow, ir.Constant(I64, -1 - len(plan.named)), arena))


def _shape_function(
    module: ir.Module, name: str, plan: DynamicPlan, shapes: Sequence[tuple[int | str, ...]]
) -> None:
    """`int32_t <name>(int32_t index, const int64_t *table, int64_t *dims)`: tensor
    `index`'s shape at the sizes of a filled table, in `dims`; its rank, or -1 for no
    such tensor."""
    fn = ir.Function(module, ir.FunctionType(I32, [I32, PTR, PTR]), name=name)
    index, table, dims = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    values = {n: b.load(_at(b, table, i), typ=I64) for i, n in enumerate(plan.sizes)}
    missing = fn.append_basic_block("missing")
    switch = b.switch(index, missing)
    for number, shape in enumerate(shapes):
        block = fn.append_basic_block(f"tensor{number}")
        switch.add_case(ir.Constant(I32, number), block)
        b.position_at_end(block)
        sizes = _Sizes(b, values)
        for axis, d in enumerate(shape):
            b.store(sizes.extent(d), _at(b, dims, axis))
        b.ret(ir.Constant(I32, len(shape)))
    b.position_at_end(missing)
    b.ret(ir.Constant(I32, -1))
