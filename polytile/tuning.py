"""`tune` as the public API gives it: the search (`search.tune.tune`) with its in-model
validation compiling the model's variants by `compile` (the search, a stage before the
compiler, takes the compile function from its caller), on the graph `compile` imports
(`compiler.imported`: a model with symbolic sizes keeps them, under its bounds, and its
tasks are the kernels `compile` looks tuning records up for)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from polytile.frontend.importer import ModelSource
from polytile.search.tune import TuneResult
from polytile.search.tune import tune as search

from .compiler import compile, imported


def tune(
    model: ModelSource,
    trials: int,
    records: str,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    dynamic: bool | None = None,
    bounds: Mapping[str, Sequence[int]] | None = None,
    **options: Any,
) -> TuneResult:
    """Tune a model's kernels for `trials` measurements, appending them to the records
    file `records`; the options are `search.tune.tune`'s (`validation=ValidateConfig()`
    re-ranks each task's best candidates inside the model). `input_shapes`, `dynamic`
    and `bounds` are `compile`'s: a model with symbolic sizes is tuned once for all of
    them (`sizes=search.dynamic.SizesConfig(...)` says where), and `compile(model,
    records=...)` with the same arguments applies the records."""
    variant = functools.partial(compile, dynamic=dynamic, bounds=bounds)
    with imported(model, input_shapes, dynamic, bounds) as graph:
        return search(
            model, trials, records, input_shapes=input_shapes, compile_model=variant,
            graph=graph, **options,
        )  # fmt: skip
