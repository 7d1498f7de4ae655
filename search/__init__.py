"""Schedule search: tasks of a model (`tasks`), the sketch-based search space (`space`),
cost models on polyhedral features (`cost_model`), isolated verified measurement
(`measure`), crash-safe JSONL records (`records`) and the tuning loop (`tune`)."""
