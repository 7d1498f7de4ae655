"""ResNet-50 end to end after tuning: `tune` spends at most `--trials` measurements on the
model's 28 tasks (the gradient task scheduler decides where) and each task's `--validate`
best candidates and its default are timed inside the model (`search.validate`: the
fastest there is applied), then the model compiled
with the records and with the default schedules is timed against onnxruntime in the
same run (the peers take turns, `model_bench.measure`). Writes
benchmarks/results/resnet50_tuned-CPU.{json,md} (CPU: LLVM's name for this machine's)
with the per-task table, and resnet50_best.jsonl: the fastest verified record per task
(enough for `compile(records=...)` to rebuild the tuned model on the same CPU; the
records of other CPUs in it are kept; the full records file is not kept in git).

Target: tuned latency ≤ 1.0× onnxruntime's after at most 2,000 trials (moonshot 0.8×).

    python benchmarks/resnet50_tune_bench.py [--trials 2000] [--records r.jsonl]
    python benchmarks/resnet50_tune_bench.py --records r.jsonl --trials 0  # validate only
    python benchmarks/resnet50_tune_bench.py --records r.jsonl --measure-only
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fingerprint import fingerprint, write_results
from model_bench import RESULTS, measure

from polytile import zoo
from polytile.codegen.target import host
from polytile.search.measure import COLD, MeasureConfig
from polytile.search.records import RecordFile, best_records, same_target
from polytile.search.validate import ValidateConfig
from polytile.tuning import tune

#: the fastest verified record per task, per CPU tuned on
BEST = RESULTS / "resnet50_best.jsonl"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--records", default=str(RESULTS / "resnet50_records.jsonl"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--measure-only", action="store_true", help="time existing records")
    parser.add_argument(
        "--validate", type=int, default=8, help="candidates per task timed in the model (0: off)"
    )
    parser.add_argument(
        "--flush-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time candidates with their weights evicted (cold, as in the model)",
    )
    parser.add_argument(
        "--cold",
        choices=COLD,
        default="weights",
        help="how a timed run starts cold: with its weights evicted; after the kernels "
        "writing its inputs, then with its weights evicted; or with the whole cache flushed",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    if args.trials == 0 and not args.validate and not args.measure_only:
        parser.error("--trials 0 needs --validate K (it only validates)")
    path = str(zoo.materialize("resnet50"))
    table, seconds, this_run = "", 0.0, 0
    if not args.measure_only:
        start = time.perf_counter()
        result = tune(
            path,
            args.trials,
            args.records,
            args.seed,
            measure=MeasureConfig(
                workers=args.workers, flush_cache=args.flush_cache, cold=args.cold
            ),
            validation=ValidateConfig(top=args.validate, seed=args.seed) if args.validate else None,
        )
        seconds = time.perf_counter() - start
        this_run = result.trials
        table = result.table()
        print(table)
    target = host()
    measured = RecordFile(args.records).read(target=target.key())
    trials = sum(r.timing == "kernel" for r in measured)
    best = best_records(measured, target.key())
    # other CPUs' best records stay: each machine applies only its own
    kept = [r for r in RecordFile(BEST) if not same_target(r.target, target.key())]
    BEST.unlink(missing_ok=True)
    RecordFile(BEST).append([*kept, *best.values()])
    threads = target.num_threads
    tuned = measure("resnet50", args.repeat, threads, args.records)
    default = measure("resnet50", args.repeat, threads)
    rows = {
        "tuned": tuned,
        "default": default,
        "tuning_s": round(seconds, 1),
        "flush_cache": args.flush_cache,
        "cold": args.cold,
        "validate": args.validate,
        "trials_in_records": trials,
    }
    print(json.dumps(rows))
    lines = [
        "# ResNet-50 after tuning, against onnxruntime (the peers take turns in one run; "
        "the ratio is the median of the turns' ratios)",
        "",
        "| schedules | polytile ms | onnxruntime ms | ratio | compile s |",
        "|---|---|---|---|---|",
    ]
    for name, r in (("default", default), ("tuned", tuned)):
        lines.append(
            f"| {name} | {r['polytile_ms']} | {r['onnxruntime_ms']} | {r['ratio']}× "
            f"| {r['compile_s']} |"
        )
    if table:
        lines += [
            "",
            f"Tuning: the records hold {trials} trials on this CPU ({this_run} of them "
            f"this run, {seconds:.0f} s)"
            + (
                f"; then the {args.validate} best candidates of each task, the neighbour of "
                "its best (`nb`: epilogue per innermost tile, two loops in the parallel one; "
                "measured and verified first, a trial each) and its default were timed in "
                "the model."
                if args.validate
                else "; no in-model validation."
            ),
            "",
            "```",
            table,
            "```",
        ]
    write_results(args.out, f"resnet50_tuned-{target.cpu}", rows, lines, fp=fingerprint())


if __name__ == "__main__":
    main()
