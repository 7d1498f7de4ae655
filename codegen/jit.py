"""LLVM IR → optimized machine code: in memory (MCJIT), as an object file, or as a shared
library when the system has a linker."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import llvmlite.binding as llvm
from llvmlite import ir

from polytile.errors import CodegenError

from . import cache, vecmath
from .llvm_types import LOOP_MARKER, NUM_THREADS
from .target import Target, _init_llvm, default_threads, openmp_library

T = TypeVar("T")


def function_attributes(target: Target) -> str:
    bits = target.vector_bits
    return (
        f'"target-cpu"="{target.cpu}" "target-features"="{target.features}" '
        f'"prefer-vector-width"="{bits}" "min-legal-vector-width"="{bits}"'
    )


def finalize(module: ir.Module, target: Target) -> str:
    """The module's IR text with the target and the vector width on every definition,
    and each loop ID placeholder (`ModuleContext.runtime_trips`) made a real one: a
    distinct node whose first operand is itself (llvmlite writes no such node)."""
    module.triple = target.triple
    text = str(module)
    text = re.sub(r"^(define [^\n]*\))([^\n{]*)$", r"\1\2 #0", text, flags=re.M)
    marker = re.escape(LOOP_MARKER)
    text = re.sub(
        rf'^(!\d+) = !{{ !"{marker}\d+", (!\d+) }}$', r"\1 = distinct !{\1, \2}", text, flags=re.M
    )
    return f"{text}\nattributes #0 = {{ {function_attributes(target)} }}\n"


def optimize(text: str, target: Target, context: llvm.ContextRef | None = None) -> llvm.ModuleRef:
    """LLVM's pipeline at the target's level, its own vectorizers and unroller on (a loop
    whose trip count is a run-time value carries its own refusal of runtime unrolling)."""
    _init_llvm()
    try:
        mod = llvm.parse_assembly(text, context=context)
        mod.verify()
    except RuntimeError as err:
        raise CodegenError(f"generated LLVM IR is invalid: {err}") from None
    machine = target.machine()
    mod.data_layout = str(machine.target_data)
    options = llvm.create_pipeline_tuning_options(speed_level=min(target.opt_level, 3))
    options.loop_vectorization = True
    options.slp_vectorization = True
    options.loop_unrolling = True
    builder = llvm.create_pass_builder(machine, options)
    builder.getModulePassManager().run(mod, builder)
    return mod


@dataclass(frozen=True)
class Part:
    """One separately compiled module: optimized bitcode and its machine code."""

    bitcode: bytes
    obj: bytes
    pic: bool = False


def compile_part(text: str, target: Target, pic: bool = False) -> Part:
    """IR text → optimized bitcode + object code, in an LLVM context of its own (so that
    parts compile on several threads at once; llvmlite releases the GIL in LLVM)."""
    context = llvm.create_context()
    mod = optimize(text, target, context)
    return Part(mod.as_bitcode(), emit_object(mod, target, pic), pic)


def recompile_part(bitcode: bytes, target: Target, pic: bool = False) -> Part:
    """Machine code for this target from saved bitcode (optimized again for its CPU)."""
    context = llvm.create_context()
    mod = llvm.parse_bitcode(bitcode, context=context)
    mod.triple = target.triple
    return compile_part(str(mod), target, pic)


def check_runnable(bitcode: bytes, target: Target) -> None:
    """Raise `CodegenError` when saved code calls a libmvec function this machine lacks
    (no libmvec, or not the CPU feature of its variant): the call would jump to nothing."""
    mod = llvm.parse_bitcode(bitcode, context=llvm.create_context())
    for fn in mod.functions:
        if fn.is_declaration and not vecmath.runs_on(fn.name, target):
            raise CodegenError(
                f"the saved code calls libmvec's '{fn.name}', which this machine cannot run "
                f"(no libmvec, or not the CPU feature it needs): compile the model again here"
            )


#: below this much LLVM IR text in all, compiling serially beats starting worker processes
#: (a one-op model's few small modules compile faster than a pool forks)
SERIAL_CHARS = 200_000


def _compile_args(args: tuple[str, Target, bool]) -> Part:
    return compile_part(*args)


def compile_parts(
    texts: Sequence[str], target: Target, workers: int | None = None, pic: bool = False
) -> list[Part]:
    """Compile modules on several processes (llvmlite serializes every call into LLVM
    behind one lock, so threads would not help); forked workers share the parent's
    initialized LLVM. Serial where fork is unavailable, for a single module or for little
    IR in all."""
    keys = [(hashlib.sha256(t.encode()).hexdigest(), repr(target), pic) for t in texts]
    missing = [i for i, key in enumerate(keys) if cache.COMPILED.get(key) is None]
    jobs = [(texts[i], target, pic) for i in missing]
    if sum(len(j[0]) for j in jobs) < SERIAL_CHARS:
        workers = 1
    sizes = [len(j[0]) for j in jobs]
    done = forked_map(lambda i: _compile_args(jobs[i]), len(jobs), workers, sizes)
    for i, part in zip(missing, done, strict=True):
        cache.COMPILED.put(keys[i], part)
    return [cache.COMPILED.get(key) for key in keys]  # type: ignore[misc]


#: the function `forked_map`'s workers run (set before they fork, so nothing is pickled),
#: and the lock that keeps two threads' maps from sharing it
_FORKED: Callable[[int], Any] | None = None
_FORK_LOCK = threading.Lock()


def _run_forked(i: int) -> Any:
    assert _FORKED is not None
    return _FORKED(i)


def forked_map(
    fn: Callable[[int], T],
    count: int,
    workers: int | None = None,
    cost: Sequence[int] | None = None,
) -> list[T]:
    """[fn(0), ..., fn(count - 1)] computed on `workers` forked processes (the machine's
    cores by default), the costliest first (`cost`), results pickled back: for Python and
    LLVM work that the GIL or llvmlite's lock would serialize on threads. Serial for one
    worker or item, or where fork is unavailable."""
    global _FORKED
    workers = min(workers or default_threads(), count)
    if workers <= 1 or "fork" not in mp.get_all_start_methods():
        return [fn(i) for i in range(count)]
    order = sorted(range(count), key=lambda i: -cost[i]) if cost else list(range(count))
    with _FORK_LOCK:  # one map at a time: the workers read `_FORKED`
        _FORKED = fn
        try:
            with mp.get_context("fork").Pool(workers) as pool:
                done = pool.map(_run_forked, order, chunksize=1)
        finally:
            _FORKED = None
    by_item = dict(zip(order, done, strict=True))
    return [by_item[i] for i in range(count)]


@functools.cache
def _load_runtime() -> None:
    library = openmp_library()
    if library is not None:
        llvm.load_library_permanently(library)
    # LLVM's backend calls libgcc / compiler-rt helpers for conversions it cannot inline
    # (double → half is __truncdfhf2); MCJIT binds a symbol it cannot find to address 0
    helpers = ctypes.util.find_library("gcc_s")
    if helpers is not None:
        llvm.load_library_permanently(helpers)
    # the vector math functions kernels call (`codegen.vecmath`)
    vector_math = vecmath.library_path()
    if vector_math is not None:
        llvm.load_library_permanently(vector_math)


class JitModule:
    """Machine code of a model's parts, loaded and linked into this process."""

    def __init__(self, parts: Sequence[Part], target: Target) -> None:
        _init_llvm()
        _load_runtime()
        self.target = target
        self._machine = target.machine()
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._machine)
        for part in parts:
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(part.obj))
        self.engine.finalize_object()
        self.set_threads(target.num_threads)

    def address(self, name: str) -> int:
        address = self.engine.get_function_address(name)
        if not address:
            raise CodegenError(f"the compiled module has no function '{name}'")
        return address

    def global_address(self, name: str) -> int:
        """The address of a global variable of the code (0 when it has none)."""
        return int(self.engine.get_global_value_address(name))

    def set_threads(self, count: int) -> None:
        address = self.engine.get_global_value_address(NUM_THREADS)
        if address:
            ctypes.c_int32.from_address(address).value = max(1, int(count))


def emit_object(mod: llvm.ModuleRef, target: Target, pic: bool = False) -> bytes:
    return target.machine(reloc="pic" if pic else "default").emit_object(mod)


def emit_assembly(mod: llvm.ModuleRef, target: Target) -> str:
    return target.machine().emit_assembly(mod)


def linker() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def link_shared(objects: Sequence[bytes], path: str) -> None:
    """Link an object (position-independent) into a shared library with the system's C
    compiler driver, against libgomp and libm (glibc's libm.so also links libmvec where
    the code calls it, `codegen.vecmath`)."""
    cc = linker()
    if cc is None:
        raise CodegenError(
            "export_library needs a system linker (cc, gcc or clang) and none was found; "
            "use save() for a portable artifact instead"
        )
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, obj in enumerate(objects):
            paths.append(os.path.join(tmp, f"part{i}.o"))
            with open(paths[-1], "wb") as f:
                f.write(obj)
        libs = []
        gomp = openmp_library()
        if gomp is not None:
            libs = [gomp, f"-Wl,-rpath,{os.path.dirname(gomp)}"]
        cmd = [cc, "-shared", "-o", path, *paths, *libs, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CodegenError(f"linking {path} failed: {done.stderr.strip()[:2000]}")
