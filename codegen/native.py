"""One kernel under one schedule as native code, callable on numpy buffers: what the
researcher API's `.build()` returns and what codegen tests compare with the reference."""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Mapping, Sequence

import numpy as np

from polytile.errors import InputError
from polytile.poly.ir.buffers import allocate
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import Schedule

from .jit import JitModule, Part, compile_part, emit_assembly, finalize, optimize
from .module import kernel_module, runtime_module
from .target import Target, host, with_hints
from .timing import Timing

NAME = "polytile_kernel"


@functools.cache
def _runtime_part(target: Target) -> Part:
    """The runtime's globals, compiled once per target (every kernel links its own copy
    of the object; tuning builds hundreds of kernels)."""
    return compile_part(finalize(runtime_module(target).module, target), target)


def build_part(schedule: Schedule, target: Target) -> tuple[str, Part, tuple[str, ...]]:
    """The schedule's kernel as LLVM IR, as machine code, and its parameters (the
    tensors whose buffers it takes, in order); emitted with the schedule's codegen hints
    over the target's defaults."""
    target = with_hints(target, schedule.hints)
    mc, fn = kernel_module(schedule, NAME, target)
    ir = finalize(mc.module, target)
    return ir, compile_part(ir, target), fn.params


def index_limits(kernel: Kernel) -> dict[str, int]:
    """For each tensor whose values a load uses as an index (Gather's indices, ...), the
    smallest axis size it indexes: values in [0, limit) are valid for every such load."""
    limits: dict[str, int] = {}
    for s in kernel.statements:
        for outer in loads(s.expr):
            for axis, entry in enumerate(outer.index):
                if isinstance(entry, str):
                    continue
                size = kernel.tensors[outer.tensor].shape[axis]
                for inner in loads(entry):
                    limits[inner.tensor] = min(limits.get(inner.tensor, size), size)
    return limits


def random_inputs(kernel: Kernel, seed: int) -> dict[str, np.ndarray]:
    """Seeded random inputs of a kernel: floats N(0, 1), integers in [0, 3), except that
    the tensors it loads as indices hold valid ones (a kernel run alone has no index
    check before it)."""
    rng = np.random.default_rng(seed)
    limits = index_limits(kernel)
    inputs = {}
    for t in kernel.tensors.values():
        if t.role is not Role.INPUT:
            continue
        if t.name in limits:
            values = rng.integers(0, max(limits[t.name], 1), t.shape)
        elif np.dtype(t.dtype).kind == "f":
            values = rng.standard_normal(t.shape)
        else:
            values = rng.integers(0, 3, t.shape)
        inputs[t.name] = values.astype(t.dtype)
    return inputs


class LoadedKernel:
    """A kernel's machine code loaded into this process: `kernel(inputs)` runs it and
    returns every buffer afterwards. The code may come from elsewhere (a Dask worker built
    it); `kernel` is the one it was built from."""

    def __init__(self, kernel: Kernel, part: Part, params: Sequence[str], target: Target) -> None:
        self.kernel = kernel
        self.target = target
        self.params = tuple(params)
        self._jit = JitModule([part, _runtime_part(target)], target)
        arguments = [ctypes.c_void_p] * len(self.params) + [ctypes.c_int64] * len(kernel.params)
        self._fn = ctypes.CFUNCTYPE(None, *arguments)(self._jit.address(NAME))

    def set_threads(self, count: int) -> None:
        self._jit.set_threads(count)

    def sizes(
        self, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """The symbolic sizes of a run: `sizes` over those the inputs' shapes give,
        every one given and at least 1 (InputError naming the size or input)."""
        kernel = self.kernel
        where = f"kernel '{kernel.name}'"
        try:
            found = kernel.sizes_of(
                {t.name: np.shape(inputs[t.name]) for t in kernel.inputs() if t.name in inputs}
            )
        except ValueError as err:
            raise InputError(f"{where}: input {err}") from None
        found.update(sizes or {})
        for p in kernel.params:
            if p not in found:
                raise InputError(f"{where}: no input gives the size '{p}': pass sizes={{...}}")
            if int(found[p]) < 1:
                raise InputError(f"{where}: size '{p}' must be at least 1, got {found[p]}")
        return {p: int(found[p]) for p in kernel.params}

    def buffers(
        self, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        """Every tensor's buffer: inputs checked and copied, constants, zeroed others
        (shapes at the run's symbolic sizes)."""
        chosen = self.sizes(inputs, sizes) if self.kernel.params else {}
        return allocate(self.kernel.at(chosen), inputs)

    def arguments(self, buffers: Mapping[str, np.ndarray]) -> list[int]:
        """The function's arguments: the buffers' addresses, then the symbolic sizes
        their shapes give."""
        args = [buffers[p].ctypes.data for p in self.params]
        if self.kernel.params:
            found = self.kernel.sizes_of({n: b.shape for n, b in buffers.items()})
            args += [found[p] for p in self.kernel.params]
        return args

    def run_on(self, buffers: Mapping[str, np.ndarray]) -> None:
        """Run in place on buffers from `buffers()` (no checks, no copies)."""
        self._fn(*self.arguments(buffers))

    def __call__(
        self, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        buffers = self.buffers(inputs, sizes)
        self.run_on(buffers)
        return buffers

    def outputs(
        self, inputs: Mapping[str, np.ndarray], sizes: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        buffers = self(inputs, sizes)
        return {t.name: buffers[t.name] for t in self.kernel.outputs()}

    def random_inputs(
        self, seed: int = 0, sizes: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        """Seeded random inputs, index tensors within their axes (`random_inputs`), at
        `sizes` for a kernel with symbolic sizes."""
        return random_inputs(self.kernel.at(sizes or {}), seed)

    def benchmark(
        self, inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 10, number: int = 1
    ) -> Timing:
        """Seconds per run (a `Timing`) over `repeat` × `number` runs."""
        if repeat < 1 or number < 1:
            raise InputError("benchmark: repeat and number must be at least 1")
        buffers = self.buffers(inputs if inputs is not None else self.random_inputs())
        args = self.arguments(buffers)
        self._fn(*args)
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                self._fn(*args)
            results.append((time.perf_counter() - start) / number)
        return Timing(tuple(results))

    def gflops(self, seconds: float) -> float:
        return self.kernel.flops() / seconds / 1e9


class NativeKernel(LoadedKernel):
    """One kernel under one schedule, compiled here for `target` (the host by default)."""

    def __init__(self, schedule: Schedule, target: Target | None = None) -> None:
        self.schedule = schedule
        target = target or host()
        self.ir, part, params = build_part(schedule, target)
        super().__init__(schedule.kernel, part, params, target)

    def assembly(self) -> str:
        return emit_assembly(optimize(self.ir, self.target), self.target)
