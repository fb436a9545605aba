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
