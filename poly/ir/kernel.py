"""The kernel IR: tensors and statements with exact isl domains and accesses.

A statement writes one tensor element per point of its domain. A reduction statement
combines its expression into the element (`Y[i, j] += A[i, k] * B[k, j]`); its identity is
written by a separate init statement, which lowering creates. Dimension names carry
meaning; the isl objects are derived from text on demand.

A kernel may have symbolic sizes: a tensor extent that is a name is an isl parameter, and
the statements' domains are sets over those parameters (each at least 1). Such a kernel
is scheduled and compiled once for all sizes (`params`); `at(sizes)` is its static
instance, which heuristics and references use.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

import islpy as isl
import numpy as np

from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.deps import Dependences, compute_dependences
from polytile.poly.ir.expr import (
    COMBINERS,
    Binary,
    Expr,
    Iter,
    Load,
    Unary,
    const,
    loads,
    rewrite,
    walk,
)


class Role(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    CONSTANT = "constant"
    TEMP = "temporary"


#: a tensor's extent: a number, or a symbolic size: the name of an isl parameter, or
#: quasi-affine isl text over such names (`1 + seq`, `floor((1 + seq)/2)`)
Extent = int | str


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[Extent, ...]
    dtype: str
    role: Role
    #: the data of a constant tensor (read-only); None otherwise
    value: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: the ONNX tensor this kernel tensor holds ('' for temporaries of a lowering)
    source: str = ""


@dataclass(frozen=True)
class Statement:
    name: str
    dims: tuple[str, ...]
    #: isl set text, `{ name[dims] : constraints }`
    domain: str
    tensor: str
    index: tuple[str, ...]
    expr: Expr
    #: the combiner ('sum', 'prod', 'max', 'min') of a reduction statement, else None
    reduction: str | None = None
    #: for an init statement, the reduction statement it initializes
    init_of: str | None = None

    def __post_init__(self) -> None:
        if self.reduction is not None and self.reduction not in COMBINERS:
            raise ValueError(f"statement {self.name}: unknown combiner {self.reduction}")

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        """Dimensions that do not appear in the written index (summed over)."""
        if self.reduction is None:
            return ()
        used = " ".join(self.index)
        return tuple(d for d in self.dims if not mentions(used, d))

    @property
    def accumulates_only(self) -> bool:
        """A reduction whose expression does not read its own tensor: its instances
        commute (up to reassociation), so their order within the nest is free."""
        return self.reduction is not None and all(
            ld.tensor != self.tensor for ld in loads(self.expr)
        )

    def domain_set(self) -> isl.Set:
        return ih.parse_set(self.domain)

    def write_map(self) -> isl.Map:
        text = ih.access(self.name, self.dims, self.tensor, self.index)
        return ih.parse_map(text).intersect_domain(self.domain_set())

    def read_maps(self) -> list[isl.Map]:
        """One map per load (an indirect index becomes an unconstrained dimension: any
        element along that axis, and beyond — a safe over-approximation for dependences);
        a reduction also reads its accumulator."""
        maps = [self._load_map(load) for load in loads(self.expr)]
        if self.reduction is not None:
            maps.append(self.write_map())
        return maps

    def _load_map(self, load: Load) -> isl.Map:
        # an indirect index becomes an unconstrained output dimension: any element
        index = [i if isinstance(i, str) else f"_x{n}" for n, i in enumerate(load.index)]
        text = ih.access(self.name, self.dims, load.tensor, index)
        return ih.parse_map(text).intersect_domain(self.domain_set())


def _size_constant(e: Expr, dims: tuple[str, ...], sizes: Mapping[str, int]) -> Expr | None:
    """A size read as a value (`Iter` of its isl text), as the constant it is at `sizes`."""
    if isinstance(e, Iter) and e.name not in dims:
        return const(ih.evaluate(e.name, sizes), e.dtype)
    return None


def size_of(extent: Extent, sizes: Mapping[str, int]) -> int:
    """An extent's value at these sizes."""
    if isinstance(extent, int):
        return extent
    return int(sizes[extent]) if extent in sizes else ih.evaluate(extent, sizes)


def mentions(text: str, name: str) -> bool:
    """Whether the (index) text uses the dimension `name`."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", text) is not None


@dataclass(frozen=True)
class Kernel:
    name: str
    tensors: Mapping[str, Tensor]
    statements: tuple[Statement, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.tensors, MappingProxyType):
            object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "statements", tuple(self.statements))
        names = [s.name for s in self.statements]
        if len(set(names)) != len(names):
            raise ValueError(f"kernel {self.name}: statement names are not unique")

    def __reduce__(self) -> tuple[type[Kernel], tuple[str, dict[str, Tensor], tuple]]:
        """Pickled as its fields only (cached isl objects are rebuilt on demand), so that
        kernels travel to measurement worker processes."""
        return (Kernel, (self.name, dict(self.tensors), self.statements))

    @cached_property
    def params(self) -> tuple[str, ...]:
        """The symbolic sizes of the shapes and domains, sorted (empty: a static kernel)."""
        names = {
            n for t in self.tensors.values() for d in t.shape if isinstance(d, str)
            for n in ih.names_in(d)
        }  # fmt: skip
        for s in self.statements:
            names.update(ih.param_names(s.domain_set()))
            for e in walk(s.expr):  # a size read as a value (`Iter` of its isl text)
                if isinstance(e, Iter) and e.name not in s.dims:
                    names.update(ih.names_in(e.name))
        return tuple(sorted(names))

    def at(self, sizes: Mapping[str, int]) -> Kernel:
        """The static kernel at these sizes (every parameter given, each at least 1)."""
        if not self.params:
            return self
        missing = [p for p in self.params if p not in sizes]
        small = {p: sizes[p] for p in self.params if p in sizes and int(sizes[p]) < 1}
        if missing or small:
            raise ValueError(
                f"kernel {self.name}: sizes {dict(sizes)} leave {missing or small} "
                "unset or below 1"
            )
        tensors = {
            name: replace(t, shape=tuple(size_of(d, sizes) for d in t.shape))
            for name, t in self.tensors.items()
        }
        statements = tuple(
            replace(
                s,
                domain=str(ih.fix_params(s.domain_set(), sizes)),
                expr=rewrite(s.expr, lambda e, dims=s.dims: _size_constant(e, dims, sizes)),
            )
            for s in self.statements
        )
        return Kernel(self.name, tensors, statements)

    def sizes_of(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The symbolic sizes that tensors of these shapes give (by tensor name), checked
        against each other and the static extents; ValueError naming the first mismatch."""
        found: dict[str, int] = {}
        for name, shape in shapes.items():
            declared = self.tensors[name].shape
            if len(shape) != len(declared):
                raise ValueError(f"'{name}' must have rank {len(declared)}, got {list(shape)}")
            for want, got in zip(declared, shape, strict=True):
                if isinstance(want, str) and want.isidentifier():
                    found.setdefault(want, int(got))
        for name, shape in shapes.items():  # every extent against the sizes found
            for axis, (want, got) in enumerate(zip(self.tensors[name].shape, shape, strict=True)):
                if isinstance(want, str) and not set(ih.names_in(want)) <= set(found):
                    continue  # a size no shape here gives by itself: the caller's to set
                value = size_of(want, found)
                if value != got:
                    shown = want if isinstance(want, int) else f"{want} = {value}"
                    raise ValueError(f"'{name}' axis {axis} must be {shown}, got {got}")
        return found

    @cached_property
    def statement(self) -> Mapping[str, Statement]:
        return MappingProxyType({s.name: s for s in self.statements})

    def domain(self) -> isl.UnionSet:
        return ih.union_set([s.domain_set() for s in self.statements])

    def writes(self) -> isl.UnionMap:
        return ih.union_map([s.write_map() for s in self.statements])

    def reads(self) -> isl.UnionMap:
        return ih.union_map([m for s in self.statements for m in s.read_maps()])

    @cached_property
    def dependences(self) -> Dependences:
        return compute_dependences(self)

    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role is Role.INPUT]

    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role is Role.OUTPUT]

    def by_source(self, onnx_name: str) -> Tensor:
        """The kernel tensor holding an ONNX tensor."""
        for t in self.tensors.values():
            if t.source == onnx_name:
                return t
        raise KeyError(f"kernel {self.name} holds no tensor for '{onnx_name}'")

    def workload_key(self) -> str:
        """A stable structural hash: identical kernels (up to constant values) share it."""
        payload = {
            "tensors": sorted(
                (t.name, list(t.shape), t.dtype, t.role.value) for t in self.tensors.values()
            ),
            "statements": [
                [
                    s.name,
                    list(s.dims),
                    s.domain,
                    s.tensor,
                    list(s.index),
                    str(s.expr),
                    s.reduction,
                    s.init_of,
                ]
                for s in self.statements
            ],
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def flops(self) -> int:
        """Arithmetic operations executed (domain size × operations per instance)."""
        total = 0
        for s in self.statements:
            ops = sum(1 for e in walk(s.expr) if isinstance(e, Binary | Unary))
            ops += 1 if s.reduction else 0
            total += ih.card(s.domain_set()) * ops
        return total
