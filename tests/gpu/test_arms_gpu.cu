// Multi-arm runs on CUDA: an arm of a K-arm run, whose passes run on their own
// streams beside the other arms', is bit-identical to the single-arm run of its recipe on the
// same device (CUDA graphs on, as the trainer always runs them), and every metric of the
// shadow series is there. The CPU twin is tests/cpu/test_arms.cpp. Runs that share one GPU at
// once (`mxlab run --jobs 4 --gpus 0,1`: two threads per GPU, each run with its own backend
// and streams) write the bits they write alone. Token runs with causal attention and flash attention
// in bf16 arms: each arm its single run, bit for bit, and the CPU's losses within ModelParity's budgets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda_backend.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/config/config_io.h"
#include "lab/train/trainer.h"
#include "tests/gpu/gpu_test_util.h"

using namespace mxlab;

namespace {

RunConfig tiny() {
  RunConfig c;
  c.seed = 5;
  c.steps = 40;
  c.model.depth = 2;
  c.model.width = 64;
  c.model.hidden_mult = 2;
  c.data.batch = 96;
  c.optimizer.lr = 3e-3f;
  c.precision.rounding = Rounding::nearest_away;
  c.precision.elementwise_rounding = Rounding::nearest_away;
  c.log.log_every = 10;
  c.log.bias_every = 3;
  c.log.progress = false;
  return c;
}

MemorySink run_on(Backend& be, const RunConfig& cfg) {
  MemorySink sink;
  Trainer tr(cfg, be, sink);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  return sink;
}

MemorySink run_cuda(const RunConfig& cfg) {
  auto be = make_cuda_backend(0);
  return run_on(*be, cfg);
}

// A small language model (tests/cpu/test_tokens.cpp's paired run): token data, causal attention,
// cross-entropy; the MX recipe, a flash_bf16 arm (tiles of 8 keys: the online softmax spans two)
// and a stabilized one, a branch from the flash arm to FP32 with exact attention.
RunConfig token_run(int steps) {
  RunConfig c;
  c.seed = 7;
  c.steps = steps;
  c.model.depth = 2;
  c.model.width = 32;
  c.model.block = BlockKind::attention;
  c.model.heads = 2;
  c.model.causal = true;
  c.data.batch = 4;
  c.data.seq_len = 16;
  c.data.kind = DataKind::tokens;
  c.data.vocab = 16;
  c.loss = LossKind::xent;
  c.precision.block_size = 16;
  c.optimizer.lr = 1e-2f;
  c.log.log_every = 5;
  c.log.bias_every = 3;
  c.log.progress = false;
  c.arms = {{"mx", "", {}},
            {"flash", "flash_bf16", {{"attention_tile", "[8, 8]"}}},
            {"stabilized", "stabilized_softmax", {{"attention_delta", "hp"}}}};
  c.interventions = {{"flash_fp32", std::min(10, steps - 1), "to_fp32", {}, "flash"}};
  validate_config(c);
  return c;
}

void expect_same(const MemorySink& a, const std::string& ga, const MemorySink& b, const std::string& gb) {
  const auto& ra = a.groups.at(ga).rows;
  const auto& rb = b.groups.at(gb).rows;
  ASSERT_EQ(ra.size(), rb.size()) << ga;
  size_t checked = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    ASSERT_EQ(ra[i].step, rb[i].step);
    ASSERT_EQ(ra[i].axis, rb[i].axis);
    ASSERT_EQ(ra[i].cols.size(), rb[i].cols.size());
    for (size_t c = 0; c < ra[i].cols.size(); ++c)
      for (size_t k = 0; k < ra[i].cols[c].second.size(); ++k) {
        const double x = ra[i].cols[c].second[k], y = rb[i].cols[c].second[k];
        ASSERT_TRUE(std::memcmp(&x, &y, sizeof x) == 0 || (x != x && y != y))
            << ga << " step " << ra[i].step << " " << ra[i].cols[c].first << "[" << k << "]: " << x << " vs " << y;
        ++checked;
      }
  }
  EXPECT_GT(checked, 100u);
  EXPECT_EQ(a.groups.at(ga).loss_all, b.groups.at(gb).loss_all);
}

}  // namespace

TEST(ArmsGpu, AnArmEqualsTheSingleArmRunOfItsRecipe) {
  MXLAB_REQUIRE_GPU();
  RunConfig multi = tiny();
  multi.arms = {{"away", "", {}},
                {"even", "", {{"rounding", "nearest_even"}}},
                {"grad_even", "", {{"rounding.grad", "nearest_even"}}},
                {"rceil", "", {{"scale_rule", "rceil"}}},
                {"noln", "skip_ln_quant", {}}};
  multi.interventions = {{"fp32_at20", 20, "to_fp32", {}, "even"}};
  const MemorySink m = run_cuda(multi);
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    RunConfig single = tiny();
    single.precision = arm.policy;
    if (arm.name == "even") single.interventions = {{"fp32_at20", 20, "to_fp32", {}}};
    const MemorySink s = run_cuda(single);
    expect_same(m, "trajectories/" + arm.name, s, "trajectories/mx");
    expect_same(m, "trajectories/fp32", s, "trajectories/fp32");
    if (arm.name == "even") expect_same(m, "branches/fp32_at20", s, "branches/fp32_at20");
  }
  EXPECT_NE(m.groups.at("trajectories/away").loss_all, m.groups.at("trajectories/even").loss_all);
  // The shadow series: every third step and the last.
  size_t shadow_rows = 0;
  for (const MetricRow& r : m.groups.at("trajectories/grad_even").rows) shadow_rows += r.axis == "shadow_step";
  EXPECT_EQ(shadow_rows, 14u);  // 0, 3, ..., 39 (the last step is a multiple of 3)
}

// Per-GEMM recipes as arms on CUDA (precision.grad_wgrad, precision.gemm; CPU twin:
// tests/cpu/test_gemm_precision.cpp): each arm bit-identical to its single-arm run, graphs on.
TEST(ArmsGpu, PerGemmArmsEqualTheirSingleRuns) {
  MXLAB_REQUIRE_GPU();
  RunConfig multi = tiny();
  multi.steps = 20;
  multi.arms = {{"mx", "", {}},
                {"grad_wgrad_bf16", "", {{"grad_wgrad", "bf16"}}},
                {"dgrad_bf16", "", {{"gemm.dgrad", "bf16"}}},
                {"wgrad_bf16", "", {{"gemm.wgrad", "bf16"}}}};
  const MemorySink m = run_cuda(multi);
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    RunConfig single = tiny();
    single.steps = 20;
    single.precision = arm.policy;
    const MemorySink s = run_cuda(single);
    expect_same(m, "trajectories/" + arm.name, s, "trajectories/mx");
    expect_same(m, "trajectories/fp32", s, "trajectories/fp32");
    if (arm.name != "mx")
      EXPECT_NE(m.groups.at("trajectories/" + arm.name).loss_all, m.groups.at("trajectories/mx").loss_all) << arm.name;
  }
}

// precision.rotation as arms on CUDA (CPU twin: RotationArms.EachArmEqualsItsSingleRunAndRotationMatters):
// each arm bit-identical to its single-arm run, graphs on (the rotation reads the step on the device).
TEST(ArmsGpu, RotationArmsEqualTheirSingleRuns) {
  MXLAB_REQUIRE_GPU();
  RunConfig multi = tiny();
  multi.steps = 20;
  multi.arms = {{"mx", "", {}},
                {"rot_all", "", {{"rotation", "hadamard"}}},
                {"rand_rot_sr", "", {{"rotation", "random_hadamard"}, {"rounding.grad", "stochastic"}}},
                {"rot_wgrad", "", {{"rotation.wgrad", "hadamard"}}}};
  const MemorySink m = run_cuda(multi);
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    RunConfig single = tiny();
    single.steps = 20;
    single.precision = arm.policy;
    const MemorySink s = run_cuda(single);
    expect_same(m, "trajectories/" + arm.name, s, "trajectories/mx");
    expect_same(m, "trajectories/fp32", s, "trajectories/fp32");
    if (arm.name != "mx")
      EXPECT_NE(m.groups.at("trajectories/" + arm.name).loss_all, m.groups.at("trajectories/mx").loss_all) << arm.name;
  }
}

// Captured steps are keyed on every trajectory (lab/train/capture_key.h; the CPU test of the
// key is tests/cpu/test_names.cpp): a branch behind the FP32 trajectory and 30 arms (index 31,
// beyond the first 28 that an earlier key held) that starts mid-run trains in the unlogged
// steps after its start instead of a replay of the graphs recorded without it, so it equals the
// same branch of the single-arm run, bit for bit, as does its arm.
TEST(ArmsGpu, ABranchBeyondTheTwentyEighthTrajectoryTrainsUnderGraphs) {
  MXLAB_REQUIRE_GPU();
  RunConfig multi = tiny();
  for (int a = 0; a < 30; ++a) multi.arms.push_back({"a" + std::to_string(a), "", {}});
  multi.interventions = {{"late", 23, "to_fp32", {}, "a29"}};  // off the log grid: 23..29 are captured
  validate_config(multi);
  const MemorySink m = run_cuda(multi);
  RunConfig single = tiny();
  single.interventions = {{"late", 23, "to_fp32", {}}};
  const MemorySink s = run_cuda(single);
  expect_same(m, "trajectories/a29", s, "trajectories/mx");
  expect_same(m, "branches/late", s, "branches/late");
  for (float l : m.groups.at("branches/late").loss_all) EXPECT_TRUE(std::isfinite(l));
}

// snap_gamma and reset_adam_v on CUDA (CPU twin tests/cpu/test_snap_gamma.cpp): the branch's first
// step sees the function its arm saw (same loss at `at`, bit for bit, graphs on), its gamma
// clamp debt is zero there, and it trains on its own afterwards.
TEST(ArmsGpu, SnapGammaBranchStartsFromTheQuantizedGamma) {
  MXLAB_REQUIRE_GPU();
  RunConfig c = tiny();
  c.optimizer.lr = 1e-2f;
  c.interventions = {{"snap", 20, "snap_gamma", {}}, {"snap_fp32", 20, "snap_gamma+to_fp32", {}},
                     {"rv", 20, "reset_adam_v", {}}};
  const MemorySink m = run_cuda(c);
  const auto& mx = m.groups.at("trajectories/mx").loss_all;
  const auto& snap = m.groups.at("branches/snap").loss_all;
  ASSERT_EQ(snap.size(), 20u);
  EXPECT_EQ(snap[0], mx[20]);
  EXPECT_NE(snap[19], mx[39]);
  // reset_adam_v: same first loss (same weights), then its own trajectory.
  const auto& rv = m.groups.at("branches/rv").loss_all;
  EXPECT_EQ(rv[0], mx[20]);
  EXPECT_NE(rv[19], mx[39]);
  bool seen = false;
  for (const MetricRow& r : m.groups.at("branches/snap").rows) {
    if (r.step != 20 || r.axis != "step") continue;
    for (const auto& col : r.cols)
      if (col.first == "gamma_gap_mean") {
        seen = true;
        for (double g : col.second) EXPECT_EQ(g, 0.0);
      }
  }
  EXPECT_TRUE(seen);
}

// The clamp debt on CUDA (a trajectory's gaps in one batch, one pass per tensor where its
// rows are whole blocks of 32) is the CPU's, bit for bit, on the weights both backends start
// from: every gap column of step 0's row, both trajectories (MX blocks and FP32's scalar path).
TEST(ArmsGpu, ClampDebtOfTheFirstStepIsTheCpus) {
  MXLAB_REQUIRE_GPU();
  RunConfig c = tiny();
  c.steps = 1;
  c.log.log_every = 1;
  c.model.init = InitKind::pytorch;
  const MemorySink g = run_cuda(c);
  auto cpu = make_cpu_backend();
  MemorySink h;
  {
    Trainer tr(c, *cpu, h);
    tr.open_output();
    tr.finish(tr.run(RunControl{}));
  }
  size_t compared = 0;
  for (const char* group : {"trajectories/mx", "trajectories/fp32"}) {
    const MetricRow* rg = nullptr;
    const MetricRow* rh = nullptr;
    for (const MetricRow& r : g.groups.at(group).rows)
      if (r.step == 0 && r.axis == "step") rg = &r;
    for (const MetricRow& r : h.groups.at(group).rows)
      if (r.step == 0 && r.axis == "step") rh = &r;
    ASSERT_TRUE(rg && rh) << group;
    for (const auto& col : rh->cols) {
      const std::string& k = col.first;
      if (k.find("_gap_") == std::string::npos && k.find("_above_frac") == std::string::npos) continue;
      const auto it = std::find_if(rg->cols.begin(), rg->cols.end(), [&](const auto& x) { return x.first == k; });
      ASSERT_NE(it, rg->cols.end()) << group << " " << k;
      ASSERT_EQ(it->second.size(), col.second.size()) << k;
      for (size_t i = 0; i < col.second.size(); ++i) EXPECT_EQ(it->second[i], col.second[i]) << group << " " << k << i;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 16u);  // gamma, beta: mean, max, above; weights: mean, above; two trajectories
}

// data.mx_teacher_targets on CUDA (CPU twin tests/cpu/test_mx_targets.cpp): the FP32
// trajectory is untouched and the MX arm's targets differ.
TEST(ArmsGpu, MxTeacherTargetsFeedOnlyTheMxTrajectories) {
  MXLAB_REQUIRE_GPU();
  RunConfig c = tiny();
  c.steps = 20;
  c.data.label_noise = 0.0f;
  RunConfig on = c;
  on.data.mx_teacher_targets = true;
  const MemorySink a = run_cuda(c), b = run_cuda(on);
  EXPECT_EQ(a.groups.at("trajectories/fp32").loss_all, b.groups.at("trajectories/fp32").loss_all);
  EXPECT_NE(a.groups.at("trajectories/mx").loss_all, b.groups.at("trajectories/mx").loss_all);
}

// `mxlab run --jobs 2 --device cuda` (or --jobs 4 --gpus 0,1) trains two runs at once on one GPU,
// each in its own thread with its own backend, whose streams the GPU interleaves. Every run
// must write the bits it writes alone: a multi-arm run with a shadow every 3 steps and a branch,
// beside a single-arm run with another seed (kernels of the two overlap in time).
TEST(ArmsGpu, RunsSharingOneGpuAtOnceWriteTheirBitsAlone) {
  MXLAB_REQUIRE_GPU();
  RunConfig a = tiny();
  a.steps = 60;
  a.arms = {{"away", "", {}}, {"rceil", "", {{"scale_rule", "rceil"}}}};
  a.interventions = {{"fp32_at30", 30, "to_fp32", {}, "away"}};
  RunConfig b = tiny();
  b.steps = 60;
  b.seed = 6;
  b.log.bias_every = 1;
  const MemorySink a_alone = run_cuda(a), b_alone = run_cuda(b);
  for (int round = 0; round < 2; ++round) {  // two rounds: a different interleaving each time
    std::vector<MemorySink> together(2);
    std::thread ta([&] { together[0] = run_cuda(a); });
    std::thread tb([&] { together[1] = run_cuda(b); });
    ta.join();
    tb.join();
    for (const char* g : {"trajectories/fp32", "trajectories/away", "trajectories/rceil", "branches/fp32_at30"})
      expect_same(together[0], g, a_alone, g);
    for (const char* g : {"trajectories/fp32", "trajectories/mx"}) expect_same(together[1], g, b_alone, g);
  }
}

// Token data, causal attention and flash attention in bf16 on CUDA, under graphs: each arm of the
// paired run (and the branch from the flash arm) is its single-arm run bit for bit; the flash arms'
// instruments (rows with a repeated maximum, delta sums) are among the compared columns.
TEST(ArmsGpu, TokenFlashArmsEqualTheirSingleRuns) {
  MXLAB_REQUIRE_GPU();
  const RunConfig multi = token_run(20);
  const MemorySink m = run_cuda(multi);
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    RunConfig single = token_run(20);
    single.arms.clear();
    single.precision = arm.policy;
    single.interventions.clear();
    if (arm.name == "flash") single.interventions = {{"flash_fp32", 10, "to_fp32", {}}};
    const MemorySink s = run_cuda(single);
    expect_same(m, "trajectories/" + arm.name, s, "trajectories/mx");
    expect_same(m, "trajectories/fp32", s, "trajectories/fp32");
    if (arm.name == "flash") expect_same(m, "branches/flash_fp32", s, "branches/flash_fp32");
  }
  const auto& loss_mx = m.groups.at("trajectories/mx").loss_all;
  EXPECT_NE(m.groups.at("trajectories/flash").loss_all, loss_mx);
  EXPECT_NE(m.groups.at("trajectories/stabilized").loss_all, m.groups.at("trajectories/flash").loss_all);
  for (const char* g : {"trajectories/fp32", "trajectories/mx", "trajectories/flash", "trajectories/stabilized"}) {
    const auto& l = m.groups.at(g).loss_all;
    ASSERT_EQ(l.size(), 20u) << g;
    EXPECT_NEAR(l.front(), std::log(16.0), 1.0) << g;
    EXPECT_LT(l.back(), l.front()) << g << ": the chain is learnable";
  }
}

// The same token run on the CPU and on CUDA, for ModelParity's three steps: the token batches and
// the token ops are bit-identical, only the GEMMs' accumulation order differs, so the FP32
// trajectory's losses are within ModelParity's FP32 loss budget (1e-5 relative) and the rounding
// trajectories' (MX, flash, stabilized, and the branch) within its MX loss budget (1e-3).
TEST(ArmsGpu, TokenFlashRunMatchesTheCpu) {
  MXLAB_REQUIRE_GPU();
  RunConfig c = token_run(3);
  c.log.log_every = 1;
  c.interventions = {{"flash_fp32", 1, "to_fp32", {}, "flash"}};
  auto cpu = make_cpu_backend();
  const MemorySink h = run_on(*cpu, c);
  const MemorySink g = run_cuda(c);
  for (const char* t : {"trajectories/fp32", "trajectories/mx", "trajectories/flash", "trajectories/stabilized",
                        "branches/flash_fp32"}) {
    const auto& lc = h.groups.at(t).loss_all;
    const auto& lg = g.groups.at(t).loss_all;
    ASSERT_EQ(lc.size(), lg.size()) << t;
    ASSERT_FALSE(lc.empty()) << t;
    double worst = 0.0;
    for (size_t i = 0; i < lc.size(); ++i) {
      ASSERT_TRUE(std::isfinite(lc[i]) && std::isfinite(lg[i])) << t << " step " << i;
      worst = std::max(worst, std::fabs(static_cast<double>(lg[i]) - lc[i]) / std::fabs(static_cast<double>(lc[i])));
    }
    std::printf("[tokens] %s: largest relative loss difference CPU vs CUDA over %zu steps %.3g\n", t, lc.size(), worst);
    EXPECT_LE(worst, std::string(t) == "trajectories/fp32" ? 1e-5 : 1e-3) << t;
  }
}

// The attention projections' instruments on CUDA (CPU twin: tests/cpu/test_attn_instruments.cpp)
// are computed on the host from downloaded buffers, so where the CPU and CUDA weights are the same
// bits their spectral norms must be too. With lr = 1e-30 no element of Wqkv moves (every Adam
// update is far below half an ulp of the weights), on either backend, so every row of every
// trajectory holds the initial weights of the CPU run: attn_wq_spec, attn_wk_spec, attn_wv_spec
// equal the CPU's bit for bit in every row. The gradients are not the CPU's bits (GEMM order), so
// attn_dwq_err_cos is held to its pattern: NaN exactly where the CPU's is (the FP32 trajectory,
// row 0, rows without a shadow pass), within [-1, 1] elsewhere, and printed beside the CPU's.
TEST(ArmsGpu, AttentionWeightInstrumentsMatchTheCpuOnTheSameWeights) {
  MXLAB_REQUIRE_GPU();
  RunConfig c = token_run(5);
  c.log.log_every = 1;
  c.log.bias_every = 2;  // shadow rows 0, 2, 4: rows 1 and 3 have none
  c.optimizer.lr = 1e-30f;
  validate_config(c);
  auto cpu = make_cpu_backend();
  const MemorySink h = run_on(*cpu, c);
  const MemorySink g = run_cuda(c);
  auto rows_of = [](const MemorySink& s, const std::string& group, const std::string& m) {
    std::vector<std::vector<double>> out;
    for (const MetricRow& r : s.groups.at(group).rows)
      if (r.axis == "step")
        for (const auto& col : r.cols)
          if (col.first == m) out.push_back(col.second);
    return out;
  };
  size_t bitwise = 0, finite_cos = 0;
  for (const char* t : {"trajectories/fp32", "trajectories/mx", "trajectories/flash", "trajectories/stabilized",
                        "branches/flash_fp32"}) {
    for (const char* m : {"attn_wq_spec", "attn_wk_spec", "attn_wv_spec"}) {
      const auto a = rows_of(h, t, m), b = rows_of(g, t, m);
      ASSERT_EQ(a.size(), b.size()) << t << " " << m;
      ASSERT_FALSE(a.empty()) << t << " " << m;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].size(), 2u);
        ASSERT_EQ(b[i].size(), 2u);
        for (size_t l = 0; l < 2; ++l) {
          EXPECT_EQ(a[i][l], a[0][l]) << t << " " << m << " row " << i << ": the CPU weights moved (lr too large?)";
          EXPECT_TRUE(std::memcmp(&a[i][l], &b[i][l], sizeof(double)) == 0)
              << t << " " << m << " row " << i << " layer " << l << ": CPU " << a[i][l] << " CUDA " << b[i][l];
          ++bitwise;
        }
      }
    }
    const auto a = rows_of(h, t, "attn_dwq_err_cos"), b = rows_of(g, t, "attn_dwq_err_cos");
    ASSERT_EQ(a.size(), b.size()) << t;
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t l = 0; l < 2; ++l) {
        const double x = a[i][l], y = b[i][l];
        std::printf("[attn_dwq_err_cos] %s row %zu layer %zu: CPU %.6f CUDA %.6f\n", t, i, l, x, y);
        if (std::string(t) == "branches/flash_fp32") continue;  // g~ = g-bar bit for bit on the CPU; not required here
        EXPECT_EQ(std::isnan(x), std::isnan(y)) << t << " row " << i << " layer " << l << ": CPU " << x << " CUDA " << y;
        if (!std::isnan(y)) {
          EXPECT_TRUE(y >= -1.0 && y <= 1.0) << t << " row " << i << ": " << y;
          ++finite_cos;
        }
      }
  }
  EXPECT_EQ(bitwise, (4u * 5u + 1u) * 3u * 2u);  // 4 groups of 5 rows, the branch's 1 (it starts at 4); 3 norms, 2 layers
  EXPECT_EQ(finite_cos, 3u * 2u * 2u);    // mx, flash, stabilized: rows 2 and 4, 2 layers
}
