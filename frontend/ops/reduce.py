"""Op family 'reduce' (being written)."""
