"""Checked schedule and kernel transformations: the trace steps (`steps`) and the
rewrites they use (inline, pack, rfactor, fold, flatten, contraction, canonical names)."""
