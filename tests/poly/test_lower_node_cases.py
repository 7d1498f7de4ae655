"""Every ONNX node test whose ops have a lowering and whose shapes are small: the lowered
kernels, executed in program order, reproduce the expected outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polytile.errors import UnsupportedOpError
from polytile.frontend import optimize
from polytile.frontend.ops import OPS
from polytile.poly.lower import LOWERINGS

from lowered import run_lowered
from node_cases import all_cases, compare, import_case

MAX_POINTS = 20_000


def small(case) -> bool:
    inputs, outputs = case.data_sets[0]
    sizes = [np.asarray(a).size for a in [*inputs, *outputs] if hasattr(a, "shape")]
    return bool(sizes) and max(sizes) <= 4096


def lowerable(case) -> bool:
    used = {n.op_type for n in case.model.graph.node}
    return used <= set(OPS) and used <= set(LOWERINGS) | {"Identity", "Dropout", "Constant"}


CASES = [c for c in all_cases() if lowerable(c) and small(c)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lowered_matches_expected(case) -> None:
    try:
        graph, feeds, expected = import_case(case)
        graph = optimize(graph)
        work = sum(math.prod(t.shape) for t in graph.types.values())
        if work > MAX_POINTS * 10:
            pytest.skip("too large for the point-wise reference executor")
        got = run_lowered(graph, feeds)
    except UnsupportedOpError as exc:
        pytest.skip(f"unsupported variant: {exc}")
    compare(case, got, expected)
