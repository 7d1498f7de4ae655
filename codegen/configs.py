"""What a target asks of the stages before codegen: the default schedules' settings and
the compute definitions (`compile`, `tune` and the CLI all take them from here, so a
kernel is lowered and scheduled alike wherever it is built)."""

from __future__ import annotations

from polytile.poly.default.schedule import DefaultConfig
from polytile.poly.lower.base import LowerConfig

from .target import Target


def default_config(target: Target) -> DefaultConfig:
    """The default schedules' settings for a target: its vector width, threads and L2."""
    return DefaultConfig(
        vector_width=target.lanes("float32"),
        threads=target.num_threads,
        cache_bytes=target.l2_bytes,
    )


def lower_config(target: Target) -> LowerConfig:
    """The compute definitions for a target: Winograd convs only with at least 32 vectors
    of channels in and out. Its transforms move every input and output pixel through
    memory again while its matrix product saves work per channel pair, so it pays only
    for many channels, and the fewer the wider the vectors (the direct conv is faster
    then): `benchmarks/conv_bench.py` measures the threshold against the direct conv."""
    lanes = target.lanes("float32")
    return LowerConfig(winograd_channels=32 * lanes, vector_width=lanes)
