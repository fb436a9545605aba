// Accuracy and special values of lab/core/detmath.h against double-precision std:: functions.
// The bounds are the maxima of an exhaustive sweep (header comment); by default the test
// re-checks every 997th float (~2M points per range) to stay fast. MXLAB_DETMATH_STRIDE=1
// makes it exhaustive (minutes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>

#include "lab/core/detmath.h"
#include "lab/core/philox.h"
#include "lab/model/elementwise.h"

using namespace mxlab;

namespace {

constexpr uint32_t kDefaultStride = 997;  // prime, so the sweep visits all mantissa patterns alike

uint32_t sweep_stride() {
  const char* env = std::getenv("MXLAB_DETMATH_STRIDE");
  const long v = env ? std::strtol(env, nullptr, 10) : 0;
  return v > 0 ? static_cast<uint32_t>(v) : kDefaultStride;
}
const float kInf = std::numeric_limits<float>::infinity();
constexpr uint32_t kCanonicalNaN = 0x7fc00000u;

// Error of `got` in units in the last place of the exact value `ref` (as a float would have
// it; 2^-149 below the normal range). A NaN or an infinity where the rounded reference is
// finite counts as an infinite error, so the sweeps also check "no NaN, no spurious Inf".
double ulp_error(float got, double ref) {
  const float ref_f = static_cast<float>(ref);
  if (std::isnan(ref)) return std::isnan(got) ? 0.0 : HUGE_VAL;
  if (std::isnan(got)) return HUGE_VAL;
  if (std::isinf(ref_f)) return got == ref_f ? 0.0 : HUGE_VAL;
  if (std::isinf(got)) return HUGE_VAL;
  double ulp = std::ldexp(1.0, -149);
  if (ref != 0.0) {
    int e;
    std::frexp(ref, &e);  // |ref| in [2^(e-1), 2^e): float ulp 2^(e-24)
    ulp = std::ldexp(1.0, std::max(e - 24, -149));
  }
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

struct SweepResult {
  double max_ulp = 0.0;
  float worst_x = 0.0f;
  uint64_t count = 0;
};

// Every stride-th float in [lo, hi] (by bit pattern, both signs), worst ulp error of f vs ref.
SweepResult sweep(float lo, float hi, const std::function<float(float)>& f, const std::function<double(double)>& ref,
                  uint32_t stride = sweep_stride()) {
  SweepResult r;
  auto visit = [&](float x) {
    const double e = ulp_error(f(x), ref(static_cast<double>(x)));
    ++r.count;
    if (e > r.max_ulp) {
      r.max_ulp = e;
      r.worst_x = x;
    }
  };
  auto walk_magnitudes = [&](float mag_lo, float mag_hi, float sign) {
    for (uint64_t b = f32_bits(mag_lo); b <= f32_bits(mag_hi); b += stride) visit(sign * bits_f32(static_cast<uint32_t>(b)));
    visit(sign * mag_hi);  // the end point itself
  };
  if (hi >= 0.0f) walk_magnitudes(lo > 0.0f ? lo : 0.0f, hi, 1.0f);
  if (lo < 0.0f) walk_magnitudes(hi < 0.0f ? -hi : 0.0f, -lo, -1.0f);
  return r;
}

bool is_canonical_nan(float x) { return f32_bits(x) == kCanonicalNaN; }
bool sign_bit(float x) { return (f32_bits(x) >> 31) != 0; }

void expect_sweep(const char* name, const SweepResult& r, double bound) {
  EXPECT_LE(r.max_ulp, bound) << name << ": worst at x = " << r.worst_x << " (" << r.count << " points)";
  EXPECT_GT(r.count, 100000u) << name << ": sweep visited too few points";
  std::printf("[detmath] %-6s max %.3f ulp at %.9g over %llu points (bound %.2f)\n", name, r.max_ulp, r.worst_x,
              static_cast<unsigned long long>(r.count), bound);
}

// The exhaustive maxima of the header comment, rounded up to the next 0.05.
constexpr double kExpUlp = 1.00;
constexpr double kExpm1Ulp = 1.45;
constexpr double kLogUlp = 0.90;
constexpr double kErfUlp = 1.35;
constexpr double kTanhUlp = 1.50;
constexpr double kSinCosUlp = 1.75;

double exp_ref(double x) { return std::exp(x); }
double expm1_ref(double x) { return std::expm1(x); }
double log_ref(double x) { return std::log(x); }
double erf_ref(double x) { return std::erf(x); }
double tanh_ref(double x) { return std::tanh(x); }

}  // namespace

TEST(DetMath, ExpWithinUlpBound) {
  expect_sweep("exp", sweep(-20.0f, 20.0f, det_exp, exp_ref), kExpUlp);
  // Whole range: overflow to +Inf above 88.72 and gradual underflow to 0 below -87.3.
  expect_sweep("exp", sweep(-110.0f, 100.0f, det_exp, exp_ref), kExpUlp);
}

TEST(DetMath, Expm1WithinUlpBound) {
  expect_sweep("expm1", sweep(-20.0f, 20.0f, det_expm1, expm1_ref), kExpm1Ulp);
  expect_sweep("expm1", sweep(-110.0f, 100.0f, det_expm1, expm1_ref), kExpm1Ulp);
}

TEST(DetMath, LogWithinUlpBoundIncludingSubnormals) {
  expect_sweep("log", sweep(bits_f32(1u), FLT_MAX, det_log, log_ref), kLogUlp);
  expect_sweep("log", sweep(0.5f, 2.0f, det_log, log_ref, std::max(sweep_stride() / 32, 1u)), kLogUlp);  // near 1: log -> 0
}

TEST(DetMath, ErfWithinUlpBound) { expect_sweep("erf", sweep(-20.0f, 20.0f, det_erf, erf_ref), kErfUlp); }

// The bits of det_erf and of GeLU and its derivative (lab/model/elementwise.h), frozen: a hash
// of their values at every 251st float pattern (all of them: signs, subnormals, Inf, NaN).
// Results computed by earlier versions stay comparable only while these hold, and a
// restructuring of det_erf or of the GeLU formulas (say, to evaluate det_erf's branches
// separately in a kernel, as kernels/PERF.md tried for GeLU's erf) must leave them unchanged. A
// deliberate change of these functions updates the constants and says so in its commit.
TEST(DetMath, ErfAndGeluBitsAreFrozen) {
  auto fnv = [](uint64_t& h, float f) {
    const uint32_t b = f32_bits(f);
    for (int k = 0; k < 4; ++k) {
      h ^= (b >> (8 * k)) & 255u;
      h *= 1099511628211ull;
    }
  };
  uint64_t erf_hash = 1469598103934665603ull, gelu_hash = 1469598103934665603ull;
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += 251) {
    const float x = bits_f32(static_cast<uint32_t>(i));
    fnv(erf_hash, det_erf(x));
    fnv(gelu_hash, act_value(Act::gelu, x));
    fnv(gelu_hash, act_deriv(Act::gelu, x));
  }
  EXPECT_EQ(erf_hash, 0x0b64061ad81da899ull);
  EXPECT_EQ(gelu_hash, 0xa2c0468cfe0def1bull);
}

TEST(DetMath, TanhWithinUlpBound) { expect_sweep("tanh", sweep(-20.0f, 20.0f, det_tanh, tanh_ref), kTanhUlp); }

// The whole float line, both signs, NaN/Inf excluded: no function may return NaN or a
// spurious infinity for any finite input (GELU, tanh-GELU and SiLU feed them anything).
TEST(DetMath, NoNaNForAnyFiniteInput) {
  uint64_t bad = 0;
  for (uint64_t b = 0; b < 0x7f800000u; b += sweep_stride()) {
    for (float x : {bits_f32(static_cast<uint32_t>(b)), -bits_f32(static_cast<uint32_t>(b))}) {
      const float e = det_erf(x), t = det_tanh(x), ex = det_exp(x), em = det_expm1(x);
      if (std::isnan(e) || std::isnan(t) || std::isnan(ex) || std::isnan(em)) ++bad;
      if (!(std::fabs(e) <= 1.0f) || !(std::fabs(t) <= 1.0f) || !(ex >= 0.0f) || !(em >= -1.0f)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(DetMath, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = bits_f32(1u);  // smallest subnormal
  // exp
  EXPECT_EQ(det_exp(0.0f), 1.0f);
  EXPECT_EQ(det_exp(-0.0f), 1.0f);
  EXPECT_EQ(det_exp(-kInf), 0.0f);
  EXPECT_EQ(det_exp(kInf), kInf);
  EXPECT_EQ(det_exp(88.8f), kInf);
  EXPECT_EQ(det_exp(-104.5f), 0.0f);
  EXPECT_EQ(det_exp(-103.0f), static_cast<float>(std::exp(-103.0)));  // subnormal, correctly rounded here
  EXPECT_TRUE(is_canonical_nan(det_exp(nan)));
  // expm1
  EXPECT_EQ(det_expm1(0.0f), 0.0f);
  EXPECT_TRUE(sign_bit(det_expm1(-0.0f)));
  EXPECT_EQ(det_expm1(tiny), tiny);
  EXPECT_EQ(det_expm1(-kInf), -1.0f);
  EXPECT_EQ(det_expm1(kInf), kInf);
  EXPECT_TRUE(is_canonical_nan(det_expm1(nan)));
  // log
  EXPECT_EQ(det_log(1.0f), 0.0f);
  EXPECT_FALSE(sign_bit(det_log(1.0f)));
  EXPECT_EQ(det_log(0.0f), -kInf);
  EXPECT_EQ(det_log(-0.0f), -kInf);
  EXPECT_EQ(det_log(kInf), kInf);
  EXPECT_TRUE(is_canonical_nan(det_log(-1.0f)));
  EXPECT_TRUE(is_canonical_nan(det_log(-kInf)));
  EXPECT_TRUE(is_canonical_nan(det_log(nan)));
  EXPECT_LE(ulp_error(det_log(tiny), std::log(static_cast<double>(tiny))), kLogUlp);
  // erf
  EXPECT_EQ(det_erf(kInf), 1.0f);
  EXPECT_EQ(det_erf(-kInf), -1.0f);
  EXPECT_EQ(det_erf(FLT_MAX), 1.0f);
  EXPECT_EQ(det_erf(-FLT_MAX), -1.0f);
  EXPECT_EQ(det_erf(0.0f), 0.0f);
  EXPECT_TRUE(sign_bit(det_erf(-0.0f)));
  EXPECT_TRUE(is_canonical_nan(det_erf(nan)));
  EXPECT_LE(ulp_error(det_erf(tiny), std::erf(static_cast<double>(tiny))), kErfUlp);
  // tanh
  EXPECT_EQ(det_tanh(kInf), 1.0f);
  EXPECT_EQ(det_tanh(-kInf), -1.0f);
  EXPECT_EQ(det_tanh(-1e30f), -1.0f);
  EXPECT_EQ(det_tanh(tiny), tiny);
  EXPECT_TRUE(sign_bit(det_tanh(-0.0f)));
  EXPECT_TRUE(is_canonical_nan(det_tanh(nan)));
  // sqrt: IEEE, canonical NaN for negative input, sqrt(-0) = -0
  EXPECT_EQ(sqrtf_ieee(2.0f), static_cast<float>(std::sqrt(2.0)));
  EXPECT_EQ(sqrtf_ieee(tiny), static_cast<float>(std::sqrt(static_cast<double>(tiny))));
  EXPECT_EQ(sqrtf_ieee(kInf), kInf);
  EXPECT_TRUE(sign_bit(sqrtf_ieee(-0.0f)));
  EXPECT_TRUE(is_canonical_nan(sqrtf_ieee(-1.0f)));
  EXPECT_TRUE(is_canonical_nan(sqrtf_ieee(nan)));
}

// Reference for sin/cos(2 pi u): the same exact quadrant reduction (4u, q and f = 4u - q are
// exact in double too), then double sin/cos of f pi/2, so the reference is exact to ~1e-16
// even where sin(2 pi u) is 0 (where std::sin(2 * M_PI * u) would not be).
void sincos_2pi_ref(float u, double& s, double& c) {
  const double v = 4.0 * u;
  const double q = std::nearbyint(v);
  const double phi = (v - q) * (M_PI / 2.0);
  const double sf = std::sin(phi), cf = std::cos(phi);
  switch (static_cast<int>(q) & 3) {
    case 0: s = sf; c = cf; break;
    case 1: s = cf; c = -sf; break;
    case 2: s = -sf; c = -cf; break;
    default: s = -cf; c = sf; break;
  }
}

TEST(DetMath, SinCos2PiWithinUlpBound) {
  double max_s = 0.0, max_c = 0.0, max_abs_vs_std = 0.0;
  uint64_t n = 0;
  const uint32_t stride = std::max(sweep_stride() / 4, 1u);  // denser: [0, 1) only has 2^30 floats
  for (uint64_t b = 0; b < f32_bits(1.0f); b += stride, ++n) {
    const float u = bits_f32(static_cast<uint32_t>(b));
    float s, c;
    det_sincos_2pi(u, s, c);
    double rs, rc;
    sincos_2pi_ref(u, rs, rc);
    max_s = std::max(max_s, ulp_error(s, rs));
    max_c = std::max(max_c, ulp_error(c, rc));
    const double ang = 2.0 * M_PI * static_cast<double>(u);  // independent check of the reduction
    max_abs_vs_std = std::max({max_abs_vs_std, std::fabs(s - std::sin(ang)), std::fabs(c - std::cos(ang))});
  }
  std::printf("[detmath] sincos_2pi: sin %.3f ulp, cos %.3f ulp, max |diff| vs std::sin/cos %.3g over %llu points\n",
              max_s, max_c, max_abs_vs_std, static_cast<unsigned long long>(n));
  EXPECT_LE(max_s, kSinCosUlp);
  EXPECT_LE(max_c, kSinCosUlp);
  EXPECT_LE(max_abs_vs_std, 2.0 * FLT_EPSILON);
  // Exact points of the circle.
  float s, c;
  det_sincos_2pi(0.0f, s, c);
  EXPECT_EQ(s, 0.0f);
  EXPECT_EQ(c, 1.0f);
  det_sincos_2pi(0.25f, s, c);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(c, 0.0f);
  det_sincos_2pi(0.5f, s, c);
  EXPECT_EQ(s, 0.0f);
  EXPECT_EQ(c, -1.0f);
  det_sincos_2pi(0.75f, s, c);
  EXPECT_EQ(s, -1.0f);
  EXPECT_EQ(c, 0.0f);
}

// One million N(0,1) samples: mean, variance and fourth moment within 5 standard errors
// (standard errors of the sample moments of a normal: 1/sqrt(n), sqrt(2/n), sqrt(96/n)).
TEST(DetMath, BoxMullerMoments) {
  constexpr uint32_t kPairs = 500000;
  constexpr uint64_t kSeed = 20240611;
  double m1 = 0, m2 = 0, m4 = 0;
  float zmax = 0;
  for (uint32_t i = 0; i < kPairs; ++i) {
    const U32x4 w = philox(kSeed, Stream::data, 0, i);
    float z0, z1;
    det_box_muller(w.v[0], w.v[1], z0, z1);
    for (float z : {z0, z1}) {
      ASSERT_TRUE(std::isfinite(z));
      const double d = z;
      m1 += d;
      m2 += d * d;
      m4 += d * d * d * d;
      zmax = std::max(zmax, std::fabs(z));
    }
  }
  const double n = 2.0 * kPairs;
  m1 /= n;
  m2 /= n;
  m4 /= n;
  const double var = m2 - m1 * m1;
  std::printf("[detmath] box_muller: mean %.5f var %.5f E[z^4] %.4f max|z| %.3f over %.0f samples\n", m1, var, m4,
              zmax, n);
  EXPECT_LT(std::fabs(m1), 5.0 / std::sqrt(n));
  EXPECT_LT(std::fabs(var - 1.0), 5.0 * std::sqrt(2.0 / n));
  EXPECT_LT(std::fabs(m4 - 3.0), 5.0 * std::sqrt(96.0 / n));
  // The radius is at most sqrt(-2 ln 2^-24) = 5.77 (u is never below 2^-24).
  EXPECT_LE(zmax, 5.77f);
}

TEST(DetMath, BoxMullerFixedInputs) {
  float z0, z1;
  // u0 = all ones -> uniform 1 -> radius 0.
  det_box_muller(0xFFFFFFFFu, 0x12345678u, z0, z1);
  EXPECT_EQ(z0, 0.0f);
  EXPECT_EQ(z1, 0.0f);
  // u0 = 0 -> uniform 2^-24 -> the largest radius; u1 = 0 -> angle 0.
  det_box_muller(0u, 0u, z0, z1);
  EXPECT_NEAR(z0, std::sqrt(48.0 * std::log(2.0)), 4e-6);
  EXPECT_EQ(z1, 0.0f);
  // Against double-precision Box-Muller on the same uniforms.
  const uint32_t words[][2] = {{0x9E3779B9u, 0x7F4A7C15u}, {0x00000100u, 0x40000000u}, {0xDEADBEEFu, 0xC0FFEE00u}};
  for (const auto& w : words) {
    det_box_muller(w[0], w[1], z0, z1);
    const double u = u32_to_uniform_open0(w[0]), v = u32_to_uniform(w[1]);
    const double r = std::sqrt(-2.0 * std::log(u));
    EXPECT_NEAR(z0, r * std::cos(2.0 * M_PI * v), 4.0 * FLT_EPSILON * (r + 1.0));
    EXPECT_NEAR(z1, r * std::sin(2.0 * M_PI * v), 4.0 * FLT_EPSILON * (r + 1.0));
  }
  // Golden bits: every random stream of every run is built from these, so a change here
  // changes all data, initial weights and label noise (bump the version if it is deliberate).
  det_box_muller(0x9E3779B9u, 0x7F4A7C15u, z0, z1);
  EXPECT_EQ(f32_bits(z0), 0xBF7B1B2Cu);
  EXPECT_EQ(f32_bits(z1), 0x3C8BD9D2u);
}
