"""The machine code is generated for: CPU name, features, vector width, threads.

The host's CPU and features drive LLVM's target machine. Where AVX-512 exists the
vector width is 512 bits and functions say so (`prefer-vector-width` and
`min-legal-vector-width`): LLVM's X86 tuning prefers 256-bit vectors on some AVX-512
CPUs and would split explicit 512-bit vectors there.

The prefetch choices (`MachineChoices`) default from the machine's parameters
(`machine_defaults`, from the size of L2), never from the CPU's name; a schedule's codegen
hints override them per kernel (`with_hints`).
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace

import llvmlite.binding as llvm
import numpy as np

from polytile.errors import CodegenError

from .vecmath import available as vecmath_available


@functools.cache
def _init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@dataclass(frozen=True)
class Target:
    cpu: str
    features: str
    triple: str
    vector_bits: int
    #: threads parallel loops run on (1 = serial)
    num_threads: int = field(default=1)
    opt_level: int = 3
    #: a core's L2 (the default schedules' cache tiles, `DefaultConfig.cache_bytes`)
    l2_bytes: int = 1 << 20
    #: whether a model's kernels fetch the next kernel's weights ahead as they compute
    #: (`codegen.module.prefetch_targets`; `machine_defaults` says where it pays)
    prefetch_weights: bool = True
    #: the largest panel of constants a parallel iteration reads that its reductions
    #: fetch ahead for the next iteration (`codegen.prefetch`; `machine_defaults`)
    prefetch_panel: int = 1 << 16
    #: whether exp, log, pow, tanh and erf of vectors call glibc's libmvec
    #: (`codegen.vecmath`) instead of libm lane by lane
    vector_math: bool = False
    #: how many steps ahead a register-tiled reduction asks for the rows of computed
    #: tensors it reads as vectors, a new row a step (`codegen.prefetch`;
    #: `machine_defaults` says where it pays); 0 leaves them to the hardware's prefetchers
    input_ahead: int = 0
    #: whether each parallel iteration of a stencil reduction (a 3x3 conv) asks for the
    #: next iteration's weight panel, a line per reduction step, on targets that do not
    #: fetch weights across kernels (`codegen.prefetch.Prefetches.next_panel`;
    #: `machine_defaults` says where it pays)
    panel_ahead: bool = False

    def enabled(self) -> frozenset[str]:
        """The CPU features `features` turns on (`+avx512f,...` → avx512f, ...)."""
        return frozenset(f[1:] for f in self.features.split(",") if f.startswith("+"))

    def lanes(self, dtype: str) -> int:
        """Vector lanes of one register for a dtype (bools are bytes in memory)."""
        return max(1, self.vector_bits // (8 * np.dtype(dtype).itemsize))

    def key(self) -> dict[str, object]:
        """What a tuning record names as the target."""
        return {"cpu": self.cpu, "features": self.features, "threads": self.num_threads}

    def machine(self, reloc: str = "default") -> llvm.TargetMachine:
        _init_llvm()
        target = llvm.Target.from_triple(self.triple)
        return target.create_target_machine(
            cpu=self.cpu,
            features=self.features,
            opt=min(self.opt_level, 3),
            reloc=reloc,
            codemodel="jitdefault" if reloc == "default" else "default",
        )


def host(num_threads: int | None = None, opt_level: int = 3) -> Target:
    """The machine this process runs on; threads default to its usable cores."""
    _init_llvm()
    features = llvm.get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in enabled:
        bits = 512
    elif "avx" in enabled:
        bits = 256
    else:
        bits = 128
    threads = num_threads if num_threads is not None else default_threads()
    if threads < 1:
        raise CodegenError(f"num_threads must be at least 1, got {threads}")
    l2 = l2_bytes()
    choices = machine_defaults(l2)
    return Target(
        cpu=llvm.get_host_cpu_name(),
        features=features,
        triple=llvm.get_process_triple(),
        vector_bits=bits,
        num_threads=threads,
        opt_level=opt_level,
        l2_bytes=l2,
        vector_math=vecmath_available(llvm.get_process_triple()),
        **asdict(choices),
    )


#: a per-core L2 at least this large holds two weight panels of a big conv beside its
#: activations (`machine_defaults`)
LARGE_L2 = 2 << 20
#: the panel fetched ahead on cores with a smaller L2, and the row-ahead distance (in
#: reduction steps) on cores with a large one
SMALL_L2_PANEL = 1 << 16
ROWS_AHEAD = 16


@dataclass(frozen=True)
class MachineChoices:
    """The machine-dependent prefetch choices of a `Target` (its fields of the same
    names): whether kernels fetch the next kernel's weights, the largest panel fetched
    ahead for the next parallel iteration, rows ahead, next stencil panel."""

    prefetch_weights: bool
    prefetch_panel: int
    input_ahead: int
    panel_ahead: bool


def machine_defaults(l2_bytes: int) -> MachineChoices:
    """The default prefetch choices of a core with `l2_bytes` of L2. A large L2
    (`LARGE_L2`: two weight panels of a big conv fit beside its activations) can take
    the next parallel iteration's panel beside the one in use (up to half of L2), so a
    stencil's next panel is worth fetching along the reduction (`panel_ahead`), as are
    input rows `ROWS_AHEAD` steps on, a stride the hardware's streams do not follow;
    there a window over the next kernel's weights costs a step in every reduction more
    than it saves. A smaller L2 gains from that window, and from the next iteration's
    panel only up to `SMALL_L2_PANEL` (larger ones evict the panel in use). The rule
    follows measurements on cores of 512 KiB, 1 MiB and 2 MiB L2 (`benchmarks/results/`);
    the search samples the per-kernel choices as codegen hints
    (`poly.transform.steps.hint`)."""
    if l2_bytes >= LARGE_L2:
        return MachineChoices(
            prefetch_weights=False,
            prefetch_panel=l2_bytes // 2,
            input_ahead=ROWS_AHEAD,
            panel_ahead=True,
        )
    return MachineChoices(
        prefetch_weights=True, prefetch_panel=SMALL_L2_PANEL, input_ahead=0, panel_ahead=False
    )


def machine_choices(target: Target) -> MachineChoices:
    """A target's own prefetch choices: the defaults its kernels' hint decisions start
    from (they may differ from `machine_defaults` on a target built by hand)."""
    return MachineChoices(**{f.name: getattr(target, f.name) for f in fields(MachineChoices)})


def with_hints(target: Target, hints: Mapping[str, object]) -> Target:
    """The target a kernel is emitted for: `target` with a schedule's codegen hints
    (`Schedule.hints`, fields of `Target` by name) over its defaults."""
    return replace(target, **hints) if hints else target


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@functools.cache
def l2_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size of this machine's per-core L2 as Linux reports it; 1 MiB where it does
    not (another OS, a container without sysfs), a common size of current server cores."""
    for index in sorted(glob.glob(os.path.join(root, "index*"))):
        try:
            with open(os.path.join(index, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(index, "size")) as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and size:
            number, unit = (size[:-1], size[-1]) if size[-1] in _UNITS else (size, "")
            if number.isdigit():
                return int(number) * _UNITS.get(unit, 1)
    return 1 << 20


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@functools.cache
def openmp_library() -> str | None:
    """A libgomp to run parallel loops on: scikit-learn's bundled copy, else the system's."""
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        site = os.path.dirname(os.path.dirname(spec.origin))
        found = sorted(glob.glob(os.path.join(site, "scikit_learn.libs", "libgomp*.so*")))
        if found:
            return found[0]
    return ctypes.util.find_library("gomp")
