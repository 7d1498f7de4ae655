"""The `polytile` command line, shaped like TVM's tvmc.

Exit codes: 0 success, 2 bad input (the model, a file or an argument is at fault),
3 another polytile error, 70 an internal error (a bug: please report it).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polytile.errors import InputError, ModelError, PolytileError, ShapeError, UnsupportedOpError

from .cli_args import load_inputs, parse_duration, parse_input_shapes, parse_sizes, run_sizes

if TYPE_CHECKING:
    from polytile.frontend import Graph, Partition
    from polytile.runtime import CompiledModel, Profile, Timing

EXIT_BAD_INPUT = 2
EXIT_ERROR = 3
EXIT_INTERNAL = 70
#: errors whose exit code says the input is at fault
BAD_INPUT = (InputError, ModelError, UnsupportedOpError, ShapeError)


def resolve_model(model: str, seed: int = 0) -> Path:
    """A model argument is a file path or the name of a zoo model."""
    from polytile import zoo

    path = Path(model)
    if path.suffix == ".onnx" or path.exists():
        if not path.is_file():
            raise InputError(f"model file '{model}' does not exist")
        return path
    if model in zoo.NAMES:
        return zoo.materialize(model, seed=seed)
    raise InputError(
        f"'{model}' is neither a model file nor a zoo model (zoo: {', '.join(zoo.NAMES)})"
    )


def cmd_explain(args: argparse.Namespace) -> int:
    from polytile.compiler import imported

    path = resolve_model(args.model, args.seed)
    bounds = parse_sizes(getattr(args, "bounds", None), "--bounds")
    with imported(path, parse_input_shapes(args.input_shapes), bounds=bounds or None) as graph:
        return explain_graph(args, path, graph)


def explain_graph(args: argparse.Namespace, path: Path, graph: Graph) -> int:
    """`explain` of an imported graph (with symbolic sizes, under their bounds)."""
    from polytile.frontend import optimize_with_report, partition
    from polytile.frontend.symbolic import is_static

    print(f"imported {path}")
    print(f"  {graph.summary()}")
    optimized, reports = optimize_with_report(graph)
    print("passes:")
    for r in reports:
        print(
            f"  {r.name:<26} {r.nodes_before:>5} → {r.nodes_after:<5} nodes"
            f" {r.seconds * 1e3:8.1f} ms"
        )
    start = time.perf_counter()
    parts = partition(optimized)
    print(f"partition in {(time.perf_counter() - start) * 1e3:.0f} ms: {parts.summary()}")
    per_size = explain_per_size(optimized, parts, args.threads)
    if args.kernel is not None:
        print_kernels(optimized, parts, args.kernel, args.records, args.threads)
    if args.groups:
        for g in parts.groups:
            outs = ", ".join(f"{t}:{optimized.types[t]}" for t in g.outputs)
            ops = " → ".join(optimized.node_by_name[n].op_type for n in g.nodes)
            mark = "  (compiled per size)" if g.index in per_size else ""
            print(f"  [{g.index:3}] {g.kind:<20} {ops}  ⇒ {outs}{mark}")
    if args.verify:
        if not all(is_static(d) for t in optimized.types.values() for d in t.shape):
            raise InputError("--verify needs static shapes: give every size in --input-shapes")
        return verify(path, optimized, args.seed)
    return 0


def explain_per_size(graph: Graph, parts: Partition, threads: int | None) -> Mapping[int, str]:
    """Print (and return) the groups of a symbolic graph compiled per size, and why."""
    from polytile.codegen.configs import lower_config
    from polytile.codegen.target import host
    from polytile.compiler import is_symbolic
    from polytile.explanation import per_size_groups

    if not is_symbolic(graph):
        return {}
    found = per_size_groups(graph, parts, lower_config(host(threads)))
    for index, reason in found.items():
        print(f"group {index} is compiled per size on first use, because {reason}")
    return found


def print_kernels(
    graph: Graph, parts: Partition, which: str, records: str | None, threads: int | None
) -> None:
    """The kernel of each selected group under the schedule `compile` gives it on this
    machine (its vector width and threads): the best verified tuning record, else the
    default schedule; as C-like code."""
    from polytile.codegen.configs import default_config, lower_config
    from polytile.codegen.target import host
    from polytile.explanation import explain
    from polytile.poly.default.schedule import default_schedule, representative_sizes
    from polytile.poly.transform.canonical import canonicalize
    from polytile.poly.transform.flatten import kernel_of
    from polytile.search.records import replay_record, tuned_records

    if which == "all":
        selected = list(parts.groups)
    else:
        try:
            selected = [parts.groups[int(which)]]
        except (ValueError, IndexError):
            raise InputError(
                f"--kernel takes a group index 0..{len(parts.groups) - 1} or 'all', not {which}"
            ) from None
    target = host(threads)
    config = default_config(target)
    tuned = tuned_records(records, target)
    sizes = representative_sizes(graph)
    for group in selected:
        try:
            lowered = kernel_of(graph, group, lower_config(target))
            kernel, renamed = canonicalize(lowered)  # as `compile` schedules it
            record = tuned.get(kernel.workload_key())
            tuned_schedule = replay_record(kernel, record)
            schedule = tuned_schedule or default_schedule(kernel, config, sizes)
        except PolytileError as err:
            if not sizes:
                raise
            print(f"\n// group {group.index}: compiled per size on first use, because {err}")
            continue
        source = "default" if tuned_schedule is None else "tuning record's"
        names = ", ".join(
            f"{new} = {old}" for old, new in renamed.items() if old in lowered.tensors
        )
        work = f"{kernel.flops()} flops" if not kernel.params else f"sizes {kernel.params}"
        print(f"\n// group {group.index}: {group.kind}, {work}, {source} schedule")
        print(f"// {target.cpu}, {config.vector_width} float32 lanes, {target.num_threads} threads")
        if names:
            print(f"// tensors: {names}")
        print(explain(schedule), end="")


def compare_outputs(
    names: Sequence[str], want: Sequence[np.ndarray], got: Sequence[np.ndarray], label: str
) -> float:
    """Print each output's error relative to its scale; return the worst."""
    worst = 0.0
    for name, w, g in zip(names, want, got, strict=True):
        scale = float(np.max(np.abs(w))) or 1.0
        err = float(np.max(np.abs(w.astype(np.float64) - g))) / scale
        worst = max(worst, err)
        print(f"{label.format(name=name, shape=g.shape)} max |Δ| / max|y| = {err:.2e}")
    return worst


def verify(path: Path, optimized: Graph, seed: int) -> int:
    """Run the original model and the optimized graph with onnxruntime; compare outputs."""
    import onnxruntime as ort

    from polytile.frontend import export_model

    rng = np.random.default_rng(seed)
    feeds = {
        name: rng.standard_normal(optimized.types[name].shape).astype(optimized.types[name].dtype)
        for name in optimized.inputs
    }
    want = ort_session(path, optimize=False).run(None, feeds)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    got = ort.InferenceSession(export_model(optimized).SerializeToString(), options).run(
        None, feeds
    )
    worst = compare_outputs(optimized.outputs, want, got, "verify {name}: shape {shape}")
    if worst > 1e-4:
        print("verify: the optimized graph differs from the original model", file=sys.stderr)
        return 1
    print("verify: optimized graph matches the original model (onnxruntime)")
    return 0


def compiled(model: str, args: argparse.Namespace) -> CompiledModel:
    """A model argument as a compiled model: a saved .ptm, an .onnx file or a zoo name."""
    import polytile as pt

    if Path(model).is_dir() or model.endswith(".ptm"):
        if not Path(model).is_dir():
            raise InputError(f"saved model '{model}' does not exist")
        return pt.load(model, num_threads=args.threads)
    path = resolve_model(model, args.seed)
    start = time.perf_counter()
    bounds = parse_sizes(getattr(args, "bounds", None), "--bounds")
    if any(len(b) != 2 for b in bounds.values()):
        raise InputError("--bounds takes name=LOW:HIGH items")
    result = pt.compile(
        str(path),
        input_shapes=parse_input_shapes(args.input_shapes),
        num_threads=args.threads,
        opt_level=args.opt_level,
        records=getattr(args, "records", None),
        bounds=bounds or None,
    )
    print(describe(path.name, time.perf_counter() - start, result.stats))
    if result.manifest.specials:  # which kernels compile per size, and why
        from polytile.explanation import explain_model

        print(explain_model(result), end="")
    return result


def describe(name: str, seconds: float, stats: Any) -> str:
    """One line on a compiled model: time, kernels, memory."""
    return (
        f"compiled {name} in {seconds:.1f} s: {stats.kernels} kernels, "
        f"{stats.functions} distinct functions, arena {stats.arena_bytes / 2**20:.1f} MiB "
        f"(unshared {stats.unshared_bytes / 2**20:.1f} MiB)"
    )


def exit_code(error: BaseException) -> int:
    """Bad input, polytile's own error about the model, or a bug."""
    if isinstance(error, BAD_INPUT):
        return EXIT_BAD_INPUT
    return EXIT_ERROR if isinstance(error, PolytileError) else EXIT_INTERNAL


def cmd_compile(args: argparse.Namespace) -> int:
    from polytile import zoo

    if args.zoo:
        names = zoo.NAMES if args.zoo == "all" else args.zoo.split(",")
        unknown = [n for n in names if n not in zoo.NAMES]
        if unknown:
            raise InputError(f"--zoo: unknown model(s) {unknown} (zoo: {', '.join(zoo.NAMES)})")
        return compile_batch(names, args)
    if args.scheduler is not None:
        raise InputError("--scheduler compiles a batch: use it with --zoo")
    if args.model is None:
        raise InputError("compile needs a model (an .onnx file or zoo name) or --zoo")
    model = compiled(args.model, args)
    output = args.output or f"{Path(args.model).stem}.ptm"
    print(f"saved {model.save(output)}")
    return 0


def compile_batch(names: Sequence[str], args: argparse.Namespace) -> int:
    """Compile models one by one, or each as a task on the Dask cluster of --scheduler. A
    model that fails prints an error line naming it and the others go on; the exit code is
    the worst failure's."""
    from tqdm import tqdm

    from polytile.batch import CompileResult, compile_many

    out = Path(args.output or "compiled")
    with tqdm(total=len(names), desc="compile zoo", unit="model") as bar:

        def report(result: CompileResult) -> None:
            if result.ok:
                tqdm.write(describe(result.name, result.seconds, result.stats))
            else:
                if exit_code(result.error) == EXIT_INTERNAL:
                    traceback.print_exception(result.error)
                line = f"polytile: error: model '{result.name}': {result.error}"
                tqdm.write(line, file=sys.stderr)
            bar.update()

        results = compile_many(
            names,
            out,
            args.scheduler,
            seed=args.seed,
            num_threads=args.threads,
            opt_level=args.opt_level,
            input_shapes=parse_input_shapes(args.input_shapes),
            records=args.records,
            progress=report,
        )
    failed = [r for r in results if not r.ok]
    print(f"saved {len(results) - len(failed)} of {len(results)} models in {out}/")
    if failed:
        listed = ", ".join(r.name for r in failed)
        print(f"polytile: error: {len(failed)} model(s) failed: {listed}", file=sys.stderr)
    return max((exit_code(r.error) for r in failed if r.error is not None), default=0)


def print_timing(label: str, timing: Timing) -> None:
    ms = 1e3
    print(
        f"{label}: mean {timing.mean * ms:.2f} ms, median {timing.median * ms:.2f} ms, "
        f"std {timing.std * ms:.2f} ms ({len(timing.results)} repeats)"
    )


def cmd_run(args: argparse.Namespace) -> int:
    model = compiled(args.model, args)
    feeds = load_inputs(args.inputs, args.fill, model, args.seed, run_sizes(args))
    outputs = model.run(feeds)
    for name, value in zip(model.output_names, outputs, strict=True):
        print(f"output {name}: {value.dtype}{list(value.shape)}")
    if args.output:
        np.savez(args.output, **dict(zip(model.output_names, outputs, strict=True)))
        print(f"saved outputs to {args.output}")
    if args.repeat:
        print_timing("polytile", model.benchmark(feeds, repeat=args.repeat, number=args.number))
    if args.profile:
        print_profile(model.profile(feeds, repeat=args.profile))
    return 0


def print_profile(profile: Profile, top: int = 10) -> None:
    """The kernel calls that take the most time, like onnxruntime's per-node profile."""
    total = profile.total
    print(f"profile: {len(profile.calls)} kernel calls, {total * 1e3:.3f} ms in all")
    print(f"{'call':>5}  {'ms':>8}  {'share':>6}  function")
    for call in sorted(profile.calls, key=lambda c: -c.seconds)[:top]:
        share = call.seconds / total if total else 0.0
        print(f"{call.index:>5}  {call.seconds * 1e3:>8.3f}  {share:>6.1%}  {call.function}")


def ort_session(path: Path, threads: int | None = None, optimize: bool = True) -> Any:
    """An onnxruntime session for a model, at the newest IR version onnxruntime reads
    (it lags onnx's); a model it cannot run is a PolytileError, not a crash."""
    import onnxruntime as ort

    from polytile.frontend.importer import load_model
    from polytile.frontend.onnx_io import max_ir_version

    model, _ = load_model(path)
    opset = max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))
    model.ir_version = min(model.ir_version, max_ir_version(opset))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as err:  # onnxruntime's own exception types
        raise PolytileError(f"onnxruntime cannot run {path.name}: {err}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    """Compile, check against onnxruntime, time both in the same process."""
    model = compiled(args.model, args)
    feeds = model.random_inputs(args.seed, run_sizes(args))
    mine = model.benchmark(feeds, repeat=args.repeat, number=args.number)
    print_timing("polytile   ", mine)
    if args.vs == "none":
        return 0
    session = ort_session(resolve_model(args.model, args.seed), args.threads)
    want = session.run(None, feeds)
    got = model.run(feeds)
    worst = compare_outputs(model.output_names, want, got, "output {name} against onnxruntime:")
    session.run(None, feeds)
    results = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        for _ in range(args.number):
            session.run(None, feeds)
        results.append((time.perf_counter() - start) / args.number)
    from polytile.runtime import Timing

    theirs = Timing(tuple(results))
    print_timing("onnxruntime", theirs)
    print(f"polytile / onnxruntime latency: {mine.median / theirs.median:.2f}×")
    if worst > 1e-3:
        print("bench: polytile's outputs differ from onnxruntime's", file=sys.stderr)
        return 1
    return 0


RECORDS_HELP = "tuning records (JSONL): the fastest verified schedule per kernel is used"


def cmd_tune(args: argparse.Namespace) -> int:
    """Search schedules, append measurements to the records, report before / after."""
    from polytile.search.dynamic import SizesConfig
    from polytile.search.measure import MeasureConfig
    from polytile.search.validate import ValidateConfig
    from polytile.tuning import tune

    if args.validate < 0:
        raise InputError(f"--validate takes a count of candidates (0: off), not {args.validate}")
    path = resolve_model(args.model, args.seed)
    budget = parse_duration(args.time_budget) if args.time_budget else None
    bounds = parse_sizes(args.bounds, "--bounds")
    if any(len(b) != 2 for b in bounds.values()):
        raise InputError("--bounds takes name=LOW:HIGH items")
    sizes = None
    if args.tune_sizes:  # "batch=1,seq=16 batch=2,seq=100": one item per measured size
        found = [parse_sizes(item, "--tune-sizes") for item in args.tune_sizes.split()]
        if any(len(v) != 1 for s in found for v in s.values()):
            raise InputError("--tune-sizes takes items like batch=1,seq=128")
        sizes = SizesConfig(sizes=tuple({k: v[0] for k, v in s.items()} for s in found))
    result = tune(
        str(path),
        trials=args.trials,
        records=args.records,
        seed=args.seed,
        tasks=args.tasks,
        time_budget=budget,
        strategy=args.strategy,
        num_threads=args.threads,
        input_shapes=parse_input_shapes(args.input_shapes),
        bounds=bounds or None,
        sizes=sizes,
        measure=MeasureConfig(
            timeout=args.timeout,
            workers=args.workers,
            build_timeout=args.build_timeout,
            build_workers=args.build_workers,
            scheduler=args.scheduler,
            flush_cache=args.flush_cache,
            cold=args.cold,
        ),
        batch=args.batch,
        cost_model=args.cost_model,
        cost_model_kind=args.cost_model_kind,
        validation=ValidateConfig(top=args.validate, seed=args.seed) if args.validate else None,
        early_stopping=args.early_stopping,
    )
    print(result.table())
    if args.end_to_end:
        import polytile as pt

        shapes, at = parse_input_shapes(args.input_shapes), run_sizes(args)
        options = {"num_threads": args.threads, "input_shapes": shapes, "bounds": bounds or None}
        before = pt.compile(str(path), **options)
        after = pt.compile(str(path), records=args.records, **options)
        feeds = before.random_inputs(args.seed, at)
        print_timing("end to end, default schedules", before.benchmark(feeds, repeat=10))
        print_timing("end to end, tuned", after.benchmark(feeds, repeat=10))
    return 0


def cmd_zoo(args: argparse.Namespace) -> int:
    from polytile import zoo

    if args.action == "list":
        for info in zoo.list_models():
            inputs = ", ".join(
                f"{name}[{','.join(map(str, shape))}]" for name, shape in info.inputs
            )
            print(f"{info.name:<24} {info.source:<10} {info.description} | inputs: {inputs}")
        return 0
    names = zoo.NAMES if args.names == ["all"] else args.names
    for name in names:
        start = time.perf_counter()
        path = zoo.materialize(name, seed=args.seed)
        print(f"{name:<24} {path} ({time.perf_counter() - start:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polytile", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    explain = sub.add_parser("explain", help="import, optimize and partition a model; print it")
    explain.add_argument("model", help="an .onnx file or a zoo model name")
    explain.add_argument("--input-shapes", help="name:[d0,d1,...] (sizes or size names)")
    explain.add_argument("--bounds", help="size=LOW:HIGH ... for symbolic sizes (seq=1:512)")
    explain.add_argument("--groups", action="store_true", help="list every fused group")
    explain.add_argument(
        "--kernel",
        metavar="N|all",
        help="print group N's kernel (or all) under the schedule compile gives it here",
    )
    explain.add_argument(
        "--records", help="tuning records (JSONL): show a kernel's best verified record"
    )
    explain.add_argument("--threads", type=int, help="threads (default: all cores)")
    explain.add_argument(
        "--verify",
        action="store_true",
        help="check the optimized graph against the model with onnxruntime",
    )
    explain.add_argument("--seed", type=int, default=0, help="zoo weights and random inputs")
    explain.set_defaults(func=cmd_explain)

    def model_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--input-shapes",
            help="name:[d0,d1,...] for dynamic inputs; a size name (name:[batch,seq]) keeps "
            "it symbolic: the model is compiled once for all its values",
        )
        p.add_argument("--bounds", help="size=LOW:HIGH ... for symbolic sizes (seq=1:512)")
        p.add_argument(
            "--sizes", help="size=N ...: where a model compiled for all sizes runs (default 1)"
        )
        p.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
        p.add_argument("--opt-level", type=int, default=3, choices=[0, 1, 2, 3])
        p.add_argument("--seed", type=int, default=0, help="zoo weights and random inputs")

    def model_command(
        name: str,
        about: str,
        func: Callable[[argparse.Namespace], int],
        model: str = "an .onnx file or a zoo model name",
        nargs: str | None = None,
    ) -> argparse.ArgumentParser:
        """The subcommand `name` on a model that it compiles, using tuning records if given."""
        p = sub.add_parser(name, help=about)
        p.add_argument("model", nargs=nargs, help=model)
        p.add_argument("--records", help=RECORDS_HELP)
        model_options(p)
        p.set_defaults(func=func)
        return p

    def timing_options(p: argparse.ArgumentParser, repeat: int) -> None:
        p.add_argument("--repeat", type=int, default=repeat, help="time this many repeats")
        p.add_argument("--number", type=int, default=1, help="runs per timed repeat")

    comp = model_command(
        "compile", "compile a model to a saved .ptm artifact", cmd_compile, nargs="?"
    )
    comp.add_argument("-o", "--output", help="the .ptm to write (a directory with --zoo)")
    comp.add_argument("--zoo", metavar="all|a,b", help="compile zoo models in a batch")
    comp.add_argument(
        "--scheduler",
        metavar="ADDR",
        help="compile the --zoo batch on this Dask scheduler's cluster",
    )

    run = model_command(
        "run",
        "run a model (.onnx, .ptm or zoo name) on inputs",
        cmd_run,
        "an .onnx file, a .ptm artifact or a zoo model name",
    )
    run.add_argument("-i", "--inputs", help="an .npz of inputs keyed by input name")
    run.add_argument("--fill", default="random", help="inputs when no -i is given: random")
    run.add_argument("-o", "--output", help="write the outputs to this .npz")
    timing_options(run, repeat=0)
    run.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="REPEAT",
        help="time each kernel call over this many runs and list the slowest",
    )

    bench = model_command("bench", "compile, verify and time a model against a peer", cmd_bench)
    bench.add_argument("--vs", choices=["onnxruntime", "none"], default="onnxruntime")
    timing_options(bench, repeat=10)

    tune = sub.add_parser("tune", help="search schedules and record the measurements")
    tune.add_argument("model")
    tune.add_argument("--trials", type=int, default=64)
    tune.add_argument("--records", required=True, help="the JSONL records file (appended)")
    tune.add_argument("--tasks", help="task indices to tune, like 0,2-5 (default: all)")
    tune.add_argument("--time-budget", help="stop after this long: 90s, 30m, 2h")
    tune.add_argument(
        "--early-stopping",
        type=int,
        metavar="N",
        help="stop once the estimated model latency has not improved in N trials",
    )
    tune.add_argument("--strategy", choices=["evolutionary", "random"], default="evolutionary")
    tune.add_argument("--timeout", type=float, default=60.0, help="seconds per candidate")
    tune.add_argument(
        "--workers", type=int, default=1, help="processes compiling and timing candidates"
    )
    tune.add_argument(
        "--build-workers",
        type=int,
        default=2,
        help="processes building candidates' schedules (sketch steps, legality, AST checks)",
    )
    tune.add_argument(
        "--build-timeout",
        type=float,
        default=60.0,
        help="seconds one candidate's schedule may take to build before its worker is killed",
    )
    tune.add_argument("--batch", type=int, default=8, help="candidates measured per round")
    tune.add_argument(
        "--flush-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time every run with the kernel's weights evicted, as kernels meet them in a "
        "model (the default: warm timings favour schedules that lose in the model)",
    )
    tune.add_argument(
        "--cold",
        choices=("weights", "producer", "all"),
        default="weights",
        help="how a timed run starts cold: its weights evicted, its activations as its last "
        "run left them (the default); the kernels that write its inputs in the model run "
        "first, then its weights are evicted; or the whole cache is flushed",
    )
    tune.add_argument(
        "--scheduler",
        metavar="ADDR",
        help="build candidates on this Dask scheduler's cluster (tcp://host:8786); "
        "timing stays on this machine",
    )
    tune.add_argument(
        "--cost-model", help="a cost model file: loaded if it exists, saved after tuning"
    )
    tune.add_argument(
        "--cost-model-kind",
        choices=["pretrained", "regression", "ranking", "random"],
        default="pretrained",
        help="pretrained (the default): fit on the rows shipped with polytile plus this "
        "tune's measurements; regression, ranking: trained from this tune's only",
    )
    tune.add_argument(
        "--validate",
        type=int,
        default=8,
        metavar="K",
        help="afterwards, time each task's K best candidates, a neighbour of its best "
        "(measured first: one trial a task) and its default inside the model and apply "
        "the fastest there (0: off; --trials 0 only validates)",
    )
    tune.add_argument(
        "--tune-sizes",
        metavar="SIZES",
        help="for a model with symbolic sizes: the sizes each candidate is timed at, one "
        "item per set, its sizes comma-separated ('batch=1,seq=16 batch=2,seq=100'; a "
        "missing size is its lower bound); default: 3 sampled within --bounds (seeded), "
        "each candidate's cost the geometric mean of its latencies there",
    )
    tune.add_argument(
        "--end-to-end",
        action="store_true",
        help="time the model before and after tuning (at --sizes for symbolic sizes)",
    )
    model_options(tune)
    tune.set_defaults(func=cmd_tune)

    zoo = sub.add_parser("zoo", help="list or materialize the bundled models")
    zoo.add_argument("action", choices=["list", "materialize"])
    zoo.add_argument("names", nargs="*", default=["all"])
    zoo.add_argument("--seed", type=int, default=0)
    zoo.set_defaults(func=cmd_zoo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except Exception as exc:
        code = exit_code(exc)
        if code == EXIT_INTERNAL:  # a bug: show everything
            traceback.print_exc()
            print("polytile: internal error (a bug in polytile); please report it", file=sys.stderr)
        else:
            print(f"polytile: error: {exc}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
