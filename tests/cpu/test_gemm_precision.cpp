// Per-GEMM precision: the gradient operand of the weight-gradient GEMMs as a role of its own
// (precision.grad_wgrad, and its rounding mode), and `precision.gemm: {fprop, dgrad, wgrad}`,
// which sets both operand roles of one GEMM. Configuration (parse, print, round trip, run ids of
// existing configurations, the gemm expansion and its conflicts, patches, --set, sweeps), and
// whole runs: an arm with the new keys is bit-identical to the single-arm run of its recipe.
// The model's side (which GEMM reads which role, the bits against the dense composition) is in
// test_model.cpp (ModelMx.WgradGradientOperandHasARoleOfItsOwn, MatchesExplicitCompositionBitForBit).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

using Role = PrecisionConfig::Role;

RunConfig load(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return config_from_yaml_string(yaml, "g.yaml", overrides);
}

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return test::config_error(yaml, "g.yaml", overrides);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The operand formats of the three GEMMs of a linear layer under `p`, as the model resolves
// them: {X, W} of Fprop, {dY, W} of Dgrad, {dY, X} of Wgrad.
struct GemmFormats {
  NumFmt fprop_x, fprop_w, dgrad_dy, dgrad_w, wgrad_dy, wgrad_x;
  bool operator==(const GemmFormats& o) const {
    return fprop_x == o.fprop_x && fprop_w == o.fprop_w && dgrad_dy == o.dgrad_dy && dgrad_w == o.dgrad_w &&
           wgrad_dy == o.wgrad_dy && wgrad_x == o.wgrad_x;
  }
};
GemmFormats formats(const PrecisionConfig& p) {
  return {p.activation, p.weight, p.grad, p.weight_bwd_fmt(), p.grad_wgrad_fmt(), p.activation_bwd_fmt()};
}
std::ostream& operator<<(std::ostream& os, const GemmFormats& g) {
  return os << "fprop {" << name(g.fprop_x) << ", " << name(g.fprop_w) << "} dgrad {" << name(g.dgrad_dy) << ", "
            << name(g.dgrad_w) << "} wgrad {" << name(g.wgrad_dy) << ", " << name(g.wgrad_x) << "}";
}

}  // namespace

TEST(GradWgrad, ParsesPrintsAndRoundTrips) {
  const RunConfig d;
  EXPECT_FALSE(d.precision.grad_wgrad.has_value());
  EXPECT_EQ(d.precision.grad_wgrad_fmt(), NumFmt::mxfp8_e4m3);
  EXPECT_TRUE(has(dump_config(d), "  grad_wgrad: same\n"));

  const RunConfig b = load("precision: {grad: mxfp8_e4m3, grad_wgrad: bf16}\n");
  EXPECT_EQ(b.precision.grad_wgrad_fmt(), NumFmt::bf16);
  EXPECT_EQ(b.precision.grad, NumFmt::mxfp8_e4m3);
  EXPECT_TRUE(has(dump_config(b), "  grad_wgrad: bf16\n"));
  EXPECT_TRUE(load(dump_config(b)) == b);
  EXPECT_TRUE(has(describe_policy(b.precision), " grad=mxfp8_e4m3 "));
  EXPECT_TRUE(has(describe_policy(b.precision), " grad_wgrad=bf16 "));

  // `same` follows grad, also when a patch changes grad later.
  const RunConfig s = load("precision: {grad: mxfp6_e3m2, grad_wgrad: same}\n");
  EXPECT_FALSE(s.precision.grad_wgrad.has_value());
  EXPECT_EQ(s.precision.grad_wgrad_fmt(), NumFmt::mxfp6_e3m2);
  EXPECT_EQ(apply_intervention(s.precision, {"x", 1, "", {{"grad", "bf16"}}}).grad_wgrad_fmt(), NumFmt::bf16);
  // An explicit format stays when grad changes: hashed as written (another run id than `same`).
  const RunConfig e = load("precision: {grad: mxfp6_e3m2, grad_wgrad: mxfp6_e3m2}\n");
  EXPECT_EQ(apply_intervention(e.precision, {"x", 1, "", {{"grad", "bf16"}}}).grad_wgrad_fmt(), NumFmt::mxfp6_e3m2);
  EXPECT_NE(config_hash(e), config_hash(s));
  EXPECT_FALSE(e == s);

  // to_fp32 makes it fp32 too (the FP32 trajectory's policy has no MX operand left).
  EXPECT_EQ(apply_intervention(b.precision, {"x", 1, "to_fp32", {}}).grad_wgrad_fmt(), NumFmt::fp32);
  EXPECT_EQ(PrecisionConfig::fp32().grad_wgrad_fmt(), NumFmt::fp32);

  // An MX grad_wgrad needs the width to be a multiple of the block like every MX role.
  EXPECT_TRUE(has(error_of("model: {width: 48}\nprecision: {weight: bf16, activation: bf16, grad: bf16, "
                           "ln_affine: none, grad_wgrad: mxfp8_e4m3}\n"),
                  "MX role grad_wgrad needs"));
  EXPECT_TRUE(has(error_of("precision: {grad_wgrad: bf17}\n"), "g.yaml:1: precision.grad_wgrad: unknown format 'bf17'"));
}

TEST(GradWgrad, RoundingModeFollowsGradUnlessGiven) {
  // `rounding: {grad: M}` reaches both gradient operands, as before the role existed.
  const RunConfig g = load("precision: {rounding: {grad: stochastic}}\n");
  EXPECT_EQ(g.precision.rounding_of(Role::grad_wgrad), Rounding::stochastic);
  EXPECT_FALSE(g.precision.rounding_grad_wgrad.has_value());
  EXPECT_TRUE(has(dump_config(g),
                  "  rounding: {weight: nearest_even, activation: nearest_even, grad: stochastic, ln_affine: nearest_even}\n"));
  // Its own mode: printed in the mapping, kept when grad's changes, round-trips.
  const RunConfig w = load("precision: {rounding: {grad_wgrad: stochastic}}\n");
  EXPECT_EQ(w.precision.rounding_of(Role::grad_wgrad), Rounding::stochastic);
  EXPECT_EQ(w.precision.rounding_of(Role::grad), Rounding::nearest_even);
  EXPECT_FALSE(w.precision.rounding_uniform());
  EXPECT_TRUE(has(dump_config(w), "  rounding: {weight: nearest_even, activation: nearest_even, grad: nearest_even, "
                                  "ln_affine: nearest_even, grad_wgrad: stochastic}\n"));
  EXPECT_TRUE(load(dump_config(w)) == w);
  EXPECT_TRUE(has(describe_policy(w.precision), "rounding=weight:nearest_even,activation:nearest_even,grad:nearest_even,"
                                               "ln_affine:nearest_even,grad_wgrad:stochastic "));
  const PrecisionConfig wg = apply_intervention(w.precision, {"x", 1, "", {{"rounding.grad", "nearest_away"}}});
  EXPECT_EQ(wg.rounding_of(Role::grad_wgrad), Rounding::stochastic);
  // One mode for every role resets it too.
  EXPECT_EQ(apply_intervention(w.precision, {"x", 1, "", {{"rounding", "nearest_away"}}}).rounding_of(Role::grad_wgrad),
            Rounding::nearest_away);
  // Given, though equal to grad's, it is as written: another configuration than the one mode.
  const RunConfig eq = load("precision: {rounding: {grad_wgrad: nearest_even}}\n");
  EXPECT_TRUE(eq.precision.rounding_uniform());
  EXPECT_FALSE(eq == RunConfig{});
  EXPECT_TRUE(load(dump_config(eq)) == eq);
  // --set of one role over a one-mode file: grad's mode still reaches the wgrad operand (the
  // spelt-out mapping leaves grad_wgrad to follow grad), and grad_wgrad can be set alone.
  const RunConfig sg = load("precision: {rounding: nearest_away}\n", {"precision.rounding.grad=stochastic"});
  EXPECT_EQ(sg.precision.rounding_of(Role::grad_wgrad), Rounding::stochastic);
  EXPECT_EQ(sg.precision.rounding_of(Role::weight), Rounding::nearest_away);
  const RunConfig sw = load("precision: {rounding: nearest_away}\n", {"precision.rounding.grad_wgrad=toward_zero"});
  EXPECT_EQ(sw.precision.rounding_of(Role::grad_wgrad), Rounding::toward_zero);
  EXPECT_EQ(sw.precision.rounding_of(Role::grad), Rounding::nearest_away);
  EXPECT_TRUE(has(error_of("precision: {rounding: {grad_wgard: stochastic}}\n"), "did you mean 'grad_wgrad'"));
  // In patches: `rounding: {grad_wgrad: M}` and `rounding.grad_wgrad: M`.
  const RunConfig a = load("arms:\n  - {name: a, set: {rounding: {grad_wgrad: stochastic}}}\n"
                           "  - {name: b, set: {rounding.grad_wgrad: stochastic}}\n");
  EXPECT_EQ(a.arms[0].set, a.arms[1].set);
  EXPECT_EQ(resolved_arms(a)[0].policy.rounding_of(Role::grad_wgrad), Rounding::stochastic);
  EXPECT_EQ(resolved_arms(a)[0].policy.rounding_of(Role::grad), Rounding::nearest_even);
}

// Configurations that do not use the new keys keep their run ids (results/ and earlier run
// directories are found by them) and their printed text, bar the new `grad_wgrad: same` line.
TEST(GradWgrad, RunIdsOfExistingConfigurationsAreUnchanged) {
  const std::string src = MXLAB_SOURCE_DIR;
  EXPECT_FALSE(has(canonical_config_text(RunConfig{}), "grad_wgrad"));
  EXPECT_EQ(config_hash(RunConfig{}), "2f848def76bf");
  // Per-role rounding (in the file and in patches) and --set of one role: ids printed by
  // `mxlab dump-config --id` at the commit before the grad_wgrad role (4a15c32).
  const std::string per_role =
      "seed: 3\nprecision: {rounding: {grad: nearest_away, weight: stochastic}}\n"
      "arms:\n  - {name: g, set: {rounding: {grad: nearest_even}}}\n"
      "interventions:\n  - {name: x, at: 5, from: g, set: {rounding.grad: stochastic, weight_bwd: bf16}}\n";
  EXPECT_EQ(config_hash(load(per_role)), "2a9b381574c7");
  EXPECT_EQ(config_hash(load(per_role, {"precision.rounding=nearest_away", "precision.rounding.grad=toward_zero"})),
            "5b4a9d9055cb");
  // The published study with per-role rounding arms: every run id in its committed summary.
  std::ifstream csv(src + "/results/study_arms/summary_study_arms_shardall.csv");
  ASSERT_TRUE(csv.good());
  std::map<uint64_t, std::string> published;  // seed -> run id
  std::string line;
  std::getline(csv, line);  // header: run_id,group,at,seed,...
  while (std::getline(csv, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    ASSERT_GE(cells.size(), 4u) << line;
    published[std::stoull(cells[3])] = cells[0];
  }
  ASSERT_GE(published.size(), 20u);
  size_t matched = 0;
  for (const ExpandedRun& r : expand_experiment(src + "/experiments/paper/study_arms_lr5e-4.yaml")) {
    const auto it = published.find(r.cfg.seed);
    if (it == published.end()) continue;
    EXPECT_EQ(r.id, it->second) << "seed " << r.cfg.seed;
    ++matched;
  }
  EXPECT_EQ(matched, published.size());
}

TEST(GemmKey, ExpandsToTheOperandRolesOfItsGemmOnly) {
  const GemmFormats mx = formats(PrecisionConfig{});
  const NumFmt M = NumFmt::mxfp8_e4m3, F = NumFmt::bf16;
  // Each GEMM alone in bf16: the other two GEMMs keep every operand (the `same` roles that
  // would follow a changed one are pinned).
  EXPECT_EQ(formats(load("precision: {gemm: {fprop: bf16}}\n").precision), (GemmFormats{F, F, M, M, M, M}));
  EXPECT_EQ(formats(load("precision: {gemm: {dgrad: bf16}}\n").precision), (GemmFormats{M, M, F, F, M, M}));
  EXPECT_EQ(formats(load("precision: {gemm: {wgrad: bf16}}\n").precision), (GemmFormats{M, M, M, M, F, F}));
  // Each GEMM alone in MX, the others bf16.
  EXPECT_EQ(formats(load("precision: {gemm: {fprop: mxfp8_e4m3, dgrad: bf16, wgrad: bf16}}\n").precision),
            (GemmFormats{M, M, F, F, F, F}));
  EXPECT_EQ(formats(load("precision: {gemm: {fprop: bf16, dgrad: mxfp8_e4m3, wgrad: bf16}}\n").precision),
            (GemmFormats{F, F, M, M, F, F}));
  EXPECT_EQ(formats(load("precision: {gemm: {wgrad: mxfp8_e4m3, fprop: bf16, dgrad: bf16}}\n").precision),
            (GemmFormats{F, F, F, F, M, M}));
  EXPECT_EQ(formats(load("precision: {gemm: {}}\n").precision), mx);
  EXPECT_EQ(formats(load("precision: {gemm: }\n").precision), mx);
}

TEST(GemmKey, PinsTheOtherGemmsRolesToTheFormatsGivenBeside) {
  const NumFmt M = NumFmt::mxfp8_e4m3, F = NumFmt::bf16, E = NumFmt::mxfp8_e5m2, S = NumFmt::mxfp6_e3m2;
  // weight / activation given (not fprop's own roles when only dgrad or wgrad is given): the
  // Dgrad W and Wgrad X that follow them still do.
  EXPECT_EQ(formats(load("precision: {weight: mxfp8_e5m2, activation: mxfp6_e3m2, gemm: {wgrad: bf16}}\n").precision),
            (GemmFormats{S, E, M, E, F, F}));
  EXPECT_EQ(formats(load("precision: {grad_wgrad: mxfp8_e5m2, gemm: {dgrad: bf16}}\n").precision),
            (GemmFormats{M, M, F, F, E, M}));
  EXPECT_EQ(formats(load("precision: {weight_bwd: mxfp8_e5m2, gemm: {fprop: bf16}}\n").precision),
            (GemmFormats{F, F, M, E, M, M}));
  // The expansion is the roles it sets: the same configuration and run id as spelling them out.
  const RunConfig g = load("precision: {gemm: {dgrad: bf16}}\n");
  const RunConfig r = load("precision: {grad: bf16, weight_bwd: bf16, grad_wgrad: mxfp8_e4m3}\n");
  EXPECT_TRUE(g == r);
  EXPECT_EQ(config_hash(g), config_hash(r));
  EXPECT_FALSE(has(dump_config(g), "gemm"));
  EXPECT_TRUE(load(dump_config(g)) == g);
}

TEST(GemmKey, RefusesARoleKeyOfTheSameGemm) {
  std::string e = error_of("precision:\n  weight: bf16\n  gemm: {fprop: bf16}\n");
  EXPECT_TRUE(has(e, "g.yaml:3: precision.gemm.fprop sets weight and activation, and precision.weight is also "
                     "given (g.yaml:2): keep one of the two"))
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_TRUE(has(error_of("precision: {gemm: {dgrad: bf16}, weight_bwd: same}\n"), "precision.weight_bwd is also given"));
  EXPECT_TRUE(has(error_of("precision: {gemm: {wgrad: bf16}, grad_wgrad: bf16}\n"), "precision.grad_wgrad is also given"));
  EXPECT_TRUE(has(error_of("precision: {gemm: {wgrad: bf16}, activation_bwd: bf16}\n"),
                  "precision.activation_bwd is also given"));
  // From --set, either way round, and from a file it extends (one merged mapping).
  e = error_of("precision: {gemm: {wgrad: bf16}}\n", {"precision.activation_bwd=fp32"});
  EXPECT_TRUE(has(e, "precision.activation_bwd is also given (--set precision.activation_bwd=fp32)")) << e;
  e = error_of("precision: {grad: bf16}\n", {"precision.gemm.dgrad=fp16"});
  EXPECT_TRUE(has(e, "--set precision.gemm.dgrad=fp16: precision.gemm.dgrad sets grad and weight_bwd")) << e;
  test::TempDir dir;
  dir.write("base.yaml", "precision: {grad: bf16}\n");
  const std::string child = dir.write("child.yaml", "extends: base.yaml\nprecision: {gemm: {dgrad: bf16}}\n");
  e = "";
  try {
    load_config(child);
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_TRUE(has(e, "precision.grad is also given (" + dir.str() + "/base.yaml:1)")) << e;
  // Bad GEMM names and values.
  EXPECT_TRUE(has(error_of("precision: {gemm: {wgard: bf16}}\n"), "unknown GEMM 'wgard' in precision.gemm (did you mean 'wgrad'?"));
  EXPECT_TRUE(has(error_of("precision: {gemm: {wgrad: same}}\n"), "precision.gemm.wgrad: unknown format 'same'"));
  EXPECT_TRUE(has(error_of("precision: {gemm: bf16}\n"), "precision.gemm: expected a mapping of GEMMs to formats"));
  EXPECT_TRUE(has(error_of("precision: {gem: {wgrad: bf16}}\n"), "did you mean 'gemm'"));
  // Through the binary: exit 2 and one line.
  const std::string path = dir.write("bad.yaml", "precision:\n  grad: bf16\n  gemm: {dgrad: fp16}\n");
  const testutil::Proc p = testutil::run_mxlab({"dump-config", path});
  EXPECT_EQ(p.exit_code, 2) << p.output;
  EXPECT_EQ(testutil::count_of(p.output, "\n"), 1) << p.output;
  EXPECT_TRUE(has(p.output, "bad.yaml:3: precision.gemm.dgrad sets grad and weight_bwd")) << p.output;
}

TEST(GemmKey, WorksInSetOverridesSweepsAndPatches) {
  const NumFmt M = NumFmt::mxfp8_e4m3, F = NumFmt::bf16;
  // --set, one GEMM or the mapping.
  EXPECT_EQ(formats(load("steps: 5\n", {"precision.gemm.wgrad=bf16"}).precision), (GemmFormats{M, M, M, M, F, F}));
  EXPECT_EQ(formats(load("steps: 5\n", {"precision.gemm={fprop: bf16}"}).precision), (GemmFormats{F, F, M, M, M, M}));
  EXPECT_TRUE(has(error_of("steps: 5\n", {"precision.gemm.wgard=bf16"}), "unknown key 'precision.gemm.wgard'"));
  // A sweep over one GEMM's format.
  const std::vector<ExpandedRun> runs =
      expand_experiment_string("sweep: {grid: {precision.gemm.wgrad: [bf16, mxfp8_e4m3]}}\n", "s.yaml", {});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(formats(runs[0].cfg.precision), (GemmFormats{M, M, M, M, F, F}));
  EXPECT_EQ(formats(runs[1].cfg.precision), (GemmFormats{M, M, M, M, M, M}));
  EXPECT_NE(runs[1].id, config_hash(RunConfig{}));  // explicit formats, as written

  // Patches: `gemm: {...}` or `gemm.<GEMM>: F`, stored as gemm.<GEMM>, applied to the base policy
  // (the arm's GEMM overrides the base's roles; the pins read the base).
  const RunConfig a = load(
      "precision: {weight: mxfp8_e5m2, grad: mxfp6_e3m2, rounding: nearest_away}\n"
      "arms:\n"
      "  - {name: base}\n"
      "  - {name: fprop_bf16, set: {gemm: {fprop: bf16}}}\n"
      "  - {name: dgrad_bf16, set: {gemm.dgrad: bf16}}\n"
      "  - {name: wgrad_bf16, set: {gemm: {wgrad: bf16}, rounding: {grad: nearest_even}}}\n"
      "  - {name: only_wgrad_mx, apply: to_fp32, set: {gemm: {wgrad: mxfp8_e4m3}, elementwise: bf16}}\n");
  const NumFmt E = NumFmt::mxfp8_e5m2, S = NumFmt::mxfp6_e3m2, X = NumFmt::fp32;
  const std::vector<ResolvedArm> arms = resolved_arms(a);
  ASSERT_EQ(arms.size(), 5u);
  EXPECT_EQ(formats(arms[0].policy), (GemmFormats{M, E, S, E, S, M}));
  EXPECT_EQ(formats(arms[1].policy), (GemmFormats{F, F, S, E, S, M}));
  EXPECT_EQ(formats(arms[2].policy), (GemmFormats{M, E, F, F, S, M}));
  EXPECT_EQ(formats(arms[3].policy), (GemmFormats{M, E, S, E, F, F}));
  EXPECT_EQ(arms[3].policy.rounding_of(Role::grad_wgrad), Rounding::nearest_even);
  EXPECT_EQ(formats(arms[4].policy), (GemmFormats{X, X, X, X, M, M}));
  EXPECT_EQ(a.arms[1].set, (std::map<std::string, std::string>{{"gemm.fprop", "bf16"}}));
  EXPECT_EQ(a.arms[2].set, (std::map<std::string, std::string>{{"gemm.dgrad", "bf16"}}));
  EXPECT_TRUE(has(dump_config(a), "    set: {gemm.fprop: bf16}\n"));
  EXPECT_TRUE(load(dump_config(a)) == a);
  // A patch may not give a GEMM and one of its roles.
  std::string e = error_of("arms:\n  - {name: w, set: {gemm: {wgrad: bf16}, activation_bwd: fp32}}\n");
  EXPECT_TRUE(has(e, "g.yaml:2: patch 'w': set gives gemm.wgrad (which sets grad_wgrad and activation_bwd) and "
                     "activation_bwd: keep one of the two"))
      << e;
  EXPECT_TRUE(has(error_of("arms:\n  - {name: w, set: {gemm: {wgard: bf16}}}\n"), "unknown GEMM 'wgard'"));
  EXPECT_TRUE(has(error_of("arms:\n  - {name: w, set: {gemm: bf16}}\n"), "arms[0].set.gemm: expected a mapping"));
  EXPECT_TRUE(has(error_of("arms:\n  - {name: w, set: {gemmm: bf16}}\n"), "did you mean 'gemm'"));
  // Interventions take the same patches (from the arm's policy at `at`).
  const RunConfig iv = load("steps: 10\ninterventions:\n  - {name: w, at: 5, set: {gemm: {wgrad: bf16}}}\n");
  EXPECT_EQ(formats(apply_intervention(iv.precision, iv.interventions[0])), (GemmFormats{M, M, M, M, F, F}));
  EXPECT_THROW(apply_intervention(PrecisionConfig{}, {"x", 1, "", {{"gemm.dgrad", "bf16"}, {"grad", "bf16"}}}), Error);
}

namespace {

RunConfig tiny() {
  RunConfig c;
  c.seed = 11;
  c.steps = 12;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 40;
  c.optimizer.lr = 3e-3f;
  c.precision.rounding = Rounding::nearest_away;
  c.precision.elementwise_rounding = Rounding::nearest_away;
  c.log.log_every = 4;
  c.log.bias_every = 3;
  c.log.progress = false;
  return c;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same_rows(const MemorySink& a, const std::string& ga, const MemorySink& b, const std::string& gb) {
  const auto& ra = a.groups.at(ga).rows;
  const auto& rb = b.groups.at(gb).rows;
  ASSERT_EQ(ra.size(), rb.size()) << ga << " vs " << gb;
  for (size_t i = 0; i < ra.size(); ++i) {
    ASSERT_EQ(ra[i].step, rb[i].step);
    ASSERT_EQ(ra[i].cols.size(), rb[i].cols.size());
    for (size_t c = 0; c < ra[i].cols.size(); ++c)
      for (size_t k = 0; k < ra[i].cols[c].second.size(); ++k)
        ASSERT_TRUE(same_bits(ra[i].cols[c].second[k], rb[i].cols[c].second[k]))
            << ga << " step " << ra[i].step << " " << ra[i].cols[c].first << "[" << k << "]";
  }
  const auto& la = a.groups.at(ga).loss_all;
  const auto& lb = b.groups.at(gb).loss_all;
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << ga;
}

}  // namespace

// Arms with per-GEMM recipes train in lock-step, each bit-identical to its single-arm run; the
// recipes matter (each GEMM's format moves the trajectory); an explicit grad_wgrad equal to
// grad is the default run bit for bit.
TEST(GemmArms, EachArmEqualsItsSingleRunAndEveryGemmMatters) {
  RunConfig multi = tiny();
  multi.arms = {{"mx", "", {}},
                {"grad_wgrad_bf16", "", {{"grad_wgrad", "bf16"}}},
                {"fprop_bf16", "", {{"gemm.fprop", "bf16"}}},
                {"dgrad_bf16", "", {{"gemm.dgrad", "bf16"}}},
                {"wgrad_bf16", "", {{"gemm.wgrad", "bf16"}}},
                {"wgrad_own_mode", "", {{"rounding.grad_wgrad", "toward_zero"}}}};
  ASSERT_NO_THROW(validate_config(multi));
  const MemorySink m = test::run_in_memory(multi);
  std::map<std::string, std::vector<float>> losses;
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    SCOPED_TRACE(arm.name);
    RunConfig single = tiny();
    single.precision = arm.policy;
    const MemorySink s = test::run_in_memory(single);
    expect_same_rows(m, "trajectories/" + arm.name, s, "trajectories/mx");
    expect_same_rows(m, "trajectories/fp32", s, "trajectories/fp32");
    EXPECT_TRUE(has(m.groups.at("trajectories/" + arm.name).attrs.str.at("policy"),
                    " grad_wgrad=" + std::string(name(arm.policy.grad_wgrad_fmt())) + " "));
    losses[arm.name] = m.groups.at("trajectories/" + arm.name).loss_all;
  }
  for (const auto& [arm, loss] : losses) {
    if (arm != "mx") {
      EXPECT_NE(loss, losses.at("mx")) << arm << " trains like the default arm";
    }
  }
  EXPECT_NE(losses.at("wgrad_bf16"), losses.at("grad_wgrad_bf16"));  // activation_bwd matters too
  // The split key at the default's format is the default run.
  RunConfig same = tiny();
  same.precision.grad_wgrad = same.precision.grad;
  const MemorySink a = test::run_in_memory(same), b = test::run_in_memory(tiny());
  expect_same_rows(a, "trajectories/mx", b, "trajectories/mx");
}
