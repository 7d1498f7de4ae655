"""A compiled model at run time: one native call per inference, plus saving and loading.

A saved model (`.ptm`) is a directory holding `manifest.json` (inputs, outputs, the kernel
calls and memory plan, the target it was built for), `module.o` (machine code),
`module.bc` (optimized LLVM bitcode, to rebuild machine code for another CPU without
rescheduling) and `constants.npz` (packed weights); a model compiled for all sizes with
kernels compiled per size also holds their subgraphs (`special<i>.*`, `polytile.special`).

The native entry returns a status: 0, or the number (plus one) of the run-time index
check that failed (`codegen.module.IndexCheck`), which `run` raises as an
`IndexOutOfRangeError` naming the model, the node, the input, the value and its
position. Models saved before the checks existed have no "checks" in their manifest and
an entry that returns nothing; they load and run as before.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from polytile.codegen.c_header import c_header, constant_offsets
from polytile.codegen.dynamic import DynamicPlan, bind, shape_at
from polytile.codegen.dynamic_plan import PLAN, TABLE_LENGTH, plan_module
from polytile.codegen.jit import (
    JitModule,
    Part,
    check_runnable,
    compile_part,
    finalize,
    link_shared,
    linker,
    recompile_part,
)
from polytile.codegen.link import OutputCopy
from polytile.codegen.module import FAULT, IndexCheck, KernelCall
from polytile.codegen.special import Specialized
from polytile.codegen.target import Target, host
from polytile.codegen.timing import Timing
from polytile.errors import CodegenError, IndexOutOfRangeError, InputError, ModelError
from polytile.frontend.narrow import FLOAT_FORMATS
from polytile.frontend.ops.indexing import IndexBound, out_of_range_message
from polytile.poly.ir.buffers import aligned_block, aligned_empty
from polytile.poly.ir.kernel import size_of
from polytile.version import __version__

from .special import CompileGraph, Specializations, load_source

FORMAT_VERSION = 1

#: outputs from this size on are allocated 64-byte aligned, like every other buffer;
#: smaller ones are not, as aligning costs a small model's run more than it saves
ALIGNED_OUTPUT_BYTES = 16384


@dataclass(frozen=True)
class IOSpec:
    name: str
    dtype: str
    #: sizes, and in a model compiled for all sizes symbolic ones (`Dim` text)
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class Manifest:
    name: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    entry: str
    arena_bytes: int
    copies: tuple[OutputCopy, ...]
    target: Mapping[str, Any]
    calls: tuple[KernelCall, ...]
    #: run-time index checks the entry makes (None: saved before checks, no status)
    checks: tuple[IndexCheck, ...] | None = ()
    #: a model compiled for all sizes: its sizes and arena, worked out per run
    dynamic: DynamicPlan | None = None
    #: its kernels compiled per size on first use (`polytile.special`)
    specials: tuple[Specialized, ...] = ()

    def to_json(self) -> dict[str, Any]:
        def spec(s: IOSpec) -> dict[str, Any]:
            return {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)}

        data = {
            "format": FORMAT_VERSION,
            "polytile": __version__,
            "name": self.name,
            "inputs": [spec(s) for s in self.inputs],
            "outputs": [spec(s) for s in self.outputs],
            "entry": self.entry,
            "arena_bytes": self.arena_bytes,
            "copies": [[c.index, c.kind, c.source] for c in self.copies],
            "target": dict(self.target),
            "calls": [c.to_json() for c in self.calls],
        }
        if self.checks is not None:  # None: saved before the checks, its entry returns nothing
            data["checks"] = [c.to_json() for c in self.checks]
        if self.dynamic is not None:
            data["dynamic"] = self.dynamic.to_json()
        if self.specials:
            data["specials"] = [s.to_json() for s in self.specials]
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Manifest:
        def spec(d: Mapping[str, Any]) -> IOSpec:
            shape = tuple(x if isinstance(x, str) else int(x) for x in d["shape"])
            return IOSpec(str(d["name"]), str(d["dtype"]), shape)

        return Manifest(
            name=str(data["name"]),
            inputs=tuple(spec(d) for d in data["inputs"]),
            outputs=tuple(spec(d) for d in data["outputs"]),
            entry=str(data["entry"]),
            arena_bytes=int(data["arena_bytes"]),
            copies=tuple(OutputCopy(int(i), str(k), int(s)) for i, k, s in data["copies"]),
            target=dict(data["target"]),
            calls=tuple(KernelCall.from_json(c) for c in data["calls"]),
            checks=(
                tuple(IndexCheck.from_json(c) for c in data["checks"]) if "checks" in data else None
            ),
            dynamic=DynamicPlan.from_json(data["dynamic"]) if "dynamic" in data else None,
            specials=tuple(Specialized.from_json(s) for s in data.get("specials", ())),
        )


@dataclass(frozen=True)
class CallTiming:
    """One kernel call of a profiled run: its place in the model, its function, the
    median seconds it took and its kernel's workload key (tuning records' key)."""

    index: int
    function: str
    seconds: float
    workload: str = ""


@dataclass(frozen=True)
class Profile:
    """A profiled inference: each kernel call's median time, and the outputs it gave."""

    calls: tuple[CallTiming, ...]
    outputs: list[np.ndarray]

    @property
    def total(self) -> float:
        """The calls' medians added up (close to one run's latency)."""
        return sum(c.seconds for c in self.calls)


def replace_directory(path: Path, write: Callable[[Path], None]) -> None:
    """`write` fills a fresh directory next to `path`, which then replaces `path` whole:
    a reader never sees half a saved model, and a failed write leaves the old one."""
    tmp = Path(tempfile.mkdtemp(prefix=".ptm-", dir=path.parent))
    try:
        write(tmp)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_ARGS = (ctypes.c_void_p,) * 4
_Entry = ctypes.CFUNCTYPE(ctypes.c_int32, *_ARGS)
_LegacyEntry = ctypes.CFUNCTYPE(None, *_ARGS)
_DynamicEntry = ctypes.CFUNCTYPE(ctypes.c_int32, *_ARGS, ctypes.c_void_p)
#: `polytile_plan(sizes, table)`: the arena bytes, or a negative error
_Planner = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


class CompiledModel:
    """A model compiled to native code: `run(feeds)` makes one native call."""

    def __init__(
        self,
        manifest: Manifest,
        constants: Sequence[np.ndarray],
        jit: JitModule,
        parts: Sequence[Part],
        target: Target,
        stats: Any = None,
        sources: Sequence[Any] = (),
        compile_graph: CompileGraph | None = None,
    ) -> None:
        """`sources`: the subgraphs of the kernels compiled per size (`specials`), which
        `compile_graph` compiles (`polytile.special`)."""
        self.manifest = manifest
        self.constants = aligned_block(constants)
        self.target = target
        self.stats = stats
        self._jit = jit
        self._parts = list(parts)
        kind = _LegacyEntry if manifest.checks is None else _Entry
        self._entry = kind(jit.address(manifest.entry))
        if manifest.dynamic is not None:
            self._entry = _DynamicEntry(jit.address(manifest.entry))
        #: the native memory plan of a model compiled for all sizes (`dynamic_plan`;
        #: a model saved without one plans in Python)
        self._planner: Any = None
        if manifest.dynamic is not None and jit.global_address(TABLE_LENGTH):
            self._planner = _Planner(jit.address(PLAN))
        self._lock = threading.Lock()
        #: the kernels compiled per size, and their specializations so far
        self.specializations: Specializations | None = None
        if manifest.specials:
            self.specializations = Specializations(
                manifest.name, manifest.specials, sources, target, compile_graph
            )
        self._arena = aligned_empty((manifest.arena_bytes,), np.uint8)
        self._constant_table = (ctypes.c_void_p * max(1, len(self.constants)))(
            *[c.ctypes.data for c in self.constants]
        )
        self._inputs = (ctypes.c_void_p * max(1, len(manifest.inputs)))()
        self._outputs = (ctypes.c_void_p * max(1, len(manifest.outputs)))()
        self._input_index = {s.name: i for i, s in enumerate(manifest.inputs)}
        self._copied = {c.index for c in manifest.copies}
        #: per output: its shape, dtype and bytes (worked out once, not every run)
        self._output_specs = [
            (s.shape, np.dtype(s.dtype), math.prod(s.shape) * np.dtype(s.dtype).itemsize)
            for s in manifest.outputs
            if manifest.dynamic is None
        ]

    # --- running ----------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.manifest.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.manifest.outputs]

    def set_num_threads(self, count: int) -> None:
        if count < 1:
            raise InputError(
                f"model '{self.manifest.name}': num_threads must be at least 1, got {count}"
            )
        self._jit.set_threads(count)
        if self.specializations is not None:
            self.specializations.set_num_threads(count)

    def _check(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        name = self.manifest.name
        if not isinstance(feeds, Mapping):
            raise InputError(f"model '{name}': feeds must be a dict of input name → array")
        unknown = sorted(set(feeds) - set(self._input_index))
        if unknown:
            raise InputError(
                f"model '{name}': unknown input(s) {unknown}; inputs are {self.input_names}"
            )
        arrays = []
        for spec in self.manifest.inputs:
            if spec.name not in feeds:
                raise InputError(f"model '{name}': input '{spec.name}' is missing")
            value = feeds[spec.name]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            if value.dtype != np.dtype(spec.dtype):
                raise InputError(
                    f"model '{name}': input '{spec.name}' must be {spec.dtype}, got {value.dtype}"
                )
            if value.shape != spec.shape and self.manifest.dynamic is None:
                raise InputError(
                    f"model '{name}': input '{spec.name}' must have shape {list(spec.shape)}, "
                    f"got {list(value.shape)}"
                )
            if not value.flags.c_contiguous:
                value = np.ascontiguousarray(value)
            arrays.append(value)
        return arrays

    def run(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Outputs for the given inputs (a dict name → array), in the model's order."""
        arrays = self._check(feeds)
        table, arena_bytes, sizes = self._sized(arrays)
        outputs = self._new_outputs(sizes if table is not None else None)
        with self._lock:
            for i, a in enumerate(arrays):
                self._inputs[i] = a.ctypes.data
            for i, o in enumerate(outputs):
                self._outputs[i] = o.ctypes.data
            args = [
                ctypes.addressof(self._inputs),
                ctypes.addressof(self._outputs),
                ctypes.addressof(self._constant_table),
            ]
            if table is None:
                status = self._entry(*args, self._arena.ctypes.data)
            else:
                if self._arena.nbytes < arena_bytes:  # grown for the largest sizes seen
                    self._arena = aligned_empty((arena_bytes,), np.uint8)
                status = self._entry(*args, self._arena.ctypes.data, table.ctypes.data)
            if status:
                raise self._fault(status, sizes)
        return self._with_copies(arrays, outputs)

    def _sized(self, arrays: list[np.ndarray]) -> tuple[np.ndarray | None, int, dict[str, int]]:
        """For a model compiled for all sizes: the dynamic table at the inputs' sizes, the
        arena bytes it needs and every size's value (None, 0, {} for a static model)."""
        dynamic = self.manifest.dynamic
        if dynamic is None:
            return None, 0, {}
        named = bind(
            self.manifest.name,
            [(s.name, s.shape) for s in self.manifest.inputs],
            [a.shape for a in arrays],
        )
        for size, value in named.items():
            low, high = dynamic.bounds.get(size, (1, value))
            if not low <= value <= high:
                raise InputError(
                    f"model '{self.manifest.name}': size '{size}' = {value} is outside the "
                    f"bounds [{low}, {high}] the model was compiled for"
                )
        table, arena, values = dynamic.table(named, self._native_plan if self._planner else None)
        if self.specializations is not None:  # each specialized kernel's function there
            table = self.specializations.table(dynamic, table, values)
        return table, arena, values

    def _native_plan(self, sizes: np.ndarray, table: np.ndarray) -> int:
        """The model's compiled planner at these named sizes (`DynamicPlan.table`)."""
        arena = int(self._planner(sizes.ctypes.data, table.ctypes.data))
        if arena < 0:  # (the bounds are checked before: a byte count overflowed)
            raise InputError(
                f"model '{self.manifest.name}': at sizes {sizes.tolist()} its tensors need "
                "more bytes than 64-bit offsets hold"
            )
        return arena

    def _fault(self, status: int, sizes: Mapping[str, int]) -> IndexOutOfRangeError:
        """The error of failed check `status - 1`, from the position and value the
        entry left in the globals `FAULT` (`sizes`: the run's, for a symbolic shape)."""
        checks = self.manifest.checks or ()
        if not 0 < status <= len(checks):
            return IndexOutOfRangeError(
                f"model '{self.manifest.name}': the compiled code reported an unknown "
                f"failed check {status}"
            )
        check = checks[status - 1]
        position, value = (
            int(ctypes.c_int64.from_address(self._jit.global_address(name)).value) for name in FAULT
        )
        at = [size_of(n, sizes) for n in check.sizes]
        bound = IndexBound(0, tuple(at), check.data, check.axis)
        shape = tuple(size_of(d, sizes) for d in check.shape)
        detail = out_of_range_message(check.input, shape, bound, position, value)
        return IndexOutOfRangeError(f"model '{self.manifest.name}': {check.node}: {detail}")

    def _new_outputs(self, sizes: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """Output arrays for one run (at these sizes, in a model compiled for all sizes),
        64-byte aligned from `ALIGNED_OUTPUT_BYTES` on (a small output's few stores lose
        less than aligning it costs)."""
        specs = self._output_specs
        if sizes is not None:
            specs = []
            for s in self.manifest.outputs:
                shape, dtype = shape_at(s.shape, sizes), np.dtype(s.dtype)
                specs.append((shape, dtype, math.prod(shape) * dtype.itemsize))
        return [
            aligned_empty(shape, dtype)
            if nbytes >= ALIGNED_OUTPUT_BYTES
            else np.empty(shape, dtype)
            for shape, dtype, nbytes in specs
        ]

    def _with_copies(self, arrays: list[np.ndarray], outputs: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs with those no kernel writes filled in (copies of inputs, constants
        or other outputs)."""
        for copy in self.manifest.copies:
            source = {"input": arrays, "output": outputs, "constant": self.constants}[copy.kind]
            outputs[copy.index] = np.array(source[copy.source], copy=True).reshape(
                outputs[copy.index].shape
            )
        return outputs

    def random_inputs(
        self, seed: int = 0, sizes: Mapping[str, int] | None = None
    ) -> dict[str, np.ndarray]:
        """Seeded random feeds; inputs read as indices hold valid ones (below the
        smallest axis they index). A model compiled for all sizes makes them at `sizes`
        (a named size not given is 1)."""
        rng = np.random.default_rng(seed)
        feeds = {}
        dynamic = self.manifest.dynamic
        named = {n: int((sizes or {}).get(n, 1)) for n in dynamic.named} if dynamic else {}
        values = dynamic.values(named) if dynamic else {}
        limits: dict[int, int] = {}
        for check in self.manifest.checks or ():
            if check.slot.kind == "input":
                low = min(size_of(n, values) for n in check.sizes)
                limits[check.slot.index] = min(limits.get(check.slot.index, low), low)
        for number, spec in enumerate(self.manifest.inputs):
            s = IOSpec(spec.name, spec.dtype, shape_at(spec.shape, values))
            kind = np.dtype(s.dtype).kind
            if number in limits:
                feeds[s.name] = rng.integers(0, max(limits[number], 1), s.shape).astype(s.dtype)
            elif kind == "f" or s.dtype == "bfloat16" or s.dtype in FLOAT_FORMATS:
                # numpy calls bfloat16 and most float8 kind V; float8e8m0 has no sign
                normal = rng.standard_normal(s.shape)
                normal = np.abs(normal) if s.dtype == "float8_e8m0fnu" else normal
                feeds[s.name] = normal.astype(s.dtype)
            elif kind == "b":
                feeds[s.name] = rng.integers(0, 2, s.shape).astype(bool)
            else:
                feeds[s.name] = rng.integers(0, 10, s.shape).astype(s.dtype)
        return feeds

    def benchmark(
        self,
        feeds: Mapping[str, Any] | None = None,
        repeat: int = 10,
        number: int = 1,
        warmup: int = 1,
    ) -> Timing:
        """Time `repeat` measurements of `number` runs each (after `warmup` runs)."""
        if repeat < 1 or number < 1:
            raise InputError("benchmark: repeat and number must be at least 1")
        feeds = feeds if feeds is not None else self.random_inputs()
        for _ in range(warmup):
            self.run(feeds)
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                self.run(feeds)
            results.append((time.perf_counter() - start) / number)
        return Timing(tuple(results))

    def profile(
        self, feeds: Mapping[str, Any] | None = None, repeat: int = 10, warmup: int = 1
    ) -> Profile:
        """Each kernel call timed on its own, the calls made in model order as one
        inference makes them (so each meets the cache the previous ones left): the calls
        add up to about one run, and show which kernels the time goes to."""
        if repeat < 1:
            raise InputError("profile: repeat must be at least 1")
        feeds = feeds if feeds is not None else self.random_inputs()
        if self.manifest.checks:  # the calls run unchecked below: one checked run first
            self.run(feeds)
        arrays = self._check(feeds)
        entries, arena_bytes, sizes = self._sized(arrays)
        table = [] if entries is None else [int(v) for v in entries]
        outputs = self._new_outputs(sizes if entries is not None else None)
        if self._arena.nbytes < arena_bytes:
            self._arena = aligned_empty((arena_bytes,), np.uint8)
        base = self._arena.ctypes.data
        tables = {
            "input": [a.ctypes.data for a in arrays],
            "output": [o.ctypes.data for o in outputs],
            "constant": [c.ctypes.data for c in self.constants],
            "dynamic": [base + offset for offset in table],
        }
        prepared = []
        for call in self.manifest.calls:
            kind = ctypes.CFUNCTYPE(
                None, *[ctypes.c_void_p] * len(call.args), *[ctypes.c_int64] * len(call.sizes)
            )
            fn = kind(self._jit.address(call.function))
            args = [
                base + s.index if s.kind == "arena" else tables[s.kind][s.index] for s in call.args
            ]
            prepared.append((fn, [*args, *(table[i] for i in call.sizes)]))
        samples: list[list[float]] = [[] for _ in prepared]
        with self._lock:
            for run in range(warmup + repeat):
                for times, (fn, args) in zip(samples, prepared, strict=True):
                    start = time.perf_counter()
                    fn(*args)
                    if run >= warmup:
                        times.append(time.perf_counter() - start)
        calls = tuple(
            CallTiming(i, call.function, statistics.median(times), call.workload)
            for i, (call, times) in enumerate(zip(self.manifest.calls, samples, strict=True))
        )
        return Profile(calls, self._with_copies(arrays, outputs))

    # --- artifacts --------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as a `.ptm` directory; `load` restores it without rescheduling."""
        out = Path(path)
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.is_dir():
            raise InputError(f"cannot save model '{self.manifest.name}': no directory {parent}")

        def write(tmp: Path) -> None:
            data = self.manifest.to_json()
            data["parts"] = len(self._parts)
            (tmp / "manifest.json").write_text(json.dumps(data, indent=1))
            for i, part in enumerate(self._parts):
                (tmp / f"part{i}.o").write_bytes(part.obj)
                (tmp / f"part{i}.bc").write_bytes(part.bitcode)
            np.savez(tmp / "constants.npz", *self.constants)
            if self.specializations is not None:
                self.specializations.save(tmp)

        replace_directory(out, write)
        return out

    def export_library(self, path: str | os.PathLike[str]) -> Path:
        """A C-callable shared library exporting `int32_t polytile_run(inputs, outputs,
        constants, arena)` (0, or the number plus one of the failed index check of the
        manifest's "checks", whose position and value it leaves in the `int64_t`
        globals `polytile_fault_position` and `polytile_fault_value`) and
        `polytile_num_threads`; its constants are saved next to it as
        `<path>.npz` and as raw bytes in `<path>.bin`, the manifest (arena size, inputs,
        outputs) as `<path>.json` and a C header declaring it all (with each constant's
        offset in the `.bin`) as `<path>.h`.
        Any alignment of the buffers works; 64-byte aligned ones run fastest (as
        `run` passes them). Needs a system linker.

        A model compiled for all sizes plans its memory per call, in the library too:
        `int64_t polytile_plan(const int64_t *sizes, int64_t *table)` takes the named
        sizes in the order of the manifest's "dynamic"/"named", fills `table` (the
        `int64_t polytile_table_length` entries the run reads: the sizes, derived ones,
        each arena tensor's offset, the index checks' counts and bounds) and returns the
        arena bytes it needs; or -1 - i when size i is below 1 or outside the bounds the
        model was compiled for, -1 - (number of sizes, the global `polytile_num_sizes`)
        when a byte count overflows. `int32_t polytile_input_shape(int32_t index, const
        int64_t *table, int64_t *dims)` and `polytile_output_shape` (same arguments) put a
        tensor's shape at those sizes in `dims` and return its rank (-1: no such
        tensor). `polytile_run` then takes the table as a fifth argument. The plan is
        the one `run` makes (`codegen.dynamic_plan`: tensors placed in a few orders
        fixed at compile time, the one needing the fewest bytes kept)."""
        if self.manifest.specials:
            kernels = "; ".join(f"{s.name}: {s.reason}" for s in self.manifest.specials)
            raise CodegenError(
                f"model '{self.manifest.name}' cannot be exported as a library: it compiles "
                f"kernels per size when first run at a size, which a C library cannot "
                f"({kernels}); compile it with dynamic=False at the sizes it needs"
            )
        if linker() is None:
            raise CodegenError(
                "export_library needs a system linker (cc, gcc or clang) and none was found; "
                "use save() for a portable artifact instead"
            )
        out = Path(path)
        objects = [recompile_part(p.bitcode, self.target, pic=True).obj for p in self._parts]
        dynamic = self.manifest.dynamic
        if dynamic is not None and self._planner is None:  # (compiled with the model since)
            inputs = [s.shape for s in self.manifest.inputs]
            module = plan_module(dynamic, inputs, [s.shape for s in self.manifest.outputs])
            objects.append(compile_part(finalize(module, self.target), self.target, True).obj)
        link_shared(objects, str(out))
        np.savez(f"{out}.npz", *self.constants)
        Path(f"{out}.json").write_text(json.dumps(self.manifest.to_json(), indent=1))
        nbytes = [c.nbytes for c in self.constants]
        offsets, total = constant_offsets(nbytes)
        raw = bytearray(total)
        for c, at in zip(self.constants, offsets, strict=True):
            raw[at : at + c.nbytes] = c.tobytes()
        Path(f"{out}.bin").write_bytes(raw)
        m = self.manifest
        specs = [[(s.name, s.dtype, s.shape) for s in io] for io in (m.inputs, m.outputs)]
        checks = None if m.checks is None else len(m.checks)
        header = c_header(m.name, m.entry, *specs, nbytes, m.arena_bytes, checks, dynamic)
        Path(f"{out}.h").write_text(header)
        return out


def load(
    path: str | os.PathLike[str],
    num_threads: int | None = None,
    compile_graph: CompileGraph | None = None,
) -> CompiledModel:
    """Restore a saved model. Machine code is reused when this CPU matches the one it was
    built for; otherwise the saved bitcode is compiled for this CPU (never rescheduled).
    `compile_graph` compiles its kernels compiled per size (`polytile.special`) on first
    use: `pt.load` (`polytile.compiler.load`) gives the compiler's."""
    root = Path(path)
    try:
        data = json.loads((root / "manifest.json").read_text())
        if data.get("format") != FORMAT_VERSION:
            raise ModelError(
                f"'{path}' has artifact format {data.get('format')}; "
                f"this polytile reads {FORMAT_VERSION}"
            )
        manifest = Manifest.from_json(data)
        count = int(data["parts"])
        with np.load(root / "constants.npz") as npz:
            constants = [npz[f"arr_{i}"] for i in range(len(npz.files))]
        target = host(num_threads)
        saved = manifest.target
        same_cpu = saved.get("cpu") == target.cpu and saved.get("features") == target.features
        parts = []
        for i in range(count):
            bitcode = (root / f"part{i}.bc").read_bytes()
            check_runnable(bitcode, target)
            if same_cpu:
                parts.append(Part(bitcode, (root / f"part{i}.o").read_bytes()))
            else:
                parts.append(recompile_part(bitcode, target))
        sources = [load_source(root, f"special{i}") for i in range(len(manifest.specials))]
    except (OSError, ValueError, KeyError, TypeError, DecodeError) as err:
        raise ModelError(f"'{path}' is not a readable saved polytile model: {err}") from None
    except CodegenError as err:
        raise ModelError(f"'{path}': {err}") from None
    manifest = Manifest(**{**vars(manifest), "target": target.key()})
    jit = JitModule(parts, target)
    return CompiledModel(manifest, constants, jit, parts, target, None, sources, compile_graph)
