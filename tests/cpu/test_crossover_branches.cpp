// Crossover branches (the pre-registered experiment E2, experiments/paper/why_mx_e2.yaml): a
// branch may fork from the FP32 trajectory (`from: fp32`, trained under `precision`) and may
// train a fixed number of steps (`steps: N`, at .. at+N-1) and then stop while the run goes on.
// Checked through the real binary on a tiny version of E2: both kinds exist and stop at their
// length; the FP32 and MX trajectories are bit-identical to a run without the branches; a branch
// from fp32 starts from the FP32 state at `at` (weights, Adam m and v, step counter, data
// position: one under to_fp32 reproduces the FP32 trajectory's losses bit for bit); `mxlab
// branch --from fp32 --steps N` equals the branch run in-line; `mxlab summarize` reads such a
// branch and censors it at its end minus the window, and gives each branch its endpoint against
// its parent on the joined series; the configuration's rules for both keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lab/config/config.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/stats/loss_events.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

// E2 in miniature: 60 steps, one arm `mx_all`, branch points scaled down (20, 33), branches of
// 15 steps (33 is off the log grid). checkpoint_every: 10 lets `mxlab branch` start at 20.
constexpr const char* kBase = R"(name: crossover_test
seed: 7
steps: 60
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 32}
optimizer: {lr: 3.0e-3}
precision: {weight: mxfp8_e4m3, activation: mxfp8_e4m3, grad: mxfp8_e4m3, ln_affine: mxfp8_e4m3}
log: {log_every: 5, progress: false, snapshot_steps: [20, 25], snapshot_optimizer: true}
checkpoint_every: 10
arms:
  - {name: mx_all}
)";
constexpr const char* kBranches = R"(interventions:
  - {name: fp32_from_mx_20, at: 20, steps: 15, from: mx_all, apply: snap_gamma+to_fp32}
  - {name: mx_from_fp32_20, at: 20, steps: 15, from: fp32}
  - {name: fp32_from_mx_33, at: 33, steps: 15, from: mx_all, apply: snap_gamma+to_fp32}
  - {name: mx_from_fp32_33, at: 33, steps: 15, from: fp32}
  - {name: fp32_copy_25, at: 25, steps: 20, from: fp32, apply: to_fp32}
)";
constexpr int kSteps = 60;

class CrossoverRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("crossover");
    write_bytes(dir_ + "/base.yaml", kBase);
    write_bytes(dir_ + "/branches.yaml", std::string(kBase) + kBranches);
    // Every checkpoint kept: the after-the-fact branches below copy them all.
    ASSERT_NO_FATAL_FAILURE(train_cpu(dir_ + "/base.yaml", dir_ + "/base", &base_, {"--keep-checkpoints", "all"}));
    ASSERT_NO_FATAL_FAILURE(train_cpu(dir_ + "/branches.yaml", dir_ + "/branches", &branches_));
  }
  static std::string dir_, base_, branches_;
};
std::string CrossoverRuns::dir_, CrossoverRuns::base_, CrossoverRuns::branches_;

std::string error_of(const std::string& yaml) { return test::config_error(yaml, "e2.yaml"); }

}  // namespace

TEST_F(CrossoverRuns, BothKindsStopAtTheirLengthAndTheRunGoesOn) {
  const h5::H5File f(branches_, h5::H5File::Mode::read);
  EXPECT_EQ(f.get_attr_string("/", "status"), "complete");
  struct Expect {
    const char* name;
    int at, steps;
    const char* from;
  };
  for (const Expect& e : {Expect{"fp32_from_mx_20", 20, 15, "mx_all"}, Expect{"mx_from_fp32_20", 20, 15, "fp32"},
                          Expect{"fp32_from_mx_33", 33, 15, "mx_all"}, Expect{"mx_from_fp32_33", 33, 15, "fp32"},
                          Expect{"fp32_copy_25", 25, 20, "fp32"}}) {
    SCOPED_TRACE(e.name);
    const std::string g = std::string("branches/") + e.name;
    EXPECT_EQ(f.get_attr_string(g, "state"), "ran");  // finished, not failed
    EXPECT_EQ(f.get_attr_string(g, "from"), e.from);
    EXPECT_EQ(f.get_attr_int64(g, "at"), e.at);
    EXPECT_EQ(f.get_attr_int64(g, "end_step"), e.at + e.steps);
    EXPECT_EQ(f.get_attr_int64(g, "steps_run"), e.steps);
    EXPECT_EQ(f.get_attr_int64(g, "divergence_step"), -1);
    EXPECT_EQ(f.dataset_shape(g + "/loss_all")[0], static_cast<uint64_t>(e.steps));
    for (double v : f.read_doubles(g + "/loss_all")) EXPECT_TRUE(std::isfinite(v));
    // Rows from the first log step at or after `at` to its last step, none after.
    const std::vector<int64_t> steps = f.read_int64s(g + "/step");
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.front(), (e.at + 4) / 5 * 5);
    EXPECT_LT(steps.back(), e.at + e.steps);
    EXPECT_GE(steps.back(), e.at + e.steps - 5);
    for (int64_t s : f.read_int64s(g + "/shadow_step")) EXPECT_LT(s, e.at + e.steps);
  }
  // The parents ran to the end.
  for (const char* g : {"trajectories/fp32", "trajectories/mx_all"}) {
    EXPECT_EQ(f.get_attr_int64(g, "steps_run"), kSteps) << g;
    EXPECT_FALSE(f.has_attr(g, "end_step")) << g;
  }
  // The policies: MX-all from fp32 (the arm's, as mx_all is `precision` unpatched), FP32 from mx.
  EXPECT_EQ(f.get_attr_string("branches/mx_from_fp32_20", "policy"), f.get_attr_string("trajectories/mx_all", "policy"));
  EXPECT_EQ(f.get_attr_string("branches/fp32_from_mx_20", "policy"),
            f.get_attr_string("branches/fp32_copy_25", "policy"));
  EXPECT_EQ(f.get_attr_string("branches/mx_from_fp32_20", "patch"), "{}");
}

TEST_F(CrossoverRuns, BranchesDoNotDisturbTheirParents) {
  const h5::H5File a(base_, h5::H5File::Mode::read), b(branches_, h5::H5File::Mode::read);
  for (const char* g : {"trajectories/fp32", "trajectories/mx_all"}) expect_same_group(a, g, b, g);
  // The parents' snapshots at the branch points are the same too (the source of a branch is
  // snapshot at its `at`: fp32 at 33 exists only in the run with branches).
  for (const char* s : {"snapshots/fp32/step_20/layer0.W1", "snapshots/mx_all/step_25/v/layer1.W2"})
    EXPECT_EQ(a.read_doubles(s), b.read_doubles(s)) << s;
  EXPECT_TRUE(b.is_group("snapshots/fp32/step_33"));
  EXPECT_TRUE(b.is_group("snapshots/mx_all/step_33"));
}

TEST_F(CrossoverRuns, ABranchFromFp32StartsFromTheFp32State) {
  const h5::H5File f(branches_, h5::H5File::Mode::read);
  // Weights, m and v at `at` (snapshots at the start of step 20, after the branch has started).
  for (const std::string part : {"", "m/", "v/"})
    for (const char* grp : {"layer0.gamma", "layer0.W1", "layer1.W2", "layer1.b2"}) {
      const std::string p = part + grp;
      EXPECT_EQ(f.read_doubles("snapshots/mx_from_fp32_20/step_20/" + p), f.read_doubles("snapshots/fp32/step_20/" + p))
          << p;
      EXPECT_NE(f.read_doubles("snapshots/mx_from_fp32_20/step_20/" + p),
                f.read_doubles("snapshots/mx_all/step_20/" + p))
          << p;
    }
  // Under FP32 dynamics the branch is the FP32 trajectory, bit for bit, for its 20 steps: the
  // step counter (lr schedule, Adam's bias correction) and the data stream position are the
  // FP32 trajectory's too.
  const std::vector<double> fp32 = f.read_doubles("trajectories/fp32/loss_all");
  const std::vector<double> copy = f.read_doubles("branches/fp32_copy_25/loss_all");
  ASSERT_EQ(copy.size(), 20u);
  for (size_t i = 0; i < copy.size(); ++i) EXPECT_TRUE(same_bits(copy[i], fp32[25 + i])) << "step " << 25 + i;
  const std::vector<int64_t> rows = f.read_int64s("branches/fp32_copy_25/step");
  const std::vector<double> rl = f.read_doubles("branches/fp32_copy_25/loss");
  const std::vector<int64_t> frows = f.read_int64s("trajectories/fp32/step");
  const std::vector<double> fl = f.read_doubles("trajectories/fp32/loss");
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < frows.size(); ++j)
      if (frows[j] == rows[i]) {
        EXPECT_TRUE(same_bits(rl[i], fl[j])) << "row at step " << rows[i];
      }
  // Under MX dynamics it departs from FP32 at once (its first step's loss is the MX forward of
  // the FP32 weights) and is not the mx_all arm either.
  const std::vector<double> mx = f.read_doubles("branches/mx_from_fp32_20/loss_all");
  const std::vector<double> arm = f.read_doubles("trajectories/mx_all/loss_all");
  EXPECT_NE(mx[0], fp32[20]);
  EXPECT_NE(mx[0], arm[20]);
}

TEST_F(CrossoverRuns, BranchAfterTheFactFromFp32EqualsTheInlineBranch) {
  const std::string out = make_temp_dir("after");
  const std::string id = base_.substr(base_.rfind('/') + 1, 12);
  const std::string src = base_.substr(0, base_.rfind('/'));
  write_bytes(out + "/" + id + ".h5", slurp(base_));
  for (int s = 10; s < kSteps; s += 10) {
    const std::string name = "/" + id + ".step" + std::to_string(s) + ".ckpt";
    write_bytes(out + name, slurp(src + name));
  }
  const std::string file = out + "/" + id + ".h5";
  Proc p = run_mxlab({"branch", file, "--name", "mx_from_fp32_20", "--at", "20", "--from", "fp32", "--steps", "15"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  p = run_mxlab({"branch", file, "--name", "mx_from_fp32_33", "--at", "33", "--from", "fp32", "--steps", "15"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "replaying steps 30..32")) << p.output;
  {
    const h5::H5File a(branches_, h5::H5File::Mode::read), b(file, h5::H5File::Mode::read);
    for (const char* g : {"branches/mx_from_fp32_20", "branches/mx_from_fp32_33"}) expect_same_group(a, g, b, g);
  }
  // Too long, and no change from an arm, are refused before anything is written.
  p = run_mxlab({"branch", file, "--name", "long", "--at", "50", "--from", "fp32", "--steps", "11"});
  EXPECT_EQ(p.exit_code, 2) << p.output;
  EXPECT_TRUE(contains(p.output, "--steps must be in [1, 10]")) << p.output;
  p = run_mxlab({"branch", file, "--name", "same", "--at", "50", "--from", "mx_all"});
  EXPECT_EQ(p.exit_code, 2) << p.output;
  EXPECT_TRUE(contains(p.output, "changes nothing")) << p.output;
  p = run_mxlab({"branch", file, "--name", "nope", "--at", "50", "--from", "mx", "--apply", "to_fp32"});
  EXPECT_EQ(p.exit_code, 2) << p.output;
  EXPECT_TRUE(contains(p.output, "or --from fp32")) << p.output;
  const h5::H5File after(file, h5::H5File::Mode::read);
  EXPECT_FALSE(after.is_group("branches/long"));
  EXPECT_FALSE(after.is_group("branches/same"));
}

TEST_F(CrossoverRuns, SummarizeCensorsAShortBranchAtItsEndMinusTheWindow) {
  const std::string dir = branches_.substr(0, branches_.rfind('/'));
  const Proc p = run_mxlab({"summarize", dir, "--csv", "--no-index", "--excursion-window", "10",
                            "--excursion-block", "5"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  // The header names the columns; find excursion_censored_at in the rows of the branches.
  const std::vector<std::string> lines = [&] {
    std::vector<std::string> v;
    size_t s = 0;
    for (size_t e; (e = p.output.find('\n', s)) != std::string::npos; s = e + 1) v.push_back(p.output.substr(s, e - s));
    return v;
  }();
  auto cells = [](const std::string& line) {
    std::vector<std::string> v;
    size_t s = 0;
    for (size_t e; (e = line.find(',', s)) != std::string::npos; s = e + 1) v.push_back(line.substr(s, e - s));
    v.push_back(line.substr(s));
    return v;
  };
  ASSERT_FALSE(lines.empty());
  const std::vector<std::string> head = cells(lines[0]);
  const auto col = [&](const char* name) {
    return static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
  };
  const size_t group = col("group"), censored = col("excursion_censored_at");
  ASSERT_LT(group, head.size()) << lines[0];
  ASSERT_LT(censored, head.size()) << lines[0];
  int seen = 0;
  for (const std::string& line : lines) {
    const std::vector<std::string> c = cells(line);
    if (c.size() != head.size()) continue;
    if (c[group] == "mx_from_fp32_20" || c[group] == "fp32_from_mx_20") {
      EXPECT_EQ(c[censored], "25") << line;  // 20 + 15 - 10
      ++seen;
    }
    if (c[group] == "mx_from_fp32_33") {
      EXPECT_EQ(c[censored], "38") << line;  // 33 + 15 - 10
      ++seen;
    }
  }
  EXPECT_EQ(seen, 3) << p.output;
}

TEST_F(CrossoverRuns, SummarizeGivesEachBranchItsEndpointOnTheJoinedSeries) {
  // The endpoint columns of every branch are branch_endpoint (lab/stats/loss_events.h) of the
  // file's loss_all datasets: the parent's (the branch's `from`) and the branch's, window
  // [at, end_step - W). Under K = 0.5 every block is "above" (events everywhere, the parents'
  // before the branch points: not at risk), under K = 10 none is (censored, at risk).
  const std::string dir = branches_.substr(0, branches_.rfind('/'));
  const h5::H5File f(branches_, h5::H5File::Mode::read);
  auto floats = [&](const std::string& ds) {
    std::vector<float> v;
    for (double x : f.read_doubles(ds)) v.push_back(static_cast<float>(x));
    return v;
  };
  auto split = [](const std::string& text, char sep) {
    std::vector<std::string> v;
    size_t s = 0;
    for (size_t e; (e = text.find(sep, s)) != std::string::npos; s = e + 1) v.push_back(text.substr(s, e - s));
    v.push_back(text.substr(s));
    return v;
  };
  int events = 0, censored = 0, at_risk = 0, not_at_risk = 0;
  for (const ExcursionRule rule : {ExcursionRule{0.5, 10, 5}, ExcursionRule{10.0, 10, 5}, ExcursionRule{1.0, 5, 5}}) {
    const Proc p = run_mxlab({"summarize", dir, "--csv", "--no-index", "--excursion-factor", std::to_string(rule.factor),
                              "--excursion-window", std::to_string(rule.window), "--excursion-block",
                              std::to_string(rule.block)});
    ASSERT_EQ(p.exit_code, 0) << p.output;
    const std::vector<std::string> lines = split(p.output, '\n');
    const std::vector<std::string> head = split(lines[0], ',');
    const auto col = [&](const char* name) {
      return static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
    };
    int branches = 0;
    for (size_t i = 1; i < lines.size(); ++i) {
      const std::vector<std::string> c = split(lines[i], ',');
      if (c.size() != head.size()) continue;
      if (c[col("at")].empty()) {  // a trajectory: no endpoint
        for (const char* k : {"parent", "at_risk", "branch_excursion_step", "control_censored_at"})
          EXPECT_EQ(c[col(k)], "") << lines[i];
        continue;
      }
      ++branches;
      const std::string g = "branches/" + c[col("group")];
      SCOPED_TRACE(g + " under factor " + std::to_string(rule.factor));
      EXPECT_EQ(c[col("parent")], f.get_attr_string(g, "from"));
      const BranchEndpoint e =
          branch_endpoint(floats("trajectories/" + c[col("parent")] + "/loss_all"), floats(g + "/loss_all"),
                          f.get_attr_int64(g, "at"), f.get_attr_int64(g, "end_step"), rule);
      EXPECT_EQ(c[col("at_risk")], e.at_risk ? "1" : "0");
      EXPECT_EQ(c[col("branch_excursion_step")], std::to_string(e.branch.event ? e.branch.step : -1));
      EXPECT_EQ(c[col("branch_censored_at")], std::to_string(e.branch.event ? -1 : e.branch.step));
      EXPECT_EQ(c[col("control_excursion_step")], std::to_string(e.control.event ? e.control.step : -1));
      EXPECT_EQ(c[col("control_censored_at")], std::to_string(e.control.event ? -1 : e.control.step));
      EXPECT_EQ(e.window_end, f.get_attr_int64(g, "end_step") - rule.window);
      events += e.branch.event + e.control.event;
      censored += !e.branch.event + !e.control.event;
      at_risk += e.at_risk;
      not_at_risk += !e.at_risk;
    }
    EXPECT_EQ(branches, 5) << p.output;
  }
  EXPECT_GT(events, 0);
  EXPECT_GT(censored, 0);
  EXPECT_GT(at_risk, 0);
  EXPECT_GT(not_at_risk, 0);
}

TEST(CrossoverConfig, FromFp32AndStepsRules) {
  const RunConfig c = config_from_yaml_string(
      "steps: 100\narms:\n  - {name: a}\n  - {name: b, set: {weight: bf16}}\n"
      "interventions:\n  - {name: x, at: 10, from: fp32, steps: 90}\n  - {name: y, at: 10, from: fp32, "
      "set: {activation: bf16}}\n",
      "e2.yaml");
  ASSERT_EQ(c.interventions.size(), 2u);
  EXPECT_EQ(c.interventions[0].steps, 90);
  EXPECT_EQ(c.interventions[1].steps, 0);
  // From fp32 the base is `precision`, not an arm's policy.
  EXPECT_TRUE(branch_policy(c, c.interventions[0]) == c.precision);
  EXPECT_EQ(branch_policy(c, c.interventions[1]).activation, NumFmt::bf16);
  EXPECT_EQ(branch_policy(c, c.interventions[1]).weight, c.precision.weight);
  // The printed configuration reads back the same, with `steps` only where it is set.
  const std::string text = dump_config(c);
  EXPECT_TRUE(config_from_yaml_string(text, "again.yaml") == c);
  EXPECT_NE(canonical_config_text(c).find("    steps: 90\n"), std::string::npos);
  EXPECT_EQ(count_of(canonical_config_text(c), "    steps:"), 1);
  // A configuration without the new keys keeps its text and run id: `steps: 0` is not printed.
  RunConfig old;
  old.interventions.push_back({"x", 10, "to_fp32", {}});
  EXPECT_EQ(canonical_config_text(old).find("    steps:"), std::string::npos);
  EXPECT_EQ(dump_config(old).find("    steps:"), std::string::npos);

  const std::string steps_range = "is outside [1, steps - at] = [1, 90]";
  EXPECT_NE(error_of("steps: 100\ninterventions:\n  - {name: x, at: 10, apply: to_fp32, steps: 91}\n").find(steps_range),
            std::string::npos);
  EXPECT_NE(error_of("steps: 100\ninterventions:\n  - {name: x, at: 10, apply: to_fp32, steps: -1}\n").find(steps_range),
            std::string::npos);
  EXPECT_EQ(error_of("steps: 100\ninterventions:\n  - {name: x, at: 10, apply: to_fp32, steps: 90}\n"), "");
  EXPECT_NE(error_of("interventions:\n  - {name: x, at: 10, apply: to_fp32, steps: two}\n").find("expected an integer"),
            std::string::npos);
  // From an arm an empty patch still changes nothing; from fp32 it is the MX recipe.
  EXPECT_NE(error_of("interventions:\n  - {name: x, at: 10}\n").find("changes nothing"), std::string::npos);
  EXPECT_EQ(error_of("interventions:\n  - {name: x, at: 10, from: fp32}\n"), "");
  // snap_gamma snaps to an arm's quantized values: the FP32 trajectory has none.
  EXPECT_NE(error_of("interventions:\n  - {name: x, at: 10, from: fp32, apply: snap_gamma+to_fp32}\n")
                .find("forks from fp32 and applies snap_gamma"),
            std::string::npos);
  // An unknown source names both choices; fp32 is still no name for an arm or a branch.
  EXPECT_NE(error_of("arms:\n  - {name: a}\ninterventions:\n  - {name: x, at: 10, from: b, apply: to_fp32}\n")
                .find("set `from:` to one of them, or to fp32 (the FP32 trajectory)"),
            std::string::npos);
  EXPECT_NE(error_of("interventions:\n  - {name: fp32, at: 10, from: fp32}\n").find("'fp32' is reserved"),
            std::string::npos);
  EXPECT_NE(error_of("arms:\n  - {name: fp32}\n").find("'fp32' is reserved"), std::string::npos);
  // One line each.
  EXPECT_EQ(error_of("interventions:\n  - {name: x, at: 10, from: fp32, apply: snap_gamma}\n").find('\n'),
            std::string::npos);
}

TEST(CrossoverConfig, TheE2ExperimentFollowsThePreRegistration) {
  const std::string path = std::string(MXLAB_SOURCE_DIR) + "/experiments/paper/why_mx_e2.yaml";
  const Proc p = run_mxlab({"plan", path});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "239")) << p.output;
  const std::vector<ExpandedRun> runs = expand_experiment(path);
  ASSERT_EQ(runs.size(), 40u);
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].cfg.seed, 200 + i);
  const RunConfig& c = runs[0].cfg;
  EXPECT_EQ(c.steps, 20000);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 5.0e-4f);
  ASSERT_EQ(c.arms.size(), 1u);
  EXPECT_EQ(c.arms[0].name, "mx_all");
  EXPECT_TRUE(c.arms[0].apply.empty() && c.arms[0].set.empty());
  ASSERT_EQ(c.interventions.size(), 6u);
  int k = 0;
  for (int b : {4000, 8000, 12000}) {
    const InterventionConfig& to_fp32 = c.interventions[k++];
    const InterventionConfig& to_mx = c.interventions[k++];
    EXPECT_EQ(to_fp32.name, "fp32_from_mx_" + std::to_string(b));
    EXPECT_EQ(to_fp32.from, "mx_all");
    EXPECT_EQ(to_fp32.apply, "snap_gamma+to_fp32");
    EXPECT_EQ(to_mx.name, "mx_from_fp32_" + std::to_string(b));
    EXPECT_EQ(to_mx.from, "fp32");
    EXPECT_TRUE(to_mx.apply.empty() && to_mx.set.empty());
    for (const InterventionConfig* iv : {&to_fp32, &to_mx}) {
      EXPECT_EQ(iv->at, b);
      EXPECT_EQ(iv->steps, 2500);
    }
    // MX-all dynamics from the FP32 state: the mx_all arm's recipe.
    EXPECT_TRUE(branch_policy(c, to_mx) == resolved_arms(c)[0].policy);
  }
  EXPECT_EQ(c.log.curvature_every, 4000);
  EXPECT_TRUE(c.log.snapshot_optimizer);
}
