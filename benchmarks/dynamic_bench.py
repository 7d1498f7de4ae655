"""Models with symbolic sizes compiled once for all of them, against a static compile at
each size and against onnxruntime. Writes benchmarks/results/dynamic-CPU.{json,md}
(CPU: LLVM's name for this machine's).

Per model: the compile time of the dynamic model and of a static one (at the model's
first size), and per size the latency of the dynamic model, of the static compile at
that size and of onnxruntime, timed in interleaved turns (`turns.interleaved`), plus the
first call at a size the dynamic model has not run yet, right after a run at a size it
has, in steady-state runs (it compiles nothing: its native plan places the arena for the
new sizes). After a pause, any call, at a new size or not, also pays for waking the
thread team.

    python benchmarks/dynamic_bench.py [--models bert_small__dyn] [--turns 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from fingerprint import write_results
from turns import interleaved, ort_session

import polytile as pt
from polytile import zoo
from polytile.codegen import cache
from polytile.codegen.target import host

RESULTS = Path(__file__).resolve().parent / "results"
#: model -> (bounds, sizes: (batch, seq) or (batch,))
MODELS: dict[str, tuple[dict[str, tuple[int, int]], list[tuple[int, ...]]]] = {
    "bert_small__dyn": (
        {"seq": (1, 512)},
        [(1, 1), (1, 7), (1, 16), (1, 64), (1, 128), (1, 384), (1, 512), (2, 128), (4, 128)],
    ),
    "gpt2_2l__dyn": ({}, [(1, 1), (1, 7), (1, 16), (1, 64), (1, 128), (2, 64), (4, 64)]),
    "llama_small__dyn": ({}, [(1, 1), (1, 7), (1, 16), (1, 64), (1, 128), (2, 64), (4, 64)]),
    "resnet34__dyn": ({}, [(1,), (2,), (4,)]),
}


def _sizes(info: zoo.ModelInfo, point: Sequence[int]) -> dict[str, int]:
    return dict(zip(info.symbolic, point, strict=True))


def bench_model(
    name: str, turns: int, repeat: int, threads: int, count: int | None = None
) -> dict[str, object]:
    bounds, points = MODELS[name]
    points = points[:count]
    model = zoo.build(name)
    info = zoo.model_info(name)
    start = time.perf_counter()
    dynamic = pt.compile(model, bounds=bounds, num_threads=threads)
    dynamic_seconds = time.perf_counter() - start
    session = ort_session(model, threads)
    # a first run at a size of its own: later first calls are new sizes, not a cold start
    warm = zoo.random_inputs(model, dims={p: 3 for p in info.symbolic})
    dynamic.run(warm)
    rows = []
    for point in points:
        sizes = _sizes(info, point)
        feeds = zoo.random_inputs(model, dims=sizes)
        shapes = {k: v.shape for k, v in feeds.items()}
        # the first call at a size this model has not run, right after a run at a size it
        # has (its threads awake, as a server's between requests): against steady runs
        dynamic.run(warm)
        first = time.perf_counter()
        got = dynamic.run(feeds)
        first = time.perf_counter() - first
        start = time.perf_counter()
        static = pt.compile(model, input_shapes=shapes, dynamic=False, num_threads=threads)
        static_seconds = time.perf_counter() - start
        want = session.run(None, feeds)
        error = max(
            float(np.max(np.abs(w - g)) / (np.max(np.abs(w)) or 1.0))
            for w, g in zip(want, got, strict=True)
        )
        times = interleaved(
            {
                "dynamic": lambda f=feeds: dynamic.run(f),
                "static": lambda f=feeds, s=static: s.run(f),
                "onnxruntime": lambda f=feeds: session.run(None, f),
            },
            turns,
            repeat,
        )
        steady = statistics.median(times["dynamic"])
        rows.append(
            {
                "sizes": sizes,
                "dynamic_ms": steady * 1e3,
                "static_ms": statistics.median(times["static"]) * 1e3,
                "onnxruntime_ms": statistics.median(times["onnxruntime"]) * 1e3,
                "vs_static": _median_ratio(times["dynamic"], times["static"]),
                "vs_onnxruntime": _median_ratio(times["dynamic"], times["onnxruntime"]),
                "first_call_runs": first / steady,
                "static_compile_s": static_seconds,
                "max_rel_error": error,
            }
        )
        print(name, rows[-1], flush=True)
    return {
        "model": name,
        "bounds": bounds,
        "dynamic_compile_s": dynamic_seconds,
        "static_compile_s": _geomean([row["static_compile_s"] for row in rows]),
        "sizes": rows,
    }


def _warm_up(threads: int) -> None:
    """One small compile before any timed one: the first compile in a process also pays
    for importing the compiler and setting up its workers, which is no part of either
    compile being compared (its memos are cleared after it)."""
    pt.compile(zoo.build("mlp"), num_threads=threads)
    cache.EMITTED.clear()
    cache.COMPILED.clear()


def _median_ratio(mine: Sequence[float], theirs: Sequence[float]) -> float:
    return statistics.median(m / t for m, t in zip(mine, theirs, strict=True))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def table(results: Sequence[Mapping[str, object]], threads: int) -> list[str]:
    lines = [
        "# Models compiled once for all sizes: against a static compile per size and onnxruntime",
        "",
        f"{threads} threads; latency is the median of interleaved turns (each the best of a "
        "few runs); ratios are medians of per-turn ratios. *first call*: the first run at a "
        "size the model has not seen, right after a run at one it has (threads awake), in "
        "steady-state runs. Static compile: the geometric "
        "mean over the sizes of a compile at each.",
        "",
        "| model | compile dynamic / static (s) | sizes | dynamic / static (geomean, worst) "
        "| dynamic / onnxruntime (geomean) | first call (worst, runs) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        rows = r["sizes"]
        vs_static = [row["vs_static"] for row in rows]  # type: ignore[index]
        vs_ort = [row["vs_onnxruntime"] for row in rows]  # type: ignore[index]
        first = max(row["first_call_runs"] for row in rows)  # type: ignore[index]
        lines.append(
            f"| {r['model']} | {r['dynamic_compile_s']:.1f} / {r['static_compile_s']:.1f} "
            f"| {len(rows)} | {_geomean(vs_static):.2f}, {max(vs_static):.2f} "
            f"| {_geomean(vs_ort):.2f} | {first:.1f} |"
        )
    lines += ["", "| model | sizes | dynamic ms | static ms | onnxruntime ms | first call |"]
    lines.append("|---|---|---|---|---|---|")
    for r in results:
        for row in r["sizes"]:  # type: ignore[attr-defined]
            sizes = ", ".join(f"{k}={v}" for k, v in row["sizes"].items())
            lines.append(
                f"| {r['model']} | {sizes} | {row['dynamic_ms']:.3f} | {row['static_ms']:.3f} "
                f"| {row['onnxruntime_ms']:.3f} | {row['first_call_runs']:.1f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--points", type=int, default=None, help="the first N sizes only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    threads = args.threads or host().num_threads
    _warm_up(threads)
    results = [
        bench_model(m, args.turns, args.repeat, threads, args.points) for m in args.models
    ]
    stem = f"dynamic-{host().cpu}"
    for path in write_results(args.out, stem, results, table(results, threads)):
        print("wrote", path)


if __name__ == "__main__":
    main()
