"""The one error hierarchy of polytile.

Every error a user can provoke is a `PolytileError` whose message names the thing at
fault: the model, the node (name and op type), the input or the attribute. Anything else
escaping from polytile is a bug.
"""

from __future__ import annotations


class PolytileError(Exception):
    """Base of every error polytile raises on purpose."""


class ModelError(PolytileError):
    """The model cannot be read or is not valid ONNX (truncated, checker failure, ...)."""


class UnsupportedOpError(PolytileError):
    """The model uses ops (or op variants) polytile does not support.

    `unsupported` lists every offending (node name, op type, reason) so that one error
    reports all of them, not just the first.
    """

    def __init__(self, message: str, unsupported: tuple[tuple[str, str, str], ...] = ()) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class ShapeError(PolytileError):
    """Shapes are dynamic, inconsistent or cannot be inferred statically."""


class SymbolicShapeError(ShapeError):
    """A shape depends on symbolic sizes (batch, seq) in a way polytile cannot decide for
    every size (is seq == 1?) or cannot express (a division by seq). `dims` names the
    sizes involved and `node` the node at fault when known: the place where a caller may
    fall back to a specialization at concrete sizes."""

    def __init__(self, message: str, dims: tuple[str, ...] = (), node: str = "") -> None:
        super().__init__(message)
        self.dims = dims
        self.node = node


class InputError(PolytileError):
    """An argument given by the caller (input shapes, feeds, options) is wrong."""


class IndexOutOfRangeError(InputError):
    """An index read from a run-time tensor (Gather's indices, a Scatter's, ...) lies
    outside the axis it indexes; the model stopped before any kernel read through it."""


class IllegalSchedule(PolytileError):
    """A schedule transformation would break a dependence; raised by the poly layer only."""


class BudgetExceeded(IllegalSchedule):
    """Building or checking a schedule ran out of its budget of isl operations or of
    seconds: too costly to be worth having rather than illegal. `resource` names what ran
    out ("isl operations" or "seconds"), `where` the step at which it was noticed, and
    `trace` the steps applied by then when known (the search records them)."""

    def __init__(
        self, message: str, resource: str = "", where: str = "", trace: tuple = ()
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.where = where
        self.trace = trace


class CodegenError(PolytileError):
    """Machine code could not be produced for a legal schedule."""


class TuningError(PolytileError):
    """Tuning could not proceed (unusable records file, no measurable candidate, ...)."""


def node_label(name: str, op_type: str) -> str:
    """How every message refers to a node: its name and its op type."""
    return f"node '{name}' ({op_type})" if name else f"unnamed {op_type} node"
