"""Shared fixtures: the directory of this file is on sys.path, so tests import helpers
(`node_cases`) directly."""
