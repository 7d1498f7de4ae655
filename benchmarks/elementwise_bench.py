"""Transcendental elementwise ops (and LRN, whose power is one) on a 64×56×56 float32
tensor: polytile with vectors through libmvec, polytile with libm called lane by lane
(`Target(vector_math=False)`), onnxruntime and numpy, in interleaved turns of one
process; writes benchmarks/results/elementwise-CPU.{json,md}. `codegen/vecmath.py` and
`Instance.constant_power` are where these figures come from.

    python benchmarks/elementwise_bench.py [--threads 2] [--turns 7]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from fingerprint import fingerprint, write_results
from onnx import TensorProto, helper, numpy_helper
from turns import interleaved, ort_session

import polytile as pt
from polytile.codegen.target import host

RESULTS = Path(__file__).parent / "results"
SHAPE = (1, 64, 56, 56)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _lrn(x: np.ndarray) -> np.ndarray:
    sums = np.stack([(x[:, max(0, c - 2) : c + 3] ** 2).sum(1) for c in range(x.shape[1])], 1)
    return x / (2.0 + 1e-4 / 5 * sums) ** 0.75


#: name → (ONNX node, initializers, numpy's version or None, positive input)
CASES: dict[str, tuple[onnx.NodeProto, dict[str, np.ndarray], Callable | None, bool]] = {
    "Exp": (helper.make_node("Exp", ["x"], ["y"]), {}, np.exp, False),
    "Log": (helper.make_node("Log", ["x"], ["y"]), {}, np.log, True),
    "Tanh": (helper.make_node("Tanh", ["x"], ["y"]), {}, np.tanh, False),
    "Erf": (helper.make_node("Erf", ["x"], ["y"]), {}, None, False),
    "Sigmoid": (helper.make_node("Sigmoid", ["x"], ["y"]), {}, _sigmoid, False),
    "Pow(x, 1.3)": (
        helper.make_node("Pow", ["x", "e"], ["y"]),
        {"e": np.array(1.3, np.float32)},
        lambda x: np.power(x, np.float32(1.3)),
        True,
    ),
    "Pow(x, 2)": (
        helper.make_node("Pow", ["x", "e"], ["y"]),
        {"e": np.array(2.0, np.float32)},
        np.square,
        False,
    ),
    "LRN(beta 0.75)": (
        helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=0.75, bias=2.0),
        {},
        _lrn,
        False,
    ),
}


def model_of(node: onnx.NodeProto, initializers: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        node.op_type,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bench(name: str, threads: int, turns: int, repeat: int) -> dict[str, object]:
    node, initializers, reference, positive = CASES[name]
    model = model_of(node, initializers)
    target = host(threads)
    runs = {
        "libmvec": pt.compile(model, target=target),
        "libm": pt.compile(model, target=replace(target, vector_math=False)),
    }
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 3
    if positive:
        x = np.abs(x) + 1e-3
    feeds = {"x": x}
    session = ort_session(model, threads)
    want = session.run(None, feeds)[0]
    errors = {}
    for label, compiled in runs.items():
        got = compiled.run(feeds)[0]
        assert got.shape == want.shape and got.dtype == want.dtype, label
        errors[label] = float(np.abs(got - want).max() / np.abs(want).max())
    calls = {
        "onnxruntime": lambda: session.run(None, feeds),
        **{label: (lambda cm=cm: cm.run(feeds)) for label, cm in runs.items()},
    }
    if reference is not None:
        calls["numpy"] = lambda: reference(x)
    times = interleaved(calls, turns, repeat)
    median = {label: float(np.median(t)) for label, t in times.items()}
    ort_turns = np.array(times["onnxruntime"])
    return {
        "op": name,
        **{f"{label}_us": t * 1e6 for label, t in median.items()},
        **{
            f"{label}_vs_onnxruntime": float(np.median(np.array(times[label]) / ort_turns))
            for label in calls
            if label != "onnxruntime"
        },
        "libmvec_error": errors["libmvec"],
        "libm_error": errors["libm"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--ops", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    rows = [bench(name, args.threads, args.turns, args.repeat) for name in args.ops]
    for row in rows:
        print(row, flush=True)
    target = host(args.threads)
    lines = [
        f"# Transcendental elementwise ops on {'×'.join(map(str, SHAPE))} float32 "
        f"({target.cpu}, {args.threads} threads)",
        "",
        f"Median of {args.turns} interleaved turns (best of {args.repeat} runs each); a ratio "
        "is the median of the turns' ratios to onnxruntime; errors relative to "
        "onnxruntime's output scale. libm: polytile's code calling libm lane by lane.",
        "",
        "| op | polytile (libmvec) µs | polytile (libm) µs | onnxruntime µs | numpy µs "
        "| libmvec / ort | libm / ort | numpy / ort | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        numpy_us = f"{r['numpy_us']:.0f}" if "numpy_us" in r else "-"
        numpy_ratio = f"{r['numpy_vs_onnxruntime']:.2f}" if "numpy_us" in r else "-"
        lines.append(
            f"| {r['op']} | {r['libmvec_us']:.0f} | {r['libm_us']:.0f} "
            f"| {r['onnxruntime_us']:.0f} | {numpy_us} | {r['libmvec_vs_onnxruntime']:.2f} "
            f"| {r['libm_vs_onnxruntime']:.2f} | {numpy_ratio} | {r['libmvec_error']:.1e} |"
        )
    meta = {"turns": args.turns, "repeat": args.repeat, "shape": list(SHAPE)}
    fp = fingerprint(args.threads)
    write_results(args.out, f"elementwise-{target.cpu}", rows, lines, meta, fp)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
