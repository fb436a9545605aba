// precision.attention: flash_bf16 on the CPU reference (lab/model/flash_attention.h): the kernel on
// hand-worked rows (a repeated maximum gives P-bar = 1 exactly; Algorithm 3's two rules and the
// r_m = 0 case it leaves alone), the model's flash path against the exact one, what each option
// changes and what it leaves alone, the trainer's instruments, their checkpoint, the configuration
// and the flash-attention command. The bits of the forward and backward against the paper's
// Algorithms 1-3 in PyTorch: tests/torch/flash_attention.py (ctest torch_flash_attention); the CUDA
// kernels against this reference: tests/gpu/test_flash_attention_gpu.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/core/detmath.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/npy.h"
#include "lab/model/elementwise.h"
#include "lab/model/flash_attention.h"
#include "lab/model/mlp.h"
#include "lab/runs/checkpoint.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

std::vector<float> noise(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * randn_elem(seed, Stream::validation, 0, i);
  return v;
}

// One (sequence, head) of S tokens and head dim 1: q = 1, every key k = a (so z = a: one repeated
// maximum), values v. Returns o_hp, o, lse and the row statistics of row S - 1.
struct Row {
  float o_hp, o, lse, rowmax, nmax, nones;
};
Row one_row(float a, const std::vector<float>& v, const Backend::FlashSpec& f) {
  const int64_t S = static_cast<int64_t>(v.size());
  std::vector<float> q(S, 1.0f), k(S, a), o(S), ohp(S), lse(S), rm(S), st(2 * S);
  auto be = make_cpu_backend();
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, S, 1,
                     1.0f, f);
  const int64_t r = S - 1;
  return {ohp[r], o[r], lse[r], rm[r], st[2 * r], st[2 * r + 1]};
}

TEST(FlashKernel, RepeatedMaximumGivesPbarOneAndTheMean) {
  // z = (2, 2): m = 2, P-bar = (1, 1) exactly, l = 2, O = (-3 - 5) / 2 = -4.
  Backend::FlashSpec f;
  const Row r = one_row(2.0f, {-3.0f, -5.0f}, f);
  EXPECT_EQ(r.o_hp, -4.0f);
  EXPECT_EQ(r.o, -4.0f);
  EXPECT_EQ(r.rowmax, 2.0f);
  EXPECT_EQ(r.nmax, 2.0f);
  EXPECT_EQ(r.nones, 2.0f);
  EXPECT_EQ(r.lse, 2.0f + det_log(2.0f));
}

TEST(FlashKernel, StabilizedSoftmaxShiftsARepeatedMaximumAsAlgorithm3Says) {
  Backend::FlashSpec f;
  f.stabilized = true;
  // r_m = 2 > 0, attained twice: m = beta r_m = 4, P-bar = exp(-2) < 1 at both keys.
  Row r = one_row(2.0f, {-3.0f, -5.0f}, f);
  EXPECT_EQ(r.nones, 0.0f);
  EXPECT_EQ(r.nmax, 2.0f);  // the row maximum itself is the same
  EXPECT_EQ(r.rowmax, 2.0f);
  const float p = det_exp(-2.0f), pb = fa_bf16(p);
  EXPECT_EQ(r.o_hp, (pb * -3.0f + pb * -5.0f) * (1.0f / (p + p)));
  EXPECT_NEAR(r.o_hp, -4.0f, 4.0f * std::ldexp(1.0f, -8));
  EXPECT_EQ(r.lse, 4.0f + det_log(p + p));
  f.beta = 4.0f;  // m = 8
  r = one_row(2.0f, {-3.0f, -5.0f}, f);
  EXPECT_EQ(r.lse, 8.0f + det_log(det_exp(-6.0f) + det_exp(-6.0f)));
  // r_m = -1 < 0, attained twice: m = 0, P-bar = exp(-1).
  f.beta = 2.0f;
  r = one_row(-1.0f, {-3.0f, -5.0f}, f);
  EXPECT_EQ(r.nones, 0.0f);
  EXPECT_EQ(r.lse, 0.0f + det_log(det_exp(-1.0f) + det_exp(-1.0f)));
  // r_m = 0 exactly: Algorithm 3 has no rule, m stays 0 and P-bar = 1 (the gap it leaves).
  r = one_row(0.0f, {-3.0f, -5.0f}, f);
  EXPECT_EQ(r.nones, 2.0f);
  // A maximum attained once is never shifted: the standard softmax's bits.
  const Row single_std = one_row(1.0f, {-3.0f}, Backend::FlashSpec{});
  const Row single_stab = one_row(1.0f, {-3.0f}, f);
  EXPECT_EQ(single_stab.o_hp, single_std.o_hp);
  EXPECT_EQ(single_stab.lse, single_std.lse);
  // Within eps counts as a tie: (2, 2 - 2^-7) (both bf16) with eps 0.01 is shifted, with eps 0.005
  // not (then only the exact maximum has P-bar = 1; bf16(exp(-2^-7)) = 0.9921875).
  std::vector<float> q = {1.0f, 1.0f}, k = {2.0f, 2.0f - std::ldexp(1.0f, -7)}, v = {-3.0f, -5.0f}, o(2), ohp(2),
                     lse(2), rm(2), st(4);
  auto be = make_cpu_backend();
  f.eps = 0.01f;
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, 2, 1,
                     1.0f, f);
  EXPECT_EQ(st[2], 1.0f);  // row 1: one key attains the maximum exactly
  EXPECT_EQ(st[3], 0.0f);  // and no P-bar = 1 after the shift
  f.eps = 0.005f;
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, 2, 1,
                     1.0f, f);
  EXPECT_EQ(st[3], 1.0f);
}

TEST(FlashKernel, NearTiesOutsideEpsStillRoundToOneInBf16) {
  // Algorithm 3 with the paper's eps = 1e-3: a key within 2^-9 of the maximum but more than eps below
  // it is no tie, so nothing is shifted, and bf16(exp(-(m - z))) rounds to 1 all the same (bf16's
  // spacing below 1 is 2^-8). z = (2, 2 - 2^-10 - 2^-11), both from bf16 q and k (dh = 2).
  const float kb1 = std::ldexp(1.0f, -7) - std::ldexp(1.0f, -10) - std::ldexp(1.0f, -11);
  ASSERT_EQ(fa_bf16(kb1), kb1);
  std::vector<float> q = {1.0f, 1.0f, 1.0f, 1.0f}, k = {2.0f, 0.0f, 2.0f - std::ldexp(1.0f, -7), kb1},
                     v = {-3.0f, 0.0f, -5.0f, 0.0f}, o(4), ohp(4), lse(2), rm(2), st(4);
  Backend::FlashSpec f;
  f.stabilized = true;  // eps 1e-3
  auto be = make_cpu_backend();
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, 2, 2,
                     1.0f, f);
  EXPECT_EQ(st[2], 1.0f);  // row 1: one key attains the maximum
  EXPECT_EQ(st[3], 2.0f);  // and two bf16 P-bar are 1
  f.eps = std::ldexp(1.0f, -9);  // eps at bf16's rounding window: a tie, shifted, no P-bar = 1
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, 2, 2,
                     1.0f, f);
  EXPECT_EQ(st[3], 0.0f);
}

TEST(FlashKernel, CausalRowsSeeOnlyEarlierKeys) {
  // Row 0 sees key 0 only: O = v_0 exactly; a later key with a huge logit changes nothing there.
  const int64_t S = 3, dh = 2;
  std::vector<float> q(S * dh, 1.0f), k = {0.5f, 0.5f, 1.0f, 1.0f, 40.0f, 40.0f}, v = {-1.5f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<float> o(S * dh), ohp(S * dh), lse(S), rm(S), st(2 * S);
  Backend::FlashSpec f;
  f.causal = true;
  f.bc = 1;
  auto be = make_cpu_backend();
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, S, dh,
                     1.0f, f);
  EXPECT_EQ(o[0], -1.5f);
  EXPECT_EQ(o[1], 2.0f);
  EXPECT_EQ(rm[0], 1.0f);  // z = 0.5 + 0.5
  EXPECT_EQ(rm[2], 80.0f);
  f.causal = false;
  be->flash_attn_fwd(q.data(), k.data(), v.data(), o.data(), ohp.data(), lse.data(), rm.data(), st.data(), 1, S, dh,
                     1.0f, f);
  EXPECT_EQ(o[0], 5.0f);  // the last key dominates every row without the mask
  EXPECT_EQ(rm[0], 80.0f);
}

// ---- the model's flash path ----

ModelConfig attn_model(int depth = 2) {
  ModelConfig m;
  m.depth = depth;
  m.width = 32;
  m.block = BlockKind::attention;
  m.heads = 2;
  return m;
}

struct Pass {
  std::vector<float> out, grads, delta_bias;
};

// Forward, MSE loss and backward of `m` (sequences of 16 tokens, 3 of them) under policy p.
Pass run_pass(const ModelConfig& m, const PrecisionConfig& p) {
  const int S = 16;
  const int64_t T = 3 * S;
  const NetShape s = NetShape::student(m, S);
  auto be = make_cpu_backend();
  std::vector<float> P = init_params(s, InitKind::pytorch, 1.0f, 5, Stream::init);
  std::vector<float> X = noise(static_cast<size_t>(T * s.d), 8, 2.0f), Y = noise(static_cast<size_t>(T * s.d), 9, 0.5f);
  std::vector<float> G(P.size());
  Workspace ws = Workspace::make(*be, s, T);
  PassPolicy pol;
  pol.p = p;
  pol.seed = 3;
  forward(*be, s, P.data(), X.data(), ws, pol);
  Pass r;
  r.out.assign(ws.out, ws.out + T * s.d);
  loss_and_grad(*be, LossSpec{}, Y.data(), ws, pol, nullptr);
  backward(*be, s, P.data(), X.data(), ws, G.data(), pol);
  r.grads = G;
  if (p.flash())
    for (int l = 0; l < s.depth; ++l) r.delta_bias.push_back(flash_instruments(*be, s, ws, l).delta_bias);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t off = 0, int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(a.size());
  double num = 0, den = 0;
  for (int64_t i = off; i < off + n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(FlashModel, ExactAttentionIsTheExistingPathWhateverTheFlashParameters) {
  // The flash kernel's parameters are read only under flash_bf16: exact attention gives the
  // default policy's bits (tests/cpu/golden/model_calls.txt pins its calls).
  const PrecisionConfig base;
  PrecisionConfig tuned = base;
  tuned.attention_tile_r = 4;
  tuned.attention_tile_c = 8;
  tuned.attention_beta = 8.0f;
  tuned.attention_eps = 0.25f;
  const Pass a = run_pass(attn_model(), base), b = run_pass(attn_model(), tuned);
  EXPECT_TRUE(same_bits(a.out, b.out));
  EXPECT_TRUE(same_bits(a.grads, b.grads));
}

TEST(FlashModel, FlashIsWithinBf16OfExactAndDiffers) {
  // FP32 everywhere but the attention kernel: the flash output and every gradient group are within
  // bf16 rounding (2^-8 relative, with the GEMMs around it) of exact FP32 attention, and not equal.
  PrecisionConfig exact = PrecisionConfig::fp32(), flash = exact;
  flash.attention = AttnImpl::flash_bf16;
  flash.attention_tile_c = 8;
  const Pass e = run_pass(attn_model(), exact), f = run_pass(attn_model(), flash);
  EXPECT_FALSE(same_bits(e.out, f.out));
  EXPECT_LT(rel_diff(f.out, e.out), std::ldexp(1.0, -7));
  const NetShape s = NetShape::student(attn_model(), 16);
  for (const ParamGroup& g : s.groups) {
    const double r = rel_diff(f.grads, e.grads, g.offset, g.size());
    EXPECT_LT(r, std::ldexp(1.0, -5)) << g.name;
  }
  // The flash path reads Bc: another key tile, other bits.
  PrecisionConfig other = flash;
  other.attention_tile_c = 16;
  EXPECT_FALSE(same_bits(run_pass(attn_model(), other).grads, f.grads));
  // ... but not Br.
  other = flash;
  other.attention_tile_r = 3;
  const Pass br = run_pass(attn_model(), other);
  EXPECT_TRUE(same_bits(br.out, f.out));
  EXPECT_TRUE(same_bits(br.grads, f.grads));
}

TEST(FlashModel, DeltaHpZeroesTheDeltaBiasAndChangesOnlyWhatReadsDelta) {
  // One block: the MLP sub-block's and Wo's gradients are computed before the attention kernel's
  // backward, so delta hp changes exactly Wqkv and the first norm's gains.
  PrecisionConfig lp;  // the paper's MX recipe around the kernel
  lp.attention = AttnImpl::flash_bf16;
  PrecisionConfig hp = lp;
  hp.attention_delta = AttnDelta::hp;
  const ModelConfig m = attn_model(1);
  const Pass a = run_pass(m, lp), b = run_pass(m, hp);
  ASSERT_EQ(b.delta_bias.size(), 1u);
  EXPECT_EQ(b.delta_bias[0], 0.0);
  EXPECT_NE(a.delta_bias[0], 0.0);
  EXPECT_TRUE(same_bits(a.out, b.out));  // the forward is the same
  const NetShape s = NetShape::student(m, 16);
  for (const ParamGroup& g : s.groups) {
    const std::vector<float> ga(a.grads.begin() + g.offset, a.grads.begin() + g.offset + g.size()),
        gb(b.grads.begin() + g.offset, b.grads.begin() + g.offset + g.size());
    const bool reads_delta = g.kind == ParamGroup::wqkv || g.kind == ParamGroup::attn_gamma ||
                             g.kind == ParamGroup::attn_beta;
    EXPECT_EQ(same_bits(ga, gb), !reads_delta) << g.name;
  }
}

TEST(FlashModel, CausalOutputsOfEarlierTokensIgnoreLaterOnes) {
  // model.causal, exact and flash: changing the last token of every sequence changes no output of
  // the tokens before it (and does change the last one's); without the mask it changes them all.
  for (const bool flash : {false, true})
    for (const bool causal : {true, false}) {
      ModelConfig m = attn_model();
      m.causal = causal;
      const int S = 16;
      const int64_t T = 3 * S;
      const NetShape s = NetShape::student(m, S);
      auto be = make_cpu_backend();
      std::vector<float> P = init_params(s, InitKind::pytorch, 1.0f, 5, Stream::init);
      std::vector<float> X = noise(static_cast<size_t>(T * s.d), 8, 2.0f);
      Workspace ws = Workspace::make(*be, s, T);
      PassPolicy pol;
      pol.p.attention = flash ? AttnImpl::flash_bf16 : AttnImpl::exact;
      forward(*be, s, P.data(), X.data(), ws, pol);
      const std::vector<float> a(ws.out, ws.out + T * s.d);
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < s.d; ++c) X[((b + 1) * S - 1) * s.d + c] += 1.0f;
      forward(*be, s, P.data(), X.data(), ws, pol);
      int64_t earlier_changed = 0, last_changed = 0;
      for (int64_t r = 0; r < T; ++r)
        for (int64_t c = 0; c < s.d; ++c)
          if (ws.out[r * s.d + c] != a[static_cast<size_t>(r * s.d + c)]) ++(r % S == S - 1 ? last_changed : earlier_changed);
      EXPECT_GT(last_changed, 0) << flash << causal;
      if (causal) {
        EXPECT_EQ(earlier_changed, 0) << "flash " << flash;
      } else {
        EXPECT_GT(earlier_changed, 0) << "flash " << flash;
      }
    }
}

TEST(FlashModel, CausalGradientsMatchFiniteDifferences) {
  // FP32, exact attention with the mask: the gradient of Wqkv (which the mask's backward reaches
  // through dQ and dK) against central differences of the loss.
  ModelConfig m = attn_model(1);
  m.causal = true;
  const int S = 8;
  const int64_t T = 2 * S;
  const NetShape s = NetShape::student(m, S);
  auto be = make_cpu_backend();
  const std::vector<float> init = init_params(s, InitKind::pytorch, 1.0f, 5, Stream::init);
  std::vector<float> X = noise(static_cast<size_t>(T * s.d), 8, 2.0f), Y = noise(static_cast<size_t>(T * s.d), 9, 0.5f);
  std::vector<float> G(init.size());
  Workspace ws = Workspace::make(*be, s, T);
  PassPolicy pol;
  pol.p = PrecisionConfig::fp32();
  auto loss_at = [&](std::vector<float> p) {
    forward(*be, s, p.data(), X.data(), ws, pol);
    loss_and_grad(*be, LossSpec{}, Y.data(), ws, pol, nullptr);
    return static_cast<double>(be->read_scalar(ws.loss));
  };
  std::vector<float> P = init;
  loss_at(P);
  backward(*be, s, P.data(), X.data(), ws, G.data(), pol);
  const ParamGroup& g = *s.find(0, ParamGroup::wqkv);
  double num = 0, den = 0;
  for (int64_t i = 0; i < g.size(); i += 7) {  // a spread subset of Q, K and V rows
    std::vector<float> up = init, dn = init;
    up[g.offset + i] += 1e-2f;
    dn[g.offset + i] -= 1e-2f;
    const double fd = (loss_at(up) - loss_at(dn)) / (static_cast<double>(up[g.offset + i]) - dn[g.offset + i]);
    num += (G[g.offset + i] - fd) * (G[g.offset + i] - fd);
    den += fd * fd;
  }
  ASSERT_GT(den, 0.0);
  EXPECT_LT(std::sqrt(num / den), 2e-2);
}

TEST(FlashModel, StatisticsOfTheKernelsOperandsAreNotCounted) {
  PrecisionConfig p;
  p.attention = AttnImpl::flash_bf16;
  for (StatTensor t : {StatTensor::attn_q, StatTensor::attn_k, StatTensor::attn_p, StatTensor::attn_v,
                       StatTensor::grad_ctx, StatTensor::grad_logits})
    EXPECT_FALSE(stat_quantized(p, t)) << name(t);
  EXPECT_TRUE(stat_quantized(p, StatTensor::attn_ctx));  // Wo's input, an MX GEMM operand still
  EXPECT_TRUE(stat_quantized(PrecisionConfig{}, StatTensor::attn_q));
}

TEST(FlashModel, ForwardAndBackwardMustAgreeOnTheImplementation) {
  const ModelConfig m = attn_model(1);
  const NetShape s = NetShape::student(m, 16);
  auto be = make_cpu_backend();
  std::vector<float> P = init_params(s, InitKind::pytorch, 1.0f, 5, Stream::init), X = noise(48 * 32, 1),
                     Y = noise(48 * 32, 2), G(P.size());
  Workspace ws = Workspace::make(*be, s, 48);
  PassPolicy exact, flash;
  flash.p.attention = AttnImpl::flash_bf16;
  forward(*be, s, P.data(), X.data(), ws, exact);
  loss_and_grad(*be, LossSpec{}, Y.data(), ws, exact, nullptr);
  EXPECT_THROW(backward(*be, s, P.data(), X.data(), ws, G.data(), flash), std::logic_error);
  // An MLP network has no attention sub-block for the kernel to compute.
  ModelConfig mlp;
  mlp.depth = 1;
  mlp.width = 32;
  const NetShape ms = NetShape::student(mlp);
  Workspace mws = Workspace::make(*be, ms, 4);
  std::vector<float> mp = init_params(ms, InitKind::pytorch, 1.0f, 5, Stream::init);
  EXPECT_THROW(forward(*be, ms, mp.data(), X.data(), mws, flash), Error);
}

// ---- the trainer's instruments ----

RunConfig flash_run() {
  RunConfig c;
  c.seed = 2;
  c.steps = 8;
  c.device = "cpu";
  c.model = attn_model();
  c.data.batch = 3;
  c.data.seq_len = 16;
  c.precision.block_size = 16;
  c.optimizer.lr = 3e-3f;
  c.log.log_every = 2;
  c.log.progress = false;
  c.arms = {{"flash", "flash_bf16", {{"attention_tile", "[16, 8]"}}},
            {"stab", "stabilized_softmax", {}},
            {"dhp", "delta_hp", {}}};
  return c;
}

// The rows of `group`'s logged series: metric -> [row][layer].
std::map<std::string, std::vector<std::vector<double>>> logged(const MemorySink& sink, const std::string& group) {
  std::map<std::string, std::vector<std::vector<double>>> out;
  for (const MetricRow& r : sink.groups.at(group).rows)
    if (r.axis == "step")
      for (const auto& [name, v] : r.cols) out[name].push_back(v);
  return out;
}

TEST(FlashTrainer, LogsTheInstrumentsPerLayer) {
  const MemorySink sink = test::run_in_memory(flash_run());
  EXPECT_EQ(sink.root.str.at("status"), "complete");
  const auto fp32 = logged(sink, "trajectories/fp32");
  for (const char* m : {"attn_multi_max_frac", "attn_multi_one_frac", "attn_delta_bias", "attn_delta_bias_cumsum"}) {
    ASSERT_EQ(fp32.at(m).size(), 5u) << m;  // steps 0, 2, 4, 6 and the last, 7; exact attention: NaN
    for (const auto& row : fp32.at(m)) {
      ASSERT_EQ(row.size(), 2u);
      for (double x : row) EXPECT_TRUE(std::isnan(x)) << m;
    }
  }
  for (const char* arm : {"trajectories/flash", "trajectories/stab", "trajectories/dhp"}) {
    const auto rows = logged(sink, arm);
    double sum[2] = {0, 0};
    for (size_t i = 0; i < rows.at("attn_delta_bias").size(); ++i)
      for (int l = 0; l < 2; ++l) {
        const double frac = rows.at("attn_multi_max_frac")[i][l], one = rows.at("attn_multi_one_frac")[i][l];
        EXPECT_TRUE(frac >= 0.0 && frac <= 1.0 && one >= 0.0 && one <= 1.0) << arm;
        sum[l] += rows.at("attn_delta_bias")[i][l];
        EXPECT_EQ(rows.at("attn_delta_bias_cumsum")[i][l], sum[l]) << arm << " row " << i;
        if (std::string(arm) == "trajectories/dhp") {
          EXPECT_EQ(rows.at("attn_delta_bias")[i][l], 0.0);
        } else {
          EXPECT_TRUE(std::isfinite(rows.at("attn_delta_bias")[i][l]));
          EXPECT_NE(rows.at("attn_delta_bias")[i][l], 0.0) << arm;
        }
      }
  }
  // The statistics of the kernel's operands are not counted; Wo's input still is.
  const auto flash = logged(sink, "trajectories/flash");
  for (double x : flash.at("attn_p_lastbin")[0]) EXPECT_TRUE(std::isnan(x));
  for (double x : flash.at("attn_ctx_lastbin")[0]) EXPECT_TRUE(std::isfinite(x));
  EXPECT_EQ(sink.groups.at("trajectories/flash").dataset_attrs.at("attn_p_lastbin").ints.at("quantized"), 0);
  EXPECT_EQ(sink.groups.at("trajectories/fp32").attrs.str.count("policy"), 1u);
  EXPECT_NE(sink.groups.at("trajectories/flash").attrs.str.at("policy").find("attention=flash_bf16 attention_tile=16x8"),
            std::string::npos);
}

TEST(FlashTrainer, TheRunningSumResumesFromACheckpoint) {
  const RunConfig cfg = flash_run();
  const MemorySink whole = test::run_in_memory(cfg);
  auto be = make_cpu_backend();
  test::TempDir dir("mxlab_flash_ckpt");
  const std::string path = dir.str() + "/run.ckpt";
  {
    MemorySink first;
    Trainer tr(cfg, *be, first);
    tr.open_output();
    tr.run(RunControl{}, 5);
    save_checkpoint(tr, config_hash(cfg), path);
  }
  MemorySink second;
  Trainer tr(cfg, *be, second);
  load_checkpoint(tr, config_hash(cfg), path);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  for (const char* arm : {"trajectories/flash", "trajectories/stab"}) {
    const auto a = logged(whole, arm).at("attn_delta_bias_cumsum"), b = logged(second, arm).at("attn_delta_bias_cumsum");
    ASSERT_GE(b.size(), 1u);
    ASSERT_GE(a.size(), b.size());
    // The resumed rows are the last rows of the whole run, bit for bit.
    for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], a[a.size() - b.size() + i]) << arm << " row " << i;
  }
}

// ---- configuration and CLI ----

std::string config_error(const std::string& yaml) {
  try {
    config_from_yaml_string(yaml, "f.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* const kAttn = "model: {depth: 1, width: 32, block: attention, heads: 2}\ndata: {batch: 2, seq_len: 32}\n";

TEST(FlashConfig, KeysParseAndProblemsAreRefused) {
  const RunConfig c = config_from_yaml_string(
      std::string(kAttn) + "precision: {attention: flash_bf16, attention_tile: [16, 8], attention_softmax: stabilized, "
                           "attention_beta: 4, attention_eps: 0.01, attention_delta: hp}\n",
      "f.yaml");
  EXPECT_TRUE(c.precision.flash());
  EXPECT_EQ(c.precision.attention_tile_r, 16);
  EXPECT_EQ(c.precision.attention_tile_c, 8);
  EXPECT_EQ(c.precision.attention_softmax, AttnSoftmax::stabilized);
  EXPECT_EQ(c.precision.attention_beta, 4.0f);
  EXPECT_EQ(c.precision.attention_delta, AttnDelta::hp);
  EXPECT_TRUE(config_from_yaml_string(dump_config(c), "d.yaml") == c);
  // --set and an arm's set take the tile as [Br, Bc] too.
  const RunConfig s = config_from_yaml_string(kAttn, "f.yaml", {"precision.attention_tile=[32,4]"});
  EXPECT_EQ(s.precision.attention_tile_c, 4);
  const RunConfig a = config_from_yaml_string(
      std::string(kAttn) + "arms:\n  - {name: f, apply: flash_bf16, set: {attention_tile: [8, 16]}}\n", "f.yaml");
  EXPECT_EQ(resolved_arms(a)[0].policy.attention_tile_c, 16);
  // The defaults leave every run id as it was: no attention key in the canonical text.
  EXPECT_EQ(canonical_config_text(RunConfig{}).find("attention"), std::string::npos);

  std::string e = config_error("precision: {attention: flash_bf16}\n");
  EXPECT_NE(e.find("needs model.block: attention"), std::string::npos) << e;
  e = config_error(std::string(kAttn) + "precision: {attention_softmax: stabilized}\n");
  EXPECT_NE(e.find("needs precision.attention: flash_bf16"), std::string::npos) << e;
  e = config_error(std::string(kAttn) + "precision: {attention_delta: hp}\n");
  EXPECT_NE(e.find("needs precision.attention: flash_bf16"), std::string::npos) << e;
  e = config_error(std::string(kAttn) + "precision: {attention: flash_bf16, attn_probs: mxfp8_e4m3}\n");
  EXPECT_NE(e.find("leave attn_probs at same"), std::string::npos) << e;
  e = config_error(std::string(kAttn) + "precision: {attention: flash_bf16, attention_tile: [0, 4]}\n");
  EXPECT_NE(e.find("attention_tile"), std::string::npos) << e;
  e = config_error(std::string(kAttn) + "precision: {attention_tile: 16}\n");
  EXPECT_NE(e.find("expected [Br, Bc]"), std::string::npos) << e;
  e = config_error(std::string(kAttn) + "precision: {attention_beta: 1.0}\n");
  EXPECT_NE(e.find("must be > 1"), std::string::npos) << e;
  // An arm's preset is checked like the base policy: stabilized_softmax on an MLP model.
  e = config_error("arms:\n  - {name: s, apply: stabilized_softmax}\n");
  EXPECT_NE(e.find("arm 's'"), std::string::npos) << e;
}

TEST(FlashConfig, FlashAttentionCommandRefusesBadInputInOneLine) {
  test::TempDir dir("mxlab_flash_cmd");
  const float q[6] = {1, 2, 3, 4, 5, 6};
  write_npy(dir.str() + "/q.npy", {3, 2}, q);
  write_npy(dir.str() + "/k3.npy", {2, 3}, q);
  write_npy(dir.str() + "/r1.npy", {6}, q);
  const std::string Q = dir.str() + "/q.npy", out = dir.str() + "/out";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--q", Q, "--k", dir.str() + "/k3.npy", "--v", Q}, "--k must have --q's shape"},
      {{"--q", dir.str() + "/r1.npy", "--k", Q, "--v", Q}, "rank >= 2"},
      {{"--q", Q, "--k", Q, "--v", Q, "--tile", "0,4"}, "--tile"},
      {{"--q", Q, "--k", Q, "--v", Q, "--softmax", "soft"}, "--softmax"},
      {{"--q", Q, "--k", Q, "--v", Q, "--beta", "1"}, "--beta must be > 1"},
      {{"--q", Q, "--k", Q, "--v", Q, "--eps", "nan"}, "--eps"},
  };
  for (const auto& [args, want] : cases) {
    std::vector<std::string> a = {"flash-attention", "--out", out};
    a.insert(a.end(), args.begin(), args.end());
    const testutil::Proc p = testutil::run_mxlab(a);
    EXPECT_EQ(p.exit_code, 2) << p.output;
    EXPECT_NE(p.output.find(want), std::string::npos) << p.output;
    EXPECT_EQ(testutil::count_of(p.output, "\n"), 1) << p.output;
  }
  // [S, dh] (one item) runs; the outputs have the input's leading shape.
  const testutil::Proc ok = testutil::run_mxlab({"flash-attention", "--out", out, "--q", Q, "--k", Q, "--v", Q});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(read_npy(out + "/o.npy").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(read_npy(out + "/row_stats.npy").shape, (std::vector<int64_t>{3, 2}));
}

}  // namespace
