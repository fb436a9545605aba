// Blocks at the top of the float32 range (lab/mx/README.md, "Blocks at the top of the float32
// range"): a finite block never quantizes to +-Inf. Where the rule asks for a scale above 2^127
// (int8 under ceil/even/rceil/floor_bump) or the block maximum would round to 2^128 or more,
// the block is all NaN (the E8M0 NaN scale, 0xFF), as torchao's EVEN does; everywhere else it is
// finite. Checked for every format, rule, rounding and bump, against an independent criterion
// in double precision, by hand on the cases the issue named, and through `mxlab quantize`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lab/core/exit_codes.h"
#include "lab/io/npy.h"
#include "lab/mx/format.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/cpu/run_binary_util.h"

using namespace mxlab;

namespace {

const float kMax = std::numeric_limits<float>::max();

const NumFmt kMx[] = {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2,
                      NumFmt::mxfp6_e2m3, NumFmt::mxfp4_e2m1, NumFmt::mxint8};
const Rounding kModes[] = {Rounding::nearest_even, Rounding::nearest_away, Rounding::toward_zero, Rounding::stochastic};

int floor_log2(double a) { return std::ilogb(a); }

// The rule's exponent without any clamp above (so > 127 means "no E8M0 scale"), in double.
int unclamped_scale(double amax, const ElemSpec& es, ScaleRule rule, Bump bump) {
  const int emax = es.emax();
  switch (rule) {
    case ScaleRule::floor: return floor_log2(amax) - emax;
    case ScaleRule::ceil: return static_cast<int>(std::ceil(std::log2(amax))) - emax;  // exact for these amax
    case ScaleRule::even: {
      const double ulp = std::ldexp(1.0, floor_log2(amax) - es.mbits);
      return floor_log2(std::floor(amax / ulp + 0.5) * ulp) - emax;
    }
    case ScaleRule::rceil: {
      const double d = static_cast<float>(amax * static_cast<double>(static_cast<float>(1.0 / es.max_normal())));
      const int fl = floor_log2(d);
      return std::ldexp(1.0, fl) == d ? fl : fl + 1;
    }
    case ScaleRule::floor_bump: {
      const int s = floor_log2(amax) - emax;
      return (bump == Bump::always || std::ldexp(amax, -s) > es.max_normal()) ? s + 1 : s;
    }
    default: return 0;
  }
}

// Does amax, quantized at scale s with `mode` (stochastic: rounded up), reach 2^128?
bool top_overflows(double amax, int s, const ElemSpec& es, Rounding mode) {
  const double r = std::ldexp(amax, -s);
  if (r > es.max_normal()) return std::ldexp(es.max_normal(), s) >= std::ldexp(1.0, 128);
  const int e = floor_log2(r) > es.emin() ? floor_log2(r) : es.emin();
  const double spacing = es.is_int() ? std::ldexp(1.0, -es.mbits) : std::ldexp(1.0, e - es.mbits);
  const double t = r / spacing, n = std::floor(t), frac = t - n;
  bool up = false;
  switch (mode) {
    case Rounding::nearest_even: up = frac > 0.5 || (frac == 0.5 && std::fmod(n, 2.0) == 1.0); break;
    case Rounding::nearest_away: up = frac >= 0.5; break;
    case Rounding::stochastic: up = frac > 0.0; break;
    default: break;
  }
  const double k = std::min((n + (up ? 1 : 0)) * spacing, es.max_normal());
  return std::ldexp(k, s) >= std::ldexp(1.0, 128);
}

bool expect_nan(float amax, const ElemSpec& es, ScaleRule rule, Bump bump, Rounding mode) {
  const int s = unclamped_scale(amax, es, rule, bump);
  return s > 127 || top_overflows(amax, s, es, mode);
}

// Block maxima at the top of the float32 range: FLT_MAX and below it, each format's rounding
// thresholds (and their neighbours), powers of two and the last-bin edges.
std::vector<float> top_amaxes() {
  std::vector<float> a;
  float v = kMax;
  for (int i = 0; i < 64; ++i, v = std::nextafter(v, 0.0f)) a.push_back(v);
  for (int m = 0; m <= 7; ++m)
    for (double frac : {0.25, 0.5, 0.75, 1.0}) {
      // (2^(m+1) - frac) * 2^(127 - m): the last grid steps below 2^128 for m mantissa bits.
      const double t = (std::ldexp(1.0, m + 1) - frac) * std::ldexp(1.0, 127 - m);
      if (t > kMax) continue;
      float c = static_cast<float>(t);
      for (int j = 0; j < 3; ++j) c = std::nextafter(c, 0.0f);
      for (int j = 0; j < 7 && c <= kMax; ++j, c = std::nextafter(c, INFINITY)) a.push_back(c);
    }
  for (double x : {1.0, 1.25, 1.5, 1.75, 1.875, 1.9375}) a.push_back(static_cast<float>(std::ldexp(x, 127)));
  a.push_back(std::nextafter(std::ldexp(1.0f, 127), 0.0f));
  return a;
}

// Quantizes [amax, -amax/2, 1, -0] as one block (and a second, ordinary block after it).
std::vector<float> quantize_block(float amax, NumFmt fmt, ScaleRule rule, Bump bump, Rounding mode, QuantStats* st) {
  const std::vector<float> x = {amax, -amax / 2, 1.0f, -0.0f, 3.0f, -1.5f, 0.25f, 2.0f};
  QuantSpec spec;
  spec.fmt = fmt;
  spec.block = 4;
  spec.rule = rule;
  spec.bump = bump;
  spec.rounding = mode;
  spec.seed = 7;
  std::vector<float> y(x.size());
  quantize_dequantize(x.data(), y.data(), 1, static_cast<int64_t>(x.size()), Axis::contiguous, spec, st);
  return y;
}

TEST(QuantizeTop, FiniteBlocksNeverBecomeInfAndNaNExactlyWhenNoScaleFits) {
  int checked = 0, nan_blocks = 0, failures = 0;
  for (NumFmt fmt : kMx) {
    const ElemSpec& es = elem_spec(mx_elem(fmt));
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (int b = 0; b < 2; ++b) {
        const ScaleRule rule = static_cast<ScaleRule>(r);
        const Bump bump = static_cast<Bump>(b);
        if (bump == Bump::always && rule != ScaleRule::floor_bump) continue;
        for (Rounding mode : kModes)
          for (float amax : top_amaxes()) {
            QuantStats st;
            const std::vector<float> y = quantize_block(amax, fmt, rule, bump, mode, &st);
            const bool nan = std::isnan(y[0]);
            const bool want = expect_nan(amax, es, rule, bump, mode);
            bool ok = nan == want && st.nan_blocks == (nan ? 1u : 0u);
            for (int i = 0; i < 4; ++i) ok = ok && (nan ? std::isnan(y[i]) : std::isfinite(y[i]));
            for (int i = 4; i < 8; ++i) ok = ok && std::isfinite(y[i]);  // the other block is untouched
            if (!ok && failures++ < 10)
              ADD_FAILURE() << es.name << " " << name(rule) << " bump " << b << " " << name(mode)
                            << " amax " << std::hexfloat << amax << ": got " << y[0] << " " << y[1] << " (nan_blocks "
                            << st.nan_blocks << "), expected " << (want ? "a NaN block" : "finite values");
            ++checked;
            nan_blocks += nan;
          }
      }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(nan_blocks, 100) << "the top of the range was not reached";
  EXPECT_GT(checked - nan_blocks, 1000);
}

// The cases worked by hand.
TEST(QuantizeTop, HandWorkedCases) {
  QuantStats st;
  // E4M3 `even`: FLT_MAX rounded to 3 mantissa bits is 2^128, s = 128 - 8 = 120, and FLT_MAX / 2^120
  // = 255.99998 rounds to 256: 256 * 2^120 = 2^128 is no float32. torchao's EVEN gives the NaN
  // scale 0xFF here (its rounded amax is Inf); so does mxlab.
  EXPECT_TRUE(std::isnan(quantize_block(kMax, NumFmt::mxfp8_e4m3, ScaleRule::even, Bump::clamp, Rounding::nearest_even, &st)[0]));
  EXPECT_EQ(st.nan_blocks, 1u);
  // E2M1 `even` likewise: s = 128 - 2 = 126, FLT_MAX / 2^126 = 3.9999998 rounds to 4.
  EXPECT_TRUE(std::isnan(quantize_block(kMax, NumFmt::mxfp4_e2m1, ScaleRule::even, Bump::clamp, Rounding::nearest_even, &st)[1]));
  // The same block rounded toward zero stays below: 255.99998 -> 240, 240 * 2^120.
  EXPECT_EQ(quantize_block(kMax, NumFmt::mxfp8_e4m3, ScaleRule::even, Bump::clamp, Rounding::toward_zero, &st)[0],
            static_cast<float>(std::ldexp(240.0, 120)));
  // `floor` never rounds past amax: s = 127 - 8 = 119, FLT_MAX / 2^119 = 511.99997 clamps to 448.
  EXPECT_EQ(quantize_block(kMax, NumFmt::mxfp8_e4m3, ScaleRule::floor, Bump::clamp, Rounding::nearest_even, &st)[0],
            static_cast<float>(std::ldexp(448.0, 119)));
  EXPECT_EQ(st.clamped, 1u);
  // int8 (emax 0): `ceil` asks for s = 128, which E8M0 lacks (mxlab clamped it to 127 before).
  EXPECT_EQ(shared_exponent(kMax, elem_spec(Elem::int8), ScaleRule::ceil, Bump::clamp), kScaleExpNaN);
  EXPECT_TRUE(std::isnan(quantize_block(1.5e38f * 2, NumFmt::mxint8, ScaleRule::ceil, Bump::clamp, Rounding::nearest_even, &st)[0]));
  // int8 `rceil`: amax * (64/127) >= 2^127 rounds up to 2^128: NaN, not Transformer Engine's saturated 2^127.
  EXPECT_EQ(shared_exponent(kMax, elem_spec(Elem::int8), ScaleRule::rceil, Bump::clamp), kScaleExpNaN);
  // Just below every threshold: finite.
  EXPECT_TRUE(std::isfinite(quantize_block(std::ldexp(1.5f, 127), NumFmt::mxfp8_e4m3, ScaleRule::ceil, Bump::clamp,
                                           Rounding::nearest_even, &st)[0]));
}

// torchao's EVEN makes a block NaN exactly when its bit trick rounds amax to Inf; for the formats
// torchao has and round-to-nearest elements, mxlab's rule gives the same verdict on every float
// of the top binade that can get there (and those below).
TEST(QuantizeTop, EvenNaNBlocksAreTorchaosForEveryTopAmax) {
  const NumFmt torchao_fmts[] = {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2, NumFmt::mxfp6_e2m3,
                                 NumFmt::mxfp4_e2m1};
  int failures = 0;
  for (NumFmt fmt : torchao_fmts) {
    const ElemSpec& es = elem_spec(mx_elem(fmt));
    const uint32_t half = 1u << (23 - es.mbits - 1);
    // Every float from FLT_MAX down past the first one torchao rounds to Inf.
    for (uint32_t bits = 0x7F7FFFFFu; bits >= 0x7F7FFFFFu - 2 * half; --bits) {
      const float amax = bits_f32(bits);
      const bool torchao_nan = ((bits + half) & 0xFF800000u) == 0x7F800000u;
      const bool nan = block_scale_exp(amax, es, ScaleRule::even, Bump::clamp, Rounding::nearest_even) == kScaleExpNaN;
      if (nan != torchao_nan && failures++ < 10)
        ADD_FAILURE() << es.name << " amax " << std::hexfloat << amax << ": mxlab " << nan << " torchao " << torchao_nan;
    }
  }
  EXPECT_EQ(failures, 0);
}

// The example through the binary: random float32 bit patterns with one element near
// 3.4e38, E4M3 and E2M1, --scale-rule even: that block is NaN, --stats counts it, nothing is Inf.
TEST(QuantizeTop, CommandLineMakesTheBlockNaN) {
  const std::string dir = testutil::make_temp_dir("top");
  std::vector<float> x(4 * 32);
  uint32_t state = 12345;
  for (float& v : x) {
    do {
      state = state * 1664525u + 1013904223u;
      v = bits_f32(state);
    } while (!std::isfinite(v) || std::fabs(v) > 1e30f);
  }
  x[37] = -3.4028233e38f;  // block 1: within rounding of -FLT_MAX
  write_npy(dir + "/in.npy", {4, 32}, x.data());
  for (const char* fmt : {"mxfp8_e4m3", "mxfp4_e2m1"}) {
    const std::string out = dir + "/" + fmt + ".npy";
    const testutil::Proc p = testutil::run_mxlab(
        {"quantize", "--format", fmt, "--scale-rule", "even", "--in", dir + "/in.npy", "--out", out, "--stats"});
    ASSERT_EQ(p.exit_code, kExitOk) << p.output;
    EXPECT_TRUE(testutil::contains(p.output, "nan")) << p.output;
    const NpyArray y = read_npy(out);
    for (size_t i = 0; i < y.data.size(); ++i) {
      if (i >= 32 && i < 64) EXPECT_TRUE(std::isnan(y.data[i])) << fmt << " " << i;
      else EXPECT_TRUE(std::isfinite(y.data[i])) << fmt << " " << i << " " << y.data[i];
    }
  }
}

}  // namespace
