"""The pre-trained cost model's data: measure candidates of the zoos' tasks, featurize
them, ship the rows in the package and report how well a model fit on them ranks the
candidates of models it never saw.

    python benchmarks/train_cost_model.py collect --until 01:30   # measure (UTC deadline)
    python benchmarks/train_cost_model.py build                   # rows -> search/data
    python benchmarks/train_cost_model.py evaluate                # held-out ranking report
    python benchmarks/train_cost_model.py curves --model bert_small --trials 80

- `collect`: for each model (the held-out ones first), a sample of its distinct tasks
  (weighted by √(FLOPs × weight), tasks already collected skipped) is tuned round-robin,
  a batch of 8 at a time, with the evolutionary proposals (mutations of the best and
  fresh samples) unranked (a random model: the data should not follow one model's
  taste). Records go to `<work>/records.jsonl` (the tuner's records file: a restart
  resumes and never measures a candidate twice) and each measured candidate's feature
  row, as the tuner computed it, to `<work>/rows.jsonl`. It stops at the wall-clock
  deadline and keeps what it measured.
- `build`: rows of the training models' tasks (never a workload that occurs in a
  held-out model) → `search/data/cost_model_rows.npz` (features, per-task normalized
  throughput, task ids) and its JSON sidecar (machine, date, commit, feature format).
  A record without a row is replayed and featurized (`trace_features`).
- `evaluate`: on each held-out task, pairwise accuracy and top-1 / top-5 recall of the
  pre-trained model, a random model, a model fit on the task's first `--online`
  measurements only (what online learning has after a few rounds), and the pre-trained
  model updated with those → `benchmarks/results/cost_model-<cpu>.{json,md}`.
- `curves`: tuning curves on one held-out model: pre-trained vs from-scratch regression
  vs random search, several seeds → `benchmarks/results/cost_model_curves-<cpu>.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from fingerprint import fingerprint, write_results

from polytile import zoo
from polytile.codegen.configs import lower_config
from polytile.codegen.target import host
from polytile.search.cost_model import MODEL_FORMAT, SHIPPED, RandomModel
from polytile.search.measure import MeasureConfig, Measurer
from polytile.search.records import RecordFile, trace_key
from polytile.search.tasks import Task, extract_tasks
from polytile.search.tune import Tuner

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORK = Path.home() / ".cache" / "polytile" / "cost_model"
#: models never trained on: a modern CNN and a transformer encoder
HELD_OUT = ("mobilenet_v3_large", "bert_small")
#: models trained on, legacy and modern zoo interleaved (the cheap ones first)
TRAIN = (
    "squeezenet", "resnet34", "alexnet", "gpt2_2l", "efficientnet_b1", "resnet50",
    "vit_b_32", "inception_v1", "regnet_x_400mf", "mlp", "shufflenet", "bart_enc_small",
    "convnext_small", "densenet121", "clip_text_small", "timm_mixer_s16", "vgg19",
)  # fmt: skip


def _deadline(text: str) -> float:
    """'HH:MM' UTC today (tomorrow if past) → epoch seconds."""
    now = datetime.datetime.now(datetime.UTC)
    hour, minute = (int(x) for x in text.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if at < now - datetime.timedelta(hours=12):
        at += datetime.timedelta(days=1)
    return at.timestamp()


def _log(*parts: object) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
    print(stamp, *parts, flush=True)


def _short(trace_or_key: object) -> str:
    text = trace_or_key if isinstance(trace_or_key, str) else trace_key(trace_or_key)  # type: ignore[arg-type]
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def pick_tasks(tasks: Sequence[Task], count: int, done: set[str], seed: int) -> list[Task]:
    """Up to `count` tasks not collected yet, sampled by √(FLOPs × weight) without
    replacement: the heavy ones likely, the light ones still represented."""
    fresh = [t for t in tasks if t.key not in done]
    if len(fresh) <= count:
        return fresh
    rng = np.random.default_rng(seed)
    weights = np.array([math.sqrt(max(t.flops, 1) * t.weight) for t in fresh])
    chosen = rng.choice(len(fresh), count, replace=False, p=weights / weights.sum())
    return [fresh[i] for i in sorted(chosen)]


def collect_model(
    name: str, work: Path, deadline: float, per_task: int, max_tasks: int, done: set[str],
    seed: int,
) -> int:  # fmt: skip
    """Measure candidates of a sample of the model's tasks round-robin until each has
    `per_task` trials or the deadline; returns the trials measured."""
    target = host()
    path = str(zoo.materialize(name))
    tasks = extract_tasks(path, None, lower_config(target))
    keys_file = work / "models.jsonl"
    with open(keys_file, "a") as f:  # which workloads each model has (the hold-out)
        f.write(json.dumps({"model": name, "workloads": [t.key for t in tasks]}) + "\n")
    chosen = pick_tasks(tasks, max_tasks, done, seed)
    if not chosen or time.time() > deadline:
        return 0
    config = MeasureConfig(timeout=20.0, build_timeout=20.0)
    records = RecordFile(work / "records.jsonl")
    tuner = Tuner(chosen, records, target, seed, "evolutionary", config, batch=8,
                  model=RandomModel(seed), pool=1)  # fmt: skip
    measurer = Measurer(target, config)
    trials = 0
    try:
        with open(work / "rows.jsonl", "a") as out:
            live = list(tuner.states)
            while live and time.time() < deadline:
                for state in list(live):
                    if time.time() >= deadline:
                        break
                    if state.trials >= per_task or state.done:
                        live.remove(state)
                        continue
                    try:
                        got = tuner.run_round(measurer, state, per_task - state.trials)
                    except Exception as err:
                        _log(f"{name} task {state.task.index}: skipped ({err})"[:300])
                        live.remove(state)
                        continue
                    trials += len(got)
                    rows = state.measured[len(state.measured) - len(got) :]
                    for record, m in zip(got, rows, strict=True):
                        if record.error == "budget":
                            continue
                        out.write(json.dumps({
                            "model": name, "workload": record.workload,
                            "trace": _short(record.trace_key()), "latency": record.latency
                            if record.ok else None, "row": m.row,
                        }) + "\n")  # fmt: skip
                    out.flush()
    finally:
        measurer.close()
        tuner.close()
    done.update(t.key for t in chosen)
    return trials


def collect(args: argparse.Namespace) -> None:
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    deadline = _deadline(args.until)
    done: set[str] = set()
    if (work / "rows.jsonl").exists():  # resumed: those tasks are collected
        for line in (work / "rows.jsonl").read_text().splitlines():
            try:
                done.add(json.loads(line)["workload"])
            except (ValueError, KeyError):
                continue
    models = [*HELD_OUT, *[m for m in TRAIN if m not in HELD_OUT]]
    if args.models:
        models = args.models
    total = 0
    for i, name in enumerate(models):
        left = deadline - time.time()
        if left < 30:
            break
        held = name in HELD_OUT
        # the held-out models' tasks get more trials: they are the test set
        share = left / max(1, len(models) - i) * (2.0 if held else 1.0)
        start = time.time()
        try:
            got = collect_model(
                name, work, min(deadline, start + share), args.per_task * (2 if held else 1),
                args.max_tasks, done, args.seed,
            )  # fmt: skip
        except Exception as err:
            _log(f"{name}: failed ({type(err).__name__}: {err})"[:400])
            continue
        total += got
        _log(f"{name}: {got} trials in {time.time() - start:.0f} s; total {total}")
    _log(f"collected {total} trials")


# --- build ---------------------------------------------------------------------------


def collected(work: Path) -> tuple[list[dict], dict[str, set[str]]]:
    """The measured rows (first of each workload and trace, in measurement order) and each
    model's workloads."""
    entries, seen = [], set()
    for line in (work / "rows.jsonl").read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a line cut by the deadline's interrupt
            continue
        key = (entry["workload"], entry["trace"])
        if key not in seen:
            seen.add(key)
            entries.append(entry)
    models: dict[str, set[str]] = {}
    for line in (work / "models.jsonl").read_text().splitlines():
        data = json.loads(line)
        models.setdefault(data["model"], set()).update(data["workloads"])
    return entries, models


def held_out_keys(models: dict[str, set[str]]) -> set[str]:
    """Every workload of a held-out model: never trained on, wherever else it occurs."""
    return set().union(*(models.get(m, set()) for m in HELD_OUT))


def by_task(entries: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """Per workload (rows with features only): features, throughput normalized by the
    task's best (0 for a failed candidate, as the tuner trains) and the models."""
    grouped: dict[str, list[dict]] = {}
    for e in entries:
        if e["row"] is not None:
            grouped.setdefault(e["workload"], []).append(e)
    found = {}
    for key, group in grouped.items():
        ok = [e["latency"] for e in group if e["latency"]]
        if not ok:
            continue
        best = min(ok)
        x = np.array([e["row"] for e in group], dtype=np.float64)
        y = np.array([best / e["latency"] if e["latency"] else 0.0 for e in group])
        found[key] = (x, y, [e["model"] for e in group])
    return found


def build(args: argparse.Namespace) -> None:
    entries, models = collected(args.work)
    tasks = by_task(entries)
    held = held_out_keys(models)
    train = sorted(k for k in tasks if k not in held)
    x = np.concatenate([tasks[k][0] for k in train])
    y = np.concatenate([tasks[k][1] for k in train])
    groups = np.concatenate(
        [np.full(len(tasks[k][1]), i, dtype=np.int32) for i, k in enumerate(train)]
    )
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, features=x, targets=y, groups=groups)
    fp = fingerprint()
    trained_on = sorted({m for k in train for m in tasks[k][2]})
    meta = {
        "format": MODEL_FORMAT,
        "width": int(x.shape[1]),
        "rows": len(y),
        "tasks": len(train),
        "workloads": train,
        "models": trained_on,
        "held_out": list(HELD_OUT),
        "cpu": fp["cpu"],
        "cpu_model": fp["cpu_model"],
        "features": fp["features"],
        "threads": fp["threads"],
        "l2_bytes": fp["l2_bytes"],
        "polytile_commit": fp["polytile_commit"],
        "date": fp["date"],
        "target": "per-task normalized throughput: the task's best latency / latency",
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    _log(f"{out}: {len(y)} rows of {len(train)} tasks of {len(trained_on)} models, "
         f"{out.stat().st_size // 1024} KiB")  # fmt: skip


# --- evaluate ------------------------------------------------------------------------


def ranking(pred: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Pairwise accuracy (pairs of different truth), top-1 recall (the predicted best is
    the best), the predicted best's share of the best throughput, top-5 recall."""
    i, j = np.triu_indices(len(truth), 1)
    differ = truth[i] != truth[j]
    right = (pred[i] - pred[j]) * (truth[i] - truth[j]) > 0
    k = min(5, len(truth))
    pick = int(np.argmax(pred))
    top_true = set(np.argsort(-truth, kind="stable")[:k].tolist())
    return {
        "pairwise": float(right[differ].mean()) if differ.any() else float("nan"),
        "top1": float(truth[pick] >= truth.max()),
        "top1_quality": float(truth[pick] / truth.max()),
        "top5": len(top_true & set(np.argsort(-pred, kind="stable")[:k].tolist())) / k,
    }


def _methods(shipped: Path, online: int, weights: Sequence[int], seed: int) -> dict:
    """Scoring functions (train rows, train targets, test rows → scores) of the compared
    models."""
    from polytile.search.cost_model import GBModel, PretrainedModel

    def random_model(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> np.ndarray:
        return RandomModel(seed).predict_rows(t)

    def pretrained(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> np.ndarray:
        model = PretrainedModel(seed, data=shipped)
        model.fit_rows([], [])
        return model.predict_rows(t)

    def scratch(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> np.ndarray:
        model = GBModel(seed)
        model.fit_rows(x, y / max(y.max(), 1e-12) if y.max() > 0 else y)
        return model.predict_rows(t)

    def updated(weight: int):  # noqa: ANN202
        def score(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> np.ndarray:
            model = PretrainedModel(seed, data=shipped)
            model.online_weight = weight
            model.fit_rows(x, y / max(y.max(), 1e-12) if y.max() > 0 else y)
            return model.predict_rows(t)

        return score

    found = {"random": random_model, "pretrained": pretrained, f"scratch_{online}": scratch}
    for w in weights:
        found[f"pretrained+{online}_w{w:g}"] = updated(w)
    return found


def evaluate(args: argparse.Namespace) -> None:
    entries, models = collected(args.work)
    tasks = by_task(entries)
    held = held_out_keys(models)
    methods = _methods(args.out, args.online, args.weights, args.seed)
    rows = []
    for key, (x, y, owners) in tasks.items():
        if key not in held or len(y) < args.online + 8:
            continue
        model = next((m for m in HELD_OUT if key in models.get(m, set())), owners[0])
        first, rest = slice(0, args.online), slice(args.online, None)
        if len(set(y[rest].tolist())) < 2:
            continue
        row: dict = {"model": model, "workload": key, "rows": len(y), "test": len(y) - args.online}
        for name, score in methods.items():
            pred = score(x[first], y[first], x[rest])
            row[name] = ranking(np.asarray(pred), y[rest])
        rows.append(row)
        _log(
            key, model, {k: round(v["pairwise"], 3) for k, v in row.items() if isinstance(v, dict)}
        )
    summary = {
        name: {
            metric: float(np.nanmean([r[name][metric] for r in rows]))
            for metric in ("pairwise", "top1", "top1_quality", "top5")
        }
        for name in methods
    }
    cv = task_cv(args.out, args.seed)
    cpu = host().cpu
    shipped = json.loads(args.out.with_suffix(".json").read_text())
    lines = [
        "# Pre-trained cost model: ranking on models it was not trained on",
        "",
        f"Shipped rows: {shipped['rows']} measured candidates of {shipped['tasks']} tasks of "
        f"{len(shipped['models'])} models ({', '.join(shipped['models'])}), measured on "
        f"{shipped['cpu']} ({shipped['cpu_model']}) on {shipped['date']}. Held out (no "
        f"workload of theirs trained on): {', '.join(HELD_OUT)}: {len(rows)} tasks with at "
        f"least {args.online + 8} measured candidates.",
        "",
        f"Per held-out task, the candidates after its first {args.online} measurements are "
        f"ranked by: a random model; the pre-trained model (shipped rows only); a model "
        f"trained from scratch on the task's first {args.online} measurements (what the "
        f"tuner's online model has after {args.online // 8} rounds); the pre-trained model "
        f"updated with those {args.online} rows, each counted w times (a shipped row "
        "once). Means over tasks (macro).",
        "",
        "| model | pairwise accuracy | top-1 recall | top-1 pick / best | top-5 recall |",
        "|---|---|---|---|---|",
    ]
    for name, m in summary.items():
        lines.append(
            f"| {name} | {m['pairwise']:.3f} | {m['top1']:.2f} | {m['top1_quality']:.3f} | "
            f"{m['top5']:.2f} |"
        )
    lines += ["", "Per held-out model (pairwise accuracy):", ""]
    for name in HELD_OUT:
        mine = [r for r in rows if r["model"] == name]
        if mine:
            parts = ", ".join(
                f"{k} {np.nanmean([r[k]['pairwise'] for r in mine]):.3f}" for k in methods
            )
            lines.append(f"- {name} ({len(mine)} tasks): {parts}")
    lines += [
        "",
        f"Whole training tasks held out in turn ({cv['folds']} folds over the shipped rows): "
        f"pairwise accuracy {cv['pretrained']:.3f} (random {cv['random']:.3f}).",
    ]
    write_results(
        RESULTS, f"cost_model-{cpu}", rows, lines,
        meta={"summary": summary, "task_cv": cv, "online": args.online, "shipped": shipped},
    )  # fmt: skip
    print("\n".join(lines))


def task_cv(path: Path, seed: int, folds: int = 4) -> dict:
    """Pairwise accuracy on whole shipped tasks held out in turn (the rest trained on)."""
    from polytile.search.cost_model import _regressor, load_shipped

    data = load_shipped(path)
    tasks = np.unique(data.groups)
    scores: dict[str, list[float]] = {"pretrained": [], "random": []}
    rng = np.random.default_rng(seed)
    for fold in range(folds):
        test = tasks[fold::folds]
        train = ~np.isin(data.groups, test)
        model = _regressor(data.features[train], data.targets[train], seed)
        for task in test:
            mask = data.groups == task
            truth = data.targets[mask]
            if len(set(truth.tolist())) < 2:
                continue
            scores["pretrained"].append(
                ranking(model.predict(data.features[mask]), truth)["pairwise"]
            )
            scores["random"].append(ranking(rng.random(mask.sum()), truth)["pairwise"])
    return {"folds": folds, **{k: float(np.nanmean(v)) for k, v in scores.items()}}


# --- curves --------------------------------------------------------------------------

#: the compared searches of `curves`
CURVES = {
    "pretrained": {"strategy": "evolutionary", "cost_model_kind": "pretrained"},
    "scratch": {"strategy": "evolutionary", "cost_model_kind": "regression"},
    "random": {"strategy": "random"},
}


def curves(args: argparse.Namespace) -> None:
    """Tuning curves on one held-out model's heaviest tasks: the estimated latency of
    those tasks (Σ weight × best) after each trial, and seconds, per search and seed."""
    import tempfile

    from polytile.search.tune import tune

    path = str(zoo.materialize(args.model))
    tasks = extract_tasks(path)
    heavy = sorted(tasks, key=lambda t: -t.flops * t.weight)[: args.tasks]
    spec = ",".join(str(t.index) for t in heavy)
    weight = {t.key: t.weight for t in heavy}
    runs: dict = {}
    deadline = _deadline(args.until) if args.until else math.inf
    plan = [(v, seed) for seed in args.seeds for v in CURVES]
    for done, (variant, seed) in enumerate(plan):
        options = CURVES[variant]
        budget = (deadline - time.time()) / (len(plan) - done)  # each run its share
        if budget < 30:
            break
        with tempfile.TemporaryDirectory() as tmp:
            records = Path(tmp) / "r.jsonl"
            start = time.perf_counter()
            tune(path, args.trials, str(records), seed, spec, progress=False,
                 time_budget=budget if budget < math.inf else None, **options)  # fmt: skip
            seconds = time.perf_counter() - start
            best: dict[str, float] = {}
            curve, stamps = [], []
            read = RecordFile(records).read()
            t0 = min((r.timestamp for r in read), default=0.0)
            for r in read:
                if r.ok:
                    best[r.workload] = min(best.get(r.workload, math.inf), r.latency)
                total = sum(weight[k] * v for k, v in best.items())
                curve.append(total * 1e3 if len(best) == len(heavy) else None)
                stamps.append(r.timestamp - t0)
            runs[f"{variant}-{seed}"] = {"curve": curve, "seconds": seconds, "at": stamps}
            _log(f"{variant} seed {seed}: {curve[-1:]} ms after {len(curve)} trials, "
                 f"{seconds:.0f} s")  # fmt: skip
        write_curves(args.model, spec, runs)  # after every run: a deadline keeps the rest


def write_curves(model: str, spec: str, runs: dict) -> None:
    cpu = host().cpu
    lines = [
        f"# Tuning curves on {model} (held out of the pre-trained cost model)",
        "",
        f"Tasks {spec} (the heaviest by FLOPs × weight); latency is Σ weight × best of "
        "those tasks, in ms, once each has a measurement.",
        "",
        "| run | trials | ms after 16 trials | after 32 | final ms | seconds |",
        "|---|---|---|---|---|---|",
    ]

    def at(curve: list, n: int) -> str:
        value = curve[min(n, len(curve)) - 1] if curve else None
        return f"{value:.3f}" if value is not None else "-"

    for key, run in runs.items():
        c = run["curve"]
        lines.append(
            f"| {key} | {len(c)} | {at(c, 16)} | {at(c, 32)} | {at(c, len(c))} | "
            f"{run['seconds']:.0f} |"
        )
    stem = f"cost_model_curves-{model}-{cpu}"
    write_results(RESULTS, stem, runs, lines, meta={"model": model, "tasks": spec})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for key, run in runs.items():
            style = {"pretrained": "-", "scratch": "-."}.get(key.split("-")[0], "--")
            pts = [
                (i + 1, c, a)
                for i, (c, a) in enumerate(zip(run["curve"], run["at"], strict=True))
                if c is not None
            ]
            axes[0].step([p[0] for p in pts], [p[1] for p in pts], style, label=key)
            axes[1].step([p[2] for p in pts], [p[1] for p in pts], style, label=key)
        for ax, label in zip(axes, ("trials", "seconds"), strict=True):
            ax.set_xlabel(label)
            ax.set_ylabel("estimated latency (ms)")
            ax.legend()
        fig.suptitle(model)
        fig.tight_layout()
        fig.savefig(RESULTS / f"{stem}.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no chart")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=WORK, help="records and rows collected")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--until", required=True, help="UTC deadline HH:MM")
    c.add_argument("--per-task", type=int, default=24)
    c.add_argument("--max-tasks", type=int, default=8)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--models", nargs="*")
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=SHIPPED)
    e = sub.add_parser("evaluate")
    e.add_argument("--out", type=Path, default=SHIPPED, help="the shipped rows")
    e.add_argument("--online", type=int, default=16, help="the task's own rows of `scratch`")
    e.add_argument("--weights", type=int, nargs="*", default=[1, 4, 16])
    e.add_argument("--seed", type=int, default=0)
    v = sub.add_parser("curves")
    v.add_argument("--model", default="bert_small", choices=HELD_OUT)
    v.add_argument("--trials", type=int, default=80)
    v.add_argument("--tasks", type=int, default=3, help="the heaviest tasks tuned")
    v.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    v.add_argument("--until", help="UTC deadline HH:MM: the runs share the time left")
    args = parser.parse_args(argv)
    {"collect": collect, "build": build, "evaluate": evaluate, "curves": curves}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
