// Hand-worked one-block cases for the scalar MX quantizer (values worked out on paper).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"

using namespace mxlab;

namespace {
std::vector<float> qdq(std::vector<float> v, NumFmt f, ScaleRule rule = ScaleRule::floor,
                       Rounding r = Rounding::nearest_even, QuantStats* st = nullptr) {
  QuantSpec s;
  s.fmt = f;
  s.rule = rule;
  s.rounding = r;
  std::vector<float> out(v.size());
  quantize_dequantize(v.data(), out.data(), 1, static_cast<int64_t>(v.size()), Axis::contiguous, s, st);
  return out;
}
}  // namespace

// The paper's example (section 5.1): layernorm gains 0.88-0.90 under E4M3 floor. amax < 1 so
// X = 2^(-1-8) = 2^-9; v/X is 451-462 > 448: every element clamps to 448 * 2^-9 = 0.875.
TEST(MxHandWorked, LayernormGainsAllClampToLastBin) {
  std::vector<float> g = {0.89740956f, 0.89628334f, 0.88358812f, 0.88474816f, 0.90372837f};
  QuantStats st;
  auto q = qdq(g, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_even, &st);
  for (float v : q) EXPECT_EQ(v, 0.875f);
  EXPECT_EQ(st.clamped, 5u);
  EXPECT_EQ(st.lastbin, 5u);
  // rceil: descale = 0.9037/448 rounds up to X = 2^-8, so v/X = 226-231 lies in [128, 256)
  // where the E4M3 grid is 16: every element rounds to 224, i.e. 0.875, without clamping.
  auto r = qdq(g, NumFmt::mxfp8_e4m3, ScaleRule::rceil, Rounding::nearest_even, &st);
  for (float v : r) EXPECT_EQ(v, 0.875f);
  EXPECT_EQ(st.clamped, 0u);
  EXPECT_EQ(st.lastbin, 0u);
}

TEST(MxHandWorked, TiesEvenAwayTowardZero) {
  // amax 1.0 -> X = 2^-8 (E4M3). 1.0 -> 256 exact. 1.0625*256 = 272 is a tie between 256 and
  // 288 (grid 32 in [256, 512)): even -> 256 (k=8), away -> 288.
  std::vector<float> v = {1.0f, 1.0625f};
  auto e = qdq(v, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_even);
  auto a = qdq(v, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_away);
  auto z = qdq(std::vector<float>{1.0f, 1.12f}, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::toward_zero);
  EXPECT_EQ(e[1], 1.0f);
  EXPECT_EQ(a[1], 1.125f);
  EXPECT_EQ(z[1], 1.0f);
  // Negative ties mirror positive ones.
  auto en = qdq(std::vector<float>{-1.0f, -1.0625f}, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_away);
  EXPECT_EQ(en[1], -1.125f);
}

TEST(MxHandWorked, SubnormalElementsKept) {
  // amax 1.0 -> X = 2^-8; 2^-17 / X = 2^-9: the smallest E4M3 subnormal, kept.
  auto q = qdq(std::vector<float>{1.0f, std::ldexp(1.0f, -17), std::ldexp(1.0f, -19)}, NumFmt::mxfp8_e4m3);
  EXPECT_EQ(q[1], std::ldexp(1.0f, -17));
  EXPECT_EQ(q[2], 0.0f);  // 2^-11 < half the smallest subnormal: rounds to zero
}

TEST(MxHandWorked, AllZeroBlockAndNaNBlock) {
  auto z = qdq(std::vector<float>(32, 0.0f), NumFmt::mxfp4_e2m1);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  std::vector<float> v(64, 1.0f);
  v[3] = std::numeric_limits<float>::quiet_NaN();
  v[40] = 3.0f;
  QuantStats st;
  auto q = qdq(v, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_even, &st);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(q[i])) << i;
  EXPECT_EQ(q[40], 3.0f);
  EXPECT_EQ(q[41], 1.0f);
  EXPECT_EQ(st.nan_blocks, 1u);
  EXPECT_EQ(shared_exponent(0.0f, elem_spec(Elem::fp8_e4m3), ScaleRule::floor, Bump::clamp), -127);
}

// Ties in every format. Each block's maximum is the format's max_normal, so floor gives X = 1
// and the values below are the elements themselves.
TEST(MxHandWorked, TiesInEveryFormat) {
  struct Case {
    NumFmt f;
    float amax, tie, even, away;
  };
  const Case cases[] = {
      // E5M2 [1, 2): grid 0.25; 1.125 is halfway between 1.0 (k=4, even) and 1.25 (k=5).
      {NumFmt::mxfp8_e5m2, 57344.0f, 1.125f, 1.0f, 1.25f},
      // E3M2 [4, 8): grid 1; 4.5 between 4 (even) and 5.
      {NumFmt::mxfp6_e3m2, 28.0f, 4.5f, 4.0f, 5.0f},
      // E3M2 subnormals: grid 2^-4; 2^-5 between 0 (even) and 2^-4.
      {NumFmt::mxfp6_e3m2, 28.0f, 0.03125f, 0.0f, 0.0625f},
      // E2M3 [1, 2): grid 1/8; 1.0625 between 1.0 (even) and 1.125.
      {NumFmt::mxfp6_e2m3, 7.5f, 1.0625f, 1.0f, 1.125f},
      // E2M3 [4, 8): grid 0.5; 4.75 between 4.5 and 5.0 (k=10, even).
      {NumFmt::mxfp6_e2m3, 7.5f, 4.75f, 5.0f, 5.0f},
      // E2M1 [2, 4): grid 1; 2.5 between 2 (even) and 3.
      {NumFmt::mxfp4_e2m1, 6.0f, 2.5f, 2.0f, 3.0f},
      // E2M1 [4, 6]: grid 2; 5 between 4 (k=2, even) and 6.
      {NumFmt::mxfp4_e2m1, 6.0f, 5.0f, 4.0f, 6.0f},
      // E2M1 subnormal 0.5: 0.25 between 0 (even) and 0.5.
      {NumFmt::mxfp4_e2m1, 6.0f, 0.25f, 0.0f, 0.5f},
      // INT8 grid 1/64 (amax 1.5 -> X = 1): 1.5/64 between 1/64 and 2/64 (even).
      {NumFmt::mxint8, 1.5f, 1.5f / 64.0f, 2.0f / 64.0f, 2.0f / 64.0f},
      // INT8: 0.5/64 between 0 (even) and 1/64.
      {NumFmt::mxint8, 1.5f, 0.5f / 64.0f, 0.0f, 1.0f / 64.0f},
  };
  for (const Case& c : cases) {
    for (float sign : {1.0f, -1.0f}) {
      const std::vector<float> v = {c.amax, sign * c.tie};
      EXPECT_EQ(qdq(v, c.f, ScaleRule::floor, Rounding::nearest_even)[1], sign * c.even) << name(c.f) << " " << c.tie;
      EXPECT_EQ(qdq(v, c.f, ScaleRule::floor, Rounding::nearest_away)[1], sign * c.away) << name(c.f) << " " << c.tie;
    }
  }
}

TEST(MxHandWorked, LastBin) {
  QuantStats st;
  // E2M1: amax 6.5 -> X = 1 (floor(log2 6.5) = 2 = emax); 6.5 > 6 clamps to 6.
  auto q = qdq({6.5f, 1.0f}, NumFmt::mxfp4_e2m1, ScaleRule::floor, Rounding::nearest_even, &st);
  EXPECT_EQ(q[0], 6.0f);
  EXPECT_EQ(st.clamped, 1u);
  EXPECT_EQ(st.lastbin, 1u);
  // E5M2: 60000 -> X = 1, clamps to 57344.
  q = qdq({60000.0f}, NumFmt::mxfp8_e5m2, ScaleRule::floor, Rounding::nearest_even, &st);
  EXPECT_EQ(q[0], 57344.0f);
  // E4M3: 440 (block max 460, X = 1) rounds up into the last bin without clamping: grid 32 in
  // [256, 512), 440 -> 448. 430 rounds down to 416.
  q = qdq({460.0f, 440.0f, 430.0f}, NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_even, &st);
  EXPECT_EQ(q[1], 448.0f);
  EXPECT_EQ(q[2], 416.0f);
  EXPECT_EQ(st.clamped, 1u);  // only 460
  EXPECT_EQ(st.lastbin, 2u);  // 460 and 440
  // The same block under ceil: X = 2 (ceil(log2 460) - 8 = 1): 230 -> 224, 220 -> 224, 215 -> 208.
  q = qdq({460.0f, 440.0f, 430.0f}, NumFmt::mxfp8_e4m3, ScaleRule::ceil, Rounding::nearest_even, &st);
  EXPECT_EQ(q[0], 448.0f);
  EXPECT_EQ(q[1], 448.0f);
  EXPECT_EQ(q[2], 416.0f);
  EXPECT_EQ(st.clamped + st.lastbin, 0u);
}

TEST(MxHandWorked, SubnormalsInSmallFormats) {
  // E2M1 (amax 6, X = 1): subnormal grid 0.5. 0.3 -> 0.5 (nearest), 0 (toward zero).
  EXPECT_EQ(qdq({6.0f, 0.3f}, NumFmt::mxfp4_e2m1)[1], 0.5f);
  EXPECT_EQ(qdq({6.0f, 0.3f}, NumFmt::mxfp4_e2m1, ScaleRule::floor, Rounding::toward_zero)[1], 0.0f);
  // E3M2 (amax 28, X = 1): 2^-4 is the smallest subnormal, kept; 3 * 2^-4 also a subnormal code.
  EXPECT_EQ(qdq({28.0f, 0.0625f, 0.1875f}, NumFmt::mxfp6_e3m2)[1], 0.0625f);
  EXPECT_EQ(qdq({28.0f, 0.0625f, 0.1875f}, NumFmt::mxfp6_e3m2)[2], 0.1875f);
  // Scale 2^-127 (tiny block): E4M3's smallest subnormal times 2^-127 = 2^-136, a float32 subnormal.
  const float tiny = std::ldexp(1.0f, -136);
  EXPECT_EQ(qdq({std::ldexp(448.0f, -127), tiny}, NumFmt::mxfp8_e4m3)[1], tiny);
}

TEST(MxHandWorked, Int8) {
  QuantStats st;
  // amax 1.0 -> X = 1 (emax 0): -0.50390625 = -32.25/64 -> -32/64.
  EXPECT_EQ(qdq({1.0f, -0.50390625f}, NumFmt::mxint8)[1], -0.5f);
  // amax 1.99 -> X = 1; 1.99 * 64 = 127.36 > 127: clamps to 127/64.
  auto q = qdq({1.99f, 0.015625f}, NumFmt::mxint8, ScaleRule::floor, Rounding::nearest_even, &st);
  EXPECT_EQ(q[0], 127.0f / 64.0f);
  EXPECT_EQ(q[1], 0.015625f);
  EXPECT_EQ(st.clamped, 1u);
  // amax 100 -> X = 2^6: 100/64 = 1.5625 exact (100 = 100/64 * 64); 3 -> 3/64 -> 3.
  q = qdq({100.0f, 3.0f, 0.4f}, NumFmt::mxint8);
  EXPECT_EQ(q[0], 100.0f);
  EXPECT_EQ(q[1], 3.0f);
  EXPECT_EQ(q[2], 0.0f);  // 0.4/64 = 0.00625 < 1/128: rounds to 0
}

TEST(MxHandWorked, InfBlockAndZeroBlockUnderEveryRule) {
  QuantStats st;
  auto q = qdq({1.0f, -INFINITY, 2.0f}, NumFmt::mxfp6_e2m3, ScaleRule::floor, Rounding::nearest_even, &st);
  for (float v : q) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(st.nan_blocks, 1u);
  for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
    for (float v : qdq(std::vector<float>(5, 0.0f), NumFmt::mxint8, static_cast<ScaleRule>(r))) EXPECT_EQ(v, 0.0f);
}
