"""Every ONNX node test that tests/e2e/test_onnx_backend.py does not run, with the reason:
the one place to look up (and shrink) the list.

- `UNSUPPORTED` (hand-written): variants of supported ops that polytile refuses on purpose
  with an `UnsupportedOpError` (element types, training mode, extra outputs);
  test_onnx_backend.py checks that each of them is indeed refused cleanly.
- `BUGS` (hand-written): known bugs, with the diagnosed faulty function. Remove an entry
  when its fix lands (a test checks every pattern still matches some node test).
- `unsupported_ops()` (computed): tests using an op polytile does not import at all
  (`frontend.importer.find_unsupported`); adding an op enables its tests automatically.

Patterns are regular expressions searched in the node test's name (without the `_cpu`
suffix the ONNX runner adds). `python tests/e2e/backend_exclusions.py` prints the table.
Only the node tests run at all: the runner's model tests (model zoo "real" models, which
are downloaded, and the "simple" / "pytorch" ones) are not collected.
"""

from __future__ import annotations

import functools
import re
import sys
import warnings

from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase

from polytile.frontend.importer import find_unsupported

UNSUPPORTED: dict[str, str] = {
    r"^test_equal_string": "string tensors are not supported",
    r"^test_identity_(?:sequence|opt)$": "sequence and optional values are not supported",
    r"^test_batchnorm_\w+_training_mode$": "BatchNormalization training mode (inference only)",
    r"^test_training_dropout(?:_mask|_default|_default_mask)?$": (
        "Dropout training mode with a non-zero ratio draws random numbers"
    ),
    r"^test_if$": "If whose condition is only known at run time (a graph input)",
    r"^test_(?:loop11|range_\w+_expanded)$": (
        "Loop whose trip count is only known at run time (a graph input)"
    ),
}

BUGS: dict[str, str] = {
    r"^test_attention_4d_causal_fp16(?:_expanded)?$": (
        "frontend/widen.py computes each float16 op in float32 and rounds once (as "
        "onnxruntime); onnx's reference rounds every float16 step: 2 of 192 values are "
        "2 ulps apart, past rtol 1e-3"
    ),
}


@functools.cache
def node_cases() -> tuple[TestCase, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(c for c in collect_testcases(None) if c.kind == "node")


@functools.cache
def unsupported_ops() -> dict[str, str]:
    """Exact-name patterns of the node tests using ops polytile does not support."""
    found = {}
    for case in node_cases():
        ops = sorted({op for _, op, _ in find_unsupported(case.model)})
        if ops:
            found[f"^{re.escape(case.name)}$"] = f"unsupported op(s): {', '.join(ops)}"
    return found


@functools.cache
def exclusions() -> dict[str, str]:
    """Every exclusion, pattern → reason."""
    return {**unsupported_ops(), **UNSUPPORTED, **BUGS}


@functools.cache
def _compiled() -> tuple[tuple[re.Pattern[str], str], ...]:
    # compiled once: over a thousand patterns thrash `re`'s cache of compiled patterns
    return tuple((re.compile(p), reason) for p, reason in exclusions().items())


@functools.cache
def reason_for(name: str) -> str | None:
    """Why the node test `name` (no device suffix) is excluded, or None if it runs."""
    for pattern, reason in _compiled():
        if pattern.search(name):
            return reason
    return None


if __name__ == "__main__":
    counts: dict[str, int] = {}
    for case in node_cases():
        why = reason_for(case.name)
        if why is not None:
            kind = "unsupported op" if why.startswith("unsupported op") else why
            counts[kind] = counts.get(kind, 0) + 1
            if "-v" in sys.argv:
                print(f"{case.name}: {why}")
    for why, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"{n:5d}  {why}")
    print(f"{sum(counts.values()):5d}  excluded of {len(node_cases())} node tests")
