// Attention blocks and RMS/MX norms on the CPU reference: the new backend ops on
// tiny hand-worked inputs, the batched GEMM against per-item GEMMs, the model's layout,
// statistics slots and roles, and the trainer's attention datasets. The FP32 forward and every
// gradient are checked against PyTorch autograd by tests/torch/crosscheck.py (ctest
// torch_crosscheck); the GPU twins by tests/gpu/test_cuda_backend.cu and test_model_parity.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/elementwise.h"
#include "lab/model/mlp.h"
#include "lab/mx/quantize.h"
#include "lab/config/config_io.h"
#include "lab/train/trainer.h"

using namespace mxlab;

namespace {

const ElementwiseRound kFp32{};
const ElementwiseRound kBf16{true, Rounding::nearest_even};

std::vector<float> noise(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * randn_elem(seed, Stream::validation, 0, i);
  return v;
}

// A host buffer the CPU backend can use directly (its memory is host memory).
struct Host {
  std::vector<float> v;
  explicit Host(std::vector<float> x) : v(std::move(x)) {}
  Host(std::initializer_list<float> x) : v(x) {}
  explicit Host(int64_t n, float fill = std::nanf("")) : v(static_cast<size_t>(n), fill) {}
  float* p() { return v.data(); }
};

TEST(AttentionOps, HeadsSplitAndMergeFollowTheDocumentedIndex) {
  auto be = make_cpu_backend();
  const int64_t nb = 2, S = 3, h = 2, dh = 2, ld = 3 * h * dh + 1, col0 = h * dh;  // K's columns of a [nb*S x ld]
  Host x(nb * S * ld, 0.0f);
  for (size_t i = 0; i < x.v.size(); ++i) x.v[i] = static_cast<float>(i);
  Host heads(nb * h * S * dh);
  be->heads_split(x.p(), heads.p(), nb, S, h, dh, ld, col0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t c = 0; c < dh; ++c)
          EXPECT_EQ(heads.v[((b * h + j) * S + s) * dh + c], x.v[(b * S + s) * ld + col0 + j * dh + c]);
  Host y(nb * S * ld, -1.0f);
  be->heads_merge(heads.p(), y.p(), nb, S, h, dh, ld, col0);
  for (int64_t r = 0; r < nb * S; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const bool mine = c >= col0 && c < col0 + h * dh;
      EXPECT_EQ(y.v[r * ld + c], mine ? x.v[r * ld + c] : -1.0f) << r << "," << c;  // other columns untouched
    }
}

TEST(AttentionOps, SoftmaxForwardOnHandWorkedRows) {
  auto be = make_cpu_backend();
  // Row 0: equal logits -> uniform; row 1: (0, 2 ln 3, -huge, 0) at scale 1/2 -> weights
  // (1, 3, 0, 1) -> (0.2, 0.6, 0, 0.2).
  const float l3 = 2.0f * static_cast<float>(std::log(3.0));
  Host logits({1.0f, 1.0f, 1.0f, 1.0f, 0.0f, l3, -1e30f, 0.0f});
  Host rowmax(2);
  be->softmax_fwd(logits.p(), logits.p(), rowmax.p(), 2, 4, 0.5f, kFp32);  // in place
  for (int j = 0; j < 4; ++j) EXPECT_EQ(logits.v[j], 0.25f);
  EXPECT_EQ(rowmax.v[0], 0.5f);
  EXPECT_NEAR(logits.v[4], 0.2f, 1e-6f);
  EXPECT_NEAR(logits.v[5], 0.6f, 1e-6f);
  EXPECT_EQ(logits.v[6], 0.0f);  // exp(-huge) underflows to 0
  EXPECT_NEAR(logits.v[7], 0.2f, 1e-6f);
  EXPECT_EQ(rowmax.v[1], 0.5f * l3);
  // bf16 element-wise: every probability is a bf16 value.
  Host l2({0.3f, -1.7f, 2.2f, 0.9f});
  Host p2(4), m2(1);
  be->softmax_fwd(l2.p(), p2.p(), m2.p(), 1, 4, 1.0f, kBf16);
  for (float p : p2.v) EXPECT_EQ(p, round_bf16(p, Rounding::nearest_even));
}

TEST(AttentionOps, SoftmaxBackwardIsExactOnDyadicInputs) {
  auto be = make_cpu_backend();
  // p = (1/4, 3/4), dp = (1, 0): D = 1/4, dl = p (dp - D) scale = (3/16, -3/16) * scale.
  Host p({0.25f, 0.75f}), dp({1.0f, 0.0f}), dl(2);
  be->softmax_bwd(p.p(), dp.p(), dl.p(), 1, 2, 0.5f, kFp32);
  EXPECT_EQ(dl.v[0], 0.09375f);
  EXPECT_EQ(dl.v[1], -0.09375f);
  be->softmax_bwd(p.p(), dp.p(), dp.p(), 1, 2, 1.0f, kFp32);  // in place over dp
  EXPECT_EQ(dp.v[0], 0.1875f);
  EXPECT_EQ(dp.v[1], -0.1875f);
}

TEST(NormOps, RmsNormForwardAndItsMxNormEstimate) {
  auto be = make_cpu_backend();
  // RMSNorm of (3, 4, 0, 0): ms = 25/4, rstd = 1/2.5; y = xhat * gamma.
  Host x({3.0f, 4.0f, 0.0f, 0.0f}), g({2.0f, 1.0f, 1.0f, -1.0f}), y(4), xh(4), rs(1);
  be->rmsnorm_fwd(x.p(), g.p(), y.p(), xh.p(), rs.p(), 1, 4, 0.0f, Backend::RmsEstimate{}, kFp32);
  EXPECT_EQ(rs.v[0], 1.0f / 2.5f);
  EXPECT_EQ(xh.v[0], 3.0f * (1.0f / 2.5f));
  EXPECT_EQ(y.v[0], xh.v[0] * 2.0f);
  EXPECT_EQ(y.v[3], -0.0f);
  // MXNorm, blocks of 4: absmaxes (2, 3). p = 1: G = 2.5, c = 0.4 -> r = 1 (0.4f * 2.5 rounds to 1),
  // ms = 1, rstd = 1: xhat = x exactly.
  Host x8({1.0f, -2.0f, 0.5f, 0.0f, 3.0f, 0.0f, 0.0f, -1.0f}), y8(8), xh8(8), rs8(1);
  be->rmsnorm_fwd(x8.p(), nullptr, y8.p(), xh8.p(), rs8.p(), 1, 8, 0.0f, Backend::RmsEstimate{4, 1, 0.4f}, kFp32);
  EXPECT_EQ(rs8.v[0], 1.0f);
  EXPECT_EQ(xh8.v, x8.v);
  EXPECT_EQ(y8.v, x8.v);
  // p = 2: G = sqrt((4 + 9) / 2), ms = (c G)^2, rstd = 1 / sqrt(ms + eps).
  be->rmsnorm_fwd(x8.p(), nullptr, y8.p(), xh8.p(), rs8.p(), 1, 8, 1e-5f, Backend::RmsEstimate{4, 2, 0.5f}, kFp32);
  const float r = 0.5f * sqrtf_ieee(6.5f);
  EXPECT_EQ(rs8.v[0], 1.0f / sqrtf_ieee(r * r + 1e-5f));
  // The estimate ignores everything but the block maxima: moving a non-maximal element changes nothing.
  Host x8b = x8;
  x8b.v[2] = -1.9f;
  Host rs8b(1);
  be->rmsnorm_fwd(x8b.p(), nullptr, y8.p(), xh8.p(), rs8b.p(), 1, 8, 1e-5f, Backend::RmsEstimate{4, 2, 0.5f}, kFp32);
  EXPECT_EQ(rs8b.v[0], rs8.v[0]);
  EXPECT_EQ(mxnorm_coefficient(2, 32), 0.4185f);
  EXPECT_THROW(mxnorm_coefficient(2, 8), Error);
}

TEST(NormOps, RmsNormBackwardMatchesTheFormulaInDouble) {
  auto be = make_cpu_backend();
  const int64_t rows = 3, d = 8;
  Host x(noise(rows * d, 1)), g(noise(d, 2, 0.3f)), dy(noise(rows * d, 3)), y(rows * d), xh(rows * d), rs(rows);
  for (float& v : g.v) v += 1.0f;
  be->rmsnorm_fwd(x.p(), g.p(), y.p(), xh.p(), rs.p(), rows, d, 1e-5f, Backend::RmsEstimate{}, kFp32);
  Host dx(rows * d), dg(d);
  be->rmsnorm_bwd(dy.p(), xh.p(), rs.p(), g.p(), dx.p(), dg.p(), rows, d, kFp32);
  for (int64_t i = 0; i < rows; ++i) {
    double ms = 0, sgx = 0;
    for (int64_t j = 0; j < d; ++j) ms += double(x.v[i * d + j]) * x.v[i * d + j] / d;
    const double r = 1.0 / std::sqrt(ms + 1e-5);
    for (int64_t j = 0; j < d; ++j) sgx += double(dy.v[i * d + j]) * g.v[j] * x.v[i * d + j] * r / d;
    for (int64_t j = 0; j < d; ++j) {
      const double want = r * (double(dy.v[i * d + j]) * g.v[j] - x.v[i * d + j] * r * sgx);
      EXPECT_NEAR(dx.v[i * d + j], want, 1e-5 * (1 + std::fabs(want))) << i << "," << j;
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    double want = 0;
    for (int64_t i = 0; i < rows; ++i) want += double(dy.v[i * d + j]) * xh.v[i * d + j];
    EXPECT_NEAR(dg.v[j], want, 1e-6 * (1 + std::fabs(want)));
  }
  be->rmsnorm_bwd(dy.p(), xh.p(), rs.p(), nullptr, dx.p(), nullptr, rows, d, kFp32);  // no gain: g = dy
}

TEST(NormOps, ScaleColsMultipliesEachColumn) {
  auto be = make_cpu_backend();
  Host w({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}), g({0.5f, -2.0f, 3.0f}), out(6);
  be->scale_cols(w.p(), g.p(), out.p(), 2, 3, kFp32);
  EXPECT_EQ(out.v, (std::vector<float>{0.5f, -4.0f, 9.0f, 2.0f, -10.0f, 18.0f}));
  be->scale_cols(w.p(), g.p(), w.p(), 2, 3, kFp32);  // in place
  EXPECT_EQ(w.v, out.v);
}

// The batched GEMM equals per-item GEMMs (CPU: the same product code) in every layout, with MX
// operands whose K-strided blocks stay inside an item (K a multiple of the block), and its
// statistics are the items' summed.
TEST(AttentionOps, BatchedGemmEqualsPerItemGemms) {
  auto be = make_cpu_backend();
  const int64_t batch = 3, M = 5, N = 7, K = 16;
  Host A(noise(batch * M * K, 4)), Bm(noise(batch * N * K, 5, 3.0f));
  QuantSpec q;
  q.fmt = NumFmt::mxfp4_e2m1;
  q.block = 8;
  for (int layout = 0; layout < 4; ++layout) {
    GemmOperand a, b;
    a.k_contiguous = layout & 1;
    b.k_contiguous = layout & 2;
    a.q = b.q = a.stats_q = b.stats_q = q;
    a.round_bf16_first = true;
    Host C(batch * M * N), Ci(batch * M * N);
    be->reset_stats(2);
    a.p = A.p();
    b.p = Bm.p();
    a.stats_slot = 0;
    be->gemm_batched(batch, M, N, K, a, b, C.p(), 0.0f, kBf16);
    for (int64_t i = 0; i < batch; ++i) {
      a.p = A.p() + i * M * K;
      b.p = Bm.p() + i * N * K;
      a.stats_slot = 1;
      be->gemm(M, N, K, a, b, Ci.p() + i * M * N, 0.0f, kBf16);
    }
    EXPECT_EQ(C.v, Ci.v) << "layout " << layout;
    const auto st = be->read_stats();
    EXPECT_EQ(st[0].n, static_cast<uint64_t>(batch * M * K));
    EXPECT_EQ(st[0].lastbin, st[1].lastbin);
    EXPECT_EQ(st[0].clamped, st[1].clamped);
    EXPECT_EQ(st[0].blocks, st[1].blocks);
  }
}

ModelConfig attn_model(NormKind norm) {
  ModelConfig m;
  m.depth = 2;
  m.width = 32;
  m.hidden_mult = 2;
  m.block = BlockKind::attention;
  m.heads = 4;
  m.norm = norm;
  m.mxnorm_block = 16;
  return m;
}

TEST(AttentionModel, LayoutNamesAndShapes) {
  const NetShape s = NetShape::student(attn_model(NormKind::layernorm), 8);
  std::vector<std::string> names;
  for (const ParamGroup& g : s.groups)
    if (g.layer == 0) names.push_back(g.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layer0.attn_gamma", "layer0.attn_beta", "layer0.Wqkv", "layer0.Wo",
                                             "layer0.bo", "layer0.gamma", "layer0.beta", "layer0.W1", "layer0.W2",
                                             "layer0.b2"}));
  EXPECT_EQ(s.find(0, ParamGroup::wqkv)->rows, 96);
  EXPECT_EQ(s.head_dim(), 8);
  // RMSNorm / MXNorm have gains but no bias.
  const NetShape r = NetShape::student(attn_model(NormKind::rmsnorm), 8);
  EXPECT_NE(r.find(1, ParamGroup::attn_gamma), nullptr);
  EXPECT_EQ(r.find(1, ParamGroup::attn_beta), nullptr);
  EXPECT_EQ(r.find(1, ParamGroup::beta), nullptr);
  // The MLP block is what it was: same groups, same statistics tensors.
  ModelConfig mlp = attn_model(NormKind::layernorm);
  mlp.block = BlockKind::mlp;
  EXPECT_EQ(NetShape::student(mlp).groups.size(), 10u);
  EXPECT_EQ(stat_tensors(NetShape::student(mlp)).size(), 6u);
  EXPECT_EQ(stat_tensors(s).size(), static_cast<size_t>(kStatTensors));
  EXPECT_THROW(Workspace::make(*make_cpu_backend(), s, 12), Error);  // not whole sequences of 8
}

// One MX pass of an attention network: every attention statistics slot counts exactly the
// elements of its operand, and the attention roles change what they should.
TEST(AttentionModel, MxStatisticsCountEveryOperandAndRolesMatter) {
  const int64_t S = 8, nb = 3, T = nb * S, d = 32, h = 4;
  RunConfig cfg;
  cfg.model = attn_model(NormKind::layernorm);
  cfg.data.seq_len = static_cast<int>(S);
  const NetShape s = NetShape::student(cfg.model, static_cast<int>(S));
  auto be = make_cpu_backend();
  const std::vector<float> init = init_params(s, InitKind::pytorch, 1.0f, 3, Stream::init);
  Host P(init), X(noise(T * d, 6)), Tg(noise(T * d, 7, 0.5f)), G(init.size());
  auto pass = [&](const PrecisionConfig& p, bool stats) {
    Workspace ws = Workspace::make(*be, s, T);
    PassPolicy pol;
    pol.p = p;
    pol.seed = 9;
    pol.collect_stats = stats;
    be->reset_stats(s.depth * kStatTensors);
    forward(*be, s, P.p(), X.p(), ws, pol);
    loss_and_grad(*be, cfg.loss_spec(), Tg.p(), ws, pol, nullptr);
    backward(*be, s, P.p(), X.p(), ws, G.p(), pol);
    return std::make_pair(be->read_scalar(ws.loss), G.v);
  };
  PrecisionConfig mx;
  mx.block_size = 8;
  pass(mx, true);
  const std::vector<QuantStats> st = be->read_stats();
  const uint64_t td = static_cast<uint64_t>(T * d), probs = static_cast<uint64_t>(nb * h * S * S);
  const std::vector<std::pair<StatTensor, uint64_t>> expect = {
      {StatTensor::attn_ln_out, td}, {StatTensor::attn_q, td},      {StatTensor::attn_k, td},
      {StatTensor::attn_p, probs},   {StatTensor::attn_v, td},      {StatTensor::attn_ctx, td},
      {StatTensor::grad_attn_out, td}, {StatTensor::grad_ctx, td},  {StatTensor::grad_logits, probs},
      {StatTensor::grad_qkv, 3 * td}, {StatTensor::attn_gamma, 32}, {StatTensor::attn_beta, 32},
      {StatTensor::ln_out, td}};
  for (int l = 0; l < s.depth; ++l)
    for (const auto& [t, n] : expect) EXPECT_EQ(st[stats_slot(l, t)].n, n) << name(t) << " layer " << l;
  // Probabilities are in [0, 1]: under E4M3 some land in the last bin (the row maxima of each block).
  EXPECT_GT(st[stats_slot(0, StatTensor::attn_p)].lastbin, 0u);

  const auto base = pass(mx, false);
  ASSERT_TRUE(std::isfinite(base.first));
  for (auto role : {&PrecisionConfig::attn_logits, &PrecisionConfig::attn_probs}) {
    PrecisionConfig p = mx;
    p.*role = NumFmt::mxfp4_e2m1;
    EXPECT_NE(pass(p, false).second, base.second) << "an attention role changed nothing";
  }
  PrecisionConfig same = mx;
  same.attn_logits = same.attn_probs = NumFmt::mxfp8_e4m3;  // explicit, equal to `same`
  EXPECT_EQ(pass(same, false).second, base.second);
}

// MXNorm under MX: its gain is folded into the next weight (not applied to the activation), so
// the result differs from RMSNorm's; in FP32 both are finite and the gains get gradients.
TEST(AttentionModel, MxNormFoldsItsGainIntoTheWeight) {
  const int64_t S = 16, T = 2 * S, d = 32;
  RunConfig cfg;
  cfg.data.seq_len = static_cast<int>(S);
  auto be = make_cpu_backend();
  for (BlockKind block : {BlockKind::mlp, BlockKind::attention}) {
    std::vector<std::vector<float>> grads;
    for (NormKind norm : {NormKind::rmsnorm, NormKind::mxnorm}) {
      cfg.model = attn_model(norm);
      cfg.model.block = block;
      const NetShape s = NetShape::student(cfg.model, static_cast<int>(S));
      std::vector<float> init = init_params(s, InitKind::pytorch, 1.0f, 3, Stream::init);
      for (const ParamGroup& g : s.groups)  // gains off 1, so that folding them matters
        if (g.kind == ParamGroup::gamma || g.kind == ParamGroup::attn_gamma)
          for (int64_t i = 0; i < g.size(); ++i) init[g.offset + i] = 1.0f + 0.5f * noise(1, g.offset + i)[0];
      Host P(init), X(noise(T * d, 6, 2.0f)), Tg(noise(T * d, 7, 0.5f)), G(init.size());
      Workspace ws = Workspace::make(*be, s, T);
      PassPolicy pol;
      pol.p.block_size = 16;
      forward(*be, s, P.p(), X.p(), ws, pol);
      loss_and_grad(*be, cfg.loss_spec(), Tg.p(), ws, pol, nullptr);
      backward(*be, s, P.p(), X.p(), ws, G.p(), pol);
      ASSERT_TRUE(std::isfinite(be->read_scalar(ws.loss)));
      for (const ParamGroup& g : s.groups) {
        double n = 0;
        for (int64_t i = 0; i < g.size(); ++i) n += double(G.v[g.offset + i]) * G.v[g.offset + i];
        EXPECT_GT(n, 0.0) << g.name;
      }
      grads.push_back(G.v);
    }
    EXPECT_NE(grads[0], grads[1]);
  }
}

// Every layer's norms read their own gains in the backward (the forward keeps Q(gamma) per layer
// and norm site, and the backward reuses it): the gains' gradients of a 2-layer attention student
// in FP32, with a different gamma in every layer and site, match central differences of the
// loss. Reading another layer's or site's gains moves them by far more than the tolerance (an
// earlier build that read layer 0's attention gains in every layer passed every other test).
TEST(AttentionModel, GainGradientsOfEveryLayerAndSiteMatchFiniteDifferences) {
  const int64_t S = 8, T = 2 * S, d = 32;
  RunConfig cfg;
  cfg.data.seq_len = static_cast<int>(S);
  cfg.model = attn_model(NormKind::layernorm);
  const NetShape s = NetShape::student(cfg.model, static_cast<int>(S));
  auto be = make_cpu_backend();
  std::vector<float> init = init_params(s, InitKind::pytorch, 1.0f, 3, Stream::init);
  for (const ParamGroup& g : s.groups)
    if (g.kind == ParamGroup::gamma || g.kind == ParamGroup::attn_gamma)
      for (int64_t i = 0; i < g.size(); ++i) init[g.offset + i] = 1.0f + 0.5f * noise(1, 977 + g.offset + i)[0];
  Host X(noise(T * d, 6, 2.0f)), Tg(noise(T * d, 7, 0.5f)), G(static_cast<int64_t>(init.size()));
  Workspace ws = Workspace::make(*be, s, T);
  PassPolicy pol;
  pol.p.weight = pol.p.activation = pol.p.grad = pol.p.ln_affine = NumFmt::fp32;
  pol.p.elementwise_bf16 = false;
  auto loss_at = [&](std::vector<float> params) {
    forward(*be, s, params.data(), X.p(), ws, pol);
    loss_and_grad(*be, cfg.loss_spec(), Tg.p(), ws, pol, nullptr);
    return static_cast<double>(be->read_scalar(ws.loss));
  };
  Host P(init);
  forward(*be, s, P.p(), X.p(), ws, pol);
  loss_and_grad(*be, cfg.loss_spec(), Tg.p(), ws, pol, nullptr);
  backward(*be, s, P.p(), X.p(), ws, G.p(), pol);
  int checked = 0;
  for (const ParamGroup& g : s.groups) {
    if (g.kind != ParamGroup::gamma && g.kind != ParamGroup::attn_gamma) continue;
    double num = 0, den = 0;
    for (int64_t i = 0; i < g.size(); ++i) {
      const float h = 1e-2f;
      std::vector<float> up = init, dn = init;
      up[g.offset + i] += h;
      dn[g.offset + i] -= h;
      const double fd = (loss_at(up) - loss_at(dn)) / (static_cast<double>(up[g.offset + i]) - dn[g.offset + i]);
      const double an = G.v[g.offset + i];
      num += (an - fd) * (an - fd);
      den += fd * fd;
    }
    ASSERT_GT(den, 0.0) << g.name;
    EXPECT_LT(std::sqrt(num / den), 2e-2) << g.name;
    ++checked;
  }
  EXPECT_EQ(checked, 2 * s.depth);
}

RunConfig tiny_attention_run() {
  RunConfig c;
  c.seed = 4;
  c.steps = 6;
  c.device = "cpu";
  c.model = attn_model(NormKind::layernorm);
  c.data.batch = 3;
  c.data.seq_len = 8;
  c.precision.block_size = 8;
  c.log.log_every = 2;
  c.log.progress = false;
  return c;
}

TEST(AttentionTrainer, WritesAttentionStatisticsAndLogitMax) {
  auto be = make_cpu_backend();
  MemorySink sink;
  {
    Trainer tr(tiny_attention_run(), *be, sink);
    tr.open_output();
    tr.finish(tr.run(RunControl{}));
  }
  const auto& mx = sink.groups.at("trajectories/mx");
  ASSERT_FALSE(mx.rows.empty());
  std::set<std::string> cols;  // of the first logged row (not the shadow_step series)
  const auto first = std::find_if(mx.rows.begin(), mx.rows.end(), [](const MetricRow& r) { return r.axis == "step"; });
  ASSERT_NE(first, mx.rows.end());
  for (const auto& [name, v] : first->cols) cols.insert(name);
  for (const char* want : {"attn_q_lastbin", "attn_p_clamped", "grad_logits_lastbin", "attn_gamma_lastbin",
                           "ln_out_lastbin", "attn_logit_max"})
    EXPECT_TRUE(cols.count(want)) << want;
  EXPECT_TRUE(mx.dataset_attrs.count("attn_v_lastbin"));
  EXPECT_EQ(mx.dataset_attrs.at("attn_q_lastbin").ints.at("quantized"), 1);
  EXPECT_EQ(sink.groups.at("trajectories/fp32").dataset_attrs.at("attn_p_lastbin").ints.at("quantized"), 0);
  for (const auto& row : mx.rows)
    for (const auto& [name, v] : row.cols)
      if (name == "attn_logit_max") {
        ASSERT_EQ(v.size(), 2u);
        for (double m : v) EXPECT_TRUE(std::isfinite(m) && m > 0.0) << m;
      }
  EXPECT_EQ(sink.root.str.at("status"), "complete");

  // An MLP run has none of these (its files are what they were).
  RunConfig mlp = tiny_attention_run();
  mlp.model.block = BlockKind::mlp;
  MemorySink s2;
  Trainer t2(mlp, *be, s2);
  t2.open_output();
  t2.finish(t2.run(RunControl{}));
  size_t logged = 0;
  for (const MetricRow& r : s2.groups.at("trajectories/mx").rows) {
    if (r.axis != "step") continue;
    ++logged;
    for (const auto& [name, v] : r.cols) EXPECT_EQ(name.find("attn"), std::string::npos) << name;
  }
  EXPECT_GT(logged, 0u);
}

}  // namespace
