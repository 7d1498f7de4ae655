"""Native kernels for the codegen tests: the IR for an AVX-512 target whatever the host,
seeded inputs, and the check against the program-order reference."""

from __future__ import annotations

import numpy as np

from polytile.codegen.native import NativeKernel, build_part
from polytile.codegen.target import Target, host
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.ir.schedule import Schedule
from polytile.poly.oracle.reference import run_program_order


def avx512_ir(
    schedule: Schedule,
    prefetch_weights: bool = True,
    prefetch_panel: int = 1 << 16,
    input_ahead: int = 0,
    panel_ahead: bool = False,
    l2_bytes: int = 1 << 20,
) -> str:
    """The LLVM IR of `schedule` for a CPU with AVX-512 (16 float lanes a register),
    whatever the host: the tests that read IR count registers of that width. (Their
    values are checked with the host's own code.)"""
    target = Target(
        "skylake-avx512",
        "",
        host().triple,
        512,
        num_threads=2,
        prefetch_weights=prefetch_weights,
        prefetch_panel=prefetch_panel,
        input_ahead=input_ahead,
        panel_ahead=panel_ahead,
        l2_bytes=l2_bytes,
    )
    return build_part(schedule, target)[0]


def inputs_for(k: Kernel, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    found = {}
    for t in k.tensors.values():
        if t.role is not Role.INPUT:
            continue
        kind = np.dtype(t.dtype).kind
        if kind == "f":
            found[t.name] = (rng.standard_normal(t.shape) * 2).astype(t.dtype)
        elif kind == "b":
            found[t.name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            found[t.name] = rng.integers(-5, 6, t.shape).astype(t.dtype)
    if k.name == "gather":
        found["I"] = np.array([5, 0, 3, 3], dtype=np.int64)
    return found


def check(schedule: Schedule, inputs: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    k = schedule.kernel
    want = run_program_order(k, inputs)
    got = NativeKernel(schedule)(inputs)
    for t in k.outputs():
        assert got[t.name].shape == want[t.name].shape
        assert got[t.name].dtype == want[t.name].dtype
        np.testing.assert_allclose(
            got[t.name],
            want[t.name],
            rtol=rtol,
            atol=rtol,
            err_msg=f"{k.name}: {schedule.trace_json()}",
        )
