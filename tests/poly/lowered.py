"""Run an optimized graph through the polyhedral kernels, group by group, with the
program-order reference executor: the differential harness for lowering."""

from __future__ import annotations

import numpy as np

from polytile.frontend import Graph, partition
from polytile.poly.lower import lower
from polytile.poly.reference import run_program_order


def run_lowered(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Graph outputs computed by lowering every fused group and executing the kernels."""
    parts = partition(graph)
    env = dict(feeds)
    env.update(graph.constants)
    for view, source in graph.aliases.items():
        if source in env:
            env[view] = env[source].reshape(graph.types[view].shape)
    for group in parts.groups:
        kernel = lower(graph, group)
        inputs = {}
        for t in kernel.inputs():
            inputs[t.name] = np.asarray(env[t.source], dtype=t.dtype).reshape(t.shape)
        buffers = run_program_order(kernel, inputs)
        for t in kernel.outputs():
            env[t.source] = buffers[t.name]
        for view, source in graph.aliases.items():
            if source in env and view not in env:
                env[view] = env[source].reshape(graph.types[view].shape)
    return [np.asarray(env[name]) for name in graph.outputs]
