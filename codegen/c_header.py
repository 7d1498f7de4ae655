"""The C header of an exported library (`CompiledModel.export_library`): the functions and
globals it exports, with the model's inputs, outputs and sizes written out, so a C
caller needs neither Python nor the manifest to call it right."""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import dynamic_plan as dp
from .dynamic import DynamicPlan
from .llvm_types import NUM_THREADS
from .module import FAULT

#: a tensor as the header describes it: its name, dtype and shape (numbers and `Dim` text)
TensorSpec = tuple[str, str, tuple[int | str, ...]]


def _listed(kind: str, specs: Sequence[TensorSpec]) -> list[str]:
    lines = [f" * {kind}:"]
    for i, (name, dtype, shape) in enumerate(specs):
        lines.append(f" *   {i}: {name} {dtype} [{', '.join(str(d) for d in shape)}]")
    return lines


def c_header(
    name: str,
    entry: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    constants: int,
    arena_bytes: int,
    checks: int | None,
    plan: DynamicPlan | None,
) -> str:
    """The header text of a library whose entry function is `entry`, making `checks`
    index checks (None: a model saved before they existed, whose entry returns nothing)."""
    guard = "POLYTILE_" + re.sub(r"\W", "_", name).upper() + "_H"
    comment = [f"/* The polytile model '{name}' as a C library.", " *"]
    comment += _listed("inputs", inputs) + _listed("outputs", outputs)
    comment += [
        " * Pointer arrays hold one buffer per input, output and constant (the constants in",
        " * the order of <library>.npz); any alignment works, 64 bytes runs fastest.",
        " */",
    ]
    lines = [*comment, f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", ""]
    lines += ["#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    lines += [
        f"#define POLYTILE_NUM_INPUTS {len(inputs)}",
        f"#define POLYTILE_NUM_OUTPUTS {len(outputs)}",
        f"#define POLYTILE_NUM_CONSTANTS {constants}",
    ]
    table = ""
    if plan is None:
        lines.append(f"#define POLYTILE_ARENA_BYTES {arena_bytes}")
    else:
        table = ", const int64_t *table"
        lines += ["", "/* the named sizes, in the order polytile_plan takes them */"]
        lines += [f"#define POLYTILE_SIZE_{n} {i}" for i, n in enumerate(plan.named)]
        lines += [
            "",
            "/* the dynamic table's entries (allocate them for polytile_plan) */",
            f"extern const int64_t {dp.TABLE_LENGTH};",
            f"extern const int64_t {dp.NUM_SIZES};",
            "/* Fills the table for these sizes; returns the arena bytes polytile_run needs,",
            " * or -1 - i when size i is out of bounds, -1 - polytile_num_sizes when a byte",
            " * count overflows. */",
            f"int64_t {dp.PLAN}(const int64_t *sizes, int64_t *table);",
            "/* A tensor's shape at a filled table's sizes, in dims; its rank (-1: none) */",
            f"int32_t {dp.INPUT_SHAPE}(int32_t index, const int64_t *table, int64_t *dims);",
            f"int32_t {dp.OUTPUT_SHAPE}(int32_t index, const int64_t *table, int64_t *dims);",
        ]
    lines += ["", "/* the threads parallel loops use (default 1) */"]
    lines.append(f"extern int32_t {NUM_THREADS};")
    if checks:
        lines.append("/* where the failed index check found a bad value, and the value */")
        lines += [f"extern int64_t {g};" for g in FAULT]
    if checks is None:
        status, result = "void", ""
    else:
        status, result = "int32_t", ": 0, or the number plus one of the failed index check"
    lines.append(f"/* Runs the model{result}. */")
    args = "void *const *inputs, void *const *outputs, void *const *constants, void *arena"
    lines += [f"{status} {entry}({args}{table});", ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
