// The float fast path of the element quantizer equals the integer path on EVERY float32 input,
// on the device: for each element format x deterministic rounding mode x a spread of scale
// exponents s, all 2^32 bit patterns except NaN/Inf (which never reach the element step: a
// block holding one becomes NaN) go through quantize_element_fast and quantize_element_exact
// (lab/mx/scalar.h, compiled by nvcc as the kernels compile it: element format constants
// folded in, rounding mode at run time), and value bits, clamped and lastbin must all agree.
// The CPU side of the same header is checked in tests/cpu/test_quantize_fast.cpp.
//
// Second part: the kernels against the CPU reference on shapes that take the vectorised paths
// (test_quantize_gpu.cu uses dims that blocks do not divide, mostly odd, which take the scalar
// fallbacks): column counts that are multiples of 4 for the strided tile kernel (block 32,
// partial last band, partial last group of 32 columns) and the 16-byte contiguous path, with
// and without whole blocks per row. Every MX format x scale rule x
// rounding x axis at block 32, and blocks 8..256; float32 and bf16 outputs, fused statistics
// and the bf16-inexact counter.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/mx_produce.cuh"
#include "kernels/quantize.cuh"
#include "lab/mx/format.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace mxlab;

// Both ends of the E8M0 range (1/X or X a float32 subnormal, results that are float32
// subnormals or Inf, float32-subnormal inputs that matter), steps inside them, ordinary scales.
constexpr int kScales[] = {-127, -126, -125, -120, -60, -9, 0, 1, 9, 60, 120, 126, 127};
constexpr Rounding kFastModes[] = {Rounding::nearest_even, Rounding::nearest_away, Rounding::toward_zero};
constexpr uint64_t kAllPatterns = uint64_t{1} << 32;
constexpr uint64_t kNonFinite = uint64_t{1} << 24;  // exponent field 255: 2 signs x 2^23 mantissas
constexpr int kMaxRecorded = 8;                    // mismatches kept for the report per launch
constexpr int kThreads = 256;

struct Mismatch {
  uint32_t bits, fast, exact;
  uint8_t fast_flags, exact_flags;  // clamped | lastbin << 1
};

struct Tally {
  unsigned long long checked, mismatches, nonzero, clamped, lastbin;
  Mismatch first[kMaxRecorded];
};

template <Elem E>
__global__ void __launch_bounds__(kThreads) fast_vs_exact_kernel(int s, Rounding mode, Tally* tally) {
  // The element format with every field a compile-time constant, as the kernels build it.
  const ElemSpec es = cuda::device_elem_spec<E>();
  const ElemScale sc = elem_scale(s);
  unsigned long long checked = 0, nonzero = 0, clamped = 0, lastbin = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < kAllPatterns; i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    if (!is_finite_bits(bits)) continue;
    const float v = bits_f32(bits);
    const ElemResult f = quantize_element_fast(v, sc, es, mode);
    const ElemResult x = quantize_element_exact(v, s, es, mode, 0u);
    ++checked;
    nonzero += (f32_bits(x.value) & 0x7FFFFFFFu) != 0u;
    clamped += x.clamped;
    lastbin += x.lastbin;
    if (f32_bits(f.value) != f32_bits(x.value) || f.clamped != x.clamped || f.lastbin != x.lastbin) {
      const unsigned long long slot = atomicAdd(&tally->mismatches, 1ull);
      if (slot < kMaxRecorded) {
        tally->first[slot] = Mismatch{bits, f32_bits(f.value), f32_bits(x.value),
                                      static_cast<uint8_t>(f.clamped | (f.lastbin << 1)),
                                      static_cast<uint8_t>(x.clamped | (x.lastbin << 1))};
      }
    }
  }
  // Warp sums first: five 64-bit atomics per warp, not per thread.
  for (int o = 16; o > 0; o >>= 1) {
    checked += __shfl_xor_sync(0xFFFFFFFFu, checked, o);
    nonzero += __shfl_xor_sync(0xFFFFFFFFu, nonzero, o);
    clamped += __shfl_xor_sync(0xFFFFFFFFu, clamped, o);
    lastbin += __shfl_xor_sync(0xFFFFFFFFu, lastbin, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&tally->checked, checked);
    atomicAdd(&tally->nonzero, nonzero);
    atomicAdd(&tally->clamped, clamped);
    atomicAdd(&tally->lastbin, lastbin);
  }
}

void launch(Elem e, unsigned grid, int s, Rounding mode, Tally* d_tally) {
  switch (e) {
    case Elem::fp8_e4m3: fast_vs_exact_kernel<Elem::fp8_e4m3><<<grid, kThreads>>>(s, mode, d_tally); break;
    case Elem::fp8_e5m2: fast_vs_exact_kernel<Elem::fp8_e5m2><<<grid, kThreads>>>(s, mode, d_tally); break;
    case Elem::fp6_e3m2: fast_vs_exact_kernel<Elem::fp6_e3m2><<<grid, kThreads>>>(s, mode, d_tally); break;
    case Elem::fp6_e2m3: fast_vs_exact_kernel<Elem::fp6_e2m3><<<grid, kThreads>>>(s, mode, d_tally); break;
    case Elem::fp4_e2m1: fast_vs_exact_kernel<Elem::fp4_e2m1><<<grid, kThreads>>>(s, mode, d_tally); break;
    case Elem::int8: fast_vs_exact_kernel<Elem::int8><<<grid, kThreads>>>(s, mode, d_tally); break;
    default: break;
  }
}

TEST(QuantizeFastGpu, EveryFloat32EqualsIntegerPath) {
  MXLAB_REQUIRE_GPU();
  int dev = 0, sms = 0;
  MXLAB_CUDA_OK(cudaGetDevice(&dev));
  MXLAB_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const unsigned grid = static_cast<unsigned>(sms) * 8u;
  Tally* d_tally = nullptr;
  MXLAB_CUDA_OK(cudaMalloc(&d_tally, sizeof(Tally)));
  const auto t0 = std::chrono::steady_clock::now();
  unsigned long long total = 0, total_bad = 0;
  for (int ei = 0; ei < static_cast<int>(Elem::kCount); ++ei) {
    const Elem e = static_cast<Elem>(ei);
    for (Rounding mode : kFastModes) {
      for (int s : kScales) {
        MXLAB_CUDA_OK(cudaMemset(d_tally, 0, sizeof(Tally)));
        launch(e, grid, s, mode, d_tally);
        MXLAB_CUDA_OK(cudaGetLastError());
        Tally t{};
        MXLAB_CUDA_OK(cudaMemcpy(&t, d_tally, sizeof(Tally), cudaMemcpyDeviceToHost));
        const char* where = kElemSpecs[ei].name;
        EXPECT_EQ(t.checked, kAllPatterns - kNonFinite) << where << " " << name(mode) << " s=" << s;
        EXPECT_EQ(t.mismatches, 0u) << where << " " << name(mode) << " s=" << s;
        for (unsigned long long k = 0; k < t.mismatches && k < kMaxRecorded; ++k) {
          const Mismatch& m = t.first[k];
          ADD_FAILURE() << where << " " << name(mode) << " s=" << s << " v=0x" << std::hex << m.bits << ": fast 0x"
                        << m.fast << " flags " << int(m.fast_flags) << ", exact 0x" << m.exact << " flags "
                        << int(m.exact_flags);
        }
        // Not a vacuous check: at ordinary scales many inputs quantize to non-zero values,
        // some clamp and some land in the last bin.
        if (s == 0) {
          EXPECT_GT(t.nonzero, 1000000ull) << where;
          EXPECT_GT(t.clamped, 1000000ull) << where;
          EXPECT_GT(t.lastbin, t.clamped) << where;
        }
        total += t.checked;
        total_bad += t.mismatches;
      }
    }
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[fast path] %llu element quantizations compared (%d formats x %zu modes x %zu scales x 2^32 - 2^24 "
              "inputs), %llu mismatches, %.1f s\n",
              total, static_cast<int>(Elem::kCount), std::size(kFastModes), std::size(kScales), total_bad, sec);
  cudaFree(d_tally);
}

// ---- kernels vs CPU reference on vectorisable shapes ------------------------------------------

using mxlab::cuda::kStatWords;
using mxlab::cuda::QuantLaunch;

constexpr uint32_t kSalt = 0x2468ACE1u;
constexpr int kPoisonByte = 0xFF;  // outputs are filled with it first: 0xFFFF / 0xFFFFFFFF are NaNs no kernel writes

// Inputs: 32 x 32 regions with a base exponent each (mostly moderate, some near the float32
// limits), full-mantissa values, few-bit mantissas (ties on every element grid), float32
// subnormals, zeros, and a few NaN / Inf.
std::vector<float> region_input(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int64_t rr = (rows + 31) / 32, cr = (cols + 31) / 32;
  std::vector<int> base(static_cast<size_t>(rr * cr));
  for (int& b : base) b = uni(0, 9) < 8 ? uni(-20, 20) : (uni(0, 1) ? uni(-140, -110) : uni(100, 127));
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int e = std::clamp(base[static_cast<size_t>((r / 32) * cr + c / 32)] - uni(0, 10), -126, 127);
      const uint32_t sign = (rng() & 1u) ? 0x80000000u : 0u;
      uint32_t mant = static_cast<uint32_t>(rng()) & 0x7FFFFFu;
      const int u = uni(0, 999);
      if (u < 300) mant &= 0x7F0000u;  // few bits: ties
      uint32_t bits = sign | (static_cast<uint32_t>(e + 127) << 23) | mant;
      if (u >= 950 && u < 980) bits = sign | (mant >> uni(0, 20));  // float32 subnormal or zero
      if (u >= 980 && u < 998) bits = sign;                          // zero
      if (u == 998 && uni(0, 20) == 0) bits = 0x7FC00000u;           // NaN (rare)
      if (u == 999 && uni(0, 20) == 0) bits = sign | 0x7F800000u;    // Inf (rare)
      x[static_cast<size_t>(r * cols + c)] = bits_f32(bits);
    }
  return x;
}

struct VecRef {
  std::vector<float> out;
  QuantStats stats;
  uint64_t inexact = 0;
};

VecRef vec_reference(const std::vector<float>& in, int64_t rows, int64_t cols, Axis axis, QuantSpec q) {
  VecRef ref;
  q.salt = kSalt;
  ref.out.resize(in.size());
  quantize_dequantize(in.data(), ref.out.data(), rows, cols, axis, q, &ref.stats);
  for (float v : ref.out) ref.inexact += is_finite_bits(f32_bits(v)) && !bf16_exact(v);
  return ref;
}

TEST(QuantizeFastGpu, KernelsOnVectorisableShapesEqualCpu) {
  MXLAB_REQUIRE_GPU();
  struct Shape {
    int64_t rows, cols;
  };
  // 1000 x 776: partial last band (1000 = 31 * 32 + 8: lanes with no rows), a partial last group
  // of 32 columns (776 = 24 * 32 + 8: lanes with no columns), rows of 24.25 blocks; 256 x 1024:
  // whole blocks and bands everywhere.
  const Shape shapes[] = {{1000, 776}, {256, 1024}};
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  int64_t bad_total = 0, cases_run = 0;
  for (const Shape& sh : shapes) {
    const size_t n = static_cast<size_t>(sh.rows * sh.cols);
    const std::vector<float> in = region_input(sh.rows, sh.cols, 0xC0FFEEull + static_cast<uint64_t>(sh.cols));
    float* d_in = nullptr;
    float* d_f32 = nullptr;
    __nv_bfloat16* d_bf16 = nullptr;
    unsigned long long* d_cnt = nullptr;
    MXLAB_CUDA_OK(cudaMalloc(&d_in, n * 4));
    MXLAB_CUDA_OK(cudaMalloc(&d_f32, n * 4));
    MXLAB_CUDA_OK(cudaMalloc(&d_bf16, n * 2));
    MXLAB_CUDA_OK(cudaMalloc(&d_cnt, (2 * kStatWords + 2) * sizeof(unsigned long long)));
    MXLAB_CUDA_OK(cudaMemcpy(d_in, in.data(), n * 4, cudaMemcpyHostToDevice));
    std::vector<std::pair<QuantSpec, Axis>> cases;
    for (int f = static_cast<int>(NumFmt::mxfp8_e4m3); f < static_cast<int>(NumFmt::kCount); ++f)
      for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
        for (int m = 0; m < static_cast<int>(Rounding::kCount); ++m)
          for (Axis axis : {Axis::contiguous, Axis::strided}) {
            QuantSpec q;
            q.fmt = static_cast<NumFmt>(f);
            q.rule = static_cast<ScaleRule>(r);
            q.rounding = static_cast<Rounding>(m);
            q.seed = 0xFEED0000ull + static_cast<uint64_t>(f * 64 + r * 8 + m);
            cases.push_back({q, axis});
          }
    // Other block sizes: 8..256 lanes-per-block layouts of the contiguous kernel (1 to 32 lanes
    // per block), and the shared-memory strided kernel (block != 32).
    for (int k : {8, 16, 64, 128, 256})
      for (Axis axis : {Axis::contiguous, Axis::strided})
        for (Rounding m : {Rounding::nearest_even, Rounding::stochastic}) {
          if (axis == Axis::strided && k > 64) continue;
          QuantSpec q;
          q.fmt = k == 16 ? NumFmt::mxint8 : NumFmt::mxfp8_e4m3;
          q.block = k;
          q.rounding = m;
          q.seed = 0xB10C0000ull + static_cast<uint64_t>(k);
          cases.push_back({q, axis});
        }
    for (size_t c0 = 0; c0 < cases.size(); c0 += workers) {
      const size_t c1 = std::min(cases.size(), c0 + workers);
      std::vector<std::future<VecRef>> refs;
      for (size_t i = c0; i < c1; ++i)
        refs.push_back(std::async(std::launch::async, vec_reference, std::cref(in), sh.rows, sh.cols,
                                  cases[i].second, cases[i].first));
      for (size_t i = c0; i < c1; ++i) {
        const VecRef ref = refs[i - c0].get();
        const QuantSpec& q = cases[i].first;
        const Axis axis = cases[i].second;
        const std::string what = std::string(name(q.fmt)) + " k=" + std::to_string(q.block) + " " + name(q.rule) +
                                 " " + name(q.rounding) +
                                 (axis == Axis::contiguous ? " contiguous " : " strided ") +
                                 std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
        MXLAB_CUDA_OK(cudaMemset(d_f32, kPoisonByte, n * 4));
        MXLAB_CUDA_OK(cudaMemset(d_bf16, kPoisonByte, n * 2));
        MXLAB_CUDA_OK(cudaMemset(d_cnt, 0, (2 * kStatWords + 2) * sizeof(unsigned long long)));
        QuantLaunch L;
        L.in = d_in;
        L.rows = sh.rows;
        L.cols = sh.cols;
        L.axis = axis;
        L.q = q;
        L.q.salt = kSalt;
        L.stats_q = L.q;  // fused statistics
        L.d_stats = d_cnt;
        L.d_inexact = d_cnt + 2 * kStatWords;
        mxlab::cuda::quantize_f32(L, d_f32, nullptr);
        L.d_stats = d_cnt + kStatWords;
        L.d_inexact = d_cnt + 2 * kStatWords + 1;
        mxlab::cuda::quantize_bf16(L, d_bf16, nullptr);
        MXLAB_CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint32_t> g32(n);
        std::vector<uint16_t> g16(n);
        unsigned long long cnt[2 * kStatWords + 2];
        MXLAB_CUDA_OK(cudaMemcpy(g32.data(), d_f32, n * 4, cudaMemcpyDeviceToHost));
        MXLAB_CUDA_OK(cudaMemcpy(g16.data(), d_bf16, n * 2, cudaMemcpyDeviceToHost));
        MXLAB_CUDA_OK(cudaMemcpy(cnt, d_cnt, sizeof cnt, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (size_t k = 0; k < n; ++k) {
          const uint32_t want = f32_bits(ref.out[k]);
          const uint16_t want16 = static_cast<uint16_t>(f32_bits(round_bf16(ref.out[k], Rounding::nearest_even)) >> 16);
          if (g32[k] != want || g16[k] != want16) {
            if (bad < 3)
              ADD_FAILURE() << what << " element " << k << " (input 0x" << std::hex << f32_bits(in[k]) << "): f32 0x"
                            << g32[k] << " want 0x" << want << ", bf16 0x" << g16[k] << " want 0x" << want16;
            ++bad;
          }
        }
        const uint64_t want_stats[kStatWords] = {ref.stats.n, ref.stats.lastbin, ref.stats.clamped,
                                                 ref.stats.nan_blocks, ref.stats.blocks};
        for (int out = 0; out < 2; ++out)
          for (int w = 0; w < kStatWords; ++w)
            if (cnt[out * kStatWords + w] != want_stats[w]) {
              ADD_FAILURE() << what << (out ? " bf16" : " f32") << " pass: statistics word " << w << " = "
                            << cnt[out * kStatWords + w] << ", want " << want_stats[w];
              ++bad;
            }
        EXPECT_EQ(cnt[2 * kStatWords], ref.inexact) << what;
        EXPECT_EQ(cnt[2 * kStatWords + 1], ref.inexact) << what;
        // The input must exercise what the test claims: NaN blocks and clamping occur, not everywhere.
        EXPECT_GT(ref.stats.nan_blocks, 0u) << what;
        EXPECT_LT(ref.stats.nan_blocks, ref.stats.blocks / 4) << what;
        bad_total += bad;
        ++cases_run;
      }
    }
    cudaFree(d_in);
    cudaFree(d_f32);
    cudaFree(d_bf16);
    cudaFree(d_cnt);
  }
  std::printf("[fast path] kernels vs CPU on vectorisable shapes: %lld cases, %lld mismatches\n",
              static_cast<long long>(cases_run), static_cast<long long>(bad_total));
  EXPECT_EQ(bad_total, 0);
}

}  // namespace
