"""Lowerings of family 'nn' (being written)."""
