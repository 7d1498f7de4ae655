"""Blocked layouts: `pack` stores an operand so that the block a vector (or register
block) walks along one axis is contiguous, `(d0, .., d, ..) -> (ceil(d/f), d0, .., .., f)`
as OIHW -> O/f.I.H.W.f, and rewrites every load to match.

A constant (weights) is packed now, at compile time. A kernel input is packed at run
time by a copy statement in its own loop nest before the first statement that reads it:
the matrix product's B walked in panels of 16 columns reads rows a row stride apart (4 KB
for 1024 columns), all in the same few cache sets, and transposed it gathers every lane.
Packed, a panel is one contiguous stream (BLAS packs B the same way).
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from polytile.errors import IllegalSchedule
from polytile.names import unique_name
from polytile.poly.ir.expr import Expr, Load, loads, rewrite
from polytile.poly.ir.kernel import Kernel, Role, Statement, Tensor
from polytile.poly.ir.schedule import (
    Leaf,
    Loop,
    Node,
    Schedule,
    Step,
    identity_expr,
    statements_below,
)

#: packed copies of constants: per source array (by identity, while it lives), per (axis,
#: factor). Every candidate of a search that packs a weight the same way shares one
#: read-only array instead of holding its own copy (megabytes each: with a copy per
#: built candidate, the tuner's memory grew with every trial)
_PACKED: dict[int, tuple[weakref.ref, dict[tuple[int, int], np.ndarray]]] = {}


def packed_constant(value: np.ndarray, axis: int, factor: int) -> np.ndarray:
    """`pack_constant`, computed once per source array and layout."""
    key = id(value)
    entry = _PACKED.get(key)
    if entry is None or entry[0]() is not value:

        def forget(ref: weakref.ref, key: int = key) -> None:
            if _PACKED.get(key, (None,))[0] is ref:
                del _PACKED[key]

        entry = (weakref.ref(value, forget), {})
        _PACKED[key] = entry
    layouts = entry[1]
    if (axis, factor) not in layouts:
        packed = pack_constant(value, axis, factor)
        packed.flags.writeable = False
        layouts[(axis, factor)] = packed
    return layouts[(axis, factor)]


def pack_constant(value: np.ndarray, axis: int, factor: int) -> np.ndarray:
    """Block `axis` by `factor`: the block index goes outermost and the lane innermost,
    (d0, .., d, ..) → (⌈d/f⌉, d0, .., .., f), as OIHW → O/f·I·H·W·f. A partial block is
    zero-padded."""
    size = value.shape[axis]
    blocks = -(-size // factor)
    pad = [(0, 0)] * value.ndim
    pad[axis] = (0, blocks * factor - size)
    padded = np.pad(value, pad)
    shape = (*value.shape[:axis], blocks, factor, *value.shape[axis + 1 :])
    blocked = np.moveaxis(padded.reshape(shape), (axis, axis + 1), (0, -1))
    return np.ascontiguousarray(blocked)


def packed_shape(shape: tuple[int, ...], axis: int, factor: int) -> tuple[int, ...]:
    return (-(-shape[axis] // factor), *shape[:axis], *shape[axis + 1 :], factor)


def pack(schedule: Schedule, tensor: str, axis: int, factor: int) -> Schedule:
    """Store a constant or input tensor in a blocked layout along `axis`, so that each
    block of `factor` elements is contiguous; every load is rewritten to match."""
    kernel = schedule.kernel
    step = f"pack({tensor}, axis={axis}, factor={factor})"
    t = kernel.tensors.get(tensor)
    if t is None or t.role not in (Role.CONSTANT, Role.INPUT):
        raise IllegalSchedule(f"{step}: only a constant or input tensor can be packed")
    if t.role is Role.CONSTANT and t.value is None:
        raise IllegalSchedule(f"{step}: the constant has no value")
    if not 0 <= axis < len(t.shape) or factor < 2:
        raise IllegalSchedule(f"{step}: axis out of range or factor below 2")
    if any(isinstance(d, str) for d in t.shape):
        raise IllegalSchedule(f"{step}: {tensor} has symbolic sizes {list(t.shape)}")
    readers = [s for s in kernel.statements if any(ld.tensor == tensor for ld in loads(s.expr))]
    if not readers:
        raise IllegalSchedule(f"{step}: no statement reads {tensor}")
    taken = set(kernel.tensors) | {s.name for s in kernel.statements}
    name = unique_name(f"{tensor}_packed", taken)

    def index(load_index: tuple) -> tuple:
        entry = load_index[axis]
        if not isinstance(entry, str):
            raise IllegalSchedule(f"{step}: an indirect index cannot be packed")
        block = f"floor(({entry})/{factor})"
        lane = f"({entry}) - {factor}*floor(({entry})/{factor})"
        return (block, *load_index[:axis], *load_index[axis + 1 :], lane)

    def rewrite_load(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor == tensor:
            return Load(name, index(e.index), e.dtype)
        return None

    statements = [replace(st, expr=rewrite(st.expr, rewrite_load)) for st in kernel.statements]
    tensors = dict(kernel.tensors)
    body = schedule.body
    if t.role is Role.CONSTANT:
        del tensors[tensor]
        value = packed_constant(np.asarray(t.value), axis, factor)
        tensors[name] = Tensor(name, value.shape, t.dtype, Role.CONSTANT, value, source=t.source)
    else:
        shape = packed_shape(t.shape, axis, factor)
        tensors[name] = Tensor(name, shape, t.dtype, Role.TEMP)
        copy = _copy_statement(t, name, axis, factor, taken)
        statements.insert(kernel.statements.index(readers[0]), copy)
        body = _before_readers(schedule, copy, {s.name for s in readers}, taken | {copy.name})
    new_kernel = Kernel(kernel.name, tensors, tuple(statements))
    args = {"tensor": tensor, "axis": axis, "factor": factor}
    trace = (*schedule.trace, Step("pack", args))
    return replace(schedule, kernel=new_kernel, body=body, trace=trace)


def _copy_statement(t: Tensor, name: str, axis: int, factor: int, taken: set[str]) -> Statement:
    """`packed[b, .., l] = t[.., factor*b + l, ..]` over the elements of `t`."""
    stmt = unique_name(f"{t.name}_pack", taken)
    block, lane = f"{t.name}_b", f"{t.name}_l"
    rest = [f"{t.name}_{n}" for n in range(len(t.shape)) if n != axis]
    dims = (block, *rest, lane)
    bounds = [
        f"0 <= {d} < {n}"
        for d, n in zip(rest, [*t.shape[:axis], *t.shape[axis + 1 :]], strict=True)
    ]
    bounds += [f"0 <= {lane} < {factor}", f"0 <= {factor}*{block} + {lane} < {t.shape[axis]}"]
    domain = f"{{ {stmt}[{', '.join(dims)}] : {' and '.join(bounds)} }}"
    source = [*rest[:axis], f"{factor}*{block} + {lane}", *rest[axis:]]
    return Statement(stmt, dims, domain, name, dims, Load(t.name, tuple(source), t.dtype))


def _before_readers(
    schedule: Schedule, copy: Statement, readers: set[str], taken: set[str]
) -> tuple[Node, ...]:
    """The schedule's body with the copy's own nest before the first top node that holds
    a reader."""
    names = taken | set(schedule.loop_names())
    nest: Node = Leaf(copy.name)
    for dim in reversed(copy.dims):
        loop_name = unique_name(dim, names)
        names.add(loop_name)
        nest = Loop(loop_name, {copy.name: identity_expr(copy.name, copy.dims, dim)}, (nest,))
    at = next(i for i, n in enumerate(schedule.body) if readers & set(statements_below(n)))
    return (*schedule.body[:at], nest, *schedule.body[at:])
