"""`ordering_touching`: a kernel's dependences with an end in given statements, as an
inline's order check takes them (only the consumers' accesses change), against the whole
kernel's dependences restricted to those statements."""

from __future__ import annotations

from dataclasses import replace

import islpy as isl
import pytest

from polytile.poly.dsl import kernel
from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.deps import ordering_touching
from polytile.poly.ir.kernel import Kernel
from polytile.poly.ir.schedule import initial_schedule, reversed_dependences

from kernels import mm_relu, prefix_sum, softmax_rows

KERNELS: dict[str, Kernel] = {
    "mm_relu": mm_relu(6, 5, 4),  # a reduction and its init
    "softmax": softmax_rows(3, 7),
    "prefix_sum": prefix_sum(7),  # a loop-carried flow dependence
    "symbolic": kernel(
        "T[i, j] = X[i, j] * 2.0", "Y[i] += T[i, j]", "Z[i] = Y[i] + 1.0", X=("n", 5)
    ),
}


def _touching(relation: isl.UnionMap, k: Kernel, stmts: list[str]) -> isl.UnionMap:
    own = ih.union_set([k.statement[s].domain_set() for s in stmts])
    return relation.intersect_domain(own).union(relation.intersect_range(own))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_ordering_touching_is_the_kernels_dependences_with_an_end_there(name: str) -> None:
    k = KERNELS[name]
    full = k.dependences.ordering()
    assert not full.is_empty()
    names = [s.name for s in k.statements]
    for chosen in ([names[0]], [names[-1]], names[1:2], names):
        got = ordering_touching(k, chosen)
        assert got.is_equal(_touching(full, k, chosen)), chosen


def test_the_order_check_of_changed_statements_finds_their_reversed_dependences() -> None:
    """A schedule running Z's nest first reverses the dependences Z has with Y: checking
    Z's (or Y's) finds them, as the whole check does; T's with Y stay in order."""
    k = KERNELS["symbolic"]
    plain = initial_schedule(k)
    assert reversed_dependences(plain).is_empty()
    wrong = replace(plain, body=(plain.body[-1], *plain.body[:-1]))
    whole = reversed_dependences(wrong)
    assert not whole.is_empty()
    for changed in (["Z"], ["Y"], ["Z", "T"]):
        got = reversed_dependences(wrong, changed)
        assert got.is_equal(_touching(whole, k, changed)) and not got.is_empty()
    assert reversed_dependences(wrong, ["T"]).is_empty()
