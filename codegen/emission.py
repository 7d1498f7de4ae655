"""What the collaborators of one kernel's code generation share: `KernelState`, the
per-kernel facts and caches (the schedule, the target, lane strides, private temporaries'
layouts) that the function's emitter and those of its outlined parallel bodies all read,
and `Emitter`, the narrow interface through which the register accumulators
(`codegen.promote`), the prefetcher (`codegen.prefetch`) and statement values
(`codegen.values.Instance`) emit code into the function being built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from llvmlite import ir

from polytile.poly.analysis.strides import lane_strides
from polytile.poly.analysis.tile_init import init_fills_tile
from polytile.poly.ast.build import AstExpr, For, Int
from polytile.poly.ast.quasi import flat_index
from polytile.poly.ir.expr import walk
from polytile.poly.ir.kernel import Kernel, Statement
from polytile.poly.ir.schedule import Schedule
from polytile.poly.transform.contract import Private

from .ast_facts import calls_of, constant_bound, exact, relative_trips, upper
from .integers import Integers
from .llvm_types import I64, ModuleContext
from .target import Target
from .values import address_texts

#: unroll marks on loops with more iterations than this stay loops
MAX_UNROLL = 64
#: the element types whose vectors may run with lanes masked off (`maskable`)
MASKABLE_DTYPES = frozenset({"float32", "float64"})


class Emitter(Protocol):
    """The function being emitted, as its collaborators see it: its builder, the
    tensors' pointers and offset shifts (a private temporary's slice), integer AST
    expressions, offsets' layouts, and the loops open at the builder's position."""

    b: ir.IRBuilder
    mc: ModuleContext
    kernel: Kernel
    ptrs: dict[str, ir.Value]
    shift: dict[str, ir.Value]
    #: the loops being emitted, outermost first
    enclosing: list[For]
    #: index arithmetic (`codegen.integers`)
    ints: Integers
    #: the values of the kernel's symbolic sizes in this function
    sizes: dict[str, ir.Value]

    def int(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value: ...

    def shape(self, tensor: str) -> tuple[int | str, ...]: ...


@dataclass
class KernelState:
    """What the emitters of one kernel (the function and its outlined bodies) share: the
    schedule, the target, and facts about the AST's loops worked out once."""

    schedule: Schedule
    target: Target
    strides: dict[tuple[str, str], dict[str, int | None] | None] = field(default_factory=dict)
    #: loop → the temporaries stored in one slice per thread inside each iteration
    private: dict[str, list[Private]] = field(default_factory=dict)
    #: tensor → the shape its offsets are computed in: a private temporary's slice box
    layout: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: parallel loop → the fewest slices of the private temporaries in or below it
    slots: dict[str, int] = field(default_factory=dict)
    #: (statement, loop, address) → the address's stride along the loop
    along: dict[tuple[str, str, str], int | None] = field(default_factory=dict)
    #: (init statement, reduction loop) → whether the init fills the loop's accumulators
    fills: dict[tuple[str, str], bool] = field(default_factory=dict)
    #: statements → the element types they store and compute in (`vector_lanes`)
    types: dict[tuple[str, ...], frozenset[str]] = field(default_factory=dict)

    @property
    def kernel(self) -> Kernel:
        return self.schedule.kernel

    def shape(self, tensor: str) -> tuple[int | str, ...]:
        """The shape the tensor's offsets are computed in (a private temporary's box)."""
        return self.layout.get(tensor) or self.kernel.tensors[tensor].shape

    def stride_along(self, stmt: Statement, loop: str, text: str) -> int | None:
        """The stride of an address along a loop (cached: isl works it out)."""
        key = (stmt.name, loop, text)
        if key not in self.along:
            found = lane_strides(self.schedule, stmt.name, loop, {text: text})[text]
            self.along[key] = found
        return self.along[key]

    def init_fills(self, init: str, main: str, loop: str) -> bool:
        """Whether the init statement writes exactly the accumulators of `main` that the
        reduction loop uses, in every iteration of the loops around (cached)."""
        key = (init, loop)
        if key not in self.fills:
            self.fills[key] = init_fills_tile(self.schedule, init, main, loop)
        return self.fills[key]

    def vector_plan(self, stmt: Statement, loop: str) -> dict[str, int | None] | None:
        """Lane strides of every address and dimension the statement uses, or None when
        it must run lane by lane."""
        key = (stmt.name, loop)
        if key in self.strides:
            return self.strides[key]
        plan: dict[str, int | None] | None = None
        texts = address_texts(stmt.expr, self.shape)
        if texts is not None and loop:
            texts.append(flat_index(self.shape(stmt.tensor), stmt.index))
            found = lane_strides(self.schedule, stmt.name, loop, {t: t for t in texts})
            if all(v is not None for v in found.values()):
                plan = found
        self.strides[key] = plan
        return plan

    def vector_lanes(self, node: For) -> int | None:
        """Lanes of a vector loop: one register of the narrowest type, fewer when the
        loop is shorter (the power of two that covers it when its last vector may be
        masked, `maskable`, else the one it covers); None when it cannot run as
        vectors."""
        calls = calls_of(node.body)
        if calls is None or node.inc != Int(1):
            return None
        lanes = min(self.target.lanes(d) for d in self._dtypes(node))
        trips = relative_trips(node)
        if trips is not None and trips < lanes:
            wide = 1 << max(trips - 1, 1).bit_length()
            lanes = wide if self.maskable(node) else 1 << max(trips, 1).bit_length() - 1
        elif trips is None and isinstance(node.init, Int):
            # a bound such as min(3, n - 16*t): at most that many trips, unmasked
            bound = upper(node)
            limit = constant_bound(bound) if bound is not None else None
            if limit is not None:
                lanes = min(lanes, 1 << max(limit - node.init.value, 1).bit_length() - 1)
        return lanes if lanes >= 2 else None

    def _dtypes(self, node: For) -> frozenset[str]:
        """The element types the loop's statements store and compute in (cached: every
        question about a vector loop asks)."""
        stmts = tuple(call.stmt for call in calls_of(node.body) or ())
        if stmts not in self.types:
            dtypes = set()
            for name in stmts:
                stmt = self.kernel.statement[name]
                dtypes.add(self.kernel.tensors[stmt.tensor].dtype)
                dtypes.update(e.dtype for e in walk(stmt.expr))
            self.types[stmts] = frozenset(dtypes)
        return self.types[stmts]

    def maskable(self, node: For) -> bool:
        """Whether the loop's last, partial vector may run masked: its lanes past the
        loop compute undefined values that nothing stores, which only floating point
        does without a trap (an integer division by an undefined lane may fault)."""
        return self._dtypes(node) <= MASKABLE_DTYPES

    def expanded(self, node: For) -> bool:
        """Whether codegen emits the loop as straight-line copies with constant values."""
        if not isinstance(node.init, Int) or node.inc != Int(1):
            return False
        bound = upper(node)
        limit = exact(bound) if bound is not None else None
        if limit is None:
            return False
        trips = limit - node.init.value
        if node.annotation == "unroll":
            return 0 < trips <= MAX_UNROLL
        if node.annotation == "vector":
            lanes = self.vector_lanes(node)
            if lanes is None or -(-trips // lanes) > MAX_UNROLL:
                return False
            return trips % lanes == 0 or self.maskable(node)
        return False


def plus(b: ir.IRBuilder, value: ir.Value, n: int) -> ir.Value:
    """value + n, folded when value is a constant (promoted accumulators of expanded
    loops are keyed by their iterators' constant values)."""
    if isinstance(value, ir.Constant) and isinstance(value.constant, int):
        return ir.Constant(I64, value.constant + n)
    return value if n == 0 else b.add(value, ir.Constant(I64, n), flags=["nsw"])
