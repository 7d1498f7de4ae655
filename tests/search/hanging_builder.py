"""A build worker whose first build of decisions that unroll never returns, busy in
Python and holding the GIL as a long isl call does (the decisions are written to
`$HANG_MARK`); every build's decisions are logged to `$HANG_LOG`. Otherwise the real
worker."""

from __future__ import annotations

import json
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import polytile.search.builder as builder

_build = builder._build


def _hanging_build(space: object, decisions: dict, features: bool) -> tuple:
    key = json.dumps(dict(decisions), sort_keys=True)
    with open(os.environ["HANG_LOG"], "a") as log:
        log.write(key + "\n")
    mark = Path(os.environ["HANG_MARK"])
    if decisions["unroll"] and (not mark.exists() or mark.read_text() == key):
        mark.write_text(key)
        while True:  # never returns, never releases the GIL for long
            pass
    return _build(space, decisions, features)


if __name__ == "__main__":
    builder._build = _hanging_build
    builder._serve(Connection(int(sys.argv[1])))
