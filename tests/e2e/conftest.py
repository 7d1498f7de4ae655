"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from polytile import zoo


@pytest.fixture(scope="session")
def zoo_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One zoo cache per session: each model is materialized at most once per run, and
    tests never write to (or depend on) the user's ~/.cache."""
    return tmp_path_factory.mktemp("zoo-cache")


@pytest.fixture(scope="session")
def zoo_model() -> Callable[..., onnx.ModelProto]:
    """`zoo.build` memoized for the session, so several tests share one build.

    Meant for the small and mid-sized models (VGG-19 alone holds ~575 MB); callers must
    not mutate the returned model (copy it first).
    """
    built: dict[tuple[str, int], onnx.ModelProto] = {}

    def get(name: str, seed: int = 0) -> onnx.ModelProto:
        if (name, seed) not in built:
            built[name, seed] = zoo.build(name, seed)
        return built[name, seed]

    return get
