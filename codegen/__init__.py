"""Code generation: the isl AST of a scheduled kernel to LLVM IR (`kernel`, `values`),
the CPU target (`target`), one native module per model with its memory plan (`module`,
`plan`), compiled and loaded with LLVM's JIT (`jit`), and a single kernel run natively
(`native`)."""
