// The scalar MX numerics, shared verbatim by the CPU reference (lab/mx/quantize.cpp) and
// the CUDA kernels (kernels/quantize.cu): shared-exponent rules, element rounding, bf16 and
// fp16 rounding. Everything is computed on the float's bits with integer arithmetic, so it
// is exact (no log2, no float division) and gives the same bits on every machine.
//
// Conventions:
//   - A finite float v is m * 2^(x) with m a 24-bit integer significand (see decompose()).
//   - A block's shared scale is X = 2^s, s in [-127, 127] (an E8M0 exponent), or the NaN scale
//     (kScaleExpNaN) where the block holds a NaN or Inf or its rule's exponent is beyond E8M0.
//   - An element is quantized as the value r = v / X rounded onto the element's grid,
//     saturating at +-max_normal; subnormal elements are kept; the dequantized value
//     Q(v) = round(r) * X is returned as a float (exact: see make_float(); +-Inf where it
//     reaches 2^128, possible only within one element rounding step of FLT_MAX).
#pragma once
#include <cstdint>

#include "lab/core/hd.h"
#include "lab/core/philox.h"
#include "lab/mx/format.h"

namespace mxlab {

constexpr int kScaleExpMin = -127;  // E8M0 range used for shared exponents
constexpr int kScaleExpMax = 127;
// The E8M0 NaN code (0xFF) as an exponent: what shared_exponent() and block_scale_exp() return
// for a block that has no scale (its rule's exponent is beyond E8M0). Such a block becomes all
// NaN, as a block holding NaN or Inf does (lab/mx/README.md, "Blocks at the top of the float32
// range").
constexpr int kScaleExpNaN = 128;
constexpr float kFloat32Max = 3.40282347e38f;

MXLAB_HD int clz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(x);
#else
  return x == 0 ? 32 : __builtin_clz(x);
#endif
}

// |v| = m * 2^x with m < 2^24 an integer (m == 0 for zero). Only for finite v.
struct Decomposed {
  uint32_t m;
  int x;
  bool neg;
};

MXLAB_HD Decomposed decompose(float v) {
  const uint32_t b = f32_bits(v);
  const uint32_t e = (b >> 23) & 0xFFu;
  const uint32_t f = b & 0x7FFFFFu;
  Decomposed d;
  d.neg = (b >> 31) != 0;
  if (e == 0) {  // zero or float32 subnormal: f * 2^-149
    d.m = f;
    d.x = -149;
  } else {
    d.m = f | 0x800000u;
    d.x = static_cast<int>(e) - 150;
  }
  return d;
}

MXLAB_HD bool is_finite_bits(uint32_t b) { return ((b >> 23) & 0xFFu) != 0xFFu; }

// floor(log2 m*2^x) for m > 0.
MXLAB_HD int floor_log2(uint32_t m, int x) { return x + 31 - clz32(m); }

// k * 2^e as a float, exactly, for 0 <= k < 2^31 whenever the result is representable;
// results at or above 2^128 become +Inf (possible only for blocks within one rounding step
// of FLT_MAX). Results below 2^-149 cannot occur for MX elements (finest grid is 2^-143).
MXLAB_HD float make_float(uint32_t k, int e, bool neg) {
  const uint32_t sign = neg ? 0x80000000u : 0u;
  if (k == 0) return bits_f32(sign);
  // Normalise k to a 24-bit significand (k < 2^31, so at most 7 right shifts; the shifted-out
  // bits are zero for every caller because k has <= 10 significant bits).
  const int msb = 31 - clz32(k);
  int exp = e + msb;  // value is in [2^exp, 2^(exp+1))
  if (exp >= 128) return bits_f32(sign | 0x7F800000u);
  uint32_t sig = msb >= 23 ? (k >> (msb - 23)) : (k << (23 - msb));
  if (exp >= -126) {
    return bits_f32(sign | (static_cast<uint32_t>(exp + 127) << 23) | (sig & 0x7FFFFFu));
  }
  // Subnormal: shift further right; exact for the grids used here (2^-149 divides them).
  const int sh = -126 - exp;
  sig = sh >= 32 ? 0u : (sig >> sh);
  return bits_f32(sign | sig);
}

// Should the magnitude m*2^x round up when the bits below 2^q are dropped (m*2^x >= 0)?
// Returns the kept integer k such that the result is k * 2^q.
MXLAB_HD uint32_t round_to_grid(uint32_t m, int x, int q, Rounding mode, uint32_t rnd) {
  const int shift = q - x;  // number of low bits of m to drop
  if (shift <= 0) return m << (-shift);  // already on the grid (callers keep this < 2^31)
  uint32_t kept, rem;
  bool half_exact = false, above_half = false;
  if (shift >= 32) {
    kept = 0;
    rem = m;  // m < 2^24 <= 2^(shift-1): strictly below half
  } else {
    kept = m >> shift;
    rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    half_exact = rem == half;
    above_half = rem > half;
  }
  bool up = false;
  switch (mode) {
    case Rounding::nearest_even: up = above_half || (half_exact && (kept & 1u)); break;
    case Rounding::nearest_away: up = above_half || half_exact; break;
    case Rounding::toward_zero: up = false; break;
    case Rounding::stochastic:
      // Round up with probability rem / 2^shift, using the low `shift` random bits.
      if (shift < 32) {
        up = (rnd & ((1u << shift) - 1u)) < rem;
      } else {
        // rem < 2^24: compare the top 32 bits of the fraction with 32 random bits.
        const int down = shift - 32;
        const uint32_t frac32 = down >= 24 ? 0u : (rem >> down);
        up = rnd < frac32;
      }
      break;
    default: break;
  }
  return kept + (up ? 1u : 0u);
}

// Sign of (a * 2^ea) - (b * 2^eb) for a, b < 2^31.
MXLAB_HD int cmp_scaled(uint32_t a, int ea, uint32_t b, int eb) {
  if (a == 0 || b == 0) return (a > 0) - (b > 0);
  const int la = floor_log2(a, ea), lb = floor_log2(b, eb);
  if (la != lb) return la > lb ? 1 : -1;
  // Same binade: align to the smaller exponent (difference < 32 bits here).
  uint64_t A = a, B = b;
  if (ea > eb) A <<= (ea - eb); else B <<= (eb - ea);
  return (A > B) - (A < B);
}

// ---- shared exponent ---------------------------------------------------------------------

// Below the E8M0 range a scale is clamped (every element of such a block is tiny); above it
// there is none: the NaN code.
MXLAB_HD int clamp_scale_exp(int s) {
  return s < kScaleExpMin ? kScaleExpMin : (s > kScaleExpMax ? kScaleExpNaN : s);
}

// Reciprocal of max_normal as float32, as Transformer Engine and torchao form it
// (1.0f / max_normal rounded to float32 once).
MXLAB_HD float max_normal_reciprocal_f32(const ElemSpec& es) {
  return 1.0f / static_cast<float>(es.max_normal());
}

// Round a positive float's bits up to a power of two, returning the biased E8M0 exponent;
// Transformer Engine's float_to_e8m0 (satfinite, round toward +inf).
MXLAB_HD int e8m0_round_up_biased(float val) {
  const uint32_t b = f32_bits(val);
  uint32_t e = (b >> 23) & 0xFFu;
  const uint32_t mant = b & 0x7FFFFFu;
  if (e == 0xFFu) return mant ? 255 : 254;  // NaN -> NaN code, Inf -> largest finite
  if (val == 0.0f) return 0;
  if (mant > 0 && e != 0xFEu && !(e == 0 && mant <= 0x400000u)) ++e;
  return static_cast<int>(e);
}

// The shared exponent s (X = 2^s) of a block with absolute maximum `amax` (finite, >= 0), or
// kScaleExpNaN where the rule's exponent is beyond E8M0 (nothing else makes it NaN):
//   - int8 (emax 0) under ceil, even, rceil and floor_bump, for amax near FLT_MAX: s = 128;
//   - `even` where amax rounded to the element's mantissa width reaches 2^128: that rounded
//     maximum has exponent 128, beyond float32 and E8M0 (torchao's EVEN: its rounded amax is
//     Inf, the NaN scale), for every format.
// amax == 0 gives -127 (every element is then 0). See DESIGN.md section 2 and lab/mx/README.md.
// Quantizers and the quantization-gap instrument call block_scale_exp() below, which also takes
// the NaN/Inf policy.
MXLAB_HD int shared_exponent(float amax, const ElemSpec& es, ScaleRule rule, Bump bump) {
  if (amax == 0.0f) return kScaleExpMin;
  const Decomposed d = decompose(amax);
  const int emax = es.emax();
  switch (rule) {
    case ScaleRule::floor:
      return clamp_scale_exp(floor_log2(d.m, d.x) - emax);
    case ScaleRule::ceil: {
      // torchao CEIL: add one to the float's exponent when any mantissa bit is set.
      const int fl = floor_log2(d.m, d.x);
      const bool pow2 = (d.m & (d.m - 1u)) == 0u;
      return clamp_scale_exp(fl + (pow2 ? 0 : 1) - emax);
    }
    case ScaleRule::even: {
      // torchao EVEN: round amax half-up to the element's mantissa width (mbits bits below
      // its leading one), then floor. torchao adds half an element ulp to the float's bits,
      // which is the same for a normal amax; for a float32-subnormal amax the bit trick
      // would round at the wrong place, which changes s only for int8 (emax 0), a format
      // torchao does not have: mxlab rounds the value.
      const int fl = floor_log2(d.m, d.x);
      const int drop = (31 - clz32(d.m)) - es.mbits;  // bits below the kept mantissa
      const bool carry = drop > 0 && ((d.m + (1u << (drop - 1))) >> (drop + es.mbits + 1)) != 0u;
      const int rounded_exp = fl + (carry ? 1 : 0);  // floor(log2) of the rounded amax
      if (rounded_exp > kScaleExpMax) return kScaleExpNaN;  // rounded amax 2^128: no float32, no E8M0
      return clamp_scale_exp(rounded_exp - emax);
    }
    case ScaleRule::rceil: {
      // Transformer Engine / torchao: descale = amax * (1/max_normal) in float32, rounded up
      // to a power of two in bit space.
      const float descale = amax * max_normal_reciprocal_f32(es);
      // e8m0_round_up_biased saturates (as Transformer Engine's satfinite conversion does) where
      // rounding up would need code 255; here that is the NaN scale instead.
      const uint32_t db = f32_bits(descale);
      if ((db >> 23) == 0xFEu && (db & 0x7FFFFFu) != 0u) return kScaleExpNaN;
      return clamp_scale_exp(e8m0_round_up_biased(descale) - 127);
    }
    case ScaleRule::floor_bump: {
      int s = clamp_scale_exp(floor_log2(d.m, d.x) - emax);
      // Would the block maximum clamp, i.e. amax / 2^s > max_normal?
      const bool clamps = cmp_scaled(d.m, d.x - s, es.max_sig(), es.max_lsb_exp()) > 0;
      if (bump == Bump::always || clamps) s = clamp_scale_exp(s + 1);  // int8 at 2^127: NaN
      return s;
    }
    default:
      return clamp_scale_exp(floor_log2(d.m, d.x) - emax);
  }
}

// ---- element quantization ------------------------------------------------------------------

struct ElemResult {
  float value;   // dequantized Q(v) = element * 2^s
  bool clamped;  // |v / X| > max_normal before saturation
  bool lastbin;  // |element| == max_normal after rounding and saturation
};

// Quantize one finite element v of a block with shared exponent s: the integer path, for
// every rounding mode. quantize_element() uses it for stochastic rounding; for the
// deterministic modes it is the reference the float path below is proven equal to.
MXLAB_HD ElemResult quantize_element_exact(float v, int s, const ElemSpec& es, Rounding mode, uint32_t rnd) {
  ElemResult out{0.0f, false, false};
  const Decomposed d = decompose(v);
  if (d.m == 0) {
    out.value = bits_f32(d.neg ? 0x80000000u : 0u);
    return out;
  }
  const int x = d.x - s;  // |r| = m * 2^x
  const int er = floor_log2(d.m, x);
  const int q = (er > es.emin() ? er : es.emin()) - es.mbits;  // grid spacing exponent
  out.clamped = cmp_scaled(d.m, x, es.max_sig(), es.max_lsb_exp()) > 0;
  uint32_t k;
  int kq;
  if (out.clamped) {
    k = es.max_sig();
    kq = es.max_lsb_exp();
  } else {
    k = round_to_grid(d.m, x, q, mode, rnd);
    kq = q;
    // Rounding up may cross max_normal (e.g. E4M3 464 -> 480): saturate.
    if (cmp_scaled(k, kq, es.max_sig(), es.max_lsb_exp()) > 0) {
      k = es.max_sig();
      kq = es.max_lsb_exp();
    }
  }
  out.lastbin = cmp_scaled(k, kq, es.max_sig(), es.max_lsb_exp()) == 0;
  out.value = make_float(k, kq + s, d.neg);
  return out;
}

// ---- fast path for the deterministic roundings ---------------------------------------------
// The same function as quantize_element_exact() for nearest_even, nearest_away and toward_zero,
// in about 20 float/integer instructions without 64-bit or data-dependent integer work (the
// integer path costs a few hundred instructions per element on a GPU). Every float operation
// here is exact or its rounding is harmless, as argued step by step below; the equality is
// also checked on every float32 input (tests/gpu/test_quantize_fast_gpu.cu) and on a
// structured and random sample on the CPU (tests/cpu/test_quantize_fast.cpp).
//
// Requirements: IEEE float32 arithmetic with round-to-nearest-even, subnormals honoured (no
// flush-to-zero / denormals-are-zero: nvcc's default --ftz=false, no -ffast-math on the host)
// and no excess precision (SSE on x86-64, FLT_EVAL_METHOD 0).
#if defined(__FAST_MATH__)
#error "lab/mx/scalar.h: the exact float path needs IEEE subnormals and rounding; do not build with -ffast-math"
#endif

// 2^e as a float, exactly, for e in [-127, 127] (2^-127 is the subnormal 0x00400000).
MXLAB_HD float pow2_f32(int e) {
  return bits_f32(e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 0x00400000u);
}

// min(a, b) for non-NaN floats: one FMNMX on the GPU, minss on x86-64 (std::fmin would be a
// libm call there because of its NaN rules, which never apply here).
MXLAB_HD float min_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return b < a ? b : a;
#endif
}

// The block-constant part of the fast path: X = 2^s and 1/X = 2^-s, both exact floats.
struct ElemScale {
  float inv;    // 2^-s
  float scale;  // 2^s
};
MXLAB_HD ElemScale elem_scale(int s) { return ElemScale{pow2_f32(-s), pow2_f32(s)}; }

MXLAB_HD constexpr bool fast_rounding(Rounding mode) {
  return mode == Rounding::nearest_even || mode == Rounding::nearest_away || mode == Rounding::toward_zero;
}

// 2^23 as a float: adding and subtracting it rounds a float in [0, 2^22] to an integer,
// half to even (the sum lies in [2^23, 2^24), where the float spacing is exactly 1).
constexpr float kRintMagic = 8388608.0f;

// Quantize one finite element v (deterministic modes only: see quantize_element()).
MXLAB_HD ElemResult quantize_element_fast(float v, ElemScale sc, const ElemSpec& es, Rounding mode) {
  // max_normal = max_sig * 2^max_lsb_exp: an integer below 2^8 times a power of two in
  // [2^-6, 2^13], exact as a float (built from bits so that nothing rounds).
  const float max_normal = static_cast<float>(es.max_sig()) * pow2_f32(es.max_lsb_exp());
  const uint32_t emin_field = static_cast<uint32_t>(es.emin() + 127) << 23;  // biased emin, in place
  const uint32_t mbits_field = static_cast<uint32_t>(es.mbits) << 23;
  // a = |v| / X. Exact whenever a >= 2^-126; overflow gives +Inf (then a > max_normal, as
  // exactly). Below 2^-126 the product may round, but it stays <= 2^-126, far below half the
  // finest element spacing (2^-17 for E5M2): every deterministic mode gives 0, exactly as
  // for the unrounded value, and neither value is clamped.
  const float a = bits_f32(f32_bits(v) & 0x7FFFFFFFu) * sc.inv;
  ElemResult out;
  out.clamped = a > max_normal;
  // Clamped values take max_normal, which is on the grid, so they need no separate branch.
  const float ac = min_f32(a, max_normal);
  // Grid exponent q = max(e_a, emin) - mbits with e_a = floor(log2 ac), read from the biased
  // exponent field (0 for a float32-subnormal ac, which then takes the emin branch, as it must:
  // ac < 2^-126 < 2^emin). Kept in place (shifted left by 23) so that it builds the powers
  // of two directly: 2^-q has biased field 254 + mbits - qe, 2^q has qe - mbits, both in
  // the normal range for every format (q in [emin - mbits, emax - mbits] = [-16, 13]).
  const uint32_t e_field = f32_bits(ac) & 0x7F800000u;
  const uint32_t qe_field = e_field > emin_field ? e_field : emin_field;
  const float inv_spacing = bits_f32((254u << 23) + mbits_field - qe_field);
  const float spacing = bits_f32(qe_field - mbits_field);
  // t = ac / 2^q: exact (a power-of-two scaling whose result is a normal float or a multiple of
  // 2^-149), and t < 2^(mbits + 1) <= 128, so the integer rounding below is exact.
  const float t = ac * inv_spacing;
  float k = (t + kRintMagic) - kRintMagic;  // round half to even
  if (mode == Rounding::nearest_away) {
    // A tie that went down to even goes up instead; t - k is exact (|t - k| <= 1/2, and
    // Sterbenz's lemma where k > 0).
    if (t - k == 0.5f) k += 1.0f;
  } else if (mode == Rounding::toward_zero) {
    if (k > t) k -= 1.0f;  // t >= 0, so truncation is floor
  }
  // k * 2^q: exact (k <= 2^(mbits + 1)). It never exceeds max_normal, so unlike the integer
  // path this needs no saturation step: q <= emax - mbits = max_lsb_exp, so max_normal / 2^q
  // is an integer >= t, and each mode rounds t to an integer without passing one that is >= t.
  const float mag = k * spacing;
  out.lastbin = mag == max_normal;
  // mag * X: exact, the result's least significant bit is >= 2^(min_sub_exp + s) >= 2^-143
  // (so even a float32-subnormal result is exact), and a product >= 2^128 rounds to +Inf
  // (an MX value has <= 8 significant bits, so none lies strictly between FLT_MAX and 2^128).
  // The sign is v's, also for zero.
  out.value = bits_f32(f32_bits(mag * sc.scale) | (f32_bits(v) & 0x80000000u));
  return out;
}

// ---- noise instead of rounding (Rounding::noise) ----------------------------------------------
// MX's error magnitude without its bias: the element becomes v + u * ulp(v), a float32 that is in
// general not on the element grid, with ulp(v) the spacing of the element grid at v under the
// block's scale X = 2^s (the scale the quantizer itself chooses: block_scale_exp) and u uniform on
// (-1/2, 1/2) from the element's random word (Stream::mx_noise, indexed like stochastic rounding).
// Nothing is clamped or saturated. lab/mx/README.md, "Noise instead of rounding", has the
// definitions and why; tests/cpu/test_mx_noise.cpp checks them.

// The exponent E of ulp(v) = 2^E for a finite, non-zero v in a block with shared exponent s
// (s in [-127, 127]): the binade of |v| / X, e = floor(log2 |v|) - s, taken into [emin, emax]
// (below emin, the element's subnormal range, the spacing is the lowest normal binade's, the
// subnormal spacing 2^(emin - mbits); above emax, beyond the top binade, the top binade's
// 2^(emax - mbits): no block's own scale puts an element there, every rule's scale being at least
// the floor rule's), then E = e - mbits + s. Integer arithmetic on v's bits (float32-subnormal v
// included: decompose() is exact). With the block's own scale, E is in [-143, 127]: the finest
// grid is E5M2's 2^(-16 - 127), and every rule gives s + emax <= 128 (amax < 2^128), so
// E <= 128 - mbits.
MXLAB_HD int noise_ulp_exp(float v, int s, const ElemSpec& es) {
  const Decomposed d = decompose(v);
  int e = floor_log2(d.m, d.x) - s;
  if (e < es.emin()) e = es.emin();
  if (e > es.emax()) e = es.emax();
  return e - es.mbits + s;
}

// 2^e as a float for e in [-149, 127] (float32 subnormals below -126), exactly.
MXLAB_HD float noise_pow2(int e) {
  return bits_f32(e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : (1u << (e + 149)));
}

// u from the element's random word: the odd multiples of 2^-25 in (-1/2, 1/2), each of the 2^24
// values equally likely (the top 24 bits of the word), so E[u] = 0 exactly, |u| <= 1/2 - 2^-25
// and Var[u] = (1 - 2^-48) / 12. The integer 2k + 1 - 2^24 has at most 24 significant bits, so it
// converts exactly, and the product with 2^-25 is exact.
MXLAB_HD float noise_u(uint32_t rnd) {
  const int32_t k = static_cast<int32_t>(((rnd >> 8) << 1) | 1u) - (int32_t{1} << 24);
  return static_cast<float>(k) * noise_pow2(-25);
}

// v + u * ulp(v) for one finite element v of a block with shared exponent s, u = noise_u(rnd).
// Two float32 operations, each rounded once to nearest even: n = u * 2^E (exact for E >= -124,
// u's last bit being 2^-25; below, a float32-subnormal n may round), then v + n. They are kept
// apart (never contracted into one FMA: -ffp-contract=off on the host, __fmul_rn / __fadd_rn on
// the device), so CPU and GPU give the same bits. Zero stays zero with its sign (the quantizer's
// error at 0 is 0 under every scale and rounding, and a tensor that is structurally zero, such as
// layernorm's beta at initialisation or an all-zero block, stays so). The statistics are those
// nearest_even quantization would count: clamped = |v| / X above max_normal (the noisy value
// itself is not clamped), lastbin = |v| / X would round to max_normal.
MXLAB_HD ElemResult noise_element(float v, int s, const ElemSpec& es, uint32_t rnd) {
  ElemResult out = quantize_element_fast(v, elem_scale(s), es, Rounding::nearest_even);
  if ((f32_bits(v) & 0x7FFFFFFFu) == 0u) {
    out.value = v;
    return out;
  }
  const float u = noise_u(rnd);
  const float ulp = noise_pow2(noise_ulp_exp(v, s, es));
#if defined(__CUDA_ARCH__)
  out.value = __fadd_rn(v, __fmul_rn(u, ulp));
#else
  const float n = u * ulp;
  out.value = v + n;
#endif
  return out;
}

// Whether an element rounding reads a random word, and the word of element `idx` (its flat index
// r * cols + c in the stored tensor) of a quantization with (seed, salt = the step): stochastic
// rounding from Stream::stochastic_round, noise from Stream::mx_noise; 0 for the others. Every
// quantizer (the CPU reference, each CUDA kernel, the quantization-gap instrument) draws it here.
MXLAB_HD constexpr bool draws_word(Rounding mode) { return mode == Rounding::stochastic || mode == Rounding::noise; }
MXLAB_HD uint32_t element_word(Rounding mode, uint64_t seed, uint32_t salt, uint64_t idx) {
  if (!draws_word(mode)) return 0u;
  return philox(seed, mode == Rounding::noise ? Stream::mx_noise : Stream::stochastic_round, salt, idx).v[0];
}

// Quantize one finite element v of a block with shared exponent s: the float path for the
// deterministic modes, the integer path for stochastic rounding, noise_element for noise. The
// CPU reference and the CUDA kernels both call this (or quantize_element_fast with elem_scale(s)),
// so they agree by construction.
MXLAB_HD ElemResult quantize_element(float v, int s, const ElemSpec& es, Rounding mode, uint32_t rnd) {
  if (fast_rounding(mode)) return quantize_element_fast(v, elem_scale(s), es, mode);
  if (mode == Rounding::noise) return noise_element(v, s, es, rnd);
  return quantize_element_exact(v, s, es, mode, rnd);
}

// ---- the scale of a block ----------------------------------------------------------------------

// The shared exponent of a block with absolute maximum `amax` (max |v_i|; NaN or Inf when the
// block holds one: a NaN-propagating maximum, or the caller passes NaN for such a block), or
// kScaleExpNaN: the block then becomes all NaN. The one function every quantizer (the CPU
// reference, every CUDA kernel) and the quantization-gap instrument call, so that they agree on
// which blocks have a scale. NaN where
//   - the block holds a NaN or an Inf (the NaN/Inf policy);
//   - the rule's exponent is beyond E8M0 (shared_exponent()).
// Nothing else: a block with a valid scale is quantized element by element, and an element whose
// dequantized value reaches 2^128 (amax within one element rounding step of FLT_MAX under ceil,
// rceil or floor_bump, which round the scale up) is +-Inf, the rest of the block unaffected, as
// torchao's to_dtype returns it (lab/mx/README.md, "Blocks at the top of the float32 range").
MXLAB_HD int block_scale_exp(float amax, const ElemSpec& es, ScaleRule rule, Bump bump) {
  if (!(amax <= kFloat32Max)) return kScaleExpNaN;
  return shared_exponent(amax, es, rule, bump);
}

// ---- scalar formats ---------------------------------------------------------------------------

// Round to bfloat16 (returned as the float with the same value). nearest_even or
// nearest_away; overflow goes to +-Inf, subnormals are kept, NaN stays (quiet) NaN.
MXLAB_HD float round_bf16(float v, Rounding mode) {
  const uint32_t b = f32_bits(v);
  if (!is_finite_bits(b)) return (b & 0x7FFFFFu) ? bits_f32((b | 0x00400000u) & 0xFFFF0000u) : v;
  uint32_t r;
  if (mode == Rounding::nearest_away) {
    r = b + 0x8000u;
  } else {  // nearest_even (other modes are not offered for bf16 vector ops)
    r = b + 0x7FFFu + ((b >> 16) & 1u);
  }
  return bits_f32(r & 0xFFFF0000u);
}

// Round to IEEE binary16 (returned as a float), round-to-nearest-even (or ties away),
// overflow to +-Inf (|v| >= 65520), subnormals kept, NaN stays NaN.
MXLAB_HD float round_fp16(float v, Rounding mode) {
  const uint32_t b = f32_bits(v);
  if (!is_finite_bits(b)) return (b & 0x7FFFFFu) ? bits_f32(b | 0x00400000u) : v;
  const Decomposed d = decompose(v);
  if (d.m == 0) return v;
  const int er = floor_log2(d.m, d.x);
  const int q = (er > -14 ? er : -14) - 10;
  const uint32_t k = round_to_grid(d.m, d.x, q, mode == Rounding::nearest_away ? mode : Rounding::nearest_even, 0u);
  if (cmp_scaled(k, q, 2047u, 5) > 0) return bits_f32((d.neg ? 0x80000000u : 0u) | 0x7F800000u);  // > 65504
  return make_float(k, q, d.neg);
}

// Is the (finite) float exactly representable in bf16? Used to guard the bf16 tensor-core GEMM.
MXLAB_HD bool bf16_exact(float v) { return (f32_bits(v) & 0xFFFFu) == 0u; }

}  // namespace mxlab
