"""Tuning records: an append-only JSONL file, one line per measured candidate.

A line holds the record format version, polytile's version, the workload key (of the
canonical kernel), the target (CPU, features, threads), the trace, the latencies in
seconds, the error kind (None when the candidate built, ran and verified), the seed, a
timestamp, the search space's decisions behind the trace (the tuner's population when
it resumes) and how the latencies were timed: "kernel" (the measurer ran the kernel
alone, as the search compares candidates) or "model" (seconds per call of the kernel
inside inferences of the whole model: `validate` re-ranks a task's best candidates so),
and for a kernel timed alone how its timed runs started (`start`: "warm", or the
measurement's cold mode, "weights", "producer" or "all"; empty in older files), and for a
kernel with symbolic sizes the sizes it was timed at (`sizes`, `search.dynamic`).
Latencies of the two timings are not compared with each other. Lines are flushed and
fsynced after each batch, so a crash loses at most the batch in flight and never a
committed line; a partial or corrupt line is skipped with a warning when reading.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytile.codegen.target import Target
from polytile.errors import IllegalSchedule, InputError, TuningError
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.transform.steps import replay
from polytile.version import __version__

from .budget import candidate_budget

RECORD_VERSION = 1
#: error kinds of a failed candidate ("budget": its build went over the isl operations or
#: seconds of `search.budget`, and it was never built again)
ERRORS = ("illegal", "build", "runtime", "timeout", "crash", "wrong_result", "budget")
#: how a record's latencies were timed: the kernel alone, or its calls inside the model
TIMINGS = ("kernel", "model")


@dataclass(frozen=True)
class Record:
    workload: str
    target: Mapping[str, Any]
    trace: tuple[Mapping[str, Any], ...]
    latencies: tuple[float, ...] = ()
    error: str | None = None
    seed: int = 0
    timestamp: float = field(default_factory=time.time)
    version: int = RECORD_VERSION
    polytile: str = __version__
    #: what the candidate's error said (empty when it succeeded)
    message: str = ""
    #: the search space's decisions that built the trace (None when unknown)
    decisions: Mapping[str, Any] | None = None
    #: "kernel" (timed alone) or "model" (timed inside the model's inferences)
    timing: str = "kernel"
    #: how the timed runs of a kernel timed alone started (`MeasureConfig.start`; empty
    #: when unknown: a record from before it was kept, or timed in the model)
    start: str = ""
    #: the sizes a kernel with symbolic sizes was timed at (its latencies: geometric
    #: means over them, `search.dynamic`); empty for a static kernel
    sizes: tuple[Mapping[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.error is not None and self.error not in ERRORS:
            raise ValueError(f"unknown record error kind {self.error!r}")
        if self.timing not in TIMINGS:
            raise ValueError(f"unknown record timing {self.timing!r}")

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.latencies)

    @property
    def latency(self) -> float:
        """Seconds: the best measured time alone (what disturbs a lone kernel only slows
        it); in the model, the median over the neighbours and turns it ran with, which is
        how validation ranks; infinite for a failed candidate."""
        if not self.ok:
            return float("inf")
        return min(self.latencies) if self.timing == "kernel" else statistics.median(self.latencies)

    def trace_key(self) -> str:
        return trace_key(self.trace)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "polytile": self.polytile,
            "workload": self.workload,
            "target": dict(self.target),
            "trace": [dict(s) for s in self.trace],
            "latencies": list(self.latencies),
            "error": self.error,
            "message": self.message,
            "seed": self.seed,
            "timestamp": self.timestamp,
            "decisions": dict(self.decisions) if self.decisions is not None else None,
            "timing": self.timing,
            "start": self.start,
            "sizes": [dict(s) for s in self.sizes],
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Record:
        return Record(
            workload=str(data["workload"]),
            target=dict(data["target"]),
            trace=tuple(dict(s) for s in data["trace"]),
            latencies=tuple(float(x) for x in data["latencies"]),
            error=data.get("error"),
            seed=int(data.get("seed", 0)),
            timestamp=float(data.get("timestamp", 0.0)),
            version=int(data["version"]),
            polytile=str(data.get("polytile", "")),
            message=str(data.get("message", "")),
            decisions=data.get("decisions"),
            timing=str(data.get("timing", "kernel")),
            start=str(data.get("start", "")),
            sizes=tuple({str(k): int(v) for k, v in s.items()} for s in data.get("sizes") or ()),
        )


def trace_key(trace: Iterable[Mapping[str, Any]]) -> str:
    """A trace as canonical JSON: equal traces, equal keys (to never measure twice)."""
    return json.dumps([dict(s) for s in trace], sort_keys=True)


def same_target(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("cpu", "features", "threads"))


class RecordFile:
    """One JSONL file of records; appends are durable batch by batch."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise TuningError(f"records file '{self.path}' is not a file")

    def append(self, records: Iterable[Record]) -> None:
        lines = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in records)
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+", encoding="utf-8") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # a previous crash may have left a partial last line
                f.seek(f.tell() - 1)
                last = f.read(1)
                if last != "\n":
                    f.write("\n")
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    def __iter__(self) -> Iterator[Record]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    if data.get("version") != RECORD_VERSION:
                        raise ValueError(f"record format {data.get('version')}")
                    yield Record.from_json(data)
                except (ValueError, KeyError, TypeError) as err:
                    warnings.warn(
                        f"{self.path}:{number}: skipping an unreadable record ({err})",
                        stacklevel=2,
                    )

    def read(
        self, workload: str | None = None, target: Mapping[str, Any] | None = None
    ) -> list[Record]:
        """Records of a workload and target (others are ignored)."""
        return [
            r
            for r in self
            if (workload is None or r.workload == workload)
            and (target is None or same_target(r.target, target))
        ]


def best_records(
    records: Sequence[Record] | RecordFile, target: Mapping[str, Any]
) -> dict[str, Record]:
    """The fastest verified record per workload, for one target. A workload whose
    candidates were timed inside the model takes the fastest of its latest such
    validation (its records share one timestamp): in the model, where it runs, a kernel
    can rank otherwise than alone, and a later validation saw the later candidates. A
    validation older than the workload's newest candidate timed alone no longer applies
    (it did not see that candidate)."""
    best: dict[str, Record] = {}
    newest: dict[str, float] = {}
    latest: dict[str, float] = {}
    chosen: dict[str, Record] = {}
    for r in records:
        if not (r.ok and same_target(r.target, target)):
            continue
        if r.timing == "model":
            if r.timestamp > latest.get(r.workload, -1.0):
                latest[r.workload] = r.timestamp
                chosen.pop(r.workload, None)
            if r.timestamp == latest[r.workload] and (
                r.workload not in chosen or r.latency < chosen[r.workload].latency
            ):
                chosen[r.workload] = r
            continue
        newest[r.workload] = max(r.timestamp, newest.get(r.workload, r.timestamp))
        if r.workload not in best or r.latency < best[r.workload].latency:
            best[r.workload] = r
    return best | {k: r for k, r in chosen.items() if latest[k] >= newest.get(k, latest[k])}


def tuned_records(records: object, target: Target) -> dict[str, Record]:
    """What `compile` applies: the best verified record per workload for this target,
    from a records file (path or `RecordFile`) or a sequence of records (none without)."""
    if records is None:
        return {}
    if isinstance(records, str | os.PathLike):
        if not Path(records).is_file():
            raise InputError(f"records file '{records}' does not exist")
        return best_records(RecordFile(records), target.key())
    if isinstance(records, RecordFile):
        return best_records(records, target.key())
    return best_records(list(records), target.key())  # type: ignore[call-overload]


def replay_record(kernel: Kernel, record: Record | None) -> Schedule | None:
    """The record's schedule replayed on the kernel (legality checked again), or None."""
    if record is None:
        return None
    try:
        with candidate_budget(initial_schedule(kernel)):
            return replay(kernel, record.trace)
    except IllegalSchedule as err:  # or over the candidate budget
        warnings.warn(
            f"kernel {kernel.name}: a tuning record no longer applies ({err})", stacklevel=3
        )
        return None
