"""Lowerings of family 'injective' (being written)."""
