"""Typing of one parsed statement: affine index text for isl, the domain condition, and
the value expression as typed IR, collecting the iteration variables on the way."""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping

import numpy as np

from polytile.poly.dsl.parse import (
    CALLS,
    CONSTANTS,
    FLOAT_CALLS,
    UNARY_CALLS,
    Fail,
    ParsedStatement,
    check_local,
    index_list,
)
from polytile.poly.dsl.tensors import TensorEntry
from polytile.poly.ir.expr import Cast, Const, Expr, Iter, Load, binary, const, select, unary

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


def _int(value: int) -> tuple[str, int, bool]:
    return str(value), value, value >= 0


def _wrap(text: str, atom: bool) -> str:
    return text if atom else f"({text})"


class Builder:
    """Converts one parsed statement into typed IR pieces, collecting its variables."""

    def __init__(
        self,
        stmt: ParsedStatement,
        tensors: Mapping[str, TensorEntry],
        default: str,
        params: Collection[str] = (),
    ) -> None:
        self.stmt = stmt
        self.tensors = tensors
        #: symbolic sizes: affine expressions may use them, values may not
        self.params = frozenset(params)
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
            raise Fail(f"tensor '{name}' is used without an index")
        if name in CALLS:
            raise Fail(f"'{name}' is a function, not a variable")
        check_local(name, "variable")
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
                raise Fail(f"index '{ast.unparse(node)}' is not an integer")
            return _int(node.value)
        if isinstance(node, ast.Name):
            if node.id in self.params:
                return node.id, None, True
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
                    raise Fail(f"index '{ast.unparse(node)}' is not affine (variable × variable)")
                c, x, x_atom = (av, b, b_atom) if av is not None else (bv, a, a_atom)
                return f"{c}*{_wrap(x, x_atom)}", None, False
            if isinstance(node.op, ast.FloorDiv | ast.Mod):
                if bv is None or bv <= 0:
                    raise Fail(
                        f"index '{ast.unparse(node)}': // and % need a positive constant divisor"
                    )
                if av is not None:
                    return _int(av // bv if isinstance(node.op, ast.FloorDiv) else av % bv)
                floor = f"floor({_wrap(a, a_atom)}/{bv})"
                if isinstance(node.op, ast.FloorDiv):
                    return floor, None, True
                return f"{_wrap(a, a_atom)} - {bv}*{floor}", None, False
        raise Fail(f"index '{ast.unparse(node)}' is not an affine expression")

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
                    raise Fail(f"condition '{ast.unparse(node)}': unsupported comparison")
                parts += [_ISL_CMP[type(op)], self.affine(right)[0]]
            return " ".join(parts)
        raise Fail(f"condition '{ast.unparse(node)}' is not an affine comparison")

    # --- value expressions: (expr, weak) where weak = made of literals only -----------
    def expr(self, node: ast.expr) -> tuple[Expr, bool]:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                return const(node.value, "bool"), True
            if isinstance(node.value, int):
                return const(node.value, "int64"), True
            if isinstance(node.value, float):
                return const(node.value, "float64"), True
            raise Fail(f"unsupported constant {node.value!r}")
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS and node.id not in self.vars:
                return const(CONSTANTS[node.id], "float64"), True
            if node.id in self.params:
                raise Fail(f"the symbolic size '{node.id}' is used as a value")
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
            raise Fail("'//' is for indices; write floor(a / b) in an expression")
        if isinstance(node, ast.Compare):
            result: Expr | None = None
            left = self.expr(node.left)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                if type(op) not in _CMPOPS:
                    raise Fail(f"unsupported comparison in '{ast.unparse(node)}'")
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
        raise Fail(f"unsupported expression '{ast.unparse(node)}'")

    def load(self, node: ast.Subscript) -> Load:
        if not isinstance(node.value, ast.Name):
            raise Fail(f"'{ast.unparse(node)}' does not index a tensor")
        name = node.value.id
        tensor = self.tensors.get(name)
        if tensor is None or tensor.shape is None:
            raise Fail(
                f"reads tensor '{name}', which has no shape and is not written by an "
                f"earlier statement (give {name}=(...))"
            )
        index = index_list(node)
        if len(index) != len(tensor.shape):
            raise Fail(
                f"'{ast.unparse(node)}' has {len(index)} indices, but '{name}' has rank "
                f"{len(tensor.shape)}"
            )
        self.loaded.append(name)
        return Load(name, tuple(self.index(i, name, p) for p, i in enumerate(index)), tensor.dtype)

    def call(self, node: ast.Call) -> tuple[Expr, bool]:
        fn = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if fn not in CALLS or node.keywords:
            known = ", ".join(sorted(CALLS))
            raise Fail(f"unknown function '{fn}' (known: {known})")
        arity = {"where": (3, 3), "pow": (2, 2), "max": (2, 99), "min": (2, 99)}
        lo, hi = arity.get(fn, (1, 1))
        if not lo <= len(node.args) <= hi:
            raise Fail(f"{fn}() takes {lo if lo == hi else f'{lo} or more'} arguments")
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
