// The block Hadamard rotation on CUDA (kernels/hadamard.cuh, precision.rotation) against the CPU
// reference (lab/mx/hadamard.cpp), bit for bit:
//   - the transform itself on both kernels (contiguous: runs of whole blocks, a partial last chunk;
//     strided: tiles of n rows by 32 columns or fewer, odd column counts), every block size from 2
//     to 4096, deterministic and random signs (salt from the device step or from the spec), the
//     bf16 rounding as read, in place, NaN / Inf / signed zeros / subnormals;
//   - every GEMM path of a rotated operand (MX and bf16 on the bf16 tensor-core path, A or B
//     rotated: the two bf16 copies then share one scratch region; fp16 on the FP32 path; an FP32
//     role rotated in scratch), both layouts, stochastic rounding, the statistics of the rotated
//     tensor, a stacked operand of gemm_batched: each shown by C = op . I^T (one exact product per
//     output, whatever the GEMM path or order);
//   - a GEMM of two rotated operands within the FP32 accumulation bound of the CPU's.
// A whole rotated training step, operand by operand: PerGemmGpu.EveryOperandOfARotatedStepEqualsTheCpus;
// trajectories: ModelParity.RotatedPoliciesMatchCpu, ArmsGpu.RotationArmsEqualTheirSingleRuns,
// ProducerQuantGpu.RotatedPolicyIsBitIdenticalWithAndWithout.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "kernels/hadamard.cuh"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"
#include "lab/mx/hadamard.h"
#include "lab/mx/scalar.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using test::Dev;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Values of every magnitude, with specials sprinkled in when asked.
std::vector<float> inputs(size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<float> x(n);
  for (float& v : x) v = std::ldexp(nd(rng), ex(rng));
  if (specials && n > 64) {
    std::uniform_int_distribution<size_t> at(0, n - 1);
    const float sp[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 1e-40f, -1e-42f, 3.0e38f, -3.0e38f};
    for (int i = 0; i < 40; ++i) x[at(rng)] = sp[i % 9];
  }
  return x;
}

int64_t report_mismatches(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (bits(want[i]) != bits(got[i]) && ++bad <= 3)
      ADD_FAILURE() << what << " [" << i << "]: cpu " << want[i] << " (0x" << std::hex << bits(want[i]) << ") gpu "
                    << got[i] << " (0x" << bits(got[i]) << std::dec << ")";
  return bad;
}

struct Case {
  int64_t rows, cols, period;
  Axis axis;
  int n;
};

// The CPU reference of a launch: bf16 rounding first where asked, then hadamard_rotate.
std::vector<float> cpu_rotate(std::vector<float> x, const Case& c, RotationSpec r, bool bf16_first, Rounding mode) {
  if (bf16_first)
    for (float& v : x) v = round_bf16(v, mode);
  hadamard_rotate(x.data(), x.data(), c.rows, c.cols, c.axis, c.period, r);
  return x;
}

}  // namespace

TEST(RotationGpu, TransformEqualsCpuBitForBit) {
  MXLAB_REQUIRE_GPU();
  std::vector<Case> cases;
  for (int n : {2, 4, 8, 32, 64, 128, 256, 512, 1024, 4096}) {
    cases.push_back({37, 4096, 4096, Axis::contiguous, n});            // 37 rows of 4096: several chunks
    cases.push_back({4096, 33, 4096, Axis::strided, n});               // one tile row, a 1-column tail
  }
  cases.push_back({3, 8192, 4096, Axis::contiguous, 64});              // signs repeat every 4096
  cases.push_back({37, 96, 96, Axis::contiguous, 32});                 // 3552 floats: one partial chunk
  cases.push_back({2 * 96, 517, 96, Axis::strided, 32});               // stacked items, 17 column tiles
  cases.push_back({1024, 70, 512, Axis::strided, 512});                // 16-column tiles
  cases.push_back({4096, 3, 4096, Axis::strided, 4096});               // 2-column tiles
  int64_t checked = 0;
  cudaStream_t s = nullptr;
  MXLAB_CUDA_OK(cudaStreamCreate(&s));
  const uint32_t step = 4711;
  Dev<uint32_t> d_step(1);
  d_step.put({step});
  for (const Case& c : cases)
    for (int variant = 0; variant < 4; ++variant) {
      const bool random = variant & 1, bf16_first = variant & 2;
      SCOPED_TRACE(testing::Message() << c.rows << "x" << c.cols << (c.axis == Axis::contiguous ? " contiguous" : " strided")
                                      << " n " << c.n << " period " << c.period << (random ? " random" : "")
                                      << (bf16_first ? " bf16-first" : ""));
      const size_t N = static_cast<size_t>(c.rows * c.cols);
      const std::vector<float> x = inputs(N, 100 + c.n + variant, true);
      RotationSpec r;
      r.block = c.n;
      r.random_signs = random;
      r.seed = 0xfeedbeefULL + c.n;
      r.salt = step;
      const std::vector<float> want = cpu_rotate(x, c, r, bf16_first, Rounding::nearest_away);
      Dev<float> in(N), out(N);
      in.put(x);
      cuda::RotateLaunch L;
      L.in = in.p;
      L.out = out.p;
      L.rows = c.rows;
      L.cols = c.cols;
      L.axis = c.axis;
      L.period = c.period;
      L.r = r;
      L.r.salt = variant == 1 ? 0 : step;  // variant 1 reads the salt from the device step
      L.d_step = variant == 1 ? d_step.p : nullptr;
      L.round_bf16_first = bf16_first;
      L.bf16_mode = Rounding::nearest_away;
      cuda::hadamard_rotate(L, s);
      MXLAB_CUDA_OK(cudaStreamSynchronize(s));
      EXPECT_EQ(report_mismatches(want, out.get(), "out of place"), 0);
      // In place.
      L.out = in.p;
      cuda::hadamard_rotate(L, s);
      MXLAB_CUDA_OK(cudaStreamSynchronize(s));
      EXPECT_EQ(report_mismatches(want, in.get(), "in place"), 0);
      checked += static_cast<int64_t>(2 * N);
    }
  MXLAB_CUDA_OK(cudaStreamDestroy(s));
  std::printf("[rotation gpu] %lld rotated floats bit-identical to the CPU reference\n", static_cast<long long>(checked));
}

TEST(RotationGpu, LauncherRefusesWhatTheCpuRefuses) {
  MXLAB_REQUIRE_GPU();
  Dev<float> buf(64 * 64);
  cuda::RotateLaunch L;
  L.in = L.out = buf.p;
  L.rows = 64;
  L.cols = 48;
  L.period = 48;
  L.r.block = 32;
  EXPECT_THROW(cuda::hadamard_rotate(L, nullptr), Error);  // 48 is not a multiple of 32
  L.cols = 64;
  L.period = 64;
  L.r.block = 24;
  EXPECT_THROW(cuda::hadamard_rotate(L, nullptr), Error);
  L.r.block = 8192;
  EXPECT_THROW(cuda::hadamard_rotate(L, nullptr), Error);
  L.r.block = 32;
  EXPECT_NO_THROW(cuda::hadamard_rotate(L, nullptr));
  MXLAB_CUDA_OK(cudaDeviceSynchronize());
}

namespace {

// C = op . I^T (or I . op^T when `b_side`) on `be`: the rotated, quantized operand itself. The
// identity is an unrotated bf16 operand (exact); op is [rows x K] logical, stored per op.k_contiguous.
std::vector<float> operand_through_identity(Backend& be, const std::vector<float>& stored, GemmOperand op, int64_t rows,
                                            int64_t K, bool b_side, int slot) {
  std::vector<float> eye(static_cast<size_t>(K * K), 0.0f);
  for (int64_t i = 0; i < K; ++i) eye[static_cast<size_t>(i * K + i)] = 1.0f;
  float* x = be.alloc(stored.size());
  be.upload(x, stored.data(), stored.size());
  float* I = be.alloc(eye.size());
  be.upload(I, eye.data(), eye.size());
  op.p = x;
  op.stats_slot = slot;
  op.stats_q = op.q;
  GemmOperand id;
  id.p = I;
  id.q.fmt = NumFmt::bf16;
  float* C = be.alloc(static_cast<size_t>(rows * K));
  if (b_side) be.gemm(K, rows, K, id, op, C, 0.0f, ElementwiseRound{});   // C [K x rows] = I . op^T
  else be.gemm(rows, K, K, op, id, C, 0.0f, ElementwiseRound{});          // C [rows x K] = op . I^T
  std::vector<float> out(static_cast<size_t>(rows * K));
  be.download(out.data(), C, out.size());
  return out;
}

}  // namespace

TEST(RotationGpu, EveryGemmPathQuantizesTheRotatedOperandLikeTheCpu) {
  MXLAB_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const StepScalars st{29, 0.0f, 1.0f, 1.0f};
  cpu->set_step(st);
  gpu->set_step(st);
  cpu->reset_stats(1);
  gpu->reset_stats(1);
  const int64_t rows = 48, K = 256;
  struct Path {
    NumFmt fmt;
    Rounding rounding;
    bool bf16_first;
  };
  const Path paths[] = {{NumFmt::mxfp8_e4m3, Rounding::nearest_away, true},   // bf16 tensor-core path
                        {NumFmt::mxfp4_e2m1, Rounding::stochastic, false},    // bf16 path, stochastic
                        {NumFmt::bf16, Rounding::nearest_even, false},        // bf16 path, scalar format
                        {NumFmt::fp16, Rounding::nearest_even, false},        // FP32 path, dequantized
                        {NumFmt::fp32, Rounding::nearest_even, false},        // FP32 role, rotated in scratch
                        {NumFmt::fp32, Rounding::nearest_even, true}};        // FP32 role rounded to bf16 first
  int64_t checked = 0;
  for (const Path& path : paths)
    for (bool kc : {true, false})
      for (bool b_side : {false, true})
        for (bool random : {false, true}) {
          SCOPED_TRACE(testing::Message() << name(path.fmt) << " " << name(path.rounding) << (path.bf16_first ? " bf16-first" : "")
                                          << (kc ? " k-contiguous" : " strided") << (b_side ? " as B" : " as A")
                                          << (random ? " random" : ""));
          std::vector<float> stored = inputs(static_cast<size_t>(rows * K), 7 + checked, false);
          // fp16 saturates to Inf at 65504; an Inf operand meets the identity's zeros as Inf * 0 =
          // NaN, whose payload is the GEMM library's (x86 and cuBLAS differ), not the quantizer's.
          // Scaled by 2^-12, the rotated values (|x| <= ~2^23 * sqrt(64)) stay finite in fp16 and
          // the small ones still reach its subnormals.
          if (path.fmt == NumFmt::fp16)
            for (float& v : stored) v = std::ldexp(v, -12);
          GemmOperand op;
          op.k_contiguous = kc;
          op.q.fmt = path.fmt;
          op.q.rounding = path.rounding;
          op.q.seed = 321;
          op.sr_op = 17;
          op.round_bf16_first = path.bf16_first;
          op.bf16_mode = Rounding::nearest_away;
          op.rot.block = 64;
          op.rot.random_signs = random;
          op.rot.seed = 555;
          const int slot = is_mx(path.fmt) ? 0 : -1;
          const std::vector<float> c = operand_through_identity(*cpu, stored, op, rows, K, b_side, slot);
          const std::vector<float> g = operand_through_identity(*gpu, stored, op, rows, K, b_side, slot);
          EXPECT_EQ(report_mismatches(c, g, "operand"), 0);
          checked += static_cast<int64_t>(c.size());
        }
  const QuantStats sc = cpu->read_stats().at(0), sg = gpu->read_stats().at(0);
  EXPECT_GT(sc.n, 0u);
  EXPECT_EQ(sg.n, sc.n);
  EXPECT_EQ(sg.lastbin, sc.lastbin);
  EXPECT_EQ(sg.clamped, sc.clamped);
  EXPECT_EQ(sg.blocks, sc.blocks);
  EXPECT_EQ(sg.nan_blocks, sc.nan_blocks);
  std::printf("[rotation gpu] %lld rotated GEMM operand values bit-identical on every path\n",
              static_cast<long long>(checked));
}

// gemm_batched: a stacked K-strided operand [batch*K x M] rotated with the signs of each item's K.
TEST(RotationGpu, StackedBatchedOperandEqualsTheCpu) {
  MXLAB_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const StepScalars st{3, 0.0f, 1.0f, 1.0f};
  cpu->set_step(st);
  gpu->set_step(st);
  const int64_t batch = 3, M = 40, K = 64;
  const std::vector<float> a = inputs(static_cast<size_t>(batch * K * M), 41, false);
  std::vector<float> eye(static_cast<size_t>(batch * K * K), 0.0f);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < K; ++i) eye[static_cast<size_t>((b * K + i) * K + i)] = 1.0f;
  auto run = [&](Backend& be) {
    GemmOperand A;
    A.p = be.alloc(a.size());
    be.upload(const_cast<float*>(A.p), a.data(), a.size());
    A.k_contiguous = false;
    A.q.fmt = NumFmt::mxfp8_e4m3;
    A.rot.block = 32;
    A.rot.random_signs = true;
    A.rot.seed = 99;
    GemmOperand I;
    I.p = be.alloc(eye.size());
    be.upload(const_cast<float*>(I.p), eye.data(), eye.size());
    I.q.fmt = NumFmt::bf16;
    float* C = be.alloc(static_cast<size_t>(batch * M * K));
    be.gemm_batched(batch, M, K, K, A, I, C, 0.0f, ElementwiseRound{});
    std::vector<float> out(static_cast<size_t>(batch * M * K));
    be.download(out.data(), C, out.size());
    return out;
  };
  EXPECT_EQ(report_mismatches(run(*cpu), run(*gpu), "batched"), 0);
}

// Both operands rotated with the same signs (as the model builds them): the GPU's product of its
// (bit-identical) quantized operands is within the FP32 accumulation bound of the CPU's:
// |C_gpu - C_cpu| <= 2 gamma_K sum_k |a_k b_k| <= 2 K 2^-23 ||a|| ||b|| (tensor cores truncate:
// u = 2^-23; Cauchy-Schwarz), with a, b the quantized rotated rows.
TEST(RotationGpu, GemmOfTwoRotatedOperandsIsWithinTheAccumulationBound) {
  MXLAB_REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const StepScalars st{8, 0.0f, 1.0f, 1.0f};
  cpu->set_step(st);
  gpu->set_step(st);
  const int64_t M = 64, N = 48, K = 256;
  const std::vector<float> A = inputs(static_cast<size_t>(M * K), 51, false), B = inputs(static_cast<size_t>(N * K), 52, false);
  for (bool random : {false, true}) {
    GemmOperand a, b;
    a.q.fmt = b.q.fmt = NumFmt::mxfp8_e4m3;
    a.k_contiguous = true;
    b.k_contiguous = false;  // B stored [K x N]
    a.sr_op = 1;
    b.sr_op = 2;
    a.rot.block = b.rot.block = 32;
    a.rot.random_signs = b.rot.random_signs = random;
    a.rot.seed = b.rot.seed = 4242;
    std::vector<float> Bs(B.size());
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) Bs[static_cast<size_t>(k * N + j)] = B[static_cast<size_t>(j * K + k)];
    auto product = [&](Backend& be) {
      GemmOperand x = a, y = b;
      float* pa = be.alloc(A.size());
      be.upload(pa, A.data(), A.size());
      float* pb = be.alloc(Bs.size());
      be.upload(pb, Bs.data(), Bs.size());
      x.p = pa;
      y.p = pb;
      float* C = be.alloc(static_cast<size_t>(M * N));
      be.gemm(M, N, K, x, y, C, 0.0f, ElementwiseRound{});
      std::vector<float> out(static_cast<size_t>(M * N));
      be.download(out.data(), C, out.size());
      return out;
    };
    const std::vector<float> cc = product(*cpu), cg = product(*gpu);
    const std::vector<float> qa = operand_through_identity(*cpu, A, a, M, K, false, -1);
    const std::vector<float> qb = operand_through_identity(*cpu, Bs, b, N, K, false, -1);
    double worst = 0.0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double na = 0.0, nb = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          na += static_cast<double>(qa[static_cast<size_t>(i * K + k)]) * qa[static_cast<size_t>(i * K + k)];
          nb += static_cast<double>(qb[static_cast<size_t>(j * K + k)]) * qb[static_cast<size_t>(j * K + k)];
        }
        const double bound = 2.0 * K * std::ldexp(1.0, -23) * std::sqrt(na) * std::sqrt(nb);
        const double diff = std::fabs(static_cast<double>(cg[static_cast<size_t>(i * N + j)]) - cc[static_cast<size_t>(i * N + j)]);
        ASSERT_LE(diff, bound) << "(" << i << ", " << j << ")";
        worst = std::max(worst, bound > 0 ? diff / bound : 0.0);
      }
    std::printf("[rotation gpu] %s: two rotated operands, worst |C_gpu - C_cpu| = %.3g of the bound\n",
                random ? "random" : "deterministic", worst);
  }
}

}  // namespace mxlab
