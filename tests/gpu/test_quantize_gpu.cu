// GPU quantization == CPU reference, bit for bit (kernels/quantize.cuh vs lab/mx/quantize.h):
// every MX format x scale rule (incl. both bump modes) x rounding (incl. stochastic with a
// device step) x axis, both outputs (float32 and bf16) and the statistics counters, on odd
// tensor shapes whose dims the blocks do not divide, with inputs that span every float32
// magnitude (subnormals, near FLT_MAX), ties, powers of two, all-zero blocks and NaN/Inf blocks.
// Outputs are poisoned with a NaN pattern the kernels never write before every run, so an
// unwritten element fails. Comparison: the bits must be equal, except that NaN matches NaN.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/quantize.cuh"
#include "lab/core/error.h"
#include "lab/mx/format.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace mxlab;
using mxlab::cuda::kStatWords;
using mxlab::cuda::QuantLaunch;

constexpr uint32_t kPoison32 = 0xFFFFFFFFu;  // a NaN no kernel writes (they write 0x7FC00000 / input NaNs)
constexpr uint16_t kPoison16 = 0xFFFFu;
constexpr uint32_t kStep = 0x01234567u;      // the device step: the stochastic salt
constexpr uint32_t kHostSalt = 99u;          // q.salt: must be ignored when a device step is given
constexpr int kMaxReport = 5;                // mismatches printed per case

// RAII device buffer.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

bool isnan_bits(uint32_t b) { return (b & 0x7F800000u) == 0x7F800000u && (b & 0x7FFFFFu) != 0u; }

// Inputs spanning all magnitudes. Magnitude regions of 40 x 24 elements (not aligned with the
// blocks, so blocks mix regions) have a base exponent anywhere from the subnormal range to
// FLT_MAX; elements are full-mantissa values, few-bit mantissas (ties for every element
// format), powers of two, bf16 ties, float32 subnormals, random finite bit patterns, +-0 and
// rare NaN/+-Inf. Some bands of rows and columns are all zero (all-zero blocks on both axes).
std::vector<float> make_input(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int64_t rreg = (rows + 39) / 40, creg = (cols + 23) / 24;
  std::vector<int> base(static_cast<size_t>(rreg * creg));
  for (int& b : base) {
    const int kind = uni(0, 9);
    b = kind < 7 ? uni(-20, 20) : kind == 7 ? uni(-150, -110) : kind == 8 ? uni(100, 127) : uni(-150, 127);
  }
  auto pow2f = [](int e, uint32_t frac, bool neg) {
    // (1 + frac/2^23) * 2^e, e clamped to the float range; below 2^-126 via an exact-or-rounded ldexp.
    e = std::min(e, 127);
    const uint32_t sign = neg ? 0x80000000u : 0u;
    if (e >= -126) return bits_f32(sign | (static_cast<uint32_t>(e + 127) << 23) | (frac & 0x7FFFFFu));
    const float one = bits_f32(sign | 0x3F800000u | (frac & 0x7FFFFFu));
    return std::ldexp(one, e);
  };
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int b = base[static_cast<size_t>((r / 40) * creg + c / 24)];
      const bool neg = (rng() & 1u) != 0;
      const uint32_t mant = static_cast<uint32_t>(rng()) & 0x7FFFFFu;
      const int u = uni(0, 9999);
      float v;
      if (u < 5200) v = pow2f(b - uni(0, 12), mant, neg);                            // full mantissa
      else if (u < 6400) v = pow2f(b - uni(0, 6), static_cast<uint32_t>(uni(0, 7)) << 20, neg);  // 3-bit: ties
      else if (u < 7200) v = pow2f(b - uni(0, 8), 0u, neg);                         // powers of two
      else if (u < 7600) v = bits_f32((f32_bits(pow2f(b, mant, neg)) & 0xFFFF0000u) | 0x8000u);  // bf16 tie
      else if (u < 8100) v = neg ? -0.0f : 0.0f;
      else if (u < 8600) v = bits_f32((neg ? 0x80000000u : 0u) | (mant | 1u));      // float32 subnormal
      else if (u < 9000) v = bits_f32((neg ? 0x80000000u : 0u) | (static_cast<uint32_t>(uni(0, 254)) << 23) | mant);
      else if (u < 9995) v = pow2f(b, mant, neg);
      else if (u < 9997) v = bits_f32(0x7FC00000u);  // NaN
      else v = neg ? -INFINITY : INFINITY;
      x[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  for (int64_t r = 64; r < std::min<int64_t>(rows, 128); ++r)
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(r * cols + c)] = 0.0f;
  const int64_t c0 = cols > 160 ? 96 : 32, c1 = cols > 160 ? 160 : 64;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < std::min(cols, c1); ++c) x[static_cast<size_t>(r * cols + c)] = 0.0f;
  return x;
}

struct Case {
  QuantSpec q;
  bool round_first = false;
  Rounding bf16_mode = Rounding::nearest_even;
  bool device_step = true;  // salt from the device step (else q.salt)
};

std::string describe(const Case& c, Axis axis, int64_t rows, int64_t cols) {
  std::string s = std::string(name(c.q.fmt)) + " k=" + std::to_string(c.q.block) + " " + name(c.q.rule);
  if (c.q.rule == ScaleRule::floor_bump) s += std::string("/") + name(c.q.bump);
  s += std::string(" ") + name(c.q.rounding) + (axis == Axis::contiguous ? " contiguous " : " strided ") +
       std::to_string(rows) + "x" + std::to_string(cols);
  if (c.round_first) s += std::string(" bf16-first(") + name(c.bf16_mode) + ")";
  if (!c.device_step) s += " host-salt";
  return s;
}

// What the CPU reference produces for one case.
struct Reference {
  std::vector<float> out;
  QuantStats stats;
  uint64_t inexact = 0;  // finite outputs that are not bf16-exact
};

Reference cpu_reference(const std::vector<float>& in, int64_t rows, int64_t cols, Axis axis, const Case& c) {
  Reference ref;
  std::vector<float> src = in;
  if (c.round_first)
    for (float& v : src) v = round_bf16(v, c.bf16_mode);
  QuantSpec q = c.q;
  q.salt = kStep;  // the effective salt of every GPU run (device step, or the host salt set to it)
  ref.out.resize(in.size());
  quantize_dequantize(src.data(), ref.out.data(), rows, cols, axis, q, &ref.stats);
  for (float v : ref.out)
    if (std::isfinite(v) && !bf16_exact(v)) ++ref.inexact;
  return ref;
}

// Compares one case's GPU results with the reference; returns the number of mismatches.
struct GpuRun {
  std::vector<uint32_t> f32;
  std::vector<uint16_t> bf16;
  unsigned long long stats[3][kStatWords];  // from quantize_f32, quantize_bf16, quant_stats
  unsigned long long inexact[2];            // from quantize_f32, quantize_bf16
};

int64_t compare(const Reference& ref, const GpuRun& g, const std::string& what) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    const uint32_t want = f32_bits(ref.out[i]);
    const uint32_t got = g.f32[i];
    const bool ok = got == want || (isnan_bits(want) && isnan_bits(got) && got != kPoison32);
    if (!ok && bad++ < kMaxReport)
      ADD_FAILURE() << what << ": f32 output [" << i << "] gpu 0x" << std::hex << got << " cpu 0x" << want
                    << std::dec << " (" << bits_f32(got) << " vs " << ref.out[i] << ")";
  }
  for (size_t i = 0; i < ref.out.size(); ++i) {
    const uint32_t want32 = f32_bits(round_bf16(ref.out[i], Rounding::nearest_even));
    const uint16_t want = static_cast<uint16_t>(want32 >> 16);
    const uint16_t got = g.bf16[i];
    const bool ok = got == want || (isnan_bits(want32) && isnan_bits(static_cast<uint32_t>(got) << 16) && got != kPoison16);
    if (!ok && bad++ < kMaxReport)
      ADD_FAILURE() << what << ": bf16 output [" << i << "] gpu 0x" << std::hex << got << " want 0x" << want
                    << std::dec << " (cpu value " << ref.out[i] << ")";
  }
  const uint64_t want_stats[kStatWords] = {ref.stats.n, ref.stats.lastbin, ref.stats.clamped, ref.stats.nan_blocks,
                                           ref.stats.blocks};
  const char* names[kStatWords] = {"n", "lastbin", "clamped", "nan_blocks", "blocks"};
  const char* runs[3] = {"quantize_f32", "quantize_bf16", "quant_stats"};
  for (int r = 0; r < 3; ++r)
    for (int w = 0; w < kStatWords; ++w)
      if (g.stats[r][w] != want_stats[w]) {
        ++bad;
        ADD_FAILURE() << what << ": " << runs[r] << " stats." << names[w] << " gpu " << g.stats[r][w] << " cpu "
                      << want_stats[w];
      }
  for (int r = 0; r < 2; ++r)
    if (g.inexact[r] != ref.inexact) {
      ++bad;
      ADD_FAILURE() << what << ": " << runs[r] << " bf16-inexact count gpu " << g.inexact[r] << " cpu " << ref.inexact;
    }
  return bad;
}

// Runs one case on the GPU: quantize_f32, quantize_bf16 and quant_stats, each with its own
// statistics counters, outputs poisoned first.
void gpu_run(const float* d_in, int64_t rows, int64_t cols, Axis axis, const Case& c, const uint32_t* d_step,
             DevBuf<float>& d_f32, DevBuf<__nv_bfloat16>& d_bf16, DevBuf<unsigned long long>& d_counters,
             GpuRun& g) {
  const size_t n = static_cast<size_t>(rows * cols);
  ASSERT_EQ(cudaMemset(d_f32.p, 0xFF, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_bf16.p, 0xFF, n * sizeof(__nv_bfloat16)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_counters.p, 0, d_counters.n * sizeof(unsigned long long)), cudaSuccess);
  QuantLaunch L;
  L.in = d_in;
  L.rows = rows;
  L.cols = cols;
  L.axis = axis;
  L.q = c.q;
  L.q.salt = kHostSalt;
  if (!c.device_step) L.q.salt = kStep;  // same stream as the reference, through the host salt
  L.round_bf16_first = c.round_first;
  L.bf16_mode = c.bf16_mode;
  L.d_step = c.device_step ? d_step : nullptr;
  L.stats_q = L.q;
  unsigned long long* cnt = d_counters.p;
  L.d_stats = cnt;
  L.d_inexact = cnt + 3 * kStatWords;
  mxlab::cuda::quantize_f32(L, d_f32.p, nullptr);
  L.d_stats = cnt + kStatWords;
  L.d_inexact = cnt + 3 * kStatWords + 1;
  mxlab::cuda::quantize_bf16(L, d_bf16.p, nullptr);
  L.d_stats = cnt + 2 * kStatWords;
  L.d_inexact = nullptr;
  mxlab::cuda::quant_stats(L, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g.f32.resize(n);
  g.bf16.resize(n);
  ASSERT_EQ(cudaMemcpy(g.f32.data(), d_f32.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(g.bf16.data(), d_bf16.p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  unsigned long long host[3 * kStatWords + 2];
  ASSERT_EQ(cudaMemcpy(host, cnt, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int r = 0; r < 3; ++r)
    for (int w = 0; w < kStatWords; ++w) g.stats[r][w] = host[r * kStatWords + w];
  g.inexact[0] = host[3 * kStatWords];
  g.inexact[1] = host[3 * kStatWords + 1];
}

// The shapes: blocks of 32 (and the other sizes tested) divide neither dim.
struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{1031, 777}, {4099, 67}};

using InputFn = std::vector<float> (*)(int64_t rows, int64_t cols, uint64_t seed);

// Runs every case on every shape, for one axis. CPU references are computed in parallel.
// `typical`: make_input's inputs, whose NaN blocks are few but present (checked).
void run_cases(const std::vector<Case>& cases, Axis axis, uint64_t seed, InputFn input = make_input,
               bool typical = true) {
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  int64_t total_bad = 0, checked = 0;
  for (const Shape& sh : kShapes) {
    const std::vector<float> in = input(sh.rows, sh.cols, seed ^ static_cast<uint64_t>(sh.rows * 7919 + sh.cols));
    const size_t n = in.size();
    DevBuf<float> d_in(n), d_f32(n);
    DevBuf<__nv_bfloat16> d_bf16(n);
    DevBuf<unsigned long long> d_counters(3 * kStatWords + 2);
    DevBuf<uint32_t> d_step(1);
    ASSERT_TRUE(d_in.p && d_f32.p && d_bf16.p && d_counters.p && d_step.p);
    ASSERT_EQ(cudaMemcpy(d_in.p, in.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_step.p, &kStep, 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (size_t c0 = 0; c0 < cases.size(); c0 += workers) {
      const size_t c1 = std::min(cases.size(), c0 + workers);
      std::vector<std::future<Reference>> refs;
      for (size_t i = c0; i < c1; ++i)
        refs.push_back(std::async(std::launch::async, cpu_reference, std::cref(in), sh.rows, sh.cols, axis,
                                  std::cref(cases[i])));
      for (size_t i = c0; i < c1; ++i) {
        const Reference ref = refs[i - c0].get();
        GpuRun g;
        gpu_run(d_in.p, sh.rows, sh.cols, axis, cases[i], d_step.p, d_f32, d_bf16, d_counters, g);
        if (::testing::Test::HasFatalFailure()) return;
        total_bad += compare(ref, g, describe(cases[i], axis, sh.rows, sh.cols));
        ++checked;
        // The inputs must exercise what the test claims: NaN blocks and clamping do occur.
        if (typical && is_mx(cases[i].q.fmt)) {
          EXPECT_GT(ref.stats.nan_blocks, 0u) << describe(cases[i], axis, sh.rows, sh.cols);
          EXPECT_LT(ref.stats.nan_blocks, ref.stats.blocks / 4) << describe(cases[i], axis, sh.rows, sh.cols);
        }
      }
    }
  }
  std::printf("[quantize] %lld cases x shapes checked, %lld mismatches\n", static_cast<long long>(checked),
              static_cast<long long>(total_bad));
  EXPECT_EQ(total_bad, 0);
}

const NumFmt kMxFormats[] = {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2,
                             NumFmt::mxfp6_e2m3, NumFmt::mxfp4_e2m1, NumFmt::mxint8};
const Rounding kRoundings[] = {Rounding::nearest_even, Rounding::nearest_away, Rounding::toward_zero,
                               Rounding::stochastic, Rounding::noise};

// Every MX format x scale rule (floor_bump with both bump modes) x rounding, block 32.
std::vector<Case> mx_cases() {
  std::vector<Case> cases;
  for (NumFmt f : kMxFormats)
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (int bump = 0; bump < (static_cast<ScaleRule>(r) == ScaleRule::floor_bump ? 2 : 1); ++bump)
        for (Rounding rnd : kRoundings) {
          Case c;
          c.q.fmt = f;
          c.q.block = 32;
          c.q.rule = static_cast<ScaleRule>(r);
          c.q.bump = static_cast<Bump>(bump);
          c.q.rounding = rnd;
          c.q.seed = 0x5EED0000ull + static_cast<uint64_t>(f) * 131 + static_cast<uint64_t>(r);
          cases.push_back(c);
        }
  return cases;
}

// bf16-first rounding, other block sizes (the generic and narrower/wider lane paths), host salt.
std::vector<Case> extra_cases() {
  std::vector<Case> cases;
  for (NumFmt f : kMxFormats)
    for (Rounding m : {Rounding::nearest_even, Rounding::nearest_away}) {
      Case c;
      c.q.fmt = f;
      c.q.rounding = f == NumFmt::mxfp4_e2m1 ? Rounding::stochastic : Rounding::nearest_even;
      c.q.seed = 42;
      c.round_first = true;
      c.bf16_mode = m;
      cases.push_back(c);
    }
  for (int k : {4, 8, 16, 64, 128, 7, 24, 96}) {
    Case c;
    c.q.fmt = k % 2 ? NumFmt::mxfp4_e2m1 : NumFmt::mxfp8_e4m3;
    c.q.block = k;
    c.q.rule = k == 16 ? ScaleRule::floor_bump : ScaleRule::floor;
    c.q.rounding = k == 24 ? Rounding::stochastic : Rounding::nearest_even;
    c.q.seed = 7;
    cases.push_back(c);
  }
  Case host;
  host.q.fmt = NumFmt::mxfp6_e2m3;
  host.q.rounding = Rounding::stochastic;
  host.q.seed = 0xABCDEF;
  host.device_step = false;
  cases.push_back(host);
  return cases;
}

// fp32 / bf16 / fp16 roles, with and without bf16-first rounding.
std::vector<Case> scalar_cases() {
  std::vector<Case> cases;
  for (NumFmt f : {NumFmt::fp32, NumFmt::bf16, NumFmt::fp16})
    for (Rounding m : {Rounding::nearest_even, Rounding::nearest_away})
      for (bool first : {false, true}) {
        Case c;
        c.q.fmt = f;
        c.q.rounding = m;
        c.round_first = first;
        c.bf16_mode = m == Rounding::nearest_even ? Rounding::nearest_away : Rounding::nearest_even;
        cases.push_back(c);
      }
  return cases;
}

TEST(QuantizeGpu, MxContiguousEqualsCpu) {
  MXLAB_REQUIRE_GPU();
  run_cases(mx_cases(), Axis::contiguous, 101);
}

TEST(QuantizeGpu, MxStridedEqualsCpu) {
  MXLAB_REQUIRE_GPU();
  run_cases(mx_cases(), Axis::strided, 202);
}

TEST(QuantizeGpu, BlockSizesBf16FirstHostSaltEqualCpu) {
  MXLAB_REQUIRE_GPU();
  run_cases(extra_cases(), Axis::contiguous, 303);
  run_cases(extra_cases(), Axis::strided, 404);
}

TEST(QuantizeGpu, ScalarFormatsEqualCpu) {
  MXLAB_REQUIRE_GPU();
  run_cases(scalar_cases(), Axis::contiguous, 505);
}

// Blocks at the top of the float32 range (lab/mx/scalar.h, block_scale_exp): magnitudes in
// [2^118, FLT_MAX], one element in 40 taken from the last rounding steps below 2^128 of every
// element width (and FLT_MAX itself), so that under the rules that round the scale up many
// blocks get the NaN scale (int8's exponent 128, `even`'s rounded amax 2^128) and many elements
// of blocks with a valid scale dequantize to 2^128, +-Inf, on both sides.
std::vector<float> make_top_input(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> top;
  for (int m = 0; m <= 7; ++m)
    for (double frac : {0.25, 0.5, 0.75, 1.0}) {
      const double t = (std::ldexp(1.0, m + 1) - frac) * std::ldexp(1.0, 127 - m);
      if (t > 3.4028234663852886e38) continue;
      float c = static_cast<float>(t);
      for (int j = 0; j < 2; ++j) c = std::nextafter(c, 0.0f);
      for (int j = 0; j < 5 && std::isfinite(c); ++j, c = std::nextafter(c, INFINITY)) top.push_back(c);
    }
  top.push_back(bits_f32(0x7F7FFFFFu));
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) {
    const uint32_t sign = (rng() & 1u) ? 0x80000000u : 0u;
    if (rng() % 40 == 0) {
      v = bits_f32(f32_bits(top[rng() % top.size()]) | sign);
    } else {
      const uint32_t field = 245u + static_cast<uint32_t>(rng() % 10);  // 2^118 .. 2^127
      v = bits_f32(sign | (field << 23) | (static_cast<uint32_t>(rng()) & 0x7FFFFFu));
    }
  }
  return x;
}

TEST(QuantizeGpu, TopOfFloat32RangeBlocksEqualCpu) {
  MXLAB_REQUIRE_GPU();
  run_cases(mx_cases(), Axis::contiguous, 808, make_top_input, false);
  run_cases(mx_cases(), Axis::strided, 909, make_top_input, false);
  std::vector<Case> sizes;  // the generic kernel (odd block sizes) too
  for (int k : {7, 24}) {
    Case c;
    c.q.fmt = NumFmt::mxfp8_e4m3;
    c.q.block = k;
    c.q.rule = ScaleRule::even;
    c.q.rounding = k == 7 ? Rounding::stochastic : Rounding::nearest_even;
    sizes.push_back(c);
  }
  run_cases(sizes, Axis::contiguous, 1010, make_top_input, false);
  run_cases(sizes, Axis::strided, 1111, make_top_input, false);
  // The input does reach the NaN scale and +-Inf elements beside finite ones (checked on the CPU
  // reference): E4M3 `even` has NaN blocks; E5M2 `rceil` and `ceil`, E2M1 `floor_bump` have no NaN
  // block but +-Inf elements.
  const std::vector<float> in = make_top_input(64, 64, 1);
  QuantSpec q;
  q.fmt = NumFmt::mxfp8_e4m3;
  q.rule = ScaleRule::even;
  EXPECT_GT(mx_stats(in.data(), 64, 64, Axis::contiguous, q).nan_blocks, 0u);
  for (const auto& fr : {std::make_pair(NumFmt::mxfp8_e5m2, ScaleRule::rceil),
                         std::make_pair(NumFmt::mxfp8_e5m2, ScaleRule::ceil),
                         std::make_pair(NumFmt::mxfp4_e2m1, ScaleRule::floor_bump)}) {
    q.fmt = fr.first;
    q.rule = fr.second;
    std::vector<float> out(in.size());
    QuantStats st;
    quantize_dequantize(in.data(), out.data(), 64, 64, Axis::contiguous, q, &st);
    EXPECT_EQ(st.nan_blocks, 0u) << name(q.fmt) << " " << name(q.rule);
    EXPECT_GT(std::count_if(out.begin(), out.end(), [](float v) { return std::isinf(v); }), 0)
        << name(q.fmt) << " " << name(q.rule);
  }
}

// In place (out == in) with a separate statistics spec (diagnostic stats under another MX
// format): the statistics pass must read the input before it is overwritten.
TEST(QuantizeGpu, InPlaceWithDiagnosticStats) {
  MXLAB_REQUIRE_GPU();
  const int64_t rows = 517, cols = 333;
  for (Axis axis : {Axis::contiguous, Axis::strided}) {
    const std::vector<float> in = make_input(rows, cols, 606 + static_cast<int>(axis));
    const size_t n = in.size();
    QuantSpec q;
    q.fmt = NumFmt::mxfp4_e2m1;
    q.rule = ScaleRule::rceil;
    QuantSpec sq;
    sq.fmt = NumFmt::mxfp8_e4m3;
    std::vector<float> want(n);
    quantize_dequantize(in.data(), want.data(), rows, cols, axis, q);
    const QuantStats st = mx_stats(in.data(), rows, cols, axis, sq);
    DevBuf<float> d(n);
    DevBuf<unsigned long long> d_stats(kStatWords);
    ASSERT_TRUE(d.p && d_stats.p);
    ASSERT_EQ(cudaMemcpy(d.p, in.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_stats.p, 0, kStatWords * 8), cudaSuccess);
    QuantLaunch L;
    L.in = d.p;
    L.rows = rows;
    L.cols = cols;
    L.axis = axis;
    L.q = q;
    L.d_stats = d_stats.p;
    L.stats_q = sq;
    mxlab::cuda::quantize_f32(L, d.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint32_t> got(n);
    unsigned long long gs[kStatWords];
    ASSERT_EQ(cudaMemcpy(got.data(), d.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gs, d_stats.p, sizeof gs, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t w = f32_bits(want[i]);
      if (!(got[i] == w || (isnan_bits(w) && isnan_bits(got[i]))) && bad++ < kMaxReport)
        ADD_FAILURE() << "in-place [" << i << "] gpu 0x" << std::hex << got[i] << " cpu 0x" << w;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(gs[0], st.n);
    EXPECT_EQ(gs[1], st.lastbin);
    EXPECT_EQ(gs[2], st.clamped);
    EXPECT_EQ(gs[3], st.nan_blocks);
    EXPECT_EQ(gs[4], st.blocks);
    EXPECT_GT(st.lastbin, 0u);  // the diagnostic statistics are non-trivial
  }
}

// The bf16 output is exact except in the documented tiny-scale corner (kernels/quantize.cuh):
// a block of fp8_e4m3 values near 2^-120 has elements on a 2^-133-or-finer grid.
TEST(QuantizeGpu, Bf16InexactCornerIsCounted) {
  MXLAB_REQUIRE_GPU();
  const int64_t rows = 4, cols = 64;
  std::vector<float> in(static_cast<size_t>(rows * cols));
  std::mt19937 rng(707);
  // Exponents -120..-135: block amax in [2^-120, 2^-119) gives scale 2^-127 (clamped) and an
  // element grid of 2^-136 below 2^-130, finer than bf16's 2^-133.
  for (float& v : in)
    v = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, -120 - static_cast<int>(rng() % 16));
  QuantSpec q;
  q.fmt = NumFmt::mxfp8_e4m3;
  std::vector<float> want(in.size());
  quantize_dequantize(in.data(), want.data(), rows, cols, Axis::contiguous, q);
  uint64_t inexact = 0;
  for (float v : want) inexact += bf16_exact(v) ? 0 : 1;
  ASSERT_GT(inexact, 0u) << "the corner case must produce bf16-inexact values";
  DevBuf<float> d_in(in.size());
  DevBuf<__nv_bfloat16> d_out(in.size());
  DevBuf<unsigned long long> d_cnt(1);
  ASSERT_EQ(cudaMemcpy(d_in.p, in.data(), in.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_cnt.p, 0, 8), cudaSuccess);
  QuantLaunch L;
  L.in = d_in.p;
  L.rows = rows;
  L.cols = cols;
  L.q = q;
  L.d_inexact = d_cnt.p;
  mxlab::cuda::quantize_bf16(L, d_out.p, nullptr);
  unsigned long long got = 0;
  ASSERT_EQ(cudaMemcpy(&got, d_cnt.p, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, inexact);
  // Every bf16 output is within 2^-134 of the exact dequantized value.
  std::vector<uint16_t> out(in.size());
  ASSERT_EQ(cudaMemcpy(out.data(), d_out.p, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < out.size(); ++i) {
    const double g = bits_f32(static_cast<uint32_t>(out[i]) << 16);
    EXPECT_LE(std::fabs(g - static_cast<double>(want[i])), std::ldexp(1.0, -134)) << i;
  }
}

// quantize_bf16_batch (a step's weights quantized together) against quantize_bf16
// one by one: the same bf16 bits for every tensor of a mixed list (both tuned kernels, several
// shapes, formats and roundings, tensors that do not fill a whole band or block row), with the
// ones that cannot share a launch (stochastic rounding, statistics, other block sizes, non-MX
// formats, strided rows that are not 16-byte multiples) taking their own; and fewer launches
// than tensors where they can share.
TEST(QuantizeGpu, BatchEqualsOneByOne) {
  MXLAB_REQUIRE_GPU();
  struct Spec {
    int64_t rows, cols;
    Axis axis;
    NumFmt fmt;
    Rounding rounding;
    int block;
    bool first;
    bool stats;
  };
  const Spec specs[] = {
      {256, 512, Axis::contiguous, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
      {512, 256, Axis::contiguous, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
      {70, 192, Axis::contiguous, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
      {256, 512, Axis::strided, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
      {512, 256, Axis::strided, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
      {70, 48, Axis::strided, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
      {256, 512, Axis::strided, NumFmt::mxfp8_e4m3, Rounding::nearest_even, 32, false, false},
      {96, 64, Axis::contiguous, NumFmt::mxfp4_e2m1, Rounding::nearest_even, 32, false, false},
      {96, 64, Axis::strided, NumFmt::mxfp6_e3m2, Rounding::toward_zero, 32, true, false},
      {64, 512, Axis::contiguous, NumFmt::mxfp8_e4m3, Rounding::stochastic, 32, true, false},
      {64, 512, Axis::contiguous, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, true},
      {64, 512, Axis::strided, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 16, true, false},
      {64, 512, Axis::contiguous, NumFmt::bf16, Rounding::nearest_even, 32, false, false},
      {64, 30, Axis::strided, NumFmt::mxfp8_e4m3, Rounding::nearest_away, 32, true, false},
  };
  constexpr int n = sizeof(specs) / sizeof(specs[0]);
  std::vector<std::unique_ptr<DevBuf<float>>> in;
  std::vector<std::unique_ptr<DevBuf<__nv_bfloat16>>> one, batch;
  DevBuf<unsigned long long> stats(2 * kStatWords);
  ASSERT_EQ(cudaMemset(stats.p, 0, stats.n * sizeof(unsigned long long)), cudaSuccess);
  std::vector<QuantLaunch> L(n);
  std::vector<__nv_bfloat16*> out(n);
  int shareable = 0;
  for (int i = 0; i < n; ++i) {
    const Spec& sp = specs[i];
    const size_t count = static_cast<size_t>(sp.rows * sp.cols);
    const auto host = make_input(sp.rows, sp.cols, 900 + i);
    in.push_back(std::make_unique<DevBuf<float>>(count));
    one.push_back(std::make_unique<DevBuf<__nv_bfloat16>>(count));
    batch.push_back(std::make_unique<DevBuf<__nv_bfloat16>>(count));
    ASSERT_EQ(cudaMemcpy(in.back()->p, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(one.back()->p, 0xFF, count * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(batch.back()->p, 0xEE, count * 2), cudaSuccess);
    QuantLaunch& l = L[i];
    l.in = in.back()->p;
    l.rows = sp.rows;
    l.cols = sp.cols;
    l.axis = sp.axis;
    l.q.fmt = sp.fmt;
    l.q.block = sp.block;
    l.q.rounding = sp.rounding;
    l.q.seed = 77 + i;
    l.q.salt = 3;
    l.round_bf16_first = sp.first;
    l.bf16_mode = Rounding::nearest_away;
    if (sp.stats) {
      l.d_stats = stats.p;
      l.stats_q = l.q;
    }
    out[i] = batch.back()->p;
    shareable += is_mx(sp.fmt) && fast_rounding(sp.rounding) && !sp.stats && sp.block == 32 &&
                 (sp.axis == Axis::contiguous || sp.cols % 4 == 0);
  }
  for (int i = 0; i < n; ++i) mxlab::cuda::quantize_bf16(L[i], one[i]->p, nullptr);
  for (int i = 0; i < n; ++i)
    if (L[i].d_stats) L[i].d_stats = stats.p + kStatWords;  // the batch's statistics go elsewhere
  const int launches = mxlab::cuda::quantize_bf16_batch(L.data(), out.data(), n, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The 9 shareable tensors form 5 groups (one per kernel instance: e4m3 away contiguous x3, tile
  // x3; e4m3 even tile; e2m1 contiguous; e3m2 tile), the other 5 take a launch each.
  EXPECT_EQ(shareable, 9);
  EXPECT_EQ(launches, 10);
  for (int i = 0; i < n; ++i) {
    const size_t count = static_cast<size_t>(specs[i].rows * specs[i].cols);
    std::vector<uint16_t> a(count), b(count);
    ASSERT_EQ(cudaMemcpy(a.data(), one[i]->p, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(b.data(), batch[i]->p, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(a, b) << "tensor " << i << " (" << specs[i].rows << " x " << specs[i].cols << ")";
  }
  // Statistics counted by the batch's own launch equal the single one's.
  std::vector<unsigned long long> st(2 * kStatWords);
  ASSERT_EQ(cudaMemcpy(st.data(), stats.p, st.size() * 8, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int w = 0; w < kStatWords; ++w) EXPECT_EQ(st[w], st[kStatWords + w]) << "statistics word " << w;
  std::printf("[quantize batch] %d tensors (%d shareable) in %d launches, bit for bit\n", n, shareable, launches);
}

TEST(QuantizeGpu, RejectsBadArguments) {
  MXLAB_REQUIRE_GPU();
  DevBuf<float> d(64);
  QuantLaunch L;
  L.in = d.p;
  L.rows = 2;
  L.cols = 32;
  L.q.fmt = NumFmt::mxfp8_e4m3;
  L.q.block = 0;  // configuration admits only positive sizes: an internal check catches the rest
  EXPECT_THROW(mxlab::cuda::quantize_f32(L, d.p, nullptr), std::logic_error);
  L.q.block = 32;
  L.rows = -1;
  EXPECT_THROW(mxlab::cuda::quantize_f32(L, d.p, nullptr), mxlab::Error);
}

}  // namespace
