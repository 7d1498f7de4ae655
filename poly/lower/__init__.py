"""ONNX → polyhedral kernels: one compute definition per op (see `base.lowering`)."""

from polytile.frontend.fusion import Group
from polytile.frontend.graph import Graph
from polytile.poly.ir.kernel import Kernel
from polytile.poly.lower import (  # noqa: F401  (each registers lowerings)
    elementwise,
    indexing,
    injective,
    layout,
    nn,
    norm,
    pool,
    reduce,
    resize,
    rotary,
)
from polytile.poly.lower.base import (
    LOWERINGS,
    LowerConfig,
    LowerContext,
    identifier,
    lower_group,
    lowering,
)


def lower(graph: Graph, group: Group, config: LowerConfig | None = None) -> Kernel:
    """The kernel of one fused group of an optimized graph."""
    return lower_group(
        graph,
        group.nodes,
        group.inputs,
        group.outputs,
        name=f"{graph.name}_g{group.index}_{group.kind}",
        config=config,
    )


__all__ = [
    "LOWERINGS",
    "LowerConfig",
    "LowerContext",
    "identifier",
    "lower",
    "lower_group",
    "lowering",
]
