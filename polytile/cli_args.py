"""Parsing the command line's sizes: `--input-shapes`, `--bounds` and `--sizes`."""

from __future__ import annotations

import argparse

from polytile.errors import InputError


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
