"""Register blocks fit the target's vector registers: the matrix-product plan's inner
loop, compiled for a CPU with AVX2 (16 registers of 8 lanes) and for one with AVX-512
(32 of 16), keeps its accumulators in registers and never touches the stack."""

from __future__ import annotations

import platform
import re

import pytest

from polytile.codegen.jit import emit_assembly, finalize, optimize
from polytile.codegen.kernel import emit_kernel
from polytile.codegen.module import new_module
from polytile.codegen.target import Target, host, l2_bytes
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="x86 register counts"
)

FMA = re.compile(r"\bvfmadd\w*ps\b")
STACK = re.compile(r"\(%rsp\)|\(%rbp\)")


def _fma_loop(assembly: str) -> list[str]:
    """The innermost loop holding the FMAs: from its label to the jump back to it."""
    lines = assembly.splitlines()
    first = next(i for i, line in enumerate(lines) if FMA.search(line))
    start = max(i for i in range(first) if re.match(r"^\.LBB\w+:", lines[i]))
    label = lines[start].rstrip(":")
    end = next(i for i in range(first, len(lines)) if re.search(rf"\bj\w+\s+{label}$", lines[i]))
    return lines[start : end + 1]


def _inner_loop(cpu: str, bits: int, config: DefaultConfig) -> list[str]:
    target = Target(cpu, "", host().triple, bits, num_threads=2)
    k = kernel("C[i, j] += A[i, k] * B[k, j]", A=(96, 256), B=(256, 4 * config.vector_width))
    module = new_module("gemm", target)
    emit_kernel(module, default_schedule(k, config), "gemm")
    return _fma_loop(emit_assembly(optimize(finalize(module.module, target), target), target))


@pytest.mark.parametrize(
    ("cpu", "bits", "fmas"), [("znver3", 256, 12), ("skylake-avx512", 512, 16)]
)
def test_matrix_product_accumulators_stay_in_registers(cpu: str, bits: int, fmas: int) -> None:
    """6 rows of two AVX2 vectors (8 rows spilled four accumulators every iteration), 8
    rows of two AVX-512 vectors: one FMA per accumulator in each (maybe unrolled) step,
    and no stack access."""
    config = DefaultConfig(vector_width=bits // 32, threads=2)
    loop = _inner_loop(cpu, bits, config)
    count = sum(bool(FMA.search(line)) for line in loop)
    assert count > 0 and count % fmas == 0
    assert not [line for line in loop if STACK.search(line)]


def test_eight_rows_spill_with_sixteen_registers() -> None:
    """The check above can fail: four rows more than the AVX2 plan's spill."""
    config = DefaultConfig(vector_width=8, threads=2, register_block=4)
    assert [line for line in _inner_loop("znver3", 256, config) if STACK.search(line)]


def test_l2_size_read_from_sysfs(tmp_path) -> None:
    """Linux's cache description gives the default schedules' cache size; without one
    the size is 1 MiB."""
    for index, (level, size) in enumerate([("1", "32K"), ("2", "512K"), ("3", "32768K")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert l2_bytes(str(tmp_path)) == 512 * 1024
    assert l2_bytes(str(tmp_path / "missing")) == 1 << 20
