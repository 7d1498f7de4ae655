"""polytile.search: not built yet (see DESIGN.md)."""
