"""Kernels written by hand, in a compact tensor-expression notation.

    k = kernel(
        "Y[i, j] += A[i, k] * B[k, j]",
        "C[i, j] = max(Y[i, j], 0)",
        A=(128, 128), B=(128, 128), name="mm_relu",
    )

Each statement is `T[index, ...] op expression [if condition]`:

- `op` is `=`, or a reduction: `+=` (sum), `*=` (prod), `max=`, `min=`. A reduction into a
  tensor no earlier statement wrote gets an init statement `<stmt>_init` (`init_of=<stmt>`)
  writing the combiner's identity, placed right before it; a reduction into a tensor
  written earlier accumulates onto its values.
- Indices are affine in the iteration variables: `+`, `-`, `*` by a constant, integer
  constants, `//` and `%` by a positive constant (isl `floor(e/c)`); an index that loads
  from a tensor (`A[I[i]]`) is an indirect load.
- The expression: loads, numbers, `inf`, iteration variables, `+ - * / % **`, unary `-`,
  comparisons, `and` / `or` / `not`, `x if c else y`, and the calls `max min exp log sqrt
  erf tanh pow floor ceil abs sigmoid relu where(c, a, b)`. `/` is true division (integer
  operands are made float), `%` is C's fmod (the IR's `mod`). Number literals take the type
  of the operand they meet; the result is cast to the written tensor's dtype.
- `if condition` restricts the domain (affine comparisons joined by `and` / `or` / `not`),
  e.g. a triangle `L[i, j] = A[i, j] if j <= i`. A reduction's init keeps the conjuncts
  that mention only the written variables.

Iteration variables are the names used in indices (and in the expression or condition)
that are not tensors. A variable used as a bare index at position p of a tensor T of known
shape has extent `T.shape[p]`; every such use must agree (else InputError naming the
variable and the tensors), or `extents={"i": 14}` fixes it. The domain is the box of the
extents (and the condition); every access is checked to stay within its tensor.

Tensors: keyword arguments give input shapes (a tuple, or an int for 1-D) or constant
values (numpy arrays). A written tensor's shape comes from its left-hand side's bare
variables unless given; it is an OUTPUT unless a statement after its last write reads it
(then TEMP), and `outputs=` overrides that. dtypes: `dtype` for all, `dtypes` per tensor.

Statements are named after the tensor they write (uniquified); dims are the left-hand
side's variables in order, then the remaining ones in order of appearance.

`kernel_from_node` builds the kernel of one ONNX node through the real frontend and
lowering, for comparing hand-written and lowered kernels.
"""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import islpy as isl
import numpy as np

from polytile.errors import InputError
from polytile.names import unique_name
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import (
    Cast,
    Const,
    Expr,
    Iter,
    Load,
    binary,
    const,
    identity,
    loads,
    select,
    unary,
)
from polytile.poly.ir.kernel import Kernel, Role, Statement, Tensor

if TYPE_CHECKING:
    from polytile.frontend import OptimizeConfig
    from polytile.poly.lower.base import LowerConfig

__all__ = ["kernel", "kernel_from_node"]

REDUCTIONS = {"+=": "sum", "*=": "prod", "max=": "max", "min=": "min"}
#: unary math calls (name in the DSL → IR op)
UNARY_CALLS = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "erf": "erf",
    "tanh": "tanh",
    "floor": "floor",
    "ceil": "ceil",
    "abs": "abs",
    "sigmoid": "sigmoid",
    "relu": "relu",
}
#: math calls whose result is a float even for integer operands
FLOAT_CALLS = frozenset({"exp", "log", "sqrt", "erf", "tanh", "sigmoid"})
CALLS = frozenset({*UNARY_CALLS, "max", "min", "pow", "where"})
CONSTANTS = {"inf": math.inf, "nan": math.nan}
#: words isl's parser reserves: never names of tensors or variables
ISL_WORDS = frozenset(
    [
        "exists",
        "mod",
        "floor",
        "ceil",
        "min",
        "max",
        "and",
        "or",
        "not",
        "infty",
        "true",
        "false",
        "rat",
        "implies",
        "NaN",
    ]
)

_ASSIGN = re.compile(r"^\s*(?P<lhs>[^=]*?)\s*(?P<op>max=|min=|\+=|\*=|=)(?!=)\s*(?P<rhs>.*)$", re.S)
_BINOPS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.Mod: "mod",
    ast.Pow: "pow",
}
_CMPOPS = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
_ISL_CMP = {ast.Eq: "=", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


class _Fail(Exception):
    """A problem in one statement; `kernel` adds the statement's text."""


# --- tensors ----------------------------------------------------------------------------


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...] | None
    dtype: str
    value: np.ndarray | None = None
    writes: list[int] = field(default_factory=list)  # statement positions writing it
    reads: list[int] = field(default_factory=list)  # statement positions reading it


def _declare(
    tensors: Mapping[str, Any], dtype: str, dtypes: Mapping[str, str], where: str
) -> dict[str, _Tensor]:
    out = {}
    for name, spec in tensors.items():
        _check_name(name, "tensor", where)
        if isinstance(spec, np.ndarray):
            value = spec.astype(dtypes[name]) if name in dtypes else spec
            out[name] = _Tensor(name, tuple(value.shape), value.dtype.name, np.array(value))
            continue
        shape = (spec,) if isinstance(spec, int | np.integer) else spec
        try:
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise InputError(
                f"{where}: tensor '{name}' must be given a shape (tuple of ints) or a numpy "
                f"array, got {spec!r}"
            ) from None
        if any(d < 0 for d in shape):
            raise InputError(f"{where}: tensor '{name}' has a negative extent in {shape}")
        out[name] = _Tensor(name, shape, _dtype(dtypes.get(name, dtype), where))
    return out


def _dtype(value: str, where: str) -> str:
    try:
        return np.dtype(value).name
    except TypeError:
        raise InputError(f"{where}: unknown dtype {value!r}") from None


def _check_name(name: str, what: str, where: str) -> None:
    if not name.isidentifier() or name in ISL_WORDS:
        raise InputError(f"{where}: '{name}' cannot name a {what}")


def _check_local(name: str, what: str) -> None:
    if not name.isidentifier() or name in ISL_WORDS:
        raise _Fail(f"'{name}' cannot name a {what} (an isl keyword)")


# --- one statement ------------------------------------------------------------------------


@dataclass
class _Stmt:
    """What one statement's text says, before naming and typing it."""

    text: str
    tensor: str
    combiner: str | None
    lhs: list[ast.expr]
    rhs: ast.expr
    guard: ast.expr | None


def _split_guard(rhs: str) -> tuple[str, str | None]:
    """`expr if cond` → (expr, cond); a Python conditional `a if c else b` stays whole."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(rhs).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        raise _Fail(f"cannot tokenize the expression: {exc}") from None
    depth, ifs, last_else = 0, [], -1
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in ("(", "[", "{"):
            depth += 1
        elif tok.type == tokenize.OP and tok.string in (")", "]", "}"):
            depth -= 1
        elif tok.type == tokenize.NAME and depth == 0 and tok.string in ("if", "else"):
            if tok.string == "if":
                ifs.append(tok.start[1])
            else:
                last_else = tok.start[1]
    guards = [col for col in ifs if col > last_else]
    if not guards:
        return rhs, None
    col = guards[-1]
    return rhs[:col], rhs[col + 2 :]


def _parse(text: str) -> _Stmt:
    flat = " ".join(text.split())
    found = _ASSIGN.match(flat)
    if found is None:
        raise _Fail("expected `T[index] = expression` (or +=, *=, max=, min=)")
    op, rhs_text = found["op"], found["rhs"]
    if re.search(r"[-/%&|^@<>!]$", found["lhs"]):
        raise _Fail(f"unsupported assignment '{found['lhs'][-1]}{op}' (use =, +=, *=, max=, min=)")
    lhs = _parse_python(found["lhs"], "left-hand side")
    if not (isinstance(lhs, ast.Subscript) and isinstance(lhs.value, ast.Name)):
        raise _Fail(f"the left-hand side '{found['lhs']}' must be a tensor element T[i, ...]")
    expr_text, guard_text = _split_guard(rhs_text)
    if not expr_text.strip():
        raise _Fail("the right-hand side is empty")
    rhs = _parse_python(expr_text, "right-hand side")
    guard = _parse_python(guard_text, "condition") if guard_text is not None else None
    return _Stmt(text, lhs.value.id, REDUCTIONS.get(op), _index_list(lhs), rhs, guard)


def _parse_python(text: str, what: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise _Fail(f"syntax error in the {what} '{text.strip()}': {exc.msg}") from None


def _index_list(sub: ast.Subscript) -> list[ast.expr]:
    index = sub.slice
    return list(index.elts) if isinstance(index, ast.Tuple) else [index]


def _int(value: int) -> tuple[str, int, bool]:
    return str(value), value, value >= 0


def _wrap(text: str, atom: bool) -> str:
    return text if atom else f"({text})"


class _Builder:
    """Converts one parsed statement into typed IR pieces, collecting its variables."""

    def __init__(self, stmt: _Stmt, tensors: Mapping[str, _Tensor], default: str) -> None:
        self.stmt = stmt
        self.tensors = tensors
        self.float_dtype = default if np.dtype(default).kind == "f" else "float32"
        self.vars: dict[str, None] = {}  # in order of appearance
        self.bare: dict[str, list[tuple[str, int]]] = {}  # var → (tensor, position) uses
        self.loaded: list[str] = []

    # --- affine index expressions -----------------------------------------------------
    def index(self, node: ast.expr, tensor: str, pos: int) -> str | Expr:
        if any(isinstance(n, ast.Subscript) for n in ast.walk(node)):
            value, _ = self.expr(node)  # an indirect index: any integer expression
            return value
        if isinstance(node, ast.Name) and node.id not in CONSTANTS:
            self.bare.setdefault(self.variable(node.id), []).append((tensor, pos))
        text, _ = self.affine(node)
        return text

    def variable(self, name: str) -> str:
        if name in self.tensors:
            raise _Fail(f"tensor '{name}' is used without an index")
        if name in CALLS:
            raise _Fail(f"'{name}' is a function, not a variable")
        _check_local(name, "variable")
        self.vars.setdefault(name, None)
        return name

    def affine(self, node: ast.expr) -> tuple[str, bool]:
        """isl text of an affine expression, and whether it is constant."""
        text, value, _ = self.aff(node)
        return text, value is not None

    def aff(self, node: ast.expr) -> tuple[str, int | None, bool]:
        """(isl text, its value if constant, whether the text is an atom)."""
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise _Fail(f"index '{ast.unparse(node)}' is not an integer")
            return _int(node.value)
        if isinstance(node, ast.Name):
            return self.variable(node.id), None, True
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            text, value, atom = self.aff(node.operand)
            if isinstance(node.op, ast.UAdd):
                return text, value, atom
            return _int(-value) if value is not None else (f"-{_wrap(text, atom)}", None, False)
        if isinstance(node, ast.BinOp):
            a, av, a_atom = self.aff(node.left)
            b, bv, b_atom = self.aff(node.right)
            if isinstance(node.op, ast.Add | ast.Sub):
                add = isinstance(node.op, ast.Add)
                if av is not None and bv is not None:
                    return _int(av + bv if add else av - bv)
                if add:
                    return f"{a} + {_wrap(b, not b.startswith('-'))}", None, False
                return f"{a} - {_wrap(b, b_atom)}", None, False
            if isinstance(node.op, ast.Mult):
                if av is not None and bv is not None:
                    return _int(av * bv)
                if av is None and bv is None:
                    raise _Fail(f"index '{ast.unparse(node)}' is not affine (variable × variable)")
                c, x, x_atom = (av, b, b_atom) if av is not None else (bv, a, a_atom)
                return f"{c}*{_wrap(x, x_atom)}", None, False
            if isinstance(node.op, ast.FloorDiv | ast.Mod):
                if bv is None or bv <= 0:
                    raise _Fail(
                        f"index '{ast.unparse(node)}': // and % need a positive constant divisor"
                    )
                if av is not None:
                    return _int(av // bv if isinstance(node.op, ast.FloorDiv) else av % bv)
                floor = f"floor({_wrap(a, a_atom)}/{bv})"
                if isinstance(node.op, ast.FloorDiv):
                    return floor, None, True
                return f"{_wrap(a, a_atom)} - {bv}*{floor}", None, False
        raise _Fail(f"index '{ast.unparse(node)}' is not an affine expression")

    # --- the domain condition ---------------------------------------------------------
    def condition(self, node: ast.expr) -> str:
        if isinstance(node, ast.BoolOp):
            joiner = " and " if isinstance(node.op, ast.And) else " or "
            return joiner.join(f"({self.condition(v)})" for v in node.values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return f"not ({self.condition(node.operand)})"
        if isinstance(node, ast.Compare):
            parts = [self.affine(node.left)[0]]
            for op, right in zip(node.ops, node.comparators, strict=True):
                if type(op) not in _ISL_CMP:
                    raise _Fail(f"condition '{ast.unparse(node)}': unsupported comparison")
                parts += [_ISL_CMP[type(op)], self.affine(right)[0]]
            return " ".join(parts)
        raise _Fail(f"condition '{ast.unparse(node)}' is not an affine comparison")

    # --- value expressions: (expr, weak) where weak = made of literals only -----------
    def expr(self, node: ast.expr) -> tuple[Expr, bool]:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                return const(node.value, "bool"), True
            if isinstance(node.value, int):
                return const(node.value, "int64"), True
            if isinstance(node.value, float):
                return const(node.value, "float64"), True
            raise _Fail(f"unsupported constant {node.value!r}")
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS and node.id not in self.vars:
                return const(CONSTANTS[node.id], "float64"), True
            return Iter(self.variable(node.id)), False
        if isinstance(node, ast.Subscript):
            return self.load(node), False
        if isinstance(node, ast.UnaryOp):
            x, weak = self.expr(node.operand)
            if isinstance(node.op, ast.UAdd):
                return x, weak
            if isinstance(node.op, ast.USub):
                return unary("neg", x), weak
            if isinstance(node.op, ast.Not):
                return unary("not", self.as_bool(x)), weak
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            op = _BINOPS[type(node.op)]
            a, b, weak = self.unify(self.expr(node.left), self.expr(node.right))
            if op == "div" and np.dtype(a.dtype).kind != "f":
                target = "float64" if weak else self.float_dtype
                a, b = Cast(a, target), Cast(b, target)
            return binary(op, a, b), weak
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            raise _Fail("'//' is for indices; write floor(a / b) in an expression")
        if isinstance(node, ast.Compare):
            result: Expr | None = None
            left = self.expr(node.left)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                if type(op) not in _CMPOPS:
                    raise _Fail(f"unsupported comparison in '{ast.unparse(node)}'")
                right = self.expr(right_node)
                a, b, _ = self.unify(left, right)
                term = binary(_CMPOPS[type(op)], a, b)
                result = term if result is None else binary("and", result, term)
                left = right
            assert result is not None
            return result, False
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            values = [self.as_bool(self.expr(v)[0]) for v in node.values]
            out = values[0]
            for v in values[1:]:
                out = binary(op, out, v)
            return out, False
        if isinstance(node, ast.IfExp):
            return self.choose(node.test, node.body, node.orelse)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise _Fail(f"unsupported expression '{ast.unparse(node)}'")

    def load(self, node: ast.Subscript) -> Load:
        if not isinstance(node.value, ast.Name):
            raise _Fail(f"'{ast.unparse(node)}' does not index a tensor")
        name = node.value.id
        tensor = self.tensors.get(name)
        if tensor is None or tensor.shape is None:
            raise _Fail(
                f"reads tensor '{name}', which has no shape and is not written by an "
                f"earlier statement (give {name}=(...))"
            )
        index = _index_list(node)
        if len(index) != len(tensor.shape):
            raise _Fail(
                f"'{ast.unparse(node)}' has {len(index)} indices, but '{name}' has rank "
                f"{len(tensor.shape)}"
            )
        self.loaded.append(name)
        return Load(name, tuple(self.index(i, name, p) for p, i in enumerate(index)), tensor.dtype)

    def call(self, node: ast.Call) -> tuple[Expr, bool]:
        fn = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if fn not in CALLS or node.keywords:
            known = ", ".join(sorted(CALLS))
            raise _Fail(f"unknown function '{fn}' (known: {known})")
        arity = {"where": (3, 3), "pow": (2, 2), "max": (2, 99), "min": (2, 99)}
        lo, hi = arity.get(fn, (1, 1))
        if not lo <= len(node.args) <= hi:
            raise _Fail(f"{fn}() takes {lo if lo == hi else f'{lo} or more'} arguments")
        if fn == "where":
            return self.choose(*node.args)
        args = [self.expr(a) for a in node.args]
        if fn in UNARY_CALLS:
            [(x, weak)] = args
            if fn in FLOAT_CALLS and np.dtype(x.dtype).kind != "f":
                x = self.retype(x, "float64") if weak else Cast(x, self.float_dtype)
            return unary(UNARY_CALLS[fn], x), weak
        out = args[0]
        for arg in args[1:]:
            a, b, weak = self.unify(out, arg)
            out = (binary(fn, a, b), weak)
        return out

    def choose(self, cond: ast.expr, a: ast.expr, b: ast.expr) -> tuple[Expr, bool]:
        test = self.as_bool(self.expr(cond)[0])
        x, y, weak = self.unify(self.expr(a), self.expr(b))
        return select(test, x, y), weak

    @staticmethod
    def as_bool(x: Expr) -> Expr:
        return x if x.dtype == "bool" else Cast(x, "bool")

    @staticmethod
    def retype(x: Expr, dtype: str) -> Expr:
        if x.dtype == dtype:
            return x
        if isinstance(x, Const):
            return const(x.value, dtype)
        return Cast(x, dtype)

    def unify(self, left: tuple[Expr, bool], right: tuple[Expr, bool]) -> tuple[Expr, Expr, bool]:
        """Both operands in one dtype: literals adapt to the other side; otherwise an
        integer meeting a float becomes that float, and numpy promotion decides the rest."""
        (a, wa), (b, wb) = left, right
        if a.dtype == b.dtype:
            return a, b, wa and wb
        ka, kb = np.dtype(a.dtype).kind, np.dtype(b.dtype).kind
        if wa != wb:
            weak, strong = (a, b) if wa else (b, a)
            target = strong.dtype
            if np.dtype(weak.dtype).kind == "f" and np.dtype(target).kind != "f":
                target = self.float_dtype
            out = self.retype(weak, target), self.retype(strong, target)
            return (out if wa else out[::-1]) + (False,)
        if ka == "f" and kb != "f":
            target = a.dtype
        elif kb == "f" and ka != "f":
            target = b.dtype
        else:
            target = np.promote_types(a.dtype, b.dtype).name
        return self.retype(a, target), self.retype(b, target), wa and wb


# --- the kernel ---------------------------------------------------------------------------


def kernel(
    *statements: str,
    name: str = "kernel",
    dtype: str = "float32",
    dtypes: Mapping[str, str] | None = None,
    outputs: Sequence[str] | None = None,
    extents: Mapping[str, int] | None = None,
    shapes: Mapping[str, Any] | None = None,
    **tensors: Any,
) -> Kernel:
    """A Kernel from statements in the tensor-expression notation (see the module doc).

    Keyword arguments name the input tensors: a shape, or a numpy array for a constant
    (`shapes=` takes the same for names that clash with these parameters)."""
    where = f"kernel '{name}'"
    if not statements:
        raise InputError(f"{where}: give at least one statement")
    dtypes = dict(dtypes or {})
    declared = {**dict(shapes or {}), **tensors}
    table = _declare(declared, _dtype(dtype, where), dtypes, where)
    for tname in dtypes:
        if tname not in declared and not any(_writes(s, tname) for s in statements):
            raise InputError(f"{where}: dtypes names '{tname}', which is not a tensor")
    extents = dict(extents or {})
    built: list[Statement] = []
    taken: set[str] = set()
    for position, text in enumerate(statements):
        if not isinstance(text, str):
            raise InputError(f"{where}: statement {position} is not a string: {text!r}")
        try:
            built.extend(_statement(text, position, table, dtype, dtypes, extents, taken))
        except _Fail as exc:
            raise InputError(f"{where}, statement '{text}': {exc}") from None
    return Kernel(name, _roles(table, outputs, where), tuple(built))


def _writes(text: str, tensor: str) -> bool:
    return re.match(rf"\s*{re.escape(tensor)}\s*\[", text) is not None


def _statement(
    text: str,
    position: int,
    table: dict[str, _Tensor],
    dtype: str,
    dtypes: Mapping[str, str],
    extents: Mapping[str, int],
    taken: set[str],
) -> list[Statement]:
    parsed = _parse(text)
    tname = parsed.tensor
    _check_local(tname, "tensor")
    target = table.get(tname)
    if target is not None and target.value is not None:
        raise _Fail(f"writes '{tname}', which is a constant")
    if target is not None and target.reads and not target.writes:
        raise _Fail(f"writes '{tname}', which an earlier statement reads as an input")
    if target is None:
        target = _Tensor(tname, None, _dtype(dtypes.get(tname, dtype), ""))
        table[tname] = target
    b = _Builder(parsed, table, dtype)
    if target.shape is not None and len(parsed.lhs) != len(target.shape):
        raise _Fail(
            f"'{tname}' has rank {len(target.shape)}, but the left-hand side gives "
            f"{len(parsed.lhs)} indices"
        )
    lhs_index = []
    for pos, node in enumerate(parsed.lhs):
        if any(isinstance(n, ast.Subscript) for n in ast.walk(node)):
            raise _Fail(f"the written index '{ast.unparse(node)}' must be affine (no loads)")
        if target.shape is not None and isinstance(node, ast.Name):
            b.bare.setdefault(b.variable(node.id), []).append((tname, pos))
        lhs_index.append(b.affine(node)[0])
    lhs_vars = list(b.vars)
    value, _ = b.expr(parsed.rhs)
    guard = b.condition(parsed.guard) if parsed.guard is not None else ""
    dims = list(b.vars)
    sizes = [_extent(v, b.bare, table, extents) for v in dims]
    if target.shape is None:
        shape = []
        for node in parsed.lhs:
            if not isinstance(node, ast.Name):
                raise _Fail(
                    f"cannot infer the shape of '{tname}' from the index '{ast.unparse(node)}'; "
                    f"give {tname}=(...)"
                )
            shape.append(sizes[dims.index(node.id)])
        target.shape = tuple(shape)
    if value.dtype != target.dtype:
        value = b.retype(value, target.dtype)
    combiner = parsed.combiner
    first_write = not target.writes
    stmt_name = unique_name(tname, taken)
    out: list[Statement] = []
    if combiner is not None and first_write:
        init_name = unique_name(f"{stmt_name}_init", taken)
        init_guard = _conjuncts_within(b, parsed.guard, set(lhs_vars))
        init_sizes = [sizes[dims.index(v)] for v in lhs_vars]
        out.append(
            Statement(
                init_name,
                tuple(lhs_vars),
                ih.box(init_name, lhs_vars, init_sizes, init_guard),
                tname,
                tuple(lhs_index),
                const(identity(combiner, target.dtype), target.dtype),
                init_of=stmt_name,
            )
        )
    out.append(
        Statement(
            stmt_name,
            tuple(dims),
            ih.box(stmt_name, dims, sizes, guard),
            tname,
            tuple(lhs_index),
            value,
            reduction=combiner,
        )
    )
    for s in out:
        _check_bounds(s, table)
    for loaded in b.loaded:
        table[loaded].reads.append(position)
    target.writes.append(position)
    return out


def _extent(
    var: str,
    bare: Mapping[str, list[tuple[str, int]]],
    table: Mapping[str, _Tensor],
    extents: Mapping[str, int],
) -> int:
    if var in extents:
        return int(extents[var])
    uses = [(t, p, table[t].shape[p]) for t, p in bare.get(var, ()) if table[t].shape is not None]
    if not uses:
        raise _Fail(
            f"cannot infer the extent of '{var}': it is never a bare index of a tensor with a "
            f"known shape (pass extents={{'{var}': n}})"
        )
    sizes = {size for _, _, size in uses}
    if len(sizes) > 1:
        seen = ", ".join(f"{t}[{p}] = {size}" for t, p, size in dict.fromkeys(uses))
        raise _Fail(
            f"conflicting extents for '{var}': {seen} (pass extents={{'{var}': n}} and a "
            "condition to choose)"
        )
    return sizes.pop()


def _conjuncts_within(b: _Builder, guard: ast.expr | None, names: set[str]) -> str:
    """The top-level `and` terms of the condition that mention only `names`."""
    if guard is None:
        return ""
    terms = (
        guard.values if isinstance(guard, ast.BoolOp) and isinstance(guard.op, ast.And) else [guard]
    )
    kept = [
        f"({b.condition(t)})"
        for t in terms
        if {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} <= names
    ]
    return " and ".join(kept)


def _check_bounds(s: Statement, table: Mapping[str, _Tensor]) -> None:
    accesses = [(s.tensor, s.index, s.write_map(), "writes")]
    for load in loads(s.expr):
        if all(isinstance(i, str) for i in load.index):
            text = ih.access(s.name, s.dims, load.tensor, [str(i) for i in load.index])
            access = ih.parse_map(text).intersect_domain(s.domain_set())
            accesses.append((load.tensor, load.index, access, "reads"))
    for tname, index, access, verb in accesses:
        shape = table[tname].shape
        assert shape is not None
        dims = [f"a{n}" for n in range(len(shape))]
        inside = ih.parse_set(ih.box(tname, dims, shape))
        outside = access.subtract_range(inside)
        if not outside.is_empty():
            point = outside.domain().sample_point()
            coords = [
                f"{d} = {point.get_coordinate_val(isl.dim_type.set, n).to_python()}"
                for n, d in enumerate(s.dims)
            ]
            raise _Fail(
                f"{verb} {tname}[{', '.join(index)}] outside its shape {list(shape)} "
                f"(at {', '.join(coords)})"
            )


def _roles(
    table: Mapping[str, _Tensor], outputs: Sequence[str] | None, where: str
) -> dict[str, Tensor]:
    if outputs is not None:
        for o in outputs:
            if o not in table or not table[o].writes:
                raise InputError(f"{where}: outputs names '{o}', which no statement writes")
    result = {}
    for t in table.values():
        assert t.shape is not None
        if t.value is not None:
            role = Role.CONSTANT
        elif not t.writes:
            if not t.reads:
                raise InputError(f"{where}: tensor '{t.name}' is declared but never used")
            role = Role.INPUT
        elif outputs is not None:
            role = Role.OUTPUT if t.name in outputs else Role.TEMP
        else:
            last = max(t.writes)
            role = Role.TEMP if any(r > last for r in t.reads) else Role.OUTPUT
        result[t.name] = Tensor(t.name, t.shape, t.dtype, role, t.value)
    return result


# --- one ONNX node -----------------------------------------------------------------------


def kernel_from_node(
    node: Any,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    opset: int = 17,
    *,
    dtype: str = "float32",
    dtypes: Mapping[str, str] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    passes: OptimizeConfig | None = None,
    lowering: LowerConfig | None = None,
) -> Kernel:
    """The kernel of a single ONNX node (a NodeProto, or a ModelProto), through the real
    frontend (import, optimize, partition) and lowering.

    For a NodeProto, `input_shapes` gives every non-constant input's shape, `dtype` /
    `dtypes` their element types, and `initializers` constant inputs (numpy arrays).
    `passes` selects the frontend passes (all by default), e.g. to study a kernel that a
    pass would rewrite, and `lowering` the compute definitions. Kernel tensors are renamed
    isl-safe; `kernel.by_source(onnx_name)` finds them."""
    import onnx

    from polytile.frontend import import_model, optimize, partition
    from polytile.poly.lower import lower, lower_group

    shapes = dict(input_shapes or {})
    if isinstance(node, onnx.ModelProto):
        model, given = node, shapes
    elif isinstance(node, onnx.NodeProto):
        model = _one_node_model(
            node, shapes, opset, dtype, dict(dtypes or {}), dict(initializers or {})
        )
        given = {}
    else:
        raise InputError(f"kernel_from_node takes an onnx NodeProto or ModelProto, got {node!r}")
    graph = optimize(import_model(model, input_shapes=given), passes)
    groups = partition(graph).groups
    if len(groups) == 1:
        return lower(graph, groups[0], lowering)
    if not groups:
        raise InputError(
            f"model '{graph.name}': nothing is left to compute after optimization "
            "(the node is a view or folds to a constant)"
        )
    nodes = [n for g in groups for n in g.nodes]
    produced = {t for g in groups for t in g.outputs}
    inputs = list(dict.fromkeys(t for g in groups for t in g.inputs if t not in produced))
    name = f"{graph.name}_node"
    return lower_group(graph, nodes, inputs, graph.outputs, name=name, config=lowering)


def _one_node_model(
    node: Any,
    shapes: dict[str, Sequence[int]],
    opset: int,
    dtype: str,
    dtypes: dict[str, str],
    initializers: dict[str, np.ndarray],
) -> Any:
    from onnx import helper, numpy_helper

    what = f"node '{node.name or node.op_type}' ({node.op_type})"
    names = list(dict.fromkeys(i for i in node.input if i))
    for given in shapes:
        if given not in names or given in initializers:
            raise InputError(f"input_shapes names '{given}', which is not an input of {what}")
    inputs = []
    for name in names:
        if name in initializers:
            continue
        if name not in shapes:
            raise InputError(f"{what}: give the shape of input '{name}' in input_shapes")
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtypes.get(name, dtype)))
        inputs.append(helper.make_tensor_value_info(name, elem, [int(d) for d in shapes[name]]))
    outputs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
    graph = helper.make_graph(
        [node],
        node.name or node.op_type.lower(),
        inputs,
        outputs,
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
