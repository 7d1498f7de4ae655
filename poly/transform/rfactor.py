"""rfactor: split a reduction dimension `r = F*ro + ri` and make `ri` a spatial dimension of
a partial-result tensor, so that a reduction with little spatial parallelism gets a
parallel (or vector) loop — TVM's `rfactor`, on exact isl domains.

    Y[w] += e(r)            becomes    R[w, ri]  = identity
                                       R[w, ri] += e(F*ro + ri)      (ri spatial)
                                       Y[w]     += R[w, ri]          (sum over ri)

The reduction is reassociated (partial results per `ri`), which the combiner's
associativity allows. It rewrites statements, so it comes before any step that moves
the statement's loops (only `pack` steps may precede it); the schedule restarts from the
new kernel's initial schedule, keeping the trace.
"""

from __future__ import annotations

import re
from dataclasses import replace

import islpy as isl

from polytile.errors import IllegalSchedule
from polytile.names import unique_name
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.expr import Expr, Load, const, identity, loads, rewrite
from polytile.poly.ir.kernel import Kernel, Role, Statement, Tensor
from polytile.poly.ir.schedule import Schedule, Step, initial_schedule


def _substitute(text: str, dim: str, value: str) -> str:
    return re.sub(rf"(?<![\w.]){re.escape(dim)}(?![\w.])", f"({value})", text)


def _lowest(domain: isl.Set, dim: str) -> int:
    value = domain.dim_min_val(ih.dim_names(domain).index(dim))
    if not value.is_int():
        raise IllegalSchedule(f"rfactor: {dim} has no finite lower bound")
    return int(value.to_python())


def rfactor(schedule: Schedule, stmt: str, dim: str, factor: int) -> Schedule:
    kernel = schedule.kernel
    step = f"rfactor({stmt}, {dim}, factor={factor})"
    if any(s.kind != "pack" for s in schedule.trace):
        raise IllegalSchedule(f"{step}: rfactor must come before any loop transformation")
    if stmt not in kernel.statement:
        raise IllegalSchedule(f"{step}: no statement '{stmt}'")
    s = kernel.statement[stmt]
    if s.reduction is None or dim not in s.reduction_dims:
        raise IllegalSchedule(f"{step}: {dim} is not a reduction dimension of {stmt}")
    if factor < 2:
        raise IllegalSchedule(f"{step}: the factor must be at least 2")
    if any(ld.tensor == s.tensor for ld in loads(s.expr)):
        raise IllegalSchedule(f"{step}: {stmt} reads the tensor it reduces into")
    if _lowest(s.domain_set(), dim) < 0:
        raise IllegalSchedule(f"{step}: {dim} starts below 0")
    taken = set(kernel.tensors) | {st.name for st in kernel.statements} | set(s.dims)
    outer, inner = unique_name(f"{dim}o", taken), unique_name(f"{dim}i", taken)
    partial = unique_name(f"{s.tensor}_rf", taken)
    names = {n: unique_name(f"{stmt}_rf{n}", taken) for n in ("", "_init", "_final")}
    written = [d for d in s.dims if d not in s.reduction_dims]
    dtype = kernel.tensors[s.tensor].dtype

    # the partial reduction: r → F*ro + ri over the original domain
    dims = [outer if d == dim else d for d in s.dims]
    dims.insert(dims.index(outer) + 1, inner)
    value = f"{factor}*{outer} + {inner}"
    reindex = ih.parse_map(
        f"{{ {stmt}[{', '.join(s.dims)}] -> {names['']}[{', '.join(dims)}] : "
        f"{dim} = {value} and 0 <= {inner} < {factor} }}"
    )
    domain = s.domain_set().apply(reindex)
    write_shape = kernel.tensors[s.tensor].shape
    index = (*s.index, inner)

    def move(e: Expr) -> Expr | None:
        if isinstance(e, Load):
            idx = tuple(_substitute(i, dim, value) if isinstance(i, str) else i for i in e.index)
            return Load(e.tensor, idx, e.dtype)
        return None

    body = Statement(
        names[""],
        tuple(dims),
        str(domain),
        partial,
        index,
        rewrite(s.expr, move),
        reduction=s.reduction,
    )
    # its init and the final combination, over the written dims (and ri)
    spatial = s.domain_set().project_out_except(written, [isl.dim_type.set])
    lane = ih.parse_set(f"{{ [{inner}] : 0 <= {inner} < {factor} }}")
    init_domain = spatial.flat_product(lane).set_tuple_name(names["_init"])
    for pos, name in enumerate([*written, inner]):
        init_domain = init_domain.set_dim_name(isl.dim_type.set, pos, name)
    init = Statement(
        names["_init"],
        (*written, inner),
        str(init_domain),
        partial,
        index,
        const(identity(s.reduction, dtype), dtype),
        init_of=names[""],
    )
    final_domain = str(init_domain).replace(f"{names['_init']}[", f"{names['_final']}[", 1)
    final = Statement(
        names["_final"],
        (*written, inner),
        final_domain,
        s.tensor,
        s.index,
        Load(partial, index, dtype),
        reduction=s.reduction,
    )
    statements: list[Statement] = []
    for st in kernel.statements:
        if st.name == stmt:
            statements.extend([init, body, final])
        else:
            statements.append(st)
    shape = (*write_shape, factor)
    tensors = dict(kernel.tensors)
    tensors[partial] = Tensor(partial, shape, dtype, Role.TEMP)
    new_kernel = Kernel(kernel.name, tensors, tuple(statements))
    result = initial_schedule(new_kernel)
    args = {"stmt": stmt, "dim": dim, "factor": factor}
    return replace(result, trace=(*schedule.trace, Step("rfactor", args)))
