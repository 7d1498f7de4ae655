"""The AST interpreter (the oracle for schedule transformations): on initial schedules it
agrees with the program-order executor and numpy; it follows isl's AST operator semantics
(floor division, remainders, min / max bounds, strides, guards); it runs parallel loops
out of order and checks that every instance runs exactly once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polytile.errors import InputError
from polytile.explanation import explain
from polytile.poly.ast.build import Block, Call, For, If, Int, Mark, Op, Var, build_ast
from polytile.poly.ir.expr import Load, binary, const
from polytile.poly.ir.kernel import Kernel, Role, Statement, Tensor
from polytile.poly.ir.schedule import Leaf, Loop, Schedule, initial_schedule
from polytile.poly.oracle.interp import (
    InterpretError,
    compile_expr,
    eval_expr,
    execution_order,
    interpret,
    run_schedule,
)
from polytile.poly.oracle.reference import run_program_order
from polytile.poly.transform import steps as T

from kernels import F32, boxed, init, mm_relu, prefix_sum, random_inputs, softmax_rows, stencil


def _tensors(**specs: tuple[tuple[int, ...], Role]) -> dict[str, Tensor]:
    return {n: Tensor(n, shape, F32, role) for n, (shape, role) in specs.items()}


def broadcast_add(n: int = 3, m: int = 5) -> Kernel:
    """C[i, j] = A[i, j] + b[j] (a row vector broadcast over rows)."""
    expr = binary("add", Load("A", ("i", "j"), F32), Load("b", ("j",), F32))
    s = boxed("C", ("i", "j"), [n, m], "C", ("i", "j"), expr)
    tensors = _tensors(A=((n, m), Role.INPUT), b=((m,), Role.INPUT), C=((n, m), Role.OUTPUT))
    return Kernel("broadcast_add", tensors, (s,))


def row_max(n: int = 4, m: int = 6) -> Kernel:
    """M[i] = max_j X[i, j]: a max reduction with its init."""
    stmts = (
        init("M", ("i",), [n], -np.inf),
        boxed("M", ("i", "j"), [n, m], "M", ("i",), Load("X", ("i", "j"), F32), reduction="max"),
    )
    return Kernel("row_max", _tensors(X=((n, m), Role.INPUT), M=((n,), Role.OUTPUT)), stmts)


def triangle(n: int = 6) -> Kernel:
    """L[i, j] = 2·A[i, j] on { 0 <= j <= i < n }, then R[i] = sum_{j <= i} L[i, j]."""
    tri = "{ %s[i, j] : 0 <= j <= i < %d }"
    stmts = (
        Statement(
            "L",
            ("i", "j"),
            tri % ("L", n),
            "L",
            ("i", "j"),
            binary("mul", Load("A", ("i", "j"), F32), const(2, F32)),
        ),
        init("R", ("i",), [n], 0),
        Statement(
            "R",
            ("i", "j"),
            tri % ("R", n),
            "R",
            ("i",),
            Load("L", ("i", "j"), F32),
            reduction="sum",
        ),
    )
    tensors = _tensors(A=((n, n), Role.INPUT), L=((n, n), Role.OUTPUT), R=((n,), Role.OUTPUT))
    return Kernel("triangle", tensors, stmts)


def scale(n: int = 10, lo: int = 0) -> Kernel:
    """B[i] = 2·A[i] on lo <= i < n."""
    s = Statement(
        "S",
        ("i",),
        f"{{ S[i] : {lo} <= i < {n} }}",
        "B",
        ("i",),
        binary("mul", Load("A", ("i",), F32), const(2, F32)),
    )
    return Kernel("scale", _tensors(A=((n,), Role.INPUT), B=((n,), Role.OUTPUT)), (s,))


def _numpy_expected(name: str, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if name == "mm_relu":
        return {"C": np.maximum(x["A"] @ x["B"], 0)}
    if name == "broadcast_add":
        return {"C": x["A"] + x["b"]}
    if name == "stencil":
        a = x["A"]
        b = np.zeros_like(a)
        b[1:-1] = a[:-2] + a[1:-1] + a[2:]
        return {"B": b}
    if name == "row_max":
        return {"M": x["X"].max(axis=1)}
    if name == "triangle":
        low = np.tril(2 * x["A"])
        return {"L": low, "R": low.sum(axis=1)}
    if name == "softmax":
        e = np.exp(x["X"] - x["X"].max(axis=1, keepdims=True))
        return {"Y": e / e.sum(axis=1, keepdims=True)}
    if name == "prefix_sum":
        return {"P": np.cumsum(x["A"])}
    raise KeyError(name)


KERNELS = {
    "mm_relu": lambda: mm_relu(4, 5, 3),
    "broadcast_add": broadcast_add,
    "stencil": lambda: stencil(9),
    "row_max": row_max,
    "triangle": triangle,
    "softmax": lambda: softmax_rows(3, 5),
    "prefix_sum": lambda: prefix_sum(7),
}


def _assert_same(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_initial_schedule_agrees_with_program_order_and_numpy(name: str) -> None:
    kernel = KERNELS[name]()
    inputs = random_inputs(kernel, seed=1)
    got = run_schedule(initial_schedule(kernel), inputs)
    want = run_program_order(kernel, inputs)
    assert set(got) == set(kernel.tensors)
    for t in kernel.tensors.values():
        assert got[t.name].shape == t.shape and got[t.name].dtype == np.dtype(t.dtype)
        # same instances in the same order: bit-identical, temporaries included
        np.testing.assert_array_equal(got[t.name], want[t.name])
    for tname, value in _numpy_expected(name, inputs).items():
        _assert_same(got[tname], value.astype(F32))


def test_interpret_takes_an_ast_with_its_kernel() -> None:
    kernel = mm_relu(3, 4, 2)
    inputs = random_inputs(kernel)
    ast = build_ast(initial_schedule(kernel))
    got = interpret(ast, kernel, inputs)["C"]
    _assert_same(got, np.maximum(inputs["A"] @ inputs["B"], 0))
    with pytest.raises(ValueError, match="kernel"):
        interpret(ast, None, inputs)
    with pytest.raises(InputError, match="'B' is missing"):
        interpret(ast, kernel, {"A": inputs["A"]})


def test_inputs_are_not_modified() -> None:
    kernel = broadcast_add()
    inputs = random_inputs(kernel)
    before = {k: v.copy() for k, v in inputs.items()}
    run_schedule(initial_schedule(kernel), inputs)
    for k, v in before.items():
        np.testing.assert_array_equal(inputs[k], v)


# --- isl AST operators -------------------------------------------------------------------


def _op(op: str, *args: int | Op | Var) -> Op:
    return Op(op, tuple(Int(a) if isinstance(a, int) else a for a in args))


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        (_op("fdiv_q", -7, 2), -4),  # floor
        (_op("fdiv_q", 7, 2), 3),
        (_op("fdiv_q", -8, 4), -2),
        (_op("pdiv_q", 7, 2), 3),
        (_op("pdiv_r", 7, 3), 1),
        (_op("zdiv_r", -7, 2), -1),  # C remainder: sign of the dividend
        (_op("zdiv_r", 7, -2), 1),
        (_op("zdiv_r", -6, 3), 0),
        (_op("div", -8, 4), -2),  # exact
        (_op("minus", 5), -5),
        (_op("min", 4, -1, 7), -1),
        (_op("max", 4, -1, 7), 7),
        (_op("sub", 2, 9), -7),
        (_op("mul", -3, 4), -12),
        (_op("select", _op("lt", 1, 2), 10, 20), 10),
        (_op("select", _op("ge", 1, 2), 10, 20), 20),
        (_op("and", _op("eq", 3, 3), _op("le", 2, 2)), 1),
        (_op("or", _op("gt", 1, 3), _op("lt", 1, 1)), 0),
    ],
)
def test_ast_operator_semantics(expr: Op, value: int) -> None:
    assert eval_expr(expr, {}) == value


def test_lazy_operators_do_not_evaluate_the_other_branch() -> None:
    unbound = Var("nowhere")
    assert eval_expr(_op("select", 1, 5, unbound), {}) == 5
    assert eval_expr(_op("and", _op("eq", 0, 1), unbound), {}) == 0
    assert eval_expr(_op("or", _op("eq", 1, 1), unbound), {}) == 1
    with pytest.raises(InterpretError, match="nowhere"):
        eval_expr(unbound, {})
    assert eval_expr(_op("add", Var("i"), 3), {"i": 4}) == 7


@pytest.mark.parametrize(
    "expr",
    [_op("div", 7, 2), _op("pdiv_q", -1, 4), _op("pdiv_r", -5, 4), _op("frobnicate", 1, 2)],
)
def test_broken_operator_preconditions_raise(expr: Op) -> None:
    with pytest.raises(InterpretError):
        compile_expr(expr)({})


# --- hand-built schedules whose ASTs use floor division, min / max, strides, guards ------


def _nest(kernel: Kernel, stmt: str, exprs: list[str]) -> Schedule:
    """One loop per expression (outermost first) around one statement."""
    s = kernel.statement[stmt]
    body: tuple = (Leaf(stmt),)
    for n, e in reversed(list(enumerate(exprs))):
        body = (Loop(f"l{n}", {stmt: f"{{ {stmt}[{', '.join(s.dims)}] -> [({e})] }}"}, body),)
    return Schedule(kernel, body)


def _ops(node: object) -> set[str]:
    """Every AST operator used in a node."""
    if isinstance(node, Op):
        return {node.op}.union(*(_ops(a) for a in node.args))
    if isinstance(node, For):
        return _ops(node.init) | _ops(node.cond) | _ops(node.inc) | _ops(node.body)
    if isinstance(node, If):
        return _ops(node.cond) | _ops(node.then) | (_ops(node.orelse) if node.orelse else set())
    if isinstance(node, Block):
        return set().union(*(_ops(i) for i in node.items))
    if isinstance(node, Mark):
        return _ops(node.body)
    if isinstance(node, Call):
        return set().union(*(_ops(a) for a in node.args))
    return set()


def _check(schedule: Schedule, want: dict[str, np.ndarray], seed: int = 0) -> None:
    inputs = random_inputs(schedule.kernel, seed)
    got = run_schedule(schedule, inputs)
    for name, fn in want.items():
        _assert_same(got[name], fn(inputs))


def test_split_by_four_with_min_bound() -> None:
    """i → (floor(i/4), i mod 4) on 10 points: the inner bound is min(3, 9 - 4·l0)."""
    kernel = scale(10)
    schedule = _nest(kernel, "S", ["floor(i/4)", "i - 4*floor(i/4)"])
    ast = build_ast(schedule)
    assert "min" in _ops(ast)
    assert "min(3, " in explain(schedule)
    _check(schedule, {"B": lambda x: 2 * x["A"]})
    assert execution_order(schedule) == [("S", (i,)) for i in range(10)]


def test_split_with_shifted_domain_uses_max_and_min() -> None:
    kernel = scale(15, lo=3)
    schedule = _nest(kernel, "S", ["floor(i/4)", "i - 4*floor(i/4)"])
    assert {"min", "max"} <= _ops(build_ast(schedule))

    def want(x: dict) -> np.ndarray:
        b = 2 * x["A"]
        b[:3] = 0
        return b

    _check(schedule, {"B": want})


def test_interchanged_split_uses_division_and_strides() -> None:
    """(i mod 4, floor(i/4)) and (i mod 4, i): pdiv_q / pdiv_r in bounds, stride 4."""
    kernel = scale(15, lo=3)

    def want(x: dict) -> np.ndarray:
        b = 2 * x["A"]
        b[:3] = 0
        return b

    by_block = _nest(kernel, "S", ["i - 4*floor(i/4)", "floor(i/4)"])
    assert "pdiv_q" in _ops(build_ast(by_block))
    _check(by_block, {"B": want})
    strided = _nest(kernel, "S", ["i - 4*floor(i/4)", "i"])
    ast = build_ast(strided)
    assert "pdiv_r" in _ops(ast)
    assert any(isinstance(n, For) and n.inc == Int(4) for n in _walk(ast))
    _check(strided, {"B": want})
    order = [p[0] for _, p in execution_order(strided)]
    assert order == sorted(range(3, 15), key=lambda i: (i % 4, i))


def _walk(node: object) -> list[object]:
    out = [node]
    if isinstance(node, For | Mark):
        out += _walk(node.body)
    elif isinstance(node, If):
        out += _walk(node.then) + (_walk(node.orelse) if node.orelse else [])
    elif isinstance(node, Block):
        for item in node.items:
            out += _walk(item)
    return out


def test_skewed_triangle_uses_floord_and_a_mark() -> None:
    """A skewed tiling of a triangle: isl emits floord (fdiv_q) for a possibly negative
    dividend, and a loop that runs once stays as a Mark node."""
    kernel = triangle(7)
    schedule = _nest(kernel, "L", ["i", "floor((i + j - 4)/3)", "i", "j"])
    schedule = Schedule(kernel, (*schedule.body, *initial_schedule(kernel).body[1:]))
    ast = build_ast(schedule)
    assert {"fdiv_q", "min", "max"} <= _ops(ast)
    assert "floord(" in explain(schedule)
    assert any(isinstance(n, Mark) for n in _walk(ast))
    _check(schedule, {"L": lambda x: np.tril(2 * x["A"])})


def test_guards_with_remainders() -> None:
    """Two statements with different strides under one loop: isl guards each with a
    remainder test."""
    n = 12
    stmts = tuple(
        Statement(
            name,
            ("i",),
            f"{{ {name}[i] : 0 <= i < {n} and i mod {k} = 0 }}",
            out,
            ("i",),
            Load("A", ("i",), F32),
        )
        for name, out, k in (("S1", "B", 2), ("S2", "C", 3))
    )
    tensors = _tensors(A=((n,), Role.INPUT), B=((n,), Role.OUTPUT), C=((n,), Role.OUTPUT))
    kernel = Kernel("strided", tensors, stmts)
    fused = Loop(
        "a", {"S1": "{ S1[i] -> [(i)] }", "S2": "{ S2[i] -> [(i)] }"}, (Leaf("S1"), Leaf("S2"))
    )
    schedule = Schedule(kernel, (fused,))
    ast = build_ast(schedule)
    assert any(isinstance(node, If) for node in _walk(ast))
    assert {"zdiv_r", "pdiv_r"} & _ops(ast)

    def every(k: int):  # noqa: ANN202
        return lambda x: np.where(np.arange(n) % k == 0, x["A"], 0).astype(F32)

    _check(schedule, {"B": every(2), "C": every(3)})
    assert execution_order(schedule)[:4] == [("S1", (0,)), ("S2", (0,)), ("S1", (2,)), ("S2", (3,))]


def test_transformed_mm_relu_through_the_transformations() -> None:
    kernel = mm_relu(6, 8, 4)
    inputs = random_inputs(kernel)
    schedule = initial_schedule(kernel)
    schedule, (j0, j1) = T.split_named(schedule, "j", [None, 3])  # 8 = 3·3 - 1: partial tile
    schedule = T.reorder(schedule, j0, "k", j1)
    schedule = T.parallel(schedule, "i")
    got = run_schedule(schedule, inputs)["C"]
    _assert_same(got, run_program_order(kernel, inputs)["C"])
    _assert_same(got, np.maximum(inputs["A"] @ inputs["B"], 0))


# --- out-of-order parallel loops and instance checks ------------------------------------------


def _force_annotation(schedule: Schedule, loop: str, annotation: str) -> Schedule:
    """Mark a loop without the legality check (what a buggy transformation might do)."""

    def rebuild(node: object) -> object:
        if isinstance(node, Loop):
            body = tuple(rebuild(c) for c in node.body)
            return replace(
                node, body=body, annotation=annotation if node.name == loop else node.annotation
            )
        return node

    return replace(schedule, body=tuple(rebuild(n) for n in schedule.body))


def test_a_parallel_mark_on_a_carried_loop_gives_a_wrong_result() -> None:
    kernel = prefix_sum(8)
    inputs = random_inputs(kernel)
    want = np.cumsum(inputs["A"])
    bad = _force_annotation(initial_schedule(kernel), "i_1", "parallel")
    assert "parallel" in explain(bad)
    forward = run_schedule(bad, inputs, order="forward")["P"]
    np.testing.assert_allclose(forward, want, rtol=1e-5)
    for order in ("reverse", "shuffle"):
        got = run_schedule(bad, inputs, order=order, seed=3)["P"]
        assert not np.allclose(got, want), order


def test_a_legal_parallel_mark_is_order_independent() -> None:
    kernel = mm_relu(5, 6, 3)
    inputs = random_inputs(kernel)
    schedule = T.vectorize(T.parallel(initial_schedule(kernel), "i"), "j_1")
    want = run_program_order(kernel, inputs)["C"]
    for order in ("forward", "reverse", "shuffle"):
        np.testing.assert_array_equal(run_schedule(schedule, inputs, order=order)["C"], want)
    reverse = execution_order(schedule, order="reverse")
    rows = [p[0] for s, p in reverse if s == "Y"]
    assert rows[0] == 4 and rows[-1] == 0
    with pytest.raises(ValueError, match="order"):
        run_schedule(schedule, inputs, order="sideways")


def test_every_instance_runs_exactly_once() -> None:
    kernel = scale(3)
    inputs = random_inputs(kernel)
    twice = Block(
        (Call("S", (Int(0),)), Call("S", (Int(1),)), Call("S", (Int(2),)), Call("S", (Int(1),)))
    )
    with pytest.raises(InterpretError, match=r"S\[1\] executed twice"):
        interpret(twice, kernel, inputs)
    missing = Block((Call("S", (Int(0),)), Call("S", (Int(2),))))
    with pytest.raises(InterpretError, match="misses 1"):
        interpret(missing, kernel, inputs)
    outside = Block(tuple(Call("S", (Int(i),)) for i in range(4)))
    with pytest.raises(InterpretError, match="outside its domain"):
        interpret(outside, kernel, inputs)
    got = interpret(missing, kernel, inputs, check=False)["B"]
    np.testing.assert_array_equal(got, [2 * inputs["A"][0], 0, 2 * inputs["A"][2]])
    with pytest.raises(InterpretError, match="passes 2 values"):
        interpret(Call("S", (Int(0), Int(1))), kernel, inputs)
    with pytest.raises(InterpretError, match="no statement 'Q'"):
        interpret(Call("Q", ()), kernel, inputs)


def test_for_loops_follow_init_cond_inc() -> None:
    """A hand-written AST: for (c = 1; c <= 9 && c < 12; c += 4) → 1, 5, 9; the iterator
    is restored after the loop."""
    kernel = scale(10, lo=1)
    loop = For(
        "c",
        Int(1),
        _op("and", _op("le", Var("c"), 9), _op("lt", Var("c"), 12)),
        Int(4),
        Call("S", (Var("c"),)),
    )
    with pytest.raises(InterpretError, match="misses"):
        interpret(loop, kernel, random_inputs(kernel))
    got = interpret(loop, kernel, random_inputs(kernel), check=False)["B"]
    assert [i for i in range(10) if got[i] != 0] == [1, 5, 9]
