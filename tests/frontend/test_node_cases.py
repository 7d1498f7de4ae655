"""Every supported ONNX node test: types agree with the expected outputs and with
onnx.shape_inference, and the canonicalized graph computes the expected values."""

from __future__ import annotations

import pytest

from polytile.errors import UnsupportedOpError

from node_cases import cases_for, roundtrip

CASES = cases_for()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_import_matches_expected(case) -> None:
    try:
        roundtrip(case)
    except UnsupportedOpError as exc:
        pytest.skip(f"unsupported variant: {exc}")
