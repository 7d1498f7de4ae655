"""exp, erf and tanh of float32 values as inline arithmetic, for whole vectors and
scalars alike.

Softmax, sigmoid (SiLU, Swish), ELU and the normalizations spend most of their time in
exp. A libmvec call (`codegen.vecmath`) is opaque to LLVM: each vector pays a call,
its arguments and results go through the calling convention, and LLVM cannot
interleave the independent vectors of an unrolled row. Inline, exp is 15 vector
instructions LLVM schedules with the rest of the kernel.

The method: n = round(x / ln 2) by the shifter trick (adding 1.5 * 2^23 leaves n in the
low mantissa bits, with the exponent bias folded in), r = x - n ln 2 (in two parts, the
first exact for every n in range), exp(r) by Cephes' degree-7 polynomial on
|r| <= ln 2 / 2, and 2^n made by shifting those bits into the exponent. The polynomial
gives 2 exp(r) and the scale 2^(n-1), so that n = 128 (results up to float32's largest)
still builds a normal power; past float32's range the product becomes inf. Results
below 2^-125.5 (x < -86.99, near float32's smallest normal) flush to 0, as code
running with flush-to-zero would give them. Within 2 ulp of the exact result elsewhere
(`tests/codegen/test_fastmath.py` checks 4 against float64 numpy, the bound
`codegen.vecmath` is held to); NaN passes through.

erf (GELU) and tanh (GELU's tanh form) are Eigen's rational approximations
x P(x^2) / Q(x^2), clamped where the function is ±1 in float32: a dozen multiply-adds
and a division; tanh of |x| below 0.0004 is x.

Scalar code uses the same arithmetic, so the remainder lanes of a row that vector code
leaves to scalar code get the bits its vector lanes would have.
"""

from __future__ import annotations

from llvmlite import ir

from .llvm_types import I32, constant

#: inputs are clamped to where n stays within [-126, 128]: exp overflows past 88.72
#: (the product then rounds to inf), and below LOW the scale's exponent field is 0
HIGH = 88.8
LOW = -87.33
LOG2E = 1.44269504088896341
#: 1.5 * 2^23 + 126: t = x log2(e) + SHIFTER holds n + 126 in its low mantissa bits
SHIFTER = 12582912.0 + 126.0
#: ln 2 in two parts: n * LN2_HIGH is exact for |n| < 2^15
LN2_HIGH = 0.693359375
LN2_LOW = -2.12194440e-4
#: 2 exp(r): twice Cephes' expf polynomial 1 + r + r^2 P(r), highest degree first
POLYNOMIAL = tuple(
    2 * c
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
        1.0,
        1.0,
    )
)
#: erf's numerator (odd: times x) and denominator polynomials in x^2, highest degree
#: first, and the bound past which erf is ±1 in float32 (Eigen's coefficients)
ERF_NUMERATOR = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
ERF_DENOMINATOR = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)
ERF_BOUND = 4.0
#: tanh's, likewise, the bound and the magnitude below which tanh(x) is x in float32
TANH_NUMERATOR = (
    -2.76076847742355e-16,
    2.00018790482477e-13,
    -8.60467152213735e-11,
    5.12229709037114e-08,
    1.48572235717979e-05,
    6.37261928875436e-04,
    4.89352455891786e-03,
)
TANH_DENOMINATOR = (
    1.19825839466702e-06,
    1.18534705686654e-04,
    2.26843463243900e-03,
    4.89352518554385e-03,
)
TANH_BOUND = 7.90531110763549805
TANH_TINY = 0.0004
#: float32's mantissa bits
MANTISSA = 23
FLAGS = ("contract",)


#: the functions computed here
FUNCTIONS = ("exp", "erf", "tanh")


def applies(name: str, ty: ir.Type) -> bool:
    """Whether function `name` of values of this type is computed here (float32, scalar
    or vector)."""
    if name not in FUNCTIONS:
        return False
    element = ty.element if isinstance(ty, ir.VectorType) else ty
    return isinstance(element, ir.FloatType)


def _int_type(ty: ir.Type) -> ir.Type:
    return ir.VectorType(I32, ty.count) if isinstance(ty, ir.VectorType) else I32


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp(x) of float32 `x`, scalar or vector."""
    ty = x.type
    # clamped (NaN compares false, stays NaN and makes the result NaN)
    low, high = constant(ty, LOW), constant(ty, HIGH)
    clamped = b.select(b.fcmp_ordered("<", x, low), low, x)
    clamped = b.select(b.fcmp_ordered(">", clamped, high), high, clamped)
    shifter = constant(ty, SHIFTER)
    t = b.fadd(b.fmul(clamped, constant(ty, LOG2E), flags=FLAGS), shifter, flags=FLAGS)
    n = b.fsub(t, shifter)  # n + 126 - 126, exactly
    r = b.fsub(clamped, b.fmul(n, constant(ty, LN2_HIGH), flags=FLAGS), flags=FLAGS)
    r = b.fsub(r, b.fmul(n, constant(ty, LN2_LOW), flags=FLAGS), flags=FLAGS)
    y = _polynomial(b, r, POLYNOMIAL)
    ity = _int_type(ty)
    scale = b.bitcast(b.shl(b.bitcast(t, ity), constant(ity, MANTISSA)), ty)
    return b.fmul(y, scale)


def _polynomial(b: ir.IRBuilder, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
    """The polynomial at x by Horner's rule (coefficients highest degree first)."""
    y = constant(x.type, coefficients[0])
    for c in coefficients[1:]:
        y = b.fadd(b.fmul(y, x, flags=FLAGS), constant(x.type, c), flags=FLAGS)
    return y


def _rational(
    b: ir.IRBuilder, x: ir.Value, bound: float, numerator: tuple, denominator: tuple
) -> ir.Value:
    """x P(x^2) / Q(x^2) of x clamped to [-bound, bound] (NaN stays NaN)."""
    ty = x.type
    low, high = constant(ty, -bound), constant(ty, bound)
    clamped = b.select(b.fcmp_ordered("<", x, low), low, x)
    clamped = b.select(b.fcmp_ordered(">", clamped, high), high, clamped)
    square = b.fmul(clamped, clamped)
    top = b.fmul(clamped, _polynomial(b, square, numerator))
    return b.fdiv(top, _polynomial(b, square, denominator))


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erf(x) of float32 `x`, scalar or vector."""
    return _rational(b, x, ERF_BOUND, ERF_NUMERATOR, ERF_DENOMINATOR)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh(x) of float32 `x`, scalar or vector."""
    value = _rational(b, x, TANH_BOUND, TANH_NUMERATOR, TANH_DENOMINATOR)
    tiny = constant(x.type, TANH_TINY)
    small = b.and_(b.fcmp_ordered("<", x, tiny), b.fcmp_ordered(">", x, b.fneg(tiny)))
    return b.select(small, x, value)


def call(b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    """Function `name` (one of `FUNCTIONS`) of x."""
    return {"exp": exp, "erf": erf, "tanh": tanh}[name](b, x)
