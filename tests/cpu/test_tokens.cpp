// data.kind: tokens on the CPU reference: the token chain and its batches, the embedding,
// unembedding and cross-entropy ops on hand-worked inputs, the token network's FP32 gradients
// against finite differences (with causal attention), and a paired run (FP32, MX and flash arms,
// a branch) on token data; the configuration rules and the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/core/detmath.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/elementwise.h"
#include "lab/model/mlp.h"
#include "lab/train/batch.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

TEST(TokenData, TheChainPicksItsSuccessorsByTheDocumentedThresholds) {
  const uint64_t seed = 9;
  const int64_t V = 37;
  for (int64_t v : {0, 5, 36})
    for (const auto& [u, j] : std::vector<std::pair<float, int>>{{0.0f, 0}, {0.53f, 0}, {0.54f, 1}, {0.79f, 1},
                                                                  {0.81f, 2}, {0.93f, 2}, {0.94f, 3}, {0.9999f, 3}}) {
      const uint32_t w = philox(seed, Stream::token_chain, 0, static_cast<uint64_t>(v * kTokenSuccessors + j)).v[0];
      EXPECT_EQ(token_successor(seed, V, v, u), 1 + static_cast<int64_t>(w % (V - 1))) << v << " " << u;
    }
}

TEST(TokenData, BatchesAreSequencesOfTheChainFromABos) {
  auto be = make_cpu_backend();
  const int64_t nseq = 6, S = 24, V = 20;
  std::vector<float> ids(nseq * S), tg(nseq * S), ids2(nseq * S), tg2(nseq * S);
  StepScalars st;
  st.step = 3;
  be->set_step(st);
  be->token_batch(ids.data(), tg.data(), nseq, S, V, 5, Stream::data);
  be->token_batch(ids2.data(), tg2.data(), nseq, S, V, 5, Stream::data);
  EXPECT_EQ(ids, ids2);  // a pure function of (seed, stream, step)
  EXPECT_EQ(tg, tg2);
  int repeats = 0;
  for (int64_t b = 0; b < nseq; ++b) {
    EXPECT_EQ(ids[b * S], 0.0f);  // the BOS
    std::set<float> seen;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t r = b * S + i;
      EXPECT_TRUE(tg[r] >= 1.0f && tg[r] < V && tg[r] == std::floor(tg[r])) << tg[r];
      if (i + 1 < S) {
        EXPECT_EQ(ids[r + 1], tg[r]);  // the next token is the target
      }
      const float u = u32_to_uniform(philox(5, Stream::data, 3, static_cast<uint64_t>(r)).v[0]);
      EXPECT_EQ(tg[r], static_cast<float>(token_successor(5, V, static_cast<int64_t>(ids[r]), u)));
      repeats += seen.count(ids[r]) ? 1 : 0;
      seen.insert(ids[r]);
    }
  }
  EXPECT_GT(repeats, nseq * S / 4);  // a sparse chain over 20 tokens: sequences repeat tokens
  st.step = 4;
  be->set_step(st);
  be->token_batch(ids2.data(), tg2.data(), nseq, S, V, 5, Stream::data);
  EXPECT_NE(ids, ids2);  // another step, another batch
}

TEST(TokenOps, EmbeddingAndCrossEntropyOnHandWorkedInputs) {
  auto be = make_cpu_backend();
  // E [3 x 2]; ids (2, 0, 2): rows E[2], E[0], E[2] (bf16 rounding per R).
  const std::vector<float> E = {1.0f, 2.0f, 3.0f, 4.0f, 0.1f, -6.0f}, ids = {2.0f, 0.0f, 2.0f};
  std::vector<float> out(6), dE(6, -1.0f);
  be->embed_fwd(ids.data(), E.data(), out.data(), 3, 2, 3, ElementwiseRound{});
  EXPECT_EQ(out, (std::vector<float>{0.1f, -6.0f, 1.0f, 2.0f, 0.1f, -6.0f}));
  be->embed_fwd(ids.data(), E.data(), out.data(), 3, 2, 3, ElementwiseRound{true, Rounding::nearest_even});
  EXPECT_EQ(out[0], round_bf16(0.1f, Rounding::nearest_even));
  const std::vector<float> dout = {0.5f, 1.0f, 2.0f, 3.0f, 0.25f, -1.0f};
  be->embed_bwd(ids.data(), dout.data(), dE.data(), 3, 2, 3);
  EXPECT_EQ(dE, (std::vector<float>{2.0f, 3.0f, 0.0f, 0.0f, 0.75f, 0.0f}));  // token 1 unseen: 0
  const std::vector<float> bad = {3.0f};
  EXPECT_THROW(be->embed_fwd(bad.data(), E.data(), out.data(), 1, 2, 3, ElementwiseRound{}), Error);
  const std::vector<float> frac = {0.5f};
  EXPECT_THROW(be->embed_fwd(frac.data(), E.data(), out.data(), 1, 2, 3, ElementwiseRound{}), Error);

  // Two rows of logits (0, ln 3) with targets 1 and 0: p = (1/4, 3/4); loss = (-ln 3/4 - ln 1/4) / 2.
  const float l3 = static_cast<float>(std::log(3.0));
  const std::vector<float> logits = {0.0f, l3, 0.0f, l3}, target = {1.0f, 0.0f};
  std::vector<float> dl(4), loss(1);
  be->loss_xent(logits.data(), target.data(), dl.data(), loss.data(), nullptr, 2, 2, ElementwiseRound{});
  EXPECT_NEAR(loss[0], (-std::log(0.75) - std::log(0.25)) / 2, 1e-6);
  EXPECT_NEAR(dl[0], 0.25f / 2, 1e-7f);
  EXPECT_NEAR(dl[1], (0.75f - 1.0f) / 2, 1e-7f);
  EXPECT_NEAR(dl[2], (0.25f - 1.0f) / 2, 1e-7f);
  EXPECT_NEAR(dl[3], 0.75f / 2, 1e-7f);
  // Exactly the documented expressions (kl_exp, kl_prob, kl_logprob, xent_grad_elem).
  const float m = l3, e0 = det_exp(0.0f - m), e1 = det_exp(l3 - m);
  const double S = static_cast<double>(e0) + static_cast<double>(e1);
  EXPECT_EQ(dl[0], xent_grad_elem(kl_prob(e0, S), false, 0.5f, false, Rounding::nearest_even));
  const float ls = det_log(static_cast<float>(S));
  EXPECT_EQ(loss[0], mean_from_sum(-static_cast<double>(kl_logprob(l3, m, ls)) - kl_logprob(0.0f, m, ls), 2));
}

// A token network: embedding, `depth` blocks, unembedding, cross-entropy.
ModelConfig token_model(BlockKind block) {
  ModelConfig m;
  m.depth = 2;
  m.width = 16;
  m.block = block;
  m.heads = 2;
  m.causal = block == BlockKind::attention;
  return m;
}

TEST(TokenModel, Fp32GradientsMatchFiniteDifferences) {
  for (BlockKind block : {BlockKind::mlp, BlockKind::attention}) {
    const int S = 8, V = 11;
    const int64_t T = 2 * S;
    const NetShape s = NetShape::student(token_model(block), S, V);
    ASSERT_EQ(s.groups.front().name, "embed");
    ASSERT_EQ(s.groups.back().name, "unembed");
    auto be = make_cpu_backend();
    const std::vector<float> init = init_params(s, InitKind::pytorch, 1.0f, 5, Stream::init);
    std::vector<float> ids(T), tg(T), G(init.size());
    be->token_batch(ids.data(), tg.data(), 2, S, V, 3, Stream::data);
    Workspace ws = Workspace::make(*be, s, T);
    EXPECT_EQ(ws.width, V);
    PassPolicy pol;
    pol.p = PrecisionConfig::fp32();
    const LossSpec xent{LossKind::xent, 1.0f};
    auto loss_at = [&](std::vector<float> p) {
      forward(*be, s, p.data(), ids.data(), ws, pol);
      loss_and_grad(*be, xent, tg.data(), ws, pol, nullptr);
      return static_cast<double>(be->read_scalar(ws.loss));
    };
    std::vector<float> P = init;
    EXPECT_NEAR(loss_at(P), std::log(static_cast<double>(V)), 1.0);  // about ln V at initialisation
    backward(*be, s, P.data(), ids.data(), ws, G.data(), pol);
    for (const ParamGroup& g : s.groups) {
      if (g.kind != ParamGroup::embed && g.kind != ParamGroup::unembed && g.kind != ParamGroup::w1 &&
          g.kind != ParamGroup::wqkv)
        continue;
      double num = 0, den = 0;
      for (int64_t i = 0; i < g.size(); i += 5) {
        std::vector<float> up = init, dn = init;
        up[g.offset + i] += 1e-2f;
        dn[g.offset + i] -= 1e-2f;
        const double fd = (loss_at(up) - loss_at(dn)) / (static_cast<double>(up[g.offset + i]) - dn[g.offset + i]);
        num += (G[g.offset + i] - fd) * (G[g.offset + i] - fd);
        den += fd * fd;
      }
      ASSERT_GT(den, 0.0) << g.name;
      EXPECT_LT(std::sqrt(num / den), 2e-2) << g.name << (block == BlockKind::mlp ? " mlp" : " attention");
    }
  }
}

TEST(TokenModel, LossAndNetworkMustMatch) {
  auto be = make_cpu_backend();
  const NetShape tok = NetShape::student(token_model(BlockKind::mlp), 1, 5), reg = NetShape::student(token_model(BlockKind::mlp));
  Workspace wt = Workspace::make(*be, tok, 4), wr = Workspace::make(*be, reg, 4);
  std::vector<float> y(64, 0.0f);
  const PassPolicy pol;
  EXPECT_THROW(loss_and_grad(*be, LossSpec{LossKind::mse, 1.0f}, y.data(), wt, pol, nullptr), Error);
  EXPECT_THROW(loss_and_grad(*be, LossSpec{LossKind::xent, 1.0f}, y.data(), wr, pol, nullptr), Error);
  EXPECT_THROW(NetShape::student(token_model(BlockKind::mlp), 1, 1), Error);
}

RunConfig token_run() {
  RunConfig c;
  c.seed = 7;
  c.steps = 30;
  c.device = "cpu";
  c.model = token_model(BlockKind::attention);
  c.data.batch = 4;
  c.data.seq_len = 16;
  c.data.kind = DataKind::tokens;
  c.data.vocab = 16;
  c.loss = LossKind::xent;
  c.precision.block_size = 16;
  c.optimizer.lr = 1e-2f;
  c.log.log_every = 5;
  c.log.progress = false;
  c.arms = {{"mx", "", {}}, {"flash", "flash_bf16", {}}};
  InterventionConfig iv;
  iv.name = "flash_fp32";
  iv.at = 10;
  iv.apply = "to_fp32";
  iv.from = "flash";
  c.interventions = {iv};
  return c;
}

TEST(TokenTrainer, PairedRunOnTokensLearnsInLockStep) {
  const MemorySink sink = test::run_in_memory(token_run());
  EXPECT_EQ(sink.root.str.at("status"), "complete");
  auto loss_all = [&](const std::string& g) { return sink.groups.at(g).loss_all; };
  for (const char* g : {"trajectories/fp32", "trajectories/mx", "trajectories/flash"}) {
    const std::vector<float> l = loss_all(g);
    ASSERT_EQ(l.size(), 30u) << g;
    EXPECT_NEAR(l.front(), std::log(16.0), 1.0) << g;
    EXPECT_LT(l.back(), 0.8f * l.front()) << g;  // the chain is learnable
  }
  // Lock-step: every trajectory starts from the same weights on the same batch, so the shadow
  // pass (FP32 at the arm's weights) of step 0 is the FP32 trajectory's step 0, bit for bit.
  auto shadow_loss = [&](const std::string& g, int64_t step) {
    for (const MetricRow& r : sink.groups.at(g).rows)
      if (r.axis == "shadow_step" && r.step == step)
        for (const auto& [name, v] : r.cols)
          if (name == "shadow_fp32_loss") return v[0];
    return static_cast<double>(NAN);
  };
  for (const char* g : {"trajectories/mx", "trajectories/flash"})
    EXPECT_EQ(static_cast<float>(shadow_loss(g, 0)), loss_all("trajectories/fp32").front()) << g;
  // The branch: from the flash arm's state at step 10, FP32 with exact attention: its first loss is
  // the flash arm's shadow loss there (FP32 at those weights, on that step's batch), bit for bit.
  const std::vector<float> br = loss_all("branches/flash_fp32");
  ASSERT_EQ(br.size(), 20u);
  EXPECT_EQ(br.front(), static_cast<float>(shadow_loss("trajectories/flash", 10)));
  EXPECT_NE(br.front(), loss_all("trajectories/flash")[10]);  // flash and exact attention differ
}

TEST(TokenConfig, RulesAndCli) {
  auto err = [](const std::string& y) {
    try {
      config_from_yaml_string(y, "t.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("data: {kind: tokens}\n").find("needs loss: xent"), std::string::npos);
  EXPECT_NE(err("loss: xent\n").find("needs data.kind: tokens"), std::string::npos);
  EXPECT_NE(err("data: {kind: tokens, mx_teacher_targets: true}\nloss: xent\n").find("no teacher"), std::string::npos);
  EXPECT_NE(err("data: {kind: tokens, vocab: 1}\nloss: xent\n").find("data.vocab"), std::string::npos);
  EXPECT_NE(err("model: {causal: true}\n").find("needs model.block: attention"), std::string::npos);
  const RunConfig c = config_from_yaml_string("data: {kind: tokens, vocab: 9}\nloss: xent\n", "t.yaml");
  EXPECT_EQ(c.vocab(), 9);
  EXPECT_TRUE(config_from_yaml_string(dump_config(c), "d.yaml") == c);
  EXPECT_EQ(canonical_config_text(RunConfig{}).find("vocab"), std::string::npos);  // run ids unchanged

  test::TempDir dir("mxlab_tokens_cli");
  const std::string exp = dir.write("e.yaml", "steps: 2\nmodel: {depth: 1, width: 32}\ndata: {batch: 4, kind: tokens, "
                                              "vocab: 8}\nloss: xent\n");
  const testutil::Proc ok = testutil::run_mxlab({"run", exp, "--out", dir.str() + "/out", "--device", "cpu", "--quiet"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

}  // namespace
