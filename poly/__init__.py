"""polytile.poly: not built yet (see DESIGN.md)."""
