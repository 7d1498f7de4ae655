"""`tune` as the public API gives it: the search (`search.tune.tune`) with its in-model
validation compiling the model's variants by `compile` (the search, a stage before the
compiler, takes the compile function from its caller)."""

from __future__ import annotations

from typing import Any

from polytile.frontend.importer import ModelSource
from polytile.search.tune import TuneResult
from polytile.search.tune import tune as search

from .compiler import compile


def tune(model: ModelSource, trials: int, records: str, **options: Any) -> TuneResult:
    """Tune a model's kernels for `trials` measurements, appending them to the records
    file `records`; the options are `search.tune.tune`'s (`validation=ValidateConfig()`
    re-ranks each task's best candidates inside the model)."""
    return search(model, trials, records, compile_model=compile, **options)
