"""Every fused group of the smaller zoo models lowers to a kernel whose default schedule is
legal (every step is checked against the dependences), vectorized and parallel, and whose
AST builds. Semantics of lowering and schedules are tested on small shapes in tests/poly."""

from __future__ import annotations

import pytest

from polytile.frontend import import_model, optimize, partition
from polytile.poly.ast.build import build_ast
from polytile.poly.default.schedule import default_schedule
from polytile.poly.ir.schedule import check_order
from polytile.poly.lower import lower


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "transformer", "mlp"])
def test_every_group_gets_a_legal_default_schedule(name: str, zoo_model) -> None:
    graph = optimize(import_model(zoo_model(name), name=name))
    groups = partition(graph).groups
    vectorized = parallel = 0
    for group in groups:
        schedule = default_schedule(lower(graph, group))
        check_order(schedule, "default schedule")
        build_ast(schedule)
        annotations = {loop.annotation for loop, _ in schedule.loops()}
        vectorized += "vector" in annotations
        parallel += "parallel" in annotations
    assert vectorized >= 0.75 * len(groups)
    assert parallel >= 0.75 * len(groups)
