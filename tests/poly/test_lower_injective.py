"""The injective lowerings (reshape-like copies, Transpose, Concat, Split, Slice, Pad, Gather,
Expand, Tile, Resize, Dropout) and the reductions (ReduceSum / Mean / Max / L2, ArgMax) on
small crafted models: import → optimize → partition → lower → program-order execution,
compared with onnxruntime (or onnx's reference evaluator) on the original model.

Execution is checked point by point: every load (indirect indices included) and every
store stays inside its tensor, and every element of every output is written by exactly one
non-reduction statement instance (so the pieces of a piecewise map are disjoint and cover
the output). Each kernel also gets its dependences, default schedule and AST."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import islpy as isl
import numpy as np
import onnx
import pytest
from onnx import helper

from polytile.explanation import explain
from polytile.frontend.importer import import_model as import_raw
from polytile.frontend.ops.resize import COORDINATE_MODES, NEAREST_MODES
from polytile.poly.default.schedule import default_schedule
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.buffers import allocate
from polytile.poly.ir.expr import Const, Load, loads
from polytile.poly.ir.kernel import Kernel, Role
from polytile.poly.lower import lower_group
from polytile.poly.oracle.reference import affine, evaluate, execute_statement, points

from lowered import Shape, check_lowered, feeds_for, make

F32 = "float32"


# --- harness ----------------------------------------------------------------------------------


def assert_affine_in_bounds(kernel: Kernel) -> None:
    """Every store and every affine load of every statement instance stays inside its
    tensor (isl, over the whole domain; indirect loads are checked at run time)."""
    for s in kernel.statements:
        maps = [s.write_map()]
        maps += [
            s._load_map(ld) for ld in loads(s.expr) if all(isinstance(i, str) for i in ld.index)
        ]
        for access in maps:
            name = access.get_tuple_name(isl.dim_type.out)
            t = kernel.tensors[name]
            box = ih.parse_set(ih.box(name, [f"a{i}" for i in range(len(t.shape))], t.shape))
            assert access.range().is_subset(box), f"{s.name} accesses {name} out of bounds"


def _inside(kernel: Kernel, tensor: str, index: tuple[int, ...], what: str) -> None:
    shape = kernel.tensors[tensor].shape
    assert len(index) == len(shape) and all(
        0 <= v < n for v, n in zip(index, shape, strict=True)
    ), f"{what} {tensor}{list(index)} outside {list(shape)}"


def execute_checked(kernel: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """run_program_order, checking every access of every instance and that each output
    element is stored by exactly one non-reduction instance."""
    buffers = allocate(kernel, inputs)
    stores = {t.name: np.zeros(t.shape, dtype=np.int64) for t in kernel.outputs()}
    for s in kernel.statements:
        for point in points(s):
            for ld in loads(s.expr):
                index = tuple(
                    affine(i, point) if isinstance(i, str) else int(evaluate(i, point, buffers))
                    for i in ld.index
                )
                _inside(kernel, ld.tensor, index, f"{s.name} at {point} loads")
            target = tuple(affine(i, point) for i in s.index)
            _inside(kernel, s.tensor, target, f"{s.name} at {point} stores")
            if s.reduction is None and s.tensor in stores:
                stores[s.tensor][target] += 1
            execute_statement(s, point, buffers)
    for name, count in stores.items():
        assert np.all(count == 1), f"output {name} stored {count.tolist()} times"
    return buffers


def inspect_kernel(kernel: Kernel) -> None:
    """A lowered kernel stays in bounds, has dependences and a default schedule."""
    assert_affine_in_bounds(kernel)
    kernel.dependences  # noqa: B018  (computes)
    explain(default_schedule(kernel))


#: the lowered kernels, executed with every access checked, reproduce the oracle
check = partial(check_lowered, execute=execute_checked, inspect=inspect_kernel)


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def statements_of(kernels: list[Kernel]) -> list:
    return [s for k in kernels for s in k.statements]


# --- reshape-like copies ------------------------------------------------------------------------

RESHAPES = {
    "merge": ((2, 3, 4), (6, 4)),
    "split": ((6, 4), (2, 3, 4)),
    "unaligned": ((2, 3, 4), (4, 6)),
    "flat": ((2, 3, 4), (24,)),
    "infer_and_copy": ((2, 3, 4), (0, -1)),
    "size_one_axes": ((1, 6, 1, 2), (3, 1, 4)),
}


@pytest.mark.parametrize("case", RESHAPES, ids=list(RESHAPES))
def test_reshape_output_is_a_copy(case: str) -> None:
    shape, target = RESHAPES[case]
    inputs = {"x": (shape, F32)}
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    kernels = check(make([node], inputs, ["y"], {"s": ints(*target)}), inputs)
    (kernel,) = kernels
    (s,) = kernel.statements
    assert s.tensor == "y"


def test_reshape_between_ops_is_an_alias() -> None:
    inputs = {"x": ((2, 3, 4), F32)}
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0]),
    ]
    kernels = check(make(nodes, inputs, ["y"], {"s": ints(4, 6)}), inputs)
    assert [s for k in kernels for s in k.statements if s.tensor == "r"] == []


def test_reshape_index_groups_axes() -> None:
    from polytile.poly.lower.injective import reshape_index

    assert reshape_index((2, 1, 3), (2, 3), ("i0", "i1")) == ["i0", "0", "i1"]
    assert reshape_index((6,), (2, 3), ("i0", "i1")) == ["3*i0 + i1"]
    assert reshape_index((2, 3), (6,), ("i0",)) == ["floor(i0/3)", "i0 - 3*floor(i0/3)"]


@pytest.mark.parametrize("axis", [0, 2, -1, 3])
def test_flatten(axis: int) -> None:
    inputs = {"x": ((2, 3, 2, 2), F32)}
    check(make([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], inputs, ["y"]), inputs)


@pytest.mark.parametrize("axes", [None, [-1], [0, 2]])
def test_squeeze(axes: list[int] | None) -> None:
    inputs = {"x": ((1, 3, 1, 1), F32)}
    names = ["x", "a"] if axes is not None else ["x"]
    consts = {"a": ints(*axes)} if axes is not None else {}
    check(make([helper.make_node("Squeeze", names, ["y"])], inputs, ["y"], consts), inputs)


@pytest.mark.parametrize("axes", [[0], [-1], [1, -1]])
def test_unsqueeze(axes: list[int]) -> None:
    inputs = {"x": ((3, 2), "int32")}
    node = helper.make_node("Unsqueeze", ["x", "a"], ["y"])
    check(make([node], inputs, ["y"], {"a": ints(*axes)}), inputs)


def test_dropout_copies_and_masks() -> None:
    """Dropout is eliminated by the passes; lowered directly, it copies and masks."""
    inputs = {"x": ((2, 3), F32)}
    node = helper.make_node("Dropout", ["x"], ["y", "mask"])
    graph = import_raw(make([node], inputs, ["y", "mask"], opset=13))
    (dropout,) = graph.nodes
    kernel = lower_group(graph, [dropout.name], ["x"], ["y", "mask"])
    x = feeds_for(inputs)["x"]
    buffers = execute_checked(kernel, {"x": x})
    np.testing.assert_array_equal(buffers["y"], x)
    assert buffers["mask"].dtype == np.bool_ and buffers["mask"].all()


# --- Transpose, Concat, Split -------------------------------------------------------------------


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]])
def test_transpose(perm: list[int] | None) -> None:
    inputs = {"x": ((2, 3, 2, 4), F32)}
    attrs = {} if perm is None else {"perm": perm}
    check(make([helper.make_node("Transpose", ["x"], ["y"], **attrs)], inputs, ["y"]), inputs)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis: int) -> None:
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    inputs = {f"x{i}": (tuple(s), F32) for i, s in enumerate(shapes)}
    node = helper.make_node("Concat", list(inputs), ["y"], axis=axis)
    kernels = check(make([node], inputs, ["y"]), inputs)
    assert len(statements_of(kernels)) == 3  # one per input, over its slab


def test_concat_with_a_constant_and_an_empty_input() -> None:
    inputs = {"x": ((2, 3), "int64"), "e": ((2, 0), "int64")}
    node = helper.make_node("Concat", ["c", "x", "e"], ["y"], axis=1)
    consts = {"c": np.arange(4, dtype=np.int64).reshape(2, 2)}
    kernels = check(make([node], inputs, ["y"], consts), inputs)
    assert len(statements_of(kernels)) == 2


@pytest.mark.parametrize(
    ("axis", "split", "outputs"),
    [(0, None, 2), (1, [1, 4, 2], 3), (-1, None, 3), (1, [0, 7], 2)],
    ids=["equal", "sizes", "uneven_chunks", "empty_part"],
)
def test_split(axis: int, split: list[int] | None, outputs: int) -> None:
    inputs = {"x": ((4, 7), F32)}
    names = ["x", "s"] if split is not None else ["x"]
    attrs = {} if split is not None else {"num_outputs": outputs}
    consts = {"s": ints(*split)} if split is not None else {}
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node("Split", names, outs, axis=axis, **attrs)
    kernels = check(make([node], inputs, outs, consts), inputs, oracle="reference")
    assert {s.tensor for s in statements_of(kernels)} == set(outs)


# --- Slice ----------------------------------------------------------------------------------------

SLICES = {
    "basic": ([0, 1], [2, 3], None, None),
    "negative_bounds": ([-3, -4], [-1, 100], [1, 2], None),
    "steps": ([0, 1], [5, 6], [1, 2], [2, 3]),
    "negative_steps": ([-1, 4], [-100, 0], [2, 1], [-1, -2]),
    "negative_axes_and_step": ([3], [-6], [-2], [-2]),
    "empty": ([2], [1], [0], [1]),
    "clamped": ([-100], [100], [-1], [3]),
}


@pytest.mark.parametrize("case", SLICES, ids=list(SLICES))
def test_slice(case: str) -> None:
    starts, ends, axes, steps = SLICES[case]
    inputs = {"x": ((3, 5, 6), F32)}
    names, consts = ["x", "b", "e"], {"b": ints(*starts), "e": ints(*ends)}
    if axes is not None:
        names.append("a")
        consts["a"] = ints(*axes)
    if steps is not None:
        names.append("st")
        consts["st"] = ints(*steps)
    node = helper.make_node("Slice", names, ["y"])
    check(make([node], inputs, ["y"], consts), inputs)


# --- Pad ------------------------------------------------------------------------------------------

PADS = {
    "constant": ("constant", [1, 0, 2, 0, 2, 1], None, 1.5),
    "constant_crop": ("constant", [1, -1, 0, -2, 2, 1], None, None),
    "constant_axes": ("constant", [2, -1], [-1], 0.25),
    "constant_crop_all": ("constant", [0, -3, 0, 1, 0, 0], None, 2.0),
    "reflect": ("reflect", [1, 2, 3, 2, 0, 1], None, None),
    "reflect_crop": ("reflect", [0, -1, 2, 0, 2, 1], None, None),
    "reflect_wide": ("reflect", [0, 7, 0, 9, 0, 0], None, None),
    "edge": ("edge", [2, 0, 1, 3, 2, 2], None, None),
    "edge_crop": ("edge", [-1, 2, 0, 2, 0, -1], None, None),
    "wrap": ("wrap", [1, 2, 3, 2, 1, 1], None, None),
    "wrap_wide": ("wrap", [0, 5, 0, 11, 0, 0], None, None),
    "wrap_crop": ("wrap", [0, 3, 0, -1, 2, 0], None, None),
}


@pytest.mark.parametrize("case", PADS, ids=list(PADS))
def test_pad(case: str) -> None:
    mode, pads, axes, value = PADS[case]
    inputs = {"x": ((3, 4, 5), F32)}
    names, consts = ["x", "p"], {"p": ints(*pads)}
    if value is not None or axes is not None:
        names.append("v" if value is not None else "")
        if value is not None:
            consts["v"] = np.array(value, dtype=np.float32)
    if axes is not None:
        names.append("a")
        consts["a"] = ints(*axes)
    node = helper.make_node("Pad", names, ["y"], mode=mode)
    # onnxruntime rejects reflect pads wider than the axis; numpy (the reference) repeats
    oracle = "reference" if "wide" in case else "ort"
    kernels = check(make([node], inputs, ["y"], consts, opset=19), inputs, oracle=oracle)
    if mode == "constant" and "all" not in case:
        _, border = statements_of(kernels)
        assert isinstance(border.expr, Const)  # the box minus the interior (a union)
        assert " or " in border.domain or case == "constant_axes"


def test_pad_int_before_an_op_fuses() -> None:
    inputs = {"x": ((2, 3), "int32")}
    nodes = [
        helper.make_node("Pad", ["x", "p", "v"], ["t"], mode="constant"),
        helper.make_node("Transpose", ["t"], ["y"]),
    ]
    consts = {"p": ints(1, 0, 1, 2), "v": np.array(7, dtype=np.int32)}
    check(make(nodes, inputs, ["y"], consts), inputs)


# --- Gather, Expand, Tile -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("axis", "indices"),
    [(0, [[0, -1], [2, 1]]), (1, [-4, 3, 0]), (-1, 2), (2, [[[-1]], [[0]]])],
    ids=["2d_negative", "axis1_negative", "scalar", "3d_indices"],
)
def test_gather_constant_indices(axis: int, indices: object) -> None:
    inputs = {"x": ((3, 4, 5), F32)}
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    consts = {"i": np.array(indices, dtype=np.int64)}
    kernels = check(make([node], inputs, ["y"], consts), inputs)
    (s,) = statements_of(kernels)
    indirect = [i for ld in loads(s.expr) for i in ld.index if not isinstance(i, str)]
    assert len(indirect) == 1  # the index is a load of the indices tensor


def test_gather_nonnegative_constant_indices_need_no_select() -> None:
    inputs = {"x": ((4, 3), F32)}
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
    kernels = check(make([node], inputs, ["y"], {"i": ints(3, 0, 0)}), inputs)
    (s,) = statements_of(kernels)
    (index,) = [i for i in s.expr.index if not isinstance(i, str)]
    assert isinstance(index, Load)


def test_gather_runtime_indices() -> None:
    inputs = {"x": ((5, 3), F32), "i": ((2, 2), "int32")}
    feeds = {"x": feeds_for(inputs)["x"], "i": np.array([[-1, 0], [4, -5]], dtype=np.int32)}
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
    check(make([node], inputs, ["y"]), inputs, feeds=feeds)


@pytest.mark.parametrize(
    ("shape", "target"),
    [((3, 1), (2, 3, 4)), ((1, 4), (3, 1)), ((2, 1, 3), (2, 2, 3)), ((1,), (1,))],
    ids=["rank_up", "both_broadcast", "middle", "trivial"],
)
def test_expand(shape: Shape, target: Shape) -> None:
    inputs = {"x": (shape, F32)}
    node = helper.make_node("Expand", ["x", "s"], ["y"])
    check(make([node], inputs, ["y"], {"s": ints(*target)}), inputs)


@pytest.mark.parametrize(
    ("shape", "repeats"), [((2, 3), (2, 3)), ((1, 3, 2), (3, 1, 2)), ((2, 2), (1, 1))]
)
def test_tile(shape: Shape, repeats: Shape) -> None:
    inputs = {"x": (shape, "int64")}
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    check(make([node], inputs, ["y"], {"r": ints(*repeats)}), inputs)


def test_injective_chain_is_one_kernel() -> None:
    inputs = {"x": ((2, 3, 4), F32), "z": ((4, 1, 2), F32)}
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Slice", ["t", "b", "e", "a", "st"], ["s"]),
        helper.make_node("Pad", ["s", "p"], ["q"], mode="reflect"),
        helper.make_node("Concat", ["q", "z"], ["y"], axis=1),
    ]
    consts = {
        "b": ints(-1),
        "e": ints(-100),
        "a": ints(2),
        "st": ints(-2),
        "p": ints(0, 1, 0, 0, 0, 0),
    }
    kernels = check(make(nodes, inputs, ["y"], consts), inputs)
    assert len(kernels) == 1


# --- Resize -------------------------------------------------------------------------------------

#: every coordinate transformation the frontend accepts but tf_crop_and_resize (tested
#: on its own), and every rounding of nearest
COORDINATES = [m for m in COORDINATE_MODES if m != "tf_crop_and_resize"]
ROUNDINGS = list(NEAREST_MODES)


def _resize(
    x: Shape,
    scales: Sequence[float] | None = None,
    sizes: Sequence[int] | None = None,
    roi: Sequence[float] | None = None,
    dtype: str = F32,
    **attrs: object,
) -> tuple[onnx.ModelProto, dict[str, tuple[Shape, str]]]:
    inputs = {"x": (x, dtype)}
    consts: dict[str, np.ndarray] = {}
    names = ["x", "", "", ""]
    if roi is not None:
        names[1] = "roi"
        consts["roi"] = np.array(roi, dtype=np.float32)
    if scales is not None:
        names[2] = "scales"
        consts["scales"] = np.array(scales, dtype=np.float32)
    if sizes is not None:
        names[3] = "sizes"
        consts["sizes"] = ints(*sizes)
    while not names[-1]:
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return make([node], inputs, ["y"], consts, opset=19), inputs


def _affine_nearest(kernels: list[Kernel]) -> bool:
    return all(
        isinstance(i, str) for s in statements_of(kernels) for ld in loads(s.expr) for i in ld.index
    )


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("coordinates", COORDINATES)
def test_resize_nearest_modes(coordinates: str, rounding: str) -> None:
    """Up in one axis and down in the other (non-integer factors): every pick is affine."""
    for scales in ([1, 1, 1.7, 0.6], [1, 1, 0.5, 3.0]):
        m, inputs = _resize(
            (1, 2, 5, 6),
            scales=scales,
            mode="nearest",
            coordinate_transformation_mode=coordinates,
            nearest_mode=rounding,
        )
        kernels = check(m, inputs, oracle="reference")
        assert _affine_nearest(kernels)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_resize_nearest_without_an_affine_formula_computes_the_index(
    rounding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no affine formula reproduces the reference's float picks, the index is the
    same float computation as an indirect load (forced here by rejecting every formula)."""
    from polytile.poly.lower import resize

    monkeypatch.setattr(resize, "affine_rounding", lambda *args: (0, -1, 1))
    m, inputs = _resize(
        (1, 1, 5, 6),
        scales=[1, 1, 1.7, 0.6],
        mode="nearest",
        coordinate_transformation_mode="half_pixel",
        nearest_mode=rounding,
    )
    kernels = check(m, inputs, oracle="reference")
    assert not _affine_nearest(kernels)


@pytest.mark.parametrize(
    ("sizes", "policy", "axes"),
    [((7, 3), "stretch", None), ((9, 9), "not_larger", [2, 3]), ((2, 7), "not_smaller", [3, 2])],
)
def test_resize_nearest_sizes(sizes: Shape, policy: str, axes: list[int] | None) -> None:
    attrs: dict[str, object] = {"keep_aspect_ratio_policy": policy}
    if axes is not None:
        attrs["axes"] = axes
        full = sizes
    else:
        full = (1, 2, *sizes)
    m, inputs = _resize((1, 2, 4, 5), sizes=full, mode="nearest", **attrs)
    kernels = check(m, inputs, oracle="reference")
    assert _affine_nearest(kernels)


def test_resize_nearest_agrees_with_onnxruntime() -> None:
    m, inputs = _resize(
        (1, 1, 3, 4),
        scales=[1, 1, 2, 2],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
    kernels = check(m, inputs, oracle="ort")
    (s,) = statements_of(kernels)
    assert s.expr.index == ("i0", "i1", "floor(i2/2)", "floor(i3/2)")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_tf_crop_and_resize(mode: str) -> None:
    m, inputs = _resize(
        (1, 1, 4, 5),
        roi=[0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4],
        sizes=[1, 1, 5, 4],
        mode=mode,
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-3.0,
    )
    kernels = check(m, inputs, oracle="reference")
    if mode == "nearest":
        assert _affine_nearest(kernels)
        assert any(" or " in s.domain for s in statements_of(kernels))  # the extrapolation


@pytest.mark.parametrize("coordinates", [*COORDINATES, "pytorch_half_pixel_to_one"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_interpolating(mode: str, coordinates: str) -> None:
    sizes = (1, 2, 7, 3)
    if coordinates == "pytorch_half_pixel_to_one":
        coordinates, sizes = "pytorch_half_pixel", (1, 2, 1, 3)
    m, inputs = _resize(
        (1, 2, 4, 5), sizes=sizes, mode=mode, coordinate_transformation_mode=coordinates
    )
    check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)


def test_resize_cubic_exclude_outside_and_a() -> None:
    m, inputs = _resize(
        (1, 1, 5, 4), scales=[1, 1, 0.8, 1.5], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1
    )
    check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)


def test_resize_linear_axes_only() -> None:
    m, inputs = _resize((2, 3, 4), scales=[2.5], mode="linear", axes=[2])
    check(m, inputs, oracle="reference", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_resize_linear_integers_round_half_to_even(dtype: str) -> None:
    m, inputs = _resize((1, 1, 3, 3), scales=[1, 1, 2, 2], mode="linear", dtype=dtype)
    feeds = {"x": np.array([[[[0, 3, 8], [1, 2, 5], [7, 0, 4]]]], dtype=dtype)}
    check(m, inputs, oracle="reference", feeds=feeds)


# --- reductions -----------------------------------------------------------------------------------

REDUCE_CASES = {
    "axes_keep": ([1], 1, 0),
    "negative_axes_drop": ([-1, 0], 0, 0),
    "all_default": (None, 1, 0),
    "all_drop": (None, 0, 0),
    "noop": (None, 1, 1),
    "empty_axes_input": ([], 0, 0),
}


@pytest.mark.parametrize("case", REDUCE_CASES, ids=list(REDUCE_CASES))
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce(op: str, case: str) -> None:
    axes, keep, noop = REDUCE_CASES[case]
    inputs = {"x": ((2, 3, 4), F32)}
    names, consts = ["x"], {}
    if axes is not None:
        names.append("a")
        consts["a"] = np.array(axes, dtype=np.int64)
    node = helper.make_node(op, names, ["y"], keepdims=keep, noop_with_empty_axes=noop)
    kernels = check(make([node], inputs, ["y"], consts), inputs, rtol=1e-5)
    statements = statements_of(kernels)
    reductions = [s for s in statements if s.reduction]
    if case == "noop":
        assert reductions == []
        return
    (red,) = reductions
    assert red.reduction == ("max" if op == "ReduceMax" else "sum")
    (init,) = [s for s in statements if s.init_of == red.name]
    assert init.tensor == red.tensor and init.index == red.index
    assert statements.index(init) < statements.index(red)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float16"])
def test_reduce_dtypes(op: str, dtype: str) -> None:
    inputs = {"x": ((3, 5), dtype)}
    node = helper.make_node(op, ["x", "a"], ["y"], keepdims=0)
    check(
        make([node], inputs, ["y"], {"a": ints(1)}),
        inputs,
        oracle="reference",
        rtol=1e-3,
        atol=1e-3,
    )


def test_reduce_max_bool_starts_from_false() -> None:
    inputs = {"x": ((3, 4), "bool")}
    feeds = {"x": np.array([[0, 0, 0, 0], [0, 1, 0, 0], [1, 1, 1, 1]], dtype=bool)}
    node = helper.make_node("ReduceMax", ["x", "a"], ["y"], keepdims=0)
    check(make([node], inputs, ["y"], {"a": ints(1)}, opset=20), inputs, "reference", feeds=feeds)


def test_reduce_attribute_axes_before_opset_18() -> None:
    inputs = {"x": ((2, 3, 4), F32)}
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[0, -1], keepdims=1)
    check(make([node], inputs, ["y"], opset=17), inputs)


def test_reduce_over_an_empty_axis() -> None:
    inputs = {"x": ((2, 0, 3), F32)}
    feeds = {"x": np.zeros((2, 0, 3), dtype=np.float32)}
    for op in ("ReduceSum", "ReduceMax", "ReduceL2"):
        node = helper.make_node(op, ["x", "a"], ["y"], keepdims=1)
        m = make([node], inputs, ["y"], {"a": ints(1)})
        kernels = check(m, inputs, oracle="reference", feeds=feeds)
        assert not any(s.reduction for s in statements_of(kernels))


def test_reduce_with_an_epilogue() -> None:
    inputs = {"x": ((3, 4), F32)}
    nodes = [
        helper.make_node("ReduceL2", ["x", "a"], ["r"], keepdims=1),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    check(make(nodes, inputs, ["y"], {"a": ints(1)}), inputs)


@pytest.mark.parametrize("keep", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_argmax(axis: int, last: int, keep: int) -> None:
    inputs = {"x": ((3, 4, 5), "int32")}
    feeds = {"x": np.random.default_rng(0).integers(0, 3, size=(3, 4, 5)).astype(np.int32)}
    node = helper.make_node(
        "ArgMax", ["x"], ["y"], axis=axis, keepdims=keep, select_last_index=last
    )
    kernels = check(make([node], inputs, ["y"]), inputs, feeds=feeds)  # ties everywhere
    combiners = [s.reduction for s in statements_of(kernels) if s.reduction]
    assert combiners == ["max", "max" if last else "min"]
    (kernel,) = kernels
    assert [t.dtype for t in kernel.tensors.values() if t.role is Role.TEMP] == ["int32"]


@pytest.mark.parametrize("last", [0, 1])
def test_argmax_float_with_nan(last: int) -> None:
    inputs = {"x": ((2, 4), F32)}
    feeds = {"x": np.array([[1, np.nan, 3, np.nan], [2, 5, 5, -1]], dtype=np.float32)}
    node = helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0, select_last_index=last)
    check(make([node], inputs, ["y"]), inputs, oracle="reference", feeds=feeds)
