"""Kernels of a model compiled for all sizes that are compiled per size, on first use.

A group that cannot stay symbolic (`codegen.special`) keeps its subgraph, with symbolic
types, as the *source* of its specializations. At a run's sizes, the sizes it depends on
(`Specialized.params`) pick its specialization: compiled the first time they are met
(the subgraph at those sizes, `frontend.symbolic_graph.at_sizes`, compiled as a static
model of its own) and kept for every later run at them. The dynamic table of a run then
holds each specialization's entry function, constants table and arena, which the model's
trampolines pass on.

A saved model carries the sources, not the specializations compiled so far: they are
machine code for sizes one process happened to meet, and compiling one costs the same
after loading as before saving; `load` gives a model that compiles them again on first
use. The sources are written as `special<i>.json` (the graph with its sizes as `Dim`
texts), `special<i>.onnx` (its nodes) and `special<i>.npz` (its constants).
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from polytile.codegen.dynamic import SPECIAL_ENTRIES, DynamicPlan
from polytile.codegen.special import Specialized
from polytile.codegen.target import Target
from polytile.errors import CodegenError, PolytileError
from polytile.frontend import Graph
from polytile.frontend.graph import Node, TensorType
from polytile.frontend.onnx_io import attribute_value, node_to_proto
from polytile.frontend.symbolic import parse_dim, shape_texts
from polytile.frontend.symbolic_graph import at_sizes

if TYPE_CHECKING:
    from .runtime import CompiledModel

#: the sizes a specialization is compiled for: its kernel's sizes, in `params` order
SizesKey = tuple[int, ...]
#: compiles a static graph for a target (`polytile.compiler.compile_static`)
CompileGraph = Callable[[Graph, Target], "CompiledModel"]


class Specializations:
    """A model's kernels compiled per size: their sources, the specializations compiled
    so far (per kernel and sizes) and the dynamic tables that call them."""

    def __init__(
        self,
        model: str,
        specials: Sequence[Specialized],
        sources: Sequence[Graph],
        target: Target,
        compile_graph: CompileGraph | None = None,
    ) -> None:
        """`compile_graph` compiles a static graph for a target (`polytile.compiler`,
        which builds and loads models with it: this layer sits below the compiler)."""
        self.model = model
        self.compile_graph = compile_graph
        self.specials = tuple(specials)
        self.sources = tuple(sources)
        self.target = target
        #: (kernel number, sizes) → its compiled specialization
        self.compiled: dict[tuple[int, SizesKey], CompiledModel] = {}
        #: how many specializations were compiled (a test counts them)
        self.compilations = 0
        self._tables: dict[tuple[int, ...], np.ndarray] = {}
        self._lock = threading.Lock()
        #: the thread count the model was set to run with (`set_num_threads`), if any
        self._threads: int | None = None

    def set_num_threads(self, count: int) -> None:
        """Run the specializations, those compiled so far and later ones, on `count`
        threads, as the model's own kernels."""
        self._threads = count
        for model in self.compiled.values():
            model.set_num_threads(count)

    def table(self, plan: DynamicPlan, table: np.ndarray, values: Mapping[str, int]) -> np.ndarray:
        """The dynamic table at these sizes (`values`: every size's) with each
        specialized kernel's entries filled, compiling those not met yet."""
        key = tuple(int(values[n]) for n in plan.named)
        found = self._tables.get(key)
        if found is not None:
            return found
        with self._lock:
            filled = np.array(table, dtype=np.int64, copy=True)
            for number in range(len(self.specials)):
                model = self._specialization(number, values)
                at = plan.special_entry(number)
                filled[at : at + SPECIAL_ENTRIES] = addresses(model)
            filled.flags.writeable = False
            self._tables[key] = filled
        return filled

    def _specialization(self, number: int, values: Mapping[str, int]) -> CompiledModel:
        special = self.specials[number]
        sizes = tuple(int(values[p]) for p in special.params)
        found = self.compiled.get((number, sizes))
        if found is None:
            found = self._compile(number, dict(zip(special.params, sizes, strict=True)))
            if self._threads is not None:
                found.set_num_threads(self._threads)
            self.compiled[(number, sizes)] = found
            self.compilations += 1
        return found

    def _compile(self, number: int, sizes: Mapping[str, int]) -> CompiledModel:
        special = self.specials[number]
        shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
        where = f"model '{self.model}': {special.name}, compiled per size, at {shown or 'no sizes'}"
        if self.compile_graph is None:
            raise CodegenError(f"{where}: no compiler was given (load the model with pt.load)")
        name = f"{self.sources[number].name}@{'_'.join(map(str, sizes.values()))}"
        try:
            model = self.compile_graph(at_sizes(self.sources[number], sizes, name), self.target)
        except PolytileError as err:
            raise CodegenError(f"{where}: {err}") from err
        m = model.manifest
        if tuple(s.name for s in m.inputs) != special.inputs:
            raise CodegenError(f"{where}: it takes inputs {[s.name for s in m.inputs]}, "
                               f"not the kernel's {list(special.inputs)}")  # fmt: skip
        if m.copies or tuple(s.name for s in m.outputs) != special.outputs:
            raise CodegenError(f"{where}: its outputs are not all computed by its kernels")
        return model

    # --- saving -----------------------------------------------------------------------
    def save(self, root: Path) -> None:
        for i, source in enumerate(self.sources):
            save_source(source, root, f"special{i}")


def addresses(model: CompiledModel) -> list[int]:
    """A specialization's entries in the dynamic table: its entry function, constants
    table and arena (kept alive by the model, which the cache holds)."""
    return [
        model._jit.address(model.manifest.entry),
        ctypes.addressof(model._constant_table),
        model._arena.ctypes.data,
    ]


def save_source(graph: Graph, root: Path, stem: str) -> None:
    """A specialized kernel's source graph as `<stem>.json`, `.onnx` and `.npz`."""
    symbolic = sorted(n for n, v in graph.constants.items() if v.dtype == object)
    data = {
        "name": graph.name,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "opset": graph.opset,
        "aliases": dict(graph.aliases),
        "types": {n: [t.dtype, list(shape_texts(t.shape))] for n, t in graph.types.items()},
        "constants": list(graph.constants),
        "symbolic_constants": symbolic,
    }
    (root / f"{stem}.json").write_text(json.dumps(data, indent=1))
    nodes = helper.make_graph([node_to_proto(n) for n in graph.nodes], graph.name, [], [])
    (root / f"{stem}.onnx").write_bytes(nodes.SerializeToString())
    arrays = {
        f"c{i}": (np.vectorize(str, otypes=[str])(v) if n in symbolic else np.asarray(v))
        for i, (n, v) in enumerate(graph.constants.items())
    }
    np.savez(root / f"{stem}.npz", **arrays)  # type: ignore[arg-type]


def load_source(root: Path, stem: str) -> Graph:
    """The source graph `save_source` wrote."""
    data = json.loads((root / f"{stem}.json").read_text())
    proto = onnx.GraphProto()
    proto.ParseFromString((root / f"{stem}.onnx").read_bytes())
    nodes = tuple(
        Node(
            p.name, p.op_type, tuple(p.input), tuple(p.output),
            {a.name: attribute_value(a, p.name) for a in p.attribute}, p.domain,
        )
        for p in proto.node
    )  # fmt: skip
    types = {
        n: TensorType(tuple(d if isinstance(d, int) else parse_dim(d) for d in shape), dtype)
        for n, (dtype, shape) in data["types"].items()
    }
    symbolic = set(data["symbolic_constants"])
    constants = {}
    with np.load(root / f"{stem}.npz") as npz:
        for i, n in enumerate(data["constants"]):
            value = npz[f"c{i}"]
            if n in symbolic:
                value = np.array([parse_dim(str(t)) for t in value.flat], dtype=object).reshape(
                    value.shape
                )
            value.flags.writeable = False
            constants[n] = value
    return Graph(
        data["name"], nodes, tuple(data["inputs"]), tuple(data["outputs"]), types, constants,
        int(data["opset"]), dict(data["aliases"]),
    )  # fmt: skip


def describe(specials: Sequence[Specialized]) -> list[str]:
    """Lines saying which kernels are compiled per size and why (`explain`)."""
    lines = []
    for s in specials:
        sizes = ", ".join(s.params) or "no sizes"
        lines.append(f"{s.name}: compiled per size ({sizes}) on first use, because {s.reason}")
        lines.append(f"    nodes: {'; '.join(s.nodes)}")
    return lines
