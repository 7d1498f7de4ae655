"""The polyhedral core, one subpackage per concern: the IR (`ir`: expressions, kernels,
schedules, dependences), lowering of ONNX ops to kernels (`lower`), the loop AST (`ast`),
exact analyses of scheduled code (`analysis`), checked transformations (`transform`),
default schedules (`default`), hand-written kernels (`dsl`) and two independent executors
used as test oracles (`oracle`)."""
