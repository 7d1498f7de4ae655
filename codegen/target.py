"""The machine code is generated for: CPU name, features, vector width, threads.

The host's CPU and features drive LLVM's target machine. Where AVX-512 exists the
vector width is 512 bits and functions say so (`prefer-vector-width` and
`min-legal-vector-width`): LLVM's X86 tuning prefers 256-bit vectors on some AVX-512
CPUs (Skylake-X, Ice Lake) and would split explicit 512-bit vectors there. (On this
project's znver4 machine the emitted code is the same with or without them.)
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import importlib.util
import os
from dataclasses import dataclass, field

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
    #: (`codegen.module.prefetch_targets`; `prefetches_weights` says where it pays)
    prefetch_weights: bool = True
    #: the largest panel of constants a parallel iteration reads that its reductions
    #: fetch ahead for the next iteration (`codegen.prefetch`; `panel_bytes` says how big)
    prefetch_panel: int = 1 << 16
    #: whether exp, log, pow, tanh and erf of vectors call glibc's libmvec
    #: (`codegen.vecmath`) instead of libm lane by lane
    vector_math: bool = False
    #: how many steps ahead a register-tiled reduction asks for the rows of computed
    #: tensors it reads as vectors, a new row a step (`codegen.prefetch`;
    #: `rows_ahead` says where it pays); 0 leaves them to the hardware's prefetchers
    input_ahead: int = 0
    #: whether each parallel iteration of a stencil reduction (a 3x3 conv) asks for the
    #: next iteration's weight panel, a line per reduction step, on targets that do not
    #: fetch weights across kernels (`codegen.prefetch.Prefetches.next_panel`;
    #: `panels_ahead` says where it pays)
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
    cpu, l2 = llvm.get_host_cpu_name(), l2_bytes()
    return Target(
        cpu=cpu,
        features=features,
        triple=llvm.get_process_triple(),
        vector_bits=bits,
        num_threads=threads,
        opt_level=opt_level,
        l2_bytes=l2,
        prefetch_weights=prefetches_weights(cpu),
        prefetch_panel=panel_bytes(cpu, l2),
        vector_math=vecmath_available(llvm.get_process_triple()),
        input_ahead=rows_ahead(cpu),
        panel_ahead=panels_ahead(cpu),
    )


#: CPUs (LLVM's names, by prefix) whose models run faster with the next kernel's weights
#: fetched ahead (`Target.prefetch_weights`). Measured, models against themselves in the
#: same turns: on a 2-vCPU Zen 5 host ResNet-50 took 0.977 instead of 1.016x
#: onnxruntime's time (tuned; 1.118 instead of 1.205x with default schedules); the other
#: Zen generations follow it unmeasured. On a
#: 2-vCPU Intel AVX-512 host (`rocketlake`) the window's step in every reduction loop
#: cost more than it saved: ResNet-50 1.239-1.255 -> 1.208-1.211x, VGG-19 1.019 ->
#: 0.965x, DenseNet-121 1.025 -> 1.021x; later, tuned, 1.040x without it against 1.069x
#: with it, 1.057-1.060x with each thread's share capped at 128 or 512 KB; in another
#: run, 1.046x without it against 1.13x (1.062x capped at 256 KB) with each iteration's
#: share asked for at once, before or after it, instead of a line per reduction step.
#: Elsewhere, unmeasured, the hardware's own prefetchers are left to it.
PREFETCH_WEIGHTS_CPUS = ("znver",)


def prefetches_weights(cpu: str) -> bool:
    """Whether the CPU LLVM names `cpu` prefetches weights by default."""
    return cpu.startswith(PREFETCH_WEIGHTS_CPUS)


#: the panel fetched ahead on the CPUs of `PREFETCH_WEIGHTS_CPUS`: on a Zen 5 (1 MiB L2)
#: ResNet-50's 64 KB panels of its 512->2048 1x1 convs gained 17% a call in the model, its
#: 128 KB and 256 KB panels nothing or lost
ZEN_PANEL_BYTES = 1 << 16


def panel_bytes(cpu: str, l2: int) -> int:
    """The largest weight panel of a parallel iteration fetched ahead for the next one
    (`Target.prefetch_panel`). Half of L2 elsewhere, so that the next panel fits beside
    the one in use: on a 2-vCPU Intel AVX-512 host (2 MiB L2) the 590 KB panels of
    ResNet-50's 3x3 convs over 7x7 pixels, read from memory at the first row of each
    channel block and from L2 at the other six, took 1.04 -> 0.93 ms a call in the model,
    the 256 KB ones of its 2048->512 1x1 convs 0.50 -> 0.44; the model 1.058-1.064 ->
    1.043-1.044x onnxruntime (tuned, same turns), a limit of L2/4 1.050x, 2 x L2 1.050x."""
    return ZEN_PANEL_BYTES if cpu.startswith(PREFETCH_WEIGHTS_CPUS) else l2 // 2


#: CPUs (LLVM's names, by prefix) whose reductions fetch their input rows ahead
#: (`Target.input_ahead`), and how many steps. Measured on a 2-vCPU Intel AVX-512 host
#: (`rocketlake`), same turns against onnxruntime: a 1x1 conv over pixel vectors reads a
#: new row of its input each channel, a stride the hardware streams do not follow, and
#: in the model its input is seldom all in the core's L2 (ResNet-50's 1024->256 conv
#: over 14x14 pixels, warm 0.36 ms; right after the conv writing its input 0.45 ms,
#: after the 3 MB-writing stem conv 0.48). ResNet-50 tuned 1.039 ->
#: 1.008x (12 steps 1.009, 24 1.013), default schedules 1.082 -> 1.054x (8 steps 1.069),
#: DenseNet-121 0.921 -> 0.891x, Inception v2 1.080 -> 1.076x and 1.085 -> 1.061x,
#: ShuffleNet 1.289 -> 1.239x, the others within their spread. Its 1024->256 1x1 convs
#: over 14x14 pixels 0.42 -> 0.38 ms a call. The other Intel server cores follow it
#: unmeasured; elsewhere the rows are left to the hardware.
ROWS_AHEAD_CPUS = (
    "rocketlake",
    "icelake-server",
    "sapphirerapids",
    "emeraldrapids",
    "graniterapids",
    "cascadelake",
    "cooperlake",
    "skylake-avx512",
)
ROWS_AHEAD = 16


def rows_ahead(cpu: str) -> int:
    """`Target.input_ahead` for the CPU LLVM names `cpu`."""
    return ROWS_AHEAD if cpu.startswith(ROWS_AHEAD_CPUS) else 0


#: CPUs (LLVM's names, by prefix) whose stencil reductions fetch the next parallel
#: iteration's weight panel (`Target.panel_ahead`): the Intel server cores of
#: `ROWS_AHEAD_CPUS`. Measured on the same 2-vCPU `rocketlake` host, same turns against
#: onnxruntime: a 3x3 conv parallel over output-channel blocks reads its block's panel
#: from memory at its first row of pixels, where the top border skips the kernel's first
#: row, and in pieces the hardware does not stream. ResNet-50 tuned 1.002 -> 0.976x
#: (its layer-3 3x3 convs 0.76 -> 0.69 ms a call, layer 4's 0.93 -> 0.82), default
#: schedules 1.049 -> 1.013x; Inception v2 1.095 -> 1.034x, ZFNet-512 0.581 -> 0.550x,
#: VGG-19 0.976 -> 0.967x, DenseNet-121 0.890 -> 0.896x (within its spread)
PANEL_AHEAD_CPUS = ROWS_AHEAD_CPUS


def panels_ahead(cpu: str) -> bool:
    """`Target.panel_ahead` for the CPU LLVM names `cpu`."""
    return cpu.startswith(PANEL_AHEAD_CPUS)


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@functools.cache
def l2_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size of this machine's per-core L2 as Linux reports it; 1 MiB where it does
    not (another OS, a container without sysfs), a Zen 4/5's and a Skylake-X's."""
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
