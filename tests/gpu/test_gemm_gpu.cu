// GemmRunner (kernels/gemm.cuh) against the CPU: every layout (k_contiguous for A and B), the
// operand roles (FP32, MX, bf16, fp16, mixed, bf16-first), beta 0 and 1, FP32 and bf16 output.
// The reference quantizes each operand with the CPU quantize_dequantize (same stored layout,
// axis, stochastic seed and salt as the GPU) and multiplies in double.
//
// Tolerance (derived, per element): the GPU multiplies exactly the dequantized operands a_k,
// b_k (quantization itself is tested bit for bit in test_quantize_gpu.cu), so the only error
// is FP32 arithmetic. With n = K + 2 rounding steps per output (K - 1 additions in whatever
// order or tree cuBLAS uses, the product rounding when a product is not exact in FP32 (FP32
// x MX), and the beta*C addition), the classical bound (Higham, Accuracy and Stability,
// eq. 3.5) is |C - C_ref| <= gamma_n * (sum_k |a_k b_k| + |beta C0|), gamma_n = n u / (1 - n u).
// u = 2^-24 for SGEMM (IEEE round to nearest). For the bf16 tensor-core path the products are
// exact, but the tensor cores align addends and truncate instead of rounding, so we take
// u = 2^-23 (the unit roundoff of truncation). The double-precision reference contributes
// < K 2^-53 relative: negligible. With out.bf16 the result is then rounded to bf16, adding at
// most half a bf16 ulp: 2^-8 |C| <= 2^-8 (|C_ref| + tol).
// Separate exact checks: FP32 roles must give the exact result on inputs where FP32 is exact
// and TF32 is not (no TF32), repeated runs are bit-identical, and the statistics slots equal the
// CPU counts.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.cuh"
#include "kernels/quantize.cuh"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/gpu/gpu_test_util.h"
#include "lab/model/elementwise.h"

namespace {

using namespace mxlab;
using mxlab::cuda::GemmRunner;
using mxlab::cuda::kStatWords;

constexpr uint32_t kStep = 977u;

// Every CUDA call in these tests is checked (a failed copy must not pass as a result).
#define CUDA_EXPECT(expr) EXPECT_EQ((expr), cudaSuccess) << #expr
constexpr int kMaxReport = 5;

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

// A blocking stream: it waits for the legacy-stream cudaMemcpy uploads of the tests.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Normal-ish values with a spread of magnitudes per row (so MX blocks actually clamp/round).
std::vector<float> random_matrix(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-6, 3);
  std::vector<float> x(n);
  for (float& v : x) v = std::ldexp(nd(rng), ex(rng));
  return x;
}

// One operand role.
struct Role {
  const char* label;
  QuantSpec q;
  bool round_first = false;
  Rounding bf16_mode = Rounding::nearest_even;
};

Role role(const char* label, NumFmt f, ScaleRule rule = ScaleRule::floor, Rounding r = Rounding::nearest_even,
          bool first = false, Rounding bmode = Rounding::nearest_even) {
  Role ro;
  ro.label = label;
  ro.q.fmt = f;
  ro.q.rule = rule;
  ro.q.rounding = r;
  ro.q.seed = 0xC0FFEEull;
  ro.round_first = first;
  ro.bf16_mode = bmode;
  return ro;
}

// The dequantized operand as the GPU sees it, in its stored layout.
std::vector<float> cpu_operand(const std::vector<float>& x, int64_t rows, int64_t cols, const GemmOperand& op,
                               QuantStats* stats) {
  std::vector<float> src = x;
  if (op.round_bf16_first)
    for (float& v : src) v = round_bf16(v, op.bf16_mode);
  QuantSpec q = op.q;
  q.seed = sr_seed(op.q.seed, op.sr_op);  // the CPU backend's rule (lab/cpu/cpu_backend.cpp)
  q.salt = kStep;
  std::vector<float> out(x.size());
  quantize_dequantize(src.data(), out.data(), rows, cols, op.k_contiguous ? Axis::contiguous : Axis::strided, q);
  if (stats) {
    QuantSpec sq = op.stats_q;
    sq.seed = sr_seed(op.stats_q.seed, op.sr_op);
    sq.salt = kStep;
    quantize_dequantize(src.data(), nullptr, rows, cols, op.k_contiguous ? Axis::contiguous : Axis::strided, sq,
                        stats);
  }
  return out;
}

// Element (m, k) of A / (n, k) of B in their stored layouts.
float at(const std::vector<float>& x, bool kc, int64_t i, int64_t k, int64_t K, int64_t I) {
  return kc ? x[static_cast<size_t>(i * K + k)] : x[static_cast<size_t>(k * I + i)];
}

struct Problem {
  int64_t M, N, K;
  bool a_kc, b_kc;
  Role ra, rb;
  float beta;
  ElementwiseRound out;
};

std::string describe(const Problem& p) {
  return std::string(p.ra.label) + " x " + p.rb.label + " M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) +
         " K=" + std::to_string(p.K) + " A" + (p.a_kc ? "[MxK]" : "[KxM]") + " B" + (p.b_kc ? "[NxK]" : "[KxN]") +
         " beta=" + std::to_string(static_cast<int>(p.beta)) +
         (p.out.bf16 ? std::string(" out=bf16/") + name(p.out.mode) : std::string(" out=fp32"));
}

// Runs one problem on the GPU and checks it against the CPU reference with the derived tolerance.
// Returns the number of out-of-tolerance elements.
int64_t check_problem(GemmRunner& runner, cudaStream_t s, const Problem& p, uint64_t seed, bool check_stats) {
  const std::string what = describe(p);
  const int64_t M = p.M, N = p.N, K = p.K;
  const std::vector<float> ha = random_matrix(static_cast<size_t>(M * K), seed);
  const std::vector<float> hb = random_matrix(static_cast<size_t>(N * K), seed + 1);
  const std::vector<float> hc = random_matrix(static_cast<size_t>(M * N), seed + 2);
  DevBuf<float> da(ha.size()), db(hb.size()), dc(hc.size());
  DevBuf<unsigned long long> dstats(2 * kStatWords);
  DevBuf<uint32_t> dstep(1);
  EXPECT_TRUE(da.p && db.p && dc.p && dstats.p && dstep.p);
  CUDA_EXPECT(cudaMemcpy(da.p, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  CUDA_EXPECT(cudaMemcpy(db.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  if (p.beta == 0.0f)
    CUDA_EXPECT(cudaMemset(dc.p, 0xFF, hc.size() * 4));  // NaN: must not be read
  else
    CUDA_EXPECT(cudaMemcpy(dc.p, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice));
  CUDA_EXPECT(cudaMemset(dstats.p, 0, 2 * kStatWords * 8));
  CUDA_EXPECT(cudaMemcpy(dstep.p, &kStep, 4, cudaMemcpyHostToDevice));

  GemmOperand a, b;
  a.p = da.p;
  a.k_contiguous = p.a_kc;
  a.q = p.ra.q;
  a.round_bf16_first = p.ra.round_first;
  a.bf16_mode = p.ra.bf16_mode;
  a.sr_op = 3;
  b.p = db.p;
  b.k_contiguous = p.b_kc;
  b.q = p.rb.q;
  b.round_bf16_first = p.rb.round_first;
  b.bf16_mode = p.rb.bf16_mode;
  b.sr_op = 4;
  if (check_stats) {
    a.stats_slot = 0;
    b.stats_slot = 1;
    // MX roles: their own statistics; other roles: diagnostic statistics under MXFP8 E4M3.
    QuantSpec diag;
    diag.fmt = NumFmt::mxfp8_e4m3;
    a.stats_q = is_mx(a.q.fmt) ? a.q : diag;
    b.stats_q = is_mx(b.q.fmt) ? b.q : diag;
  }
  runner.run(M, N, K, a, b, dc.p, p.beta, p.out, dstep.p, check_stats ? dstats.p : nullptr);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess) << what;
  std::vector<float> got(hc.size());
  CUDA_EXPECT(cudaMemcpy(got.data(), dc.p, got.size() * 4, cudaMemcpyDeviceToHost));

  QuantStats sa, sb;
  const std::vector<float> qa =
      cpu_operand(ha, p.a_kc ? M : K, p.a_kc ? K : M, a, check_stats ? &sa : nullptr);
  const std::vector<float> qb =
      cpu_operand(hb, p.b_kc ? N : K, p.b_kc ? K : N, b, check_stats ? &sb : nullptr);
  const bool tensor_cores = mxlab::cuda::operand_path(a) == mxlab::cuda::OperandPath::bf16_exact &&
                            mxlab::cuda::operand_path(b) == mxlab::cuda::OperandPath::bf16_exact;
  const double u = tensor_cores ? std::ldexp(1.0, -23) : std::ldexp(1.0, -24);
  const double n = static_cast<double>(K + 2);
  const double gamma = n * u / (1.0 - n * u);
  int64_t bad = 0;
  double max_rel = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double prod = static_cast<double>(at(qa, p.a_kc, m, k, K, M)) * at(qb, p.b_kc, j, k, K, N);
        ref += prod;
        mag += std::fabs(prod);
      }
      const double c0 = p.beta * static_cast<double>(hc[static_cast<size_t>(m * N + j)]);
      if (p.beta != 0.0f) {
        ref += c0;
        mag += std::fabs(c0);
      }
      double tol = gamma * mag;
      if (p.out.bf16) tol += std::ldexp(std::fabs(ref) + tol, -8);
      const float g = got[static_cast<size_t>(m * N + j)];
      const double err = std::fabs(static_cast<double>(g) - ref);
      const bool bf16_ok = !p.out.bf16 || bf16_exact(g);
      if (mag > 0) max_rel = std::max(max_rel, err / mag);
      if (!(std::isfinite(g) && err <= tol && bf16_ok) && bad++ < kMaxReport)
        ADD_FAILURE() << what << ": C[" << m << "," << j << "] gpu " << g << " ref " << ref << " |err| " << err
                      << " tol " << tol << (bf16_ok ? "" : " (not bf16-exact)");
    }
  }
  if (check_stats) {
    unsigned long long hs[2 * kStatWords];
    CUDA_EXPECT(cudaMemcpy(hs, dstats.p, sizeof hs, cudaMemcpyDeviceToHost));
    const QuantStats* want[2] = {&sa, &sb};
    for (int o = 0; o < 2; ++o) {
      const uint64_t w[kStatWords] = {want[o]->n, want[o]->lastbin, want[o]->clamped, want[o]->nan_blocks,
                                      want[o]->blocks};
      for (int i = 0; i < kStatWords; ++i)
        if (hs[o * kStatWords + i] != w[i]) {
          ++bad;
          ADD_FAILURE() << what << ": stats slot " << o << " word " << i << " gpu " << hs[o * kStatWords + i]
                        << " cpu " << w[i];
        }
    }
  }
  return bad;
}

std::vector<Role> roles_a() {
  return {role("fp32", NumFmt::fp32),
          role("mxfp8_e4m3", NumFmt::mxfp8_e4m3),
          role("bf16", NumFmt::bf16),
          role("fp16", NumFmt::fp16),
          role("fp32", NumFmt::fp32),
          role("mxfp4_e2m1/stochastic", NumFmt::mxfp4_e2m1, ScaleRule::floor, Rounding::stochastic),
          role("fp32+bf16-first", NumFmt::fp32, ScaleRule::floor, Rounding::nearest_even, true),
          role("mxfp8_e5m2+bf16-first(away)", NumFmt::mxfp8_e5m2, ScaleRule::ceil, Rounding::nearest_away, true,
               Rounding::nearest_away)};
}
std::vector<Role> roles_b() {
  return {role("fp32", NumFmt::fp32),
          role("mxfp8_e4m3", NumFmt::mxfp8_e4m3),
          role("bf16", NumFmt::bf16),
          role("fp16", NumFmt::fp16),
          role("mxfp8_e4m3", NumFmt::mxfp8_e4m3),
          role("mxfp6_e3m2/rceil", NumFmt::mxfp6_e3m2, ScaleRule::rceil),
          role("mxint8", NumFmt::mxint8, ScaleRule::floor_bump),
          role("bf16(away)", NumFmt::bf16, ScaleRule::floor, Rounding::nearest_away)};
}

TEST(GemmGpu, AllLayoutsRolesBetaOutputMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Stream st;
  GemmRunner runner(st.s);
  const std::vector<Role> ra = roles_a(), rb = roles_b();
  int64_t bad = 0, count = 0;
  uint64_t seed = 1000;
  for (size_t r = 0; r < ra.size(); ++r)
    for (int layout = 0; layout < 4; ++layout)
      for (float beta : {0.0f, 1.0f})
        for (int o = 0; o < 3; ++o) {
          Problem p{131, 77, 300, (layout & 1) != 0, (layout & 2) != 0, ra[r], rb[r], beta, {}};
          p.out.bf16 = o > 0;
          p.out.mode = o == 2 ? Rounding::nearest_away : Rounding::nearest_even;
          bad += check_problem(runner, st.s, p, seed++, /*check_stats=*/layout == 3 && o == 0);
          ++count;
        }
  std::printf("[gemm] %lld problems checked, %lld out of tolerance\n", static_cast<long long>(count),
              static_cast<long long>(bad));
  EXPECT_EQ(bad, 0);
}

// Larger K and shapes that are not multiples of anything (partial MX blocks along K).
TEST(GemmGpu, OddShapesMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Stream st;
  GemmRunner runner(st.s);
  int64_t bad = 0;
  const Role mx = role("mxfp8_e4m3", NumFmt::mxfp8_e4m3);
  const Role f32 = role("fp32", NumFmt::fp32);
  bad += check_problem(runner, st.s, {257, 129, 1031, true, false, mx, mx, 1.0f, {}}, 77, true);
  bad += check_problem(runner, st.s, {33, 65, 2049, false, true, f32, f32, 0.0f, {}}, 78, true);
  bad += check_problem(runner, st.s, {1, 1, 33, true, true, mx, f32, 0.0f, {true, Rounding::nearest_even}}, 79, true);
  EXPECT_EQ(bad, 0);
}

// FP32 roles are true FP32: with A = 1 + j 2^-20 (j < 16) and B = 1, every partial sum of K = 16
// terms is exact in FP32 (<= 24 significant bits), so the result must equal the exact sum;
// TF32 (10-bit mantissas) would drop the 2^-20 terms.
TEST(GemmGpu, Fp32RolesAreExactWhereFp32IsExactNoTf32) {
  MXLAB_REQUIRE_GPU();
  Stream st;
  GemmRunner runner(st.s);
  const int64_t M = 64, N = 48, K = 16;
  std::vector<float> ha(static_cast<size_t>(M * K)), hb(static_cast<size_t>(N * K), 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) ha[static_cast<size_t>(m * K + k)] = 1.0f + std::ldexp(static_cast<float>((m + k) % 16), -20);
  DevBuf<float> da(ha.size()), db(hb.size()), dc(static_cast<size_t>(M * N));
  CUDA_EXPECT(cudaMemcpy(da.p, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  CUDA_EXPECT(cudaMemcpy(db.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  GemmOperand a, b;
  a.p = da.p;
  b.p = db.p;
  runner.run(M, N, K, a, b, dc.p, 0.0f, {}, nullptr, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  std::vector<float> got(static_cast<size_t>(M * N));
  CUDA_EXPECT(cudaMemcpy(got.data(), dc.p, got.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int64_t m = 0; m < M; ++m) {
    double want = 0;
    for (int64_t k = 0; k < K; ++k) want += ha[static_cast<size_t>(m * K + k)];
    for (int64_t n = 0; n < N; ++n)
      if (static_cast<double>(got[static_cast<size_t>(m * N + n)]) != want && bad++ < kMaxReport)
        ADD_FAILURE() << "C[" << m << "," << n << "] = " << got[static_cast<size_t>(m * N + n)] << ", exact " << want;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_NE(runner.math_mode().find("PEDANTIC"), std::string::npos);
}

// Same inputs, same runner: bit-identical results (SGEMM and the bf16 path), and a CUDA-graph
// replay after reserve() gives the same bits as the direct call.
TEST(GemmGpu, DeterministicAndGraphCapturable) {
  MXLAB_REQUIRE_GPU();
  Stream st;
  GemmRunner runner(st.s);
  const int64_t M = 512, N = 384, K = 1024;
  const std::vector<float> ha = random_matrix(static_cast<size_t>(M * K), 5), hb = random_matrix(static_cast<size_t>(N * K), 6);
  DevBuf<float> da(ha.size()), db(hb.size()), dc(static_cast<size_t>(M * N));
  DevBuf<uint32_t> dstep(1);
  CUDA_EXPECT(cudaMemcpy(da.p, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  CUDA_EXPECT(cudaMemcpy(db.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  CUDA_EXPECT(cudaMemcpy(dstep.p, &kStep, 4, cudaMemcpyHostToDevice));
  for (NumFmt f : {NumFmt::fp32, NumFmt::mxfp8_e4m3}) {
    GemmOperand a, b;
    a.p = da.p;
    b.p = db.p;
    b.k_contiguous = false;
    a.q.fmt = b.q.fmt = f;
    a.q.rounding = f == NumFmt::fp32 ? Rounding::nearest_even : Rounding::stochastic;
    std::vector<float> first(static_cast<size_t>(M * N)), again(first.size());
    runner.run(M, N, K, a, b, dc.p, 0.0f, {}, dstep.p, nullptr);
    CUDA_EXPECT(cudaMemcpy(first.data(), dc.p, first.size() * 4, cudaMemcpyDeviceToHost));
    for (int rep = 0; rep < 3; ++rep) {
      CUDA_EXPECT(cudaMemset(dc.p, 0xFF, again.size() * 4));
      runner.run(M, N, K, a, b, dc.p, 0.0f, {}, dstep.p, nullptr);
      CUDA_EXPECT(cudaMemcpy(again.data(), dc.p, again.size() * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << name(f) << " run " << rep;
    }
    // Graph capture: scratch is already reserved (by the runs above, and explicitly here).
    runner.reserve(std::max(M * K, N * K));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_EXPECT(cudaMemset(dc.p, 0xFF, again.size() * 4));
    ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    runner.run(M, N, K, a, b, dc.p, 0.0f, {}, dstep.p, nullptr);
    ASSERT_EQ(cudaStreamEndCapture(st.s, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, st.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
    CUDA_EXPECT(cudaMemcpy(again.data(), dc.p, again.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << name(f) << " graph replay";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  // Growing scratch inside a capture is refused with a clear error, not a cudaMalloc.
  GemmRunner fresh(st.s);
  GemmOperand a, b;
  a.p = da.p;
  b.p = db.p;
  a.q.fmt = b.q.fmt = NumFmt::mxfp8_e4m3;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_THROW(fresh.run(M, N, K, a, b, dc.p, 0.0f, {}, dstep.p, nullptr), mxlab::Error);
  cudaStreamEndCapture(st.s, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
}

// The documented bf16-inexact corner (fp8_e4m3 blocks with amax below 2^-116) multiplied by
// large values: with the check on, the runner detects it and reruns on the FP32 path.
TEST(GemmGpu, Bf16InexactCornerFallsBackWhenVerified) {
  MXLAB_REQUIRE_GPU();
  Stream st;
  GemmRunner runner(st.s);
  runner.set_verify_bf16_exact(true);
  const int64_t M = 8, N = 8, K = 64;
  std::mt19937 rng(11);
  std::vector<float> ha(static_cast<size_t>(M * K)), hb(static_cast<size_t>(N * K));
  for (float& v : ha) v = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, -120 - static_cast<int>(rng() % 16));
  for (float& v : hb) v = std::ldexp(1.0f + static_cast<float>(rng() % 8) / 8.0f, 120);
  Problem p{M, N, K, true, true, role("mxfp8_e4m3", NumFmt::mxfp8_e4m3), role("bf16", NumFmt::bf16), 0.0f, {}};
  // check_problem draws its own inputs; run this one directly.
  DevBuf<float> da(ha.size()), db(hb.size()), dc(static_cast<size_t>(M * N));
  CUDA_EXPECT(cudaMemcpy(da.p, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  CUDA_EXPECT(cudaMemcpy(db.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  GemmOperand a, b;
  a.p = da.p;
  a.q = p.ra.q;
  b.p = db.p;
  b.q = p.rb.q;
  runner.run(M, N, K, a, b, dc.p, 0.0f, {}, nullptr, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  EXPECT_EQ(runner.bf16_fallbacks(), 1);
  std::vector<float> got(static_cast<size_t>(M * N));
  CUDA_EXPECT(cudaMemcpy(got.data(), dc.p, got.size() * 4, cudaMemcpyDeviceToHost));
  const std::vector<float> qa = cpu_operand(ha, M, K, a, nullptr), qb = cpu_operand(hb, N, K, b, nullptr);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double pr = static_cast<double>(qa[static_cast<size_t>(m * K + k)]) * qb[static_cast<size_t>(n * K + k)];
        ref += pr;
        mag += std::fabs(pr);
      }
      const double tol = (K + 2) * std::ldexp(1.0, -24) * mag;
      EXPECT_LE(std::fabs(got[static_cast<size_t>(m * N + n)] - ref), tol) << m << "," << n;
    }
}

// K = 0: C = beta * C (then rounded), and nothing is read from the (null) operands.
TEST(GemmGpu, EmptyReductionScalesC) {
  MXLAB_REQUIRE_GPU();
  Stream st;
  GemmRunner runner(st.s);
  const int64_t M = 3, N = 5;
  std::vector<float> hc(static_cast<size_t>(M * N));
  for (size_t i = 0; i < hc.size(); ++i) hc[i] = 1.0f + std::ldexp(static_cast<float>(i), -12);
  DevBuf<float> dc(hc.size());
  GemmOperand a, b;
  std::vector<float> got(hc.size());
  CUDA_EXPECT(cudaMemcpy(dc.p, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice));
  runner.run(M, N, 0, a, b, dc.p, 1.0f, {true, Rounding::nearest_even}, nullptr, nullptr);
  CUDA_EXPECT(cudaStreamSynchronize(st.s));
  CUDA_EXPECT(cudaMemcpy(got.data(), dc.p, got.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < hc.size(); ++i) EXPECT_EQ(got[i], round_bf16(hc[i], Rounding::nearest_even)) << i;
  runner.run(M, N, 0, a, b, dc.p, 0.0f, {}, nullptr, nullptr);
  CUDA_EXPECT(cudaStreamSynchronize(st.s));
  CUDA_EXPECT(cudaMemcpy(got.data(), dc.p, got.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < hc.size(); ++i) EXPECT_EQ(f32_bits(got[i]), 0u) << i;
}

TEST(GemmGpu, SrSeedMatchesElementwise) {
  MXLAB_REQUIRE_GPU();
  EXPECT_EQ(mxlab::cuda::operand_sr_seed(1, 1), 1ull ^ 0x9E3779B97F4A7C15ull);
  for (uint64_t op = 0; op < 64; ++op) EXPECT_EQ(mxlab::cuda::operand_sr_seed(12345, op), sr_seed(12345, op));
}

TEST(GemmGpu, RefusesTf32Override) {
  MXLAB_REQUIRE_GPU();
  setenv("NVIDIA_TF32_OVERRIDE", "1", 1);
  EXPECT_THROW({ GemmRunner r(nullptr); }, mxlab::Error);
  unsetenv("NVIDIA_TF32_OVERRIDE");
}

}  // namespace
