"""Parsing the command line's values: `--input-shapes`, `--bounds`, `--sizes`, durations and
input files."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import numpy as np

from polytile.errors import InputError

if TYPE_CHECKING:
    from .runtime import CompiledModel


def parse_input_shapes(text: str | None) -> dict[str, tuple[int | str, ...]]:
    """`name:[1,3,224,224] ids:[batch,seq]` → {"name": (1, 3, 224, 224), "ids": ("batch",
    "seq")}: a name is a symbolic size, which the model is compiled for all values of."""
    shapes: dict[str, tuple[int | str, ...]] = {}
    if not text:
        return shapes
    for item in text.split():
        name, sep, dims = item.rpartition(":")
        shape: tuple[int | str, ...] | None = None
        if dims.startswith("[") and dims.endswith("]"):
            parts = [d.strip() for d in dims[1:-1].split(",") if d.strip()]
            if all(d.isdigit() or d.isidentifier() for d in parts):
                shape = tuple(int(d) if d.isdigit() else d for d in parts)
        if not sep or not name or shape is None:
            raise InputError(
                f"--input-shapes item '{item}' is not of the form name:[d0,d1,...] "
                "(sizes or size names)"
            )
        shapes[name] = shape
    return shapes


def parse_sizes(text: str | None, option: str) -> dict[str, tuple[int, ...]]:
    """`seq=1:512 batch=4` → {"seq": (1, 512), "batch": (4,)} (for --bounds and --sizes)."""
    found: dict[str, tuple[int, ...]] = {}
    for item in (text or "").replace(",", " ").split():
        name, sep, value = item.partition("=")
        numbers = value.split(":")
        if not sep or not name.isidentifier() or not all(n.isdigit() for n in numbers):
            raise InputError(f"{option} item '{item}' is not of the form name=N or name=LOW:HIGH")
        found[name] = tuple(int(n) for n in numbers)
    return found


def run_sizes(args: argparse.Namespace) -> dict[str, int]:
    """--sizes: the sizes a model compiled for all sizes runs at (each named size 1
    when not given)."""
    sizes = parse_sizes(getattr(args, "sizes", None), "--sizes")
    if any(len(v) != 1 for v in sizes.values()):
        raise InputError("--sizes takes name=N items")
    return {name: value[0] for name, value in sizes.items()}


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `2h` → seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise InputError(
            f"--time-budget takes a duration like 90s, 30m or 2h, not '{text}'"
        ) from None


def load_inputs(
    path: str | None,
    fill: str,
    model: CompiledModel,
    seed: int,
    sizes: dict[str, int] | None = None,
) -> dict:
    """Inputs from an .npz file (keys are input names), or random ones (at `sizes`, for
    a model compiled for all sizes)."""
    if path is None:
        if fill != "random":
            raise InputError(f"--fill takes 'random', not '{fill}'")
        return model.random_inputs(seed, sizes)
    try:
        with np.load(path) as data:
            feeds = {k: data[k] for k in data.files}
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read inputs from '{path}': {err}") from None
    # numpy saves ml_dtypes arrays (bfloat16, float8, ...) as raw records of their size
    for spec in model.manifest.inputs:
        value, dtype = feeds.get(spec.name), np.dtype(spec.dtype)
        if value is not None and value.dtype.kind == "V" and value.itemsize == dtype.itemsize:
            feeds[spec.name] = value.view(dtype)
    return feeds
