// Deterministic float transcendentals (exp, expm1, log, erf, tanh, sin/cos of 2*pi*u, Box-Muller)
// for the scalar code shared by the CPU reference and the CUDA kernels. libm's expf/erff/tanhf
// and CUDA's differ in the last bits, so both backends call these instead: they use only IEEE
// +, -, *, /, sqrt, comparisons and bit manipulation, which g++ (-ffp-contract=off) and nvcc
// (--fmad=false) evaluate identically, and return the canonical quiet NaN (0x7fc00000) for every
// NaN result so that even NaNs agree bit for bit. tests/gpu/test_detmath.cu checks the bits.
//
// Accuracy against double-precision std:: functions (max error in ulp of the exact value),
// measured over every float of the range (MXLAB_DETMATH_STRIDE=1 ./mxlab_tests
// --gtest_filter='DetMath.*' reproduces it; by default the test re-checks every 997th float):
//   det_exp        0.957 ulp  x in [-104, 89] (+Inf above 88.72, 0 below -103.97: exact)
//   det_expm1      1.403 ulp  x in [-20, 90]  (-1 below)
//   det_log        0.858 ulp  every positive float, subnormals included
//   det_erf        1.319 ulp  x in [-4.5, 4.5] (+-1 beyond, the correctly rounded value)
//   det_tanh       1.498 ulp  x in [-10, 10]  (+-1 beyond)
//   det_sincos_2pi 1.736 ulp  sin and cos, every u in [0, 1)
// Polynomials are Taylor series where those converge fast enough (exp, log, sin, cos) and
// Chebyshev fits otherwise (erf; tanh near 0), written in Horner form with plain * and + (no fmaf).
#pragma once
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "lab/core/hd.h"
#include "lab/core/philox.h"

namespace mxlab {

namespace detmath {

constexpr uint32_t kSignBit = 0x80000000u;
constexpr uint32_t kCanonicalNaN = 0x7fc00000u;
constexpr uint32_t kPosInf = 0x7f800000u;

// ln 2 split for Cody-Waite reduction: kLn2Hi has 11 significant bits, so k * kLn2Hi is exact
// for |k| < 2^13 and x - k * kLn2Hi loses nothing; kLn2Lo = ln 2 - kLn2Hi rounded to float.
constexpr float kLn2Hi = 0.693115234f;   // 0x1.62ep-1
constexpr float kLn2Lo = 3.19461833e-05f;
constexpr float kLog2e = 1.44269502f;
constexpr float kSqrt2 = 1.41421354f;

// exp(x) overflows float above ln(FLT_MAX + ulp/2) = 88.7228391 and rounds to 0 below
// ln(2^-150) = -103.972077; between the bounds used here and those values the scaling by 2^k
// produces the Inf / 0 / subnormal itself, correctly rounded from the polynomial value.
constexpr float kExpMaxArg = 89.0f;
constexpr float kExpMinArg = -104.0f;
// expm1 evaluates its series directly up to |x| = 1/2; above, after reduction, the k = 1 case
// then has e^r - 1 >= -0.19 and the final sum no longer cancels.
constexpr float kExpm1Direct = 0.5f;
// expm1(x) = -1 + e^x rounds to -1 once e^x < 2^-25, i.e. x < -17.33.
constexpr float kExpm1MinArg = -18.0f;
// Below kTanhSmall tanh uses an odd polynomial, above it expm1(2a) / (expm1(2a) + 2).
constexpr float kTanhSmall = 0.55f;
// 1 - tanh(a) = 2 / (e^(2a) + 1) < 2^-25 for a > 9.01: tanh rounds to 1.
constexpr float kTanhSaturate = 9.1f;
// erf(x) = 1 - erfc(x) rounds to 1 once erfc(x) < 2^-25, i.e. x > 3.92.
constexpr float kErfSaturate = 4.0f;
// Below kErfSplit erf uses its Taylor-like odd polynomial, above it 1 - exp(-x^2) R(1/x).
constexpr float kErfSplit = 1.0f;
constexpr float kErfTailCenter = 0.625f;  // middle of 1/x in [1/4, 1]

MXLAB_HD float canonical_nan() { return bits_f32(kCanonicalNaN); }
MXLAB_HD float pos_inf() { return bits_f32(kPosInf); }
MXLAB_HD bool is_nan(float x) { return x != x; }
MXLAB_HD float abs_bits(float x) { return bits_f32(f32_bits(x) & ~kSignBit); }
// |magnitude| with the sign of `sign` (copysign without libm).
MXLAB_HD float with_sign_of(float magnitude, float sign) {
  return bits_f32((f32_bits(magnitude) & ~kSignBit) | (f32_bits(sign) & kSignBit));
}

// 2^k for k in [-126, 127] (normal range), built from the exponent field.
MXLAB_HD float pow2i(int k) { return bits_f32(static_cast<uint32_t>(k + 127) << 23); }

// p * 2^k for p in [0.5, 2] and k in [-190, 254] with a single rounding: when the result is
// subnormal the first product stays normal (exact) and only the second one rounds.
MXLAB_HD float scale_pow2(float p, int k) {
  if (k > 127) return (p * pow2i(127)) * pow2i(k - 127);
  if (k < -126) return (p * pow2i(k + 64)) * pow2i(-64);
  return p * pow2i(k);
}

// Nearest integer of v (halves away from zero) for |v| < 2^23; the conversion truncates
// identically on both backends.
MXLAB_HD int round_to_int(float v) { return static_cast<int>(v + (v >= 0.0f ? 0.5f : -0.5f)); }

// x = k ln2 + r with |r| <= ln2/2 (plus a rounding hair), for |x| < 2^12.
MXLAB_HD float reduce_ln2(float x, int& k) {
  k = round_to_int(x * kLog2e);
  const float kf = static_cast<float>(k);
  return (x - kf * kLn2Hi) - kf * kLn2Lo;
}

// e^r - 1 for |r| <= 1/2: Taylor series to r^9 (truncation < 5e-10 relative), as
// r + r^2 (1/2! + r/3! + ...) so that the leading r is exact.
MXLAB_HD float expm1_poly(float r) {
  const float q =
      0.5f +
      r * (0.166666672f +
           r * (0.0416666679f +
                r * (0.00833333377f +
                     r * (0.00138888892f + r * (0.000198412701f + r * (2.48015876e-05f + r * 2.75573188e-06f))))));
  return r + (r * r) * q;
}

// Odd polynomial for erf on [0, 1): erf(x) = x + x Q(x^2), Q(z) ~ erf(sqrt z)/sqrt z - 1.
// Chebyshev fit of degree 7 on z in [0, 1] (mpmath.chebyfit), coefficients rounded to float;
// max |error| of Q 1.7e-9, i.e. < 0.03 ulp of erf.
MXLAB_HD float erf_small_q(float z) {
  return 0.128379166f +
         z * (-0.376126379f +
              z * (0.112837821f +
                   z * (-0.0268654302f +
                        z * (0.00522103161f +
                             z * (-0.000848408032f + z * (0.000112659589f + z * -9.66704465e-06f))))));
}

// erfc(x) e^(x^2) for x in [1, 4] as a polynomial in u = 1/x - 0.625 (u in [-0.375, 0.375]).
// Chebyshev fit of degree 10 (mpmath.chebyfit), coefficients rounded to float; the error
// times e^(-x^2), i.e. the absolute error it puts on erf, is at most 2.0e-9 (0.03 ulp).
MXLAB_HD float erfc_scaled_tail(float u) {
  return 0.305952996f +
         u * (0.382283777f +
              u * (-0.172394753f +
                   u * (0.0437669121f +
                        u * (0.0233294535f +
                             u * (-0.0469422974f +
                                  u * (0.0432424061f +
                                       u * (-0.0269273445f +
                                            u * (0.00445590075f + u * (0.0260340143f + u * -0.0328922085f)))))))));
}

// tanh(x) = x + x z P(z), z = x^2, for x in [0, 0.55]: P(z) ~ (tanh(sqrt z)/sqrt z - 1)/z.
// Chebyshev fit of degree 4 on z in [0, 0.3025] (mpmath.chebyfit), coefficients rounded to
// float; max |error of z P| 6e-9 (0.1 ulp).
MXLAB_HD float tanh_small_p(float z) {
  return -0.333333313f + z * (0.133331135f + z * (-0.0539094284f + z * (0.0213093888f + z * -0.00661022775f)));
}

}  // namespace detmath

// Correctly rounded square root (IEEE on both backends). NaN and negative inputs give the
// canonical NaN (x86 and CUDA produce different NaN bit patterns); sqrt(-0) = -0.
MXLAB_HD float sqrtf_ieee(float x) {
  if (detmath::is_nan(x) || x < 0.0f) return detmath::canonical_nan();
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// e^x. +Inf above 88.72, 0 below -103.97, exp(-Inf) = 0, exp(+Inf) = +Inf.
MXLAB_HD float det_exp(float x) {
  using namespace detmath;
  if (is_nan(x)) return canonical_nan();
  if (x > kExpMaxArg) return pos_inf();
  if (x < kExpMinArg) return 0.0f;
  int k;
  const float r = reduce_ln2(x, k);
  return scale_pow2(1.0f + expm1_poly(r), k);
}

// e^x - 1, accurate near 0 (used by det_tanh).
MXLAB_HD float det_expm1(float x) {
  using namespace detmath;
  if (is_nan(x)) return canonical_nan();
  if (x > kExpMaxArg) return pos_inf();
  if (x < kExpm1MinArg) return -1.0f;
  if (x == 0.0f) return x;  // keeps the sign of -0
  if (abs_bits(x) <= kExpm1Direct) return expm1_poly(x);  // tiny and subnormal x come back exact
  int k;
  const float r = reduce_ln2(x, k);
  const float em = expm1_poly(r);
  // 2^k e^r - 1 = (2^k - 1) + 2^k (e^r - 1): for |k| <= 24 both terms are exact, so the only
  // rounding is the final sum. Outside, the -1 (or the e^x) is below half an ulp.
  constexpr int kExactShift = 24;
  if (k > kExactShift || k < -kExactShift) return scale_pow2(1.0f + em, k) - 1.0f;
  const float t = pow2i(k);
  return (t - 1.0f) + t * em;
}

// Natural logarithm: NaN for x < 0 or NaN, -Inf at +-0, +Inf at +Inf; subnormals handled.
MXLAB_HD float det_log(float x) {
  using namespace detmath;
  if (is_nan(x) || x < 0.0f) return canonical_nan();
  if (x == 0.0f) return -pos_inf();
  if (x == pos_inf()) return x;
  // x = 2^e m with m in [sqrt(1/2), sqrt(2)]; subnormals are first scaled by 2^23 (exact).
  constexpr uint32_t kMinNormalBits = 0x00800000u;
  constexpr float kTwo23 = 8388608.0f;
  int e = 0;
  if (f32_bits(x) < kMinNormalBits) {
    x = x * kTwo23;
    e = -23;
  }
  const uint32_t b = f32_bits(x);
  e += static_cast<int>(b >> 23) - 127;
  float m = bits_f32((b & 0x007fffffu) | 0x3f800000u);  // mantissa in [1, 2)
  if (m > kSqrt2) {
    m = m * 0.5f;
    e += 1;
  }
  // log(1 + f) = 2 atanh(s) = 2s + s R(s^2) with s = f / (2 + f), |s| <= 0.1716 and
  // R = 2 (z/3 + z^2/5 + z^3/7 + z^4/9) (truncation < 2e-9 relative). Written as
  // f - (f^2/2 - s (f^2/2 + R)) (using s f = (f^2/2)(1 - s)) so that f, exact, comes last.
  const float f = m - 1.0f;  // exact (Sterbenz)
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float R = z * (0.666666687f + z * (0.400000006f + z * (0.285714298f + z * 0.222222224f)));
  const float hfsq = 0.5f * f * f;
  const float ef = static_cast<float>(e);
  // ef * kLn2Hi is exact (|e| <= 149), so the last addition is the main rounding.
  return ef * kLn2Hi + (f - (hfsq - (s * (hfsq + R) + ef * kLn2Lo)));
}

// Error function; erf(+-Inf) = +-1, odd (erf(-0) = -0).
MXLAB_HD float det_erf(float x) {
  using namespace detmath;
  if (is_nan(x)) return canonical_nan();
  const float a = abs_bits(x);
  float y;
  if (a < kErfSplit) {
    y = a + a * erf_small_q(a * a);
  } else if (a < kErfSaturate) {
    // erf = 1 - e^(-a^2) R(1/a): the rounding of a^2 changes erfc by < 1e-6 relative, i.e.
    // < 0.003 ulp of erf, so no exact-square splitting is needed (it would be for erfc).
    const float u = 1.0f / a - kErfTailCenter;
    y = 1.0f - det_exp(-(a * a)) * erfc_scaled_tail(u);
  } else {
    y = 1.0f;
  }
  return with_sign_of(y, x);
}

// Hyperbolic tangent; tanh(+-Inf) = +-1, odd, tanh(x) = x for tiny x.
MXLAB_HD float det_tanh(float x) {
  using namespace detmath;
  if (is_nan(x)) return canonical_nan();
  const float a = abs_bits(x);
  float t = 1.0f;
  if (a < kTanhSmall) {
    const float z = a * a;
    t = a + a * (z * tanh_small_p(z));
  } else if (a < kTanhSaturate) {
    // tanh(a) = (e^(2a) - 1) / (e^(2a) + 1); 2a >= 1.1 so expm1 does not cancel.
    const float em = det_expm1(2.0f * a);
    t = em / (em + 2.0f);
  }
  return with_sign_of(t, x);
}

// sin(2 pi u) and cos(2 pi u) for u in [0, 1) (valid for any |u| < 2^20). The reduction is
// exact: 4u, its nearest integer q and f = 4u - q in [-1/2, 1/2] are all exact, and
// 2 pi u = q pi/2 + f pi/2; sin and cos of f pi/2 are Taylor series in f to degree 9 / 10
// (truncation < 3e-9 relative).
MXLAB_HD void det_sincos_2pi(float u, float& s, float& c) {
  using namespace detmath;
  const float v = 4.0f * u;
  const int q = round_to_int(v);
  const float f = v - static_cast<float>(q);
  const float z = f * f;
  const float sf =
      f * (1.57079637f + z * (-0.645964086f + z * (0.0796926245f + z * (-0.00468175393f + z * 0.000160441181f))));
  const float cf =
      1.0f + z * (-1.23370051f + z * (0.2536695f + z * (-0.0208634809f + z * (0.000919260259f + z * -2.52020418e-05f))));
  switch (q & 3) {
    case 0: s = sf; c = cf; break;
    case 1: s = cf; c = -sf; break;
    case 2: s = -sf; c = -cf; break;
    default: s = -cf; c = sf; break;
  }
}

// Two independent N(0, 1) samples from two random words (Box-Muller): radius from the
// (0, 1] uniform of u0 (log is finite), angle from the [0, 1) uniform of u1.
MXLAB_HD void det_box_muller(uint32_t u0, uint32_t u1, float& z0, float& z1) {
  const float radius = sqrtf_ieee(-2.0f * det_log(u32_to_uniform_open0(u0)));
  float s, c;
  det_sincos_2pi(u32_to_uniform(u1), s, c);
  z0 = radius * c;
  z1 = radius * s;
}

}  // namespace mxlab
