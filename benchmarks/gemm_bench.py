"""GEMM (C = A·B, float32) with polytile's default schedule against numpy (OpenBLAS) in
one process run; writes benchmarks/results/gemm-CPU.{json,md} (CPU: LLVM's name for this
machine's).

numpy is timed first: libgomp's worker threads spin for a while after a parallel
region and would steal cores from OpenBLAS if polytile ran just before it. Some of these
machines set OPENBLAS_CORETYPE=Haswell (older OpenBLAS builds misbehave on their CPUs),
which holds OpenBLAS to AVX2 kernels, well below its full-width speed.
The results name the kernels OpenBLAS ran; to time it at full width:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/gemm_bench.py
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from fingerprint import fingerprint, write_results

from polytile.codegen.configs import default_config
from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.poly.default.schedule import default_schedule
from polytile.poly.dsl import kernel

RESULTS = Path(__file__).parent / "results"


def best_of(fn: object, repeat: int) -> float:
    """The fastest of `repeat` runs (seconds): the least disturbed by other work."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def bench(n: int, repeat: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    a @ b
    numpy_s = best_of(lambda: a @ b, repeat)

    target = host()
    k = kernel("C[i, j] += A[i, k] * B[k, j]", A=(n, n), B=(n, n))
    schedule = default_schedule(k, default_config(target))
    start = time.perf_counter()
    native = NativeKernel(schedule, target)
    compile_s = time.perf_counter() - start
    buffers = native.buffers({"A": a, "B": b})
    native.run_on(buffers)
    error = float(np.abs(buffers["C"] - a @ b).max() / np.abs(a @ b).max())
    polytile_s = best_of(lambda: native.run_on(buffers), repeat)
    flops = 2.0 * n**3
    return {
        "n": n,
        "threads": target.num_threads,
        "cpu": target.cpu,
        "numpy_gflops": flops / numpy_s / 1e9,
        "polytile_gflops": flops / polytile_s / 1e9,
        "ratio": numpy_s / polytile_s,
        "relative_error": error,
        "llvm_compile_s": compile_s,
    }


def openblas_kernels() -> str:
    """The kernels numpy's OpenBLAS runs ("Haswell", "SkylakeX", ...)."""
    from threadpoolctl import threadpool_info

    found = [i.get("architecture") for i in threadpool_info() if i["internal_api"] == "openblas"]
    return str(found[0]) if found else "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[1024])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    rows = [bench(n, args.repeat) for n in args.n]
    meta = {
        "openblas": openblas_kernels(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
    }
    fp = fingerprint()
    cpu = fp["cpu"]
    lines = [
        "# GEMM float32, default schedule vs numpy (same process run)",
        "",
        f"{cpu}; numpy's OpenBLAS ran its {meta['openblas']} kernels "
        f"(OPENBLAS_CORETYPE={meta['OPENBLAS_CORETYPE']}).",
        "",
        "| n | threads | polytile GFLOPS | numpy GFLOPS | polytile / numpy | rel. error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['threads']} | {r['polytile_gflops']:.1f} | "
            f"{r['numpy_gflops']:.1f} | {r['ratio']:.2f} | {r['relative_error']:.1e} |"
        )
    write_results(args.out, f"gemm-{cpu}", rows, lines, meta, fp)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
