"""The C header of an exported library (`CompiledModel.export_library`): the functions and
globals it exports, with the model's inputs, outputs and sizes written out, and where
each constant lies in the raw constants file next to it, so a C caller needs neither
Python nor the manifest to call it right."""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import dynamic_plan as dp
from .dynamic import DynamicPlan
from .llvm_types import NUM_THREADS
from .module import FAULT

#: a tensor as the header describes it: its name, dtype and shape (numbers and `Dim` text)
TensorSpec = tuple[str, str, tuple[int | str, ...]]


#: each constant in the raw constants file starts at a multiple of this (its buffers
#: may then be used in place, aligned as the compiled code prefers)
CONSTANT_ALIGN = 64


def constant_offsets(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """Where constants of these byte counts start in the raw constants file, and its size."""
    offsets, at = [], 0
    for n in nbytes:
        offsets.append(at)
        at += -(-max(n, 1) // CONSTANT_ALIGN) * CONSTANT_ALIGN
    return offsets, at


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
    constants: Sequence[int],
    arena_bytes: int,
    checks: int | None,
    plan: DynamicPlan | None,
) -> str:
    """The header text of a library whose entry function is `entry`, with constants of
    these byte counts, making `checks` index checks (None: a model saved before they
    existed, whose entry returns nothing)."""
    guard = "POLYTILE_" + re.sub(r"\W", "_", name).upper() + "_H"
    comment = [f"/* The polytile model '{name}' as a C library.", " *"]
    comment += _listed("inputs", inputs) + _listed("outputs", outputs)
    comment += [
        " * Pointer arrays hold one buffer per input, output and constant; any alignment",
        " * works, 64 bytes runs fastest. The constants are the file <library>.bin (read",
        f" * into a {CONSTANT_ALIGN}-byte aligned buffer), constant i at",
        " * polytile_constant_offsets[i] (and, as numpy arrays, in <library>.npz).",
        " */",
    ]
    lines = [*comment, f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", ""]
    lines += ["#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    lines += [
        f"#define POLYTILE_NUM_INPUTS {len(inputs)}",
        f"#define POLYTILE_NUM_OUTPUTS {len(outputs)}",
        f"#define POLYTILE_NUM_CONSTANTS {len(constants)}",
    ]
    offsets, total = constant_offsets(constants)
    listed = ", ".join(map(str, offsets or [0]))
    lines += [
        f"#define POLYTILE_CONSTANTS_BYTES {total}",
        f"static const int64_t polytile_constant_offsets[{max(len(offsets), 1)}] = {{{listed}}};",
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
