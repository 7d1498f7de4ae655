"""ONNX frontend: load and validate a model, canonicalize and type it, optimize the graph
and partition it into fused groups.

    graph = import_model("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    graph = optimize(graph)          # the flat pass pipeline in `passes.PASSES`
    groups = partition(graph)        # a DAG of fused groups, one future kernel each

A model with symbolic sizes keeps them: `import_symbolic(model, {"x": ("batch", 3, 224,
224)})` types every tensor with `Dim` expressions over the named sizes.
"""

from .fusion import Group, Partition, partition
from .graph import Graph, Node, TensorType
from .importer import import_model, load_model, parameter_inputs
from .onnx_io import export_model
from .passes import PASSES, OptimizeConfig, Pass, PassReport, optimize, optimize_with_report
from .symbolic import Dim
from .symbolic_import import SymbolicModel, import_symbolic, symbolic_shapes

__all__ = [
    "PASSES",
    "Dim",
    "Graph",
    "Group",
    "Node",
    "OptimizeConfig",
    "Partition",
    "Pass",
    "PassReport",
    "SymbolicModel",
    "TensorType",
    "export_model",
    "import_model",
    "import_symbolic",
    "load_model",
    "optimize",
    "optimize_with_report",
    "parameter_inputs",
    "partition",
    "symbolic_shapes",
]
