"""ONNX frontend: load and validate a model, canonicalize and type it, optimize the graph
and partition it into fused groups."""
