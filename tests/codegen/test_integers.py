"""Index arithmetic (`codegen.integers`): random isl AST expressions, emitted by sharing
affine forms within a block, compute what Python computes; the forms fold what they
should."""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir

from polytile.codegen.integers import Integers
from polytile.codegen.jit import _init_llvm
from polytile.poly.ast.build import AstExpr, Int, Op, Var

I64 = ir.IntType(64)
NAMES = ("x", "y", "z")


def _evaluate(e: AstExpr, env: dict[str, int]) -> int:
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    a = [_evaluate(x, env) for x in e.args]
    ops = {
        "add": lambda: a[0] + a[1],
        "sub": lambda: a[0] - a[1],
        "mul": lambda: a[0] * a[1],
        "minus": lambda: -a[0],
        "min": lambda: min(a),
        "max": lambda: max(a),
        "fdiv_q": lambda: a[0] // a[1],
        "select": lambda: a[1] if a[0] else a[2],
        "lt": lambda: int(a[0] < a[1]),
        "ge": lambda: int(a[0] >= a[1]),
        "eq": lambda: int(a[0] == a[1]),
    }
    return ops[e.op]()


def _expressions() -> st.SearchStrategy[AstExpr]:
    leaves = st.one_of(st.integers(-40, 40).map(Int), st.sampled_from(NAMES).map(Var))

    def extend(inner: st.SearchStrategy[AstExpr]) -> st.SearchStrategy[AstExpr]:
        constant = st.integers(-9, 9).map(Int)
        divisor = st.integers(1, 64).map(Int)
        return st.one_of(
            st.tuples(st.sampled_from(["add", "sub", "min", "max"]), inner, inner).map(
                lambda t: Op(t[0], (t[1], t[2]))
            ),
            st.tuples(inner, constant).map(lambda t: Op("mul", t)),
            st.tuples(constant, inner).map(lambda t: Op("mul", t)),
            st.tuples(inner, inner).map(lambda t: Op("mul", t)),
            inner.map(lambda x: Op("minus", (x,))),
            st.tuples(inner, divisor).map(lambda t: Op("fdiv_q", t)),
            st.tuples(st.sampled_from(["lt", "ge", "eq"]), inner, inner, inner, inner).map(
                lambda t: Op("select", (Op(t[0], (t[1], t[2])), t[3], t[4]))
            ),
        )

    return st.recursive(leaves, extend, max_leaves=12)


def _run(exprs: list[AstExpr], env: dict[str, int]) -> list[int]:
    """The expressions emitted in one block, then again in a second block (a value of
    the first must not be taken for one of the second), stored to an array."""
    module = ir.Module("ints")
    fn_type = ir.FunctionType(ir.VoidType(), [ir.PointerType(), *[I64] * len(NAMES)])
    fn = ir.Function(module, fn_type, "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ints = Integers(b, "test")
    values = dict(zip(NAMES, fn.args[1:], strict=True))
    out = fn.args[0]
    slot = 0
    for block in range(2):
        if block:
            after = fn.append_basic_block("again")
            b.branch(after)
            b.position_at_end(after)
        for e in exprs:
            b.store(ints.expr(e, values), b.gep(out, [ir.Constant(I64, slot)], source_etype=I64))
            slot += 1
    b.ret_void()
    _init_llvm()
    compiled = llvm.parse_assembly(str(module))
    compiled.verify()
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(compiled, machine)
    engine.finalize_object()
    cfunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, *[ctypes.c_int64] * len(NAMES))(
        engine.get_function_address("f")
    )
    result = (ctypes.c_int64 * slot)()
    cfunc(ctypes.addressof(result), *[env[n] for n in NAMES])
    return list(result)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(_expressions(), min_size=1, max_size=6),
    st.fixed_dictionaries({n: st.integers(-100, 100) for n in NAMES}),
)
def test_random_expressions_compute_what_python_computes(
    exprs: list[AstExpr], env: dict[str, int]
) -> None:
    expected = [_evaluate(e, env) for e in exprs]
    assert _run(exprs, env) == expected * 2


def test_packed_layout_divisions_fold_away() -> None:
    """(32*t + 16) // 32 is t and (32*t + 16) mod 32 is 16: no division is emitted, and
    an unrolled copy at +1 costs one add."""
    t = Var("x")
    tile = Op("add", (Op("mul", (Int(32), t)), Int(16)))
    exprs = [
        Op("fdiv_q", (tile, Int(32))),
        Op("pdiv_r", (tile, Int(32))),
        Op("add", (Op("mul", (Int(7), Var("y"))), Int(5))),
        Op("add", (Op("mul", (Var("y"), Int(7))), Int(6))),
    ]
    module = ir.Module("fold")
    fn = ir.Function(module, ir.FunctionType(I64, [I64, I64]), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ints = Integers(b, "test")
    env = {"x": fn.args[0], "y": fn.args[1]}
    values = [ints.expr(e, env) for e in exprs]
    assert values[0] is fn.args[0]
    assert isinstance(values[1], ir.Constant) and values[1].constant == 16
    opcodes = [i.opname for i in b.block.instructions]
    assert "sdiv" not in opcodes and "srem" not in opcodes
    # 7*y once, then +5 and +6 on it
    assert opcodes.count("mul") == 1 and opcodes.count("add") == 2
    assert _run([exprs[0]], {"x": -3, "y": 0, "z": 0}) == [-3, -3]
