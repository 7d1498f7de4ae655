"""Integer index arithmetic of one kernel function: isl AST expressions as i64 values.

Every value is known by its affine form over opaque values (loop variables, loads,
divisions that do not simplify): `sum(coef * atom) + const`. Equal forms share one value
per block, and a form is built as its constant-free part plus the constant, so the
unrolled calls of a block share their index arithmetic and differ by one `add` each;
floor divisions and remainders of forms whose every coefficient the divisor divides fold
away (packed layouts' `(32*t + 16) // 32`). Python emits less IR and LLVM cleans less.

Values are reused only in the block that defined them: the emitter appends to blocks
(or inserts before their terminator), so an earlier value of the builder's block always
precedes the insertion point; an operand's form reaches only values that dominate the
operand, hence the use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from llvmlite import ir

from polytile.errors import CodegenError
from polytile.poly.ast.build import AstExpr, Int, Op, Var

from .llvm_types import I1, I64

#: an affine form: ((atom number, coefficient), ...) sorted by atom, and the constant
Form = tuple[tuple[tuple[int, int], ...], int]
_COMPARE = {"eq": "==", "le": "<=", "lt": "<", "ge": ">=", "gt": ">"}
_HOLDS: dict[str, Callable[[int], bool]] = {
    "eq": lambda d: d == 0,
    "le": lambda d: d <= 0,
    "lt": lambda d: d < 0,
    "ge": lambda d: d >= 0,
    "gt": lambda d: d > 0,
}


class Integers:
    """The i64 values of a function's index expressions, emitted through `b`."""

    def __init__(self, b: ir.IRBuilder, where: str) -> None:
        self.b = b
        self.where = where
        self._atoms: list[ir.Value] = []
        #: id(value) → its form; `_held` keeps the values alive so no id is reused
        self._forms: dict[int, Form] = {}
        self._held: list[ir.Value] = []
        #: id(block) → (the block, its values by form or by operation and operand forms)
        self._blocks: dict[int, tuple[ir.Block, dict[Hashable, ir.Value]]] = {}

    # --- forms ------------------------------------------------------------------------
    def form(self, value: ir.Value) -> Form:
        """The value's affine form (a new atom the first time an opaque value is seen)."""
        if isinstance(value, ir.Constant) and isinstance(value.constant, int):
            return ((), value.constant)
        found = self._forms.get(id(value))
        if found is None:
            found = (((len(self._atoms), 1),), 0)
            self._atoms.append(value)
            self._record(value, found)
        return found

    def value(self, form: Form) -> ir.Value:
        """A value of the form: a constant, an atom, or one built in this block."""
        terms, const = form
        if not terms:
            return ir.Constant(I64, const)
        if const == 0 and len(terms) == 1 and terms[0][1] == 1:
            return self._atoms[terms[0][0]]
        memo = self._memo()
        found = memo.get(form)
        if found is not None:
            return found
        b = self.b
        if const:
            made = b.add(self.value((terms, 0)), ir.Constant(I64, const), flags=["nsw"])
        elif len(terms) > 1:
            made = b.add(self.value((terms[:-1], 0)), self.value((terms[-1:], 0)), flags=["nsw"])
        else:
            atom, coef = terms[0]
            made = b.mul(self._atoms[atom], ir.Constant(I64, coef), flags=["nsw"])
        memo[form] = made
        self._record(made, form)
        return made

    def add(self, x: ir.Value, y: ir.Value) -> ir.Value:
        """x + y."""
        return self.value(_sum(self.form(x), self.form(y)))

    # --- AST expressions --------------------------------------------------------------
    def expr(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value:
        """The i64 value of an integer AST expression under the loop variables' values."""
        return self.value(self._form_of(e, env))

    def _form_of(self, e: AstExpr, env: Mapping[str, ir.Value]) -> Form:
        """The expression's form; only what an operation that is not affine needs is
        emitted (an affine sub-expression that folds away costs nothing)."""
        if isinstance(e, Int):
            return ((), e.value)
        if isinstance(e, Var):
            try:
                return self.form(env[e.name])
            except KeyError:
                raise CodegenError(f"{self.where}: '{e.name}' is unbound") from None
        op = e.op
        if op in _COMPARE or op in ("and", "or"):
            return self.form(self.b.zext(self.cond(e, env), I64))
        if op == "select":  # not shared: its condition is not a form
            x, y = (self.value(self._form_of(a, env)) for a in e.args[1:])
            return self.form(self.b.select(self.cond(e.args[0], env), x, y))
        forms = [self._form_of(a, env) for a in e.args]
        affine = _affine(op, forms)
        if affine is not None:
            return affine
        if op in ("fdiv_q", "pdiv_r") and not forms[1][0] and forms[1][1] > 0:
            divisor = forms[1][1]
            terms, const = forms[0]
            if all(coef % divisor == 0 for _, coef in terms):
                if op == "pdiv_r":  # the dividend is non-negative: Python's remainder
                    return (), const % divisor
                return tuple((a, c // divisor) for a, c in terms), const // divisor
        if op in ("min", "max") and not any(terms for terms, _ in forms):
            pick = min if op == "min" else max
            return (), pick(const for _, const in forms)
        memo = self._memo()
        key = (op, *forms)
        found = memo.get(key)
        if found is None:
            args = [self.value(f) for f in forms]
            found = memo[key] = self._emit(op, args)
        return self.form(found)

    def cond(self, e: AstExpr, env: Mapping[str, ir.Value]) -> ir.Value:
        """The i1 value of an AST condition."""
        b = self.b
        if isinstance(e, Op):
            if e.op in _COMPARE:
                fx, fy = (self._form_of(a, env) for a in e.args)
                terms, const = _sum(fx, _scaled(fy, -1))
                if not terms:  # decided: neither side is built
                    return ir.Constant(I1, int(_HOLDS[e.op](const)))
                return b.icmp_signed(_COMPARE[e.op], self.value(fx), self.value(fy))
            if e.op in ("and", "or"):
                parts = [self.cond(a, env) for a in e.args]
                join = b.and_ if e.op == "and" else b.or_
                return _fold(parts, join)
        return b.icmp_signed("!=", self.expr(e, env), ir.Constant(I64, 0))

    # --- internals --------------------------------------------------------------------
    def _record(self, value: ir.Value, form: Form) -> None:
        self._forms[id(value)] = form
        self._held.append(value)

    def _memo(self) -> dict[Hashable, ir.Value]:
        block = self.b.block
        entry = self._blocks.get(id(block))
        if entry is None:
            entry = self._blocks[id(block)] = (block, {})
        return entry[1]

    def _emit(self, op: str, args: list[ir.Value]) -> ir.Value:
        b = self.b
        if op == "mul":
            return b.mul(args[0], args[1], flags=["nsw"])
        if op == "min":
            return _fold(args, lambda x, y: smin(b, x, y))
        if op == "max":
            return _fold(args, lambda x, y: smax(b, x, y))
        if op == "fdiv_q":
            return floordiv(b, args[0], args[1])
        if op in ("div", "pdiv_q"):
            return b.sdiv(args[0], args[1])
        if op in ("pdiv_r", "zdiv_r"):
            return b.srem(args[0], args[1])
        raise CodegenError(f"{self.where}: isl AST operator '{op}' is not supported")


def _sum(x: Form, y: Form) -> Form:
    coefs = dict(x[0])
    for atom, coef in y[0]:
        coefs[atom] = coefs.get(atom, 0) + coef
    terms = tuple(sorted((a, c) for a, c in coefs.items() if c))
    return terms, x[1] + y[1]


def _scaled(x: Form, k: int) -> Form:
    if k == 0:
        return (), 0
    return tuple((a, c * k) for a, c in x[0]), x[1] * k


def _affine(op: str, forms: list[Form]) -> Form | None:
    """The form of an affine operation on forms; None for any other (a product of two
    non-constants included)."""
    if op == "add":
        return _sum(forms[0], forms[1])
    if op == "sub":
        return _sum(forms[0], _scaled(forms[1], -1))
    if op == "minus":
        return _scaled(forms[0], -1)
    if op == "mul":
        if not forms[0][0]:
            return _scaled(forms[1], forms[0][1])
        if not forms[1][0]:
            return _scaled(forms[0], forms[1][1])
    return None


def _fold(values: list[ir.Value], fn: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
    result = values[0]
    for value in values[1:]:
        result = fn(result, value)
    return result


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def floordiv(b: ir.IRBuilder, a: ir.Value, d: ir.Value) -> ir.Value:
    """isl's fdiv_q: the floor of a / d."""
    if isinstance(d, ir.Constant) and isinstance(d.constant, int) and d.constant > 0:
        negative = b.icmp_signed("<", a, ir.Constant(I64, 0))
        adjusted = b.select(negative, b.sub(a, ir.Constant(I64, d.constant - 1)), a)
        return b.sdiv(adjusted, d)
    q = b.sdiv(a, d)
    r = b.srem(a, d)
    inexact = b.icmp_signed("!=", r, ir.Constant(I64, 0))
    signs = b.xor(
        b.icmp_signed("<", r, ir.Constant(I64, 0)), b.icmp_signed("<", d, ir.Constant(I64, 0))
    )
    return b.sub(q, b.zext(b.and_(inexact, signs), I64))
