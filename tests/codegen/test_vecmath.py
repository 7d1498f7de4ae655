"""exp, log, pow, tanh and erf of vectors through libmvec (`codegen.vecmath`): the calls
are emitted where the target has them, never where it does not, and their results match
numpy's (in float64) within 4 ulp, special values included, for every lane count a
kernel's vectors may have. Constant powers of square roots skip pow altogether."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re

import numpy as np
import pytest
from llvmlite import ir
from onnx import helper

from polytile.codegen import vecmath
from polytile.codegen.jit import JitModule, compile_part, finalize
from polytile.codegen.llvm_types import ModuleContext
from polytile.codegen.native import NativeKernel
from polytile.codegen.target import Target, host
from polytile.codegen.values import ROOT_POWERS
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel, kernel_from_node
from polytile.poly.oracle.reference import BINARY, UNARY

pytestmark = pytest.mark.skipif(
    not host().vector_math, reason="this machine's C library has no libmvec"
)

#: a libmvec function called in LLVM IR
CALLED = re.compile(r'call [^@]*@"?(_ZGV\w+)')
#: the oracle's float64 functions (poly/reference.py) for each libmvec function
NUMPY = {name: UNARY.get(name) or BINARY[name] for name in vecmath.FUNCTIONS}
#: numpy's (float64) results against float32 results: libmvec's 4 ulp and the rounding
ULPS = 4.5


def within_ulps(got: np.ndarray, want: np.ndarray, dtype: str, ulps: float = ULPS) -> None:
    """Equal where either is not finite (NaN positions included), else within `ulps` of
    the float64 reference, in units of the result dtype's last place."""
    assert got.dtype == np.dtype(dtype)
    with np.errstate(over="ignore"):
        exact = want.astype(dtype)
    special = ~np.isfinite(exact) | ~np.isfinite(got)
    np.testing.assert_array_equal(got[special], exact[special])
    spacing = np.spacing(np.abs(exact[~special]).astype(dtype)).astype(np.float64)
    error = np.abs(got[~special].astype(np.float64) - want[~special])
    assert np.all(error <= ulps * np.maximum(spacing, np.finfo(dtype).smallest_subnormal))


def direct(name: str, lanes: int, dtype: str, target: Target) -> tuple[JitModule, str]:
    """A function `f(in..., out)` applying `vector_call` to one vector of `lanes`."""
    element = ir.FloatType() if dtype == "float32" else ir.DoubleType()
    vty = ir.VectorType(element, lanes)
    module = ir.Module(name="vm")
    mc = ModuleContext(module, target, threading=False)
    arity = vecmath.FUNCTIONS[name]
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * (arity + 1)), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args = [b.load(p, typ=vty, align=1) for p in fn.args[:arity]]
    out = vecmath.vector_call(b, mc, name, args)
    assert out is not None and out.type == vty
    b.store(out, fn.args[arity], align=1)
    b.ret_void()
    text = finalize(module, target)
    return JitModule([compile_part(text, target)], target), text


def inputs(name: str, n: int, dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "log":
        return [np.abs(rng.standard_normal(n) * 50).astype(dtype) + np.finfo(dtype).tiny]
    if name in ("asin", "acos", "atanh"):  # their domain: [-1, 1]
        return [rng.uniform(-1, 1, n).astype(dtype)]
    if name == "acosh":
        return [(1 + np.abs(rng.standard_normal(n) * 20)).astype(dtype)]
    if name == "pow":
        base = np.abs(rng.standard_normal(n) * 3).astype(dtype)
        return [base, rng.uniform(-3, 3, n).astype(dtype)]
    return [(rng.standard_normal(n) * 4).astype(dtype)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(vecmath.FUNCTIONS))
@pytest.mark.parametrize("lanes", [2, 3, 4, 5, 8, 16, 20, 32, 48])
def test_every_lane_count_matches_numpy(name: str, lanes: int, dtype: str) -> None:
    jit, text = direct(name, lanes, dtype, host())
    assert CALLED.search(text)
    args = inputs(name, lanes, dtype)
    out = np.zeros(lanes, dtype)
    kind = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (len(args) + 1))
    kind(jit.address("f"))(*[a.ctypes.data for a in args], out.ctypes.data)
    within_ulps(out, NUMPY[name](*[a.astype(np.float64) for a in args]), dtype)


#: zeros, infinities, NaN, subnormals, the edges of exp's range in float and double
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40]
SPECIAL += [88.8, 89.0, -104.0, 710.0, -746.0, 1e30, -1e30, 0.5, 20.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["exp", "log", "tanh", "erf"])
def test_special_values_match_numpy(name: str, dtype: str) -> None:
    x = np.array(SPECIAL * 2, dtype)[:32]
    jit, _ = direct(name, 32, dtype, host())
    out = np.zeros(32, dtype)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(jit.address("f"))(
        x.ctypes.data, out.ctypes.data
    )
    with np.errstate(all="ignore"):
        want = NUMPY[name](x.astype(np.float64))
    within_ulps(out, want, dtype)


def test_pow_special_values_match_numpy() -> None:
    base = [0.0, -0.0, 2.0, -2.0, np.inf, np.nan, 1.0, 1.0, -8.0, 0.0, 1e-3, 10.0]
    exponent = [-1.0, 3.0, np.inf, 0.5, -2.0, 0.0, np.nan, np.inf, 3.0, 0.0, 50.0, 40.0]
    base = np.array([*base, -1.0, 2.0, 3.0, 0.5], np.float32)
    exponent = np.array([*exponent, np.inf, -200.0, 0.75, 0.75], np.float32)
    jit, _ = direct("pow", 16, "float32", host())
    out = np.zeros(16, np.float32)
    kind = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    kind(jit.address("f"))(base.ctypes.data, exponent.ctypes.data, out.ctypes.data)
    with np.errstate(all="ignore"):
        want = np.power(base.astype(np.float64), exponent.astype(np.float64))
    within_ulps(out, want, "float32")


#: kernels whose function goes through libmvec (float32 exp, sigmoid through it, erf
#: and tanh are inline arithmetic: `tests/codegen/test_fastmath.py`)
OPS = {
    "Log": ("log", np.log),
    "Sin": ("sin", np.sin),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_kernels_call_libmvec_where_the_target_has_it_and_libm_elsewhere(op: str) -> None:
    """The same kernel with and without `vector_math`: libmvec's calls only in the first,
    both within 4 ulp of numpy."""
    k = kernel_from_node(helper.make_node(op, ["x"], ["y"]), {"x": (3, 37)})
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 37)) * 4).astype(np.float32)
    if op == "Log":
        x = np.abs(x) + 1e-3
    name, reference = OPS[op]
    with np.errstate(all="ignore"):
        want = reference(x.astype(np.float64))
    for vector_math in (True, False):
        target = dataclasses.replace(host(), vector_math=vector_math)
        native = NativeKernel(schedule, target)
        called = CALLED.findall(native.ir)
        assert bool(called) == vector_math
        assert all(s.endswith(f"_{name}f") for s in called)
        (got,) = native.outputs({"x": x}).values()
        assert got.shape == (3, 37)
        within_ulps(got, want, "float32")


@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_raises_to_its_power_without_pow_or_once_a_vector(beta: float) -> None:
    """LRN (AlexNet, ZFNet, Inception v1) raises its window sums to the power beta: their
    0.75 from square roots, any other through libmvec's `powf`, one call a vector; both
    as ONNX defines LRN, computed in float64 by numpy (this onnx's reference evaluator
    loops over the batch axis where it means the channels)."""
    node = helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=beta, bias=2.0)
    k = kernel_from_node(node, {"x": (1, 16, 8, 32)})
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    x = (np.random.default_rng(2).standard_normal((1, 16, 8, 32)) * 30).astype(np.float32)
    native = NativeKernel(schedule, host())
    assert [s.endswith("_powf") for s in CALLED.findall(native.ir)] == (
        [] if beta == 0.75 else [True]
    )
    assert "llvm.pow" not in native.ir
    (got,) = native.outputs({"x": x}).values()
    wide = x.astype(np.float64)
    sums = np.stack([(wide[:, max(0, c - 2) : c + 3] ** 2).sum(1) for c in range(16)], 1)
    want = (wide / (2.0 + 1e-4 / 5 * sums) ** beta).astype(np.float32)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_no_variant_without_the_cpu_feature() -> None:
    """A target whose features name no vector ISA gets no libmvec call (the lanes go
    to libm one by one)."""
    target = Target("generic", "", host().triple, 128, vector_math=True)
    module = ir.Module(name="none")
    mc = ModuleContext(module, target, threading=False)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x = ir.Constant(ir.VectorType(ir.FloatType(), 4), None)
    assert vecmath.vector_call(b, mc, "exp", [x]) is None


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("exponent", [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, -0.5, -1.0, 1.3])
def test_constant_powers_skip_pow_and_match_numpy(exponent: float, dtype: str) -> None:
    """x to a constant power of `ROOT_POWERS` is computed from square roots and
    products (no pow call) within 2 ulp, special values as pow gives them; any other
    power still calls pow."""
    k = kernel(f"Y[i] = pow(A[i], {exponent})", A=(40,), dtype=dtype)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -2.0, 1e-40, 1.0]
    x = np.abs(np.random.default_rng(3).standard_normal(40) * 5).astype(dtype)
    x[: len(specials)] = specials
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=16)))
    calls_pow = bool(CALLED.findall(native.ir)) or "llvm.pow" in native.ir
    assert calls_pow == (exponent not in ROOT_POWERS)
    (got,) = native.outputs({"A": x}).values()
    assert got.shape == (40,)
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), exponent)
    # C's pow (numpy's for any exponent but 0.5): (-inf)^y is +inf for y > 0, +0 below
    want[x == -np.inf] = math.pow(-math.inf, exponent)
    within_ulps(got, want, dtype, 2.0 if exponent in ROOT_POWERS else ULPS)


@pytest.mark.parametrize("exponent", [2.0, 0.5, 3.0, 2.5])
def test_a_constant_exponent_input_becomes_part_of_the_expression(exponent: float) -> None:
    """Pow whose exponent is an initializer (a decomposed LayerNorm's x^2) raises to it
    as to a constant: 2, 0.5 and 3 without pow, 2.5 through pow; values as numpy's."""
    node = helper.make_node("Pow", ["x", "e"], ["y"])
    k = kernel_from_node(node, {"x": (2, 40)}, initializers={"e": np.array(exponent, np.float32)})
    native = NativeKernel(default_schedule(k, DefaultConfig(vector_width=16)))
    calls_pow = bool(CALLED.findall(native.ir)) or "llvm.pow" in native.ir
    assert calls_pow == (exponent not in ROOT_POWERS)
    x = np.abs(np.random.default_rng(4).standard_normal((2, 40))).astype(np.float32)
    (got,) = native.outputs({"x": x}).values()
    assert got.shape == (2, 40)
    within_ulps(got, np.power(x.astype(np.float64), exponent), "float32")
