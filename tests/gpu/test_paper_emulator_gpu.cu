// The paper's emulator op by op (lab/model/README.md, "The paper's emulator"), CUDA against the
// CPU reference: the library's GeLU in vector ops (act_fwd / act_bwd with Act::gelu_vector, with
// and without an MX operand written by the producer), its LayerNorm in vector ops
// (layernorm_vec_fwd / _bwd: one thread per row and per column running the CPU's row and column
// functions, so every double sum runs in the CPU's order) and residual_add_r: all bit for bit.
// Then whole MX steps under the paper_emulator preset (and with the library's GeLU and residual
// add), CUDA against CPU: the GEMMs' FP32 accumulation orders differ (cuBLAS, Eigen), so the
// budget is test_model_parity.cu's for MX policies: the cross-backend gradient difference within
// 5 % of the MX gradient's distance from the FP32 gradient, the loss within 1e-3 relative; and a
// step recorded as a CUDA graph and replayed gives the eager step's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/config/config.h"
#include "lab/config/config_io.h"
#include "tests/gpu/backend_twin.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using gputest::Buf;
using gputest::normal;
using gputest::same_bits;
using gputest::Twin;

const ElementwiseRound kR{true, Rounding::nearest_away};
const ElementwiseRound kNone{};

// Values over many binades (the vector GeLU's exp and its saturation at both ends), not bf16.
std::vector<float> spread(size_t n, uint64_t seed) {
  std::vector<float> v = normal(n, seed, 2.0f);
  for (size_t i = 0; i < n; ++i) v[i] *= std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
  return v;
}

TEST(PaperEmulatorGpu, GeluVectorBitForBit) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 70, cols = 192;
  const size_t n = static_cast<size_t>(rows * cols);
  Buf h = t.make(spread(n, 1)), da = t.make(normal(n, 2)), a = t.poisoned(n), dh = t.poisoned(n);
  for (const ElementwiseRound& r : {kR, ElementwiseRound{true, Rounding::nearest_even}, kNone}) {
    for (const ElementwiseRound& in : {kR, kNone}) {
      SCOPED_TRACE(msg("r.bf16 ", r.bf16, " mode ", static_cast<int>(r.mode), " in.bf16 ", in.bf16));
      t.poison(a);
      t.poison(dh);
      t.cpu->act_fwd(Act::gelu_vector, h.c, a.c, rows, cols, r, in);
      t.gpu->act_fwd(Act::gelu_vector, h.g, a.g, rows, cols, r, in);
      t.cpu->act_bwd(Act::gelu_vector, h.c, da.c, dh.c, rows, cols, r, in, in);
      t.gpu->act_bwd(Act::gelu_vector, h.g, da.g, dh.g, rows, cols, r, in, in);
      EXPECT_TRUE(same_bits(t.host_cpu(a), t.host_gpu(a)));
      EXPECT_TRUE(same_bits(t.host_cpu(dh), t.host_gpu(dh)));
    }
  }
}

TEST(PaperEmulatorGpu, LayernormVectorBitForBit) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  for (int64_t d : {64, 96, 512}) {
    SCOPED_TRACE(msg("d = ", d));
    const int64_t rows = 150;
    const size_t n = static_cast<size_t>(rows * d);
    std::vector<float> x = normal(n, 3, 1.5f, 0.2f);
    for (int64_t i = 0; i < rows; ++i)  // rows of different scale and offset
      for (int64_t j = 0; j < d; ++j) x[i * d + j] = x[i * d + j] * std::ldexp(1.0f, static_cast<int>(i % 7) - 3) + 0.1f * i;
    std::vector<float> g = normal(d, 4, 0.2f, 1.0f), b = normal(d, 5, 0.1f);
    Buf X = t.make(x), G = t.make(g), Bb = t.make(b), DY = t.make(normal(n, 6));
    Buf Y = t.poisoned(n), XN = t.poisoned(n), VE = t.poisoned(rows), DX = t.poisoned(n), DG = t.poisoned(d),
        DB = t.poisoned(d);
    for (const ElementwiseRound& r : {kR, kNone}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(msg("bf16 ", r.bf16, " affine ", affine));
        const float* gc = affine ? G.c : nullptr;
        const float* gg = affine ? G.g : nullptr;
        t.cpu->layernorm_vec_fwd(X.c, gc, affine ? Bb.c : nullptr, Y.c, XN.c, VE.c, rows, d, 1e-5f, r);
        t.gpu->layernorm_vec_fwd(X.g, gg, affine ? Bb.g : nullptr, Y.g, XN.g, VE.g, rows, d, 1e-5f, r);
        EXPECT_TRUE(same_bits(t.host_cpu(Y), t.host_gpu(Y)));
        EXPECT_TRUE(same_bits(t.host_cpu(XN), t.host_gpu(XN)));
        EXPECT_TRUE(same_bits(t.host_cpu(VE), t.host_gpu(VE)));
        t.cpu->layernorm_vec_bwd(DY.c, XN.c, VE.c, gc, DX.c, DG.c, affine ? DB.c : nullptr, rows, d, r, r);
        t.gpu->layernorm_vec_bwd(DY.g, XN.g, VE.g, gg, DX.g, DG.g, affine ? DB.g : nullptr, rows, d, r, r);
        EXPECT_TRUE(same_bits(t.host_cpu(DX), t.host_gpu(DX)));
        EXPECT_TRUE(same_bits(t.host_cpu(DG), t.host_gpu(DG)));
        if (affine) EXPECT_TRUE(same_bits(t.host_cpu(DB), t.host_gpu(DB)));
      }
    }
  }
}

TEST(PaperEmulatorGpu, ResidualAddRBitForBit) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 33, d = 68;  // d % 4 == 0 (the float4 path) and an odd offset below
  const size_t n = static_cast<size_t>(rows * d);
  Buf X = t.make(spread(n, 7)), Y = t.make(spread(n, 8)), Bb = t.make(normal(d, 9)), O = t.poisoned(n);
  const Backend::ResidualRound cases[] = {{kR, kR, kR, kNone}, {kR, kR, kR, kR}, {kR, kNone, kR, kR},
                                          {kNone, kNone, kNone, kNone}};
  for (const Backend::ResidualRound& rr : cases) {
    for (bool bias : {true, false}) {
      t.poison(O);
      t.cpu->residual_add_r(O.c, X.c, Y.c, bias ? Bb.c : nullptr, rows, d, rr);
      t.gpu->residual_add_r(O.g, X.g, Y.g, bias ? Bb.g : nullptr, rows, d, rr);
      EXPECT_TRUE(same_bits(t.host_cpu(O), t.host_gpu(O)));
    }
  }
  // Unaligned slices (the scalar path): start one float in.
  t.cpu->residual_add_r(O.c + 1, X.c + 1, Y.c + 1, Bb.c, rows - 1, d, cases[0]);
  t.gpu->residual_add_r(O.g + 1, X.g + 1, Y.g + 1, Bb.g, rows - 1, d, cases[0]);
  EXPECT_TRUE(same_bits(t.host_cpu(O), t.host_gpu(O)));
}

// ---- whole steps ----

RunConfig step_config() {
  RunConfig c;
  c.seed = 13;
  c.model.depth = 2;
  c.model.width = 64;
  c.model.activation = Act::gelu;
  c.data.batch = 96;
  return c;
}

PrecisionConfig emulator(const std::map<std::string, std::string>& set = {}) {
  PrecisionConfig base;  // MXFP8 E4M3 everywhere
  return apply_intervention(base, InterventionConfig{"t", 0, "paper_emulator", set});
}

struct StepOut {
  std::vector<float> grads, teacher;
  float loss = 0.0f;
};

// One step (MX teacher targets under the policy, then the student's forward, loss, backward) on a
// backend; `graph`: record the step as a CUDA graph and replay it (the trainer's way).
StepOut run(Backend& be, const PrecisionConfig& p, bool graph = false) {
  const RunConfig c = step_config();
  const NetShape S = NetShape::student(c.model), T = NetShape::teacher(c.model, c.teacher);
  const int64_t B = c.data.batch, n = B * S.d;
  const std::vector<float> sp = init_params(S, c.model.init, c.model.init_gain, c.seed, Stream::init);
  const std::vector<float> tp = init_params(T, InitKind::pytorch, 1.0f, c.seed, Stream::teacher_init);
  float *P = be.alloc(sp.size()), *TP = be.alloc(tp.size()), *G = be.alloc(sp.size()), *x = be.alloc(n);
  be.upload(P, sp.data(), sp.size());
  be.upload(TP, tp.data(), tp.size());
  Workspace ws = Workspace::make(be, S, B), wt = Workspace::make(be, T, B);
  PassPolicy pol;
  pol.p = p;
  pol.seed = c.seed;
  StepScalars sc;
  be.set_step(sc);
  auto step = [&] {
    be.randn(x, static_cast<size_t>(n), c.seed, Stream::data, 1.0f);
    forward(be, T, TP, x, wt, pol);
    forward(be, S, P, x, ws, pol);
    loss_and_grad(be, c.loss_spec(), wt.out, ws, pol, nullptr);
    backward(be, S, P, x, ws, G, pol);
  };
  if (graph) {
    for (int i = 0; i < 3; ++i) {  // eager, recorded, replayed
      if (!be.replay(7)) {
        const bool rec = be.begin_capture(7);
        step();
        be.end_capture(7);
        if (rec) be.replay(7);
      }
    }
  } else {
    step();
  }
  StepOut o;
  o.grads.resize(sp.size());
  be.download(o.grads.data(), G, sp.size());
  o.teacher.resize(static_cast<size_t>(n));
  be.download(o.teacher.data(), wt.out, static_cast<size_t>(n));
  o.loss = be.read_scalar(ws.loss);
  return o;
}

double dist(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

TEST(PaperEmulatorGpu, StepsAgreeWithTheCpu) {
  MXLAB_REQUIRE_GPU();
  const std::pair<const char*, PrecisionConfig> policies[] = {
      {"paper_emulator", emulator()},
      {"paper_emulator, gelu vector, residual elementwise", emulator({{"gelu", "vector"}, {"residual", "elementwise"}})}};
  for (const auto& [label, p] : policies) {
    SCOPED_TRACE(label);
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend(0);
    const StepOut c = run(*cpu, p), g = run(*gpu, p);
    const StepOut f = run(*cpu, PrecisionConfig::fp32());
    const double cross = dist(c.grads, g.grads), bias = dist(c.grads, f.grads);
    std::printf("[paper emulator] %s: loss cpu %.9g gpu %.9g; ||g_gpu - g_cpu|| = %.3g, ||g_mx - g_fp32|| = %.3g\n",
                label, double(c.loss), double(g.loss), cross, bias);
    EXPECT_LE(std::fabs(double(c.loss) - g.loss), 1e-3 * std::fabs(double(c.loss)));
    EXPECT_LE(cross, 0.05 * bias);
    // The MX teacher's targets: GEMMs on both sides again, same budget against the FP32 teacher.
    EXPECT_LE(dist(c.teacher, g.teacher), 0.05 * dist(c.teacher, f.teacher) + 1e-30);
  }
}

TEST(PaperEmulatorGpu, RecordedStepEqualsEagerStep) {
  MXLAB_REQUIRE_GPU();
  auto a = make_cuda_backend(0), b = make_cuda_backend(0);
  const StepOut eager = run(*a, emulator()), graph = run(*b, emulator(), true);
  EXPECT_EQ(std::memcmp(eager.grads.data(), graph.grads.data(), eager.grads.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(eager.teacher.data(), graph.teacher.data(), eager.teacher.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace mxlab
