"""The polyhedral core: kernels with exact isl domains and accesses (`kernel`, lowered from
ONNX by `lower`), dependences (`deps`), schedules as named loop trees over isl schedule
trees (`schedule`, `transform`, `api`), the isl AST (`ast`), default schedules (`default`),
and two independent executors used as oracles (`reference`, `interp`)."""
