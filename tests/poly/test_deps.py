"""Which outputs may take over an input's buffer (`may_share`): only when every element of
the input is read before it is overwritten under any legal schedule, because the write
depends on the read's value."""

from __future__ import annotations

import pytest

from polytile.poly.dsl import kernel
from polytile.poly.ir.deps import may_share

from kernels import softmax_rows


@pytest.mark.parametrize(
    ("statements", "shapes", "source", "expected"),
    [
        # elementwise: each instance reads the element it writes
        (["Y[i, j] = max(A[i, j] + B[i, j], 0)"], {"A": (4, 6), "B": (4, 6)}, "B", True),
        # through a temporary: the writer reads what the reader wrote (a flow dependence)
        (["T[i] = A[i] * 2", "Y[i] = T[i] + 1"], {"A": 8}, "A", True),
        # a residual added to a matrix product, as a fused ResNet block
        (
            ["P[i, j] += A[i, k] * W[k, j]", "Y[i, j] = P[i, j] + R[i, j]"],
            {"A": (4, 3), "W": (3, 5), "R": (4, 5)},
            "R",
            True,
        ),
        # a transpose reads (j, i) and writes (i, j)
        (["Y[i, j] = A[j, i]"], {"A": (5, 5)}, "A", False),
        # a reduction reads a whole row for every element it writes
        (["Y[i, j] += A[i, k] * W[k, j]"], {"A": (4, 4), "W": (4, 4)}, "A", False),
        # different shapes lay the elements out differently
        (["Y[i, j] = A[j, i]"], {"A": (3, 5)}, "A", False),
    ],
)
def test_may_share(statements: list[str], shapes: dict, source: str, expected: bool) -> None:
    k = kernel(*statements, **shapes)
    assert may_share(k, source, k.outputs()[0].name) is expected


def test_a_neighbours_element_may_not_share() -> None:
    # a reversed loop would read A[i + 1] after Y[i + 1] overwrote it
    k = kernel("Y[i] = A[i + 1]", A=9, shapes={"Y": 9}, extents={"i": 8})
    assert not may_share(k, "A", "Y")
    # and in program order, A[i - 1] would already hold Y[i - 1]
    k = kernel("Y[i] = A[i - 1] if i >= 1", A=9, shapes={"Y": 9}, extents={"i": 9})
    assert not may_share(k, "A", "Y")


def test_a_reduction_feeding_every_element_may_share() -> None:
    # each output element depends on the row's max and sum, which read every element
    k = softmax_rows()
    assert may_share(k, "X", "Y")


def test_a_tensor_never_shares_with_itself_or_a_temporary_input() -> None:
    k = kernel("T[i] = A[i] * 2", "Y[i] = T[i] + A[i]", A=8)
    assert not may_share(k, "A", "A")
    assert may_share(k, "A", "Y")
    assert not may_share(k, "T", "Y")  # T is written by the kernel, not an input
