// Blocks at the top of the float32 range (lab/mx/README.md, "Blocks at the top of the float32
// range"). A block gets the NaN scale (E8M0 0xFF: all of it NaN) only where its rule's exponent
// is beyond E8M0's range: int8 (emax 0) under ceil/even/rceil/floor_bump, and `even` wherever amax
// rounded to the element's mantissa width reaches 2^128 (torchao's EVEN: that rounded amax is
// Inf, the NaN scale). Everywhere else the scale is valid and each element is quantized on its
// own: an element whose dequantized value reaches 2^128 is +-Inf and the rest of the block is
// normal, as torchao's to_mx + to_dtype return it under CEIL and RCEIL.
//
// Checked (1) by hand for every rule x format at FLT_MAX and on the E5M2 rceil block of the
// conformance report, (2) bit for bit against a re-implementation of torchao's to_mx / to_dtype
// (its float32 bit manipulations, written out from torchao/prototype/mx_formats/mx_tensor.py) on
// blocks at the top of the range for every torchao element format x ScaleCalculationMode,
// (3) for every format (int8 too), rule, bump and rounding against an independent criterion in
// double precision, and (4) through `mxlab quantize`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

const float kMax = std::numeric_limits<float>::max();  // (2 - 2^-23) * 2^127, bits 0x7F7FFFFF
const float kInf = std::numeric_limits<float>::infinity();

const NumFmt kMx[] = {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2,
                      NumFmt::mxfp6_e2m3, NumFmt::mxfp4_e2m1, NumFmt::mxint8};
const Rounding kModes[] = {Rounding::nearest_even, Rounding::nearest_away, Rounding::toward_zero, Rounding::stochastic};

bool same_bits(float a, float b) { return (std::isnan(a) && std::isnan(b)) || f32_bits(a) == f32_bits(b); }

std::vector<float> quantize(const std::vector<float>& x, NumFmt fmt, ScaleRule rule, Bump bump, Rounding mode,
                            int block, QuantStats* st = nullptr) {
  QuantSpec spec;
  spec.fmt = fmt;
  spec.block = block;
  spec.rule = rule;
  spec.bump = bump;
  spec.rounding = mode;
  spec.seed = 7;
  std::vector<float> y(x.size());
  quantize_dequantize(x.data(), y.data(), 1, static_cast<int64_t>(x.size()), Axis::contiguous, spec, st);
  return y;
}

// ---- (1) by hand -----------------------------------------------------------------------------

// The block {FLT_MAX, -FLT_MAX, 2^126, -1} under each rule and format, round to nearest even.
// `s` is the block's scale exponent (kScaleExpNaN: the NaN scale), `top` the value FLT_MAX
// dequantizes to (+Inf where it reaches 2^128). 2^126 is exact at every s below (2^(126 - s) is an
// element: 128, 64, 2^14, 2^13, 8, 4, 2, 1, 0.5), and -1 / 2^s is far below every element's
// smallest subnormal: -0.
struct HandCase {
  NumFmt fmt;
  ScaleRule rule;
  int s;
  double top;
};

const double kNaNBlock = std::numeric_limits<double>::quiet_NaN();

// Formats: (emax, mbits, max_normal) = e4m3 (8, 3, 448 = 1.75 2^8), e5m2 (15, 2, 57344 = 1.75 2^15),
// e3m2 (4, 2, 28 = 1.75 2^4), e2m3 (2, 3, 7.5 = 1.875 2^2), e2m1 (2, 1, 6 = 1.5 2^2), int8 (0, 6,
// 127/64). FLT_MAX = (2 - 2^-23) 2^127: all 23 mantissa bits set.
const HandCase kHand[] = {
    // floor: s = floor(log2 FLT_MAX) - emax = 127 - emax; FLT_MAX / 2^s = (2 - 2^-23) 2^emax is above
    // max_normal (< 2^(emax+1)) for every format: clamped to max_normal. Never past FLT_MAX.
    // torchao FLOOR: the same s, data clamped to max_pos (e5m2; e4m3's cast saturates; fp6/fp4
    // casts saturate).
    {NumFmt::mxfp8_e4m3, ScaleRule::floor, 119, 448.0 * 0x1p119},
    {NumFmt::mxfp8_e5m2, ScaleRule::floor, 112, 57344.0 * 0x1p112},
    {NumFmt::mxfp6_e3m2, ScaleRule::floor, 123, 28.0 * 0x1p123},
    {NumFmt::mxfp6_e2m3, ScaleRule::floor, 125, 7.5 * 0x1p125},
    {NumFmt::mxfp4_e2m1, ScaleRule::floor, 125, 6.0 * 0x1p125},
    {NumFmt::mxint8, ScaleRule::floor, 127, 127.0 / 64.0 * 0x1p127},
    // ceil: mantissa bits set, so ceil(log2 FLT_MAX) = 128 and s = 128 - emax, a valid E8M0
    // exponent for every FP format (torchao CEIL: extracted exponent 127, +1 for the mantissa).
    // FLT_MAX / 2^s = (2 - 2^-23) 2^(emax-1) lies in the element binade [2^(emax-1), 2^emax) whose
    // spacing is 2^(emax-1-mbits); it is less than half a spacing below 2^emax, so it rounds to
    // 2^emax (an element: e4m3 256, e5m2 32768, e3m2 16, e2m3 4, e2m1 4), and 2^emax 2^s = 2^128:
    // +Inf in float32, as torchao's to_dtype (element * scale in float32) returns it.
    {NumFmt::mxfp8_e4m3, ScaleRule::ceil, 120, INFINITY},  // 255.99998 -> 256
    {NumFmt::mxfp8_e5m2, ScaleRule::ceil, 113, INFINITY},  // 32767.998 -> 32768
    {NumFmt::mxfp6_e3m2, ScaleRule::ceil, 124, INFINITY},  // 15.999998 -> 16
    {NumFmt::mxfp6_e2m3, ScaleRule::ceil, 126, INFINITY},  // 3.9999998 -> 4 (spacing 1/4)
    {NumFmt::mxfp4_e2m1, ScaleRule::ceil, 126, INFINITY},  // 3.9999998 -> 4 (spacing 1)
    // int8: s = 128 - 0 = 128 > 127: beyond E8M0, the NaN scale (torchao has no int8).
    {NumFmt::mxint8, ScaleRule::ceil, kScaleExpNaN, kNaNBlock},
    // rceil: fl32(FLT_MAX * fl32(1/max_normal)) rounded up to a power of two: FLT_MAX / 448 =
    // 1.142857 2^119 -> 120; / 57344 = 1.142857 2^112 -> 113; / 28 = 1.142857 2^123 -> 124;
    // / 7.5 = 1.066667 2^125 -> 126; / 6 = 1.333333 2^125 -> 126 (the float32 product is within
    // 2^-23 relative of these, far from a power of two): the ceil scales, so the same +Inf
    // (torchao RCEIL: the same code, no clamp, the same cast and product).
    {NumFmt::mxfp8_e4m3, ScaleRule::rceil, 120, INFINITY},
    {NumFmt::mxfp8_e5m2, ScaleRule::rceil, 113, INFINITY},
    {NumFmt::mxfp6_e3m2, ScaleRule::rceil, 124, INFINITY},
    {NumFmt::mxfp6_e2m3, ScaleRule::rceil, 126, INFINITY},
    {NumFmt::mxfp4_e2m1, ScaleRule::rceil, 126, INFINITY},
    // int8: FLT_MAX * 64/127 = 1.00787 2^127 rounds up to 2^128: beyond E8M0, NaN (Transformer
    // Engine's satfinite conversion would saturate the code at 2^127; it has no int8).
    {NumFmt::mxint8, ScaleRule::rceil, kScaleExpNaN, kNaNBlock},
    // even: FLT_MAX rounded half-up to mbits mantissa bits is 2^128 for every width (its mantissa
    // is all ones): that rounded maximum has exponent 128, beyond E8M0 (and float32): the NaN scale.
    // torchao EVEN: bits + 2^(22 - mbits) carries into the exponent field, 255 with the mantissa
    // masked off = Inf, not finite: scale code 0xFF, every element NaN.
    {NumFmt::mxfp8_e4m3, ScaleRule::even, kScaleExpNaN, kNaNBlock},
    {NumFmt::mxfp8_e5m2, ScaleRule::even, kScaleExpNaN, kNaNBlock},
    {NumFmt::mxfp6_e3m2, ScaleRule::even, kScaleExpNaN, kNaNBlock},
    {NumFmt::mxfp6_e2m3, ScaleRule::even, kScaleExpNaN, kNaNBlock},
    {NumFmt::mxfp4_e2m1, ScaleRule::even, kScaleExpNaN, kNaNBlock},
    {NumFmt::mxint8, ScaleRule::even, kScaleExpNaN, kNaNBlock},
    // floor_bump (mxlab's, no torchao counterpart): floor's s = 127 - emax clamps (above), so it is
    // bumped to 128 - emax, the ceil scale: +Inf for the FP formats as under ceil; int8 127 + 1 = 128:
    // NaN.
    {NumFmt::mxfp8_e4m3, ScaleRule::floor_bump, 120, INFINITY},
    {NumFmt::mxfp8_e5m2, ScaleRule::floor_bump, 113, INFINITY},
    {NumFmt::mxfp6_e3m2, ScaleRule::floor_bump, 124, INFINITY},
    {NumFmt::mxfp6_e2m3, ScaleRule::floor_bump, 126, INFINITY},
    {NumFmt::mxfp4_e2m1, ScaleRule::floor_bump, 126, INFINITY},
    {NumFmt::mxint8, ScaleRule::floor_bump, kScaleExpNaN, kNaNBlock},
};

TEST(QuantizeTop, EveryRuleAndFormatAtFltMaxByHand) {
  const std::vector<float> x = {kMax, -kMax, 0x1p126f, -1.0f};
  for (const HandCase& c : kHand) {
    const ElemSpec& es = elem_spec(mx_elem(c.fmt));
    const std::string what = std::string(name(c.fmt)) + " " + name(c.rule);
    EXPECT_EQ(shared_exponent(kMax, es, c.rule, Bump::clamp), c.s) << what;
    QuantStats st;
    const std::vector<float> y = quantize(x, c.fmt, c.rule, Bump::clamp, Rounding::nearest_even, 4, &st);
    if (c.s == kScaleExpNaN) {
      for (float v : y) EXPECT_TRUE(std::isnan(v)) << what << ": " << v;
      EXPECT_EQ(st.nan_blocks, 1u) << what;
      continue;
    }
    EXPECT_EQ(st.nan_blocks, 0u) << what;
    EXPECT_TRUE(same_bits(y[0], static_cast<float>(c.top))) << what << ": " << y[0] << " want " << c.top;
    EXPECT_TRUE(same_bits(y[1], static_cast<float>(-c.top))) << what << ": " << y[1];
    EXPECT_TRUE(same_bits(y[2], 0x1p126f)) << what << ": " << y[2];
    EXPECT_TRUE(same_bits(y[3], -0.0f)) << what << ": " << y[3];
    // floor clamps both maxima; the Inf elements are not clamped (2^emax is an element).
    EXPECT_EQ(st.clamped, c.rule == ScaleRule::floor ? 2u : 0u) << what;
  }
}

// The block of the conformance report: E5M2, amax 3.33e38 (1.957 2^127).
//   rceil: 3.33e38 / 57344 = 1.1185 2^112 -> s = 113 (valid); 3.33e38 / 2^113 = 32066.5 lies between
//          the elements 28672 and 32768 (spacing 4096 in [2^14, 2^15)) above their midpoint 30720:
//          32768 = 2^15, and 2^15 2^113 = 2^128: +-Inf for +-3.33e38. The rest of the block:
//          2^126 -> 2^13 exact; -3 2^120 -> -384 exact (spacing 64); 1e38 -> 9629.6 between 8192 and
//          10240 (spacing 2048), above 9216: 10240 2^113 = 5 2^124; 1 -> 0; -0 -> -0.
//   ceil:  ceil(log2 3.33e38) = 128 -> s = 113: the same block.
//   even:  1.957 rounded half-up to 2 mantissa bits is 2.0 (above 1.875): 2^128, the NaN scale.
//   floor: s = 112; 3.33e38 / 2^112 = 64133 > 57344 clamps to 57344 2^112; 2^126 -> 2^14; -3 2^120 ->
//          -768 (spacing 128, exact); 1e38 -> 19259.3 between 16384 and 20480 (spacing 4096), above
//          18432: 20480 2^112 = 5 2^124.
TEST(QuantizeTop, ConformanceReportE5m2RceilBlock) {
  std::vector<float> x(32, 0.0f);
  x[0] = 3.33e38f;
  x[1] = -3.33e38f;
  x[2] = 0x1p126f;
  x[3] = -3.0f * 0x1p120f;
  x[4] = 1e38f;
  x[5] = 1.0f;
  x[6] = -0.0f;
  const ElemSpec& es = elem_spec(Elem::fp8_e5m2);
  std::vector<float> want(32, 0.0f);
  want[0] = kInf;
  want[1] = -kInf;
  want[2] = 0x1p126f;
  want[3] = -3.0f * 0x1p120f;
  want[4] = 5.0f * 0x1p124f;
  want[5] = 0.0f;
  want[6] = -0.0f;
  for (ScaleRule rule : {ScaleRule::rceil, ScaleRule::ceil}) {
    EXPECT_EQ(shared_exponent(3.33e38f, es, rule, Bump::clamp), 113) << name(rule);
    QuantStats st;
    const std::vector<float> y = quantize(x, NumFmt::mxfp8_e5m2, rule, Bump::clamp, Rounding::nearest_even, 32, &st);
    for (int i = 0; i < 32; ++i)
      EXPECT_TRUE(same_bits(y[i], want[i])) << name(rule) << " [" << i << "] " << y[i] << " want " << want[i];
    EXPECT_EQ(st.nan_blocks, 0u);
    EXPECT_EQ(st.clamped, 0u);
  }
  EXPECT_EQ(shared_exponent(3.33e38f, es, ScaleRule::even, Bump::clamp), kScaleExpNaN);
  for (float v : quantize(x, NumFmt::mxfp8_e5m2, ScaleRule::even, Bump::clamp, Rounding::nearest_even, 32))
    EXPECT_TRUE(std::isnan(v));
  const std::vector<float> f = quantize(x, NumFmt::mxfp8_e5m2, ScaleRule::floor, Bump::clamp, Rounding::nearest_even, 32);
  EXPECT_EQ(f[0], static_cast<float>(57344.0 * 0x1p112));
  EXPECT_EQ(f[1], static_cast<float>(-57344.0 * 0x1p112));
  EXPECT_EQ(f[2], 0x1p126f);
  EXPECT_EQ(f[3], -3.0f * 0x1p120f);
  EXPECT_EQ(f[4], 5.0f * 0x1p124f);
}

// ---- (2) torchao, re-implemented ---------------------------------------------------------------
// to_mx (torchao/prototype/mx_formats/mx_tensor.py) on a block: max_abs = amax |x| in float32, then
//   RCEIL (_to_mx_rceil): descale = max_abs * (1.0 / max_pos) in float32 (the scalar becomes a
//     float32); E8M0 code (_f32_to_e8m0_rceil) = descale's biased exponent field, + 1 when a
//     mantissa bit is set (for a float32 subnormal: when it is above 2^-127), 0xFF when descale is
//     not finite (and 254 + 1 = 0xFF in uint8); data_lp = x * 2^-(code - 127) (the reciprocal
//     built from bits, _e8m0_scale_to_reciprocal_fp32), cast without a clamp.
//   FLOOR / CEIL / EVEN: EVEN first adds 1 << (23 - mbits - 1) to max_abs's bits and masks with
//     0xFF800000 (sign and exponent; a carry into exponent 255 makes Inf); extracted_pow2 = the
//     exponent field - 127; CEIL adds 1 when max_abs has a mantissa bit; s = extracted_pow2 -
//     target_max_pow2 (= emax), clamped to [-127, 128]; code = s + 127, 0xFF where (the rounded)
//     max_abs is not finite; data_lp = x * 2^-s, clamped to +-max_pos for e5m2 (and e4m3 before
//     PyTorch 2.13, whose later casts saturate).
//   The cast to the element (float8 casts, f32_to_f6_e*_unpacked, f32_to_f4_unpacked): round to
//     nearest even, saturating at max_pos; float8_e5m2 without a clamp (RCEIL) is IEEE: beyond
//     max_pos it rounds to Inf at or above 61440.
// to_dtype: element (a float32) * get_fp_scale(code) = 2^(code - 127) in float32, NaN for code
// 0xFF: a product at or above 2^128 is +-Inf.
struct TaoFmt {
  NumFmt fmt;
  int max_pow2;  // F8E4M3_MAX_POW2 etc.: emax
  int mbits;
  int emin;  // smallest normal exponent of the element
  double max_pos;
};
const TaoFmt kTao[] = {
    {NumFmt::mxfp8_e4m3, 8, 3, -6, 448.0},  {NumFmt::mxfp8_e5m2, 15, 2, -14, 57344.0},
    {NumFmt::mxfp6_e3m2, 4, 2, -2, 28.0},   {NumFmt::mxfp6_e2m3, 2, 3, 0, 7.5},
    {NumFmt::mxfp4_e2m1, 2, 1, 0, 6.0},
};
enum class TaoMode { FLOOR, CEIL, EVEN, RCEIL };
const TaoMode kTaoModes[] = {TaoMode::FLOOR, TaoMode::CEIL, TaoMode::EVEN, TaoMode::RCEIL};
ScaleRule rule_of(TaoMode m) {
  switch (m) {
    case TaoMode::FLOOR: return ScaleRule::floor;
    case TaoMode::CEIL: return ScaleRule::ceil;
    case TaoMode::EVEN: return ScaleRule::even;
    default: return ScaleRule::rceil;
  }
}
const char* tao_name(TaoMode m) {
  switch (m) {
    case TaoMode::FLOOR: return "FLOOR";
    case TaoMode::CEIL: return "CEIL";
    case TaoMode::EVEN: return "EVEN";
    default: return "RCEIL";
  }
}

// The element cast: round to nearest even on the element grid (in double: exact), then saturate
// at max_pos or (IEEE float8_e5m2) overflow to Inf.
float tao_cast(float lp, const TaoFmt& f, bool saturate) {
  const double a = std::fabs(static_cast<double>(lp));
  if (a == 0.0) return lp;
  int e = std::ilogb(a);
  if (e < f.emin) e = f.emin;
  const double spacing = std::ldexp(1.0, e - f.mbits);
  double k = std::nearbyint(a / spacing) * spacing;  // ties to even (the default rounding mode)
  if (k > f.max_pos) k = saturate ? f.max_pos : INFINITY;
  return static_cast<float>(std::copysign(k, static_cast<double>(lp)));
}

// to_mx + to_dtype of one block; returns the E8M0 code (0xFF: NaN).
int torchao_block(const float* x, int k, const TaoFmt& f, TaoMode mode, float* out) {
  float max_abs = 0.0f;
  for (int i = 0; i < k; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
  int code;
  if (mode == TaoMode::RCEIL) {
    const float descale = max_abs * static_cast<float>(1.0 / f.max_pos);
    const uint32_t b = f32_bits(descale), e = (b >> 23) & 0xFFu, m = b & 0x7FFFFFu;
    const bool up = e == 0 ? m > 0x400000u : m != 0u;
    code = std::isfinite(descale) ? static_cast<int>((e + (up ? 1u : 0u)) & 0xFFu) : 255;
  } else {
    uint32_t b = f32_bits(max_abs);
    if (mode == TaoMode::EVEN) b = (b + (1u << (23 - f.mbits - 1))) & 0xFF800000u;
    int extracted = static_cast<int>((b >> 23) & 0xFFu) - 127;
    if (mode == TaoMode::CEIL && (b & 0x7FFFFFu) > 0u) extracted += 1;
    int s = extracted - f.max_pow2;
    s = s < -127 ? -127 : (s > 128 ? 128 : s);
    code = std::isfinite(bits_f32(b)) ? s + 127 : 255;
  }
  if (code == 255) {
    for (int i = 0; i < k; ++i) out[i] = std::numeric_limits<float>::quiet_NaN();
    return code;
  }
  const int rb = 254 - code;  // the reciprocal's biased exponent; 0 is the subnormal 2^-127
  const float inv = bits_f32(rb == 0 ? 0x00400000u : static_cast<uint32_t>(rb) << 23);
  const float scale = std::ldexp(1.0f, code - 127);  // exact for every code in [0, 254]
  const bool saturate = !(mode == TaoMode::RCEIL && f.fmt == NumFmt::mxfp8_e5m2);
  for (int i = 0; i < k; ++i) {
    const float lp = x[i] * inv;                 // float32
    out[i] = tao_cast(lp, f, saturate) * scale;  // float32: +-Inf at or above 2^128
  }
  return code;
}

// Block maxima at the top of the float32 range: FLT_MAX and below it, each mantissa width's
// rounding thresholds (and their neighbours), powers of two and the last-bin edges.
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
      for (int j = 0; j < 7 && c <= kMax; ++j, c = std::nextafter(c, kInf)) a.push_back(c);
    }
  for (double x : {1.0, 1.25, 1.5, 1.75, 1.875, 1.9375}) a.push_back(static_cast<float>(std::ldexp(x, 127)));
  a.push_back(std::nextafter(0x1p127f, 0.0f));
  a.push_back(3.33e38f);
  return a;
}

// A block of 32 for each top amax: the amax (random sign), other top maxima not above it (several
// elements at the edge), random magnitudes in [2^64, amax], a few small values and zeros.
std::vector<float> top_blocks(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<float> tops = top_amaxes();
  std::vector<float> x;
  for (float amax : tops) {
    x.push_back((rng() & 1u) ? -amax : amax);
    for (int i = 1; i < 32; ++i) {
      const uint32_t sign = (rng() & 1u) ? 0x80000000u : 0u;
      const int kind = static_cast<int>(rng() % 8);
      float v;
      if (kind < 2) {
        v = tops[rng() % tops.size()];
        if (v > amax) v = amax;
      } else if (kind < 6) {
        const uint32_t field = 191u + static_cast<uint32_t>(rng() % 64);  // 2^64 .. 2^127
        v = bits_f32((field << 23) | (static_cast<uint32_t>(rng()) & 0x7FFFFFu));
        if (v > amax) v = amax;
      } else if (kind == 6) {
        v = bits_f32(static_cast<uint32_t>(rng()) & 0x3FFFFFFFu);  // small (below 2)
      } else {
        v = 0.0f;
      }
      x.push_back(bits_f32(f32_bits(v) | sign));
    }
  }
  return x;
}

TEST(QuantizeTop, EqualsTorchaoToMxToDtypeBitForBit) {
  const std::vector<float> x = top_blocks(2024);
  const int64_t nblocks = static_cast<int64_t>(x.size() / 32);
  int failures = 0;
  for (const TaoFmt& f : kTao) {
    const ElemSpec& es = elem_spec(mx_elem(f.fmt));
    for (TaoMode mode : kTaoModes) {
      const std::vector<float> got = quantize(x, f.fmt, rule_of(mode), Bump::clamp, Rounding::nearest_even, 32);
      std::vector<float> want(x.size());
      int64_t infs = 0, nan_blocks = 0;
      for (int64_t b = 0; b < nblocks; ++b) {
        const float* xb = x.data() + 32 * b;
        const int code = torchao_block(xb, 32, f, mode, want.data() + 32 * b);
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const int s = shared_exponent(amax, es, rule_of(mode), Bump::clamp);
        if (s != (code == 255 ? kScaleExpNaN : code - 127) && failures++ < 10)
          ADD_FAILURE() << name(f.fmt) << " " << tao_name(mode) << " amax " << std::hexfloat << amax
                        << ": scale exponent " << std::dec << s << ", torchao code " << code;
        nan_blocks += code == 255;
        for (int i = 0; i < 32; ++i) {
          const size_t j = static_cast<size_t>(32 * b + i);
          infs += std::isinf(want[j]);
          if (!same_bits(got[j], want[j]) && failures++ < 10)
            ADD_FAILURE() << name(f.fmt) << " " << tao_name(mode) << " block amax " << std::hexfloat << amax
                          << " element " << std::dec << i << " x " << std::hexfloat << xb[i] << ": mxlab " << got[j]
                          << ", torchao " << want[j];
        }
      }
      // The cases the comparison is about do occur: +-Inf elements under CEIL / RCEIL, NaN blocks
      // under EVEN, neither under FLOOR.
      const std::string what = std::string(name(f.fmt)) + " " + tao_name(mode);
      if (mode == TaoMode::CEIL || mode == TaoMode::RCEIL) {
        EXPECT_GT(infs, 10) << what;
        EXPECT_EQ(nan_blocks, 0) << what;
      } else if (mode == TaoMode::EVEN) {
        EXPECT_GT(nan_blocks, 10) << what;
        EXPECT_EQ(infs, 0) << what;
      } else {
        EXPECT_EQ(infs + nan_blocks, 0) << what;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// torchao's EVEN makes a block NaN exactly when its bit trick rounds amax to Inf; mxlab's `even`
// gives the NaN scale for exactly those maxima, on every float of the top binade that can get
// there (and those below), whatever the element rounding.
TEST(QuantizeTop, EvenNaNScaleIsTorchaosForEveryTopAmax) {
  int failures = 0;
  for (const TaoFmt& f : kTao) {
    const ElemSpec& es = elem_spec(mx_elem(f.fmt));
    const uint32_t half = 1u << (23 - es.mbits - 1);
    // Every float from FLT_MAX down past the first one torchao rounds to Inf.
    for (uint32_t bits = 0x7F7FFFFFu; bits >= 0x7F7FFFFFu - 2 * half; --bits) {
      const float amax = bits_f32(bits);
      const bool torchao_nan = ((bits + half) & 0xFF800000u) == 0x7F800000u;
      const bool nan = shared_exponent(amax, es, ScaleRule::even, Bump::clamp) == kScaleExpNaN;
      if (nan != torchao_nan && failures++ < 10)
        ADD_FAILURE() << es.name << " amax " << std::hexfloat << amax << ": mxlab " << nan << " torchao " << torchao_nan;
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- (3) every format, rule, bump and rounding against an independent criterion --------------

int floor_log2(double a) { return std::ilogb(a); }

// The rule's exponent without any clamp above, in double; `rounded_top`: `even`'s rounded amax
// reaches 2^128 (its exponent is beyond E8M0 whatever emax is).
int unclamped_scale(double amax, const ElemSpec& es, ScaleRule rule, Bump bump, bool* rounded_top) {
  const int emax = es.emax();
  *rounded_top = false;
  switch (rule) {
    case ScaleRule::floor: return floor_log2(amax) - emax;
    case ScaleRule::ceil: return static_cast<int>(std::ceil(std::log2(amax))) - emax;  // exact for these amax
    case ScaleRule::even: {
      const double ulp = std::ldexp(1.0, floor_log2(amax) - es.mbits);
      const double r = std::floor(amax / ulp + 0.5) * ulp;
      *rounded_top = r >= 0x1p128;
      return floor_log2(r) - emax;
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

float to_f32(double v) {  // an MX value (<= 8 significant bits): exact, or +-Inf at or above 2^128
  return std::fabs(v) >= 0x1p128 ? static_cast<float>(std::copysign(INFINITY, v)) : static_cast<float>(v);
}

// v at scale s: the two neighbours on the element grid (saturated at max_normal), as float32.
struct Neighbours {
  float down, up;
  bool clamped, tie;
};
Neighbours neighbours(float v, int s, const ElemSpec& es) {
  const double r = std::ldexp(std::fabs(static_cast<double>(v)), -s);
  const double mx = es.max_normal();
  Neighbours n{};
  double lo, hi;
  if (r > mx) {
    n.clamped = true;
    lo = hi = mx;
  } else {
    const int e = es.is_int() ? 0 : std::max(r > 0 ? floor_log2(r) : es.emin(), es.emin());
    const double spacing = std::ldexp(1.0, e - es.mbits);
    const double t = r / spacing;
    lo = std::floor(t) * spacing;
    hi = std::ceil(t) * spacing;
    n.tie = t - std::floor(t) == 0.5;
    if (hi > mx) hi = mx;
  }
  const double sign = std::signbit(v) ? -1.0 : 1.0;
  n.down = lo == 0.0 ? std::copysign(0.0f, v) : to_f32(sign * std::ldexp(lo, s));
  n.up = hi == 0.0 ? std::copysign(0.0f, v) : to_f32(sign * std::ldexp(hi, s));
  return n;
}

// Whether y is what `mode` makes of v at scale s (stochastic: either neighbour).
bool element_ok(float v, float y, int s, const ElemSpec& es, Rounding mode) {
  const Neighbours n = neighbours(v, s, es);
  const double r = std::ldexp(std::fabs(static_cast<double>(v)), -s);
  switch (mode) {
    case Rounding::toward_zero: return same_bits(y, n.down);
    case Rounding::stochastic: return same_bits(y, n.down) || same_bits(y, n.up);
    default: break;
  }
  if (same_bits(n.down, n.up)) return same_bits(y, n.down);
  // Nearest: compare the distances in double (exact: power-of-two grids far inside double's range).
  const double lo = std::fabs(std::ldexp(static_cast<double>(n.down), -s));
  const double hi = std::isinf(n.up) ? std::ldexp(1.0, 128 - s) : std::fabs(std::ldexp(static_cast<double>(n.up), -s));
  if (r - lo < hi - r) return same_bits(y, n.down);
  if (r - lo > hi - r) return same_bits(y, n.up);
  if (mode == Rounding::nearest_away) return same_bits(y, n.up);
  // Ties to even: the neighbour whose grid index is even.
  const int e = es.is_int() ? 0 : std::max(floor_log2(lo > 0 ? lo : r), es.emin());
  const double spacing = std::ldexp(1.0, e - es.mbits);
  const bool lo_even = std::fmod(lo / spacing, 2.0) == 0.0;
  return same_bits(y, lo_even ? n.down : n.up);
}

TEST(QuantizeTop, NaNOnlyBeyondE8M0ElseEachElementOnItsOwn) {
  int checked = 0, nan_blocks = 0, inf_elements = 0, failures = 0;
  for (NumFmt fmt : kMx) {
    const ElemSpec& es = elem_spec(mx_elem(fmt));
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (int b = 0; b < 2; ++b) {
        const ScaleRule rule = static_cast<ScaleRule>(r);
        const Bump bump = static_cast<Bump>(b);
        if (bump == Bump::always && rule != ScaleRule::floor_bump) continue;
        for (Rounding mode : kModes)
          for (float amax : top_amaxes()) {
            // Block 0 at the top; block 1 ordinary (untouched by block 0).
            const std::vector<float> x = {amax, -amax, -amax / 2, 1.0f, 3.0f, -1.5f, 0.25f, 2.0f};
            QuantStats st;
            const std::vector<float> y = quantize(x, fmt, rule, bump, mode, 4, &st);
            bool top = false;
            const int s = unclamped_scale(amax, es, rule, bump, &top);
            const bool want_nan = s > 127 || top;
            bool ok = st.nan_blocks == (want_nan ? 1u : 0u);
            uint64_t clamped = 0;
            for (int i = 0; i < 4; ++i) {
              if (want_nan) {
                ok = ok && std::isnan(y[i]);
                continue;
              }
              ok = ok && element_ok(x[i], y[i], s, es, mode);
              const Neighbours n = neighbours(x[i], s, es);
              clamped += n.clamped;
              // A clamped element (max_normal 2^s) is never +-Inf: a scale that high is only
              // reached by rules that leave room for amax (what quant_gap's `above` relies on).
              ok = ok && !(n.clamped && std::isinf(y[i]));
              inf_elements += std::isinf(y[i]);
            }
            bool low = false;
            const int s1 = unclamped_scale(3.0, es, rule, bump, &low);
            for (int i = 4; i < 8; ++i) {
              ok = ok && element_ok(x[i], y[i], s1, es, mode);
              clamped += neighbours(x[i], s1, es).clamped;
            }
            ok = ok && st.clamped == clamped;
            if (!ok && failures++ < 10)
              ADD_FAILURE() << es.name << " " << name(rule) << " bump " << b << " " << name(mode) << " amax "
                            << std::hexfloat << amax << " (s " << std::dec << s << (top ? ", rounded amax 2^128" : "")
                            << "): got " << std::hexfloat << y[0] << " " << y[1] << " " << y[2] << " " << y[3]
                            << std::dec << " (nan_blocks " << st.nan_blocks << ")";
            ++checked;
            nan_blocks += want_nan;
          }
      }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(nan_blocks, 100) << "the NaN scale was not reached";
  EXPECT_GT(inf_elements, 100) << "no element reached 2^128";
  EXPECT_GT(checked - nan_blocks, 1000);
}

// ---- (4) through the binary ----------------------------------------------------------------------
// Random float32 bit patterns with the conformance report's 3.33e38 in block 1 and -FLT_MAX's
// neighbour in block 2: E5M2 rceil gives +-Inf for exactly those elements and a normal rest; E4M3
// and E2M1 `even` make blocks 1 and 2 NaN (3.33e38 = 1.957 2^127 rounds up to 2^128 with 3 and 1
// mantissa bits; counted by --stats) and nothing else.
TEST(QuantizeTop, CommandLine) {
  const std::string dir = testutil::make_temp_dir("top");
  std::vector<float> x(4 * 32);
  uint32_t state = 12345;
  for (float& v : x) {
    do {
      state = state * 1664525u + 1013904223u;
      v = bits_f32(state);
    } while (!std::isfinite(v) || std::fabs(v) > 1e30f);
  }
  x[37] = 3.33e38f;         // block 1
  x[70] = -3.4028233e38f;   // block 2: within rounding of -FLT_MAX
  write_npy(dir + "/in.npy", {4, 32}, x.data());
  {
    const std::string out = dir + "/e5m2.npy";
    const testutil::Proc p = testutil::run_mxlab({"quantize", "--format", "mxfp8_e5m2", "--scale-rule", "rceil", "--in",
                                                  dir + "/in.npy", "--out", out});
    ASSERT_EQ(p.exit_code, kExitOk) << p.output;
    const NpyArray y = read_npy(out);
    for (size_t i = 0; i < y.data.size(); ++i) {
      if (i == 37) EXPECT_EQ(y.data[i], kInf);
      else if (i == 70) EXPECT_EQ(y.data[i], -kInf);
      else EXPECT_TRUE(std::isfinite(y.data[i])) << i << " " << y.data[i];
    }
  }
  for (const char* fmt : {"mxfp8_e4m3", "mxfp4_e2m1"}) {
    const std::string out = dir + "/" + fmt + ".npy";
    const testutil::Proc p = testutil::run_mxlab(
        {"quantize", "--format", fmt, "--scale-rule", "even", "--in", dir + "/in.npy", "--out", out, "--stats"});
    ASSERT_EQ(p.exit_code, kExitOk) << p.output;
    EXPECT_TRUE(testutil::contains(p.output, "nan")) << p.output;
    const NpyArray y = read_npy(out);
    for (size_t i = 0; i < y.data.size(); ++i) {
      if (i >= 32 && i < 96) EXPECT_TRUE(std::isnan(y.data[i])) << fmt << " " << i;
      else EXPECT_TRUE(std::isfinite(y.data[i])) << fmt << " " << i << " " << y.data[i];
    }
  }
}

}  // namespace
