"""Tuning records: durable appends, tolerant reads, filtering by workload and target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytile.search.records import Record, RecordFile, best_records

TARGET = {"cpu": "znver4", "features": "+avx512f", "threads": 2}


def record(workload: str = "w", latency: float | None = 1e-3, **kw: object) -> Record:
    latencies = (latency, latency * 1.1) if latency is not None else ()
    error = None if latency is not None else "build"
    return Record(
        workload, TARGET, ({"kind": "split", "args": {"loop": "i"}},), latencies, error, **kw
    )


def test_round_trip_and_best(tmp_path: Path) -> None:
    f = RecordFile(tmp_path / "r.jsonl")
    f.append([record(latency=2e-3), record(latency=1e-3), record(latency=None)])
    f.append([record("other", 5e-3)])
    read = f.read()
    assert [r.latency for r in read[:2]] == [2e-3, 1e-3] and not read[2].ok
    assert read[0] == record(latency=2e-3, timestamp=read[0].timestamp)
    best = best_records(f, TARGET)
    assert best["w"].latency == 1e-3 and best["other"].latency == 5e-3
    assert best_records(f, {**TARGET, "threads": 1}) == {}  # another target: ignored
    assert len(f.read(workload="other")) == 1


def test_partial_and_corrupt_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    f = RecordFile(path)
    f.append([record(latency=3e-3)])
    with open(path, "a") as handle:
        handle.write('{"version": 1, "workload": "w", "tar')  # a crash mid-write
    f.append([record(latency=1e-3)])  # starts on a fresh line
    with open(path, "a") as handle:
        handle.write("not json\n" + json.dumps({"version": 99, "workload": "w"}) + "\n")
    with pytest.warns(UserWarning, match="skipping an unreadable record"):
        read = f.read()
    assert [r.latency for r in read] == [3e-3, 1e-3]


def test_unknown_error_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="error kind"):
        Record("w", TARGET, (), (), error="oops")


def with_an_older_line(path: Path, written: Record, lacking: str) -> RecordFile:
    """A records file holding `written`, then a line from before records kept the field
    `lacking`."""
    f = RecordFile(path)
    f.append([written])
    line = record().to_json()
    del line[lacking]
    with open(f.path, "a") as handle:
        handle.write(json.dumps(line) + "\n")
    return f


def test_timing_round_trips_and_older_lines_were_timed_alone(tmp_path: Path) -> None:
    f = with_an_older_line(tmp_path / "r.jsonl", record(timing="model"), "timing")
    assert [r.timing for r in f.read()] == ["model", "kernel"]
    # alone, the best time; in the model, the median over neighbours and turns
    assert record(latency=2.0).latency == 2.0
    assert Record("w", TARGET, (), (1.0, 5.0, 6.0), timing="model").latency == 5.0
    with pytest.raises(ValueError, match="timing"):
        record(timing="wall")


def test_how_timed_runs_started_round_trips_and_is_unknown_in_older_lines(
    tmp_path: Path,
) -> None:
    f = with_an_older_line(tmp_path / "r.jsonl", record(start="producer"), "start")
    assert [r.start for r in f.read()] == ["producer", ""]


def test_best_takes_the_fastest_of_the_latest_in_model_validation() -> None:
    def traced(loop: str, latency: float, **kw: object) -> Record:
        step = {"kind": "split", "args": {"loop": loop}}
        return Record("w", TARGET, (step,), (latency,), **kw)  # type: ignore[arg-type]

    alone = [traced(loop, t, timestamp=1.0) for loop, t in (("a", 1e-4), ("b", 2e-3), ("c", 3e-3))]
    assert best_records(alone, TARGET)["w"].trace[0]["args"]["loop"] == "a"
    first = [traced("a", 5e-3, timing="model", timestamp=10.0),
             traced("b", 4e-3, timing="model", timestamp=10.0)]  # fmt: skip
    best = best_records([*alone, *first], TARGET)["w"]
    assert best.trace[0]["args"]["loop"] == "b"  # faster in the model, though not alone
    later = [traced("a", 6e-3, timing="model", timestamp=20.0),
             traced("c", 7e-3, timing="model", timestamp=20.0)]  # fmt: skip
    best = best_records([*alone, *later, *first], TARGET)["w"]
    assert best.trace[0]["args"]["loop"] == "a" and best.latency == 6e-3
    # a candidate the search measured after the validation: the validation did not see it
    newer = traced("d", 5e-3, timestamp=30.0)
    best = best_records([*alone, *later, *first, newer], TARGET)["w"]
    assert best.trace[0]["args"]["loop"] == "a" and best.latency == 1e-4 and best.timing == "kernel"
