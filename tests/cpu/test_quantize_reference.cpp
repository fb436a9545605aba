// The main proof of exactness of the MX quantizer: an independent reference written
// differently on purpose (double-precision arithmetic, frexp for exponents, explicit
// floor/nearest on the element grid, a hand-typed table of the spec's format limits instead
// of lab/mx/format.h) compared bit for bit with quantize_dequantize() on random inputs of
// every magnitude, for every format x scale rule x rounding mode, both block axes.
//
// Inputs: random sign/exponent/mantissa bit patterns (float32 subnormals included), blocks
// clustered around a random exponent, exact ties on the element grid, powers of two and their
// float32 neighbours, the last-bin boundary max_normal * X and its neighbours, zeros of both
// signs; block sizes 1..64 and odd last dims (partial blocks).
//
// CI runs a few million element quantizations (a few seconds); MXLAB_EXHAUSTIVE=1 runs 40x more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lab/core/philox.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"

using namespace mxlab;

namespace {

// ---- the reference ------------------------------------------------------------------------

// Spec limits typed in from the OCP MX v1.0 tables (not derived from format.h).
struct RefFormat {
  NumFmt fmt;
  bool is_int;
  int emax;     // exponent of the largest normal binade
  int emin;     // exponent of the smallest normal binade (int8: the whole grid is 2^-6)
  int mbits;    // fraction bits
  double max;   // largest magnitude
};
const RefFormat kRefFormats[] = {
    {NumFmt::mxfp8_e4m3, false, 8, -6, 3, 448.0},
    {NumFmt::mxfp8_e5m2, false, 15, -14, 2, 57344.0},
    {NumFmt::mxfp6_e3m2, false, 4, -2, 2, 28.0},
    {NumFmt::mxfp6_e2m3, false, 2, 0, 3, 7.5},
    {NumFmt::mxfp4_e2m1, false, 2, 0, 1, 6.0},
    {NumFmt::mxint8, true, 0, 0, 6, 127.0 / 64.0},
};

int floor_log2_d(double a) {  // a > 0, exact
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return e - 1;
}
int ceil_log2_d(double a) {
  int e;
  const double m = std::frexp(a, &e);
  return m == 0.5 ? e - 1 : e;
}
// Below E8M0's range the scale is clamped; above it there is none: 128 stands for the NaN code.
int clamp127(int s) { return s < -127 ? -127 : (s > 127 ? 128 : s); }

int ref_scale(double amax, const RefFormat& f, ScaleRule rule, Bump bump) {
  if (amax == 0.0) return -127;
  switch (rule) {
    case ScaleRule::floor:
      return clamp127(floor_log2_d(amax) - f.emax);
    case ScaleRule::ceil:
      return clamp127(ceil_log2_d(amax) - f.emax);
    case ScaleRule::even: {
      // Round amax half-up to mbits fraction bits below its leading one, then floor. A rounded
      // maximum of 2^128 has no exponent in E8M0's (or float32's) range: no scale.
      const double ulp = std::ldexp(1.0, floor_log2_d(amax) - f.mbits);
      const double r = std::floor(amax / ulp + 0.5) * ulp;
      if (floor_log2_d(r) > 127) return 128;
      return clamp127(floor_log2_d(r) - f.emax);
    }
    case ScaleRule::rceil: {
      // Transformer Engine: 1/max_normal formed in double and stored as float; the product
      // amax * rcp in float32 (the double product of two floats is exact, so one cast rounds
      // it once, like a float32 multiply); then round up to a power of two.
      const float rcp = static_cast<float>(1.0 / f.max);
      const double d = static_cast<double>(static_cast<float>(amax * static_cast<double>(rcp)));
      if (d == 0.0) return -127;
      return clamp127(ceil_log2_d(d));
    }
    case ScaleRule::floor_bump: {
      int s = clamp127(floor_log2_d(amax) - f.emax);
      if (bump == Bump::always || std::ldexp(amax, -s) > f.max) s = clamp127(s + 1);
      return s;
    }
    default:
      ADD_FAILURE() << "unknown rule";
      return 0;
  }
}

struct RefElem {
  float value;
  bool clamped, lastbin;
};

double f32_ulp(float v) {  // spacing of float32 at |v|
  const double a = std::fabs(static_cast<double>(v));
  if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
  return std::ldexp(1.0, floor_log2_d(a) - 23);
}

RefElem ref_element(float v, int s, const RefFormat& f, Rounding mode, uint32_t rnd) {
  RefElem out{0.0f, false, false};
  const double sign = std::signbit(v) ? -1.0 : 1.0;
  const double r = std::ldexp(std::fabs(static_cast<double>(v)), -s);  // exact in double
  double k;            // the element's magnitude as a multiple of `spacing`
  double spacing;      // element grid spacing at r
  if (r > f.max) {
    out.clamped = true;
    spacing = 1.0;
    k = f.max;
  } else {
    if (f.is_int) spacing = std::ldexp(1.0, -f.mbits);
    else spacing = std::ldexp(1.0, (r >= std::ldexp(1.0, f.emin) ? floor_log2_d(r) : f.emin) - f.mbits);
    const double t = r / spacing;  // exact: power-of-two division
    const double n = std::floor(t);
    const double frac = t - n;     // exact
    bool up = false;
    switch (mode) {
      case Rounding::nearest_even: up = frac > 0.5 || (frac == 0.5 && std::fmod(n, 2.0) == 1.0); break;
      case Rounding::nearest_away: up = frac >= 0.5; break;
      case Rounding::toward_zero: up = false; break;
      case Rounding::stochastic: {
        // Documented stream rule: d = bits of v below the element grid; with D = min(d, 32),
        // round up iff (rnd mod 2^D) / 2^D < frac truncated to D bits.
        if (frac > 0.0) {
          const int d = static_cast<int>(std::lround(std::log2(std::ldexp(spacing, s) / f32_ulp(v))));
          const int D = d < 32 ? d : 32;
          const double U = static_cast<double>(D == 32 ? rnd : (rnd & ((1u << D) - 1u))) / std::ldexp(1.0, D);
          const double fr = std::floor(std::ldexp(frac, D)) / std::ldexp(1.0, D);
          up = U < fr;
        }
        break;
      }
      default: break;
    }
    k = (n + (up ? 1.0 : 0.0)) * spacing;
    if (k > f.max) k = f.max;  // cannot happen for r <= max: max is on the grid
  }
  out.lastbin = k == f.max;
  // Dequantized value; the cast is exact (<= 8 significant bits, >= 2^-143) or overflows to
  // Inf exactly when the library's make_float does (>= 2^128).
  out.value = static_cast<float>(sign * std::ldexp(k, s));
  if (k == 0.0) out.value = std::signbit(v) ? -0.0f : 0.0f;
  return out;
}

struct RefResult {
  std::vector<float> out;
  QuantStats st;
};

// Reference tensor quantizer: blocks along rows (contiguous) or down columns (strided).
RefResult ref_quantize(const std::vector<float>& in, int64_t rows, int64_t cols, Axis axis, const QuantSpec& spec,
                       const RefFormat& f) {
  RefResult res;
  res.out.assign(in.size(), 0.0f);
  const int64_t lines = axis == Axis::contiguous ? rows : cols;
  const int64_t len = axis == Axis::contiguous ? cols : rows;
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t b0 = 0; b0 < len; b0 += spec.block) {
      std::vector<int64_t> idx;
      for (int64_t p = b0; p < len && p < b0 + spec.block; ++p)
        idx.push_back(axis == Axis::contiguous ? line * cols + p : p * cols + line);
      res.st.blocks++;
      res.st.n += idx.size();
      bool bad = false;
      double amax = 0.0;
      for (int64_t i : idx) {
        if (std::isnan(in[i]) || std::isinf(in[i])) bad = true;
        else amax = std::fmax(amax, std::fabs(static_cast<double>(in[i])));
      }
      if (bad) {
        res.st.nan_blocks++;
        for (int64_t i : idx) res.out[i] = std::nanf("");
        continue;
      }
      const int s = ref_scale(amax, f, spec.rule, spec.bump);
      // No scale (the rule's exponent is beyond E8M0): the block is NaN too. With a scale, each
      // element on its own (one that dequantizes to 2^128 or more is +-Inf).
      if (s == 128) {
        res.st.nan_blocks++;
        for (int64_t i : idx) res.out[i] = std::nanf("");
        continue;
      }
      for (int64_t i : idx) {
        const uint32_t rnd = philox(spec.seed, Stream::stochastic_round, spec.salt, static_cast<uint64_t>(i)).v[0];
        const RefElem e = ref_element(in[i], s, f, spec.rounding, rnd);
        res.out[i] = e.value;
        res.st.clamped += e.clamped;
        res.st.lastbin += e.lastbin;
      }
    }
  }
  return res;
}

// ---- inputs -----------------------------------------------------------------------------------

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint32_t u32() { return static_cast<uint32_t>(rng_()); }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin() { return (u32() & 1u) != 0; }

  // Any finite float from random bits.
  float any_finite() {
    for (;;) {
      const float f = from_bits(u32());
      if (std::isfinite(f)) return f;
    }
  }
  // Random float with biased exponent field E - [0, spread] (clamped at 0: subnormals).
  float near_exp(int E, int spread) {
    int e = E - uniform(0, spread);
    if (e < 0) e = 0;
    const uint32_t b = (coin() ? 0x80000000u : 0u) | (static_cast<uint32_t>(e) << 23) | (u32() & 0x7FFFFFu);
    return from_bits(b);
  }
  // Powers of two, their neighbours, zeros, the largest/smallest floats.
  float special(int E) {
    const float p = from_bits(static_cast<uint32_t>(E < 1 ? 1 : E) << 23);
    float v = 0.0f;
    switch (uniform(0, 8)) {
      case 0: v = p; break;
      case 1: v = std::nextafter(p, 0.0f); break;
      case 2: v = std::nextafter(p, INFINITY); break;
      case 3: v = 0.0f; break;
      case 4: v = -0.0f; break;
      case 5: v = from_bits(1u + (u32() & 0xFu)); break;        // tiny subnormals
      case 6: v = from_bits(0x7F7FFFFFu - (u32() & 0xFu)); break;  // near FLT_MAX
      case 7: v = from_bits(0x00800000u - 1u - (u32() & 0x3u)); break;  // largest subnormals
      default: v = from_bits(static_cast<uint32_t>(uniform(1, 254)) << 23); break;
    }
    return coin() ? -v : v;
  }

 private:
  std::mt19937_64 rng_;
};

// Fill one block (values at `idx`) with one of several input families. Families that need the
// block's scale (ties, the last-bin edge) pick the block maximum first and ask the reference
// for the scale the rule gives it.
void fill_block(Gen& g, std::vector<float>& x, const std::vector<int64_t>& idx, const RefFormat& f,
                const QuantSpec& spec) {
  const int family = g.uniform(0, 5);
  const int E = g.uniform(0, 254);
  if (family == 0) {
    for (int64_t i : idx) x[i] = g.any_finite();
    return;
  }
  if (family == 1) {
    const int spread = g.uniform(0, 24);
    for (int64_t i : idx) x[i] = g.near_exp(E, spread);
    return;
  }
  if (family == 2) {
    for (int64_t i : idx) x[i] = g.coin() ? g.special(E - g.uniform(0, 12)) : g.near_exp(E, 10);
    return;
  }
  // Families 3-5: grid-aware. Block max first.
  const float amax_v = g.near_exp(E < 1 ? 1 : E, 0);
  x[idx[0]] = amax_v;
  const double amax = std::fabs(static_cast<double>(amax_v));
  const int s = ref_scale(amax, f, spec.rule, spec.bump);
  const double top_spacing = std::ldexp(1.0, f.is_int ? -f.mbits : f.emax - f.mbits);
  for (size_t j = 1; j < idx.size(); ++j) {
    // A random element-grid point n * spacing (or a midpoint), in the element's range.
    const int eb = f.is_int ? 0 : g.uniform(f.emin - 1, f.emax);  // emin-1: subnormal range
    const double spacing = f.is_int ? std::ldexp(1.0, -f.mbits) : std::ldexp(1.0, std::max(eb, f.emin) - f.mbits);
    const int nmax = f.is_int ? 127 : (1 << (f.mbits + 1));
    const double n = static_cast<double>(g.uniform(0, nmax));
    double r;
    if (family == 3) r = (n + 0.5) * spacing;                   // exact tie
    else if (family == 4) r = f.max + g.uniform(-2, 2) * 0.5 * top_spacing;  // last-bin edge
    else r = n * spacing;                                        // grid point (fixed point)
    double v = std::ldexp(r, s);
    if (!(v <= amax) || v < 0) v = amax;
    float fv = static_cast<float>(v);
    if (family == 4 && g.coin()) fv = std::nextafter(fv, g.coin() ? INFINITY : 0.0f);  // one ulp off
    if (std::fabs(fv) > amax_v || !std::isfinite(fv)) fv = amax_v;
    x[idx[j]] = g.coin() ? -fv : fv;
  }
}

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return to_bits(a) == to_bits(b);
}

int64_t work_scale() {
  const char* e = std::getenv("MXLAB_EXHAUSTIVE");
  return (e && std::string(e) == "1") ? 40 : 1;
}

struct Counts {
  int64_t elements = 0, ties = 0, clamped = 0, nonzero = 0;
  int64_t inf_from_finite = 0;  // finite inputs that dequantize to +-Inf (top of the float32 range)
};

// One random matrix, quantized by the library and the reference; returns elements compared.
void run_case(Gen& g, const RefFormat& f, ScaleRule rule, Rounding mode, Bump bump, Axis axis, Counts& c,
              int& failures) {
  QuantSpec spec;
  spec.fmt = f.fmt;
  spec.rule = rule;
  spec.rounding = mode;
  spec.bump = bump;
  spec.block = g.uniform(1, 64);
  spec.seed = (static_cast<uint64_t>(g.u32()) << 32) | g.u32();
  spec.salt = g.u32();
  const int64_t rows = g.uniform(1, 6);
  const int64_t cols = g.uniform(1, 3) == 1 ? g.uniform(1, 9) : g.uniform(1, 150);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  const int64_t lines = axis == Axis::contiguous ? rows : cols;
  const int64_t len = axis == Axis::contiguous ? cols : rows;
  for (int64_t line = 0; line < lines; ++line)
    for (int64_t b0 = 0; b0 < len; b0 += spec.block) {
      std::vector<int64_t> idx;
      for (int64_t p = b0; p < len && p < b0 + spec.block; ++p)
        idx.push_back(axis == Axis::contiguous ? line * cols + p : p * cols + line);
      fill_block(g, x, idx, f, spec);
    }
  std::vector<float> y(x.size());
  QuantStats st;
  quantize_dequantize(x.data(), y.data(), rows, cols, axis, spec, &st);
  const RefResult ref = ref_quantize(x, rows, cols, axis, spec, f);
  for (size_t i = 0; i < x.size(); ++i) {
    c.elements++;
    c.nonzero += y[i] != 0.0f;
    c.inf_from_finite += std::isfinite(x[i]) && std::isinf(y[i]);
    if (!same_bits(y[i], ref.out[i]) && failures < 10) {
      ++failures;
      ADD_FAILURE() << name(f.fmt) << " rule=" << name(rule) << " rounding=" << name(mode) << " bump=" << name(bump)
                    << " axis=" << (axis == Axis::contiguous ? "contiguous" : "strided") << " block=" << spec.block
                    << " shape=" << rows << "x" << cols << " index " << i << ": input " << x[i] << " (0x" << std::hex
                    << to_bits(x[i]) << ") library " << y[i] << " (0x" << to_bits(y[i]) << ") reference "
                    << ref.out[i] << " (0x" << to_bits(ref.out[i]) << std::dec << ")";
    }
  }
  c.clamped += st.clamped;
  if (st.clamped != ref.st.clamped || st.lastbin != ref.st.lastbin || st.n != ref.st.n ||
      st.blocks != ref.st.blocks || st.nan_blocks != ref.st.nan_blocks) {
    if (failures < 10) {
      ++failures;
      ADD_FAILURE() << name(f.fmt) << " " << name(rule) << " " << name(mode) << ": stats differ: library clamped "
                    << st.clamped << " lastbin " << st.lastbin << " n " << st.n << ", reference clamped "
                    << ref.st.clamped << " lastbin " << ref.st.lastbin << " n " << ref.st.n;
    }
  }
}

}  // namespace

// Every format x scale rule x rounding x axis, random matrices of every magnitude.
TEST(QuantizeReference, LibraryEqualsIndependentReferenceBitForBit) {
  Gen g(0x5EEDF00Dull);
  const int64_t cases_per_combo = 96 * work_scale();
  int failures = 0;
  Counts c;
  for (const RefFormat& f : kRefFormats)
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (int m = 0; m < static_cast<int>(Rounding::kCount); ++m) {
        if (static_cast<Rounding>(m) == Rounding::noise) continue;  // no rounding: its reference is test_mx_noise.cpp
        for (int bump = 0; bump < (static_cast<ScaleRule>(r) == ScaleRule::floor_bump ? 2 : 1); ++bump)
          for (int axis = 0; axis < 2; ++axis)
            for (int64_t k = 0; k < cases_per_combo; ++k)
              run_case(g, f, static_cast<ScaleRule>(r), static_cast<Rounding>(m), static_cast<Bump>(bump),
                       static_cast<Axis>(axis), c, failures);
      }
  // The inputs must exercise the interesting paths, or the comparison proves little.
  EXPECT_GT(c.elements, 500000);
  EXPECT_GT(c.nonzero, c.elements / 4);
  EXPECT_GT(c.clamped, 1000);
  EXPECT_GT(c.inf_from_finite, 0);  // the top of the float32 range is reached
  std::printf("[ reference ] %lld elements compared, %lld non-zero outputs, %lld clamped, %lld +-Inf from finite\n",
              static_cast<long long>(c.elements), static_cast<long long>(c.nonzero), static_cast<long long>(c.clamped),
              static_cast<long long>(c.inf_from_finite));
}

// The shared exponent alone, on many more block maxima: random bit patterns and every float32
// exponent field with the mantissas that sit at rounding boundaries.
TEST(QuantizeReference, SharedExponentEqualsReferenceForAllRules) {
  Gen g(42);
  const int64_t randoms = 200000 * work_scale();
  std::vector<float> amaxes;
  for (uint32_t e = 0; e < 255; ++e)
    for (uint32_t mant : {0x000000u, 0x000001u, 0x7FFFFFu, 0x7FFFFEu, 0x400000u, 0x3FFFFFu, 0x400001u, 0x600000u,
                          0x5FFFFFu, 0x0FFFFFu, 0x100000u, 0x0FFFFFu, 0x080000u, 0x07FFFFu, 0x200000u, 0x1FFFFFu,
                          0x700000u, 0x6FFFFFu, 0x780000u, 0x77FFFFu})
      amaxes.push_back(from_bits((e << 23) | mant));
  for (int64_t i = 0; i < randoms; ++i) amaxes.push_back(std::fabs(g.any_finite()));
  // Near the rceil decision points: amax close to max_normal * 2^k.
  for (const RefFormat& f : kRefFormats)
    for (int k = -140; k <= 130; ++k) {
      const float p = static_cast<float>(std::ldexp(f.max, k));
      if (!std::isfinite(p) || p == 0.0f) continue;
      float lo = p, hi = p;
      for (int j = 0; j < 4; ++j) {
        amaxes.push_back(lo);
        amaxes.push_back(hi);
        lo = std::nextafter(lo, 0.0f);
        hi = std::nextafter(hi, INFINITY);
      }
    }
  int failures = 0;
  for (const RefFormat& f : kRefFormats) {
    const ElemSpec& es = elem_spec(mx_elem(f.fmt));
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (int b = 0; b < 2; ++b)
        for (float a : amaxes) {
          if (!std::isfinite(a)) continue;
          const int lib = shared_exponent(a, es, static_cast<ScaleRule>(r), static_cast<Bump>(b));
          const int ref = ref_scale(a, f, static_cast<ScaleRule>(r), static_cast<Bump>(b));
          if (lib != ref && failures++ < 10)
            ADD_FAILURE() << name(f.fmt) << " " << name(static_cast<ScaleRule>(r)) << " bump=" << b << " amax "
                          << a << " (0x" << std::hex << to_bits(a) << std::dec << "): library " << lib
                          << " reference " << ref;
        }
  }
  EXPECT_EQ(failures, 0);
}
