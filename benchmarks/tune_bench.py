"""Schedule search: tuning curves (best GFLOPS against trials) of model-guided (evolutionary
+ cost model) and random search, several seeds, for GEMM 1024³ and one ResNet-50 conv;
the best tuned GEMM against numpy in the same run; the cost model's ranking quality
(pairwise accuracy, top-k recall) on held-out records, regression against pairwise
ranking. Writes benchmarks/results/tune.{json,md} and tune.png.

Targets: GEMM 1024³ ≥ 100 GFLOPS within 128 trials (what TVM 0.27's MetaSchedule reports
after 128 trials); model-guided reaches random search's final best in at most half the
trials.

    python benchmarks/tune_bench.py [--trials 128] [--seeds 0 1] [--conv-trials 64]
    python benchmarks/tune_bench.py --variants sampled --merge   # add one variant's runs
    python benchmarks/tune_bench.py --report-only [--out DIR]    # re-render tune.json

numpy's figure depends on OPENBLAS_CORETYPE, which some of these machines set to Haswell
(AVX2 kernels, slower than its AVX-512 ones): see `gemm_bench.py`.
tune.md does not record whether it was set when its numpy figure was taken.

Variants: `evolutionary` (model-guided, its population seeded with the default
schedule's decisions), `sampled` (model-guided from samples only: the ablation that
shows what the seed is worth) and `random`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from fingerprint import fingerprint, header
from onnx import TensorProto, helper, numpy_helper

from polytile import zoo
from polytile.codegen.target import host
from polytile.search.cost_model import MODELS, trace_features
from polytile.search.measure import MeasureConfig
from polytile.search.records import RecordFile
from polytile.search.tasks import extract_tasks
from polytile.search.tune import tune

RESULTS = Path(__file__).resolve().parent / "results"


def gemm_model(n: int, constant_b: bool = False) -> object:
    """Y = A @ B with both operands inputs (as TVM's and numpy's GEMM), or with B a
    constant that the compiler packs ahead of time."""
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])]
    inits = []
    if constant_b:
        inits = [numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "b")]
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n]))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "gemm",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def curve(path: Path, flops: int) -> list[float]:
    """Best GFLOPS after each searched trial, in the records' order (the default
    schedule, measured first as the baseline, is left out)."""
    best, found = 0.0, []
    for r in RecordFile(path).read()[1:]:
        if r.ok:
            best = max(best, flops / r.latency / 1e9)
        found.append(best)
    return found


def numpy_gflops(n: int, repeat: int = 5) -> float:
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    a @ b
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


#: the compared searches: model-guided evolution from the default schedule's decisions,
#: the same from samples only (an ablation), and random search
VARIANTS: dict[str, dict] = {
    "evolutionary": {"strategy": "evolutionary"},
    "sampled": {"strategy": "evolutionary", "start_from_default": False},
    "random": {"strategy": "random"},
}


def run_curves(
    name: str, model: object, trials: int, seeds: list[int], tasks: str | None, variants: list[str]
) -> dict:
    task = extract_tasks(model)[int(tasks or 0)]
    out: dict = {"task_flops": task.flops, "runs": {}}
    records = []
    for variant in variants:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "r.jsonl"
                start = time.perf_counter()
                tune(
                    model, trials, str(path), seed, tasks, progress=False,
                    measure=MeasureConfig(workers=2), **VARIANTS[variant],
                )  # fmt: skip
                seconds = time.perf_counter() - start
                points = curve(path, task.flops)
                out["runs"][f"{variant}-{seed}"] = {"curve": points, "seconds": seconds}
                records.extend(RecordFile(path).read())
                print(
                    f"{name} {variant} seed {seed}: best {points[-1]:.1f} GFLOPS, {seconds:.0f} s"
                )
    out["records"] = records
    out["task"] = task
    return out


def best_overall(records: list, flops: int) -> float:
    """The best GFLOPS of all records, the default schedule included."""
    return max((flops / r.latency / 1e9 for r in records if r.ok), default=0.0)


def half_trials_check(runs: dict) -> dict:
    """Trials each model-guided variant needs to reach random search's final best."""
    found = {}
    for key, run in runs.items():
        if not key.startswith("random"):
            continue
        seed = key.split("-")[1]
        target = run["curve"][-1]
        for variant in ("evolutionary", "sampled"):
            guided = runs.get(f"{variant}-{seed}")
            if guided is None:
                continue
            reached = next((i + 1 for i, g in enumerate(guided["curve"]) if g >= target), None)
            found[f"{variant}-{seed}"] = {
                "random_best": round(target, 1),
                "trials_to_match": reached,
                "of": len(guided["curve"]),
            }
    return found


def ranking_quality(task: object, records: list) -> dict:
    """Held-out pairwise accuracy and top-5 recall of the two cost model formulations
    (regression on normalized throughput, pairwise ranking), on this run's records."""
    from polytile.poly.transform.steps import replay

    rows, scores, seen = [], [], set()
    for r in records:
        if not r.ok or r.trace_key() in seen:
            continue
        seen.add(r.trace_key())
        rows.append(trace_features(replay(task.kernel, r.trace)))
        scores.append(1.0 / r.latency)
    y = np.array(scores)
    y = y / y.max()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    cut = int(0.7 * len(y))
    train, test = order[:cut], order[cut:]
    if len(test) < 5:
        return {"samples": len(y)}
    found: dict = {"samples": len(y)}
    for kind, cls in MODELS.items():
        model = cls(seed=0)
        model.fit_rows([rows[i] for i in train], y[train].tolist())
        pred, truth = model.predict_rows([rows[i] for i in test]), y[test]
        pairs = [(i, j) for i in range(len(test)) for j in range(i + 1, len(test))]
        right = sum((pred[i] - pred[j]) * (truth[i] - truth[j]) > 0 for i, j in pairs)
        k = min(5, len(test))
        top = set(np.argsort(-truth)[:k]) & set(np.argsort(-pred)[:k])
        found[kind] = {"pairwise_accuracy": right / len(pairs), "top5_recall": len(top) / k}
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--conv-trials", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--merge", action="store_true", help="add these runs to tune.json's (same workloads)"
    )
    parser.add_argument("--report-only", action="store_true", help="re-render tune.json")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of tune.md, .png")
    args = parser.parse_args(argv)
    saved = RESULTS / "tune.json"
    if args.report_only:
        write_report(json.loads(saved.read_text()), args.out)
        return
    results: dict = json.loads(saved.read_text()) if args.merge else {}
    gemm = run_curves("gemm", gemm_model(args.n), args.trials, args.seeds, None, args.variants)
    resnet = zoo.materialize("resnet50")
    tasks = extract_tasks(str(resnet))
    conv = max((t for t in tasks if t.kind.startswith("Conv")), key=lambda t: t.flops * t.weight)
    conv_runs = run_curves(
        "conv", str(resnet), args.conv_trials, args.seeds, str(conv.index), args.variants
    )
    for name, found, extra in (
        ("gemm", gemm, {"n": args.n}),
        ("resnet50_conv", conv_runs, {"task": conv.index, "flops": conv.flops}),
    ):
        entry = results.setdefault(name, {})
        entry.update(extra)
        entry.setdefault("runs", {}).update(found["runs"])
        entry["half_trials"] = half_trials_check(entry["runs"])
        if not args.merge:
            entry["ranking"] = ranking_quality(found["task"], found["records"])
        if not args.merge or "default_gflops" not in entry:
            entry["default_gflops"] = default_gflops(found["records"], found["task"].flops)
    if not args.merge:
        target = host()
        results["host"] = {"cpu": target.cpu, "threads": target.num_threads}
        results["meta"] = fingerprint()
        results["gemm"]["numpy_gflops"] = numpy_gflops(args.n)
        results["gemm"]["best_gflops"] = best_overall(gemm["records"], gemm["task"].flops)
    RESULTS.mkdir(exist_ok=True)
    saved.write_text(json.dumps(results, indent=1, default=float))
    write_report(results, args.out)


def default_gflops(records: list, flops: int) -> float:
    """The default schedule's GFLOPS: each run measures it first (the best of them)."""
    from polytile.search.records import trace_key

    first = records[0]
    same = [r for r in records if r.ok and trace_key(r.trace) == trace_key(first.trace)]
    return max((flops / r.latency / 1e9 for r in same), default=0.0)


def write_report(results: dict, out: Path = RESULTS) -> None:
    """tune.md and tune.png in `out` from the results (also: --report-only, from tune.json).
    The header names the host the search ran on; when tune.json predates the recorded
    fingerprint, it names the host that re-rendered it as well."""
    lines = ["# Schedule search", ""]
    machine = results.get("host")
    if "meta" in results:
        lines += [header(results["meta"]), ""]
    else:
        lines += [f"Re-rendered from tune.json. {header(fingerprint())}", ""]
    if machine is not None:
        lines += [f"Searched on {machine['cpu']}, {machine['threads']} threads.", ""]
    workloads = {k: v for k, v in results.items() if k not in ("host", "meta")}
    for name, res in workloads.items():
        lines.append(f"## {name}")
        for key, run in res["runs"].items():
            lines.append(
                f"- {key}: best {run['curve'][-1]:.1f} GFLOPS after {len(run['curve'])} trials, "
                f"{run['seconds']:.0f} s"
            )
        if "default_gflops" in res:
            lines.append(f"- default schedule: {res['default_gflops']:.1f} GFLOPS")
        if "numpy_gflops" in res:
            lines.append(f"- numpy (same run): {res['numpy_gflops']:.1f} GFLOPS")
            lines.append(
                f"- best of all runs (default schedule included): {res['best_gflops']:.1f}"
            )
        lines.append(
            "- trials model-guided search needs to reach random search's final best: "
            f"{json.dumps(res['half_trials'])}"
        )
        lines.append(f"- cost model ranking (held out): {json.dumps(res['ranking'])}")
        lines.append("")
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.md").write_text("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, (name, res) in zip(axes, workloads.items(), strict=False):
            for key, run in res["runs"].items():
                style = {"evolutionary": "-", "sampled": "-."}.get(key.split("-")[0], "--")
                ax.step(range(1, len(run["curve"]) + 1), run["curve"], style, label=key)
            ax.set_title(name)
            ax.set_xlabel("trials")
            ax.set_ylabel("best GFLOPS")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "tune.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no chart")


if __name__ == "__main__":
    main()
