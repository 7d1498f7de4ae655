"""polytile.codegen: not built yet (see DESIGN.md)."""
