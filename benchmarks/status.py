"""The README's status table, generated from benchmarks/results: per zoo model, whether
polytile agrees with onnxruntime, its latency against onnxruntime's, its compile time and
the CPU measured on. It rewrites README.md between `<!-- status:begin -->` and
`<!-- status:end -->`; `--check` only compares and exits 1 when the README is stale.

    python benchmarks/status.py [--cpu znver4] [--check] [--print]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- status:begin -->", "<!-- status:end -->"
#: agreement the end-to-end tests ask of a model: within 1e-3 of each output's scale
TOLERANCE = 1e-3


def models_file(results: Path, cpu: str | None = None) -> Path:
    """models-CPU.json of the given CPU, else the newest one (by its recorded date, else
    by the file's modification time)."""
    if cpu is not None:
        path = results / f"models-{cpu}.json"
        if not path.exists():
            raise SystemExit(f"status: no {path.name} in {results}")
        return path
    found = sorted(results.glob("models-*.json"))
    if not found:
        raise SystemExit(f"status: no models-*.json in {results}: run `make report`")

    def age(path: Path) -> tuple[str, float]:
        meta = json.loads(path.read_text()).get("meta", {})
        return str(meta.get("date", "")), path.stat().st_mtime

    return max(found, key=age)


def table(data: dict, source: str) -> list[str]:
    """The status table's markdown lines from one models-CPU.json's content."""
    meta = data["meta"]
    cpu = f"{meta['cpu']}, {meta.get('threads', '?')} threads"
    lines = [
        "| model | correct (max rel. error) | polytile / onnxruntime | compile s | CPU |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        error = r["max_rel_error"]
        correct = "yes" if error <= TOLERANCE else "**no**"
        lines.append(
            f"| {r['model']} | {correct} ({error:.1e}) | {r['ratio']:.2f}× "
            f"| {r['compile_s']:.1f} | {cpu} |"
        )
    lines += [
        "",
        f"Default schedules, latency ratio in one process run (lower is better); generated "
        f"by `make report` from `benchmarks/results/{source}`.",
    ]
    return lines


def render(readme: str, lines: list[str]) -> str:
    """The README text with the lines between the status markers replaced."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"status: README has no {BEGIN} ... {END} markers")
    head = readme[: start + len(BEGIN)]
    return head + "\n" + "\n".join(lines) + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--cpu", help="LLVM's CPU name of the models file (default: newest)")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--check", action="store_true", help="exit 1 if README is stale")
    parser.add_argument("--print", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    path = models_file(args.results, args.cpu)
    lines = table(json.loads(path.read_text()), path.name)
    if args.print:
        print("\n".join(lines))
        return 0
    current = args.readme.read_text()
    wanted = render(current, lines)
    if args.check:
        if wanted != current:
            print(f"status: {args.readme} differs from {path.name}: run benchmarks/status.py")
            return 1
        print(f"status: {args.readme} matches {path.name}")
        return 0
    if wanted != current:
        args.readme.write_text(wanted)
        print(f"status: {args.readme} table from {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
