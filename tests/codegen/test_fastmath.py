"""float32 exp, erf and tanh as inline arithmetic (`codegen.fastmath`): exp within 4 ulp
of numpy's float64 exp over its whole finite range (results below 2^-125.5 flush to 0),
erf and tanh within 4.5 (the bound libmvec is held to), special values alike, scalar
code bit for bit equal to vector code, and kernels using them (Exp, Sigmoid, Softmax,
Erf, Tanh) call no library function for them."""

from __future__ import annotations

import ctypes
import dataclasses
import re

import numpy as np
import pytest
from llvmlite import ir
from onnx import helper
from test_vecmath import NUMPY, within_ulps

from polytile.codegen import fastmath
from polytile.codegen.jit import JitModule, compile_part, finalize
from polytile.codegen.native import NativeKernel
from polytile.codegen.target import host
from polytile.poly.default.schedule import DefaultConfig, default_schedule
from polytile.poly.dsl import kernel_from_node

#: any call of a function (libm, libmvec) in LLVM IR, intrinsics aside
CALLED = re.compile(r'call [^@]*@"?((?!llvm\.)[\w.]+)')
#: exp below 2^-125.5 (near FLT_MIN) is flushed to 0
FLUSHED = -125.5 * float(np.log(2.0))


def exp_function(lanes: int, name: str = "exp") -> JitModule:
    """`f(x, out, n)`: out = name(x) for 64 values, `lanes` at a time (lanes 1: all
    scalar)."""
    module = ir.Module(name="fm")
    f32 = ir.FloatType()
    ptr, i64 = ir.PointerType(), ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), "f")
    x, out, _count = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    for i in range(0, 64, lanes):
        ty = ir.VectorType(f32, lanes) if lanes > 1 else f32
        at = [ir.Constant(i64, i)]
        value = b.load(b.gep(x, at, source_etype=f32), typ=ty, align=4)
        b.store(fastmath.call(b, name, value), b.gep(out, at, source_etype=f32), align=4)
    b.ret_void()
    return JitModule([compile_part(finalize(module, host()), host())], host())


def run(jit: JitModule, x: np.ndarray) -> np.ndarray:
    out = np.zeros(64, np.float32)
    kind = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    kind(jit.address("f"))(x.ctypes.data, out.ctypes.data, 64)
    return out


def reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    return np.where(x < FLUSHED, 0.0, want)


@pytest.mark.parametrize("scale", [1.0, 8.0, 40.0])
def test_exp_within_4_ulp_of_numpy(scale: float) -> None:
    jit = exp_function(16)
    rng = np.random.default_rng(int(scale))
    for _ in range(20):
        x = np.clip(rng.standard_normal(64) * scale, FLUSHED + 1e-3, 88.7).astype(np.float32)
        within_ulps(run(jit, x), reference(x), "float32", 4)


SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 88.8, 89.0]
SPECIAL += [88.72, 88.5, -86.9, -87.5, -104.0, 1e30, -1e30, 0.5, 20.0, -20.0, 3e-8]


def test_special_values() -> None:
    x = np.resize(np.array(SPECIAL, np.float32), 64)
    got = run(exp_function(16), x)
    want = reference(x)
    within_ulps(got, want, "float32", 4)
    assert np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize("name", ["exp", "erf", "tanh"])
@pytest.mark.parametrize("lanes", [1, 4, 8])
def test_scalar_and_narrow_vectors_give_the_wide_vectors_bits(lanes: int, name: str) -> None:
    x = (np.random.default_rng(3).standard_normal(64) * 30).astype(np.float32)
    wide = run(exp_function(16, name), x)
    np.testing.assert_array_equal(run(exp_function(lanes, name), x), wide)


@pytest.mark.parametrize("name", ["erf", "tanh"])
@pytest.mark.parametrize("scale", [1e-5, 1e-3, 0.3, 1.0, 3.0, 10.0])
def test_erf_and_tanh_within_4_and_a_half_ulp_of_numpy(scale: float, name: str) -> None:
    jit = exp_function(16, name)
    rng = np.random.default_rng(int(scale * 10))
    for _ in range(20):
        x = (rng.standard_normal(64) * scale).astype(np.float32)
        within_ulps(run(jit, x), NUMPY[name](x.astype(np.float64)), "float32", 4.5)
    # (a subnormal x keeps few bits through x P(x^2): left out)
    normal = [v for v in SPECIAL if not 0 < abs(v) < np.finfo(np.float32).tiny]
    x = np.resize(np.array(normal, np.float32), 64)
    got = run(jit, x)
    with np.errstate(all="ignore"):
        within_ulps(got, NUMPY[name](x.astype(np.float64)), "float32", 4.5)
    assert np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize(
    ("op", "attrs", "numpy"),
    [
        ("Exp", {}, np.exp),
        ("Sigmoid", {}, lambda x: 1.0 / (1.0 + np.exp(-x))),
        ("Erf", {}, NUMPY["erf"]),
        ("Tanh", {}, np.tanh),
        (
            "Softmax",
            {"axis": -1},
            lambda x: np.exp(x - x.max(-1, keepdims=True))
            / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
        ),
    ],
)
@pytest.mark.parametrize("vector_math", [True, False])
def test_kernels_compute_exp_inline(op: str, attrs: dict, numpy, vector_math: bool) -> None:
    k = kernel_from_node(helper.make_node(op, ["x"], ["y"], **attrs), {"x": (3, 37)})
    schedule = default_schedule(k, DefaultConfig(vector_width=16))
    target = dataclasses.replace(host(), vector_math=vector_math)
    native = NativeKernel(schedule, target)
    called = [c for c in CALLED.findall(native.ir) if any(f in c for f in fastmath.FUNCTIONS)]
    assert not called
    x = (np.random.default_rng(1).standard_normal((3, 37)) * 4).astype(np.float32)
    (got,) = native.outputs({"x": x}).values()
    want = numpy(x.astype(np.float64))
    if op == "Softmax":  # the sum's rounding moves each result by a relative error
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-8)
    else:
        within_ulps(got, want, "float32", 4.5)
