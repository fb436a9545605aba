// Per-GEMM precision on CUDA, bit for bit against the CPU: in an MX training step whose wgrad
// GEMMs read dY under another format than its dgrad GEMMs (precision.grad_wgrad bf16, or MXFP6
// E3M2 with a stochastic rounding of its own, beside grad MXFP8 E4M3), every GEMM operand the
// model builds is quantized by the CUDA GEMM path to exactly the CPU's values. The step (L = 2,
// d = 64, B = 96) runs on the CPU, recording each gemm() call's operands and the tensors they
// read at that moment; each operand is then multiplied on both backends by the identity
// (C = Q(op) I^T: one exact product per output element, whatever the accumulation order or the
// GEMM path), which shows the quantized operand itself. The wgrad and dgrad operands of one
// tensor (dA, dh) must differ, so the split is really there.
// Whole-model CPU/CUDA agreement under these policies: ModelParity.PerGemmPolicyMatchesCpu
// (within budgets: the accumulation order differs); a CUDA arm against its single-arm run:
// ArmsGpu.PerGemmArmsEqualTheirSingleRuns; producer-side quantization on and off:
// ProducerQuantGpu.PerGemmPolicyIsBitIdenticalWithAndWithout. The same for the E3 recipes
// (noise instead of rounding, stochastic rounding of dY): EveryOperandOfANoiseStepEqualsTheCpus.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/config/config.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

// The CPU backend, recording every gemm() call: its shape, operands and the stored tensors
// they read (copied at the call).
class RecordingBackend final : public Backend {
 public:
  std::unique_ptr<Backend> in = make_cpu_backend();
  struct Operand {
    GemmOperand op;
    int64_t rows = 0, K = 0;    // logical [rows x K]
    std::vector<float> stored;  // as stored: [rows x K] when k_contiguous, else [K x rows]
  };
  struct Call {
    Operand a, b;
  };
  std::vector<Call> calls;

  std::string name() const override { return "recording-cpu"; }
  std::string math_mode() const override { return in->math_mode(); }
  float* alloc(size_t n) override { return in->alloc(n); }
  void upload(float* d, const float* s, size_t n) override { in->upload(d, s, n); }
  void download(float* d, const float* s, size_t n) override { in->download(d, s, n); }
  void copy(float* d, const float* s, size_t n) override { in->copy(d, s, n); }
  void fill(float* d, float v, size_t n) override { in->fill(d, v, n); }
  void set_step(const StepScalars& s) override { in->set_step(s); }
  void randn(float* o, size_t n, uint64_t s, Stream st, float sc) override { in->randn(o, n, s, st, sc); }
  void add_randn(float* o, size_t n, uint64_t s, Stream st, float sc) override { in->add_randn(o, n, s, st, sc); }
  void quantize(const float* i, float* o, int64_t r, int64_t c, Axis ax, const QuantSpec& q, int slot) override {
    in->quantize(i, o, r, c, ax, q, slot);
  }
  void round_bf16(float* x, size_t n, Rounding m) override { in->round_bf16(x, n, m); }
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
            const ElementwiseRound& out) override {
    calls.push_back({record(a, M, K), record(b, N, K)});
    in->gemm(M, N, K, a, b, C, beta, out);
  }
  void layernorm_fwd(const float* x, const float* g, const float* b, float* y, float* xh, float* rs, int64_t r,
                     int64_t d, float eps, const ElementwiseRound& R, const GemmOperand* q) override {
    in->layernorm_fwd(x, g, b, y, xh, rs, r, d, eps, R, q);
  }
  void layernorm_bwd(const float* dy, const float* xh, const float* rs, const float* g, float* dx, float* dg,
                     float* db, int64_t r, int64_t d, const ElementwiseRound& R, const ElementwiseRound& Rdy) override {
    in->layernorm_bwd(dy, xh, rs, g, dx, dg, db, r, d, R, Rdy);
  }
  void act_fwd(Act a, const float* h, float* o, int64_t r, int64_t c, const ElementwiseRound& R,
               const ElementwiseRound& Rh, const GemmOperand* q) override {
    in->act_fwd(a, h, o, r, c, R, Rh, q);
  }
  void act_bwd(Act a, const float* h, const float* da, float* dh, int64_t r, int64_t c, const ElementwiseRound& R,
               const ElementwiseRound& Rh, const ElementwiseRound& Rda, const GemmOperand* q) override {
    in->act_bwd(a, h, da, dh, r, c, R, Rh, Rda, q);
  }
  void residual_add(float* o, const float* x, const float* y, const float* b, int64_t r, int64_t d,
                    const ElementwiseRound& R, const ElementwiseRound& Ry) override {
    in->residual_add(o, x, y, b, r, d, R, Ry);
  }
  void col_sum(const float* x, float* o, int64_t r, int64_t d) override { in->col_sum(x, o, r, d); }
  void add(float* d, const float* a, const float* b, size_t n, const ElementwiseRound& R, const GemmOperand* q,
           int64_t qc) override {
    in->add(d, a, b, n, R, q, qc);
  }
  void loss_mse(const float* o, const float* t, float* d, float* l, float* h, int64_t r, int64_t c,
                const ElementwiseRound& R) override {
    in->loss_mse(o, t, d, l, h, r, c, R);
  }
  void loss_kl(const float* o, const float* t, float* d, float* l, float* h, int64_t r, int64_t c, float T,
               const ElementwiseRound& R) override {
    in->loss_kl(o, t, d, l, h, r, c, T, R);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) override {
    in->adam(p, g, m, v, n, h);
  }
  void sgd(float* p, const float* g, float* b, size_t n, float m, float wd) override { in->sgd(p, g, b, n, m, wd); }
  void reduce(const Reduction* r, size_t c, double* o) override { in->reduce(r, c, o); }
  float read_scalar(const float* p) override { return in->read_scalar(p); }
  void moments(const float* x, size_t n, double o[4]) override { in->moments(x, n, o); }
  void reset_stats(int s) override { in->reset_stats(s); }
  std::vector<QuantStats> read_stats() override { return in->read_stats(); }

 private:
  Operand record(const GemmOperand& op, int64_t rows, int64_t K) {
    Operand r{op, rows, K, std::vector<float>(static_cast<size_t>(rows * K))};
    in->download(r.stored.data(), op.p, r.stored.size());
    return r;
  }
};

// Q(op) as the backend's GEMM path quantizes it: C [rows x K] = op . I_K^T, with op read from a
// copy of the recorded tensor (no statistics slot, not prequantized) and I in bf16 (exact).
std::vector<float> quantized_operand(Backend& be, const RecordingBackend::Operand& o) {
  const int64_t K = o.K;
  float* x = be.alloc(o.stored.size());
  be.upload(x, o.stored.data(), o.stored.size());
  std::vector<float> eye(static_cast<size_t>(K * K), 0.0f);
  for (int64_t i = 0; i < K; ++i) eye[static_cast<size_t>(i * K + i)] = 1.0f;
  float* I = be.alloc(eye.size());
  be.upload(I, eye.data(), eye.size());
  float* C = be.alloc(static_cast<size_t>(o.rows * K));
  GemmOperand a = o.op;
  a.p = x;
  a.prequantized = false;
  a.stats_slot = -1;
  GemmOperand b;
  b.p = I;
  b.k_contiguous = true;
  b.q.fmt = NumFmt::bf16;
  be.gemm(o.rows, K, K, a, b, C, 0.0f, ElementwiseRound{});
  std::vector<float> out(static_cast<size_t>(o.rows * K));
  be.download(out.data(), C, out.size());
  return out;
}

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

void check_policy(const PrecisionConfig& policy, const char* label) {
  SCOPED_TRACE(label);
  RunConfig c;
  c.seed = 7;
  c.model.depth = 2;
  c.model.width = 64;
  c.model.activation = Act::gelu;
  c.data.batch = 96;
  const NetShape S = NetShape::student(c.model, 1);
  const int64_t B = c.data.batch, n = B * S.d;
  const std::vector<float> init = init_params(S, c.model.init, c.model.init_gain, c.seed, Stream::init);
  RecordingBackend rec;
  auto gpu = make_cuda_backend(0);
  const StepScalars st{3, 1e-3f, 0.271f, 0.004f};
  rec.set_step(st);
  gpu->set_step(st);
  float* P = rec.alloc(init.size());
  rec.upload(P, init.data(), init.size());
  float *X = rec.alloc(static_cast<size_t>(n)), *T = rec.alloc(static_cast<size_t>(n));
  rec.randn(X, static_cast<size_t>(n), c.seed, Stream::data, 1.0f);
  rec.randn(T, static_cast<size_t>(n), c.seed, Stream::label_noise, 1.0f);
  float* G = rec.alloc(init.size());
  Workspace ws = Workspace::make(rec, S, B);
  PassPolicy pol;
  pol.p = policy;
  pol.seed = c.seed;
  forward(rec, S, P, X, ws, pol);
  loss_and_grad(rec, c.loss_spec(), T, ws, pol, nullptr);
  backward(rec, S, P, X, ws, G, pol);

  // 2 forward GEMMs per layer, then per layer (last first) dW2, da, dW1, dy.
  ASSERT_EQ(rec.calls.size(), static_cast<size_t>(6 * S.depth));
  int64_t operands = 0, elements = 0;
  for (size_t i = 0; i < rec.calls.size(); ++i) {
    const RecordingBackend::Operand* ops[2] = {&rec.calls[i].a, &rec.calls[i].b};
    for (int j = 0; j < 2; ++j) {
      const std::vector<float> qc = quantized_operand(*rec.in, *ops[j]);
      const std::vector<float> qg = quantized_operand(*gpu, *ops[j]);
      EXPECT_EQ(differing(qc, qg), 0) << "gemm " << i << " operand " << (j ? "B" : "A") << " ("
                                      << name(ops[j]->op.q.fmt) << ")";
      ++operands;
      elements += static_cast<int64_t>(qc.size());
    }
  }
  // The wgrad GEMMs' dY (dW2's dA, dW1's dh) under grad_wgrad, the dgrad GEMMs' (da's, dy's)
  // under grad: one tensor, two different quantizations.
  for (int l = 0; l < S.depth; ++l)
    for (int w = 0; w < 2; ++w) {
      const size_t wi = static_cast<size_t>(2 * S.depth + 4 * l + 2 * w);
      const RecordingBackend::Operand &wg = rec.calls[wi].a, &dg = rec.calls[wi + 1].a;
      EXPECT_EQ(wg.op.p, dg.op.p);
      EXPECT_EQ(wg.op.q.fmt, policy.grad_wgrad_fmt());
      EXPECT_EQ(dg.op.q.fmt, policy.grad);
      // Compare the quantized values elementwise: Q_wgrad(dY)^T is [cols x B], Q_dgrad(dY) [B x cols].
      const std::vector<float> qw = quantized_operand(*gpu, wg), qd = quantized_operand(*gpu, dg);
      const int64_t rows = dg.rows, cols = dg.K;  // dY is [B x cols]
      ASSERT_EQ(wg.rows, cols);
      int64_t diff = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k)
          diff += std::memcmp(&qw[static_cast<size_t>(k * rows + r)], &qd[static_cast<size_t>(r * cols + k)],
                              sizeof(float)) != 0;
      EXPECT_GT(diff, rows * cols / 10) << "layer " << l << (w ? " dh" : " dA")
                                        << ": the wgrad and dgrad operands should differ";
    }
  std::printf("[per-gemm %s] %lld GEMM operands (%lld elements) bit-identical on CPU and CUDA\n", label,
              static_cast<long long>(operands), static_cast<long long>(elements));
}

TEST(PerGemmGpu, EveryOperandOfASplitGradientStepEqualsTheCpus) {
  MXLAB_REQUIRE_GPU();
  PrecisionConfig p;  // MXFP8 E4M3 everywhere
  p.rounding = Rounding::nearest_away;
  p.elementwise_rounding = Rounding::nearest_away;
  p.grad_wgrad = NumFmt::bf16;
  check_policy(p, "grad mxfp8_e4m3, grad_wgrad bf16");
  p.grad_wgrad = NumFmt::mxfp6_e3m2;
  p.rounding_grad_wgrad = Rounding::stochastic;
  check_policy(p, "grad mxfp8_e4m3, grad_wgrad mxfp6_e3m2 stochastic");
}

// The causal study's E3 recipes (experiments/paper/why_mx_e3.yaml): noise_mx (every MX role under
// `rounding: noise`, FP32 element-wise ops: the operands take the FP32 path of the CUDA GEMM) and
// mx_sr_grad (dY stochastically rounded). The wgrad and dgrad operands of dY differ through their
// own random streams (op ids) here.
TEST(PerGemmGpu, EveryOperandOfANoiseStepEqualsTheCpus) {
  MXLAB_REQUIRE_GPU();
  PrecisionConfig p;  // MXFP8 E4M3 everywhere
  p.rounding = Rounding::noise;
  p.elementwise_bf16 = false;
  check_policy(p, "noise_mx: mxfp8_e4m3 noise, element-wise fp32");
  PrecisionConfig sr;
  sr.rounding = Rounding::nearest_away;
  sr.elementwise_rounding = Rounding::nearest_away;
  sr.rounding_grad = Rounding::stochastic;
  check_policy(sr, "mx_sr_grad: grad stochastic");
}

// precision.rotation: every operand of a step whose GEMMs rotate their operands along K (deterministic
// Hadamard on all three GEMMs; random Hadamard with stochastic rounding of the gradients, the E4
// recipe) is rotated and quantized by the CUDA GEMM path to exactly the CPU's values.
TEST(PerGemmGpu, EveryOperandOfARotatedStepEqualsTheCpus) {
  MXLAB_REQUIRE_GPU();
  PrecisionConfig p;  // MXFP8 E4M3 everywhere
  p.rounding = Rounding::nearest_away;
  p.elementwise_rounding = Rounding::nearest_away;
  p.rotation.fill(Rotation::hadamard);
  check_policy(p, "rotation hadamard");
  p.rotation.fill(Rotation::random_hadamard);
  p.rounding_grad = Rounding::stochastic;
  check_policy(p, "rotation random_hadamard, stochastic gradients");
}

}  // namespace
}  // namespace mxlab
