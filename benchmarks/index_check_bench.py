"""The cost of the run-time index checks: each zoo model whose indices come from its
inputs (token ids into embeddings) timed with its checks and without them (the same
compile with the check list emptied), beside onnxruntime, in interleaved turns. Writes
benchmarks/results/index-checks-CPU.{json,md} (CPU: LLVM's name for this machine's).

    python benchmarks/index_check_bench.py [--models bert_small gpt2_2l] [--turns 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from unittest import mock

import onnx
from fingerprint import fingerprint, write_results
from turns import interleaved, ort_session

import polytile as pt
import polytile.compiler
from polytile import zoo
from polytile.codegen.target import host

RESULTS = Path(__file__).resolve().parent / "results"
#: the text models: their token ids index embeddings at run time
DEFAULT = [
    "bert_small",
    "roberta_small",
    "gpt2_2l",
    "llama_small",
    "qwen2_small",
    "bart_enc_small",
    "clip_text_small",
]


def measure(name: str, turns: int, repeat: int, threads: int) -> dict[str, object]:
    model = onnx.load(zoo.materialize(name))
    checked = pt.compile(model, num_threads=threads)
    with mock.patch.object(polytile.compiler, "index_bounds", return_value=[]):
        unchecked = pt.compile(model, num_threads=threads)
    feeds = zoo.random_inputs(model, seed=0)
    session = ort_session(model, threads)
    times = interleaved(
        {
            "checked": lambda: checked.run(feeds),
            "unchecked": lambda: unchecked.run(feeds),
            "onnxruntime": lambda: session.run(None, feeds),
        },
        turns,
        repeat,
    )
    ratio = statistics.median(
        c / u for c, u in zip(times["checked"], times["unchecked"], strict=True)
    )
    return {
        "model": name,
        "checks": len(checked.manifest.checks),
        "checked_ms": statistics.median(times["checked"]) * 1e3,
        "unchecked_ms": statistics.median(times["unchecked"]) * 1e3,
        "onnxruntime_ms": statistics.median(times["onnxruntime"]) * 1e3,
        "checked_over_unchecked": ratio,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT)
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    target = host(args.threads)
    rows = []
    for name in args.models:
        row = measure(name, args.turns, args.repeat, target.num_threads)
        print(json.dumps(row), flush=True)
        rows.append(row)
    lines = [
        f"# Run-time index checks: cost ({target.cpu}, {target.num_threads} threads)",
        "",
        "Medians of interleaved turns (best of the turn's runs); ratio: median over the "
        "turns of checked / unchecked.",
        "",
        "| model | checks | checked ms | unchecked ms | onnxruntime ms | checked / unchecked |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['checks']} | {r['checked_ms']:.3f} | {r['unchecked_ms']:.3f} "
        f"| {r['onnxruntime_ms']:.3f} | {r['checked_over_unchecked']:.3f} |"
        for r in rows
    ]
    meta = {"turns": args.turns, "repeat": args.repeat}
    fp = fingerprint(args.threads)
    written = write_results(args.out, f"index-checks-{target.cpu}", rows, lines, meta, fp)
    print(f"wrote {written[-1]}")


if __name__ == "__main__":
    main()
