"""Test oracles: a kernel executed in program order (`reference`) and a schedule's AST
interpreted point by point (`interp`). Production code never imports them."""
