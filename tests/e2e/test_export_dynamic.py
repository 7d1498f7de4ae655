"""The C library of a model compiled once for all sizes: its planner fills the dynamic
table in C (sizes, a derived product, arena offsets, an index check's count and bound),
its shape functions give the outputs' run-time shapes, and its entry runs at each size
against onnxruntime, inside an arena of exactly the bytes the planner asked for. The
placement keeps live tensors apart at every size; bad sizes are refused."""

from __future__ import annotations

import ctypes
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polytile as pt
from polytile.codegen.c_header import c_header
from polytile.codegen.dynamic import ArenaTensor, DynamicPlan
from polytile.codegen.dynamic_plan import SAMPLE_SIZES, placement, plan_module
from polytile.codegen.jit import compile_part, finalize, link_shared, linker
from polytile.codegen.plan import ALIGN
from polytile.codegen.target import host
from polytile.frontend.symbolic import MAX_DIM
from polytile.runtime import CompiledModel

from peers import ort_run

pytestmark = pytest.mark.skipif(linker() is None, reason="no system linker")

GUARD = 256
P = ctypes.c_void_p


def block_model() -> onnx.ModelProto:
    """A projection over [batch, seq, 8], a strided 1-D conv twice (floor divisions of
    seq), a softmax in place of its input, a flattening Reshape to [batch*seq, 16] (a
    derived size) and a Gather with run-time indices (a checked index input)."""
    rng = np.random.default_rng(3)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [weight("w1", (8, 16)), weight("wc", (8, 16, 3)), weight("wc2", (4, 8, 3))]
    inits += [weight("w2", (16, 4)), numpy_helper.from_array(np.array([-1, 16]), "flat")]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h"]),
        n("Relu", ["h"], ["r"]),
        n("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        n("Conv", ["t", "wc"], ["c"], strides=[2], pads=[1, 1]),
        n("Conv", ["c", "wc2"], ["c2"], strides=[2], pads=[1, 1]),
        n("Softmax", ["r"], ["s"], axis=-1),
        n("Reshape", ["s", "flat"], ["f"]),
        n("MatMul", ["f", "w2"], ["y1"]),
        n("Gather", ["x", "ids"], ["y2"], axis=1),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["k"]),
    ]
    outputs = [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("c2", "y1", "y2")
    ]
    graph = helper.make_graph(nodes, "block", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class Library:
    """An exported library opened with ctypes, and its manifest and constants."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = lib = ctypes.CDLL(str(path))
        lib.polytile_plan.restype = ctypes.c_int64
        lib.polytile_plan.argtypes = [P, P]
        lib.polytile_run.restype = ctypes.c_int32
        lib.polytile_run.argtypes = [P] * 5
        for shape in (lib.polytile_input_shape, lib.polytile_output_shape):
            shape.restype = ctypes.c_int32
            shape.argtypes = [ctypes.c_int32, P, P]
        self.manifest = json.loads(Path(f"{path}.json").read_text())
        self.plan = DynamicPlan.from_json(self.manifest["dynamic"])
        self.length = ctypes.c_int64.in_dll(lib, "polytile_table_length").value
        with np.load(f"{path}.npz") as npz:
            self.constants = [np.ascontiguousarray(npz[f"arr_{i}"]) for i in range(len(npz.files))]

    def planned(self, named: dict[str, int]) -> tuple[int, np.ndarray]:
        sizes = np.array([named[n] for n in self.plan.named], np.int64)
        table = np.full(self.length, -7, np.int64)
        return self.lib.polytile_plan(sizes.ctypes.data, table.ctypes.data), table

    def shape(self, which: str, index: int, table: np.ndarray) -> tuple[int, ...] | None:
        dims = np.zeros(8, np.int64)
        rank = getattr(self.lib, f"polytile_{which}_shape")(
            index, table.ctypes.data, dims.ctypes.data
        )
        return None if rank < 0 else tuple(int(d) for d in dims[:rank])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompiledModel, Library]:
    compiled = pt.compile(block_model())
    assert compiled.manifest.dynamic is not None
    path = compiled.export_library(tmp_path_factory.mktemp("lib") / "block.so")
    return compiled, Library(path)


def _pointers(arrays: list[np.ndarray]) -> ctypes.Array:
    return (P * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])


def _guarded(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """An arena of exactly `nbytes` (64-byte aligned) between guard bytes, and the whole."""
    whole = np.full(nbytes + 2 * GUARD + ALIGN, 0xA5, np.uint8)
    start = GUARD + (-(whole.ctypes.data + GUARD) % ALIGN)
    return whole[start : start + nbytes], whole


@pytest.mark.parametrize(("batch", "seq", "k"), [(1, 1, 1), (2, 7, 3), (3, 17, 5)])
def test_library_plans_and_runs_at_every_size(exported, batch: int, seq: int, k: int) -> None:
    """The C table holds what `DynamicPlan.table` holds but the offsets; the shapes are
    the feeds' and onnxruntime's; the run matches it inside an arena of exactly the
    planned bytes, and its index check fails on an index the table's bound refuses."""
    compiled, lib = exported
    named = {"batch": batch, "seq": seq, "k": k}
    arena_bytes, table = lib.planned(named)
    assert arena_bytes > 0
    want_table, _, values = lib.plan.table(named)
    sizes, arena = len(lib.plan.sizes), len(lib.plan.arena)
    assert table.shape == want_table.shape
    assert table[:sizes].tolist() == [values[n] for n in lib.plan.sizes]
    assert table[sizes + arena :].tolist() == want_table[sizes + arena :].tolist()
    rng = np.random.default_rng(seq)
    feeds = {
        "x": rng.standard_normal((batch, seq, 8)).astype(np.float32),
        "ids": rng.integers(-seq, seq, k).astype(np.int64),
    }
    assert [lib.shape("input", i, table) for i in range(2)] == [v.shape for v in feeds.values()]
    want = ort_run(block_model(), feeds)
    shapes = [lib.shape("output", i, table) for i in range(len(want))]
    assert shapes == [w.shape for w in want]
    assert lib.shape("output", len(want), table) is None
    outputs = [np.full(s, np.nan, np.float32) for s in shapes]
    space, whole = _guarded(arena_bytes)
    args = [_pointers(list(feeds.values())), _pointers(outputs), _pointers(lib.constants)]
    status = lib.lib.polytile_run(*args, space.ctypes.data, table.ctypes.data)
    assert status == 0
    lead = space.ctypes.data - whole.ctypes.data
    before, after = whole[:lead], whole[lead + len(space) :]
    assert (before == 0xA5).all() and (after == 0xA5).all(), "the run wrote outside its arena"
    for got, ort_out, run_out in zip(outputs, want, compiled.run(feeds), strict=True):
        np.testing.assert_allclose(got, ort_out, rtol=1e-4, atol=1e-5, err_msg=f"at {named}")
        np.testing.assert_allclose(got, run_out, rtol=1e-6, atol=1e-6)
    feeds["ids"][-1] = seq  # out of range: the check reads its bound from the C table
    outputs = [np.zeros(s, np.float32) for s in shapes]
    args = [_pointers(list(feeds.values())), _pointers(outputs), _pointers(lib.constants)]
    assert lib.lib.polytile_run(*args, space.ctypes.data, table.ctypes.data) == 1


@pytest.mark.parametrize("seq", [1, 2, 3, 8, 63, 64, 65, 1000, 4097])
def test_planned_tensors_stay_apart_while_live(exported, seq: int) -> None:
    """At each size: offsets aligned, tensors live at once never overlapping (unless one
    takes over the other's bytes), the arena holding what is live at every step and no
    more than all tensors unshared; the C plan is the one `Placement.place` computes."""
    _, lib = exported
    plan = lib.plan
    for batch in (1, 3):
        named = {"batch": batch, "seq": seq, "k": 2}
        arena_bytes, table = lib.planned(named)
        values = plan.values(named)
        start = len(plan.sizes)
        placed = table[start : start + len(plan.arena)].tolist()
        offsets = dict(zip((t.name for t in plan.arena), placed, strict=True))
        nbytes = {t.name: t.nbytes(values) for t in plan.arena}
        owner = placement(plan).owner
        mirrored, total = placement(plan).place(nbytes)
        assert (mirrored, total) == (offsets, arena_bytes)
        assert all(o % ALIGN == 0 for o in offsets.values())
        for a in plan.arena:
            assert offsets[a.name] + nbytes[a.name] <= arena_bytes
            for b in plan.arena:
                if a.name < b.name and a.first <= b.last and b.first <= a.last:
                    if owner[a.name] == owner[b.name]:
                        assert offsets[a.name] == offsets[b.name]
                        continue
                    apart = (
                        offsets[a.name] + nbytes[a.name] <= offsets[b.name]
                        or offsets[b.name] + nbytes[b.name] <= offsets[a.name]
                    )
                    assert apart, f"{a.name} and {b.name} overlap at {named}"
        aligned = {n: -(-nbytes[n] // ALIGN) * ALIGN for n in nbytes if owner[n] == n}
        steps = range(max(t.last for t in plan.arena) + 1)
        live = [
            sum(s for n, s in aligned.items() if any(
                owner[t.name] == n and t.first <= step <= t.last for t in plan.arena
            ))
            for step in steps
        ]  # fmt: skip
        assert max(live) <= arena_bytes <= sum(aligned.values())


#: a C program using the library through its header alone: it reads the constants from
#: the library's .bin file, its inputs from a file of int64 byte counts and raw bytes,
#: plans at the sizes of its arguments, runs in an arena of exactly the planned bytes
#: and writes the float32 outputs' ranks, dimensions and values
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "block.so.h"

static void *read_block(FILE *f) {
    int64_t n;
    if (fread(&n, 8, 1, f) != 1) exit(3);
    void *p = aligned_alloc(64, (size_t)((n + 63) / 64 * 64 + 64));
    if (fread(p, 1, (size_t)n, f) != (size_t)n) exit(3);
    return p;
}

int main(int argc, char **argv) {
    void *inputs[POLYTILE_NUM_INPUTS], *outputs[POLYTILE_NUM_OUTPUTS];
    void *constants[POLYTILE_NUM_CONSTANTS];
    FILE *f = fopen(argv[1], "rb");
    for (int i = 0; i < POLYTILE_NUM_INPUTS; i++) inputs[i] = read_block(f);
    char *blob = aligned_alloc(64, POLYTILE_CONSTANTS_BYTES);
    FILE *c = fopen("block.so.bin", "rb");
    if (fread(blob, 1, POLYTILE_CONSTANTS_BYTES, c) != POLYTILE_CONSTANTS_BYTES) return 3;
    for (int i = 0; i < POLYTILE_NUM_CONSTANTS; i++)
        constants[i] = blob + polytile_constant_offsets[i];
    int64_t sizes[16], dims[8];
    for (int i = 0; i < polytile_num_sizes; i++) sizes[i] = atoll(argv[2 + i]);
    int64_t *table = malloc(sizeof(int64_t) * polytile_table_length);
    int64_t arena_bytes = polytile_plan(sizes, table);
    if (arena_bytes < 0) return 4;
    void *arena = malloc((size_t)arena_bytes);
    for (int o = 0; o < POLYTILE_NUM_OUTPUTS; o++) {
        int32_t rank = polytile_output_shape(o, table, dims);
        int64_t count = 1;
        for (int d = 0; d < rank; d++) count *= dims[d];
        outputs[o] = malloc(sizeof(float) * count);
    }
    if (polytile_run(inputs, outputs, constants, arena, table) != 0) return 5;
    for (int o = 0; o < POLYTILE_NUM_OUTPUTS; o++) {
        int32_t rank = polytile_output_shape(o, table, dims);
        int64_t count = 1;
        fwrite(&rank, 4, 1, stdout);
        for (int d = 0; d < rank; d++) count *= dims[d];
        fwrite(dims, 8, (size_t)rank, stdout);
        fwrite(outputs[o], sizeof(float), (size_t)count, stdout);
    }
    return 0;
}
"""


def test_a_c_program_runs_the_library_through_its_header(exported) -> None:
    compiled, lib = exported
    folder = lib.path.parent
    (folder / "driver.c").write_text(DRIVER)
    cc = linker()
    built = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-o", str(folder / "driver"), str(folder / "driver.c"),
         str(lib.path), f"-Wl,-rpath,{folder}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    batch, seq, k = 2, 5, 3
    rng = np.random.default_rng(11)
    feeds = {
        "x": rng.standard_normal((batch, seq, 8)).astype(np.float32),
        "ids": rng.integers(-seq, seq, k).astype(np.int64),
    }
    with open(folder / "data.bin", "wb") as f:
        for a in feeds.values():
            f.write(np.int64(a.nbytes).tobytes() + a.tobytes())
    ran = subprocess.run(
        [str(folder / "driver"), str(folder / "data.bin"), *map(str, (batch, seq, k))],
        capture_output=True, check=False, cwd=folder,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    out, at = ran.stdout, 0
    for want in compiled.run(feeds):
        rank = int(np.frombuffer(out, np.int32, 1, at)[0])
        shape = tuple(np.frombuffer(out, np.int64, rank, at + 4).tolist())
        at += 4 + 8 * rank
        got = np.frombuffer(out, np.float32, int(np.prod(shape)), at).reshape(shape)
        at += got.nbytes
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert at == len(out)


@pytest.mark.parametrize("checks", [None, 0, 2])
def test_a_static_librarys_header_compiles(tmp_path: Path, checks: int | None) -> None:
    """The header of a model compiled for given sizes (with index checks, none, or from
    before they existed) declares what a C caller uses, and C compiles against it."""
    specs = [("x", "float32", (1, 8))], [("y-out", "int64", (3,))]
    header = c_header("two-step", "polytile_run", *specs, [32, 100, 0], 4096, checks, None)
    (tmp_path / "m.h").write_text(header)
    use = "polytile_num_threads = 2; return POLYTILE_ARENA_BYTES + POLYTILE_NUM_CONSTANTS;"
    if checks:
        use += " (void)polytile_fault_value;"
    source = f'#include "m.h"\nint main(void) {{ (void)polytile_run; {use} }}\n'
    (tmp_path / "m.c").write_text(source)
    cc = [linker(), "-std=c11", "-Wall", "-Werror", "-fsyntax-only", str(tmp_path / "m.c")]
    done = subprocess.run(cc, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert ("void polytile_run(" in header) == (checks is None)
    assert ("polytile_fault_value" in header) == bool(checks)
    assert "polytile_plan" not in header and " 0: y-out int64 [3]" in header
    assert "polytile_constant_offsets[3] = {0, 64, 192};" in header


def _planner(plan: DynamicPlan, path: Path) -> ctypes._CFuncPtr:
    """`polytile_plan` of this plan alone, built into a library at `path`."""
    target = host()
    text = finalize(plan_module(plan, [], []), target)
    link_shared([compile_part(text, target, pic=True).obj], str(path))
    planner = ctypes.CDLL(str(path)).polytile_plan
    planner.restype, planner.argtypes = ctypes.c_int64, [P, P]
    return planner


@pytest.mark.parametrize("seed", range(6))
def test_fixed_placement_is_valid_and_no_worse_than_greedy_at_its_sample_sizes(
    seed: int, tmp_path: Path
) -> None:
    """Random arenas (some tensors sized by `n`, one taking over another's bytes): live
    tensors stay apart at every n, at the sizes the orders were taken from the library
    needs no more bytes than the greedy plan, and its C planner places as `place` does."""
    rng = np.random.default_rng(seed)
    tensors = []
    for i in range(12):
        first = int(rng.integers(0, 8))
        shape = (int(rng.integers(1, 300)),) + (("n",) if rng.random() < 0.5 else ())
        tensors.append(ArenaTensor(f"t{i}", 4, shape, first, first + int(rng.integers(0, 4))))
    a = tensors[0] = replace(tensors[0], last=tensors[0].first + 1)
    tensors[1] = replace(a, name="t1", first=a.last, last=a.last + 2)
    plan = DynamicPlan(("n",), {}, tuple(tensors), {"t1": "t0"})
    fixed = placement(plan)
    planner = _planner(plan, tmp_path / "plan.so")
    for n in (*SAMPLE_SIZES, 2, 100, 3000):
        nbytes = {t.name: t.nbytes({"n": n}) for t in tensors}
        offsets, total = fixed.place(nbytes)
        table = np.zeros(1 + len(tensors), np.int64)
        assert planner(np.array([n]).ctypes.data, table.ctypes.data) == total
        assert table[1:].tolist() == [offsets[t.name] for t in tensors]
        assert offsets["t1"] == offsets["t0"]
        for x in tensors:
            for y in tensors:
                if {x.name, y.name} == {"t0", "t1"}:
                    continue
                if x.name < y.name and x.first <= y.last and y.first <= x.last:
                    assert (
                        offsets[x.name] + nbytes[x.name] <= offsets[y.name]
                        or offsets[y.name] + nbytes[y.name] <= offsets[x.name]
                    ), (x, y, n)
        if n in SAMPLE_SIZES:
            assert total <= plan.table({"n": n})[1]


def test_bad_sizes_are_refused(exported) -> None:
    _, lib = exported
    names = lib.plan.named
    assert ctypes.c_int64.in_dll(lib.lib, "polytile_num_sizes").value == len(names)
    for i, name in enumerate(names):
        for bad in (0, -3, MAX_DIM + 1):
            got, _ = lib.planned({**dict.fromkeys(names, 2), name: bad})
            assert got == -1 - i, (name, bad)
    # batch * seq * 16 floats: more bytes than an int64 holds
    got, _ = lib.planned({"batch": MAX_DIM, "seq": MAX_DIM, "k": 1})
    assert got == -1 - len(names)


def test_library_refuses_sizes_outside_the_models_bounds(exported, tmp_path: Path) -> None:
    """A plan with bounds (saved with the manifest) refuses sizes outside them in C."""
    _, lib = exported
    plan = replace(lib.plan, bounds={"seq": (2, 40)}, _tables={})
    assert DynamicPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    planner = _planner(plan, tmp_path / "plan.so")
    table = np.zeros(lib.length, np.int64)
    position = plan.named.index("seq")
    for seq, ok in ((1, False), (2, True), (40, True), (41, False)):
        sizes = np.array([{"seq": seq}.get(n, 1) for n in plan.named], np.int64)
        got = planner(sizes.ctypes.data, table.ctypes.data)
        assert (got > 0) if ok else got == -1 - position, seq
