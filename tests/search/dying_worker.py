"""A measuring worker that dies (exit 3, as a crashed kernel would) while building a
candidate whose trace starts with `{"kind": "die"}`; otherwise the real worker."""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection

import polytile.search.measure as measure

_build = measure._build


def _dying_build(task: tuple, target: object, config: object, trace: list) -> tuple:
    if trace and trace[0].get("kind") == "die":
        os._exit(3)
    return _build(task, target, config, trace)


if __name__ == "__main__":
    measure._build = _dying_build
    measure._worker(Connection(int(sys.argv[1])))
