"""Kernels written by hand, in a compact tensor-expression notation.

    k = kernel(
        "Y[i, j] += A[i, k] * B[k, j]",
        "C[i, j] = max(Y[i, j], 0)",
        A=(128, 128), B=(128, 128), name="mm_relu",
    )

Each statement is `T[index, ...] op expression [if condition]`:

- `op` is `=`, or a reduction: `+=` (sum), `*=` (prod), `max=`, `min=`. A reduction into a
  tensor no earlier statement wrote gets an init statement `<stmt>_init` (`init_of=<stmt>`)
  writing the combiner's identity, placed right before it; a reduction into a tensor
  written earlier accumulates onto its values.
- Indices are affine in the iteration variables: `+`, `-`, `*` by a constant, integer
  constants, `//` and `%` by a positive constant (isl `floor(e/c)`); an index that loads
  from a tensor (`A[I[i]]`) is an indirect load.
- The expression: loads, numbers, `inf`, iteration variables, `+ - * / % **`, unary `-`,
  comparisons, `and` / `or` / `not`, `x if c else y`, and the calls `max min exp log sqrt
  erf tanh pow floor ceil abs sigmoid relu where(c, a, b)`. `/` is true division (integer
  operands are made float), `%` is C's fmod (the IR's `mod`). Number literals take the type
  of the operand they meet; the result is cast to the written tensor's dtype.
- `if condition` restricts the domain (affine comparisons joined by `and` / `or` / `not`),
  e.g. a triangle `L[i, j] = A[i, j] if j <= i`. A reduction's init keeps the conjuncts
  that mention only the written variables.

Iteration variables are the names used in indices (and in the expression or condition)
that are not tensors. A variable used as a bare index at position p of a tensor T of known
shape has extent `T.shape[p]`; every such use must agree (else InputError naming the
variable and the tensors), or `extents={"i": 14}` fixes it. The domain is the box of the
extents (and the condition); every access is checked to stay within its tensor.

Tensors: keyword arguments give input shapes (a tuple, or an int for 1-D) or constant
values (numpy arrays). A shape entry (or an `extents` value) may be a name: a symbolic
size, an isl parameter of every domain (at least 1), so that the kernel is compiled once
for all sizes (`Kernel.params`, `Kernel.at`). Indices and conditions may use such a name
(`if w + t - 1 < m`); values may not. A written tensor's shape comes from its left-hand side's bare
variables unless given; it is an OUTPUT unless a statement after its last write reads it
(then TEMP), and `outputs=` overrides that. dtypes: `dtype` for all, `dtypes` per tensor.

Statements are named after the tensor they write (uniquified); dims are the left-hand
side's variables in order, then the remaining ones in order of appearance.

`kernel_from_node` builds the kernel of one ONNX node through the real frontend and
lowering, for comparing hand-written and lowered kernels.
"""

from polytile.poly.dsl.build import kernel
from polytile.poly.dsl.node import kernel_from_node

__all__ = ["kernel", "kernel_from_node"]
