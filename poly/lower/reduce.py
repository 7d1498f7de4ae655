"""Lowerings of family 'reduce' (being written)."""
