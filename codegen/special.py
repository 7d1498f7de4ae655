"""Kernels of a model compiled for all sizes that are compiled per size instead.

Where one group of a symbolic model cannot stay symbolic (its lowering, schedule or code
needs a size the poly model cannot express), the rest of the model is still compiled
once for all sizes and that group is *specialized*: compiled on first use at each set of
the sizes it depends on, as a small static model of its own (`polytile.special`).

The entry function calls it like any kernel, through a trampoline emitted here: the
trampoline takes the group's tensors (its inputs, then its outputs, at their slots in
the model) and three entries of the dynamic table that the runtime fills per sizes:
the specialization's entry function, its constants table and its arena. It passes the
tensors on as the specialization's input and output tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llvmlite import ir

from polytile.frontend import Graph
from polytile.frontend.fusion import Group
from polytile.frontend.symbolic import Dim

from .dynamic import SPECIAL_ENTRIES
from .llvm_types import I32, I64, PTR

#: table entries per specialized kernel: its entry function, constants table, arena
ENTRIES = SPECIAL_ENTRIES


@dataclass(frozen=True)
class Specialized:
    """A group of a symbolic model compiled per size (see the module's docstring)."""

    step: int
    #: the group's node labels ("node 'n' (Op)"), for messages and `explain`
    nodes: tuple[str, ...]
    #: its tensors read from outside (constants excluded) and written for outside
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: the named sizes its shapes depend on (the key of its specializations)
    params: tuple[str, ...]
    #: why it cannot stay symbolic (the refusal's message)
    reason: str

    @property
    def name(self) -> str:
        """The kernel as messages name it: its step and first node."""
        first = self.nodes[0] if self.nodes else "(no nodes)"
        return f"kernel {self.step} ({first}{', ...' if len(self.nodes) > 1 else ''})"

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "params": list(self.params),
            "reason": self.reason,
        }

    @staticmethod
    def from_json(data: dict) -> Specialized:
        return Specialized(
            int(data["step"]),
            tuple(data["nodes"]),
            tuple(data["inputs"]),
            tuple(data["outputs"]),
            tuple(data["params"]),
            str(data["reason"]),
        )


def specialized(graph: Graph, group: Group, reason: str) -> Specialized:
    """The group `group` of `graph` as a kernel compiled per size, for `reason`."""
    sub = group.subgraph(graph)
    params: set[str] = set()
    for t in sub.types.values():
        params.update(p for d in t.shape if isinstance(d, Dim) for p in d.params)
    for value in sub.constants.values():
        if value.dtype == object:
            params.update(p for d in value.flat if isinstance(d, Dim) for p in d.params)
    labels = tuple(graph.node_by_name[n].label for n in group.nodes)
    return Specialized(group.index, labels, sub.inputs, sub.outputs, tuple(sorted(params)), reason)


def trampoline_module(
    name: str, names: Sequence[str], counts: Sequence[tuple[int, int]]
) -> ir.Module:
    """One trampoline per specialized kernel: `names[i]` passes its `counts[i]` = (inputs,
    outputs) tensors to the function whose address is its first i64 argument."""
    module = ir.Module(name=name)
    sub = ir.FunctionType(I32, [PTR] * 4)
    for fname, (ins, outs) in zip(names, counts, strict=True):
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * (ins + outs) + [I64] * 3),
                         name=fname)  # fmt: skip
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        tables = []
        for first, count in ((0, ins), (ins, outs)):
            table = b.alloca(PTR, size=ir.Constant(I32, max(1, count)))
            for i in range(count):
                at = b.gep(table, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR)
                b.store(fn.args[first + i], at)
            tables.append(table)
        address, constants, arena = fn.args[ins + outs :]
        callee = b.inttoptr(address, sub.as_pointer())
        args = [*tables, b.inttoptr(constants, PTR), b.inttoptr(arena, PTR)]
        b.call(callee, args)
        b.ret_void()
    return module
