// The format table against the OCP MX v1.0 spec, and every code of every element format by
// round trip: each bit pattern is decoded here (independently of lab/mx), scaled by 2^X for
// many X, quantized, and must come back exactly (every representable value is a fixed point,
// under every rounding mode); values between adjacent codes must round to a neighbour as
// each mode says. Also the claim that dequantized MX values are exact in bf16 except for the
// (format, scale) pairs listed in lab/mx/README.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "lab/core/error.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"

using namespace mxlab;

namespace {

// Spec parameters, typed in from the OCP MX v1.0 / OCP FP8 tables.
struct SpecRow {
  NumFmt fmt;
  const char* elem_name;
  int bits, ebits, mbits, bias, emax;
  double max_normal, min_normal, min_subnormal;
};
const SpecRow kSpec[] = {
    {NumFmt::mxfp8_e4m3, "fp8_e4m3", 8, 4, 3, 7, 8, 448.0, 0x1p-6, 0x1p-9},
    {NumFmt::mxfp8_e5m2, "fp8_e5m2", 8, 5, 2, 15, 15, 57344.0, 0x1p-14, 0x1p-16},
    {NumFmt::mxfp6_e3m2, "fp6_e3m2", 6, 3, 2, 3, 4, 28.0, 0x1p-2, 0x1p-4},
    {NumFmt::mxfp6_e2m3, "fp6_e2m3", 6, 2, 3, 1, 2, 7.5, 1.0, 0x1p-3},
    {NumFmt::mxfp4_e2m1, "fp4_e2m1", 4, 2, 1, 1, 2, 6.0, 1.0, 0x1p-1},
    {NumFmt::mxint8, "int8", 8, 0, 6, 0, 0, 127.0 / 64.0, 0x1p-6, 0x1p-6},
};

// Value of a code, decoded from the bit layout (sign | exponent | mantissa); NaN for NaN codes,
// +-Inf for Inf codes. int8 is two's complement k/64.
double decode(const SpecRow& f, uint32_t code) {
  if (f.ebits == 0) return static_cast<double>(static_cast<int8_t>(code & 0xFFu)) / 64.0;
  const bool neg = (code >> (f.bits - 1)) & 1u;
  const uint32_t e = (code >> f.mbits) & ((1u << f.ebits) - 1u);
  const uint32_t m = code & ((1u << f.mbits) - 1u);
  const uint32_t emask = (1u << f.ebits) - 1u;
  double v;
  if (f.fmt == NumFmt::mxfp8_e4m3 && e == emask && m == (1u << f.mbits) - 1u) return NAN;
  if (f.fmt == NumFmt::mxfp8_e5m2 && e == emask) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mbits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mbits), static_cast<int>(e) - f.bias);
  }
  return neg ? -v : v;
}

// Quantize `vals` as one block (plus an anchor that pins the block's scale to 2^X).
std::vector<float> quantize_with_anchor(const SpecRow& f, double X_exp, const std::vector<float>& vals,
                                        ScaleRule rule, Rounding mode, uint64_t seed = 1) {
  std::vector<float> in;
  in.push_back(static_cast<float>(std::ldexp(f.max_normal, static_cast<int>(X_exp))));
  in.insert(in.end(), vals.begin(), vals.end());
  QuantSpec s;
  s.fmt = f.fmt;
  s.rule = rule;
  s.rounding = mode;
  s.block = static_cast<int>(in.size());
  s.seed = seed;
  std::vector<float> out(in.size());
  quantize_dequantize(in.data(), out.data(), 1, static_cast<int64_t>(in.size()), Axis::contiguous, s);
  // The anchor itself is the block maximum and a code: it must survive too.
  EXPECT_EQ(out[0], in[0]) << f.elem_name << " anchor at X=2^" << X_exp;
  out.erase(out.begin());
  return out;
}

// Scale exponents to try: both ends of E8M0 (where the product stays a finite float) and between.
std::vector<int> scale_exps(const SpecRow& f) {
  std::vector<int> xs = {-127, -126, -125, -100, -64, -20, -9, -1, 0, 1, 3, 17, 64, 100};
  xs.push_back(127 - f.emax - 1);  // largest X with max_normal * 2^X < 2^128 for every format
  return xs;
}

}  // namespace

TEST(Formats, TableMatchesSpec) {
  for (const SpecRow& f : kSpec) {
    const ElemSpec& es = elem_spec(mx_elem(f.fmt));
    SCOPED_TRACE(f.elem_name);
    EXPECT_STREQ(es.name, f.elem_name);
    EXPECT_EQ(es.bits, f.bits);
    EXPECT_EQ(es.ebits, f.ebits);
    EXPECT_EQ(es.mbits, f.mbits);
    if (f.ebits) {
      EXPECT_EQ(es.bias, f.bias);
    }
    EXPECT_EQ(es.emax(), f.emax);
    EXPECT_EQ(es.max_normal(), f.max_normal);
    EXPECT_EQ(es.min_normal(), f.min_normal);
    EXPECT_EQ(es.min_subnormal(), f.min_subnormal);
    // The largest finite code decodes to max_normal: the table and the bit layout agree.
    double largest = 0.0;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double v = decode(f, c);
      if (std::isfinite(v)) largest = std::max(largest, v);
    }
    EXPECT_EQ(largest, f.max_normal);
    EXPECT_EQ(std::string(name(f.fmt)), "mx" + std::string(f.elem_name));
  }
  // The scalar formats' parameters (used by `mxlab formats`) derive the IEEE limits.
  constexpr ElemSpec bf16{"bf16", 16, 8, 7, 127, Reserved::ieee};
  constexpr ElemSpec fp16{"fp16", 16, 5, 10, 15, Reserved::ieee};
  EXPECT_EQ(bf16.max_normal(), 0x1.FEp127);
  EXPECT_EQ(bf16.min_subnormal(), 0x1p-133);
  EXPECT_EQ(fp16.max_normal(), 65504.0);
  EXPECT_EQ(fp16.min_subnormal(), 0x1p-24);
}

TEST(Formats, NamesParseAndRoundTrip) {
  for (const std::string& n : numfmt_names()) EXPECT_EQ(name(parse_numfmt(n)), n);
  for (const std::string& n : scale_rule_names()) EXPECT_EQ(name(parse_scale_rule(n)), n);
  for (const std::string& n : rounding_names()) EXPECT_EQ(name(parse_rounding(n)), n);
  EXPECT_THROW(parse_numfmt("mxfp8"), Error);
  try {
    parse_scale_rule("round");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rceil"), std::string::npos) << "the error lists the valid names";
  }
}

// Every code x several scales x every rounding mode x the rules that keep s = X: exact.
TEST(Formats, EveryCodeIsAFixedPointAtEveryScale) {
  int64_t checked = 0;
  for (const SpecRow& f : kSpec) {
    std::vector<float> codes;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double v = decode(f, c);
      if (!std::isfinite(v)) continue;
      if (f.ebits == 0 && v == -2.0) continue;  // int8 code 0x80: see Int8MostNegativeCode
      codes.push_back(static_cast<float>(v));
    }
    // Codes per format: every finite pattern (e4m3 has 2 NaN codes, e5m2 6 NaN + 2 Inf).
    const size_t expect_codes = f.fmt == NumFmt::mxfp8_e4m3 ? 254 : f.fmt == NumFmt::mxfp8_e5m2 ? 248
                                : f.ebits == 0 ? 255 : (1u << f.bits);
    EXPECT_EQ(codes.size(), expect_codes) << f.elem_name;
    for (int X : scale_exps(f)) {
      std::vector<float> scaled;
      for (float c : codes) {
        const double v = std::ldexp(static_cast<double>(c), X);
        ASSERT_EQ(static_cast<double>(static_cast<float>(v)), v) << "test setup: code*2^X must be a float";
        scaled.push_back(static_cast<float>(v));
      }
      for (ScaleRule rule : {ScaleRule::floor, ScaleRule::even, ScaleRule::floor_bump})
        for (int m = 0; m < static_cast<int>(Rounding::kCount); ++m) {
          if (static_cast<Rounding>(m) == Rounding::noise) continue;  // no rounding: test_mx_noise.cpp
          const auto out = quantize_with_anchor(f, X, scaled, rule, static_cast<Rounding>(m));
          for (size_t i = 0; i < scaled.size(); ++i) {
            // Bits, not values: -0 must stay -0.
            ASSERT_EQ(f32_bits(out[i]), f32_bits(scaled[i]))
                << f.elem_name << " X=2^" << X << " rule " << name(rule) << " " << name(static_cast<Rounding>(m))
                << " code value " << codes[i];
            ++checked;
          }
        }
    }
  }
  EXPECT_GT(checked, 100000);
}

// Between two adjacent codes a < b (same sign), at the midpoint and one float ulp either side.
TEST(Formats, ValuesBetweenAdjacentCodesRoundToANeighbour) {
  for (const SpecRow& f : kSpec) {
    std::vector<double> pos;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double v = decode(f, c);
      if (std::isfinite(v) && v >= 0.0 && !(f.ebits == 0 && c >= 0x80u)) pos.push_back(v);
    }
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    // The k-th value in order has significand parity: for every element format the codes of
    // one sign are ordered like the values, so "even" means an even code index.
    for (int X : {-127, -3, 0, 40}) {
      std::vector<float> mids, below, above;
      for (size_t i = 0; i + 1 < pos.size(); ++i) {
        const float mid = static_cast<float>(std::ldexp((pos[i] + pos[i + 1]) / 2, X));
        ASSERT_EQ(static_cast<double>(mid), std::ldexp((pos[i] + pos[i + 1]) / 2, X));
        mids.push_back(mid);
        below.push_back(std::nextafter(mid, 0.0f));
        above.push_back(std::nextafter(mid, INFINITY));
      }
      auto check = [&](const std::vector<float>& in, Rounding m, auto expect_fn, const char* what) {
        for (float sign : {1.0f, -1.0f}) {
          std::vector<float> v(in);
          for (float& x : v) x *= sign;
          const auto out = quantize_with_anchor(f, X, v, ScaleRule::floor, m);
          for (size_t i = 0; i < v.size(); ++i) {
            const double want = sign * std::ldexp(expect_fn(i), X);
            ASSERT_EQ(static_cast<double>(out[i]), want)
                << f.elem_name << " X=2^" << X << " " << name(m) << " " << what << " between " << pos[i] << " and "
                << pos[i + 1] << " (sign " << sign << ")";
          }
        }
      };
      auto lo = [&](size_t i) { return pos[i]; };
      auto hi = [&](size_t i) { return pos[i + 1]; };
      auto even = [&](size_t i) { return (i % 2 == 0) ? pos[i] : pos[i + 1]; };
      check(mids, Rounding::nearest_even, even, "midpoint");
      check(mids, Rounding::nearest_away, hi, "midpoint");
      check(mids, Rounding::toward_zero, lo, "midpoint");
      check(below, Rounding::nearest_even, lo, "just below the midpoint");
      check(below, Rounding::nearest_away, lo, "just below the midpoint");
      check(above, Rounding::nearest_even, hi, "just above the midpoint");
      check(above, Rounding::toward_zero, lo, "just above the midpoint");
      // Stochastic: always one of the two neighbours.
      for (uint64_t seed = 0; seed < 8; ++seed) {
        const auto out = quantize_with_anchor(f, X, mids, ScaleRule::floor, Rounding::stochastic, seed);
        for (size_t i = 0; i < mids.size(); ++i) {
          const double o = out[i];
          ASSERT_TRUE(o == std::ldexp(pos[i], X) || o == std::ldexp(pos[i + 1], X)) << f.elem_name << " " << o;
        }
      }
    }
  }
}

// int8's code 0x80 (-2) lies outside the symmetric range |k| <= 127 mxlab uses (as the
// microxcaling emulator does): -2 * X saturates to -127/64 * X and counts as clamped.
TEST(Formats, Int8MostNegativeCode) {
  const SpecRow& f = kSpec[5];
  ASSERT_EQ(decode(f, 0x80u), -2.0);
  QuantStats st;
  QuantSpec s;
  s.fmt = NumFmt::mxint8;
  // -127.5/64 is the block maximum (s = 0) and the midpoint between codes 0x81 (-127/64) and
  // 0x80 (-2): a two's-complement int8 using -128 would give -2 under nearest_even.
  std::vector<float> in = {1.5f, -(127.0f / 64.0f + 1.0f / 128.0f)}, out(2);
  quantize_dequantize(in.data(), out.data(), 1, 2, Axis::contiguous, s, &st);
  EXPECT_EQ(out[1], -127.0f / 64.0f);
  EXPECT_EQ(st.clamped, 1u);
  EXPECT_EQ(st.lastbin, 1u);
}

// Dequantized MX values are exact in bf16 except where they fall below bf16's smallest
// subnormal grid (2^-133): only fp8_e4m3 with s <= -125 and fp8_e5m2 with s <= -118.
TEST(Formats, DequantizedValuesExactInBf16ExceptListedScales) {
  for (const SpecRow& f : kSpec) {
    std::set<int> inexact_scales;
    for (int s = -127; s <= 127; ++s)
      for (uint32_t c = 0; c < (1u << f.bits); ++c) {
        const double v = std::ldexp(decode(f, c), s);
        if (!std::isfinite(v) || std::fabs(v) >= 0x1p128) continue;
        const float fv = static_cast<float>(v);
        ASSERT_EQ(static_cast<double>(fv), v) << "every MX value is a float32";
        const bool theory = std::fabs(v) >= 0x1p-126 || std::fmod(std::fabs(v), 0x1p-133) == 0.0;
        ASSERT_EQ(bf16_exact(fv), theory) << f.elem_name << " s=" << s << " value " << v;
        if (!bf16_exact(fv)) inexact_scales.insert(s);
      }
    std::set<int> expected;
    if (f.fmt == NumFmt::mxfp8_e4m3) expected = {-127, -126, -125};
    if (f.fmt == NumFmt::mxfp8_e5m2)
      for (int s = -127; s <= -118; ++s) expected.insert(s);
    EXPECT_EQ(inexact_scales, expected) << f.elem_name;
  }
}
