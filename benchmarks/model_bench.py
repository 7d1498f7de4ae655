"""Per zoo model: polytile's compile time and default-schedule latency against
onnxruntime's latency on the same inputs, in the same process, plus the agreement of the
outputs. Writes benchmarks/results/models-CPU.{json,md} and models-CPU.png (a bar chart
of the latency ratios; CPU: LLVM's name for this machine's).

When `openvino` is installed (the `openvino` extra), its CPU plugin is a further peer,
with f32 inference forced (else it may run bf16 or f16 where the CPU has them, which is
not the same computation) and the same thread count; its outputs are checked against
onnxruntime's. A model OpenVINO cannot compile or run keeps its row, with the reason.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fingerprint import fingerprint, write_results

import polytile as pt
from polytile import zoo
from polytile.codegen.target import host

try:
    import openvino as ov
except ImportError:  # an optional peer: the table says it is absent
    ov = None

RESULTS = Path(__file__).resolve().parent / "results"
#: every static float model (int8 ones are refused, symbolic ones need sizes); VGG-19 last
DEFAULT = [
    i.name for i in zoo.list_models() if not (i.quantized or i.symbolic or i.name == "vgg19")
] + ["vgg19"]
#: turns each peer takes, and the pause before each turn (seconds)
ROUNDS = 5
PAUSE = 0.3


#: OpenVINO's CPU plugin settings: f32 forced, one request at a time
OPENVINO_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()
    fn()
    found = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        found.append(time.perf_counter() - start)
    return found


def rel_error(want: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """The largest difference relative to the largest reference magnitude, over outputs."""
    return max(
        float(np.max(np.abs(w.astype(np.float64) - g)) / (np.max(np.abs(w)) or 1.0))
        for w, g in zip(want, got, strict=True)
    )


def turn_ratio(mine: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of the turns' ratios (each turn's times were taken side by side)."""
    return statistics.median(m / t for m, t in zip(mine, theirs, strict=True))


def _reason(error: Exception) -> str:
    """An exception as one table-safe line (OpenVINO's messages span lines and paths)."""
    text = " ".join(str(error).split()).replace("|", "/")
    return f"{type(error).__name__}: {text[:300]}"


def openvino_call(
    path: Path, threads: int, outputs: Sequence[str], feeds: Mapping[str, np.ndarray]
) -> tuple[Callable[[], list[np.ndarray]] | None, str | None]:
    """A call running the model on OpenVINO's CPU plugin with f32 forced, returning the
    outputs in onnxruntime's order; or None and why it cannot."""
    if ov is None:
        return None, "not installed"
    try:
        config = {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": threads}
        compiled = ov.Core().compile_model(str(path), "CPU", config)
        precision = compiled.get_property("INFERENCE_PRECISION_HINT")
        if precision != ov.Type.f32:
            return None, f"inference precision {precision} where f32 was asked for"
        by_name = {n: port for port in compiled.outputs for n in port.get_names()}
        ports = [by_name.get(name) for name in outputs]
        if None in ports:
            if len(compiled.outputs) != len(outputs):
                return None, f"{len(compiled.outputs)} outputs where onnxruntime has {len(outputs)}"
            ports = list(compiled.outputs)
        request = compiled.create_infer_request()

        def run() -> list[np.ndarray]:
            result = request.infer(feeds, share_inputs=True)
            return [result[port] for port in ports]

        run()
    except Exception as error:  # any failure of the peer goes into the row, not a crash
        return None, _reason(error)
    return run, None


def measure(
    name: str,
    repeat: int,
    threads: int,
    records: str | None = None,
    rounds: int = ROUNDS,
    openvino: bool = True,
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
    calls: dict[str, Callable[[], object]] = {
        "polytile": lambda: model.run(feeds),
        "onnxruntime": lambda: session.run(None, feeds),
    }
    ov_run, ov_failure = None, None
    if openvino and ov is not None:
        names = [o.name for o in session.get_outputs()]
        ov_run, ov_failure = openvino_call(path, threads, names, feeds)
        if ov_run is not None:
            calls["openvino"] = ov_run
    # the peers take turns, `rounds` times, and a ratio is the median of the rounds'
    # ratios: the VM's speed drifts over minutes, a turn takes seconds. Each
    # turn starts after a pause, so the previous peer's spinning worker threads (libgomp's,
    # onnxruntime's, OpenVINO's) have gone to sleep and do not steal the two cores.
    turns: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            time.sleep(PAUSE)
            turns[label].append(statistics.median(timed(call, repeat)))
    mine, theirs = statistics.median(turns["polytile"]), statistics.median(turns["onnxruntime"])
    want = session.run(None, feeds)
    ov_error = rel_error(want, ov_run()) if ov_run is not None else None
    session = ov_run = None  # their threads stop before the next model
    calls.clear()
    time.sleep(PAUSE)
    model.set_num_threads(1)
    serial = statistics.median(timed(lambda: model.run(feeds), repeat))
    model.set_num_threads(threads)
    error = rel_error(want, model.run(feeds))
    stats = model.stats
    row: dict[str, object] = {
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
        "ratio": round(turn_ratio(turns["polytile"], turns["onnxruntime"]), 2),
        "serial_ms": round(serial * 1e3, 3),
        "thread_speedup": round(serial / mine, 2),
        "max_rel_error": float(f"{error:.2e}"),
    }
    if openvino and ov is not None:
        found = "openvino" in turns
        row.update(
            openvino_ms=round(statistics.median(turns["openvino"]) * 1e3, 3) if found else None,
            openvino_ratio=(
                round(turn_ratio(turns["openvino"], turns["onnxruntime"]), 2) if found else None
            ),
            polytile_openvino_ratio=(
                round(turn_ratio(turns["polytile"], turns["openvino"]), 2) if found else None
            ),
            openvino_max_rel_error=float(f"{ov_error:.2e}") if ov_error is not None else None,
            openvino_failure=ov_failure,
        )
    return row


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


def geomean(values: Sequence[object]) -> str:
    """The geometric mean of the numbers among `values`, as a table cell."""
    found = [float(v) for v in values if isinstance(v, int | float)]
    return f"{statistics.geometric_mean(found):.2f}×" if found else "—"


def table(rows: Sequence[Mapping[str, object]], openvino: bool) -> list[str]:
    """The md table of the rows (OpenVINO's columns when it was a peer), a geometric-mean
    row of the ratios, and the reasons OpenVINO failed on some models."""
    head = (
        "| model | compile s (LLVM) | kernels (functions) | arena MiB (unshared) "
        "| polytile ms | onnxruntime ms | polytile / onnxruntime | 1-thread ms (speedup) "
        "| max rel. error |"
    )
    peer = " openvino ms | openvino / onnxruntime | polytile / openvino | openvino max rel. error |"
    columns = 9 + 4 * openvino
    lines = [head + (peer if openvino else ""), "|---" * columns + "|"]
    failures = []
    for r in rows:
        line = (
            f"| {r['model']} | {r['compile_s']} ({r['compile_llvm_s']}) | {r['kernels']} "
            f"({r['functions']}) | {r['arena_mib']} ({r['unshared_mib']}) | {r['polytile_ms']} "
            f"| {r['onnxruntime_ms']} | {r['ratio']}× | {r['serial_ms']} "
            f"({r['thread_speedup']}×) | {r['max_rel_error']} |"
        )
        if openvino and r.get("openvino_failure"):
            failures.append(f"- {r['model']}: {r['openvino_failure']}")
            line += " failed (below) | — | — | — |"
        elif openvino:
            line += (
                f" {r['openvino_ms']} | {r['openvino_ratio']}× | {r['polytile_openvino_ratio']}× "
                f"| {r['openvino_max_rel_error']} |"
            )
        lines.append(line)
    means = ["**geometric mean**", *[""] * 5, geomean([r["ratio"] for r in rows]), "", ""]
    if openvino:
        means += [
            "",
            geomean([r.get("openvino_ratio") for r in rows]),
            geomean([r.get("polytile_openvino_ratio") for r in rows]),
            "",
        ]
    lines.append("| " + " | ".join(means) + " |")
    if failures:
        lines += ["", "OpenVINO could not compile or run:", "", *failures]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns each peer takes")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--records", help="tuning records to compile with")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    parser.add_argument(
        "--no-openvino", action="store_true", help="leave OpenVINO out even when installed"
    )
    args = parser.parse_args(argv)
    openvino = ov is not None and not args.no_openvino
    target = host(args.threads)
    stem = f"{'models_tuned' if args.records else 'models'}-{target.cpu}"
    schedules = "tuned schedules" if args.records else "default schedules"
    rows = []
    for name in args.models:
        row = measure(name, args.repeat, target.num_threads, args.records, args.rounds, openvino)
        print(json.dumps(row))
        rows.append(row)
    extra = overhead(5)
    print(json.dumps(extra))
    fp = fingerprint(args.threads)
    if openvino:
        version = fp["versions"].get("openvino", ov.__version__)  # type: ignore[union-attr]
        peers = f"onnxruntime {ort.__version__} and OpenVINO {version} (CPU plugin, f32 forced)"
        absent = ""
    else:
        peers = f"onnxruntime {ort.__version__}"
        absent = (
            " OpenVINO is not installed (`pip install -e '.[openvino]'`): no OpenVINO columns."
            if ov is None
            else " OpenVINO left out (--no-openvino)."
        )
    meta = {
        "records": args.records,
        "rounds": args.rounds,
        "repeat": args.repeat,
        "openvino_config": {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": target.num_threads}
        if openvino
        else None,
        **extra,
    }
    lines = [
        f"# Models: polytile {schedules} vs {peers}",
        "",
        f"{fp['cpu']}, {fp['vector_bits']}-bit vectors, {fp['threads']} threads; "
        f"Python overhead per run {extra['run_overhead_us']} µs. The peers take {args.rounds} "
        "turns, each after a pause; a latency is the median of the turns' medians, a ratio "
        f"the median of the turns' ratios, all in one process run.{absent}",
        "",
        *table(rows, openvino),
    ]
    write_results(args.out, stem, rows, lines, meta, fp)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        names = np.arange(len(rows))
        width = 0.4 if openvino else 0.8
        ax.bar(names, [r["ratio"] for r in rows], width, label="polytile")
        if openvino:
            ratios = [r.get("openvino_ratio") or 0.0 for r in rows]
            ax.bar(names + width, ratios, width, label="OpenVINO f32")
            ax.legend()
        ax.set_xticks(names + (width / 2 if openvino else 0.0), [r["model"] for r in rows])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("latency / onnxruntime (lower is better)")
        ax.set_title(f"polytile {schedules}{' and OpenVINO' if openvino else ''} vs onnxruntime")
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        fig.tight_layout()
        fig.savefig(args.out / f"{stem}.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no chart")


if __name__ == "__main__":
    main()
