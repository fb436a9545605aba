// Producer-side quantization (kernels/mx_produce.cuh, kernels/gemm.cuh): the
// layernorm forward and the activation kernels write the next GEMM's MX operand (bf16) in the
// same pass as their output. Checked here:
//   1. Kernels: for every producer x MX element format x deterministic rounding x scale rule,
//      with and without the bf16-first rounding, on tensors with NaN, Inf, zero, huge and tiny
//      blocks, the bf16 operand a producer writes equals quantize_bf16 of its output bit for
//      bit, and the output itself equals the output of the producer launched without it.
//      Shapes a producer does not cover (rows not a multiple of 32, swiglu) are declined.
//   2. Backend and model: MX training steps (eager, recorded and replayed CUDA graphs) on a
//      backend with producer-side quantization and one without give bit-identical parameters;
//      the first takes y, a and dh of every layer from their producers in a recorded step, and
//      passes with statistics or stochastic rounding take none (they keep the separate pass).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/bench_support.h"
#include "kernels/cuda_backend.h"
#include "kernels/elementwise.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/mx_produce.cuh"
#include "kernels/quantize.cuh"
#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/mx/format.h"
#include "lab/config/config.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using test::Dev;

constexpr int64_t kRows = 70, kCols = 192;  // 6 blocks per row; rows not a multiple of anything

// Values with blocks that stress the format's ends: per-row scales from 2^-130 to 2^120, a zero
// block, blocks holding NaN, +Inf, -Inf, and values near FLT_MAX.
std::vector<float> stress_input(uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(kRows * kCols));
  for (int64_t r = 0; r < kRows; ++r) {
    const int e = static_cast<int>(r % 10) * 25 - 130;  // -130 .. 95
    const float scale = r % 7 == 3 ? 1.0f : std::ldexp(1.0f, e);
    for (int64_t c = 0; c < kCols; ++c) v[r * kCols + c] = nd(rng) * scale;
  }
  if (specials) {
    for (int64_t c = 0; c < 32; ++c) v[5 * kCols + 64 + c] = 0.0f;  // a zero block
    v[7 * kCols + 3] = std::numeric_limits<float>::quiet_NaN();
    v[9 * kCols + 40] = std::numeric_limits<float>::infinity();
    v[11 * kCols + 100] = -std::numeric_limits<float>::infinity();
    v[13 * kCols + 130] = 3.0e38f;
    v[13 * kCols + 131] = -3.3e38f;
    v[17 * kCols + 191] = 1.0e-45f;  // a float32 subnormal
  }
  return v;
}

QuantSpec spec_of(NumFmt f, Rounding r, ScaleRule rule, Bump bump) {
  QuantSpec q;
  q.fmt = f;
  q.block = 32;
  q.rule = rule;
  q.rounding = r;
  q.bump = bump;
  return q;
}

enum class Producer { ln_affine, ln_plain, act_fwd, act_bwd, add };

struct Case {
  Producer prod;
  Act act;
  NumFmt fmt;
  Rounding rounding;
  ScaleRule rule;
  Bump bump;
  bool round_first;
  std::string name() const {
    const char* p = prod == Producer::ln_affine ? "ln_fwd(affine)"
                    : prod == Producer::ln_plain ? "ln_fwd"
                    : prod == Producer::act_fwd  ? "act_fwd"
                    : prod == Producer::add      ? "add"
                                                 : "act_bwd";
    return std::string(p) + (prod == Producer::act_fwd || prod == Producer::act_bwd
                                 ? std::string("/") + std::to_string(static_cast<int>(act))
                                 : "") +
           " " + mxlab::name(fmt) + " " + mxlab::name(rounding) + " " + mxlab::name(rule) +
           (bump == Bump::always ? "/always" : "") + (round_first ? " bf16-first" : "");
  }
};

// Runs the producer of `c` with and without pq, then quantize_bf16 of its output; returns the
// number of mismatching bf16 operand values (and checks the outputs agree).
void check_case(const Case& c, const Dev<float>& in1, const Dev<float>& in2, const Dev<float>& gam,
                const Dev<float>& bet, cudaStream_t s) {
  SCOPED_TRACE(c.name());
  const size_t n = static_cast<size_t>(kRows * kCols);
  Dev<float> out(n), out_ref(n), xhat(n), rstd(kRows);
  Dev<uint16_t> q_fused(n), q_ref(n);
  cudaMemset(q_fused.p, 0xFF, n * sizeof(uint16_t));
  const QuantSpec q = spec_of(c.fmt, c.rounding, c.rule, c.bump);
  const Rounding bf16_mode = Rounding::nearest_away;
  const cuda::ProducedQuant pq = cuda::produced_quant(q, c.round_first, bf16_mode, q_fused.p);
  const ElementwiseRound R{true, Rounding::nearest_away}, Rin{true, Rounding::nearest_even};
  bool fused = false;
  for (int pass = 0; pass < 2; ++pass) {
    const cuda::ProducedQuant* p = pass == 0 ? &pq : nullptr;
    float* o = pass == 0 ? out.p : out_ref.p;
    bool r = false;
    switch (c.prod) {
      case Producer::ln_affine:
      case Producer::ln_plain: {
        const bool aff = c.prod == Producer::ln_affine;
        r = cuda::launch_layernorm_fwd(in1.p, aff ? gam.p : nullptr, aff ? bet.p : nullptr, o, xhat.p, rstd.p, kRows,
                                       kCols, 1e-5f, R, s, p);
        break;
      }
      case Producer::act_fwd:
        r = cuda::launch_act_fwd(c.act, in1.p, o, kRows, kCols, R, Rin, s, p);
        break;
      case Producer::act_bwd:
        r = cuda::launch_act_bwd(c.act, in1.p, in2.p, o, kRows, kCols, R, Rin, Rin, s, p);
        break;
      case Producer::add:
        r = cuda::launch_add(o, in1.p, in2.p, kRows * kCols, R, s, p);
        break;
    }
    if (pass == 0) fused = r;
  }
  ASSERT_TRUE(fused) << "the producer declined a shape it covers";
  cuda::QuantLaunch L;
  L.in = out.p;
  L.rows = kRows;
  L.cols = kCols;
  L.axis = Axis::contiguous;
  L.q = q;
  L.round_bf16_first = c.round_first;
  L.bf16_mode = bf16_mode;
  cuda::quantize_bf16(L, reinterpret_cast<__nv_bfloat16*>(q_ref.p), s);
  MXLAB_CUDA_OK(cudaStreamSynchronize(s));
  const auto a = out.get(), b = out_ref.get();
  ASSERT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << "the output changed with pq";
  const auto qf = q_fused.get(), qr = q_ref.get();
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (qf[i] != qr[i] && bad++ < 3)
      ADD_FAILURE() << "element " << i << " (row " << i / kCols << ", col " << i % kCols << "): fused 0x" << std::hex
                    << qf[i] << " quantize_bf16 0x" << qr[i] << std::dec << " of value " << a[i];
  EXPECT_EQ(bad, 0);
}

TEST(ProducerQuantGpu, OperandsEqualQuantizeBf16OfTheOutputBitForBit) {
  MXLAB_REQUIRE_GPU();
  cudaStream_t s;
  MXLAB_CUDA_OK(cudaStreamCreate(&s));
  const size_t n = static_cast<size_t>(kRows * kCols);
  Dev<float> in1(n), in2(n), gam(kCols), bet(kCols);
  in1.put(stress_input(1, true));
  in2.put(stress_input(2, true));
  {  // gains around 1 with a few large ones, betas small
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> g(kCols), b(kCols);
    for (int64_t c = 0; c < kCols; ++c) {
      g[c] = 1.0f + 0.3f * nd(rng) + (c % 37 == 0 ? 50.0f : 0.0f);
      b[c] = 0.1f * nd(rng);
    }
    gam.put(g);
    bet.put(b);
  }
  const NumFmt fmts[] = {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2,
                         NumFmt::mxfp6_e2m3, NumFmt::mxfp4_e2m1, NumFmt::mxint8};
  const Rounding modes[] = {Rounding::nearest_even, Rounding::nearest_away, Rounding::toward_zero};
  const ScaleRule rules[] = {ScaleRule::floor, ScaleRule::ceil, ScaleRule::even, ScaleRule::rceil,
                             ScaleRule::floor_bump};
  int cases = 0;
  for (NumFmt f : fmts)
    for (Rounding r : modes)
      for (bool first : {false, true}) {
        for (ScaleRule rule : rules) {
          for (Bump bump : {Bump::clamp, Bump::always}) {
            if (bump == Bump::always && rule != ScaleRule::floor_bump) continue;
            check_case({Producer::act_fwd, Act::gelu, f, r, rule, bump, first}, in1, in2, gam, bet, s);
            ++cases;
          }
        }
        for (Producer p : {Producer::ln_affine, Producer::ln_plain, Producer::add}) {
          check_case({p, Act::gelu, f, r, ScaleRule::floor, Bump::clamp, first}, in1, in2, gam, bet, s);
          ++cases;
        }
        for (Act a : {Act::relu, Act::gelu, Act::gelu_tanh, Act::linear, Act::gelu_vector}) {
          check_case({Producer::act_bwd, a, f, r, ScaleRule::floor, Bump::clamp, first}, in1, in2, gam, bet, s);
          if (a != Act::gelu) check_case({Producer::act_fwd, a, f, r, ScaleRule::floor, Bump::clamp, first}, in1, in2,
                                         gam, bet, s);
          cases += a != Act::gelu ? 2 : 1;
        }
      }
  std::printf("[producer quant] %d cases compared bit for bit\n", cases);
  MXLAB_CUDA_OK(cudaStreamDestroy(s));
}

TEST(ProducerQuantGpu, UncoveredShapesAreDeclined) {
  MXLAB_REQUIRE_GPU();
  cudaStream_t s;
  MXLAB_CUDA_OK(cudaStreamCreate(&s));
  const int64_t rows = 8, cols = 48;  // 48 % 32 != 0
  Dev<float> h(static_cast<size_t>(rows * 2 * cols)), a(static_cast<size_t>(rows * 2 * cols)),
      xhat(static_cast<size_t>(rows * cols)), rstd(rows);
  cudaMemset(h.p, 0, h.n * sizeof(float));
  Dev<uint16_t> q(static_cast<size_t>(rows * 2 * cols));
  const cuda::ProducedQuant pq =
      cuda::produced_quant(spec_of(NumFmt::mxfp8_e4m3, Rounding::nearest_even, ScaleRule::floor, Bump::clamp), false,
                           Rounding::nearest_even, q.p);
  const ElementwiseRound R{};
  EXPECT_FALSE(cuda::launch_act_fwd(Act::gelu, h.p, a.p, rows, cols, R, R, s, &pq));
  EXPECT_FALSE(cuda::launch_act_bwd(Act::gelu, h.p, h.p, a.p, rows, cols, R, R, R, s, &pq));
  EXPECT_FALSE(cuda::launch_layernorm_fwd(h.p, nullptr, nullptr, a.p, xhat.p, rstd.p, rows, cols, 1e-5f, R, s, &pq));
  EXPECT_FALSE(cuda::launch_add(a.p, h.p, h.p, rows * cols - 16, R, s, &pq));  // not a multiple of 32 elements
  EXPECT_FALSE(cuda::launch_add(a.p + 1, h.p, h.p, rows * cols - 32, R, s, &pq));  // misaligned
  EXPECT_FALSE(cuda::launch_act_fwd(Act::swiglu, h.p, a.p, rows, 32, R, R, s, &pq));  // 32 columns, but swiglu
  EXPECT_TRUE(cuda::launch_act_fwd(Act::gelu, h.p, a.p, rows, 32, R, R, s, &pq));      // the control
  MXLAB_CUDA_OK(cudaStreamSynchronize(s));
  MXLAB_CUDA_OK(cudaStreamDestroy(s));
}

// ---- backend and model ----

StepScalars scalars(uint32_t step) {
  const float t = static_cast<float>(step + 1);
  return StepScalars{step, 1e-3f, 1.0f - std::pow(0.9f, t), 1.0f - std::pow(0.999f, t)};
}

struct TrainResult {
  std::vector<float> params;
  std::vector<int64_t> hits;  // operands taken from producers so far, after each step
};

// `steps` MX training steps of a small MLP (L = 2, d = 64, H = 256, B = 96) on a fresh CUDA
// backend, the trainer's way: statistics steps eager; other steps through begin_capture /
// replay (the first eager, the second recorded, then replayed).
TrainResult train(bool producer_quant, const PrecisionConfig& policy, int steps, bool stats_every_step) {
  RunConfig c;
  c.seed = 5;
  c.model.depth = 2;
  c.model.width = 64;
  c.model.activation = Act::gelu;
  c.data.batch = 96;
  const NetShape S = NetShape::student(c.model, 1);
  const int64_t B = c.data.batch, n = B * S.d;
  auto be = make_cuda_backend(0);
  cuda::set_producer_quant(*be, producer_quant);
  const std::vector<float> init = init_params(S, c.model.init, c.model.init_gain, c.seed, Stream::init);
  const size_t P = static_cast<size_t>(S.num_params);
  float *p = be->alloc(P), *g = be->alloc(P), *m = be->alloc(P), *v = be->alloc(P);
  float *x = be->alloc(static_cast<size_t>(n)), *t = be->alloc(static_cast<size_t>(n));
  be->upload(p, init.data(), P);
  be->fill(m, 0.0f, P);
  be->fill(v, 0.0f, P);
  Workspace ws = Workspace::make(*be, S, B);
  PassPolicy pol;
  pol.p = policy;
  pol.seed = c.seed;
  pol.collect_stats = stats_every_step;
  Backend::AdamHyper hyper;
  auto step = [&] {
    be->randn(x, static_cast<size_t>(n), c.seed, Stream::data, 1.0f);
    be->randn(t, static_cast<size_t>(n), c.seed, Stream::label_noise, 1.0f);
    forward(*be, S, p, x, ws, pol);
    loss_and_grad(*be, c.loss_spec(), t, ws, pol, nullptr);
    backward(*be, S, p, x, ws, g, pol);
    be->adam(p, g, m, v, P, hyper);
  };
  TrainResult r;
  for (int i = 0; i < steps; ++i) {
    be->set_step(scalars(static_cast<uint32_t>(i)));
    if (stats_every_step) {
      be->reset_stats(S.depth * kStatTensors);
      step();
    } else if (!be->replay(1)) {
      const bool rec = be->begin_capture(1);
      step();
      be->end_capture(1);
      if (rec) be->replay(1);
    }
    r.hits.push_back(cuda::producer_quant_hits(*be));
  }
  r.params.resize(P);
  be->download(r.params.data(), p, P);
  return r;
}

PrecisionConfig mxfp8(Rounding r) {
  PrecisionConfig p;
  p.weight = p.activation = p.grad = p.ln_affine = NumFmt::mxfp8_e4m3;
  p.rounding = r;
  p.elementwise_rounding = Rounding::nearest_away;
  return p;
}

TEST(ProducerQuantGpu, TrainingStepsAreBitIdenticalWithAndWithout) {
  MXLAB_REQUIRE_GPU();
  constexpr int kSteps = 5;  // eager, recorded, 3 replays
  for (Rounding r : {Rounding::nearest_away, Rounding::nearest_even}) {
    SCOPED_TRACE(name(r));
    const TrainResult on = train(true, mxfp8(r), kSteps, false), off = train(false, mxfp8(r), kSteps, false);
    ASSERT_EQ(on.params.size(), off.params.size());
    EXPECT_EQ(std::memcmp(on.params.data(), off.params.data(), on.params.size() * sizeof(float)), 0)
        << "parameters differ with producer-side quantization";
    // The recorded step (the second) takes y, a and dh of both layers, the dA that layer 1's add
    // writes for layer 0, and 10 operands quantized ahead (W1 and W2 of both layers in the forward
    // and in the backward, and the dW1 GEMM's y); replays issue nothing. The
    // first, eager step sizes the GEMM workspaces as it goes: a GEMM that grows its lane's
    // workspace drops what the producer before it held (the GEMM then quantizes that operand
    // itself), so it may take fewer.
    ASSERT_EQ(on.hits.size(), static_cast<size_t>(kSteps));
    EXPECT_GE(on.hits[0], 1);
    EXPECT_LE(on.hits[0], 2 * 3 + 1 + 10);
    EXPECT_EQ(on.hits[1] - on.hits[0], 2 * 3 + 1 + 10);
    EXPECT_EQ(on.hits.back(), on.hits[1]);
    EXPECT_EQ(off.hits.back(), 0);
    std::printf("[producer quant] %s: %d steps bit-identical, operands taken from producers: %lld in the eager "
                "step, %lld in the recorded one\n",
                name(r), kSteps, static_cast<long long>(on.hits[0]),
                static_cast<long long>(on.hits[1] - on.hits[0]));
  }
}

// Per-GEMM precision: with the wgrad GEMMs' dY in bf16 (precision.grad_wgrad) the dgrad GEMMs'
// dY (dA, dh) are still quantized by their producers, as many operands as under the uniform
// policy are taken, and the steps are bit-identical with and without.
TEST(ProducerQuantGpu, PerGemmPolicyIsBitIdenticalWithAndWithout) {
  MXLAB_REQUIRE_GPU();
  constexpr int kSteps = 5;
  PrecisionConfig p = mxfp8(Rounding::nearest_away);
  p.grad_wgrad = NumFmt::bf16;
  const TrainResult on = train(true, p, kSteps, false), off = train(false, p, kSteps, false);
  ASSERT_EQ(on.params.size(), off.params.size());
  EXPECT_EQ(std::memcmp(on.params.data(), off.params.data(), on.params.size() * sizeof(float)), 0)
      << "parameters differ with producer-side quantization";
  ASSERT_EQ(on.hits.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(on.hits[1] - on.hits[0], 2 * 3 + 1 + 10);
  EXPECT_EQ(off.hits.back(), 0);
  const TrainResult uniform = train(true, mxfp8(Rounding::nearest_away), kSteps, false);
  EXPECT_NE(std::memcmp(on.params.data(), uniform.params.data(), on.params.size() * sizeof(float)), 0)
      << "grad_wgrad bf16 trained like the uniform policy";
}

// precision.rotation: a rotated operand is never taken from a producer or from prequantize() (they
// hold the unrotated tensor's quantization); the others still are, and the steps are bit-identical
// with and without. Wgrad rotated: all but the dW1 GEMMs' y (2 of the 17); every GEMM rotated: none.
TEST(ProducerQuantGpu, RotatedPolicyIsBitIdenticalWithAndWithout) {
  MXLAB_REQUIRE_GPU();
  constexpr int kSteps = 5;
  PrecisionConfig wgrad = mxfp8(Rounding::nearest_away);
  wgrad.rotation[static_cast<size_t>(Gemm::wgrad)] = Rotation::hadamard;
  PrecisionConfig all = mxfp8(Rounding::nearest_away);
  all.rotation.fill(Rotation::random_hadamard);
  for (const auto& [policy, taken] : {std::make_pair(wgrad, 2 * 3 + 1 + 10 - 2), std::make_pair(all, 0)}) {
    const TrainResult on = train(true, policy, kSteps, false), off = train(false, policy, kSteps, false);
    ASSERT_EQ(on.params.size(), off.params.size());
    EXPECT_EQ(std::memcmp(on.params.data(), off.params.data(), on.params.size() * sizeof(float)), 0)
        << "parameters differ with producer-side quantization (" << taken << ")";
    ASSERT_EQ(on.hits.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(on.hits[1] - on.hits[0], taken);
    EXPECT_EQ(on.hits.back(), on.hits[1]);
  }
}

TEST(ProducerQuantGpu, StatisticsAndStochasticPassesKeepTheSeparatePass) {
  MXLAB_REQUIRE_GPU();
  {  // statistics slots on y, a, dh and dA as the forward GEMMs and the da / dy GEMMs read them:
     // those operands are counted by their GEMM's quantizer; the ones without slots (the weights,
     // and y as the dW1 GEMM reads it) are still quantized ahead, 10 per step
    const TrainResult on = train(true, mxfp8(Rounding::nearest_even), 2, true);
    const TrainResult off = train(false, mxfp8(Rounding::nearest_even), 2, true);
    EXPECT_EQ(std::memcmp(on.params.data(), off.params.data(), on.params.size() * sizeof(float)), 0);
    EXPECT_EQ(on.hits.back(), 2 * 10);
  }
  {  // stochastic rounding: not covered by the producers, nor quantized ahead
    const TrainResult on = train(true, mxfp8(Rounding::stochastic), 3, false);
    const TrainResult off = train(false, mxfp8(Rounding::stochastic), 3, false);
    EXPECT_EQ(std::memcmp(on.params.data(), off.params.data(), on.params.size() * sizeof(float)), 0);
    EXPECT_EQ(on.hits.back(), 0);
  }
}

}  // namespace
}  // namespace mxlab
