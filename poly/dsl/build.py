"""`kernel`: statements in the notation → a Kernel, one statement (and a reduction's
init) at a time, with extents inferred from bare indices and every access bounds-checked."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

import islpy as isl

from polytile.errors import InputError
from polytile.names import unique_name
from polytile.poly.dsl.convert import Builder
from polytile.poly.dsl.parse import Fail, check_local, parse_statement
from polytile.poly.dsl.tensors import TensorEntry, declare, dtype_name, params_of, roles
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import const, identity, loads
from polytile.poly.ir.kernel import Kernel, Statement


def kernel(
    *statements: str,
    name: str = "kernel",
    dtype: str = "float32",
    dtypes: Mapping[str, str] | None = None,
    outputs: Sequence[str] | None = None,
    extents: Mapping[str, int | str] | None = None,
    shapes: Mapping[str, Any] | None = None,
    **tensors: Any,
) -> Kernel:
    """A Kernel from statements in the tensor-expression notation (see `polytile.poly.dsl`).

    Keyword arguments name the input tensors: a shape, or a numpy array for a constant
    (`shapes=` takes the same for names that clash with these parameters)."""
    where = f"kernel '{name}'"
    if not statements:
        raise InputError(f"{where}: give at least one statement")
    dtypes = dict(dtypes or {})
    declared = {**dict(shapes or {}), **tensors}
    table = declare(declared, dtype_name(dtype, where), dtypes, where)
    for tname in dtypes:
        if tname not in declared and not any(_writes(s, tname) for s in statements):
            raise InputError(f"{where}: dtypes names '{tname}', which is not a tensor")
    extents = dict(extents or {})
    params = params_of(table, extents)
    built: list[Statement] = []
    taken: set[str] = set()
    for position, text in enumerate(statements):
        if not isinstance(text, str):
            raise InputError(f"{where}: statement {position} is not a string: {text!r}")
        try:
            built.extend(
                _statement(text, position, table, dtype, dtypes, extents, taken, params)
            )
        except Fail as exc:
            raise InputError(f"{where}, statement '{text}': {exc}") from None
    return Kernel(name, roles(table, outputs, where), tuple(built))


def _writes(text: str, tensor: str) -> bool:
    return re.match(rf"\s*{re.escape(tensor)}\s*\[", text) is not None


def _statement(
    text: str,
    position: int,
    table: dict[str, TensorEntry],
    dtype: str,
    dtypes: Mapping[str, str],
    extents: Mapping[str, int | str],
    taken: set[str],
    params: Sequence[str],
) -> list[Statement]:
    parsed = parse_statement(text)
    tname = parsed.tensor
    check_local(tname, "tensor")
    target = table.get(tname)
    if target is not None and target.value is not None:
        raise Fail(f"writes '{tname}', which is a constant")
    if target is not None and target.reads and not target.writes:
        raise Fail(f"writes '{tname}', which an earlier statement reads as an input")
    if target is None:
        target = TensorEntry(tname, None, dtype_name(dtypes.get(tname, dtype), ""))
        table[tname] = target
    b = Builder(parsed, table, dtype, params)
    if target.shape is not None and len(parsed.lhs) != len(target.shape):
        raise Fail(
            f"'{tname}' has rank {len(target.shape)}, but the left-hand side gives "
            f"{len(parsed.lhs)} indices"
        )
    lhs_index = []
    for pos, node in enumerate(parsed.lhs):
        if any(isinstance(n, ast.Subscript) for n in ast.walk(node)):
            raise Fail(f"the written index '{ast.unparse(node)}' must be affine (no loads)")
        if target.shape is not None and isinstance(node, ast.Name) and node.id not in params:
            b.bare.setdefault(b.variable(node.id), []).append((tname, pos))
        lhs_index.append(b.affine(node)[0])
    lhs_vars = list(b.vars)
    value, _ = b.expr(parsed.rhs)
    guard = b.condition(parsed.guard) if parsed.guard is not None else ""
    dims = list(b.vars)
    clash = sorted(set(dims) & {*params, *table})
    if clash:
        raise Fail(f"'{clash[0]}' names both an iteration variable and a size or tensor")
    sizes = [_extent(v, b.bare, table, extents) for v in dims]
    if target.shape is None:
        shape = []
        for node in parsed.lhs:
            if not isinstance(node, ast.Name):
                raise Fail(
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
                ih.box(init_name, lhs_vars, init_sizes, init_guard, params),
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
            ih.box(stmt_name, dims, sizes, guard, params),
            tname,
            tuple(lhs_index),
            value,
            reduction=combiner,
        )
    )
    for s in out:
        _check_bounds(s, table, params)
    for loaded in b.loaded:
        table[loaded].reads.append(position)
    target.writes.append(position)
    return out


def _extent(
    var: str,
    bare: Mapping[str, list[tuple[str, int]]],
    table: Mapping[str, TensorEntry],
    extents: Mapping[str, int | str],
) -> int | str:
    if var in extents:
        extent = extents[var]
        return extent if isinstance(extent, str) else int(extent)
    uses = [(t, p, table[t].shape[p]) for t, p in bare.get(var, ()) if table[t].shape is not None]
    if not uses:
        raise Fail(
            f"cannot infer the extent of '{var}': it is never a bare index of a tensor with a "
            f"known shape (pass extents={{'{var}': n}})"
        )
    sizes = {size for _, _, size in uses}
    if len(sizes) > 1:
        seen = ", ".join(f"{t}[{p}] = {size}" for t, p, size in dict.fromkeys(uses))
        raise Fail(
            f"conflicting extents for '{var}': {seen} (pass extents={{'{var}': n}} and a "
            "condition to choose)"
        )
    return sizes.pop()


def _conjuncts_within(b: Builder, guard: ast.expr | None, names: set[str]) -> str:
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


def _check_bounds(
    s: Statement, table: Mapping[str, TensorEntry], params: Sequence[str]
) -> None:
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
        inside = ih.parse_set(ih.box(tname, dims, shape, params=params))
        outside = access.subtract_range(inside)
        if not outside.is_empty():
            point = outside.domain().sample_point()
            coords = [
                f"{d} = {point.get_coordinate_val(kind, n).to_python()}"
                for kind, names in ((isl.dim_type.param, params), (isl.dim_type.set, s.dims))
                for n, d in enumerate(names)
            ]
            raise Fail(
                f"{verb} {tname}[{', '.join(index)}] outside its shape {list(shape)} "
                f"(at {', '.join(coords)})"
            )
