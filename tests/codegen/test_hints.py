"""Machine choices: the target's prefetch defaults follow its parameters (the size of L2,
never the CPU's name), and a schedule's `hint` steps override them for its kernel: a
replayed trace with a hint emits the prefetches the hint asks for, and computes the same
values."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, fields, replace

import numpy as np
import pytest

from polytile.codegen.native import NativeKernel
from polytile.codegen.target import (
    LARGE_L2,
    MachineChoices,
    host,
    l2_bytes,
    machine_defaults,
    with_hints,
)
from polytile.errors import IllegalSchedule
from polytile.handle import ScheduleHandle
from polytile.poly.dsl import kernel
from polytile.poly.ir.schedule import HINTS, Schedule, Step
from polytile.poly.transform import steps as T

from natives import avx512_ir, inputs_for

#: a line of a row some steps ahead (locality 3), of the next iteration's weights
#: (`prefetch_next`, locality 2)
ROW_AHEAD = re.compile(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 3, i32 1\)")
NEXT_LINE = re.compile(r"@llvm.prefetch.p0\(ptr [^,]+, i32 0, i32 2, i32 1\)")
RNG = np.random.default_rng(11)
WEIGHTS = RNG.standard_normal((40, 16)).astype(np.float32)
PANEL_WEIGHTS = RNG.standard_normal((64, 64)).astype(np.float32)


@pytest.mark.parametrize(
    ("l2", "want"),
    [
        (2 << 20, MachineChoices(False, 1 << 20, 16, True)),
        (4 << 20, MachineChoices(False, 2 << 20, 16, True)),
        (1 << 20, MachineChoices(True, 1 << 16, 0, False)),
        (512 << 10, MachineChoices(True, 1 << 16, 0, False)),
    ],
)
def test_the_defaults_follow_the_size_of_l2(l2: int, want: MachineChoices) -> None:
    """A core whose L2 holds two weight panels of a big conv (2 MiB or more) asks for
    rows ahead and the next stencil panel, panels up to half of L2, and no window over the
    next kernel's weights; a smaller L2 the reverse, panels up to 64 KiB."""
    assert machine_defaults(l2) == want
    assert (l2 >= LARGE_L2) is not want.prefetch_weights


def test_host_takes_the_defaults_of_its_l2() -> None:
    """`host()`'s prefetch choices are `machine_defaults` of the L2 it reads, and every
    choice and hint is a field of `Target` (which `with_hints` overrides by name)."""
    target = host()
    assert target.l2_bytes == l2_bytes()
    names = [f.name for f in fields(MachineChoices)]
    chosen = MachineChoices(**{n: getattr(target, n) for n in names})
    assert chosen == machine_defaults(target.l2_bytes)
    assert set(HINTS) <= set(names) <= set(asdict(target))
    assert with_hints(target, {}) is target
    assert with_hints(target, {"input_ahead": 24}) == replace(target, input_ahead=24)


def _rows_kernel() -> list[dict[str, object]]:
    """A register tile of a 1x1 conv over pixel vectors (W constant, A computed): each
    reduction step reads a new row of A, four lines of it."""
    return [
        {"kind": "split", "args": {"loop": "i", "factors": [None, 64]}},
        {"kind": "reorder", "args": {"order": ["i0", "k", "j", "i1"]}},
        {"kind": "decompose_reduction", "args": {"stmt": "Y", "loop": "k"}},
        {"kind": "vectorize", "args": {"loop": "i1"}},
        {"kind": "unroll", "args": {"loop": "j"}},
    ]


@pytest.mark.parametrize(("default", "hinted", "asked"), [(0, 16, 4), (16, 0, 0), (0, None, 0)])
def test_a_hint_sets_the_rows_asked_for_ahead(default: int, hinted: int | None, asked: int) -> None:
    """`input_ahead` hinted in a trace (replayed from JSON) overrides the target's: 16
    gives the row-ahead prefetches (4 lines a step), 0 none; a trace without a hint keeps
    the target's. Values match numpy either way, on this machine."""
    k = kernel("Y[j, i] += W[k, j] * A[k, i]", W=WEIGHTS, A=(40, 64))
    trace = _rows_kernel()
    if hinted is not None:
        trace.append({"kind": "hint", "args": {"input_ahead": hinted}})
    schedule = T.replay(k, json.loads(json.dumps(trace)))
    assert dict(schedule.hints) == ({} if hinted is None else {"input_ahead": hinted})
    text = avx512_ir(schedule, prefetch_weights=False, input_ahead=default)
    assert len(ROW_AHEAD.findall(text.replace('"', ""))) == asked
    inputs = inputs_for(k)
    got = NativeKernel(schedule, replace(host(), input_ahead=default))(inputs)["Y"]
    assert got.shape == (16, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, WEIGHTS.T @ inputs["A"], rtol=1e-4, atol=1e-4)


def _parallel_gemm() -> Schedule:
    """A parallel register tile whose 4 KB weight panel changes with each parallel
    iteration: what `prefetch_next` asks ahead for when the panel limit allows it."""
    k = kernel("Y[j, i] += X[j, k] * W[k, i]", X=(4, 64), W=PANEL_WEIGHTS)
    handle = ScheduleHandle(k)
    assert handle.get_loops("Y") == ["j", "i", "k"]
    i0, i1 = handle.split("i", [None, 16])
    handle.reorder(i0, "k", "j", i1)
    handle.decompose_reduction("Y", "k")
    handle.vectorize(i1)
    handle.unroll("j")
    handle.parallel(i0)
    return handle.schedule


@pytest.mark.parametrize(("panel", "asks"), [(0, False), (1 << 16, True)])
def test_a_hint_sets_the_largest_panel_fetched_ahead(panel: int, asks: bool) -> None:
    """`prefetch_panel` hinted through the handle: 0 asks for none of the next
    iteration's weights, 64 KiB for its 4 KB panel, whatever the target's default; the
    hint is the trace's last step and values match numpy."""
    schedule = _parallel_gemm()
    handle = ScheduleHandle(schedule)
    handle.hint(prefetch_panel=panel)
    hinted = handle.schedule
    assert hinted.trace[-1] == Step("hint", {"prefetch_panel": panel})
    assert hinted.body == schedule.body
    for default in (0, 1 << 16):
        plain = avx512_ir(schedule, prefetch_weights=False, prefetch_panel=default).replace('"', "")
        assert bool(NEXT_LINE.search(plain)) is bool(default)
        text = avx512_ir(hinted, prefetch_weights=False, prefetch_panel=default).replace('"', "")
        assert bool(NEXT_LINE.search(text)) is asks
    inputs = inputs_for(hinted.kernel)
    got = NativeKernel(hinted)(inputs)["Y"]
    np.testing.assert_allclose(got, inputs["X"] @ PANEL_WEIGHTS, rtol=1e-4, atol=1e-4)


def test_later_hints_override_earlier_ones_and_survive_later_steps() -> None:
    """Hints merge in trace order; a step after a hint (even one rebuilding the kernel,
    as pack does) keeps it, since hints are read from the trace; JSON and replay give the
    same schedule."""
    k = kernel("Y[i, j] += A[i, k] * W[k, j]", A=(4, 8), W=WEIGHTS[:8])
    s = T.hint(T.hint(T.replay(k, []), input_ahead=8, panel_ahead=True), input_ahead=16)
    assert dict(s.hints) == {"input_ahead": 16, "panel_ahead": True}
    packed = T.split(T.pack(s, "W", 1, 8), "i", [None, 2])
    assert "W_packed" in packed.kernel.tensors
    assert dict(packed.hints) == dict(s.hints)
    again = T.replay(k, json.loads(json.dumps(packed.trace_json())))
    assert again.trace_json() == packed.trace_json() and again.hints == packed.hints
    assert again.body == packed.body


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"rows": 3},
        {"input_ahead": -1},
        {"input_ahead": True},
        {"input_ahead": 1.5},
        {"panel_ahead": 1},
        {"prefetch_panel": "64K"},
    ],
)
def test_a_malformed_hint_is_an_illegal_step(args: dict[str, object]) -> None:
    """A hint naming no known choice, or a value of the wrong type or sign, is refused
    like any step that does not apply (a trace from elsewhere, edited by hand)."""
    k = kernel("Y[i] += A[i, k]", A=(4, 8))
    with pytest.raises(IllegalSchedule, match="hint"):
        T.replay(k, [{"kind": "hint", "args": args}])
