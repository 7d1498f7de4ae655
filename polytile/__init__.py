"""polytile: an optimizing compiler for ONNX models built on the polyhedral model."""

__version__ = "0.1.0"
