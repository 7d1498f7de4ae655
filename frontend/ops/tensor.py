"""Op family 'tensor' (being written)."""
