"""The nn lowerings (conv, conv-transpose, matmul, gemm, einsum, pooling, softmax,
normalizations, LRN) on small crafted models: import → optimize → partition → lower →
program-order execution, compared with onnxruntime (or onnx's reference evaluator) on the
original model. Every kernel is also checked to load and store only inside its tensors
(padding lives in the domains)."""

from __future__ import annotations

from functools import partial

import islpy as isl
import numpy as np
import onnx
import pytest
from onnx import helper

from polytile.frontend import import_model, optimize
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import loads
from polytile.poly.ir.kernel import Kernel
from polytile.poly.lower import LOWERINGS

from lowered import Shape, check_lowered, feeds_for, reference, run_lowered
from lowered import make as _make


def make(*args: object, **kwargs: object) -> onnx.ModelProto:
    """Models with symbolic output sizes (see lowered.make)."""
    return _make(*args, symbolic_outputs=True, **kwargs)  # type: ignore[arg-type]


def assert_in_bounds(kernel: Kernel) -> None:
    """Every access of every statement instance stays inside its tensor."""
    for s in kernel.statements:
        for access in [s.write_map(), *s.read_maps()]:
            name = access.get_tuple_name(isl.dim_type.out)
            t = kernel.tensors[name]
            box = ih.parse_set(ih.box(name, [f"a{i}" for i in range(len(t.shape))], t.shape))
            assert access.range().is_subset(box), f"{s.name} accesses {name} out of bounds"


#: the lowered kernels, every access in bounds, reproduce the oracle
check = partial(check_lowered, atol=1e-5, inspect=assert_in_bounds)


F32 = "float32"

# --- Conv -------------------------------------------------------------------------------------


def conv_model(
    op: str, case: dict, bias: bool
) -> tuple[onnx.ModelProto, dict[str, tuple[Shape, str]]]:
    """A model of one Conv or ConvTranspose node: input and weight shapes `x` and `w` and
    the attributes from `case`, with a bias (one value per output channel) when `bias`."""
    attrs = dict(case)
    x, w = attrs.pop("x"), attrs.pop("w")
    inputs = {"x": (x, F32), "w": (w, F32)}
    if bias:
        channels = w[0] if op == "Conv" else w[1] * attrs.get("group", 1)
        inputs["b"] = ((channels,), F32)
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    return make([node], inputs, ["y"]), inputs


CONV_CASES = {
    "plain": dict(x=(2, 3, 5, 5), w=(4, 3, 3, 3)),
    "pads": dict(x=(2, 3, 5, 5), w=(4, 3, 3, 3), pads=[1, 1, 1, 1]),
    "asymmetric_pads_strides": dict(
        x=(1, 3, 6, 5), w=(2, 3, 3, 2), pads=[1, 0, 2, 1], strides=[2, 3]
    ),
    "dilations_pads": dict(x=(1, 2, 6, 6), w=(3, 2, 3, 3), pads=[2, 1, 2, 1], dilations=[2, 1]),
    "all": dict(
        x=(1, 2, 7, 6), w=(2, 2, 3, 2), pads=[1, 2, 0, 1], strides=[2, 2], dilations=[2, 3]
    ),
    "big_pads": dict(x=(1, 1, 3, 3), w=(2, 1, 2, 2), pads=[3, 3, 3, 3], strides=[2, 2]),
    "groups": dict(x=(1, 4, 5, 5), w=(6, 2, 3, 3), group=2, pads=[1, 1, 1, 1]),
    "depthwise": dict(x=(2, 4, 5, 5), w=(4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], strides=[2, 2]),
    "depthwise_multiplier": dict(x=(1, 2, 4, 4), w=(6, 1, 3, 3), group=2, pads=[0, 1, 0, 1]),
    "same_upper": dict(x=(1, 2, 5, 4), w=(3, 2, 3, 2), auto_pad="SAME_UPPER", strides=[2, 1]),
    "same_lower": dict(x=(1, 2, 5, 4), w=(3, 2, 2, 3), auto_pad="SAME_LOWER"),
    "1d": dict(x=(2, 3, 9), w=(4, 3, 3), pads=[2, 1], strides=[2], dilations=[2]),
    "1d_groups": dict(x=(1, 4, 7), w=(4, 2, 2), group=2, pads=[1, 0]),
    "3d": dict(x=(1, 2, 4, 4, 3), w=(3, 2, 2, 3, 2), pads=[1, 0, 1, 0, 1, 0], strides=[2, 1, 1]),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", CONV_CASES, ids=list(CONV_CASES))
def test_conv(case: str, bias: bool) -> None:
    m, inputs = conv_model("Conv", CONV_CASES[case], bias)
    (kernel,) = check(m, inputs, rtol=1e-4)
    reductions = [s for s in kernel.statements if s.reduction]
    assert len(reductions) == 1 and reductions[0].reduction == "sum"
    rank = len(CONV_CASES[case]["x"]) - 2
    # the input channel and the window; a depthwise conv's one channel a group has no loop
    depthwise = CONV_CASES[case]["w"][1] == 1 and CONV_CASES[case].get("group", 1) > 1
    assert len(reductions[0].reduction_dims) == (0 if depthwise else 1) + rank
    init = next(s for s in kernel.statements if s.init_of == reductions[0].name)
    assert init.dims == reductions[0].dims[: 2 + rank]


def test_conv_with_constant_weights_and_relu_epilogue() -> None:
    rng = np.random.default_rng(1)
    weights = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(F32),
        "b": rng.standard_normal(4).astype(F32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    inputs = {"x": ((2, 3, 5, 5), F32)}
    (kernel,) = check(make(nodes, inputs, ["y"], weights), inputs, rtol=1e-4)
    assert any(t.role.value == "constant" for t in kernel.tensors.values())


def test_conv_padding_lives_in_the_domain() -> None:
    """A padded conv has no padded copy: its reduction domain excludes the padding taps."""
    inputs = {"x": ((1, 1, 3, 3), F32), "w": ((1, 1, 3, 3), F32)}
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    (kernel,) = check(make([node], inputs, ["y"]), inputs)
    (red,) = [s for s in kernel.statements if s.reduction]
    assert set(kernel.tensors) == {"x", "w", "y"}
    # 9 outputs × 9 taps, minus the taps in the padding: 3×3 corners use 4, edges 6, centre 9
    assert ih.card(red.domain_set()) == 4 * 4 + 4 * 6 + 9


PADDED_DEPTHWISE = {
    "3x3": dict(x=(1, 4, 9, 10), w=(4, 1, 3, 3), group=4, pads=[1, 1, 1, 1]),
    "5x5_stride_2": dict(
        x=(1, 3, 19, 20), w=(3, 1, 5, 5), group=3, pads=[2, 2, 2, 2], strides=[2, 2]
    ),
    "dilated_asymmetric": dict(
        x=(2, 2, 12, 11), w=(2, 1, 3, 3), group=2, pads=[2, 1, 2, 3], dilations=[2, 2]
    ),
    "1d": dict(x=(1, 3, 12), w=(3, 1, 5), group=3, pads=[2, 1]),
    "3x3_stride_2_short_rows": dict(
        x=(1, 3, 15, 13), w=(3, 1, 3, 3), group=3, pads=[1, 1, 1, 1], strides=[2, 2]
    ),
    "7x7_stride_3_asymmetric": dict(
        x=(1, 2, 17, 16), w=(2, 1, 7, 7), group=2, pads=[3, 2, 1, 3], strides=[1, 3]
    ),
    "1d_stride_2": dict(x=(1, 3, 11), w=(3, 1, 5), group=3, pads=[2, 2], strides=[2]),
    "float16": dict(x=(1, 2, 9, 9), w=(2, 1, 3, 3), group=2, pads=[1, 1, 1, 1]),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", PADDED_DEPTHWISE, ids=list(PADDED_DEPTHWISE))
def test_a_depthwise_conv_reusing_its_input_reads_a_padded_copy(case: str, bias: bool) -> None:
    """Long rows and a window reading each input element at least PAD_MIN_REUSE times:
    the reduction reads a zero-padded copy of X over a box domain (every tap is a point).
    Same results as onnxruntime (float16: onnx's reference)."""
    spec = dict(PADDED_DEPTHWISE[case])
    dtype = "float16" if case == "float16" else F32
    x, w = spec.pop("x"), spec.pop("w")
    inputs = {"x": (x, dtype), "w": (w, dtype)}
    if bias:
        inputs["b"] = ((w[0],), dtype)
    node = helper.make_node("Conv", list(inputs), ["y"], **spec)
    tolerance = dict(oracle="reference", rtol=2e-3, atol=2e-3) if dtype != F32 else dict(rtol=1e-4)
    (kernel,) = check(make([node], inputs, ["y"]), inputs, **tolerance)
    (padded,) = [
        t for t in kernel.tensors.values() if t.role.value == "temporary" and "pad" in t.name
    ]
    (red,) = [s for s in kernel.statements if s.reduction]
    assert padded.name in {ld.tensor for ld in loads(red.expr)}
    # a window sliding by s > 1 along a row reads a copy whose rows are split into s
    # phases (`window.phases`): one more axis, of extent s, before the row
    stride = spec.get("strides", [1])[-1]
    assert len(padded.shape) == len(x) + (stride > 1)
    if stride > 1:
        assert padded.shape[-2] == stride
    box = ih.parse_set(ih.box(red.name, red.dims, ih.box_extents(red.domain_set())))
    assert red.domain_set().is_equal(box)


def test_a_depthwise_conv_with_little_reuse_over_long_rows_keeps_padding_in_the_domain() -> None:
    """A 3x3 window at stride 2 reads each input about twice: over rows longer than two
    vectors no padded copy (`PAD_MIN_REUSE`); over short rows (most of a row's vectors
    would be edge pieces), or with more reuse, one."""
    cases = (
        ((1, 4, 80, 80), [2, 2], False),
        ((1, 4, 20, 20), [2, 2], True),
        ((1, 4, 7, 7), [1, 1], True),
    )
    for x, strides, copied in cases:
        inputs = {"x": (x, F32), "w": ((4, 1, 3, 3), F32)}
        node = helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1] * 4, strides=strides)
        (kernel,) = check(make([node], inputs, ["y"]), inputs, rtol=1e-4)
        assert (set(kernel.tensors) != {"x", "w", "y"}) == copied, (x, strides)


def test_conv_float16_accumulates_in_float32() -> None:
    inputs = {"x": ((1, 2, 4, 4), "float16"), "w": ((3, 2, 3, 3), "float16")}
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    (kernel,) = check(make([node], inputs, ["y"]), inputs, oracle="reference", rtol=2e-3, atol=2e-3)
    (red,) = [s for s in kernel.statements if s.reduction]
    assert kernel.tensors[red.tensor].dtype == "float32"


# --- ConvTranspose ------------------------------------------------------------------------------

CONV_TRANSPOSE_CASES = {
    "plain": dict(x=(1, 2, 3, 3), w=(2, 3, 3, 3)),
    "strides": dict(x=(2, 2, 3, 3), w=(2, 2, 3, 3), strides=[2, 2]),
    "strides_pads": dict(x=(1, 2, 3, 4), w=(2, 3, 3, 3), strides=[3, 2], pads=[1, 2, 0, 1]),
    "output_padding": dict(x=(1, 1, 3, 3), w=(1, 2, 3, 3), strides=[2, 2], output_padding=[1, 1]),
    "dilations": dict(x=(1, 2, 3, 3), w=(2, 2, 2, 2), dilations=[2, 2], strides=[2, 1]),
    "groups": dict(x=(1, 4, 3, 3), w=(4, 2, 3, 3), group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
    "depthwise": dict(x=(1, 3, 3, 3), w=(3, 1, 2, 2), group=3, strides=[2, 2]),
    "output_shape": dict(x=(1, 1, 3, 3), w=(1, 2, 3, 3), strides=[3, 2], output_shape=[10, 8]),
    "same_upper": dict(x=(1, 1, 3, 3), w=(1, 2, 3, 3), strides=[2, 2], auto_pad="SAME_UPPER"),
    "1d": dict(x=(1, 2, 4), w=(2, 3, 3), strides=[2], pads=[1, 0], output_padding=[1]),
    "3d": dict(x=(1, 1, 2, 3, 2), w=(1, 2, 2, 2, 3), strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0]),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", CONV_TRANSPOSE_CASES, ids=list(CONV_TRANSPOSE_CASES))
def test_conv_transpose(case: str, bias: bool) -> None:
    m, inputs = conv_model("ConvTranspose", CONV_TRANSPOSE_CASES[case], bias)
    (kernel,) = check(m, inputs, rtol=1e-4)
    assert [s.reduction for s in kernel.statements] == [None, "sum"]


# --- MatMul, Gemm, Einsum -----------------------------------------------------------------

MATMUL_CASES = {
    "2d": ((3, 4), (4, 5)),
    "batch": ((2, 3, 4), (2, 4, 5)),
    "batch_broadcast": ((2, 1, 3, 4), (5, 4, 2)),
    "batch_broadcast_left": ((1, 3, 4), (3, 2, 4, 2)),
    "1d_3d": ((4,), (2, 4, 3)),
    "3d_1d": ((2, 3, 4), (4,)),
    "1d_1d": ((4,), (4,)),
    "2d_1d": ((3, 4), (4,)),
}


@pytest.mark.parametrize("case", MATMUL_CASES, ids=list(MATMUL_CASES))
def test_matmul(case: str) -> None:
    a, b = MATMUL_CASES[case]
    inputs = {"a": (a, F32), "b": (b, F32)}
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    (kernel,) = check(make([node], inputs, ["y"]), inputs)
    (red,) = [s for s in kernel.statements if s.reduction]
    assert red.reduction_dims == ("k",)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float64"])
def test_matmul_dtypes(dtype: str) -> None:
    inputs = {"a": ((2, 3, 4), dtype), "b": ((4, 2), dtype)}
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    check(make([node], inputs, ["y"]), inputs)


def test_matmul_float16() -> None:
    inputs = {"a": ((3, 8), "float16"), "b": ((8, 2), "float16")}
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    check(make([node], inputs, ["y"]), inputs, rtol=2e-3, atol=2e-3)


def test_matmul_with_add_epilogue() -> None:
    weights = {"w": np.arange(12, dtype=F32).reshape(4, 3) / 10, "c": np.ones(3, F32)}
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["y"]),
    ]
    inputs = {"a": ((2, 5, 4), F32)}
    check(make(nodes, inputs, ["y"], weights), inputs)


GEMM_CASES = {
    "plain": dict(a=(3, 4), b=(4, 5)),
    "trans_a": dict(a=(4, 3), b=(4, 5), transA=1),
    "trans_b": dict(a=(3, 4), b=(5, 4), transB=1),
    "trans_both": dict(a=(4, 3), b=(5, 4), transA=1, transB=1, alpha=0.5),
    "matrix_c": dict(a=(3, 4), b=(4, 5), c=(3, 5), alpha=2.0, beta=0.25),
    "row_c": dict(a=(3, 4), b=(4, 5), c=(5,), beta=-1.0),
    "column_c": dict(a=(3, 4), b=(4, 5), c=(3, 1)),
    "one_by_n_c": dict(a=(3, 4), b=(4, 5), c=(1, 5), transA=0, alpha=1.5),
    "scalar_c": dict(a=(3, 4), b=(5, 4), c=(), transB=1, beta=3.0),
    "single_c": dict(a=(3, 4), b=(4, 5), c=(1,)),
    "zero_beta": dict(a=(3, 4), b=(4, 5), c=(3, 5), beta=0.0),
}


@pytest.mark.parametrize("case", GEMM_CASES, ids=list(GEMM_CASES))
def test_gemm(case: str) -> None:
    spec = dict(GEMM_CASES[case])
    inputs = {"a": (spec.pop("a"), F32), "b": (spec.pop("b"), F32)}
    if "c" in spec:
        inputs["c"] = (spec.pop("c"), F32)
    node = helper.make_node("Gemm", list(inputs), ["y"], **spec)
    (kernel,) = check(make([node], inputs, ["y"]), inputs)
    init, red = kernel.statements
    assert init.init_of == red.name and red.reduction == "sum"


EINSUM_CASES = {
    "matmul": ("ij,jk->ik", [(3, 4), (4, 2)]),
    "implicit": ("ij,jk", [(3, 4), (4, 2)]),
    "batch_matmul": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    "attention": ("bhid,bhjd->bhij", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    "transpose": ("ij->ji", [(3, 4)]),
    "diagonal": ("ii->i", [(4, 4)]),
    "trace": ("ii", [(4, 4)]),
    "batch_diagonal": ("...ii->...i", [(2, 3, 3)]),
    "inner": ("i,i", [(5,), (5,)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "sum": ("ij->i", [(3, 4)]),
    "total": ("ij->", [(3, 4)]),
    "three": ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    "ellipsis_broadcast": ("...ij,...jk->...ik", [(2, 3, 4), (1, 4, 2)]),
    "label_broadcast": ("ij,ij->ij", [(3, 1), (3, 4)]),
}


@pytest.mark.parametrize("case", EINSUM_CASES, ids=list(EINSUM_CASES))
def test_einsum(case: str) -> None:
    equation, shapes = EINSUM_CASES[case]
    inputs = {f"x{i}": (shape, F32) for i, shape in enumerate(shapes)}
    node = helper.make_node("Einsum", list(inputs), ["y"], equation=equation)
    check(make([node], inputs, ["y"]), inputs, oracle="reference")


def test_einsum_int64() -> None:
    inputs = {"x0": ((2, 3), "int64"), "x1": ((3, 2), "int64")}
    node = helper.make_node("Einsum", ["x0", "x1"], ["y"], equation="ij,jk->ki")
    check(make([node], inputs, ["y"]), inputs, oracle="reference")


# --- pooling --------------------------------------------------------------------------------

POOL_CASES = {
    "plain": dict(x=(2, 2, 5, 5), kernel_shape=[2, 2]),
    "strides": dict(x=(1, 2, 6, 5), kernel_shape=[3, 2], strides=[2, 2]),
    "pads": dict(x=(1, 2, 5, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "asymmetric_pads": dict(x=(1, 1, 5, 6), kernel_shape=[3, 2], pads=[2, 0, 1, 1], strides=[2, 1]),
    "ceil": dict(x=(1, 1, 6, 6), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "ceil_pads": dict(
        x=(1, 1, 5, 6), kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1
    ),
    "dilations": dict(x=(1, 1, 7, 7), kernel_shape=[2, 2], dilations=[2, 3], pads=[1, 1, 1, 1]),
    "dilations_ceil": dict(
        x=(1, 1, 8, 7), kernel_shape=[2, 2], dilations=[2, 2], strides=[2, 3], ceil_mode=1
    ),
    "same_upper": dict(x=(1, 2, 5, 5), kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower": dict(x=(1, 2, 5, 5), kernel_shape=[3, 2], auto_pad="SAME_LOWER"),
    "valid": dict(x=(1, 2, 5, 5), kernel_shape=[2, 2], strides=[2, 2], auto_pad="VALID"),
    "1d": dict(x=(2, 3, 9), kernel_shape=[3], strides=[2], pads=[1, 2]),
    "3d": dict(
        x=(1, 1, 4, 4, 3), kernel_shape=[2, 2, 2], pads=[1, 0, 1, 0, 1, 0], strides=[2, 2, 1]
    ),
}


@pytest.mark.parametrize("case", POOL_CASES, ids=list(POOL_CASES))
def test_max_pool(case: str) -> None:
    spec = dict(POOL_CASES[case])
    inputs = {"x": (spec.pop("x"), F32)}
    node = helper.make_node("MaxPool", ["x"], ["y"], **spec)
    (kernel,) = check(make([node], inputs, ["y"]), inputs)
    init, red = kernel.statements
    assert red.reduction == "max" and init.init_of == red.name


@pytest.mark.parametrize("dtype", ["uint8", "int8", "float64"])
def test_max_pool_dtypes(dtype: str) -> None:
    inputs = {"x": ((1, 2, 4, 4), dtype)}
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    check(make([node], inputs, ["y"]), inputs)


@pytest.mark.parametrize("include", [0, 1], ids=["exclude_pad", "include_pad"])
@pytest.mark.parametrize("case", POOL_CASES, ids=list(POOL_CASES))
def test_average_pool(case: str, include: int) -> None:
    spec = dict(POOL_CASES[case])
    inputs = {"x": (spec.pop("x"), F32)}
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=include, **spec)
    opset = 19 if "dilations" in spec else 18  # AveragePool has dilations from opset 19
    check(make([node], inputs, ["y"], opset=opset), inputs)


def test_average_pool_counts_the_taps_inside() -> None:
    """Without count_include_pad, a border output divides by its in-bounds taps: one small
    count reduction per spatial axis whose count varies, before the sum; with it (and no
    ceil_mode overhang) the divisor is the window size."""
    inputs = {"x": ((1, 1, 3, 4), F32)}
    node = helper.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=[3, 2], pads=[1, 0, 1, 0], strides=[1, 2]
    )
    (kernel,) = check(make([node], inputs, ["y"]), inputs)
    # the oh axis has border effects, the ow axis (no padding) always counts 2 taps
    counts = [s for s in kernel.statements if s.reduction and "taps" in s.tensor]
    assert [s.dims for s in counts] == [("oh", "kh")]
    assert ih.card(counts[0].domain_set()) == 2 + 3 + 2
    assert [s.reduction for s in kernel.statements] == [None, "sum", None, "sum", None]
    node = helper.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1
    )
    (kernel,) = check(make([node], inputs, ["y"]), inputs)
    assert [s.reduction for s in kernel.statements] == [None, "sum", None]


PADDED_POOLS = {
    "square": dict(x=(1, 3, 9, 10), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "asymmetric_dilated": dict(
        x=(1, 2, 10, 12), kernel_shape=[2, 3], dilations=[2, 1], pads=[1, 2, 0, 1]
    ),
    "ceil": dict(x=(1, 2, 9, 11), kernel_shape=[3, 2], pads=[0, 1, 1, 1], ceil_mode=1),
    "1d": dict(x=(2, 3, 12), kernel_shape=[3], pads=[1, 2]),
}


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "AveragePool_include", "MaxPool_int8"])
@pytest.mark.parametrize("case", PADDED_POOLS, ids=list(PADDED_POOLS))
def test_a_stride_one_pool_over_long_rows_reads_a_padded_copy(case: str, op: str) -> None:
    """Its window slides by one and its output rows are at least PAD_MIN_ROW long: the
    input is copied into a temporary padded with the combiner's identity (the lowest
    value, or 0 for a sum) and the window's reduction runs over the whole box, without the
    edge pieces that kept a pool's accumulators in memory. Same results as onnxruntime."""
    spec = dict(PADDED_POOLS[case])
    dtype = "int8" if op.endswith("int8") else F32
    inputs = {"x": (spec.pop("x"), dtype)}
    if op == "AveragePool_include":
        spec["count_include_pad"] = 1
    opset = 19 if "dilations" in spec else 18
    y = helper.make_node(op.split("_")[0], ["x"], ["y"], **spec)
    (kernel,) = check(make([y], inputs, ["y"], opset=opset), inputs)
    (padded,) = [
        t for t in kernel.tensors.values() if t.role.value == "temporary" and "pad" in t.name
    ]
    window = next(s for s in kernel.statements if s.reduction and ("taps" not in s.tensor))
    assert padded.name in {ld.tensor for ld in loads(window.expr)}
    box = ih.parse_set(ih.box(window.name, window.dims, ih.box_extents(window.domain_set())))
    assert window.domain_set().is_equal(box)  # no tap is left out: the padding is data


def test_a_strided_or_short_pool_keeps_its_padding_in_the_domain() -> None:
    """A stride-2 pool reads each input about twice and a 7-wide row runs scalar anyway
    (with the copy, most of Inception v2's such pools lost: `PAD_MIN_ROW`): no padded
    copy for them."""
    for spec in (
        dict(x=(1, 2, 20, 20), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        dict(x=(1, 2, 7, 7), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ):
        inputs = {"x": (spec.pop("x"), F32)}
        y = helper.make_node("MaxPool", ["x"], ["y"], **spec)
        (kernel,) = check(make([y], inputs, ["y"]), inputs)
        assert set(kernel.tensors) == {"x", "y"}


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 6), (1, 2, 2, 3, 2)])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op: str, shape: Shape) -> None:
    inputs = {"x": (shape, F32)}
    check(make([helper.make_node(op, ["x"], ["y"])], inputs, ["y"]), inputs)


# --- softmax and normalizations ------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op: str, axis: int) -> None:
    inputs = {"x": ((2, 3, 4), F32)}
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    kernels = check(make([node], inputs, ["y"]), inputs)
    combiners = [s.reduction for k in kernels for s in k.statements if s.reduction]
    assert combiners == ["max", "sum"]


def test_softmax_large_values_are_stable() -> None:
    inputs = {"x": ((2, 4), F32)}
    m = make([helper.make_node("Softmax", ["x"], ["y"])], inputs, ["y"])
    graph = optimize(import_model(m))
    x = np.array([[1000, 1001, 1002, 1003], [-1000, 0, 1000, 3]], dtype=F32)
    (got,) = run_lowered(graph, {"x": x})
    np.testing.assert_allclose(got, reference(m, {"x": x}, "ort")[0], rtol=1e-5, atol=1e-7)


LAYER_NORM_CASES = {
    "last": dict(x=(2, 3, 4), axis=-1),
    "axis1": dict(x=(2, 3, 4), axis=1),
    "axis0": dict(x=(2, 3, 4), axis=0),
    "no_bias": dict(x=(3, 5), axis=-1, bias=False),
    "broadcast_scale": dict(x=(2, 3, 4), axis=1, scale=(1, 4)),
    "epsilon": dict(x=(2, 6), axis=-1, epsilon=0.1),
}


@pytest.mark.parametrize("stats", [False, True], ids=["y", "y_mean_inv_std"])
@pytest.mark.parametrize("case", LAYER_NORM_CASES, ids=list(LAYER_NORM_CASES))
def test_layer_norm(case: str, stats: bool) -> None:
    spec = dict(LAYER_NORM_CASES[case])
    x = spec.pop("x")
    axis = spec["axis"] % len(x)
    inputs = {"x": (x, F32), "scale": (spec.pop("scale", x[axis:]), F32)}
    if spec.pop("bias", True):
        inputs["b"] = (x[axis:], F32)
    outputs = ["y", "mean", "inv_std"] if stats else ["y"]
    node = helper.make_node("LayerNormalization", list(inputs), outputs, **spec)
    check(make([node], inputs, outputs, opset=17), inputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 5), (1, 2, 2, 3, 2)])
def test_instance_norm(shape: Shape) -> None:
    inputs = {"x": (shape, F32), "scale": ((shape[1],), F32), "b": ((shape[1],), F32)}
    node = helper.make_node("InstanceNormalization", list(inputs), ["y"], epsilon=1e-3)
    check(make([node], inputs, ["y"]), inputs, rtol=1e-4, atol=1e-5)


def _lrn_numpy(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The spec's formula (onnx's reference evaluator loops over the batch instead of the
    channels, and onnxruntime only takes odd sizes)."""
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    square_sum = np.zeros_like(x)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - before) : min(x.shape[1], c + after + 1)]
        square_sum[:, c] = np.sum(window**2, axis=1)
    return x / (bias + alpha / size * square_sum) ** beta


@pytest.mark.parametrize("size", [1, 3, 7])
def test_lrn(size: int) -> None:
    inputs = {"x": ((2, 5, 3, 2), F32)}
    node = helper.make_node("LRN", ["x"], ["y"], size=size)
    check(make([node], inputs, ["y"]), inputs, rtol=1e-4)


@pytest.mark.parametrize("shape", [(2, 5, 3, 2), (1, 4, 3)])
def test_lrn_even_size(shape: Shape) -> None:
    attrs = dict(size=4, alpha=1e-2, beta=0.5, bias=2.0)
    inputs = {"x": (shape, F32)}
    node = helper.make_node("LRN", ["x"], ["y"], **attrs)
    graph = optimize(import_model(make([node], inputs, ["y"])))
    feeds = feeds_for(inputs)
    (got,) = run_lowered(graph, feeds)
    want = _lrn_numpy(feeds["x"], **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --- other dtypes, opsets and fusions ------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_opset_11_flattens_at_axis(op: str) -> None:
    if "Reshape" not in LOWERINGS:  # the canonical form is Reshape → Softmax → Reshape
        pytest.skip("Reshape has no lowering yet")
    inputs = {"x": ((2, 3, 4), F32)}
    node = helper.make_node(op, ["x"], ["y"], axis=1)
    check(make([node], inputs, ["y"], opset=11), inputs)


F16_NODES = {
    "softmax": (helper.make_node("Softmax", ["x"], ["y"], axis=1), {}),
    "log_softmax": (helper.make_node("LogSoftmax", ["x"], ["y"]), {}),
    "average_pool": (
        helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0]),
        {},
    ),
    "max_pool": (
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
        {},
    ),
    "global_average_pool": (helper.make_node("GlobalAveragePool", ["x"], ["y"]), {}),
    "layer_norm": (
        helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=2),
        {"s": (3, 4), "b": (4,)},
    ),
    "instance_norm": (
        helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"]),
        {"s": (2,), "b": (2,)},
    ),
    "gemm": (helper.make_node("Gemm", ["x2", "w"], ["y"], transB=1), {"x2": (3, 4), "w": (5, 4)}),
    "einsum": (
        helper.make_node("Einsum", ["x", "w"], ["y"], equation="nchw,cd->ndhw"),
        {"w": (2, 3)},
    ),
    "conv_transpose": (
        helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2]),
        {"w": (2, 1, 2, 2)},
    ),
}


@pytest.mark.parametrize("case", F16_NODES, ids=list(F16_NODES))
def test_float16(case: str) -> None:
    node, extra = F16_NODES[case]
    inputs = {"x": ((2, 2, 3, 4), "float16")} if "x" in node.input else {}
    inputs |= {name: (shape, "float16") for name, shape in extra.items()}
    kernels = check(make([node], inputs, ["y"]), inputs, oracle="reference", rtol=3e-3, atol=3e-3)
    sums = [s for k in kernels for s in k.statements if s.reduction == "sum"]
    assert all(k.tensors[s.tensor].dtype == "float32" for k in kernels for s in sums)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_gemm_integers(dtype: str) -> None:
    inputs = {"a": ((3, 4), dtype), "b": ((5, 4), dtype), "c": ((5,), dtype)}
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=2.0, beta=-1.0)
    check(make([node], inputs, ["y"]), inputs, oracle="reference")


def test_gemm_integers_with_fractional_alpha_are_unsupported() -> None:
    from polytile.errors import UnsupportedOpError

    inputs = {"a": ((3, 4), "int32"), "b": ((4, 5), "int32")}
    node = helper.make_node("Gemm", ["a", "b"], ["y"], alpha=0.5)
    graph = optimize(import_model(make([node], inputs, ["y"])))
    with pytest.raises(UnsupportedOpError, match="alpha"):
        run_lowered(graph, feeds_for(inputs))


def test_conv_batchnorm_relu_block() -> None:
    rng = np.random.default_rng(2)
    weights = {
        "w": rng.standard_normal((4, 2, 3, 3)).astype(F32),
        "scale": rng.uniform(0.5, 1.5, 4).astype(F32),
        "shift": rng.standard_normal(4).astype(F32),
        "mean": rng.standard_normal(4).astype(F32),
        "var": rng.uniform(0.5, 1.5, 4).astype(F32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fc_b"], ["y"], transB=1),
    ]
    weights["fc"] = rng.standard_normal((3, 4)).astype(F32)
    weights["fc_b"] = rng.standard_normal(3).astype(F32)
    inputs = {"x": ((2, 2, 7, 7), F32)}
    check(make(nodes, inputs, ["y"], weights), inputs, rtol=1e-4)


def test_attention_block() -> None:
    """MatMul → scale → Softmax → MatMul, as in a transformer layer."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    weights = {"scale": np.array(0.5, dtype=F32)}
    inputs = {"q": ((2, 3, 4), F32), "kt": ((2, 4, 5), F32), "v": ((2, 5, 4), F32)}
    check(make(nodes, inputs, ["y"], weights), inputs)
