"""Frontend speed per zoo model: import + passes + partitioning, against onnxruntime's
session creation (its graph optimizations) on the same model, in the same run.

Targets on a 2-vCPU machine: ResNet-50 under 1 s, DenseNet-121 under 2 s.
Writes benchmarks/results/frontend-CPU.json and frontend-CPU.md (CPU: LLVM's name for
this machine's).

    python benchmarks/frontend_bench.py [--models resnet50 densenet121] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import onnx
import onnxruntime as ort
from fingerprint import fingerprint, write_results

from polytile import zoo
from polytile.frontend import import_model, optimize, partition

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"resnet50": 1.0, "densenet121": 2.0}


def best_of(repeat: int, fn) -> tuple[float, object]:  # noqa: ANN001
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def measure(name: str, repeat: int) -> dict[str, object]:
    path = zoo.materialize(name)
    data = path.read_bytes()
    model = onnx.load_from_string(data)

    def frontend() -> tuple:
        graph = import_model(data, name=name)
        optimized = optimize(graph)
        return graph, optimized, partition(optimized)

    seconds, (graph, optimized, parts) = best_of(repeat, frontend)
    t_import, _ = best_of(repeat, lambda: import_model(data, name=name))
    t_opt, _ = best_of(repeat, lambda: optimize(graph))
    t_part, _ = best_of(repeat, lambda: partition(optimized))

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    t_ort, _ = best_of(repeat, lambda: ort.InferenceSession(data, options))
    return {
        "model": name,
        "onnx_nodes": len(model.graph.node),
        "nodes_after_import": len(graph.nodes),
        "nodes_after_passes": len(optimized.nodes),
        "groups": len(parts.groups),
        "group_kinds": parts.summary(),
        "frontend_s": round(seconds, 4),
        "import_s": round(t_import, 4),
        "passes_s": round(t_opt, 4),
        "partition_s": round(t_part, 4),
        "ort_session_s": round(t_ort, 4),
        "ratio_vs_ort_session": round(seconds / t_ort, 2),
        "target_s": TARGETS.get(name),
        "meets_target": None if name not in TARGETS else seconds <= TARGETS[name],
    }


def markdown(rows: list[dict[str, object]]) -> list[str]:
    title = "# Frontend: import, passes and partitioning against onnxruntime's session creation"
    head = (
        "| model | ONNX nodes | after passes | groups | frontend s | import s | passes s "
        "| partition s | ORT session s | ratio | target s |"
    )
    lines = [title, "", "Best of the repeats, one thread.", "", head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['onnx_nodes']} | {r['nodes_after_passes']} | {r['groups']} "
            f"| {r['frontend_s']:.3f} | {r['import_s']:.3f} | {r['passes_s']:.3f} "
            f"| {r['partition_s']:.3f} | {r['ort_session_s']:.3f} | {r['ratio_vs_ort_session']} "
            f"| {r['target_s'] or ''} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    static = [i.name for i in zoo.list_models() if not (i.quantized or i.symbolic)]
    parser.add_argument("--models", nargs="*", default=static)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        row = measure(name, args.repeat)
        print(
            f"{name:<14} {row['frontend_s']:.3f} s  groups {row['groups']:>4}  "
            f"({row['ratio_vs_ort_session']}× ORT session creation)",
            flush=True,
        )
        rows.append(row)
    fp = fingerprint()
    write_results(
        args.out, f"frontend-{fp['cpu']}", rows, markdown(rows), {"repeat": args.repeat}, fp
    )
    worst = [r["model"] for r in rows if r["meets_target"] is False]
    print(
        f"median frontend time {statistics.median(r['frontend_s'] for r in rows):.3f} s; "
        f"missed targets: {worst or 'none'}"
    )


if __name__ == "__main__":
    main()
