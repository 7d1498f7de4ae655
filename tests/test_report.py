"""`make report` (benchmarks/report.py), the host fingerprint and the README status table,
without timing anything: the fingerprint's fields, the status table from a small
synthetic models file, `status.py --check` on a temporary README, and a registry that
runs every benchmark script with arguments it accepts."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import llvmlite.binding as llvm
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import fingerprint  # noqa: E402
import report  # noqa: E402
import status  # noqa: E402

#: benchmarks/ modules that generate nothing themselves
HELPERS = {"turns", "fingerprint", "report", "status"}


def test_fingerprint_names_cpu_features_cores_l2_and_versions() -> None:
    fp = fingerprint.fingerprint()
    assert fp["cpu"] == llvm.get_host_cpu_name()
    enabled = {f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f[0] == "+"}
    assert set(fp["features"]) == enabled
    assert fp["cores"] >= 1 and fp["l2_bytes"] > 0 and fp["vector_bits"] in (128, 256, 512)
    for name in ("polytile", "numpy", "onnx", "llvmlite", "islpy", "llvm"):
        assert fp["versions"][name], name
    assert set(fp["polytile_commit"]) == {"commit", "dirty"}
    line = fingerprint.header(fp)
    assert line.startswith(f"Host: {fp['cpu']} ") and "\n" not in line
    assert f"numpy {fp['versions']['numpy']}" in line


def test_write_results_stamps_json_meta_and_md_header(tmp_path: Path) -> None:
    fp = fingerprint.fingerprint()
    lines = ["# Title", "", "| a |", "|---|", "| 1 |"]
    written = fingerprint.write_results(tmp_path, "x-cpu", [{"a": 1}], lines, {"turns": 3}, fp)
    assert [p.name for p in written] == ["x-cpu.json", "x-cpu.md"]
    data = json.loads(written[0].read_text())
    assert data["rows"] == [{"a": 1}]
    assert data["meta"]["turns"] == 3 and data["meta"]["features"] == fp["features"]
    md = written[1].read_text().splitlines()
    assert md[0] == "# Title" and md[2] == fingerprint.header(fp) and md[4:] == lines[2:]


def _models_json(path: Path, cpu: str = "cpu0", date: str = "2026-01-01") -> Path:
    rows = [
        {"model": "good", "max_rel_error": 2.5e-06, "ratio": 0.9, "compile_s": 3.456,
         "compile_llvm_s": 1.0, "compile_schedule_s": 2.0, "kernels": 5, "functions": 4},
        {"model": "bad", "max_rel_error": 0.02, "ratio": 1.234, "compile_s": 10.0,
         "compile_llvm_s": 4.0, "compile_schedule_s": 1.5, "kernels": 9, "functions": 7},
    ]  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    out = path / f"models-{cpu}.json"
    out.write_text(json.dumps({"meta": {"cpu": cpu, "threads": 2, "date": date}, "rows": rows}))
    return out


def test_status_table_rows(tmp_path: Path) -> None:
    source = _models_json(tmp_path)
    lines = status.table(json.loads(source.read_text()), source.name)
    assert lines[:4] == [
        "| model | correct (max rel. error) | polytile / onnxruntime | compile s | CPU |",
        "|---|---|---|---|---|",
        "| good | yes (2.5e-06) | 0.90× | 3.5 | cpu0, 2 threads |",
        "| bad | **no** (2.0e-02) | 1.23× | 10.0 | cpu0, 2 threads |",
    ]
    assert "models-cpu0.json" in lines[-1]


def test_status_picks_the_newest_models_file(tmp_path: Path) -> None:
    _models_json(tmp_path, "old", "2025-01-01")
    _models_json(tmp_path, "new", "2026-06-01")
    (tmp_path / "models_tuned-new.json").write_text("{}")  # not a default-schedule file
    assert status.models_file(tmp_path).name == "models-new.json"
    assert status.models_file(tmp_path, "old").name == "models-old.json"
    with pytest.raises(SystemExit):
        status.models_file(tmp_path, "missing")


def test_status_check_and_rewrite_touch_only_the_marked_table(tmp_path: Path) -> None:
    _models_json(tmp_path)
    readme = tmp_path / "README.md"
    before, after = "# polytile\n\nintro\n\n", "\n\n## Next\n\ntext\n"
    readme.write_text(f"{before}{status.BEGIN}\n| stale |\n{status.END}{after}")
    args = ["--results", str(tmp_path), "--readme", str(readme)]
    assert status.main([*args, "--check"]) == 1
    assert status.main(args) == 0
    text = readme.read_text()
    assert text.startswith(before + status.BEGIN) and text.endswith(status.END + after)
    assert "| good | yes (2.5e-06) |" in text and "stale" not in text
    assert status.main([*args, "--check"]) == 0
    readme.write_text("# polytile\n\nno markers\n")
    with pytest.raises(SystemExit):
        status.main([*args, "--check"])


def test_compile_times_from_a_models_file(tmp_path: Path) -> None:
    _models_json(tmp_path)
    assert report.compile_times(tmp_path, "cpu0", True) is None
    rows = json.loads((tmp_path / "compile-cpu0.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["bad", "good"]  # slowest first
    assert rows[0]["other_s"] == pytest.approx(10.0 - 4.0 - 1.5)
    assert report.compile_times(tmp_path, "other", True) is not None  # no models-other.json


def test_registry_covers_every_benchmark_script() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - HELPERS
    named = {Path(s).stem for p in report.PARTS for s in (p.script, p.made_by) if s}
    assert scripts <= named, f"benchmarks without a report part: {scripts - named}"
    assert len({p.name for p in report.PARTS}) == len(report.PARTS)
    assert report.PARTS[-1].name == "status"


class _Parsed(Exception):
    """Raised instead of running a benchmark once its arguments are parsed."""


@pytest.mark.parametrize("part", [p for p in report.PARTS if p.script], ids=lambda p: p.name)
def test_every_part_passes_arguments_its_script_accepts(
    part: report.Part, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: list[str] | None = None) -> None:
        raise _Parsed(original(self, args))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    module = importlib.import_module(Path(part.script).stem)
    for argv in (part.args, part.quick):
        with pytest.raises(_Parsed) as parsed:
            module.main([*argv, "--out", str(tmp_path)])
        assert parsed.value.args[0].out == tmp_path


def test_quick_never_writes_into_benchmarks_results() -> None:
    with pytest.raises(SystemExit):
        report.main(["--quick", "--out", str(report.RESULTS), "--parts", "status"])
