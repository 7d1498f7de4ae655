"""Packing a kernel input at run time (`poly.pack`): a copy statement in its own nest
writes the blocked layout that every load is rewritten to, and the matrix-product plan
packs an input whose panels alias in L1 or whose vectors run across its rows
(`packed_inputs`). Compared with the program-order executor and numpy."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import polytile as pt
from polytile.codegen.native import NativeKernel
from polytile.errors import IllegalSchedule
from polytile.poly.default.schedule import DefaultConfig, default_schedule, packed_inputs
from polytile.poly.dsl import kernel
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Role, Statement
from polytile.poly.ir.schedule import initial_schedule, statements_below
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T
from polytile.search.space import SearchSpace
from polytile.search.tasks import extract_tasks

from kernels import check_mm_relu, mm_relu, random_inputs

TRANSPOSED = kernel("C[i, j] += A[i, k] * B[j, k]", A=(40, 24), B=(48, 24))


@pytest.mark.parametrize(("tensor", "axis", "factor"), [("B", 1, 4), ("B", 1, 3), ("A", 0, 4)])
def test_packing_an_input_copies_it_into_blocks_before_its_reader(
    tensor: str, axis: int, factor: int
) -> None:
    kernel_ = mm_relu(5, 10, 7)
    packed = T.pack(initial_schedule(kernel_), tensor, axis, factor)
    new = packed.kernel.tensors[f"{tensor}_packed"]
    shape = kernel_.tensors[tensor].shape
    rest = [n for a, n in enumerate(shape) if a != axis]
    assert new.role is Role.TEMP
    assert new.shape == (math.ceil(shape[axis] / factor), *rest, factor)
    assert packed.kernel.tensors[tensor] == kernel_.tensors[tensor]
    # the copy's statement and nest come right before the reader's
    names = [s.name for s in packed.kernel.statements]
    assert names.index(f"{tensor}_pack") == names.index("Y") - 1
    nests = [statements_below(n) for n in packed.body]
    assert len(nests) == len(initial_schedule(kernel_).body) + 1
    copy = next(i for i, stmts in enumerate(nests) if f"{tensor}_pack" in stmts)
    assert "Y" in nests[copy + 1]
    check_mm_relu(packed, atol=1e-6)
    again = T.replay(kernel_, packed.trace_json())
    assert again.kernel.workload_key() == packed.kernel.workload_key()


def reads(stmt: Statement) -> set[str]:
    return {ld.tensor for ld in loads(stmt.expr)}


def test_after_packing_only_the_copy_reads_the_input() -> None:
    packed = T.pack(initial_schedule(mm_relu(4, 8, 6)), "B", 1, 4)
    assert {s.name for s in packed.kernel.statements if "B" in reads(s)} == {"B_pack"}
    assert reads(packed.kernel.statement["Y"]) == {"A", "B_packed"}


def config(cache_bytes: int = 1 << 19) -> DefaultConfig:
    return DefaultConfig(vector_width=8, cache_bytes=cache_bytes)


def test_an_input_is_packed_where_its_panel_rows_alias_in_l1() -> None:
    """B's rows 1024 floats apart all fall in one L1 set: a panel of 256 of them misses
    in L1 whatever is reused. 784 floats apart (ResNet-50's 1x1 convs over 28x28 pixels
    flattened) they spread over 16 sets, which packing did not repay."""
    wide = kernel("C[i, j] += A[i, k] * B[k, j]", A=(64, 512), B=(512, 1024))
    main = wide.statement["C"]
    assert packed_inputs(wide, main, "j", "i", 256, 11, config()) == ("B",)
    # too few register blocks re-read it to repay the copy
    assert packed_inputs(wide, main, "j", "i", 256, 3, config()) == ()
    # a short reduction's panel has too few rows to alias
    assert packed_inputs(wide, main, "j", "i", 16, 11, config()) == ()
    # it fits in L2: its layout does not matter there
    assert packed_inputs(wide, main, "j", "i", 256, 11, config(cache_bytes=4 << 20)) == ()
    spread = kernel("C[i, j] += A[i, k] * B[k, j]", A=(64, 512), B=(512, 784))
    assert packed_inputs(spread, spread.statement["C"], "j", "i", 256, 11, config()) == ()


def test_a_transposed_input_is_packed_whatever_its_size() -> None:
    main = TRANSPOSED.statement["C"]
    assert packed_inputs(TRANSPOSED, main, "j", "i", 24, 14, config()) == ("B",)
    assert packed_inputs(TRANSPOSED, main, "j", "i", 24, 2, config()) == ()


def test_default_schedule_packs_a_transposed_input_and_matches_numpy() -> None:
    schedule = default_schedule(TRANSPOSED, DefaultConfig(vector_width=8))
    packs = [s.args for s in schedule.trace if s.kind == "pack"]
    assert packs == [{"tensor": "B", "axis": 0, "factor": 16}]
    inputs = random_inputs(TRANSPOSED)
    got = NativeKernel(schedule)(inputs)["C"]
    want = inputs["A"] @ inputs["B"].T
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        got, run_program_order(TRANSPOSED, inputs)["C"], rtol=1e-4, atol=1e-4
    )
    # the search space's default decisions build the same schedule
    space = SearchSpace(TRANSPOSED, lanes=8, threads=2)
    assert space.build(space.default_decisions()).trace == schedule.trace_json()
    # and its `pack` decision turns the copy off with the weights' packing
    off = space.build({**space.default_decisions(), "pack": False}).schedule
    assert "B_packed" not in off.kernel.tensors


def test_packing_an_input_never_packs_an_output() -> None:
    with pytest.raises(IllegalSchedule, match=r"pack\(C, .*constant or input"):
        T.pack(initial_schedule(TRANSPOSED), "C", 1, 8)


def test_a_compiled_model_packs_an_input_and_matches_onnxruntime() -> None:
    """Gemm with transB and B an input (not a weight): its default schedule with 8 lanes
    copies B into panels (a temporary, which a compiled model keeps in its arena), and
    the compiled model's output is onnxruntime's and numpy's."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["a", "b"], ["y"], transB=1)],
        "gemm_bt",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [40, 24]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [48, 24]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx_bytes = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]
    ).SerializeToString()
    (task,) = extract_tasks(onnx_bytes)
    schedule = default_schedule(task.kernel, DefaultConfig(vector_width=8))
    assert [s.args["axis"] for s in schedule.trace if s.kind == "pack"] == [0]
    rng = np.random.default_rng(3)
    feeds = {
        "a": rng.standard_normal((40, 24)).astype(np.float32),
        "b": rng.standard_normal((48, 24)).astype(np.float32),
    }
    (got,) = pt.compile(onnx_bytes).run(feeds)
    (want,) = ort.InferenceSession(onnx_bytes).run(None, feeds)
    assert got.shape == want.shape == (40, 48) and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, feeds["a"] @ feeds["b"].T, rtol=1e-5, atol=1e-5)
