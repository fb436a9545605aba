// The float fast path of the element quantizer (quantize_element_fast in lab/mx/scalar.h) equals
// the integer path (quantize_element_exact) bit for bit, clamped and lastbin flags included,
// for every element format x deterministic rounding mode, on the CPU:
//   - structured inputs: for a spread of scale exponents s, every float32 exponent field that
//     puts |v| / 2^s anywhere from far below the smallest subnormal element to far above
//     max_normal, times every combination of the top 10 mantissa bits with low-bit patterns that
//     make exact ties, near-ties and full mantissas; float32-subnormal inputs with one or two bits
//     set; zeros, FLT_MAX and the smallest subnormal at every s;
//   - random inputs: a few million per (format, mode), most with |v| / 2^s in the element range,
//     the rest uniform bit patterns (every magnitude), over random scale exponents in [-127, 127];
//   - hand-worked cases where the float path must not round (2^-127 as 1/X or X, Inf results,
//     saturation after rounding up, ties).
// Every float32 input is checked on the GPU (tests/gpu/test_quantize_fast_gpu.cu); that test runs
// this same header code compiled by nvcc. MXLAB_EXHAUSTIVE=1 runs every s in [-127, 127] in the
// structured part and 20x more random inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lab/mx/format.h"
#include "lab/mx/scalar.h"

using namespace mxlab;

namespace {

constexpr Rounding kFastModes[] = {Rounding::nearest_even, Rounding::nearest_away, Rounding::toward_zero};
constexpr int kMaxReport = 5;           // mismatches printed per case
constexpr uint64_t kRandomPerCase = 2'000'000;  // random inputs per (format, mode) in CI
constexpr int kExhaustiveFactor = 20;

bool exhaustive() {
  const char* e = std::getenv("MXLAB_EXHAUSTIVE");
  return e && std::string(e) == "1";
}

// splitmix64: a seeded, fast generator (the test must be reproducible).
struct SplitMix {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// Compares both paths on one input; counts and prints mismatches.
struct Checker {
  const ElemSpec& es;
  Rounding mode;
  uint64_t checked = 0, mismatches = 0;

  void check(uint32_t bits, int s) {
    if (!is_finite_bits(bits)) return;  // NaN/Inf never reach the element step (block policy)
    const float v = bits_f32(bits);
    const ElemResult want = quantize_element_exact(v, s, es, mode, 0u);
    const ElemResult got = quantize_element_fast(v, elem_scale(s), es, mode);
    ++checked;
    if (f32_bits(got.value) != f32_bits(want.value) || got.clamped != want.clamped || got.lastbin != want.lastbin) {
      if (mismatches < kMaxReport)
        ADD_FAILURE() << es.name << " " << name(mode) << " v=0x" << std::hex << bits << " (" << v << ") s=" << std::dec
                      << s << ": fast 0x" << std::hex << f32_bits(got.value) << " clamped " << got.clamped
                      << " lastbin " << got.lastbin << ", exact 0x" << f32_bits(want.value) << " clamped "
                      << want.clamped << " lastbin " << want.lastbin;
      ++mismatches;
    }
  }
};

std::vector<int> structured_scales() {
  if (exhaustive()) {
    std::vector<int> all;
    for (int s = kScaleExpMin; s <= kScaleExpMax; ++s) all.push_back(s);
    return all;
  }
  // Both ends of the E8M0 range (1/X or X subnormal, results subnormal or Inf, inputs that are
  // float32 subnormals), a step inside them, and ordinary scales.
  return {-127, -126, -125, -118, -100, -9, 0, 7, 100, 126, 127};
}

// Low mantissa patterns under the top 10 bits: exact (0), a tie at every bit position below
// (bit 12 alone is a tie for grids 13 bits coarser than the float; lower single bits make
// finer ties reachable through the exponent), just below and above those, full.
const uint32_t kLowPatterns[] = {0x0000u, 0x0001u, 0x1000u, 0x0FFFu, 0x1001u, 0x1FFFu, 0x0800u, 0x0400u, 0x0010u};

void structured_case(Checker& c, int s) {
  // Exponent fields that put |v| / 2^s between 2^(min_sub_exp - 4) and 2^(emax + 3): the window
  // where rounding decisions happen (outside it the result is 0 or the value clamps, covered by
  // the extra fields below).
  const int lo = c.es.min_sub_exp() - 4 + s + 127, hi = c.es.emax() + 3 + s + 127;
  std::vector<int> fields;
  for (int e = lo; e <= hi; ++e)
    if (e >= 0 && e <= 254) fields.push_back(e);
  for (int e : {0, 1, 2, 100, 127, 200, 253, 254}) fields.push_back(e);
  for (int e : fields)
    for (uint32_t top = 0; top < 1024u; ++top)
      for (uint32_t low : kLowPatterns)
        for (uint32_t sign : {0u, 0x80000000u})
          c.check(sign | (static_cast<uint32_t>(e) << 23) | (top << 13) | low, s);
  // float32 subnormals with one or two bits set (their ties sit at every bit position).
  for (int i = 0; i < 23; ++i)
    for (int j = 0; j <= i; ++j) c.check((1u << i) | (1u << j), s);
}

TEST(QuantizeFast, StructuredInputsEqualIntegerPath) {
  const std::vector<int> scales = structured_scales();
  for (const ElemSpec& es : kElemSpecs) {
    for (Rounding mode : kFastModes) {
      Checker c{es, mode};
      for (int s : scales) structured_case(c, s);
      EXPECT_EQ(c.mismatches, 0u) << es.name << " " << name(mode) << ": " << c.mismatches << " of " << c.checked;
      EXPECT_GT(c.checked, 100000u);
    }
  }
}

TEST(QuantizeFast, RandomInputsEqualIntegerPath) {
  const uint64_t n = kRandomPerCase * (exhaustive() ? kExhaustiveFactor : 1);
  SplitMix rng{0x5EED0F457ull};
  for (const ElemSpec& es : kElemSpecs) {
    for (Rounding mode : kFastModes) {
      Checker c{es, mode};
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t r = rng.next();
        const uint32_t bits = static_cast<uint32_t>(r);
        const int s = static_cast<int>((r >> 32) % 255u) - 127;
        if (((r >> 40) & 3u) != 0u) {
          // 3 of 4: |v| / 2^s in [2^(min_sub_exp - 3), 2^(emax + 2)), a float32 exponent field
          // clamped to the finite range; the low mantissa bits sometimes cleared (ties).
          const int span = c.es.emax() + 2 - (c.es.min_sub_exp() - 3);
          const int er = c.es.min_sub_exp() - 3 + static_cast<int>((r >> 42) % static_cast<uint64_t>(span));
          int field = er + s + 127;
          field = field < 0 ? 0 : (field > 254 ? 254 : field);
          uint32_t mant = bits & 0x7FFFFFu;
          const int clear = static_cast<int>((r >> 50) % 24u);  // zero the lowest `clear` bits
          if ((r >> 56) & 1u) mant &= ~((1u << clear) - 1u);
          c.check((bits & 0x80000000u) | (static_cast<uint32_t>(field) << 23) | mant, s);
        } else {
          c.check(bits, s);  // any magnitude (non-finite patterns are skipped)
        }
      }
      EXPECT_EQ(c.mismatches, 0u) << es.name << " " << name(mode) << ": " << c.mismatches << " of " << c.checked;
      EXPECT_GT(c.checked, n / 2);
    }
  }
}

// quantize_element (what the CPU reference and the kernels call) takes the float path for the
// deterministic modes and the integer path, with its random word, for stochastic rounding.
TEST(QuantizeFast, QuantizeElementDispatch) {
  const ElemSpec& es = elem_spec(Elem::fp8_e4m3);
  SplitMix rng{42};
  for (int i = 0; i < 10000; ++i) {
    const float v = bits_f32(static_cast<uint32_t>(rng.next() & 0x3FFFFFFFu));  // finite, positive
    const int s = static_cast<int>(rng.next() % 255u) - 127;
    const uint32_t rnd = static_cast<uint32_t>(rng.next());
    for (Rounding mode : kFastModes) {
      const ElemResult a = quantize_element(v, s, es, mode, rnd);
      const ElemResult b = quantize_element_fast(v, elem_scale(s), es, mode);
      ASSERT_EQ(f32_bits(a.value), f32_bits(b.value));
    }
    const ElemResult a = quantize_element(v, s, es, Rounding::stochastic, rnd);
    const ElemResult b = quantize_element_exact(v, s, es, Rounding::stochastic, rnd);
    ASSERT_EQ(f32_bits(a.value), f32_bits(b.value));
  }
}

// Cases where a careless float implementation rounds: worked by hand, fast path and integer path.
TEST(QuantizeFast, HandWorkedEdges) {
  struct Case {
    Elem elem;
    Rounding mode;
    float v;
    int s;
    float want;
    bool clamped, lastbin;
  };
  const float flt_max = bits_f32(0x7F7FFFFFu);
  const float inf = bits_f32(0x7F800000u);
  auto sub = [](uint32_t k) { return bits_f32(k); };  // k * 2^-149, a float32 subnormal
  const Case cases[] = {
      // E4M3: 464 lies above max_normal 448 (it is the tie between 448 and 480): clamped.
      {Elem::fp8_e4m3, Rounding::nearest_even, 464.0f, 0, 448.0f, true, true},
      {Elem::fp8_e4m3, Rounding::nearest_away, 464.0f, 0, 448.0f, true, true},
      {Elem::fp8_e4m3, Rounding::toward_zero, 479.0f, 0, 448.0f, true, true},
      {Elem::fp8_e4m3, Rounding::nearest_away, 447.0f, 0, 448.0f, false, true},
      // Ties: 5 * 2^-10 is halfway between the subnormal codes 2 and 3 (spacing 2^-9 at s = 0).
      {Elem::fp8_e4m3, Rounding::nearest_even, 5.0f / 1024.0f, 0, 4.0f / 1024.0f, false, false},
      {Elem::fp8_e4m3, Rounding::nearest_away, 5.0f / 1024.0f, 0, 6.0f / 1024.0f, false, false},
      {Elem::fp8_e4m3, Rounding::toward_zero, 7.0f / 1024.0f, 0, 6.0f / 1024.0f, false, false},
      // One float32 ulp either side of half the smallest E2M1 subnormal (0.25): 0 and 0.5, in
      // nearest-away (where floor(t + 0.5) would round 0.25 - 2^-26 up).
      {Elem::fp4_e2m1, Rounding::nearest_away, bits_f32(0x3E7FFFFFu), 0, 0.0f, false, false},
      {Elem::fp4_e2m1, Rounding::nearest_away, bits_f32(0x3E800001u), 0, 0.5f, false, false},
      {Elem::fp4_e2m1, Rounding::nearest_even, bits_f32(0x3E800000u), 0, 0.0f, false, false},
      // s = -127: 1/X = 2^127 and X = 2^-127 (a float32 subnormal). E5M2's subnormal grid is
      // 2^-16, so the outputs are multiples of 2^-143: float32 subnormals, exact.
      {Elem::fp8_e5m2, Rounding::nearest_even, sub(64), -127, sub(64), false, false},
      {Elem::fp8_e5m2, Rounding::nearest_even, sub(192), -127, sub(192), false, false},
      {Elem::fp8_e5m2, Rounding::nearest_even, sub(160), -127, sub(128), false, false},  // tie
      {Elem::fp8_e5m2, Rounding::nearest_away, sub(160), -127, sub(192), false, false},
      {Elem::fp8_e5m2, Rounding::nearest_away, sub(31), -127, 0.0f, false, false},
      // s = 127: 1/X = 2^-127; |v| / X rounds in float below 2^-126 but is 0 on every grid.
      {Elem::fp8_e5m2, Rounding::nearest_away, 1.0f, 127, 0.0f, false, false},
      // int8 at s = 127: FLT_MAX / X = 2 - 2^-23 > 127/64 clamps; 127/64 * 2^127 is finite.
      {Elem::int8, Rounding::nearest_even, flt_max, 127, 0x1.fcp127f, true, true},
      // |v| / X overflows float (FLT_MAX * 2^127): clamps to max_normal * X = 6 * 2^-127.
      {Elem::fp4_e2m1, Rounding::toward_zero, flt_max, -127, 0x1.8p-125f, true, true},
      // E5M2 with s = 113 (the ceil rule for amax = FLT_MAX): FLT_MAX / X = 32767.998 rounds
      // to 2^15, and 2^15 * 2^113 = 2^128 is Inf; toward zero gives 28672 * 2^113.
      {Elem::fp8_e5m2, Rounding::nearest_even, flt_max, 113, inf, false, false},
      {Elem::fp8_e5m2, Rounding::nearest_even, -flt_max, 113, -inf, false, false},
      {Elem::fp8_e5m2, Rounding::toward_zero, flt_max, 113, 0x1.cp127f, false, false},
      // Signed zero survives, also when a non-zero input rounds to zero.
      {Elem::fp6_e3m2, Rounding::nearest_even, -0.0f, 5, -0.0f, false, false},
      {Elem::fp6_e3m2, Rounding::toward_zero, -0.05f, 0, -0.0f, false, false},
  };
  for (const Case& c : cases) {
    const ElemSpec& es = elem_spec(c.elem);
    for (int path = 0; path < 2; ++path) {
      const ElemResult r = path == 0 ? quantize_element_fast(c.v, elem_scale(c.s), es, c.mode)
                                     : quantize_element_exact(c.v, c.s, es, c.mode, 0u);
      EXPECT_EQ(f32_bits(r.value), f32_bits(c.want))
          << (path == 0 ? "fast " : "exact ") << es.name << " " << name(c.mode) << " v=" << c.v << " s=" << c.s
          << ": got " << r.value << " want " << c.want;
      EXPECT_EQ(r.clamped, c.clamped) << es.name << " v=" << c.v << " s=" << c.s;
      EXPECT_EQ(r.lastbin, c.lastbin) << es.name << " v=" << c.v << " s=" << c.s;
    }
  }
}

}  // namespace
