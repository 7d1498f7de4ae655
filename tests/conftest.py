"""Shared fixtures: the directory of this file is on sys.path, so tests import helpers
(`node_cases`) directly.

Under pytest-xdist every core already runs a test: `compile` then schedules and emits
kernels in its own process instead of forking workers that would only compete for the
same cores (the forked paths have tests of their own, which lower the thresholds)."""

from __future__ import annotations

import os

import polytile.codegen.link as _link
import polytile.compiler as _compiler

if os.environ.get("PYTEST_XDIST_WORKER"):
    _compiler.PARALLEL_SCHEDULE = 1 << 30
    _link.PARALLEL_EMIT = 1 << 30
