"""Per zoo model: polytile's compile time and default-schedule latency against
onnxruntime's latency on the same inputs, in the same process, plus the agreement of the
outputs. Writes benchmarks/results/models-CPU.{json,md} and models-CPU.png (a bar chart
of the latency ratios; CPU: LLVM's name for this machine's).

Targets on this 2-vCPU machine: ResNet-50 latency ≤ 2× onnxruntime (moonshot ≤ 1.2×),
compile ≤ 10 s.

    python benchmarks/model_bench.py [--models resnet50 squeezenet] [--repeat 10]
    python benchmarks/model_bench.py --models resnet50 --records r.jsonl   # tuned

With `--records` (from `polytile tune`), each kernel uses its best verified record and
the results go to models_tuned-CPU.{json,md,png}. `--out DIR` writes them elsewhere
(`benchmarks/report.py --quick` does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fingerprint import fingerprint, write_results

import polytile as pt
from polytile import zoo
from polytile.codegen.target import host

RESULTS = Path(__file__).resolve().parent / "results"
#: every static float model (int8 ones are refused, symbolic ones need sizes); VGG-19 last
DEFAULT = [
    i.name for i in zoo.list_models() if not (i.quantized or i.symbolic or i.name == "vgg19")
] + ["vgg19"]
#: turns each peer takes, and the pause before each turn (seconds)
ROUNDS = 5
PAUSE = 0.3


def timed(fn, repeat: int) -> list[float]:  # noqa: ANN001
    fn()
    fn()
    found = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        found.append(time.perf_counter() - start)
    return found


def measure(
    name: str, repeat: int, threads: int, records: str | None = None, rounds: int = ROUNDS
) -> dict[str, object]:
    path = zoo.materialize(name)
    start = time.perf_counter()
    model = pt.compile(str(path), num_threads=threads, records=records)
    compile_s = time.perf_counter() - start
    feeds = model.random_inputs(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    # the peers take turns, `rounds` times, and the ratio is the median of the rounds'
    # ratios: the VM's speed drifts over minutes, a turn takes seconds. Each
    # turn starts after a pause, so the other peer's spinning worker threads (libgomp's,
    # onnxruntime's) have gone to sleep and do not steal the two cores.
    mine_rounds, theirs_rounds = [], []
    for _ in range(rounds):
        time.sleep(PAUSE)
        mine_rounds.append(statistics.median(timed(lambda: model.run(feeds), repeat)))
        time.sleep(PAUSE)
        theirs_rounds.append(statistics.median(timed(lambda: session.run(None, feeds), repeat)))
    mine, theirs = statistics.median(mine_rounds), statistics.median(theirs_rounds)
    ratio = statistics.median(m / t for m, t in zip(mine_rounds, theirs_rounds, strict=True))
    want = session.run(None, feeds)
    session = None  # its threads stop before the next model
    time.sleep(PAUSE)
    model.set_num_threads(1)
    serial = statistics.median(timed(lambda: model.run(feeds), repeat))
    model.set_num_threads(threads)
    got = model.run(feeds)
    error = max(
        float(np.max(np.abs(w.astype(np.float64) - g)) / (np.max(np.abs(w)) or 1.0))
        for w, g in zip(want, got, strict=True)
    )
    stats = model.stats
    return {
        "model": name,
        "compile_s": round(compile_s, 2),
        "compile_llvm_s": round(stats.llvm, 2),
        "compile_schedule_s": round(stats.schedule, 2),
        "kernels": stats.kernels,
        "functions": stats.functions,
        "arena_mib": round(stats.arena_bytes / 2**20, 1),
        "unshared_mib": round(stats.unshared_bytes / 2**20, 1),
        "polytile_ms": round(mine * 1e3, 3),
        "onnxruntime_ms": round(theirs * 1e3, 3),
        "ratio": round(ratio, 2),
        "serial_ms": round(serial * 1e3, 3),
        "thread_speedup": round(serial / mine, 2),
        "max_rel_error": float(f"{error:.2e}"),
    }


def overhead(repeat: int) -> dict[str, float]:
    """Python overhead of one run: a one-element Relu model against a bare ctypes call."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = pt.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": np.ones(1, np.float32)}
    per_run = min(timed(lambda: [model.run(feeds) for _ in range(1000)], repeat)) / 1000
    return {"run_overhead_us": round(per_run * 1e6, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns each peer takes")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--records", help="tuning records to compile with")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    target = host(args.threads)
    stem = f"{'models_tuned' if args.records else 'models'}-{target.cpu}"
    schedules = "tuned schedules" if args.records else "default schedules"
    rows = []
    for name in args.models:
        row = measure(name, args.repeat, target.num_threads, args.records, args.rounds)
        print(json.dumps(row))
        rows.append(row)
    extra = overhead(5)
    print(json.dumps(extra))
    fp = fingerprint(args.threads)
    meta = {"records": args.records, "rounds": args.rounds, "repeat": args.repeat, **extra}
    lines = [
        f"# Models: polytile {schedules} vs onnxruntime {ort.__version__}",
        "",
        f"{fp['cpu']}, {fp['vector_bits']}-bit vectors, {fp['threads']} threads; "
        f"Python overhead per run {extra['run_overhead_us']} µs. The peers take {args.rounds} "
        "turns; a latency is the median of the turns' medians, the ratio the median of "
        "the turns' ratios, all in one process run.",
        "",
        "| model | compile s (LLVM) | kernels (functions) | arena MiB (unshared) "
        "| polytile ms | onnxruntime ms | ratio | 1-thread ms (speedup) | max rel. error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['compile_s']} ({r['compile_llvm_s']}) | {r['kernels']} "
            f"({r['functions']}) | {r['arena_mib']} ({r['unshared_mib']}) | {r['polytile_ms']} "
            f"| {r['onnxruntime_ms']} | {r['ratio']}× | {r['serial_ms']} "
            f"({r['thread_speedup']}×) | {r['max_rel_error']} |"
        )
    write_results(args.out, stem, rows, lines, meta, fp)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        ax.bar([r["model"] for r in rows], [r["ratio"] for r in rows])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("latency / onnxruntime (lower is better)")
        ax.set_title(f"polytile {schedules} vs onnxruntime")
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        fig.tight_layout()
        fig.savefig(args.out / f"{stem}.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no chart")


if __name__ == "__main__":
    main()
