// The causal study's E3 (results/prereg/why_mx.md, "E3 - bias, variance or Adam?") as
// experiments/paper/why_mx_e3.yaml writes it: `mxlab plan` reads it (120 runs, no warning), the
// seeds, lr and horizon of the pre-registration, the three optimizer settings (default Adam,
// eps 1e-6, beta2 0.95), the arms of each and the policies they resolve to (mx_all = the emulator
// recipe; noise_mx = its roles under `rounding: noise` with FP32 element-wise ops and nothing else
// changed; mx_sr_grad = its dY stochastically rounded and nothing else changed), and that the
// default runs' FP32 trajectory and mx_all are E1's of the same seed (same configuration but for
// the name and the other arms, so the same trajectories: an arm equals the single run of its
// recipe, tests/cpu/test_arms.cpp).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "lab/config/config.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "tests/cpu/run_binary_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

const std::string kE3 = std::string(MXLAB_SOURCE_DIR) + "/experiments/paper/why_mx_e3.yaml";
const std::string kE1 = std::string(MXLAB_SOURCE_DIR) + "/experiments/paper/why_mx_e1.yaml";

std::optional<PrecisionConfig> arm_policy(const RunConfig& c, const std::string& name) {
  for (const ResolvedArm& a : resolved_arms(c))
    if (a.name == name) return a.policy;
  return std::nullopt;
}

}  // namespace

TEST(WhyMxE3, PlanReadsTheFileWithoutWarnings) {
  const Proc p = run_mxlab({"plan", kE3});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "total: 120 runs")) << p.output;
  EXPECT_FALSE(contains(p.output, "warning")) << p.output;
  EXPECT_EQ(precision_only_sweep_warning(expand_experiment(kE3)), "");
}

TEST(WhyMxE3, RunsFollowThePreRegistration) {
  const std::vector<ExpandedRun> runs = expand_experiment(kE3);
  ASSERT_EQ(runs.size(), 120u);
  const float eps[3] = {1e-8f, 1e-6f, 1e-8f}, beta2[3] = {0.999f, 0.999f, 0.95f};
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunConfig& c = runs[i].cfg;
    const size_t setting = i / 40;
    EXPECT_EQ(c.seed, 200 + i % 40) << i;
    EXPECT_EQ(c.steps, 20000);
    EXPECT_FLOAT_EQ(c.optimizer.lr, 5.0e-4f);
    EXPECT_EQ(c.optimizer.name, OptKind::adam);
    EXPECT_EQ(c.optimizer.beta1, 0.9f);
    EXPECT_EQ(c.optimizer.eps, eps[setting]) << i;
    EXPECT_EQ(c.optimizer.beta2, beta2[setting]) << i;
    EXPECT_EQ(c.name, "why_mx_e3");
    // Apart from the optimizer and the arms, every run is the default run of its seed.
    RunConfig same = c;
    same.optimizer = runs[i % 40].cfg.optimizer;
    same.arms = runs[i % 40].cfg.arms;
    EXPECT_TRUE(same == runs[i % 40].cfg) << i;
    std::vector<std::string> names;
    for (const ArmConfig& a : c.arms) names.push_back(a.name);
    const std::vector<std::string> want =
        setting == 0 ? std::vector<std::string>{"mx_all", "noise_mx", "mx_sr_grad"} : std::vector<std::string>{"mx_all"};
    EXPECT_EQ(names, want) << i;
  }
}

TEST(WhyMxE3, ArmsResolveToTheIntendedPolicies) {
  const std::vector<ExpandedRun> runs = expand_experiment(kE3);
  const RunConfig& c = runs[0].cfg;
  const std::optional<PrecisionConfig> mx = arm_policy(c, "mx_all");
  ASSERT_TRUE(mx);
  const PrecisionConfig mx_all = *mx;
  // MX-all: every role MXFP8 E4M3 (W, X, dY in both backward GEMMs, gamma and beta), block 32,
  // floor scale, ties-away elements and bf16 element-wise ops, the lab's fused ops.
  using R = PrecisionConfig::Role;
  for (NumFmt f : {mx_all.weight, mx_all.activation, mx_all.grad, mx_all.weight_bwd_fmt(), mx_all.activation_bwd_fmt(),
                   mx_all.grad_wgrad_fmt(), mx_all.ln_affine})
    EXPECT_EQ(f, NumFmt::mxfp8_e4m3);
  EXPECT_EQ(mx_all.block_size, 32);
  EXPECT_EQ(mx_all.scale_rule, ScaleRule::floor);
  EXPECT_TRUE(mx_all.backward);
  for (R r : {R::weight, R::activation, R::grad, R::ln_affine, R::grad_wgrad})
    EXPECT_EQ(mx_all.rounding_of(r), Rounding::nearest_away);
  EXPECT_TRUE(mx_all.elementwise_bf16);
  EXPECT_EQ(mx_all.elementwise_rounding, Rounding::nearest_away);
  EXPECT_EQ(mx_all.layernorm, LnOps::fused);
  EXPECT_TRUE(mx_all.ln_beta_grad);
  EXPECT_TRUE(mx_all == c.precision);

  // noise_mx: the same roles, each under noise; FP32 element-wise ops; nothing else changed.
  const std::optional<PrecisionConfig> noise = arm_policy(c, "noise_mx");
  ASSERT_TRUE(noise);
  PrecisionConfig want = mx_all;
  want.rounding = Rounding::noise;
  want.elementwise_bf16 = false;
  EXPECT_TRUE(*noise == want) << describe_policy(*noise);
  for (R r : {R::weight, R::activation, R::grad, R::ln_affine, R::grad_wgrad})
    EXPECT_EQ(noise->rounding_of(r), Rounding::noise);

  // mx_sr_grad: dY stochastically rounded in the Dgrad and the Wgrad GEMMs, nothing else changed.
  const std::optional<PrecisionConfig> sr = arm_policy(c, "mx_sr_grad");
  ASSERT_TRUE(sr);
  want = mx_all;
  want.rounding_grad = Rounding::stochastic;
  EXPECT_TRUE(*sr == want) << describe_policy(*sr);
  EXPECT_EQ(sr->rounding_of(R::grad_wgrad), Rounding::stochastic);
  for (R r : {R::weight, R::activation, R::ln_affine}) EXPECT_EQ(sr->rounding_of(r), Rounding::nearest_away);

  // The Adam runs' one arm is the same mx_all.
  for (size_t i : {40u, 80u}) {
    const std::vector<ResolvedArm> a = resolved_arms(runs[i].cfg);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].name, "mx_all");
    EXPECT_TRUE(a[0].policy == mx_all) << i;
  }
}

TEST(WhyMxE3, DefaultRunsTrainE1sFp32AndMxAllTrajectories) {
  const std::vector<ExpandedRun> e3 = expand_experiment(kE3), e1 = expand_experiment(kE1);
  ASSERT_EQ(e1.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    RunConfig c = e1[i].cfg;
    c.name = e3[i].cfg.name;
    c.arms = e3[i].cfg.arms;
    EXPECT_TRUE(c == e3[i].cfg) << "seed " << e1[i].cfg.seed;
    ASSERT_EQ(e1[i].cfg.arms[0].name, "mx_all");
    EXPECT_TRUE(resolved_arms(e1[i].cfg)[0].policy == resolved_arms(e3[i].cfg)[0].policy);
  }
}
