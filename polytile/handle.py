"""A TensorIR-like handle over the schedule transformations, for researchers.

    sch = ScheduleHandle(kernel)
    i, j, k = sch.get_loops("Y")
    j0, j1 = sch.split(j, [None, 4])
    sch.reorder(j0, k, j1)
    sch.reverse_compute_at("C", j0)
    sch.decompose_reduction("Y", k)
    sch.vectorize(j1); sch.parallel(i)
    print(sch.show())

The handle is a thin mutable cursor over immutable `Schedule` values: each call applies
one pure transformation (which records its step in the trace) and keeps the result; an
illegal request raises `IllegalSchedule` at the call that makes it and leaves the handle
unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polytile.explanation import explain
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule, Step, initial_schedule
from polytile.poly.transform import steps as T


class ScheduleHandle:
    def __init__(self, kernel_or_schedule: Kernel | Schedule) -> None:
        if isinstance(kernel_or_schedule, Kernel):
            kernel_or_schedule = initial_schedule(kernel_or_schedule)
        self.schedule: Schedule = kernel_or_schedule

    @property
    def kernel(self) -> Kernel:
        return self.schedule.kernel

    @property
    def trace(self) -> list[dict[str, Any]]:
        return self.schedule.trace_json()

    def get_loops(self, stmt: str) -> list[str]:
        """The loops around a statement, outermost first."""
        return [loop.name for loop in self.schedule.loops_of(stmt)]

    def split(self, loop: str, factors: Sequence[int | None]) -> list[str]:
        self.schedule, names = T.split_named(self.schedule, loop, factors)
        return names

    def tile(self, loops: Sequence[str], sizes: Sequence[int]) -> None:
        self.schedule = T.tile(self.schedule, loops, sizes)

    def reorder(self, *loops: str) -> None:
        self.schedule = T.reorder(self.schedule, *loops)

    def fuse(self, *loops: str) -> str:
        self.schedule, name = T.fuse_named(self.schedule, *loops)
        return name

    def compute_at(self, stmt: str, loop: str) -> None:
        self.schedule = T.compute_at(self.schedule, stmt, loop)

    def reverse_compute_at(self, stmt: str, loop: str) -> None:
        self.schedule = T.reverse_compute_at(self.schedule, stmt, loop)

    def decompose_reduction(self, stmt: str, loop: str) -> None:
        self.schedule = T.decompose_reduction(self.schedule, stmt, loop)

    def rfactor(self, stmt: str, dim: str, factor: int) -> None:
        """Partial results of reduction `stmt` per `dim % factor` (see `poly.rfactor`);
        the loops restart from the new kernel's initial schedule."""
        self.schedule = T.rfactor(self.schedule, stmt, dim, factor)

    def parallel(self, loop: str) -> None:
        self.schedule = T.parallel(self.schedule, loop)

    def vectorize(self, loop: str) -> None:
        self.schedule = T.vectorize(self.schedule, loop)

    def unroll(self, loop: str) -> None:
        self.schedule = T.unroll(self.schedule, loop)

    def hint(self, **hints: int | bool) -> None:
        """Codegen hints for the kernel over the target's defaults (`T.hint`), e.g.
        `input_ahead=16`: ask for input rows 16 reduction steps ahead."""
        self.schedule = T.hint(self.schedule, **hints)

    def apply(self, step: Step | dict[str, Any]) -> None:
        """Apply one serialized step (as found in a trace)."""
        self.schedule = T.apply_step(
            self.schedule, step if isinstance(step, Step) else Step.from_json(step)
        )

    def build(self, num_threads: int | None = None) -> Any:
        """The current schedule as native code (`codegen.native.NativeKernel`): call it on
        a dict of inputs to get every buffer back. (The one place poly reaches into
        codegen, lazily, so that the handle reads like TVM's `tvm.build(sch.mod)`.)"""
        from polytile.codegen.native import NativeKernel
        from polytile.codegen.target import host

        return NativeKernel(self.schedule, host(num_threads))

    def benchmark(self, inputs: Any = None, repeat: int = 10, number: int = 1) -> Any:
        """Build and time the current schedule: a `runtime.Timing` in seconds per run."""
        return self.build().benchmark(inputs, repeat, number)

    def show(self) -> str:
        """The current schedule as C-like code."""
        return explain(self.schedule)

    def __repr__(self) -> str:
        return f"ScheduleHandle({self.kernel.name}, {len(self.schedule.trace)} steps)"
