"""The loop AST of a schedule: isl's AST generator output as frozen dataclasses
(`build`), partial tiles (`tiles`), index text in AST form (`quasi`) and the exact check
that every statement instance runs once (`check`)."""
