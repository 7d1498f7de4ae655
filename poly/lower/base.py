"""Lowering infrastructure: a fused group of the graph becomes one Kernel.

Each ONNX op has exactly one compute definition, registered with `lowering(op_type)`: a
function from a `LowerContext` to the statements computing the node's outputs. The
context hands out identifier-safe tensor and statement names, loads with numpy
broadcasting, boxes as isl domains and temporaries.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from polytile.errors import SymbolicShapeError, UnsupportedOpError
from polytile.frontend.graph import Graph, Node, TensorType
from polytile.frontend.ops import InferContext
from polytile.frontend.symbolic import Dim
from polytile.frontend.symbolic_isl import to_isl
from polytile.names import unique_name
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Binary, Cast, Expr, Iter, Load, const, identity
from polytile.poly.ir.kernel import Extent, Kernel, Role, Statement, Tensor

Lowering = Callable[["LowerContext"], list[Statement]]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*op_types: str) -> Callable[[Lowering], Lowering]:
    """Register the one compute definition of these ops."""

    def wrap(fn: Lowering) -> Lowering:
        for op in op_types:
            if op in LOWERINGS:
                raise RuntimeError(f"op {op} lowered twice")
            LOWERINGS[op] = fn
        return fn

    return wrap


def identifier(name: str) -> str:
    """An isl-safe identifier for an ONNX name."""
    ident = re.sub(r"\W", "_", name)
    return ident if re.match(r"[A-Za-z]", ident) else f"t_{ident}"


def is_atom(text: str) -> bool:
    """Whether `text` needs no parentheses inside a larger expression."""
    return text.isidentifier() or text.lstrip("-").isdigit()


def parens(text: str) -> str:
    return text if is_atom(text) else f"({text})"


def affine_text(terms: Sequence[tuple[int, str]], offset: int = 0) -> str:
    """Affine text in isl (and Python) syntax: `[(2, 'i'), (1, 'j')], -1` → `2*i + j - 1`
    (zero coefficients dropped, compound terms parenthesized)."""
    text = ""
    for coef, name in terms:
        if coef == 0:
            continue
        mag = name if abs(coef) == 1 else f"{abs(coef)}*{parens(name)}"
        if not text:
            text = mag if coef > 0 else f"-{mag}"
        else:
            text += f" + {mag}" if coef > 0 else f" - {mag}"
    if not text:
        return str(offset)
    if offset:
        text += f" + {offset}" if offset > 0 else f" - {-offset}"
    return text


@dataclass(frozen=True)
class LowerConfig:
    """Choices between compute definitions of the same op. `compile`, `tune` and
    `explain` take the target's (`polytile.codegen.configs.lower_config`), so that tuning
    records name the kernels `compile` builds."""

    #: stride-1 3x3 convs over large images as Winograd F(2x2, 3x3) (`lower.winograd`)
    winograd: bool = True
    #: the fewest input and output channels a Winograd conv has: its transforms cost
    #: memory traffic per channel, its matrix product saves work per channel pair
    winograd_channels: int = 16
    #: float32 lanes of a vector: a padded depthwise conv whose rows take at most two
    #: reads a padded copy of its input (`lower.nn`)
    vector_width: int = 16


class _Builder:
    """Shared state while lowering one group: names, tensors, statements."""

    def __init__(self, graph: Graph, name: str, config: LowerConfig) -> None:
        self.graph = graph
        self.name = name
        self.config = config
        self.taken: set[str] = set()
        self.ids: dict[str, str] = {}  # ONNX tensor name -> kernel tensor name
        self.tensors: dict[str, Tensor] = {}

    def fresh(self, base: str) -> str:
        return unique_name(identifier(base), self.taken)

    def tensor_id(self, onnx_name: str) -> str:
        if onnx_name not in self.ids:
            self.ids[onnx_name] = self.fresh(onnx_name)
        return self.ids[onnx_name]


class LowerContext:
    """What one op's lowering sees: its node, types, constants, and name helpers."""

    def __init__(self, builder: _Builder, node: Node) -> None:
        self._b = builder
        self.node = node
        self.graph = builder.graph
        self.config = builder.config

    # --- node facts -------------------------------------------------------------------
    def type(self, onnx_name: str) -> TensorType:
        return self.graph.types[onnx_name]

    def input_type(self, index: int) -> TensorType:
        return self.graph.types[self.node.inputs[index]]

    def output_type(self, index: int = 0) -> TensorType:
        return self.graph.types[self.node.outputs[index]]

    def has_input(self, index: int) -> bool:
        return index < len(self.node.inputs) and bool(self.node.inputs[index])

    def constant(self, index: int) -> np.ndarray | None:
        """The value of input `index` when it is a compile-time constant."""
        if not self.has_input(index):
            return None
        return self.graph.constants.get(self.node.inputs[index])

    def attr(self, name: str, default: object = None) -> object:
        return self.node.attrs.get(name, default)

    def infer_context(self) -> InferContext:
        """The frontend's view of the node, for rules shared with it (conv windows, ...)."""
        graph = self.graph
        return InferContext.looking_up(
            self.node, graph.types, graph.constants, graph.opset, graph.name
        )

    def unsupported(self, message: str) -> UnsupportedOpError:
        node = self.node
        return UnsupportedOpError(
            f"{node.label} in model '{self.graph.name}': {message}",
            ((node.name, node.op_type, message),),
        )

    # --- names ------------------------------------------------------------------------
    def tensor(self, onnx_name: str) -> str:
        """The kernel tensor holding an ONNX tensor."""
        return self._b.tensor_id(onnx_name)

    def input(self, index: int) -> str:
        return self.tensor(self.node.inputs[index])

    def output(self, index: int = 0) -> str:
        return self.tensor(self.node.outputs[index])

    def statement_name(self, base: str | None = None) -> str:
        return self._b.fresh(base or self.node.name)

    def temp(self, base: str, shape: Sequence[Size], dtype: str) -> str:
        """A new temporary tensor private to this kernel."""
        name = self._b.fresh(f"{self.node.name}_{base}")
        self._b.tensors[name] = Tensor(name, tuple(extent(d) for d in shape), dtype, Role.TEMP)
        return name

    def constant_tensor(self, base: str, value: np.ndarray) -> str:
        """A new constant tensor of this kernel computed by the lowering (transformed
        weights)."""
        name = self._b.fresh(f"{self.node.name}_{base}")
        shape = tuple(int(d) for d in value.shape)
        self._b.tensors[name] = Tensor(name, shape, str(value.dtype), Role.CONSTANT, value)
        return name

    # --- building blocks --------------------------------------------------------------
    @staticmethod
    def dims(rank: int, prefix: str = "i") -> tuple[str, ...]:
        return tuple(f"{prefix}{n}" for n in range(rank))

    @staticmethod
    def domain(stmt: str, dims: Sequence[str], extents: Sequence[Size], extra: str = "") -> str:
        return ih.box(stmt, dims, [extent(e) for e in extents], extra)

    def load(self, onnx_name: str, index: Sequence[str | Expr]) -> Expr:
        t = self.type(onnx_name)
        if len(index) != t.rank:
            raise ValueError(
                f"{self.node.label}: load of rank-{t.rank} '{onnx_name}' with {len(index)} indices"
            )
        value = self.graph.constants.get(onnx_name)
        if value is not None and value.dtype == object:
            return self._size_element(onnx_name, value, index, t.dtype)
        return Load(self.tensor(onnx_name), tuple(index), t.dtype)

    def _size_element(
        self, onnx_name: str, value: np.ndarray, index: Sequence[str | Expr], dtype: str
    ) -> Expr:
        """An element of a symbolic value (`frontend.symbolic_graph`) at a constant
        index, as the value of the sizes it holds (an axis of one element is read at 0
        whatever indexes it)."""
        index = ["0" if n == 1 else i for i, n in zip(index, value.shape, strict=True)]
        if not all(isinstance(i, str) and i.lstrip("-").isdigit() for i in index):
            raise self.unsupported(
                f"'{onnx_name}' holds values of the symbolic sizes and is indexed by "
                f"{list(map(str, index))}; only constant positions are supported"
            )
        element = value[tuple(int(i) for i in index)]  # type: ignore[arg-type]
        return self.const(element if isinstance(element, Dim) else int(element), dtype)

    def load_temp(self, name: str, index: Sequence[str | Expr]) -> Load:
        return Load(name, tuple(index), self._b.tensors[name].dtype)

    def broadcast_load(
        self, onnx_name: str, out_dims: Sequence[str], out_shape: Sequence[int]
    ) -> Load:
        """Load with numpy (multidirectional) broadcasting onto the output's dims."""
        t = self.type(onnx_name)
        offset = len(out_dims) - t.rank
        index = [
            "0" if broadcast(t.shape[a], out_shape[offset + a]) else out_dims[offset + a]
            for a in range(t.rank)
        ]
        return self.load(onnx_name, index)

    @staticmethod
    def const(value: float | int | bool | Dim, dtype: str) -> Expr:
        """A constant, or the value of a symbolic size (`size_value`)."""
        if isinstance(value, Dim):
            return size_value(value, dtype)
        return const(value, dtype)


#: a size as the graph holds it: a number, or a symbolic `Dim`
Size = int | Dim


@functools.lru_cache(maxsize=4096)
def extent(size: Size) -> Extent:
    """A kernel extent for a graph size: the number, or a symbolic size's isl text
    (a product of sizes named as its derived parameter, `batch__seq`)."""
    if isinstance(size, Dim):
        return to_isl([size]).exprs[0]
    return int(size)


def static_one(size: Size) -> bool:
    """Whether an axis has the static size 1. A symbolic size counts as not 1: an axis
    broadcast by numpy's rule is a static 1 in the importer's types, and where a
    symbolic one is 1 at run time, indexing it by 0 or by its dim is the same."""
    return not isinstance(size, Dim) and size == 1


def size_value(size: Dim, dtype: str) -> Expr:
    """A symbolic size as a value of `dtype` (an average's count): its terms as products
    of sizes, each atom (a size, or a floor division of sizes) read from the kernel's
    parameters (`Iter` of its isl text), so that no derived size is needed for it."""
    total: Expr | None = None
    for mono, coef in size.terms:
        term: Expr = const(coef, "int64")
        for atom in mono:
            term = Binary("mul", term, Iter(to_isl([Dim((((atom,), 1),))]).exprs[0]), "int64")
        total = term if total is None else Binary("add", total, term, "int64")
    assert total is not None
    return as_dtype(total, dtype)


def for_all_sizes(choice: Callable[[], bool]) -> bool:
    """A lowering choice that depends on sizes (a Winograd conv over a large image),
    taken only where it holds for every size: a comparison of symbolic sizes that their
    bounds leave open counts as not holding, and the other definition, valid at any
    size, is used."""
    try:
        return choice()
    except SymbolicShapeError:
        return False


def broadcast(size: Size, onto: Size) -> bool:
    """Whether an axis of `size` is broadcast onto one of size `onto` (indexed by 0)."""
    return static_one(size) and not static_one(onto)


def as_dtype(expr: Expr, dtype: str) -> Expr:
    return expr if expr.dtype == dtype else Cast(expr, dtype)


def acc_dtype(dtype: str) -> str:
    """The dtype sums, products and statistics accumulate in: float16 in float32, any
    other dtype in itself."""
    return "float32" if dtype == "float16" else dtype


def box_statement(
    ctx: LowerContext,
    name: str,
    dims: Sequence[str],
    extents: Sequence[int],
    tensor: str,
    index: Sequence[str],
    expr: Expr,
    where: Sequence[str] = (),
) -> Statement:
    """tensor[index] = expr over the box of `extents` (restricted by `where`)."""
    domain = ctx.domain(name, dims, extents, " and ".join(where))
    return Statement(name, tuple(dims), domain, tensor, tuple(index), expr)


def reduction(
    ctx: LowerContext,
    base: str,
    out: tuple[Sequence[str], Sequence[int]],
    red: tuple[Sequence[str], Sequence[int]],
    tensor: str,
    index: Sequence[str],
    expr: Expr,
    combiner: str,
    where: Sequence[str] = (),
    start: Expr | None = None,
) -> list[Statement]:
    """The init statement (over the output dims `out`, writing `start`, by default the
    combiner's identity) and the reduction statement (over `out` then `red`, restricted by
    `where`) combining `expr` into `tensor[index]`. When nothing is reduced (an empty axis
    or output) only the start value is written, by a plain statement."""
    out_dims, out_extents = out
    red_dims, red_extents = red
    if start is None:
        start = const(identity(combiner, expr.dtype), expr.dtype)  # type: ignore[arg-type]
    start = as_dtype(start, expr.dtype)
    if math.prod(out_extents) * math.prod(red_extents) == 0:
        name = ctx.statement_name(f"{base}_empty")
        domain = ctx.domain(name, out_dims, out_extents)
        return [Statement(name, tuple(out_dims), domain, tensor, tuple(index), start)]
    name = ctx.statement_name(base)
    init = ctx.statement_name(f"{base}_init")
    dims = (*out_dims, *red_dims)
    domain = ctx.domain(name, dims, (*out_extents, *red_extents), " and ".join(where))
    return [
        Statement(
            init,
            tuple(out_dims),
            ctx.domain(init, out_dims, out_extents),
            tensor,
            tuple(index),
            start,
            init_of=name,
        ),
        Statement(name, dims, domain, tensor, tuple(index), expr, reduction=combiner),
    ]


def lower_group(
    graph: Graph,
    nodes: Sequence[str],
    inputs: Sequence[str],
    outputs: Sequence[str],
    name: str = "kernel",
    config: LowerConfig | None = None,
) -> Kernel:
    """One kernel computing `outputs` from `inputs` with the given nodes (in order)."""
    builder = _Builder(graph, identifier(name), config or LowerConfig())
    statements: list[Statement] = []
    for tensor in inputs:
        t = graph.types[tensor]
        if tensor in graph.constants and graph.constants[tensor].dtype == object:
            continue  # a symbolic value: its loads are the sizes' values (`LowerContext.load`)
        kid = builder.tensor_id(tensor)
        if tensor in graph.constants:
            builder.tensors[kid] = Tensor(
                kid, t.shape, t.dtype, Role.CONSTANT, graph.constants[tensor], source=tensor
            )
        else:
            shape = tuple(extent(d) for d in t.shape)
            builder.tensors[kid] = Tensor(kid, shape, t.dtype, Role.INPUT, source=tensor)
    for node_name in nodes:
        node = graph.node_by_name[node_name]
        fn = LOWERINGS.get(node.op_type)
        if fn is None:
            raise UnsupportedOpError(
                f"{node.label} in model '{graph.name}': no polyhedral lowering yet",
                ((node.name, node.op_type, "no lowering"),),
            )
        for out in node.outputs:
            if out:
                kid = builder.tensor_id(out)
                role = Role.OUTPUT if out in outputs else Role.TEMP
                t = graph.types[out]
                shape = tuple(extent(d) for d in t.shape)
                builder.tensors[kid] = Tensor(kid, shape, t.dtype, role, source=out)
        statements.extend(fn(LowerContext(builder, node)))
    return Kernel(builder.name, builder.tensors, tuple(statements))


def floordiv_text(text: str, divisor: int) -> str:
    """floor(text / divisor) for a positive constant divisor."""
    return text if divisor == 1 else f"floor({parens(text)}/{divisor})"


def mod_text(text: str, divisor: int) -> str:
    """text mod divisor (non-negative), without isl's `mod`: `e - c*floor(e/c)`."""
    if divisor == 1:
        return "0"
    return f"{text} - {divisor}*{floordiv_text(text, divisor)}"


def copy_statement(
    ctx: LowerContext,
    index: Sequence[str | Expr],
    output: int = 0,
    where: Sequence[str] = (),
    base: str | None = None,
    source: int = 0,
) -> Statement:
    """output[dims] = input[index] over the output's box (restricted by `where`)."""
    out = ctx.output_type(output)
    dims = ctx.dims(out.rank)
    name = ctx.statement_name(base)
    domain = ctx.domain(name, dims, out.shape, " and ".join(where))
    value = ctx.load(ctx.node.inputs[source], index)
    return Statement(name, dims, domain, ctx.output(output), dims, value)
