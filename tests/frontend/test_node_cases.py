"""Every supported ONNX node test: types agree with the expected outputs and with
onnx.shape_inference, and the canonicalized graph computes the expected values, before and
after the whole pass pipeline."""

from __future__ import annotations

import pytest

from polytile.errors import UnsupportedOpError
from polytile.frontend import optimize
from polytile.frontend.graph import Graph
from polytile.frontend.passes import verify_graph

from node_cases import cases_for, roundtrip

CASES = cases_for()


def optimized(graph: Graph) -> Graph:
    graph = optimize(graph)
    verify_graph(graph)
    return graph


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_import_matches_expected(case) -> None:
    try:
        roundtrip(case)
    except UnsupportedOpError as exc:
        pytest.skip(f"unsupported variant: {exc}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_optimized_matches_expected(case) -> None:
    try:
        roundtrip(case, transform=optimized)
    except UnsupportedOpError as exc:
        pytest.skip(f"unsupported variant: {exc}")


def test_most_node_cases_are_supported() -> None:
    """A floor on coverage, so a regression that turns passes into skips is noticed."""
    passed = 0
    for case in CASES:
        try:
            roundtrip(case)
            passed += 1
        except UnsupportedOpError:
            pass
    assert passed >= 590, f"only {passed} of {len(CASES)} supported node cases pass"
