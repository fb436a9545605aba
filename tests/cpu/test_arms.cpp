// Multi-arm runs and per-role rounding on the CPU backend: configuration,
// bit-identity of an arm with the single-arm run of its recipe, the shadow series and the
// absolute-norm metrics, and parameter snapshots.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/io/npy.h"
#include "lab/config/config_io.h"
#include "lab/train/eval.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

RunConfig tiny() {
  RunConfig c;
  c.seed = 11;
  c.steps = 20;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 40;
  c.optimizer.lr = 3e-3f;
  c.precision.rounding = Rounding::nearest_away;
  c.precision.elementwise_rounding = Rounding::nearest_away;
  c.log.log_every = 5;
  c.log.bias_every = 2;
  c.log.progress = false;
  return c;
}

MemorySink run(const RunConfig& cfg) { return mxlab::test::run_in_memory(cfg); }

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every row (logged and shadow series) and the loss history of group `ga` in `a` equal those of
// `gb` in `b` bit for bit, the last-bin statistics included.
void expect_same_rows(const MemorySink& a, const std::string& ga, const MemorySink& b, const std::string& gb) {
  const auto& ra = a.groups.at(ga).rows;
  const auto& rb = b.groups.at(gb).rows;
  ASSERT_EQ(ra.size(), rb.size()) << ga << " vs " << gb;
  for (size_t i = 0; i < ra.size(); ++i) {
    ASSERT_EQ(ra[i].step, rb[i].step);
    ASSERT_EQ(ra[i].axis, rb[i].axis);
    ASSERT_EQ(ra[i].cols.size(), rb[i].cols.size());
    for (size_t c = 0; c < ra[i].cols.size(); ++c) {
      ASSERT_EQ(ra[i].cols[c].first, rb[i].cols[c].first);
      for (size_t k = 0; k < ra[i].cols[c].second.size(); ++k)
        ASSERT_TRUE(same_bits(ra[i].cols[c].second[k], rb[i].cols[c].second[k]))
            << ga << " step " << ra[i].step << " " << ra[i].cols[c].first << "[" << k << "]";
    }
  }
  const auto& la = a.groups.at(ga).loss_all;
  const auto& lb = b.groups.at(gb).loss_all;
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
}

std::string error_of(const std::string& yaml) { return test::config_error(yaml, "arms.yaml"); }

}  // namespace

TEST(Arms, ConfigReadsArmsAndRejectsBadOnes) {
  const RunConfig c = config_from_yaml_string(
      "arms:\n  - {name: away}\n  - {name: even, set: {rounding: nearest_even}}\n"
      "  - {name: grad_even, set: {rounding: {grad: nearest_even}}}\n  - {name: bf16w, apply: bf16_weights}\n"
      "interventions:\n  - {name: b, at: 5, apply: to_fp32, from: even}\n",
      "a.yaml");
  const std::vector<ResolvedArm> arms = resolved_arms(c);
  ASSERT_EQ(arms.size(), 4u);
  EXPECT_EQ(arms[1].policy.rounding_of(PrecisionConfig::Role::grad), Rounding::nearest_even);
  EXPECT_EQ(arms[2].policy.rounding_of(PrecisionConfig::Role::grad), Rounding::nearest_even);
  EXPECT_EQ(arms[2].policy.rounding_of(PrecisionConfig::Role::weight), Rounding::nearest_even);  // the default
  EXPECT_EQ(arms[3].policy.weight, NumFmt::bf16);
  EXPECT_EQ(c.interventions[0].from, "even");
  // Without `arms:` there is one arm, mx, with `precision` as it is.
  const std::vector<ResolvedArm> one = resolved_arms(RunConfig{});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].name, "mx");
  EXPECT_TRUE(one[0].policy == RunConfig{}.precision);

  EXPECT_NE(error_of("arms:\n  - {name: fp32}\n").find("'fp32' is reserved"), std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: a}\n  - {name: a}\n").find("duplicate arm name 'a'"), std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {apply: to_fp32}\n").find("missing 'name'"), std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: a, sett: {}}\n").find("did you mean 'set'"), std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: a, set: {roundng: nearest_even}}\n").find("unknown precision field"),
            std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: a, set: {rounding: {grd: nearest_even}}}\n").find("unknown role 'grd'"),
            std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: a}\ninterventions:\n  - {name: b, at: 5, apply: to_fp32}\n")
                .find("forks from arm 'mx', which this experiment does not have (arms: a)"),
            std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: a}\ninterventions:\n  - {name: a, at: 5, apply: to_fp32, from: a}\n")
                .find("share one namespace"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 48}\nprecision: {weight: bf16, activation: bf16, grad: bf16, ln_affine: none}\n"
                     "arms:\n  - {name: a, set: {weight: mxfp8_e4m3}}\n")
                .find("arm 'a': model.width = 48 is not a multiple"),
            std::string::npos);
}

TEST(Arms, RunIdsIgnoreTheDefaultArmAndFrom) {
  RunConfig a;
  a.interventions.push_back({"x", 10, "to_fp32", {}});
  const std::string id = config_hash(a);
  a.interventions[0].from = "mx";  // the default, spelt out
  EXPECT_EQ(config_hash(a), id);
  EXPECT_EQ(canonical_config_text(a).find("from:"), std::string::npos);
  EXPECT_EQ(canonical_config_text(RunConfig{}).find("arms"), std::string::npos);
  RunConfig b = a;
  b.arms = {{"mx", "", {}}};  // an explicit arm list is another experiment (its groups carry patches)
  EXPECT_NE(config_hash(b), id);
}

TEST(Arms, PerRoleRoundingParsesPrintsAndOverrides) {
  const RunConfig m = config_from_yaml_string("precision: {rounding: {grad: nearest_away, weight: stochastic}}\n", "r");
  using R = PrecisionConfig::Role;
  EXPECT_EQ(m.precision.rounding_of(R::grad), Rounding::nearest_away);
  EXPECT_EQ(m.precision.rounding_of(R::weight), Rounding::stochastic);
  EXPECT_EQ(m.precision.rounding_of(R::activation), Rounding::nearest_even);
  EXPECT_NE(dump_config(m).find("rounding: {weight: stochastic, activation: nearest_even, grad: nearest_away, "
                                "ln_affine: nearest_even}"),
            std::string::npos);
  EXPECT_TRUE(config_from_yaml_string(dump_config(m), "dump") == m);
  // --set of one role keeps the others' mode when the file gives one mode for all.
  const RunConfig s = config_from_yaml_string("precision: {rounding: nearest_away}\n", "r", {"precision.rounding.grad=nearest_even"});
  EXPECT_EQ(s.precision.rounding_of(R::grad), Rounding::nearest_even);
  EXPECT_EQ(s.precision.rounding_of(R::weight), Rounding::nearest_away);
  EXPECT_EQ(s.precision.rounding_of(R::ln_affine), Rounding::nearest_away);
  // The same mode for every role, however spelt, is the scalar form: same text, same run id.
  const RunConfig u = config_from_yaml_string(
      "precision: {rounding: {weight: nearest_away, activation: nearest_away, grad: nearest_away, ln_affine: nearest_away}}\n",
      "r");
  const RunConfig v = config_from_yaml_string("precision: {rounding: nearest_away}\n", "r");
  EXPECT_TRUE(u == v);
  EXPECT_EQ(config_hash(u), config_hash(v));
  EXPECT_NE(dump_config(u).find("  rounding: nearest_away\n"), std::string::npos);
  // Interventions patch one role.
  InterventionConfig iv{"x", 5, "", {{"rounding.grad", "nearest_even"}}};
  const PrecisionConfig p = apply_intervention(v.precision, iv);
  EXPECT_EQ(p.rounding_of(R::grad), Rounding::nearest_even);
  EXPECT_EQ(p.rounding_of(R::activation), Rounding::nearest_away);
  // A sweep over one role.
  const RunConfig w = config_from_yaml_string(
      "precision: {rounding: nearest_away}\nsweep: {grid: {precision.rounding.grad: [nearest_even]}}\n", "r");
  EXPECT_EQ(w.precision.rounding_of(R::grad), Rounding::nearest_even);
  EXPECT_EQ(w.precision.rounding_of(R::weight), Rounding::nearest_away);
}

// Every role's rounding reaches exactly its operands: each single-role change moves the MX
// trajectory, and a per-role map with every role equal is the scalar policy bit for bit.
TEST(Arms, EachRolesRoundingActsOnItsOperands) {
  RunConfig base = tiny();
  base.steps = 6;
  base.precision.rounding = Rounding::nearest_away;
  const MemorySink ref = run(base);
  RunConfig all = base;
  all.precision.rounding_weight = all.precision.rounding_activation = all.precision.rounding_grad =
      all.precision.rounding_ln_affine = Rounding::nearest_away;
  expect_same_rows(ref, "trajectories/mx", run(all), "trajectories/mx");
  for (int role = 0; role < 4; ++role) {
    RunConfig c = base;
    std::optional<Rounding>* o[] = {&c.precision.rounding_weight, &c.precision.rounding_activation,
                                    &c.precision.rounding_grad, &c.precision.rounding_ln_affine};
    *o[role] = Rounding::toward_zero;  // far from nearest: changes the bits of every such operand
    const MemorySink m = run(c);
    EXPECT_NE(m.groups.at("trajectories/mx").loss_all, ref.groups.at("trajectories/mx").loss_all) << "role " << role;
    EXPECT_EQ(m.groups.at("trajectories/fp32").loss_all, ref.groups.at("trajectories/fp32").loss_all);
  }
}

// An arm of a multi-arm run is bit-identical to the single-arm run with that recipe, and the
// FP32 trajectory is the same in both.
TEST(Arms, AnArmEqualsTheSingleArmRunOfItsRecipe) {
  RunConfig multi = tiny();
  multi.arms = {{"away", "", {}},
                {"even", "", {{"rounding", "nearest_even"}}},
                {"grad_even", "", {{"rounding.grad", "nearest_even"}}},
                {"noln", "skip_ln_quant", {}}};
  multi.interventions = {{"fp32_at8", 8, "to_fp32", {}, "grad_even"}};
  const MemorySink m = run(multi);
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    RunConfig single = tiny();
    single.precision = arm.policy;
    if (arm.name == "grad_even") single.interventions = {{"fp32_at8", 8, "to_fp32", {}}};
    const MemorySink s = run(single);
    expect_same_rows(m, "trajectories/" + arm.name, s, "trajectories/mx");
    expect_same_rows(m, "trajectories/fp32", s, "trajectories/fp32");
    if (arm.name == "grad_even") expect_same_rows(m, "branches/fp32_at8", s, "branches/fp32_at8");
    EXPECT_EQ(m.groups.at("trajectories/" + arm.name).attrs.str.at("arm"), arm.name);
  }
  EXPECT_EQ(m.groups.at("branches/fp32_at8").attrs.str.at("from"), "grad_even");
  EXPECT_EQ(m.groups.at("trajectories/even").attrs.str.at("patch"), "{set: {rounding: nearest_even}}");
  EXPECT_EQ(m.root.lists.at("arms"), (std::vector<std::string>{"away", "even", "grad_even", "noln"}));
  // The arms differ from each other (the recipes matter on this run).
  EXPECT_NE(m.groups.at("trajectories/away").loss_all, m.groups.at("trajectories/even").loss_all);
}

// The shadow series (every shadow step) and the absolute norms: their identities, and the
// values an arm under the FP32 policy must give (its gradient is the shadow gradient).
TEST(Arms, ShadowSeriesAndNormsAreConsistent) {
  RunConfig c = tiny();
  c.arms = {{"mx", "", {}}, {"exact", "to_fp32", {}}};
  const MemorySink s = run(c);
  for (const char* g : {"trajectories/mx", "trajectories/exact"}) {
    std::vector<int64_t> shadow_steps;
    for (const MetricRow& r : s.groups.at(g).rows)
      if (r.axis == "shadow_step") shadow_steps.push_back(r.step);
    // bias_every = 2 over 20 steps, and the last (19, a log step) as always: 0, 2, ..., 18, 19.
    std::vector<int64_t> want;
    for (int t = 0; t < c.steps; t += 2) want.push_back(t);
    want.push_back(c.steps - 1);
    EXPECT_EQ(shadow_steps, want) << g;
    const auto eps = s.series(g, "shadow_eps_norm", 0, "shadow_step");
    const auto par = s.series(g, "shadow_eps_par", 0, "shadow_step");
    const auto perp = s.series(g, "shadow_eps_perp", 0, "shadow_step");
    const auto gbar = s.series(g, "shadow_gbar_norm", 0, "shadow_step");
    const auto br = s.series(g, "shadow_bias_ratio", 0, "shadow_step");
    const auto cr = s.series(g, "shadow_cross_ratio", 0, "shadow_step");
    const auto cr2 = s.series(g, "shadow_cross_ratio_sq", 0, "shadow_step");
    for (size_t i = 0; i < eps.size(); ++i) {
      EXPECT_NEAR(par[i] * par[i] + perp[i] * perp[i], eps[i] * eps[i], 1e-9 * (1 + eps[i] * eps[i]));
      if (gbar[i] > 0) {
        EXPECT_NEAR(br[i], eps[i] / gbar[i], 1e-12 * (1 + br[i]));
      }
      EXPECT_NEAR(cr[i] * cr[i], cr2[i], 1e-12 * (1 + cr2[i]));
    }
  }
  // The arm under FP32: no quantization error at all, and the shadow loss is its own loss.
  const auto loss = s.series("trajectories/exact", "loss");
  const auto sl = s.series("trajectories/exact", "shadow_loss");
  const auto en = s.series("trajectories/exact", "eps_norm");
  const auto cr2 = s.series("trajectories/exact", "cross_ratio_sq");
  const auto steps = s.series("trajectories/exact", "step");
  ASSERT_EQ(steps.size(), 5u);  // logged rows 0, 5, 10, 15, 19; shadow passes on 0, 10, 19 of them
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_EQ(cr2[i], 0.0);  // it is the FP32 trajectory itself, on every logged row
    const bool shadow_row = static_cast<int>(steps[i]) % 2 == 0 || static_cast<int>(steps[i]) == c.steps - 1;
    if (!shadow_row) {
      EXPECT_TRUE(std::isnan(sl[i]) && std::isnan(en[i])) << "no shadow pass at step " << steps[i];
      continue;
    }
    EXPECT_EQ(sl[i], loss[i]);
    EXPECT_EQ(en[i], 0.0);
  }
  // The MX arm's shadow loss is an FP32 loss at other weights: finite, positive, not its own.
  const auto ml = s.series("trajectories/mx", "loss");
  const auto msl = s.series("trajectories/mx", "shadow_loss");
  for (size_t i = 0; i < ml.size(); ++i) {
    if (static_cast<int>(steps[i]) % 2 != 0 && static_cast<int>(steps[i]) != c.steps - 1) continue;
    EXPECT_TRUE(std::isfinite(msl[i]) && msl[i] > 0) << steps[i];
    EXPECT_NE(ml[i], msl[i]);
  }
}

// Snapshots: the state at the start of the step, every group with lab/model's name and shape,
// Adam's moments on request, the probe batch once, and a branch's arm at the branch step.
TEST(Arms, SnapshotsHoldTheStateAtTheStartOfTheirStep) {
  RunConfig c = tiny();
  c.log.snapshot_steps = {0, 7, c.steps};
  c.log.snapshot_optimizer = true;
  c.log.probe_batch = 16;
  c.interventions = {{"b", 12, "skip_ln_quant", {}}};
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(c, *be, sink);
  tr.open_output();
  tr.run(RunControl{}, 7);
  const Trajectory& mx = *tr.find_trajectory("mx");
  const std::vector<float> p7 = tr.download(mx.params, static_cast<size_t>(tr.shape().num_params));
  const std::vector<float> v7 = tr.download(mx.v, static_cast<size_t>(tr.shape().num_params));
  tr.finish(tr.run(RunControl{}));
  const NetShape& S = tr.shape();
  const std::vector<float> init = init_params(S, c.model.init, c.model.init_gain, c.seed, Stream::init);
  for (const ParamGroup& g : S.groups) {
    for (const char* t : {"fp32", "mx"}) {
      const auto& a0 = sink.arrays.at(std::string("snapshots/") + t + "/step_0/" + g.name);
      EXPECT_EQ(a0.data, std::vector<float>(init.begin() + g.offset, init.begin() + g.offset + g.size())) << g.name;
      EXPECT_EQ(a0.rows, g.rows == 1 ? g.cols : g.rows);
      EXPECT_EQ(a0.cols, g.rows == 1 ? 0 : g.cols);
      EXPECT_TRUE(sink.arrays.count(std::string("snapshots/") + t + "/step_20/" + g.name)) << t;
    }
    const auto& a7 = sink.arrays.at("snapshots/mx/step_7/" + g.name);
    EXPECT_EQ(a7.data, std::vector<float>(p7.begin() + g.offset, p7.begin() + g.offset + g.size())) << g.name;
    const auto& v = sink.arrays.at("snapshots/mx/step_7/v/" + g.name);
    EXPECT_EQ(v.data, std::vector<float>(v7.begin() + g.offset, v7.begin() + g.offset + g.size())) << g.name;
    EXPECT_TRUE(sink.arrays.count("snapshots/mx/step_7/m/" + g.name));
    // The branch's arm at the branch step (not in snapshot_steps), and the branch from then on.
    EXPECT_TRUE(sink.arrays.count("snapshots/mx/step_12/" + g.name)) << g.name;
    EXPECT_FALSE(sink.arrays.count("snapshots/fp32/step_12/" + g.name)) << g.name;
    EXPECT_EQ(sink.arrays.at("snapshots/b/step_20/" + g.name).data.size(), static_cast<size_t>(g.size()));
  }
  EXPECT_EQ(sink.arrays.at("snapshots/probe_x").rows, 16);
  EXPECT_EQ(sink.arrays.at("snapshots/probe_y").cols, c.model.width);
  // The probe batch depends on the seed only: the same in a run without snapshots' other settings.
  RunConfig d = tiny();
  d.log.snapshot_steps = {3};
  d.log.probe_batch = 16;
  MemorySink s2 = run(d);
  EXPECT_EQ(s2.arrays.at("snapshots/probe_x").data, sink.arrays.at("snapshots/probe_x").data);
  EXPECT_EQ(s2.arrays.at("snapshots/probe_y").data, sink.arrays.at("snapshots/probe_y").data);
  EXPECT_FALSE(s2.arrays.count("snapshots/mx/step_3/m/layer0.W1"));  // no optimizer state unasked
}

// ---- through the binary: bench --arms, branch --from, export --snapshot ----

namespace {
// The number after "key": in the last (JSON) line of bench's output, or NaN.
double json_number(const std::string& out, const std::string& key) {
  const size_t p = out.rfind("\"" + key + "\":");
  if (p == std::string::npos) return std::nan("");
  return std::strtod(out.c_str() + p + key.size() + 3, nullptr);
}

// `mxlab bench EXP --device cpu ARGS` through the built binary: (exit status, output).
std::pair<int, std::string> bench_cpu(const std::string& exp, const std::string& args) {
  return mxlab::test::run_command(std::string(MXLAB_BINARY) + " bench " + exp + " --device cpu " + args);
}
}  // namespace

TEST(ArmsCli, BenchTimesTheTrainerWithOneAndKArms) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write("b.yaml", "model: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n");
  const auto [rc, out] = bench_cpu(exp, "--arms 3 --steps 2 --warmup 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(json_number(out, "arms"), 3.0) << out;
  const double t1 = json_number(out, "trainer_1arm_ms"), tk = json_number(out, "trainer_arms_ms");
  const double serial = json_number(out, "arms_serial_ms"), saving = json_number(out, "arms_saving");
  EXPECT_GT(t1, 0.0);
  EXPECT_GT(tk, 0.0);
  EXPECT_GT(serial, 0.0);
  EXPECT_NEAR(saving, t1 / (tk / 3.0), 1e-3 * saving);
  EXPECT_NE(out.find("3 arms"), std::string::npos);
  EXPECT_NE(out.find("per recipe-step"), std::string::npos);
  // An experiment's own arms are timed without --arms.
  const std::string exp2 = dir.write("b2.yaml", "model: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
                                                "arms:\n  - {name: a}\n  - {name: b, set: {rounding: nearest_away}}\n");
  const auto [rc2, out2] = bench_cpu(exp2, "--steps 2 --warmup 1");
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_EQ(json_number(out2, "arms"), 2.0) << out2;
  // --only times one step figure: the serial sum of parts (which needs all four) is not made up
  const auto [rc3, out3] = bench_cpu(exp, "--arms 2 --steps 1 --warmup 0 --only data");
  ASSERT_EQ(rc3, 0) << out3;
  EXPECT_GT(json_number(out3, "per_extra_arm_ms"), 0.0) << out3;
  EXPECT_TRUE(std::isnan(json_number(out3, "arms_serial_ms"))) << out3;
  EXPECT_NE(out3.find("serial sum of parts: - (--only"), std::string::npos) << out3;
}

TEST(ArmsCli, BranchFromAnArmAndSnapshotsAsNpy) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "e.yaml",
      "steps: 30\nmodel: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
      "log: {log_every: 5, progress: false, snapshot_steps: [10], snapshot_optimizer: true, probe_batch: 8}\n"
      "checkpoint_every: 10\narms:\n  - {name: away, set: {rounding: nearest_away}}\n  - {name: even}\n");
  const std::string bin = MXLAB_BINARY;
  std::string file;
  ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file));
  ASSERT_FALSE(file.empty());
  // An inline branch of arm `even` at 15 and the same branch added after the fact agree.
  auto [rc, out] = mxlab::test::run_command(bin + " branch " + file + " --at 15 --apply to_fp32 --name late");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("has no arm 'mx' (arms: away, even): choose one with --from"), std::string::npos) << out;
  std::tie(rc, out) = mxlab::test::run_command(bin + " branch " + file + " --at 15 --apply to_fp32 --name late --from even");
  ASSERT_EQ(rc, 0) << out;
  {
    const h5::H5File f(file, h5::H5File::Mode::read);
    EXPECT_EQ(f.get_attr_string("branches/late", "from"), "even");
    EXPECT_EQ(f.get_attr_strings("/", "arms"), (std::vector<std::string>{"away", "even"}));
  }
  // Snapshots as .npy: every group of every trajectory, Adam's moments, the probe batch.
  std::tie(rc, out) = mxlab::test::run_command(bin + " export " + file + " --snapshot 10 --npy " + dir.str() + "/npy");
  ASSERT_EQ(rc, 0) << out;
  for (const char* t : {"fp32", "away", "even"})
    for (const char* sub : {"", "m/", "v/"}) {
      const NpyArray w = read_npy(dir.str() + "/npy/" + t + "/" + sub + "layer0.W1.npy");
      EXPECT_EQ(w.shape, (std::vector<int64_t>{32, 32})) << t << sub;
      const NpyArray g = read_npy(dir.str() + "/npy/" + t + "/" + sub + "layer0.gamma.npy");
      EXPECT_EQ(g.shape, (std::vector<int64_t>{32})) << t << sub;
    }
  EXPECT_EQ(read_npy(dir.str() + "/npy/probe_x.npy").shape, (std::vector<int64_t>{8, 32}));
  // The .npy holds the HDF5 dataset's float32 values exactly.
  {
    const h5::H5File f(file, h5::H5File::Mode::read);
    const std::vector<double> h = f.read_doubles("snapshots/even/step_10/layer0.W2");
    const NpyArray n = read_npy(dir.str() + "/npy/even/layer0.W2.npy");
    ASSERT_EQ(h.size(), n.data.size());
    for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(static_cast<float>(h[i]), n.data[i]);
  }
  // The branch's arm at the branch step was snapshotted too; a step without one is an error
  // that lists the steps there are.
  std::tie(rc, out) = mxlab::test::run_command(bin + " export " + file + " --snapshot 11 --npy " + dir.str() + "/npy2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("no snapshot at step 11 (snapshots at steps 10, 15)"), std::string::npos) << out;
  std::tie(rc, out) = mxlab::test::run_command(bin + " export " + file + " --npy " + dir.str() + "/npy2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--npy DIR needs --snapshot S"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.str() + "/npy2"));
}

// `mxlab eval`: a snapshot evaluated on the batch its step trained on reproduces the loss the
// run recorded at that step, under the trajectory's own policy (loss_all) and under FP32 (the
// shadow pass's loss), bit for bit; a patch evaluates under the patched policy.
TEST(ArmsCli, EvalReproducesTheRecordedLossesOfItsStep) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "e.yaml",
      "steps: 30\nseed: 3\nmodel: {depth: 2, width: 32, hidden_mult: 1}\ndata: {batch: 24}\n"
      "precision: {rounding: nearest_away}\n"
      "log: {log_every: 5, bias_every: 5, progress: false, snapshot_steps: [10, 25], probe_batch: 8}\n"
      "arms:\n  - {name: away}\n  - {name: even, set: {rounding: nearest_even}}\n"
      "interventions:\n  - {name: noln, at: 20, apply: skip_ln_quant, from: even}\n");
  const std::string bin = MXLAB_BINARY;
  std::string file;
  ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file));
  auto be = make_cpu_backend();
  const h5::H5File f(file, h5::H5File::Mode::read);
  for (const char* t : {"away", "even"}) {
    const std::string g = std::string("trajectories/") + t;
    const std::vector<EvalRow> rows = eval_snapshot(*be, file, t, 10, {{"e", 0, "to_fp32", {}}}, true);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(static_cast<float>(rows[0].loss), static_cast<float>(f.read_doubles(g + "/loss_all")[10])) << t;
    const std::vector<int64_t> ss = f.read_int64s(g + "/shadow_step");
    const size_t k = static_cast<size_t>(std::find(ss.begin(), ss.end(), 10) - ss.begin());
    ASSERT_LT(k, ss.size());
    EXPECT_EQ(static_cast<float>(rows[1].loss), static_cast<float>(f.read_doubles(g + "/shadow_fp32_loss")[k])) << t;
    EXPECT_NE(rows[0].loss, rows[1].loss);
  }
  // The FP32 trajectory's own loss; a branch after its `at` under its patched policy.
  EXPECT_EQ(static_cast<float>(eval_snapshot(*be, file, "fp32", 25, {}, true)[0].loss),
            static_cast<float>(f.read_doubles("trajectories/fp32/loss_all")[25]));
  EXPECT_EQ(static_cast<float>(eval_snapshot(*be, file, "noln", 25, {}, true)[0].loss),
            static_cast<float>(f.read_doubles("branches/noln/loss_all")[25 - 20]));
  // The same patch spelt as a preset and as fields gives the same loss; the probe batch differs.
  const auto a = eval_snapshot(*be, file, "even", 10, {{"e", 0, "skip_ln_quant", {}}, {"e", 0, "", {{"ln_affine", "none"}}}}, false);
  EXPECT_EQ(a[1].loss, a[2].loss);
  EXPECT_NE(a[0].loss, eval_snapshot(*be, file, "even", 10, {}, true)[0].loss);
  // Through the binary: a table and a JSON line; unknown trajectories and steps are one-line errors.
  auto [rc, out] = mxlab::test::run_command(bin + " eval " + file + " --snapshot 10 --trajectory even --apply to_fp32");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("{apply: to_fp32}"), std::string::npos) << out;
  EXPECT_NE(out.find("\"rows\":[{\"label\":\"as trained\""), std::string::npos) << out;
  std::tie(rc, out) = mxlab::test::run_command(bin + " eval " + file + " --snapshot 10 --trajectory nope");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("no trajectory 'nope' in this run (it has fp32, away, even, noln)"), std::string::npos) << out;
  std::tie(rc, out) = mxlab::test::run_command(bin + " eval " + file + " --snapshot 11 --trajectory even");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("has no snapshot of 'even' at step 11"), std::string::npos) << out;
}

// The run line and the sweep report name the earliest divergence over the arms and the arm
// that diverged first (not the first arm's step, which is -1 when only a later arm diverged);
// a rerun that skips the finished file reads the same from it.
TEST(ArmsCli, RunReportsTheEarliestDivergenceOverTheArms) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "d.yaml",
      "steps: 40\nmodel: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\noptimizer: {lr: 0.05}\n"
      "log: {log_every: 5, progress: false, divergence_factor: 1.01}\n"
      "arms:\n  - {name: fp4, set: {weight: mxfp4_e2m1, activation: mxfp4_e2m1}}\n  - {name: even}\n  - {name: away, set: {rounding: nearest_away}}\n");
  const std::string bin = MXLAB_BINARY;
  auto [rc, out] = mxlab::test::run_command(bin + " run " + exp + " --out " + dir.str() + "/r --device cpu");
  ASSERT_EQ(rc, 0) << out;
  const std::string file = mxlab::testutil::run_file_in(dir.str() + "/r");
  ASSERT_FALSE(file.empty());
  int64_t best = -1;
  std::string best_arm;
  {
    const h5::H5File f(file, h5::H5File::Mode::read);
    for (const char* a : {"fp4", "even", "away"}) {
      const int64_t d = f.get_attr_int64(std::string("trajectories/") + a, "divergence_step");
      if (d >= 0 && (best < 0 || d < best)) {
        best = d;
        best_arm = a;
      }
    }
  }
  ASSERT_GE(best, 0) << "no arm diverged at lr 0.05 with divergence_factor 1.01: " << out;
  const std::string want = "diverged at step " + std::to_string(best) + " (arm " + best_arm + ")";
  EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  EXPECT_NE(out.find("first diverged: arm " + best_arm), std::string::npos) << out;
  std::tie(rc, out) = mxlab::test::run_command(bin + " run " + exp + " --out " + dir.str() + "/r --device cpu");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("first diverged: arm " + best_arm), std::string::npos) << out;
}

// `mxlab bench` on a sweep file benches one of its runs (the first, or --run I) with a note,
// and rejects an index outside the sweep with one line.
TEST(ArmsCli, BenchOfASweepBenchesOneRun) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write("s.yaml", "model: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
                                              "sweep:\n  grid:\n    model.width: [32, 64]\n");
  auto [rc, out] = bench_cpu(exp, "--steps 1 --warmup 1 --run 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("expands to 2 runs; benchmarking run 1 (model.width=64)"), std::string::npos) << out;
  std::tie(rc, out) = bench_cpu(exp, "--steps 1 --run 2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--run 2: " + exp + " has 2 runs (indices 0..1"), std::string::npos) << out;
}

// `mxlab bench --log-steps N`: the logged trainer step against the unlogged one, phase by phase,
// and its JSON keys; N must be positive.
TEST(ArmsCli, BenchLogStepsBreaksALoggedStepIntoPhases) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write("b.yaml", "model: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
                                              "log: {bias_every: 2}\n");
  auto [rc, out] = bench_cpu(exp, "--steps 1 --warmup 1 --log-steps 4");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("logged trainer step (log_every 1"), std::string::npos) << out;
  EXPECT_NE(out.find("4 steps, 2 with the shadow pass"), std::string::npos) << out;
  EXPECT_NE(out.find("unlogged step"), std::string::npos) << out;
  for (const char* phase : {"eager compute with statistics", "clamp debt (quantization gaps)", "update", "sink write",
                            "shadow row (with its sink write)"})
    EXPECT_NE(out.find(std::string("    ") + phase), std::string::npos) << phase << "\n" << out;
  EXPECT_NE(out.find("\"log_steps\":4,\"logged_step_ms\":"), std::string::npos) << out;
  // Without bias_every the shadow keeps the unlogged run's cadence (every log_every steps).
  std::tie(rc, out) = bench_cpu(exp, "--steps 1 --warmup 1 --log-steps 4 "
                                               "--set log.bias_every=0 --set log.log_every=3");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("4 steps, 1 with the shadow pass"), std::string::npos) << out;  // timed 5..8: only 6
  std::tie(rc, out) = bench_cpu(exp, "--steps 1 --log-steps 0");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--log-steps"), std::string::npos) << out;
}

// The curvature figure is left out (with a line saying why) where the Hessian-vector products do
// not reach: an attention block.
TEST(ArmsCli, BenchLeavesOutCurvatureWhereItIsNotDefined) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write("a.yaml", "model: {depth: 1, width: 32, hidden_mult: 1, block: attention, heads: 2}\n"
                                              "data: {batch: 2, seq_len: 32}\n");
  auto [rc, out] = bench_cpu(exp, "--steps 1 --warmup 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("curvature: not measured"), std::string::npos) << out;
  EXPECT_EQ(out.find("lambda_max"), std::string::npos) << out;
  std::tie(rc, out) = bench_cpu(exp, "--steps 1 --only curvature");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("covers the MLP block with layernorm only"), std::string::npos) << out;
}
