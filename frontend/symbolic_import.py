"""Import a model whose inputs have symbolic sizes: every tensor's shape as `Dim`
expressions over the named sizes, shape subgraphs folded to symbolic values.

    model = import_symbolic("bert.onnx", {"input_ids": ("batch", "seq")}, {"seq": (1, 512)})
    model.shapes()["output"]        # (batch, seq, 256)
    model.evaluate({"batch": 2, "seq": 7})["output"]   # (2, 7, 256)

The walk is the importer's (canonicalization, control flow, static inference and folding
all unchanged): a node whose inputs are all static goes through the static path as
before; a node touching a symbolic shape or value goes through the registry's inference
(which works on `Dim`s) or a symbolic rule (`symbolic_ops`). Where a shape cannot be
decided or expressed for every size, a `SymbolicShapeError` names the node, its op and
the sizes: the point where a compile may fall back to a specialization.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx

from polytile.errors import InputError, PolytileError, ShapeError, SymbolicShapeError

from .graph import Graph, Node, TensorType, readonly
from .importer import PROPAGATE_LIMIT, _check_shape, _Importer, import_model
from .loading import ModelSource, check_model, load_model
from .ops import OPS, InferContext
from .symbolic import (
    ISL_KEYWORDS,
    Dim,
    DimLike,
    assume,
    bounds_of,
    check_bounds,
    evaluate_shape,
)
from .symbolic_isl import IslForm, to_isl
from .symbolic_ops import TYPE_RULES, VALUE_RULES, SymbolicContext, has_dim, settle

__all__ = ["SymbolicModel", "import_symbolic", "symbolic_shapes"]

#: what a caller may give for one input dimension: a size, or the name of a symbolic one
GivenDim = int | str
Shape = tuple[DimLike, ...]


@dataclass(frozen=True)
class SymbolicModel:
    """An imported graph whose types may hold `Dim`s, with the folded symbolic values of
    its shape tensors and the bounds its comparisons were decided under."""

    graph: Graph
    #: tensor -> its value where it depends on the sizes (an object array of ints / Dims)
    values: Mapping[str, np.ndarray]
    #: every named size, in the order the inputs introduce them
    params: tuple[str, ...]
    bounds: Mapping[str, tuple[int, int]]
    #: the model it was imported from (for `specialize`)
    model: onnx.ModelProto = field(repr=False, compare=False, default_factory=onnx.ModelProto)

    def shapes(self) -> dict[str, Shape]:
        """Every tensor's shape (graph inputs, constants, node outputs)."""
        return {name: t.shape for name, t in self.graph.types.items()}

    def assumed(self) -> AbstractContextManager[None]:
        """A block in which comparisons of the model's sizes are decided under its bounds
        (outside, every size is in [1, MAX_DIM])."""
        return assume(self.bounds)

    def isl_shape(self, tensor: str) -> IslForm:
        """The tensor's shape as isl expressions, its context holding the model's bounds."""
        with self.assumed():
            return to_isl(self.graph.types[tensor].shape)

    def evaluate(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every tensor's concrete shape at the given sizes."""
        missing = [p for p in self.params if p not in sizes]
        if missing:
            raise InputError(f"evaluate needs sizes for {', '.join(missing)}")
        for name in self.params:
            lo, hi = self.bounds.get(name, bounds_of(name))
            if not lo <= sizes[name] <= hi:
                raise InputError(f"size {name}={sizes[name]} is outside its bounds [{lo}, {hi}]")
        return {name: evaluate_shape(s, sizes) for name, s in self.shapes().items()}

    def bind(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """The sizes that concrete input shapes (each feed's `.shape`) give, checked: each
        input has its rank and static sizes, a size on several axes has one value, and
        every size lies within its bounds."""
        sizes: dict[str, int] = {}
        seen: dict[str, str] = {}
        for name in self.graph.inputs:
            if name not in shapes:
                raise InputError(f"bind needs the shape of input '{name}'")
            declared, actual = self.graph.types[name].shape, tuple(shapes[name])
            if len(actual) != len(declared):
                raise InputError(
                    f"input '{name}' has shape {list(actual)}, rank {len(actual)}; the model "
                    f"takes rank {len(declared)} ({list(declared)})"
                )
            for axis, (want, got) in enumerate(zip(declared, actual, strict=True)):
                where = f"axis {axis} of input '{name}'"
                if not isinstance(want, Dim):
                    if want != got:
                        raise InputError(f"{where} has size {got}, the model takes {want}")
                    continue
                (param,) = want.params  # inputs carry single named sizes
                if sizes.setdefault(param, int(got)) != got:
                    raise InputError(
                        f"{where} has size {got}, but {seen[param]} gave {param} = {sizes[param]}"
                    )
                seen.setdefault(param, where)
        self.evaluate(sizes)  # checks the bounds
        return sizes

    def specialize(self, sizes: Mapping[str, int]) -> Graph:
        """The statically shaped graph at these sizes, imported by `import_model` (the
        specialization a compile falls back to where a kernel cannot stay symbolic)."""
        self.evaluate(sizes)  # checks the sizes
        given = {i: evaluate_shape(self.graph.types[i].shape, sizes) for i in self.graph.inputs}
        return import_model(self.model, input_shapes=given, name=self.graph.name)


def import_symbolic(
    source: ModelSource,
    input_shapes: Mapping[str, Sequence[GivenDim]] | None = None,
    bounds: Mapping[str, Sequence[int]] | None = None,
    name: str | None = None,
) -> SymbolicModel:
    """Import a model keeping its symbolic input sizes (ONNX dim_params, or names given in
    `input_shapes`, e.g. {"input_ids": ("batch", "seq")}); `bounds` ({"seq": (1, 512)})
    narrow the default [1, 2**34] used to decide comparisons."""
    model, display = load_model(source)
    name = name or display
    opset = check_model(model, name)
    checked = check_bounds(dict(bounds or {}))
    importer = _SymbolicImporter(model, name, opset, dict(input_shapes or {}))
    with assume(checked):
        graph = importer.run()
    unknown = sorted(set(checked) - set(importer.params))
    if unknown:
        raise InputError(
            f"bounds name {', '.join(unknown)}, not symbolic sizes of model '{name}' "
            f"(sizes: {', '.join(importer.params) or 'none'})"
        )
    return SymbolicModel(
        graph,
        MappingProxyType(dict(importer.symbolic)),
        tuple(importer.params),
        MappingProxyType({p: checked.get(p, bounds_of(p)) for p in importer.params}),
        model,
    )


def symbolic_shapes(
    source: ModelSource,
    input_shapes: Mapping[str, Sequence[GivenDim]] | None = None,
    bounds: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Shape]:
    """Every tensor's shape as ints and `Dim`s over the model's symbolic sizes."""
    return import_symbolic(source, input_shapes, bounds).shapes()


def _identifier(raw: str) -> str:
    """An ONNX dim_param as a size name isl accepts: ASCII letters, digits and '_', not
    starting with a digit, and not a reserved word ('max' becomes 'max_')."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", raw)
    name = f"_{name}" if not name or name[0].isdigit() else name
    return f"{name}_" if name in ISL_KEYWORDS or keyword.iskeyword(name) else name


class _SymbolicImporter(_Importer):
    def __init__(
        self,
        model: onnx.ModelProto,
        name: str,
        opset: int,
        given: dict[str, Sequence[GivenDim]],
    ) -> None:
        super().__init__(model, name, opset, {}, {})
        self.input_shapes = {k: _check_shape(k, v, name, names=True) for k, v in given.items()}
        #: size name -> the raw name it came from (dim_param, or input and axis)
        self.params: dict[str, str] = {}
        #: tensors whose values depend on the sizes (object arrays of ints and Dims)
        self.symbolic: dict[str, np.ndarray] = {}
        #: tensors whose value could not be folded symbolically -> why
        self.unfolded: dict[str, str] = {}

    def _param(self, raw: str) -> Dim:
        name = _identifier(raw)
        if self.params.setdefault(name, raw) != raw:
            raise InputError(
                f"model '{self.name}': sizes '{self.params[name]}' and '{raw}' both become "
                f"'{name}'; name them in input_shapes"
            )
        return Dim.param(name)

    def _input_shape(self, name: str, ttype: onnx.TypeProto.Tensor, what: str) -> Shape:
        given = self.input_shapes.get(name)
        if not ttype.HasField("shape"):
            if given is None:
                raise ShapeError(
                    f"{what} has no shape; pass input_shapes={{'{name}': (...)}} to fix it"
                )
            declared: list[tuple[int | None, str]] = [(None, "")] * len(given)
        else:
            declared = [
                (d.dim_value if d.HasField("dim_value") else None, d.dim_param)
                for d in ttype.shape.dim
            ]
        if given is not None and len(given) != len(declared):
            raise InputError(
                f"input_shapes gives {what} rank {len(given)}, but the model declares rank "
                f"{len(declared)}"
            )
        shape: list[DimLike] = []
        for axis, (value, param) in enumerate(declared):
            want = given[axis] if given is not None else None
            if isinstance(want, str):
                shape.append(self._param(want))
            elif want is not None:
                if value is not None and value != want:
                    raise InputError(
                        f"input_shapes gives {what} size {want} on axis {axis}, but the "
                        f"model declares {value}"
                    )
                shape.append(want)
            elif value is not None:
                shape.append(int(value))
            else:  # a dynamic dim without a name is named after its input and axis
                shape.append(self._param(param or f"{name}_{axis}"))
        return tuple(shape)

    # --- inference ---------------------------------------------------------------------
    def _canonicalize(self, node: Node, node_names: set[str]) -> tuple[Node, ...]:
        try:
            return super()._canonicalize(node, node_names)
        except SymbolicShapeError as exc:
            if exc.node:
                raise
            raise _at_node(exc, self._context(node)) from exc

    def _full_values(self, node: Node) -> list[np.ndarray | None]:
        return [
            (self.values.get(i) if i in self.values else self.symbolic.get(i)) if i else None
            for i in node.inputs
        ]

    def _infer(self, node: Node) -> None:
        symbolic_types = any(i and has_dim(self.types[i].shape) for i in node.inputs)
        symbolic_values = any(i in self.symbolic for i in node.inputs if i)
        if not symbolic_types and not symbolic_values:
            self._check_params(self._context(node))
            super()._infer(node)
            self._carry_unfolded(node)
            return
        op = OPS[node.op_type]
        base = InferContext.looking_up(
            node, self.types, self.values, self.opset, self.name, self.fresh
        )
        ctx = SymbolicContext(base, self._full_values(node))
        if op.dtypes is not None and ctx.has_input(0) and ctx.dtype(0) not in op.dtypes:
            raise ctx.unsupported(f"input dtype {ctx.dtype(0)} is not supported")
        try:
            out_types = self._out_types(ctx)
        except SymbolicShapeError as exc:
            if exc.node:
                raise
            raise _at_node(exc, ctx) from exc
        except ShapeError as exc:
            if not symbolic_types:
                raise
            # shapes that disagree for some sizes only ([seq] + [batch]): still an error
            # that depends on the sizes
            raise SymbolicShapeError(str(exc), _dims_of(ctx), node.name) from exc
        except PolytileError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ArithmeticError) as exc:
            raise ctx.error(f"symbolic shape inference failed: {exc}") from exc
        for out, t in zip(node.outputs, out_types, strict=False):
            if out:
                self.types[out] = t
        missing = [o for o in node.outputs if o and o not in self.types]
        if missing:
            raise ctx.unsupported(f"output(s) {', '.join(missing)} are not supported")
        self.nodes.append(node)
        self._fold(ctx, out_types)
        self._carry_unfolded(node)

    def _carry_unfolded(self, node: Node) -> None:
        """Outputs without a value computed from an input that depends on the sizes but
        was not folded keep the reason, for the error of a node that needs them."""
        reasons = [self.unfolded[i] for i in node.inputs if i in self.unfolded]
        for out in node.outputs:
            if reasons and out and out not in self.values and out not in self.symbolic:
                self.unfolded.setdefault(out, reasons[0])

    def _out_types(self, ctx: SymbolicContext) -> tuple[TensorType, ...]:
        node = ctx.node
        rule = TYPE_RULES.get(node.op_type)
        self._check_params(ctx, symbolic_ok=rule is not None)
        return rule(ctx) if rule is not None else OPS[node.op_type].infer(ctx)

    def _check_params(self, ctx: InferContext, symbolic_ok: bool = False) -> None:
        """A SymbolicShapeError where an input the op reads as a value (a shape, axes, k,
        ...) depends on the sizes and is not folded, or is symbolic where the op's rule
        needs it static."""
        node = ctx.node
        for index in sorted(OPS[node.op_type].params):
            tensor = node.input(index)
            if tensor in self.symbolic and not symbolic_ok:
                problem = (
                    f"holds the symbolic value {self.symbolic[tensor].tolist()}, and "
                    f"{node.op_type} needs it static"
                )
            elif tensor in self.unfolded:
                problem = f"depends on the sizes and was not folded: {self.unfolded[tensor]}"
            else:
                continue
            raise SymbolicShapeError(
                f"{ctx.where()}: input {index} ('{tensor}') {problem}", _dims_of(ctx), node.name
            )

    def _fold(self, ctx: SymbolicContext, out_types: Sequence[TensorType]) -> None:
        """The node's output values where its input values are known, symbolic or not."""
        node = ctx.node
        rule = VALUE_RULES.get(node.op_type)
        live = [(o, t) for o, t in zip(node.outputs, out_types, strict=False) if o]
        reads_types_only = node.op_type in ("Shape", "Size")
        inputs_known = all(v is not None for i, v in zip(node.inputs, ctx.full, strict=True) if i)
        if not (reads_types_only or inputs_known):
            return
        if any(has_dim(t.shape) for _, t in live):
            return  # a tensor of symbolic size is data, not a shape value
        if sum(int(np.prod(t.shape)) for _, t in live) > PROPAGATE_LIMIT:
            return
        if rule is None:
            for out, _ in live:
                self.unfolded[out] = f"{node.label} has no symbolic folding rule"
            return
        xs = [v for i, v in zip(node.inputs, ctx.full, strict=True) if i]
        try:
            results = rule(ctx, xs, tuple(out_types))
        except SymbolicShapeError as exc:
            for out, _ in live:
                self.unfolded[out] = f"{node.label}: {exc}"
            return
        for (out, t), value in zip(live, results, strict=False):
            value = settle(np.asarray(value), t.dtype)
            if tuple(value.shape) != tuple(t.shape):
                raise AssertionError(
                    f"{ctx.where()}: folded '{out}' has shape {value.shape}, inference said "
                    f"{t.shape}"
                )
            if value.dtype == object:
                self.symbolic[out] = readonly(value)
            else:
                self.values[out] = readonly(value.astype(t.dtype, copy=False))


def _at_node(exc: SymbolicShapeError, ctx: InferContext) -> SymbolicShapeError:
    """The error with the node (name, op and model) it happened at."""
    return SymbolicShapeError(f"{ctx.where()}: {exc}", exc.dims or _dims_of(ctx), ctx.node.name)


def _dims_of(ctx: InferContext) -> tuple[str, ...]:
    """The size names in a node's input shapes (for errors)."""
    names: dict[str, None] = {}
    for t in ctx.input_types:
        for d in t.shape if t is not None else ():
            if isinstance(d, Dim):
                names.update(dict.fromkeys(sorted(d.params)))
    return tuple(names)
