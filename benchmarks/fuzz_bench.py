"""Fuzzing campaign: random legal schedules of the zoos' kernels, each built as native code
and run against the kernel's reference; counts miscompiles (target: 0). Writes
benchmarks/results/fuzz-CPU.{json,md} (CPU: LLVM's name for this machine's).

A sample picks one of the distinct kernels (by workload key) of the static float models
of the legacy and the modern zoo (seeded), samples decisions of its `SearchSpace` and
mutates them a few times (as the evolutionary search does), builds the candidate, replays
its JSON trace (what the tuner measures), compiles it natively and runs it on the
kernel's seeded random inputs. The reference is the kernel run in program order by the
oracle (`poly.oracle.reference`) when it has at most `ORACLE_INSTANCES` statement
instances, else the kernel's initial (untransformed) schedule run natively.

Outcomes: `ok`; `refused` (the build raised `IllegalSchedule`: a legal refusal, as the
search records it); `budget` (the build went over its isl operations or seconds, as the
tuner's `budget` records: `BudgetExceeded`, or a build still running after
`--build-seconds`, whose worker is killed); `miscompile` (outputs differ beyond the
tolerance); `crash` (any other exception, a trace whose replay differs from the built
schedule, a worker that died or hung after its build). Every miscompile, crash and build
over budget is kept with its model, workload key, decisions and trace in the json;
`--replay FILE` checks the failures again (under the same limits).

Tolerance (`compare`): schedules reassociate float sums (tiles, vectors, rfactor), so an
output may differ from the reference by rounding, growing with the reduction's length
and cancelling terms. An element is wrong when
|got − want| > RTOL·|want| + ATOL·max|want| (max over the output tensor), both scaled by
the dtype's epsilon relative to float32's; NaN and infinities must match exactly, as must
integer and boolean outputs. The json records the worst error seen as a fraction of its
allowance (`worst_ok`), which shows the margin.

Samples run in worker processes (forked after the kernels are lowered: `search.watchdog`),
each sample and each build under a time limit: a crash in native code or a hang costs a
worker, not the campaign.

A campaign runs in shards: each finished sample is one line of a journal
(fuzz-CPU.jsonl, see `read_journal`); `--resume` skips the journaled samples, and the
summary is always made from the whole journal. Samples are deterministic by (seed,
index), so shards reach what one uninterrupted run would. SIGINT / SIGTERM stop a run
cleanly (the samples under way are dropped and run again on resuming).

    python benchmarks/fuzz_bench.py [--samples 10000] [--seed 0] [--jobs 1] [--resume]
    python benchmarks/fuzz_bench.py --summary   # rewrite fuzz-CPU.{json,md} from the journal
    python benchmarks/fuzz_bench.py --models squeezenet bert_small --samples 500
    python benchmarks/fuzz_bench.py --replay benchmarks/results/fuzz-znver4.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytile.codegen.configs import default_config
from polytile.codegen.native import NativeKernel, random_inputs
from polytile.codegen.target import Target, host, machine_choices
from polytile.errors import BudgetExceeded, IllegalSchedule, InputError
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import Schedule, initial_schedule
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform.steps import replay
from polytile.search.space import Decisions, SearchSpace
from polytile.search.watchdog import BUILD_SECONDS, Building, Pool, nothing

RESULTS = Path(__file__).resolve().parent / "results"
#: float32 tolerance of an element, relative to itself and to its tensor's largest value
RTOL = 1e-4
ATOL = 1e-5
#: kernels with at most this many statement instances are checked against the oracle
ORACLE_INSTANCES = 20_000
#: by default, kernels whose largest tensor has more elements are skipped (slow to run)
MAX_ELEMENTS = 1 << 20
#: mutations applied after a sample: 0 .. MUTATIONS - 1
MUTATIONS = 4


def default_models() -> list[str]:
    """The static float models of the legacy (onnx-light) and modern zoos; VGG-19 left
    out (550 MB of weights to build, and every kernel of it above `MAX_ELEMENTS`)."""
    from polytile import zoo

    return [
        i.name
        for i in zoo.list_models()
        if i.source in ("onnx-light", "modern")
        and not (i.quantized or i.symbolic)
        and i.name != "vgg19"
    ]


@dataclass(frozen=True)
class FuzzKernel:
    """One distinct kernel: its workload key, fused op kind and the model it came from."""

    key: str
    kernel: Kernel
    kind: str
    model: str

    @property
    def elements(self) -> int:
        return largest_tensor(self.kernel)


def largest_tensor(kernel: Kernel) -> int:
    return max((math.prod(t.shape) for t in kernel.tensors.values()), default=0)


def instances(kernel: Kernel) -> int:
    """Statement instances of the kernel (what the oracle executes one by one)."""
    return sum(int(s.domain_set().count_val().to_python()) for s in kernel.statements)


def collect(models: Sequence[str], max_elements: int = MAX_ELEMENTS) -> list[FuzzKernel]:
    """The distinct kernels of the models (first model first), as `compile` lowers them,
    whose tensors have at most `max_elements` elements each."""
    from polytile import zoo
    from polytile.search.tasks import extract_tasks

    found: dict[str, FuzzKernel] = {}
    for name in models:
        for task in extract_tasks(zoo.load(name)):
            if task.key not in found and largest_tensor(task.kernel) <= max_elements:
                found[task.key] = FuzzKernel(task.key, task.kernel, task.kind, name)
    return list(found.values())


def compare(got: np.ndarray, want: np.ndarray) -> float:
    """The worst element's error as a fraction of its allowance (see the module's
    docstring): above 1 the output is wrong."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return math.inf
    if want.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, want) else math.inf
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    if not np.array_equal(np.isnan(g), np.isnan(w)) or not np.array_equal(
        g[np.isinf(w)], w[np.isinf(w)]
    ):
        return math.inf
    if not finite.any():
        return 0.0
    g, w = g[finite], w[finite]
    if not np.isfinite(g).all():
        return math.inf
    scale = np.finfo(want.dtype).eps / np.finfo(np.float32).eps
    allowed = scale * (RTOL * np.abs(w) + ATOL * max(float(np.max(np.abs(w))), 1e-30))
    return float(np.max(np.abs(g - w) / allowed)) if w.size else 0.0


@dataclass
class Outcome:
    """What one sample did: `status` is ok / refused / budget / miscompile / crash."""

    status: str
    message: str = ""
    #: the worst element's error over its allowance (`compare`)
    error: float = 0.0
    decisions: Decisions | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)


class Checker:
    """One kernel's search space, inputs and reference outputs, made once."""

    def __init__(self, kernel: Kernel, target: Target, seed: int = 0) -> None:
        self.kernel = kernel
        self.target = target
        self.space = SearchSpace(
            kernel, config=default_config(target), machine=machine_choices(target)
        )
        self.inputs = random_inputs(kernel, seed)
        names = [t.name for t in kernel.outputs()]
        if instances(kernel) <= ORACLE_INSTANCES:
            self.reference = "program order"
            buffers = run_program_order(kernel, self.inputs)
        else:
            self.reference = "initial schedule"
            buffers = NativeKernel(initial_schedule(kernel), target)(self.inputs)
        self.want = {n: buffers[n] for n in names}

    def outputs(self, schedule: Schedule) -> dict[str, np.ndarray]:
        """The schedule's outputs on the kernel's inputs, run natively."""
        return NativeKernel(schedule, self.target).outputs(self.inputs)

    def verdict(self, got: Mapping[str, np.ndarray]) -> Outcome:
        errors = {n: compare(got[n], want) for n, want in self.want.items()}
        name, worst = max(errors.items(), key=lambda e: e[1], default=("", 0.0))
        if worst > 1.0:
            message = f"output {name} differs from the reference ({self.reference})"
            return Outcome("miscompile", f"{message}: {worst:.3g}× the tolerance", worst)
        return Outcome("ok", error=worst)

    def check_schedule(self, schedule: Schedule) -> Outcome:
        """A schedule's verdict: refused when its AST does not pass codegen's checks."""
        try:
            got = self.outputs(schedule)
        except IllegalSchedule as err:
            return Outcome("refused", f"{type(err).__name__}: {err}"[:2000])
        return self.verdict(got)

    def check_trace(self, trace: Sequence[Mapping[str, Any]]) -> Outcome:
        """A recorded candidate (JSON trace) replayed on the kernel, built, run, compared."""
        try:
            schedule = replay(self.kernel, json.loads(json.dumps(list(trace))))
        except IllegalSchedule as err:
            return Outcome("refused", f"{type(err).__name__}: {err}"[:2000])
        outcome = self.check_schedule(schedule)
        outcome.trace = list(trace)
        return outcome

    def check(self, decisions: Decisions, building: Building = nothing) -> Outcome:
        """Build the candidate of these decisions (told to `building` as the build starts,
        and None as it ends: the pool's watchdog), replay its JSON trace (what the tuner
        measures), run it and compare; any exception but a refusal is a crash."""
        trace: list[dict[str, Any]] = []
        try:
            try:
                building(dict(decisions))
                try:
                    candidate = self.space.build(decisions)
                finally:
                    building(None)
            except BudgetExceeded as err:  # too costly to build, as the tuner records it
                outcome = Outcome("budget", f"{type(err).__name__}: {err}"[:2000])
            except IllegalSchedule as err:  # a legal refusal
                outcome = Outcome("refused", f"{type(err).__name__}: {err}"[:2000])
            else:
                trace = candidate.trace
                replayed = replay(self.kernel, json.loads(json.dumps(trace)))
                if replayed.body != candidate.schedule.body:
                    outcome = Outcome("crash", "the replayed trace builds another schedule")
                else:
                    outcome = self.check_schedule(replayed)
        except Exception as err:  # a bug: kept with its trace
            outcome = Outcome("crash", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        outcome.decisions, outcome.trace = dict(decisions), trace
        return outcome


def sample_decisions(space: SearchSpace, rng: random.Random) -> Decisions:
    """A sample of the space, mutated 0 to MUTATIONS - 1 times."""
    decisions = space.sample(rng)
    for _ in range(rng.randrange(MUTATIONS)):
        decisions = space.mutate(decisions, rng)
    return decisions


def sample_rng(seed: int, index: int) -> random.Random:
    """Sample `index`'s generator: which kernel it picks, then its decisions."""
    return random.Random(f"fuzz:{seed}:{index}")


class Sampler:
    """Runs samples in this process, making each kernel's `Checker` on first use."""

    def __init__(self, kernels: Sequence[FuzzKernel], target: Target, seed: int) -> None:
        self.kernels = kernels
        self.target = target
        self.seed = seed
        self.checkers: dict[int, Checker] = {}

    def kernel_of(self, index: int) -> int:
        return sample_rng(self.seed, index).randrange(len(self.kernels))

    def run(self, index: int, building: Building = nothing) -> tuple[int, Outcome]:
        rng = sample_rng(self.seed, index)
        k = rng.randrange(len(self.kernels))
        try:
            if k not in self.checkers:
                self.checkers[k] = Checker(self.kernels[k].kernel, self.target, self.seed)
            checker = self.checkers[k]
        except Exception as err:  # the reference itself failed: a bug
            return k, Outcome("crash", f"reference: {type(err).__name__}: {err}")
        return k, checker.check(sample_decisions(checker.space, rng), building)


# --- the journal: line 1 the settings, then a line per run ({"run": r, ...}: date, commit,
# workers), per finished sample ({"sample": i, "run": r, "t": seconds into the run, ...})
# and, when a run stops cleanly, {"run_end": r, "seconds": s}. A run killed mid-write
# leaves a last line without its newline: reading ignores it, resuming cuts it off.

#: the journal's format; a journal of another version is not resumed (2: builds over
#: budget are `budget`, no longer `refused`, under a time limit `build_seconds`)
JOURNAL_VERSION = 2
#: characters of a refusal's message the journal keeps (the summary does not list them)
REFUSAL_CHARS = 300


def journal_settings(
    kernels: Sequence[FuzzKernel],
    models: Sequence[str],
    max_elements: int,
    seed: int,
    build_seconds: float = BUILD_SECONDS,
) -> dict[str, Any]:
    """What a journal's samples depend on: resuming with any other settings (or kernels
    lowered differently, which would change what each sample index picks) is refused."""
    kernel_list = [{"model": k.model, "kind": k.kind, "elements": k.elements,
                    "workload": k.key} for k in kernels]  # fmt: skip
    return {"journal": "fuzz", "version": JOURNAL_VERSION, "seed": seed, "models": list(models),
            "max_elements": max_elements, "rtol": RTOL, "atol": ATOL, "mutations": MUTATIONS,
            "build_seconds": build_seconds, "kernel_list": kernel_list}  # fmt: skip


@dataclass(frozen=True)
class Journal:
    """A journal read back: its settings, runs, samples (by index) and the length of its
    whole lines (what resuming keeps)."""

    settings: dict[str, Any]
    runs: list[dict[str, Any]]
    samples: dict[int, dict[str, Any]]
    size: int


def read_journal(path: Path) -> Journal | None:
    """The journal at `path` (None when there is none); a torn last line is ignored, a
    malformed line before it is an error."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    data = path.read_bytes()
    size = data.rfind(b"\n") + 1
    runs: list[dict[str, Any]] = []
    ends: dict[int, float] = {}
    samples: dict[int, dict[str, Any]] = {}
    settings: dict[str, Any] | None = None
    for number, line in enumerate(data[:size].splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"fuzz journal {path}: line {number} is not JSON ({err})") from None
        if settings is None:
            if record.get("journal") != "fuzz":
                raise InputError(f"fuzz journal {path}: line 1 holds no fuzz settings")
            settings = record
        elif "sample" in record:
            samples.setdefault(record["sample"], record)
        elif "run_end" in record:
            ends[record["run_end"]] = record["seconds"]
        elif "run" in record:
            runs.append(record)
    if settings is None:  # only a torn first line: nothing was journaled
        return None
    for run in runs:
        last = max((s["t"] for s in samples.values() if s["run"] == run["run"]), default=0.0)
        run["seconds"] = ends.get(run["run"], last)
    return Journal(settings, runs, samples, size)


def check_settings(path: Path, journal: Journal, settings: Mapping[str, Any]) -> None:
    """Refuses to resume a journal made with other settings, naming them."""
    old = journal.settings
    differ = {
        k: (old.get(k), settings.get(k)) for k in {*old, *settings} if old.get(k) != settings.get(k)
    }
    if "kernel_list" in differ:
        differ["kernel_list"] = ("the kernels (workload keys) differ",)
    if differ:
        raise InputError(
            f"fuzz journal {path} was made with other settings ({differ}: journal's, this "
            "run's); resume it with its settings, or start a new one without --resume"
        )


def open_journal(path: Path, settings: Mapping[str, Any], resume: bool) -> Journal | None:
    """The journal to continue (None: a new one was written, holding the settings)."""
    old = read_journal(path) if resume else None
    if old is not None:
        check_settings(path, old, settings)
        with path.open("r+b") as f:  # cut a torn last line
            f.truncate(old.size)
        return old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings) + "\n")
    return None


def sample_record(
    index: int, run: int, seconds: float, fk: FuzzKernel, outcome: Mapping[str, Any]
) -> dict[str, Any]:
    """A sample's journal line: failures and builds over budget keep their decisions
    and trace (to replay)."""
    record = {"sample": index, "run": run, "t": round(seconds, 2), "model": fk.model,
              "workload": fk.key, "kind": fk.kind, "status": outcome["status"],
              "error": outcome["error"], "message": outcome["message"]}  # fmt: skip
    if outcome["status"] in ("miscompile", "crash", "budget"):
        record.update(decisions=outcome["decisions"], trace=outcome["trace"])
    if outcome["status"] in ("refused", "budget"):
        record["message"] = outcome["message"].splitlines()[0][:REFUSAL_CHARS]
    return record


# --- the campaign -------------------------------------------------------------------------


def campaign(
    kernels: Sequence[FuzzKernel],
    samples: int,
    jobs: int,
    target: Target,
    journal: Path,
    settings: Mapping[str, Any],
    resume: bool = False,
    minutes: float | None = None,
    run_info: Mapping[str, Any] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Run samples 0 .. samples - 1 not yet in the journal (with `resume`; else a new
    journal), or as many as fit in `minutes` or before `stop()`, journaling each; the
    counts and failures of the whole journal."""
    old = open_journal(journal, settings, resume)
    done = set(old.samples) if old else set()
    run = len(old.runs) if old else 0
    todo = [i for i in range(samples) if i not in done]
    print(f"{len(done)} samples journaled, {len(todo)} to run", flush=True)
    sampler = Sampler(kernels, target, settings["seed"])
    pool = Pool(sampler, jobs, build_seconds=settings.get("build_seconds", BUILD_SECONDS))
    start = time.monotonic()
    deadline = start + minutes * 60 if minutes else math.inf
    counts: Counter[str] = Counter()
    with journal.open("a") as out:
        out.write(json.dumps({"run": run, "jobs": jobs, "target": samples, **(run_info or {})})
                  + "\n")  # fmt: skip
        out.flush()
        try:
            for index, k, outcome in pool.run(todo, deadline, stop):
                fk = kernels[k]
                record = sample_record(index, run, time.monotonic() - start, fk, outcome)
                out.write(json.dumps(record, default=float) + "\n")
                out.flush()
                counts[outcome["status"]] += 1
                if outcome["status"] in ("miscompile", "crash", "budget"):
                    print(f"sample {index} ({fk.model} {fk.kind}): {outcome['status']}: "
                          f"{outcome['message'].splitlines()[0][:300]}", flush=True)  # fmt: skip
                if sum(counts.values()) % 100 == 0:
                    elapsed = time.monotonic() - start
                    print(f"{sum(counts.values())} samples, {elapsed:.0f} s: {dict(counts)}",
                          flush=True)  # fmt: skip
        finally:
            pool.close()
            seconds = round(time.monotonic() - start, 2)
            out.write(json.dumps({"run_end": run, "seconds": seconds}) + "\n")
    return summarize(journal)


def summarize(path: Path) -> dict[str, Any]:
    """The counts, per-kind table and failures of a whole journal (every run of it)."""
    journal = read_journal(path)
    if journal is None:
        raise InputError(f"fuzz journal {path}: missing or empty")
    records = [journal.samples[i] for i in sorted(journal.samples)]
    counts = Counter(r["status"] for r in records)
    kinds: dict[str, Counter[str]] = {}
    for r in records:
        kinds.setdefault(r["kind"], Counter())[r["status"]] += 1
    oks = [r for r in records if r["status"] == "ok"]
    worst = max(oks, key=lambda r: r["error"], default=None)
    worst_ok = {"error": 0.0}
    if worst is not None and worst["error"] > 0:
        worst_ok = {k: worst[k] for k in ("error", "model", "kind")} | {"sample": worst["sample"]}
    seconds = sum(run["seconds"] for run in journal.runs)
    total = len(records)
    failures = [{k: v for k, v in r.items() if k not in ("run", "t")} for r in records
                if r["status"] in ("miscompile", "crash")]  # fmt: skip
    over = [{k: v for k, v in r.items() if k not in ("run", "t")} for r in records
            if r["status"] == "budget"]  # fmt: skip
    runs, settings = journal.runs, journal.settings
    return {
        "samples": total, "kernels": len(settings["kernel_list"]),
        "kernels_sampled": len({r["workload"] for r in records}),
        "ok": counts["ok"], "refusals": counts["refused"],
        "miscompiles": counts["miscompile"], "crashes": counts["crash"],
        "budgets": counts["budget"],
        "seconds": round(seconds, 1), "seconds_per_sample": round(seconds / max(total, 1), 3),
        "jobs": max((run["jobs"] for run in runs), default=0), "seed": settings["seed"],
        "runs": len(runs),
        "lowering_seconds": round(sum(run.get("lowering_seconds", 0) for run in runs), 1),
        "run_list": [{k: v for k, v in run.items() if k != "run"} for run in runs],
        "worst_ok": worst_ok, "kinds": {kind: dict(c) for kind, c in sorted(kinds.items())},
        "failures": failures, "over_budget": over, "kernel_list": settings["kernel_list"],
    }  # fmt: skip


def report_lines(result: Mapping[str, Any], models: Sequence[str], max_elements: int) -> list[str]:
    r = result
    lines = [
        "# Fuzzing: random legal schedules against the reference",
        "",
        f"{r['samples']} samples over {r['kernels']} distinct kernels (largest tensor ≤ "
        f"{max_elements} elements) of {len(models)} zoo models, seed {r['seed']}, "
        f"{r['jobs']} worker(s): {r['miscompiles']} miscompiles, {r['crashes']} crashes, "
        f"{r['refusals']} refusals, {r.get('budgets', 0)} builds over budget in "
        f"{r['seconds']} s over {r['runs']} run(s) "
        f"({r['seconds_per_sample']} s per sample). Tolerance: |got − want| ≤ "
        f"{RTOL}·|want| + {ATOL}·max|want|; worst passing error "
        f"{r['worst_ok']['error']:.3g}× of it.",
        "",
        "| op kind | samples | ok | refused | budget | miscompile | crash |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, c in r["kinds"].items():
        lines.append(
            f"| {kind} | {sum(c.values())} | {c.get('ok', 0)} | {c.get('refused', 0)} "
            f"| {c.get('budget', 0)} | {c.get('miscompile', 0)} | {c.get('crash', 0)} |"
        )
    listed = [*r["failures"], *r.get("over_budget", [])]
    if listed:
        lines += ["", "| sample | model | kind | status | message |", "|---|---|---|---|---|"]
        for f in sorted(listed, key=lambda f: f["sample"]):
            message = f["message"].splitlines()[0][:160].replace("|", "/")
            lines.append(
                f"| {f['sample']} | {f['model']} | {f['kind']} | {f['status']} | {message} |"
            )
    return lines


class Replayer:
    """Runs a results file's failures and builds over budget again (the `Pool`'s runner,
    as `Sampler`: under the same time limits)."""

    def __init__(
        self, rows: Mapping[str, Any], kernels: Mapping[str, FuzzKernel], target: Target
    ) -> None:
        self.listed = [*rows["failures"], *rows.get("over_budget", [])]
        self.kernels, self.target = kernels, target
        self.seed, self.count = rows["seed"], rows["kernels"]

    def kernel_of(self, index: int) -> int:
        return index

    def run(self, index: int, building: Building = nothing) -> tuple[int, Outcome]:
        f = self.listed[index]
        checker = Checker(self.kernels[f["workload"]].kernel, self.target, self.seed)
        trace, decisions = f.get("trace"), f.get("decisions")
        if not (trace or decisions):  # a worker that died or hung: the sample's decisions
            rng = sample_rng(self.seed, f["sample"])
            rng.randrange(self.count)
            decisions = sample_decisions(checker.space, rng)
        return index, checker.check_trace(trace) if trace else checker.check(decisions, building)


def replay_failures(path: Path, target: Target, build_seconds: float = BUILD_SECONDS) -> int:
    """Check a results file's failures and builds over budget again, from their traces
    or decisions, in a worker (`Pool`); the number still failing."""
    rows = json.loads(path.read_text())["rows"]
    replayer = Replayer(rows, {}, target)
    kernels: dict[str, FuzzKernel] = {}
    for model in sorted({f["model"] for f in replayer.listed}):
        kernels.update({k.key: k for k in collect([model], max_elements=1 << 62)})
    replayer.kernels = kernels
    pool = Pool(replayer, 1, build_seconds=build_seconds)
    failing = 0
    try:
        for index, _, outcome in pool.run(range(len(replayer.listed)), math.inf):
            f = replayer.listed[index]
            failing += outcome["status"] in ("miscompile", "crash")
            print(f"sample {f['sample']} ({f['model']}): {outcome['status']} "
                  f"{outcome['message'][:300]}", flush=True)  # fmt: skip
    finally:
        pool.close()
    return failing


@contextlib.contextmanager
def stop_on_signal() -> Iterator[Callable[[], bool]]:
    """While entered, SIGINT / SIGTERM ask the campaign to stop (it kills the workers,
    closes its journal, writes the summary); a second signal interrupts at once."""
    requested: list[int] = []

    def handle(signum: int, frame: object) -> None:
        if requested:
            raise KeyboardInterrupt
        print(f"{signal.Signals(signum).name}: stopping", flush=True)
        requested.append(signum)

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(requested)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-elements", type=int, default=MAX_ELEMENTS)
    parser.add_argument("--models", nargs="*", default=None, help="zoo models (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--minutes", type=float, default=None, help="stop handing out samples")
    parser.add_argument("--threads", type=int, default=None, help="threads of a kernel")
    parser.add_argument("--build-seconds", type=float, default=BUILD_SECONDS,
                        help="seconds a candidate's build may take")  # fmt: skip
    parser.add_argument("--replay", type=Path, help="check a results file's failures again")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    parser.add_argument("--journal", type=Path, help="default: OUT/fuzz-CPU.jsonl")
    parser.add_argument("--resume", action="store_true", help="skip the journaled samples")
    parser.add_argument("--summary", action="store_true", help="only rewrite the summary")
    args = parser.parse_args(argv)
    target = host(args.threads)
    if args.replay:
        raise SystemExit(1 if replay_failures(args.replay, target, args.build_seconds) else 0)
    from fingerprint import fingerprint, git_commit, write_results

    journal = args.journal or args.out / f"fuzz-{target.cpu}.jsonl"
    if args.summary:
        result = summarize(journal)
        settings = read_journal(journal).settings  # type: ignore[union-attr]
        models, max_elements = settings["models"], settings["max_elements"]
    else:
        models, max_elements = args.models or default_models(), args.max_elements
        start = time.monotonic()
        kernels = collect(models, max_elements)
        lowering = time.monotonic() - start
        print(f"{len(kernels)} kernels of {len(models)} models in {lowering:.0f} s", flush=True)
        settings = journal_settings(kernels, models, max_elements, args.seed, args.build_seconds)
        run_info = {"lowering_seconds": round(lowering, 1), **git_commit(),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        with stop_on_signal() as stop:
            result = campaign(kernels, args.samples, args.jobs, target, journal, settings,
                              args.resume, args.minutes, run_info, stop)  # fmt: skip
    lines = report_lines(result, models, max_elements)
    meta = {"models": models, "max_elements": max_elements, "rtol": RTOL, "atol": ATOL,
            "journal": journal.name}  # fmt: skip
    write_results(args.out, f"fuzz-{target.cpu}", result, lines, meta, fingerprint(args.threads))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
