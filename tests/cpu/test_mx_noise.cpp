// `rounding: noise` (lab/mx/README.md, "Noise instead of rounding"): an MX role's element becomes
// v + u * ulp(v), ulp(v) the spacing of the element grid at v under the block's scale, u uniform on
// (-1/2, 1/2) from the element's word of Stream::mx_noise; nothing clamped, nothing on the grid.
// Checked here against an independent reference (the ulp from a hand-typed table of the formats
// and frexp, u from the Philox word, the sum correctly rounded from an exact double sum), its
// bound (within half an ulp of the block grid at v, and that ulp is the quantizer's own grid
// spacing there), its moments (mean 0, variance ulp^2 / 12, with a test shown to reject a bias of
// 0.05 ulp and a 10 % change of variance), zeros, NaN blocks, the random stream (same bits for a
// seed and step, other bits for another step, seed or element), the statistics (nearest_even's),
// hand-worked subnormal and beyond-the-top-binade elements, the configuration's spelling, and
// the study's E3 arms in training (each arm the single run of its recipe, bit for bit).
// The GPU twin (CPU = GPU bits): tests/gpu/test_mx_noise_gpu.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lab/config/config.h"
#include "lab/config/config_io.h"
#include "lab/core/error.h"
#include "lab/core/philox.h"
#include "lab/mx/format.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

// The element formats by hand (OCP MX v1.0 table): smallest and largest normal exponent, mantissa
// bits. int8: k/64, one spacing everywhere (emin = emax = 0, mbits 6).
struct Grid {
  NumFmt fmt;
  int emin, emax, mbits;
};
constexpr Grid kGrids[] = {{NumFmt::mxfp8_e4m3, -6, 8, 3}, {NumFmt::mxfp8_e5m2, -14, 15, 2},
                           {NumFmt::mxfp6_e3m2, -2, 4, 2}, {NumFmt::mxfp6_e2m3, 0, 2, 3},
                           {NumFmt::mxfp4_e2m1, 0, 2, 1},  {NumFmt::mxint8, 0, 0, 6}};

// ulp(v) in double: the spacing of g's grid at |v| / 2^s, times 2^s (frexp's exponent is
// floor(log2 |v|) + 1).
double ref_ulp(double v, int s, const Grid& g) {
  int ex = 0;
  std::frexp(std::fabs(v), &ex);
  int e = ex - 1 - s;
  if (e < g.emin) e = g.emin;
  if (e > g.emax) e = g.emax;
  return std::ldexp(1.0, e - g.mbits + s);
}

// u of a word: (k + 1/2) / 2^24 - 1/2 for k = the word's top 24 bits.
double ref_u(uint32_t w) { return (static_cast<double>(w >> 8) + 0.5) / 16777216.0 - 0.5; }

// fl32(a + b) for floats a, b, correctly rounded: the double sum and its exact error (Knuth's
// TwoSum); the double sum rounds to the float the exact sum rounds to unless it is itself a
// float32 midpoint, where the error's sign decides.
float ref_add(float a, float b) {
  const double x = a, y = b, s = x + y;
  const double bb = s - x, err = (x - (s - bb)) + (y - bb);
  if (err == 0.0) return static_cast<float>(s);
  return static_cast<float>(std::nextafter(s, err > 0 ? INFINITY : -INFINITY));
}

// The whole reference for one element v of a block with scale exponent s.
float ref_noise(float v, int s, const Grid& g, uint32_t word) {
  if (v == 0.0f) return v;
  const float n = static_cast<float>(ref_u(word) * ref_ulp(v, s, g));  // exact in double, rounded once
  return ref_add(v, n);
}

std::vector<float> qdq(const std::vector<float>& x, int64_t rows, int64_t cols, NumFmt f, Rounding r, Axis axis,
                       uint64_t seed, uint32_t salt, ScaleRule rule = ScaleRule::floor, QuantStats* st = nullptr,
                       Bump bump = Bump::clamp, int block = 32) {
  QuantSpec q;
  q.fmt = f;
  q.block = block;
  q.rule = rule;
  q.bump = bump;
  q.rounding = r;
  q.seed = seed;
  q.salt = salt;
  std::vector<float> out(x.size());
  quantize_dequantize(x.data(), out.data(), rows, cols, axis, q, st);
  return out;
}

// Blocks of every magnitude: each block a base exponent, elements 0..20 binades below it (so the
// element-subnormal range and float32 subnormals occur), some zeros, some short significands.
std::vector<float> make_input(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  int base = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % 32 == 0) base = static_cast<int>(rng() % 250) - 125;
    const int e = std::max(-149, base - static_cast<int>(rng() % 21));
    uint32_t mant = static_cast<uint32_t>(rng()) & 0x7FFFFFu;
    if (rng() % 4 == 0) mant &= 0x700000u;
    const uint32_t sign = (rng() & 1u) ? 0x80000000u : 0u;
    float v = std::ldexp(1.0f + static_cast<float>(mant) / 8388608.0f, e);
    if (rng() % 40 == 0) v = 0.0f;
    x[i] = bits_f32(f32_bits(v) | sign);
  }
  return x;
}

// The block scale exponents of a [rows x cols] tensor, per element (blocks along `axis`).
std::vector<int> scales_of(const std::vector<float>& x, int64_t rows, int64_t cols, Axis axis, NumFmt f, ScaleRule rule,
                           Bump bump, int k = 32) {
  std::vector<int> s(x.size());
  const ElemSpec& es = elem_spec(mx_elem(f));
  const int64_t lines = axis == Axis::contiguous ? rows : cols, len = axis == Axis::contiguous ? cols : rows;
  auto idx = [&](int64_t line, int64_t p) { return axis == Axis::contiguous ? line * cols + p : p * cols + line; };
  for (int64_t l = 0; l < lines; ++l)
    for (int64_t b = 0; b < len; b += k) {
      float amax = 0.0f;
      for (int64_t p = b; p < std::min(len, b + k); ++p) amax = std::max(amax, std::fabs(x[idx(l, p)]));
      const int se = block_scale_exp(amax, es, rule, bump);
      for (int64_t p = b; p < std::min(len, b + k); ++p) s[idx(l, p)] = se;
    }
  return s;
}

// Are these samples of (y - x) / ulp consistent with U(-1/2, 1/2)? Mean within 5 standard errors
// of 0 and variance within 5 standard errors of 1/12 (the variance of the sample variance of a
// uniform on an interval of length 1 is (1/80 - 1/144) / n).
bool uniform_half_moments(const std::vector<double>& r, std::string* why) {
  const double n = static_cast<double>(r.size());
  double sum = 0.0;
  for (double v : r) sum += v;
  const double mean = sum / n;
  double ss = 0.0;
  for (double v : r) ss += (v - mean) * (v - mean);
  const double var = ss / (n - 1.0);
  const double se_mean = std::sqrt(1.0 / 12.0 / n), se_var = std::sqrt((1.0 / 80.0 - 1.0 / 144.0) / n);
  *why = msg("mean ", mean, " (5 se = ", 5 * se_mean, "), variance ", var, " vs 1/12 = ", 1.0 / 12.0, " (5 se = ",
             5 * se_var, ")");
  return std::fabs(mean) <= 5 * se_mean && std::fabs(var - 1.0 / 12.0) <= 5 * se_var;
}

const Grid& grid_of(NumFmt f) {
  for (const Grid& g : kGrids)
    if (g.fmt == f) return g;
  throw Error("no grid");
}

}  // namespace

// Every format x scale rule (floor_bump with both bumps) x axis, blocks of every magnitude:
// the bits of quantize_dequantize(rounding noise) are the independent reference's, and its
// statistics those of nearest_even.
TEST(MxNoise, EqualsAnIndependentReferenceBitForBit) {
  const int64_t rows = 96, cols = 160;  // 5 blocks per row; strided: 3 blocks per column
  int64_t checked = 0, nonzero_noise = 0, sub_elements = 0, f32_subnormals = 0;
  for (const Grid& g : kGrids)
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (int bump = 0; bump < (static_cast<ScaleRule>(r) == ScaleRule::floor_bump ? 2 : 1); ++bump)
        for (Axis axis : {Axis::contiguous, Axis::strided}) {
          const ScaleRule rule = static_cast<ScaleRule>(r);
          const uint64_t seed = 0xA0 + static_cast<uint64_t>(r * 16 + bump * 4 + static_cast<int>(axis));
          const std::vector<float> x = make_input(static_cast<size_t>(rows * cols), seed ^ static_cast<uint64_t>(g.fmt));
          QuantStats st, st_ne;
          const auto y = qdq(x, rows, cols, g.fmt, Rounding::noise, axis, seed, 17, rule, &st, static_cast<Bump>(bump));
          qdq(x, rows, cols, g.fmt, Rounding::nearest_even, axis, seed, 17, rule, &st_ne, static_cast<Bump>(bump));
          const std::vector<int> s = scales_of(x, rows, cols, axis, g.fmt, rule, static_cast<Bump>(bump));
          int bad = 0;
          for (size_t i = 0; i < x.size(); ++i) {
            if (s[i] == kScaleExpNaN) {
              EXPECT_TRUE(std::isnan(y[i]));
              continue;
            }
            const uint32_t w = philox(seed, Stream::mx_noise, 17, i).v[0];
            const float want = ref_noise(x[i], s[i], g, w);
            if (f32_bits(want) != f32_bits(y[i]) && bad++ < 5)
              ADD_FAILURE() << name(g.fmt) << " " << name(rule) << (axis == Axis::strided ? " strided" : "")
                            << " [" << i << "] x=" << x[i] << " s=" << s[i] << ": got " << y[i] << " want " << want;
            ++checked;
            nonzero_noise += y[i] != x[i];
            sub_elements += x[i] != 0.0f && std::fabs(std::ldexp(static_cast<double>(x[i]), -s[i])) < std::ldexp(1.0, g.emin);
            f32_subnormals += x[i] != 0.0f && std::fabs(x[i]) < 1.17549435e-38f;
          }
          EXPECT_EQ(st.n, st_ne.n);
          EXPECT_EQ(st.blocks, st_ne.blocks);
          EXPECT_EQ(st.nan_blocks, st_ne.nan_blocks);
          EXPECT_EQ(st.clamped, st_ne.clamped) << name(g.fmt) << " " << name(rule);
          EXPECT_EQ(st.lastbin, st_ne.lastbin) << name(g.fmt) << " " << name(rule);
        }
  // The inputs reach what the test claims.
  EXPECT_GT(checked, 500000);
  EXPECT_GT(nonzero_noise, checked * 9 / 10);
  EXPECT_GT(sub_elements, checked / 20);
  EXPECT_GT(f32_subnormals, 100);
}

// |y - x| <= ulp / 2, and the ulp is the quantizer's own grid spacing at x: toward_zero puts x
// into [Q, Q + ulp) (in magnitude) with Q a multiple of the ulp, for every element the quantizer
// does not clamp.
TEST(MxNoise, WithinHalfAnUlpOfTheBlockGrid) {
  const int64_t rows = 64, cols = 256;
  int64_t checked = 0;
  for (const Grid& g : kGrids)
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::rceil}) {
      const std::vector<float> x = make_input(static_cast<size_t>(rows * cols), 99 + static_cast<uint64_t>(g.fmt));
      const auto y = qdq(x, rows, cols, g.fmt, Rounding::noise, Axis::contiguous, 5, 3, rule);
      const auto tz = qdq(x, rows, cols, g.fmt, Rounding::toward_zero, Axis::contiguous, 5, 3, rule);
      const std::vector<int> s = scales_of(x, rows, cols, Axis::contiguous, g.fmt, rule, Bump::clamp);
      const double max_normal = elem_spec(mx_elem(g.fmt)).max_normal();
      for (size_t i = 0; i < x.size(); ++i) {
        if (s[i] == kScaleExpNaN || x[i] == 0.0f) continue;
        const double ulp = ref_ulp(x[i], s[i], g);
        ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), ulp / 2) << name(g.fmt) << " x=" << x[i];
        if (std::fabs(std::ldexp(static_cast<double>(x[i]), -s[i])) > max_normal) continue;  // clamped by Q
        const double q = std::fabs(static_cast<double>(tz[i])), a = std::fabs(static_cast<double>(x[i]));
        ASSERT_EQ(std::fmod(q, ulp), 0.0) << name(g.fmt) << " x=" << x[i] << " Q=" << q << " ulp=" << ulp;
        ASSERT_TRUE(q <= a && a < q + ulp) << name(g.fmt) << " x=" << x[i] << " Q=" << q << " ulp=" << ulp;
        ++checked;
      }
    }
  EXPECT_GT(checked, 150000);
}

// The statistical test of the next test rejects what it must: a bias of 0.05 ulp, or a 10 %
// larger or smaller variance, on as many draws; and it accepts true uniforms.
TEST(MxNoise, TheMomentTestRejectsABiasOrAVarianceChange) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uni(-0.5, 0.5);
  std::vector<double> r(1000000);
  for (double& v : r) v = uni(rng);
  std::string why;
  EXPECT_TRUE(uniform_half_moments(r, &why)) << why;
  std::vector<double> biased = r, wide = r, narrow = r;
  for (double& v : biased) v += 0.05;
  for (double& v : wide) v *= std::sqrt(1.1);
  for (double& v : narrow) v *= std::sqrt(0.9);
  EXPECT_FALSE(uniform_half_moments(biased, &why)) << why;
  EXPECT_FALSE(uniform_half_moments(wide, &why)) << why;
  EXPECT_FALSE(uniform_half_moments(narrow, &why)) << why;
}

// Zero-mean noise of variance ulp^2 / 12: (y - x) / ulp over 10^6 elements of one seed, for
// MXFP8 E4M3 (the study's format), MXFP4 and MXINT8, in the normal and the subnormal element range.
TEST(MxNoise, ZeroMeanAndTheVarianceOfAUniformHalfUlp) {
  const int64_t rows = 1000, cols = 1024;
  for (NumFmt f : {NumFmt::mxfp8_e4m3, NumFmt::mxfp4_e2m1, NumFmt::mxint8}) {
    const Grid& g = grid_of(f);
    std::mt19937_64 rng(11);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& v : x) v = static_cast<float>(std::ldexp(1.0 + static_cast<double>(rng() % 1000000) / 1e6, static_cast<int>(rng() % 14) - 7));
    const auto y = qdq(x, rows, cols, f, Rounding::noise, Axis::contiguous, 2024, 9);
    const std::vector<int> s = scales_of(x, rows, cols, Axis::contiguous, f, ScaleRule::floor, Bump::clamp);
    std::vector<double> r(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      r[i] = (static_cast<double>(y[i]) - x[i]) / ref_ulp(x[i], s[i], g);
    std::string why;
    EXPECT_TRUE(uniform_half_moments(r, &why)) << name(f) << ": " << why;
    std::printf("[noise %s] %s\n", name(f), why.c_str());
  }
}

TEST(MxNoise, ZeroStaysZeroWithItsSign) {
  std::vector<float> x(64, 0.0f);
  for (size_t i = 0; i < 32; ++i) x[i] = (i % 2) ? -0.0f : 0.0f;  // an all-zero block
  for (size_t i = 32; i < 64; ++i) x[i] = (i % 3 == 0) ? -0.0f : (i % 3 == 1 ? 0.0f : 1.0f + static_cast<float>(i));
  for (NumFmt f : {NumFmt::mxfp8_e4m3, NumFmt::mxint8}) {
    const auto y = qdq(x, 1, 64, f, Rounding::noise, Axis::contiguous, 3, 1);
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] == 0.0f) EXPECT_EQ(f32_bits(y[i]), f32_bits(x[i])) << name(f) << " [" << i << "]";
      else EXPECT_NE(y[i], x[i]) << name(f) << " [" << i << "]";
  }
}

// A block holding NaN or Inf becomes all NaN, as under the quantizer; the other blocks are noised.
TEST(MxNoise, NanOrInfBlockIsNanLikeTheQuantizer) {
  std::vector<float> x(96, 1.5f);
  x[3] = NAN;
  x[40] = -INFINITY;
  const auto y = qdq(x, 1, 96, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::contiguous, 1, 1);
  for (size_t i = 0; i < 64; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
  for (size_t i = 64; i < 96; ++i) EXPECT_TRUE(std::isfinite(y[i]) && y[i] != 1.5f) << i;
}

// Same seed and step: same bits. Another step (the salt), another seed (another operand) or
// another element: other noise. The word is philox(seed, mx_noise, step, r * cols + c).v[0], not
// the stochastic-rounding word of the same element.
TEST(MxNoise, DeterministicPerSeedStepAndElement) {
  const std::vector<float> x = make_input(4096, 5);
  const auto a = qdq(x, 32, 128, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::contiguous, 11, 5);
  const auto b = qdq(x, 32, 128, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::contiguous, 11, 5);
  const auto c = qdq(x, 32, 128, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::contiguous, 11, 6);
  const auto d = qdq(x, 32, 128, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::contiguous, 12, 5);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  int diff_step = 0, diff_seed = 0, nonzero = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    nonzero += x[i] != 0.0f;
    diff_step += a[i] != c[i];
    diff_seed += a[i] != d[i];
  }
  EXPECT_GT(diff_step, nonzero * 9 / 10);
  EXPECT_GT(diff_seed, nonzero * 9 / 10);
  // Element 77 of a one-block row of 100 (amax 448: s = 0, so 100.3 has ulp 2^(6 - 3) = 8).
  std::vector<float> row(100, 0.0f);
  row[0] = 448.0f;
  row[77] = 100.3f;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    const auto q = qdq(row, 1, 100, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::contiguous, seed, 9);
    const uint32_t w = philox(seed, Stream::mx_noise, 9, 77).v[0];
    EXPECT_EQ(q[77], static_cast<float>(100.3f + ref_u(w) * 8.0)) << "seed " << seed;
    const uint32_t sr = philox(seed, Stream::stochastic_round, 9, 77).v[0];
    EXPECT_NE(q[77], static_cast<float>(100.3f + ref_u(sr) * 8.0)) << "seed " << seed;
  }
  // Element (r, c) of a strided quantization draws the word of r * cols + c, too.
  const auto st = qdq(x, 32, 128, NumFmt::mxfp8_e4m3, Rounding::noise, Axis::strided, 11, 5);
  const std::vector<int> s = scales_of(x, 32, 128, Axis::strided, NumFmt::mxfp8_e4m3, ScaleRule::floor, Bump::clamp);
  const size_t i = 5 * 128 + 77;
  EXPECT_EQ(f32_bits(st[i]), f32_bits(ref_noise(x[i], s[i], grid_of(NumFmt::mxfp8_e4m3),
                                                 philox(11, Stream::mx_noise, 5, i).v[0])));
}

// Hand-worked elements through the scalar function: u at its extremes (word 0: u = -(1/2 - 2^-25);
// word 0xFFFFFFFF: u = 1/2 - 2^-25), the ulp in the normal range, in the subnormal element range
// (the lowest binade's spacing), and beyond the top binade (the top binade's spacing, nothing
// clamped).
TEST(MxNoise, HandWorkedSubnormalAndBeyondTheTopBinade) {
  const ElemSpec& e4m3 = elem_spec(Elem::fp8_e4m3);
  const ElemSpec& int8 = elem_spec(Elem::int8);
  const double umax = 0.5 - std::ldexp(1.0, -25);
  EXPECT_EQ(noise_u(0xFFFFFFFFu), static_cast<float>(umax));
  EXPECT_EQ(noise_u(0u), static_cast<float>(-umax));
  EXPECT_EQ(noise_u(0x80000000u), static_cast<float>(std::ldexp(1.0, -25)));   // k = 2^23: u = +2^-25
  EXPECT_EQ(noise_u(0x7FFFFFFFu), static_cast<float>(-std::ldexp(1.0, -25)));  // k = 2^23 - 1
  struct Case {
    const ElemSpec& es;
    float v;
    int s;
    int ulp_exp;
  };
  const Case cases[] = {
      {e4m3, 300.0f, 0, 5},           // binade [256, 512): 2^(8 - 3)
      {e4m3, 1.0f, 0, -3},            // [1, 2): 2^-3
      {e4m3, 0.01f, 0, -9},           // below 2^-6: the subnormal spacing 2^(-6 - 3)
      {e4m3, 1e-30f, 0, -9},          // far below: the same
      {e4m3, 1e-33f, -100, -109},     // a tiny block's scale, below its subnormal range
      {e4m3, 1000.0f, 0, 5},          // beyond 448 and beyond the top binade: the top binade's 2^5
      {e4m3, 3.0e5f, 0, 5},           // far beyond
      {e4m3, -7.0f, -2, -1},          // |v| / 2^-2 = 28 in [16, 32): 2^(4 - 3) * 2^-2
      {int8, 0.3f, 0, -6},            // int8: 2^-6 everywhere
      {int8, 3.9f, 0, -6},            // beyond 127/64 and beyond 2: the top binade's 2^-6
      {int8, 3.9f, 5, -1},            // times the scale
      {e4m3, 1.5e-45f, -127, -136},   // the float32 subnormal 2^-149 in the smallest block scale
  };
  for (const Case& c : cases) {
    EXPECT_EQ(noise_ulp_exp(c.v, c.s, c.es), c.ulp_exp) << c.es.name << " v=" << c.v << " s=" << c.s;
    for (uint32_t w : {0u, 0xFFFFFFFFu, 0x12345678u}) {
      const double n = static_cast<double>(noise_u(w)) * std::ldexp(1.0, c.ulp_exp);
      const float want = ref_add(c.v, static_cast<float>(n));
      const ElemResult r = noise_element(c.v, c.s, c.es, w);
      EXPECT_EQ(f32_bits(r.value), f32_bits(want)) << c.es.name << " v=" << c.v << " s=" << c.s << " w=" << w;
    }
  }
  // Beyond max_normal nothing saturates: 1000 + u * 32 with u at its top is 1016 - 2^-20 (in
  // float32: 1016), far above 448.
  EXPECT_EQ(noise_element(1000.0f, 0, e4m3, 0xFFFFFFFFu).value, 1016.0f);
  EXPECT_TRUE(noise_element(1000.0f, 0, e4m3, 0xFFFFFFFFu).clamped);  // nearest_even's statistics
  EXPECT_EQ(noise_element(-1000.0f, 0, e4m3, 0xFFFFFFFFu).value, -984.0f);
  EXPECT_EQ(noise_element(-1000.0f, 0, e4m3, 0u).value, -1016.0f);
  // The largest scale a block of E4M3 gets (s = 119 for amax near FLT_MAX): the top binade's ulp.
  EXPECT_EQ(noise_ulp_exp(3.0e38f, 119, e4m3), 8 - 3 + 119);
}

// Configuration: `rounding: noise` for every role or per role, in patches, the misspellings'
// messages, and no noise for the element-wise ops (bf16 vector ops round to nearest only).
TEST(MxNoiseConfig, ParsesAndErrorsClearlyWhenMisspelled) {
  const RunConfig a = config_from_yaml_string("precision: {rounding: noise, elementwise: fp32}\n", "noise.yaml");
  for (PrecisionConfig::Role r : {PrecisionConfig::Role::weight, PrecisionConfig::Role::activation,
                                  PrecisionConfig::Role::grad, PrecisionConfig::Role::ln_affine,
                                  PrecisionConfig::Role::grad_wgrad})
    EXPECT_EQ(a.precision.rounding_of(r), Rounding::noise);
  EXPECT_FALSE(a.precision.elementwise_bf16);
  EXPECT_NE(dump_config(a).find("rounding: noise"), std::string::npos);
  const RunConfig b = config_from_yaml_string("precision: {rounding: {grad: noise}}\n", "noise.yaml");
  EXPECT_EQ(b.precision.rounding_of(PrecisionConfig::Role::grad), Rounding::noise);
  EXPECT_EQ(b.precision.rounding_of(PrecisionConfig::Role::grad_wgrad), Rounding::noise);
  EXPECT_EQ(b.precision.rounding_of(PrecisionConfig::Role::weight), Rounding::nearest_even);
  // The printed configuration reads back to the same one.
  EXPECT_TRUE(config_from_yaml_string(dump_config(b), "dump.yaml") == b);
  const RunConfig c = config_from_yaml_string("arms:\n  - {name: noise_mx, set: {rounding: noise}}\n", "arms.yaml");
  EXPECT_EQ(resolved_arms(c)[0].policy.rounding_of(PrecisionConfig::Role::ln_affine), Rounding::noise);
  auto error_of = [](const std::string& yaml) {
    try {
      config_from_yaml_string(yaml, "bad.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  for (const char* bad : {"precision: {rounding: nosie}\n", "precision: {rounding: {grad: noize}}\n",
                          "arms:\n  - {name: a, set: {rounding: nois}}\n"}) {
    const std::string e = error_of(bad);
    EXPECT_NE(e.find("bad.yaml:"), std::string::npos) << e;
    EXPECT_NE(e.find("did you mean 'noise'"), std::string::npos) << bad << " -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  const std::string e = error_of("precision: {elementwise_rounding: noise}\n");
  EXPECT_NE(e.find("elementwise_rounding"), std::string::npos) << e;
  EXPECT_NE(e.find("nearest_even"), std::string::npos) << e;
}

// The study's E3 arms (experiments/paper/why_mx_e3.yaml) on a tiny model: each arm trains the
// single run of its recipe bit for bit, the noise reaches the training (noise_mx differs from
// FP32 and from mx_all), and it stays finite.
TEST(MxNoiseTraining, E3ArmsEqualTheirSingleRuns) {
  RunConfig multi;
  multi.seed = 11;
  multi.steps = 20;
  multi.device = "cpu";
  multi.model.depth = 2;
  multi.model.width = 32;
  multi.model.hidden_mult = 2;
  multi.data.batch = 40;
  multi.optimizer.lr = 3e-3f;
  multi.precision.rounding = Rounding::nearest_away;
  multi.precision.elementwise_rounding = Rounding::nearest_away;
  multi.log.log_every = 5;
  multi.log.progress = false;
  multi.arms = {{"mx_all", "", {}},
                {"noise_mx", "", {{"rounding", "noise"}, {"elementwise", "fp32"}}},
                {"mx_sr_grad", "", {{"rounding.grad", "stochastic"}}}};
  const MemorySink m = test::run_in_memory(multi);
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    RunConfig single = multi;
    single.arms.clear();
    single.precision = arm.policy;
    const MemorySink s = test::run_in_memory(single);
    EXPECT_EQ(m.groups.at("trajectories/" + arm.name).loss_all, s.groups.at("trajectories/mx").loss_all) << arm.name;
  }
  const auto& noise = m.groups.at("trajectories/noise_mx").loss_all;
  ASSERT_EQ(noise.size(), 20u);
  for (float l : noise) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NE(noise, m.groups.at("trajectories/fp32").loss_all);
  EXPECT_NE(noise, m.groups.at("trajectories/mx_all").loss_all);
}
