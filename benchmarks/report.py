"""`make report`: regenerate this host's tables and figures in benchmarks/results, each
stamped with the host's fingerprint, and say how long each part took.

Every part runs its benchmark script in a fresh process (one runtime's threads or memory
must not carry over into the next part's timings). Where a re-tune would take hours, a
part re-measures or re-renders from the recorded tuning files instead (as the Ansor
artifact does): the tuned models compile with `results/resnet50_best.jsonl`, the tuning
curves re-render `results/tune.json`. Files of other hosts (named by LLVM's CPU name)
are left alone. The last part rewrites the README's status table (`status.py`).

    python benchmarks/report.py                          # everything, into benchmarks/results
    python benchmarks/report.py --parts gemm conv        # some parts
    python benchmarks/report.py --quick                  # smoke run into a temporary directory
    python benchmarks/report.py --list                   # the parts and last run's times

Writes report-CPU.{md,json}: what each part generated, its wall time, the fingerprint.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fingerprint import fingerprint, write_results

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
RECORDS = RESULTS / "resnet50_best.jsonl"


@dataclass(frozen=True)
class Part:
    """One step of the report: a benchmark script run with `args` (or `quick` for a smoke
    run) and `--out DIR`, or an in-process function of (out, cpu, quick)."""

    name: str
    what: str
    outputs: tuple[str, ...]  # file names written, "{cpu}" standing for LLVM's CPU name
    script: str | None = None
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    run: Callable[[Path, str, bool], str | None] | None = None
    #: the recorded file it starts from, and the script that records it (not run here)
    recorded: str | None = None
    made_by: str | None = None
    #: a reason this host cannot run it (None: it can)
    skip: Callable[[dict], str | None] | None = None
    #: rough minutes of a full run on a quiet 2-core host, shown until a run is timed
    minutes: float = 1.0


def _no_records(fp: dict) -> str | None:
    from polytile.codegen.target import host
    from polytile.search.records import RecordFile

    if not RECORDS.exists():
        return f"no {RECORDS.name}"
    if not RecordFile(RECORDS).read(target=host().key()):
        return f"{RECORDS.name} holds no records of {fp['cpu']} (run resnet50_tune_bench.py)"
    return None


def _collected_only(fp: dict) -> str | None:
    """The cost model's evaluation needs the measured records behind its shipped rows,
    which only a collection on this host makes (about an hour of measuring)."""
    return "run train_cost_model.py collect, build and evaluate (about an hour)"


def _no_avx512(fp: dict) -> str | None:
    return None if "avx512f" in fp["features"] else "no AVX-512 on this host"


def compile_times(out: Path, cpu: str, quick: bool) -> str | None:
    """compile-CPU.{json,md,png}: the models part's compile times, by stage."""
    source = out / f"models-{cpu}.json"
    if not source.exists():
        return f"no {source.name}: run the models part first"
    data = json.loads(source.read_text())
    rows = [
        {
            "model": r["model"],
            "compile_s": r["compile_s"],
            "llvm_s": r["compile_llvm_s"],
            "schedule_s": r["compile_schedule_s"],
            "other_s": round(r["compile_s"] - r["compile_llvm_s"] - r["compile_schedule_s"], 2),
            "kernels": r["kernels"],
            "functions": r["functions"],
        }
        for r in sorted(data["rows"], key=lambda r: -r["compile_s"])
    ]
    total = sum(r["compile_s"] for r in rows)
    lines = [
        "# Compile times (default schedules)",
        "",
        f"From {source.name}: {len(rows)} models, {total:.0f} s in all. LLVM: IR emission "
        "and machine code; schedule: each kernel's schedule chosen (or replayed) and "
        "verified; other: import, graph passes, lowering.",
        "",
        "| model | compile s | LLVM s | schedule s | other s | kernels (functions) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['compile_s']:.2f} | {r['llvm_s']:.2f} | {r['schedule_s']:.2f} "
        f"| {r['other_s']:.2f} | {r['kernels']} ({r['functions']}) |"
        for r in rows
    ]
    meta = data["meta"]
    fp = meta if {"features", "versions", "polytile_commit"} <= meta.keys() else None
    write_results(out, f"compile-{cpu}", rows, lines, {"source": source.name}, fp)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 0.25 * len(rows) + 1.5))
        names = [r["model"] for r in rows][::-1]
        left = [0.0] * len(rows)
        for key in ("llvm_s", "schedule_s", "other_s"):
            widths = [max(r[key], 0.0) for r in rows][::-1]
            ax.barh(names, widths, left=left, label=key[:-2])
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_xlabel("compile seconds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"compile-{cpu}.png", dpi=120)
        plt.close(fig)
    except ImportError:
        return "matplotlib is not installed: no chart"
    return None


def readme_status(out: Path, cpu: str, quick: bool) -> str | None:
    """The README's status table from this host's models file; a smoke run only prints it."""
    from status import main as status

    if not (out / f"models-{cpu}.json").exists():
        return f"no models-{cpu}.json in {out}"
    args = ["--results", str(out), "--cpu", cpu]
    if quick or out.resolve() != RESULTS:
        args.append("--print")
    return None if status(args) == 0 else "status.py failed"


def _files(stem: str, figure: bool = False) -> tuple[str, ...]:
    """A part's json and md (and png) in the results directory."""
    return (f"{stem}.json", f"{stem}.md", *((f"{stem}.png",) if figure else ()))


#: quick runs: one turn of one run per peer
ONE_TURN = ("--turns", "1", "--repeat", "1")
PARTS: tuple[Part, ...] = (
    Part(
        "models", "every static float zoo model against onnxruntime: latency, agreement",
        _files("models-{cpu}", figure=True), script="model_bench.py", minutes=13,
        quick=("--models", "mlp", "squeezenet1_1", "--repeat", "2", "--rounds", "1"),
    ),
    Part(
        "compile", "compile times by stage, from the models part",
        _files("compile-{cpu}", figure=True), run=compile_times, minutes=0.1,
    ),
    Part(
        "tuned", "ResNet-50 compiled with its best recorded schedules against onnxruntime",
        _files("models_tuned-{cpu}", figure=True), script="model_bench.py", minutes=1,
        args=("--models", "resnet50", "--records", str(RECORDS)),
        quick=("--models", "resnet50", "--records", str(RECORDS), "--repeat", "1", "--rounds", "1"),
        recorded=RECORDS.name, made_by="resnet50_tune_bench.py", skip=_no_records,
    ),
    Part(
        "gemm", "GEMM against numpy (OpenBLAS)", _files("gemm-{cpu}"), script="gemm_bench.py",
        quick=("--n", "256", "--repeat", "2"), minutes=0.5,
    ),
    Part(
        "conv", "3x3 convolutions: Winograd, direct, onnxruntime", _files("conv-{cpu}"),
        script="conv_bench.py", quick=("--shapes", "1", *ONE_TURN), minutes=2,
    ),
    Part(
        "conv-avx2", "the same convolutions compiled for AVX2 only", _files("conv-{cpu}-avx2"),
        script="conv_bench.py", args=("--avx2",), quick=("--avx2", "--shapes", "1", *ONE_TURN),
        skip=_no_avx512, minutes=2,
    ),
    Part(
        "elementwise", "transcendental elementwise ops: libmvec, libm, onnxruntime, numpy",
        _files("elementwise-{cpu}"), script="elementwise_bench.py", minutes=1.5,
        quick=("--ops", "Exp", *ONE_TURN),
    ),
    Part(
        "frontend", "frontend time against onnxruntime's session creation",
        _files("frontend-{cpu}"), script="frontend_bench.py", minutes=3,
        quick=("--models", "mlp", "squeezenet1_1", "--repeat", "1"),
    ),
    Part(
        "index-checks", "cost of the run-time index checks in the text models",
        _files("index-checks-{cpu}"), script="index_check_bench.py", minutes=2,
        quick=("--models", "gpt2_2l", *ONE_TURN),
    ),
    Part(
        "tuning", "tuning curves and cost-model ranking, re-rendered", ("tune.md", "tune.png"),
        script="tune_bench.py", args=("--report-only",), quick=("--report-only",), minutes=0.1,
        recorded="tune.json", made_by="tune_bench.py",
    ),
    Part(
        "cost-model", "the pre-trained cost model's ranking on held-out models (recorded)",
        _files("cost_model-{cpu}"), recorded="search/data/cost_model_rows.npz",
        made_by="train_cost_model.py", skip=_collected_only, minutes=0.1,
    ),
    Part(
        "dynamic", "symbolic models compiled once against static compiles and onnxruntime",
        _files("dynamic-{cpu}"), script="dynamic_bench.py", minutes=8,
        quick=("--models", "gpt2_2l__dyn", "--points", "1", *ONE_TURN),
    ),
    Part(
        "fuzz", "random legal schedules of the zoos' kernels against the reference",
        _files("fuzz-{cpu}"), script="fuzz_bench.py",
        args=("--resume", "--jobs", "2", "--minutes", "10"),
        quick=("--samples", "10", "--models", "squeezenet"), minutes=11,
    ),
    Part("status", "the README's status table (status.py)", (), run=readme_status, minutes=0.1),
)  # fmt: skip
#: generated files that only a re-tune would refresh: kept, named in the index
RETUNE_ONLY = {
    "resnet50_tuned-{cpu}.md": "python benchmarks/resnet50_tune_bench.py (hours)",
    "tune.json": "python benchmarks/tune_bench.py (hours)",
    "cost_model-{cpu}.md": "python benchmarks/train_cost_model.py collect/build/evaluate (an hour)",
}


def run_part(part: Part, out: Path, cpu: str, quick: bool) -> str | None:
    """Runs one part; returns None when it succeeded, else why not."""
    if part.run is not None:
        return part.run(out, cpu, quick)
    argv = [*(part.quick if quick else part.args), "--out", str(out)]
    command = [sys.executable, str(BENCHMARKS / part.script), *argv]  # type: ignore[operator]
    print(f"report: {part.name}: {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=BENCHMARKS.parent, check=False)
    return None if done.returncode == 0 else f"exit status {done.returncode}"


def index(out: Path, fp: dict, rows: list[dict], quick: bool) -> list[Path]:
    """report-CPU.{md,json}: what each part wrote and how long it took."""
    lines = [
        f"# Benchmark report{' (smoke run: --quick)' if quick else ''}",
        "",
        "Regenerate with `make report` (`python benchmarks/report.py --parts NAME ...` for "
        "some parts). Wall times include compiling and the pauses between turns.",
        "",
        "| part | what | files | wall s | result |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        files = ", ".join(f"`{f}`" for f in r["files"]) or "-"
        what = r["what"] + (f" (from the recorded `{r['recorded']}`)" if r["recorded"] else "")
        lines.append(f"| {r['part']} | {what} | {files} | {r['seconds']:.0f} | {r['result']} |")
    total = sum(r["seconds"] for r in rows)
    lines += ["", f"Total {total / 60:.1f} min.", "", "Recorded, not regenerated here:", ""]
    lines += [
        f"- `{name.format(cpu=fp['cpu'])}`: {how}"
        for name, how in RETUNE_ONLY.items()
        if (RESULTS / name.format(cpu=fp["cpu"])).exists()
    ]
    return write_results(out, f"report-{fp['cpu']}", rows, lines, {"quick": quick}, fp)


def _written_since(path: Path, started: float) -> bool:
    return path.exists() and path.stat().st_mtime >= started - 1.0


def previous_times(out: Path, cpu: str) -> dict[str, float]:
    path = out / f"report-{cpu}.json"
    if not path.exists():
        return {}
    return {r["part"]: r["seconds"] for r in json.loads(path.read_text())["rows"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [p.name for p in PARTS]
    parser.add_argument("--parts", nargs="+", choices=names, default=names)
    parser.add_argument("--quick", action="store_true", help="small, few repeats, temp dir")
    parser.add_argument("--out", type=Path, help="directory of the results")
    parser.add_argument("--list", action="store_true", help="the parts and last run's times")
    args = parser.parse_args(argv)
    if args.quick and args.out is not None and args.out.resolve() == RESULTS:
        parser.error("--quick writes into a temporary directory, not benchmarks/results")
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="polytile-report-")) if args.quick else RESULTS
    fp = fingerprint()
    cpu = str(fp["cpu"])
    if args.list:
        last = previous_times(args.out, cpu)
        for p in PARTS:
            took = f"{last[p.name]:.0f} s last run" if p.name in last else f"~{p.minutes:g} min"
            print(f"{p.name:<13} {took:<18} {p.what}")
        print(f"{'total':<13} ~{sum(p.minutes for p in PARTS):g} min before a timed run")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for part in (p for p in PARTS if p.name in args.parts):
        start, started = time.perf_counter(), time.time()
        result = part.skip(fp) if part.skip is not None else None
        if result is None:
            result = run_part(part, args.out, cpu, args.quick) or "ok"
        else:
            result = f"skipped: {result}"
        seconds = time.perf_counter() - start
        files = [f.format(cpu=cpu) for f in part.outputs]
        # the files this part wrote (older ones of earlier runs do not count)
        files = [f for f in files if _written_since(args.out / f, started)]
        rows.append(
            {"part": part.name, "what": part.what, "files": files, "seconds": round(seconds, 1),
             "result": result, "recorded": part.recorded}
        )  # fmt: skip
        print(f"report: {part.name}: {result} ({seconds:.0f} s)", flush=True)
    index(args.out, fp, rows, args.quick)
    print(f"\nreport: {args.out}")
    for r in rows:
        print(f"  {r['part']:<13} {r['seconds']:>7.1f} s  {r['result']}")
    print(f"  {'total':<13} {sum(r['seconds'] for r in rows):>7.1f} s")
    return 0 if all(r["result"] == "ok" or r["result"].startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
