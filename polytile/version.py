"""polytile's version, in a module of its own: the stages below the public layer (records,
the cluster's environment check) name it without importing the package's public API."""

__version__ = "0.1.0"
