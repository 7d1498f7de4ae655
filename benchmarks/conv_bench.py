"""The 3x3 stride-1 convolutions of ResNet-50 and VGG-19 (Conv + bias + Relu, float32,
seeded weights), each compiled as Winograd F(2x2, 3x3) and as a direct convolution
(`LowerConfig(winograd=False)`), against onnxruntime, in interleaved turns of one
process; writes benchmarks/results/conv-CPU.{json,md}. `compile` picks between the two
by channels (`polytile.codegen.configs.lower_config`); these figures are where its threshold
comes from. `--avx2` compiles polytile's code for the host's AVX2 subset (16 registers of
8 floats) instead of AVX-512, and writes conv-CPU-avx2.{json,md}.

Kernel times on small machines swing between processes by more than the differences
measured, so only the ratios of one run mean anything.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from fingerprint import fingerprint, write_results
from onnx import TensorProto, helper, numpy_helper
from turns import interleaved, ort_session

import polytile as pt
from polytile.codegen.target import Target, host

RESULTS = Path(__file__).parent / "results"

#: (model, channels in, channels out, image side, calls in the model)
SHAPES = [
    ("resnet50", 64, 64, 56, 3),
    ("resnet50", 128, 128, 28, 4),
    ("resnet50", 256, 256, 14, 6),
    ("vgg19", 64, 64, 224, 1),
    ("vgg19", 128, 128, 112, 1),
    ("vgg19", 256, 256, 56, 3),
    ("vgg19", 512, 512, 28, 3),
]


def conv_model(c: int, m: int, side: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((m, c, 3, 3)) * (2.0 / (9 * c)) ** 0.5).astype(np.float32)
    b = (rng.standard_normal(m) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        f"conv{c}x{m}x{side}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def avx2_of(target: Target) -> Target:
    """The target without its AVX-512 (and AMX, AVX10) features: 256-bit vectors."""
    off = ("+avx512", "+amx", "+avx10")
    features = ",".join(f"-{f[1:]}" if f.startswith(off) else f for f in target.features.split(","))
    return replace(target, features=features, vector_bits=min(target.vector_bits, 256))


def bench(c: int, m: int, side: int, target: Target, turns: int, repeat: int) -> dict[str, float]:
    model = conv_model(c, m, side)
    winograd = pt.LowerConfig(winograd_channels=1)
    runs = {
        "winograd": pt.compile(model, target=target, lowering=winograd),
        "direct": pt.compile(model, target=target, lowering=pt.LowerConfig(winograd=False)),
    }
    threads = target.num_threads
    feeds = {"x": np.random.default_rng(1).standard_normal((1, c, side, side), np.float32)}
    session = ort_session(model, threads)
    want = session.run(None, feeds)[0]
    errors = {}
    for name, compiled in runs.items():
        got = compiled.run(feeds)[0]
        errors[name] = float(np.abs(got - want).max() / np.abs(want).max())
    calls = {
        "onnxruntime": lambda: session.run(None, feeds),
        **{name: (lambda cm=cm: cm.run(feeds)) for name, cm in runs.items()},
    }
    times = interleaved(calls, turns, repeat)
    median = {name: float(np.median(t)) for name, t in times.items()}
    return {
        **{f"{name}_us": t * 1e6 for name, t in median.items()},
        "winograd_vs_direct": median["winograd"] / median["direct"],
        "winograd_vs_onnxruntime": median["winograd"] / median["onnxruntime"],
        "direct_vs_onnxruntime": median["direct"] / median["onnxruntime"],
        "winograd_error": errors["winograd"],
        "direct_error": errors["direct"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--avx2", action="store_true", help="polytile's code without AVX-512")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    args = parser.parse_args(argv)
    target = host(args.threads)
    if args.avx2:
        target = avx2_of(target)
    rows = []
    for model, c, m, side, calls in SHAPES[: args.shapes]:
        row = bench(c, m, side, target, args.turns, args.repeat)
        rows.append({"model": model, "c": c, "m": m, "side": side, "calls": calls, **row})
        print(rows[-1], flush=True)
    cpu = target.cpu + ("-avx2" if args.avx2 else "")
    lines = [
        f"# 3x3 stride-1 Conv + bias + Relu, Winograd vs direct vs onnxruntime ({cpu}, "
        f"{target.vector_bits}-bit vectors)",
        "",
        f"{args.threads} threads, median of {args.turns} interleaved turns (best of "
        f"{args.repeat} runs each); errors relative to onnxruntime's output scale.",
        "",
        "| model | C → M | image | calls | Winograd µs | direct µs | onnxruntime µs "
        "| Winograd / direct | Winograd / ort | direct / ort | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['c']} → {r['m']} | {r['side']}² | {r['calls']} "
            f"| {r['winograd_us']:.0f} | {r['direct_us']:.0f} | {r['onnxruntime_us']:.0f} "
            f"| {r['winograd_vs_direct']:.2f} | {r['winograd_vs_onnxruntime']:.2f} "
            f"| {r['direct_vs_onnxruntime']:.2f} | {r['winograd_error']:.1e} |"
        )
    meta = {"turns": args.turns, "repeat": args.repeat, "avx2": args.avx2}
    write_results(args.out, f"conv-{cpu}", rows, lines, meta, fingerprint(args.threads))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
