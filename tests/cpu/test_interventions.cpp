// Interventions through the real binary and the HDF5 file: a branch whose patch changes nothing
// reproduces the baseline after `at` bit for bit; several branches run in one step loop without
// disturbing the baseline; `mxlab branch` on a finished run writes the same rows as the same
// intervention run in-line, from a checkpoint at `at` or replaying forward from an earlier one;
// and a bad checkpoint is never used for a branch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lab/io/h5file.h"
#include "tests/cpu/run_binary_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

constexpr const char* kBaseline = R"(name: interventions_test
seed: 5
steps: 120
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 32}
optimizer: {lr: 3.0e-3}
log: {log_every: 5, progress: false}
checkpoint_every: 20
)";

// The same run with branches in-line. `same` sets the value the policy already has (an empty
// `set: {}` is rejected as an intervention that changes nothing) and starts off the log grid.
constexpr const char* kInline = R"(interventions:
  - {name: same, at: 37, set: {scale_rule: floor}}
  - {name: fp32_at40, at: 40, apply: to_fp32}
  - {name: noln_at47, at: 47, apply: skip_ln_quant}
  - {name: fwd_at47, at: 47, set: {backward: false}}
)";

class InterventionRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("exp");
    write_bytes(dir_ + "/baseline.yaml", kBaseline);
    write_bytes(dir_ + "/inline.yaml", std::string(kBaseline) + kInline);
    baseline_ = run(dir_ + "/baseline.yaml", dir_ + "/baseline");
    inline_ = run(dir_ + "/inline.yaml", dir_ + "/inline");
  }

  // Runs an experiment to completion; returns its file.
  static std::string run(const std::string& yaml, const std::string& out) {
    // Every checkpoint is kept: the tests copy them (and branch from 20 and 40).
    const Proc p = run_mxlab({"run", yaml, "--out", out, "--keep-checkpoints", "all"});
    EXPECT_EQ(p.exit_code, 0) << p.output;
    const std::string file = run_file_in(out);
    EXPECT_FALSE(file.empty()) << p.output;
    return file;
  }

  // A copy of the finished baseline run (file and checkpoints) in a fresh directory.
  static std::string copy_baseline(const std::string& tag) {
    const std::string out = make_temp_dir(tag);
    const std::string src_dir = baseline_.substr(0, baseline_.rfind('/'));
    const std::string id = baseline_.substr(baseline_.rfind('/') + 1, 12);
    write_bytes(out + "/" + id + ".h5", slurp(baseline_));
    for (int s = 20; s < 120; s += 20) {
      const std::string name = "/" + id + ".step" + std::to_string(s) + ".ckpt";
      write_bytes(out + name, slurp(src_dir + name));
    }
    return out + "/" + id + ".h5";
  }

  static std::string dir_, baseline_, inline_;
};

std::string InterventionRuns::dir_, InterventionRuns::baseline_, InterventionRuns::inline_;

std::string ckpt_of(const std::string& run_file, int step) {
  return run_file.substr(0, run_file.size() - 3) + ".step" + std::to_string(step) + ".ckpt";
}

}  // namespace

TEST_F(InterventionRuns, BranchesCarryAtAndPatchAndRunTogether) {
  const h5::H5File f(inline_, h5::H5File::Mode::read);
  EXPECT_EQ(f.get_attr_string("/", "status"), "complete");
  ASSERT_EQ(f.list_groups("branches"), (std::vector<std::string>{"fp32_at40", "fwd_at47", "noln_at47", "same"}));
  struct Expect {
    const char* name;
    int at;
    const char* patch;
  };
  for (const Expect& e : {Expect{"same", 37, "{set: {scale_rule: floor}}"}, Expect{"fp32_at40", 40, "{apply: to_fp32}"},
                          Expect{"noln_at47", 47, "{apply: skip_ln_quant}"}, Expect{"fwd_at47", 47, "{set: {backward: false}}"}}) {
    SCOPED_TRACE(e.name);
    const std::string g = std::string("branches/") + e.name;
    EXPECT_EQ(f.get_attr_int64(g, "at"), e.at);
    EXPECT_EQ(f.get_attr_string(g, "patch"), e.patch);
    EXPECT_EQ(f.get_attr_string(g, "state"), "ran");
    // Rows from the first log step at or after `at` to the last step; the loss history from `at`.
    const std::vector<int64_t> steps = f.read_int64s(g + "/step");
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.front(), (e.at + 4) / 5 * 5);
    EXPECT_EQ(steps.back(), 119);
    EXPECT_EQ(f.dataset_shape(g + "/loss_all")[0], static_cast<uint64_t>(120 - e.at));
  }
  // The branches differ from the baseline (the patches do something) ...
  const std::vector<double> mx = f.read_doubles("trajectories/mx/loss_all");
  for (const char* b : {"fp32_at40", "noln_at47", "fwd_at47"}) {
    const std::vector<double> br = f.read_doubles(std::string("branches/") + b + "/loss_all");
    int differ = 0;
    for (size_t i = 0; i < br.size(); ++i) differ += br[i] != mx[mx.size() - br.size() + i];
    EXPECT_GT(differ, 0) << b;
  }
  // ... and the baseline does not notice them: its trajectories equal the branch-free run's.
  const h5::H5File base(baseline_, h5::H5File::Mode::read);
  for (const char* g : {"trajectories/fp32", "trajectories/mx"}) expect_same_group(base, g, f, g);
}

TEST_F(InterventionRuns, UnchangedPolicyBranchReproducesTheBaselineBitForBit) {
  const h5::H5File f(inline_, h5::H5File::Mode::read);
  // Every dataset, rows from `at` on, loss history from `at`; the group attributes differ by
  // design (at, patch, summaries over the branch's own steps), its policy does not.
  expect_same_group(f, "trajectories/mx", f, "branches/same", 37,
                    {"at", "arm", "from", "patch", "min_loss", "steps_run", "spike_score", "spike_count",
                     "divergence_step", "first_nonfinite_step", "excursion_step", "excursion_censored_at",
                     "first_spike_step", "tail_log_ratio"});
  EXPECT_EQ(f.get_attr_string("branches/same", "from"), "mx");
  EXPECT_EQ(f.get_attr_string("trajectories/mx", "arm"), "mx");
  EXPECT_EQ(f.get_attr_string("branches/same", "policy"), f.get_attr_string("trajectories/mx", "policy"));
  EXPECT_EQ(f.get_attr_double("branches/same", "final_loss"), f.get_attr_double("trajectories/mx", "final_loss"));
}

TEST_F(InterventionRuns, BranchAfterTheFactEqualsTheInlineBranch) {
  const std::string file = copy_baseline("after");
  struct Case {
    std::vector<std::string> args;
    const char* name;
    const char* from;  // what the command reports
  };
  const std::vector<Case> cases = {
      {{"--at", "40", "--apply", "to_fp32"}, "fp32_at40", "from checkpoint 40"},  // checkpoint exactly at `at`
      {{"--at", "47", "--apply", "skip_ln_quant"}, "noln_at47", "replaying steps 40..46"},  // replay forward
      {{"--at", "47", "--set", "backward=false"}, "fwd_at47", "replaying steps 40..46"},
      {{"--at", "37", "--set", "scale_rule=floor"}, "same", "replaying steps 20..36"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"branch", file, "--name", c.name};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const Proc p = run_mxlab(args);
    ASSERT_EQ(p.exit_code, 0) << p.output;
    EXPECT_TRUE(contains(p.output, c.from)) << p.output;
  }
  {
    const h5::H5File a(inline_, h5::H5File::Mode::read), b(file, h5::H5File::Mode::read);
    for (const Case& c : cases)
      expect_same_group(a, std::string("branches/") + c.name, b, std::string("branches/") + c.name);
    // The run itself is untouched: trajectories and root attributes as before.
    const h5::H5File orig(baseline_, h5::H5File::Mode::read);
    for (const char* g : {"trajectories/fp32", "trajectories/mx"}) expect_same_group(orig, g, b, g);
    EXPECT_EQ(attrs_of(orig, "/"), attrs_of(b, "/"));
  }  // closed: HDF5 locks the file, and mxlab branch opens it for writing
  // A name taken is refused, the file unchanged.
  const Proc again = run_mxlab({"branch", file, "--name", "same", "--at", "50", "--apply", "to_fp32"});
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_TRUE(contains(again.output, "branch 'same' already exists")) << again.output;
  const h5::H5File b2(file, h5::H5File::Mode::read);
  EXPECT_EQ(b2.get_attr_int64("branches/same", "at"), 37);
}

TEST_F(InterventionRuns, BranchNeverUsesABadCheckpoint) {
  // The checkpoint at `at` is corrupted: refused with a warning, the branch replays from the
  // one before and still equals the in-line branch.
  const std::string file = copy_baseline("bad40");
  std::string bytes = slurp(ckpt_of(file, 40));
  bytes[bytes.size() / 3] ^= 0x04;
  write_bytes(ckpt_of(file, 40), bytes);
  const Proc p = run_mxlab({"branch", file, "--name", "fp32_at40", "--at", "40", "--apply", "to_fp32"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "step40.ckpt is corrupted (checksum mismatch)")) << p.output;
  EXPECT_EQ(count_of(p.output, "mxlab: warning: "), 1) << p.output;
  EXPECT_TRUE(contains(p.output, "replaying steps 20..39")) << p.output;
  {
    const h5::H5File a(inline_, h5::H5File::Mode::read), b(file, h5::H5File::Mode::read);
    expect_same_group(a, "branches/fp32_at40", b, "branches/fp32_at40");
  }
  // No valid checkpoint at or before `at` (the one at 20 cut short too): refused with one
  // error line, non-zero exit, and no branch group in the file.
  bytes = slurp(ckpt_of(file, 20));
  write_bytes(ckpt_of(file, 20), bytes.substr(0, bytes.size() - 1000));
  const Proc q = run_mxlab({"branch", file, "--name", "late", "--at", "45", "--apply", "to_fp32"});
  EXPECT_EQ(q.exit_code, 2) << q.output;
  EXPECT_TRUE(contains(q.output, "step20.ckpt is truncated")) << q.output;
  EXPECT_TRUE(contains(q.output, "mxlab: error: no valid checkpoint of run")) << q.output;
  EXPECT_EQ(count_of(q.output, "\n"), 3) << "two warnings and one error line:\n" << q.output;
  const h5::H5File after(file, h5::H5File::Mode::read);
  EXPECT_FALSE(after.is_group("branches/late"));
}

TEST_F(InterventionRuns, BranchRefusesAnUnfinishedRun) {
  const std::string file = copy_baseline("unfinished");
  {
    h5::H5File f(file, h5::H5File::Mode::append);
    f.set_attr("/", "status", std::string("interrupted"));
  }
  const Proc p = run_mxlab({"branch", file, "--name", "x", "--at", "40", "--apply", "to_fp32"});
  EXPECT_EQ(p.exit_code, 2) << p.output;
  EXPECT_TRUE(contains(p.output, "has status 'interrupted': finish the run first")) << p.output;
}

TEST_F(InterventionRuns, InterruptedBranchIsComputedAgainByTheSameCommand) {
  const std::vector<std::string> args = {"--name", "fp32_at40", "--at", "40", "--apply", "to_fp32"};
  auto branch = [&](const std::string& file) {
    std::vector<std::string> a = {"branch", file};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  };
  // Ctrl-C must land while the branch trains (after the handlers are installed, before the
  // end): aim at fractions of an uninterrupted branch's wall time until one does. On a loaded
  // machine the wall time varies from one attempt to the next, so many fractions are tried, and
  // an attempt that finished before the signal gives the next estimate of the wall time.
  double wall = run_mxlab(branch(copy_baseline("timing"))).wall_s;
  bool interrupted = false;
  std::string attempts;
  for (double frac : {0.6, 0.4, 0.75, 0.5, 0.85, 0.3, 0.65, 0.45, 0.7, 0.55, 0.8, 0.35, 0.9, 0.25}) {
    const std::string file = copy_baseline("intr");
    const Proc p = run_mxlab(branch(file), [&](double t) { return t >= frac * wall; }, SIGINT);
    attempts += " " + std::to_string(frac) + ":" + std::to_string(p.exit_code);
    if (p.exit_code == 0) wall = p.wall_s;  // finished before the signal
    if (p.exit_code != 130) continue;       // finished already, or signalled before the handlers
    interrupted = true;
    EXPECT_TRUE(contains(p.output, "branch 'fp32_at40' is incomplete")) << p.output;
    {
      const h5::H5File f(file, h5::H5File::Mode::read);
      ASSERT_TRUE(f.is_group("branches/fp32_at40"));
      EXPECT_FALSE(f.has_attr("branches/fp32_at40", "state"));
      EXPECT_EQ(f.get_attr_string("/", "status"), "complete");  // the run's own status
    }
    const Proc r = run_mxlab(branch(file));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "is incomplete (an interrupted mxlab branch): computing it again")) << r.output;
    const h5::H5File a(inline_, h5::H5File::Mode::read), b(file, h5::H5File::Mode::read);
    expect_same_group(a, "branches/fp32_at40", b, "branches/fp32_at40");
    break;
  }
  EXPECT_TRUE(interrupted) << "no attempt was interrupted mid-branch (uninterrupted branch: " << wall
                           << " s; fraction:exit code of each attempt:" << attempts << ")";
}
