// `mxlab bench` times the trainer's own step: the trainer's entry points it times
// (Trainer::step_unlogged and the pieces step_batch, step_trajectory, step_shadow) are the step
// run() takes, and the losses the bench reports after its figures are those `mxlab run` writes at
// the same step, bit for bit (CPU backend; no timing is checked).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/train/batch.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/bench_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

using mxlab::test::json_number;
using mxlab::test::run_loss;

namespace {

// A small paired run under a cosine schedule with warm-up and the shadow pass on every step.
RunConfig cosine_config(OptKind opt) {
  RunConfig c;
  c.seed = 5;
  c.steps = 16;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 24;
  c.optimizer.name = opt;
  c.optimizer.lr = opt == OptKind::sgd ? 5e-2f : 3e-3f;
  c.optimizer.momentum = 0.9f;
  c.optimizer.weight_decay = opt == OptKind::adamw ? 0.1f : 0.0f;
  c.schedule.name = SchedKind::cosine;
  c.schedule.warmup = 2;
  c.schedule.lr_min = 1e-4f;
  c.log.log_every = 100;  // run() logs step 0 only (the last step is never reached below)
  c.log.bias_every = 1;
  c.log.progress = false;
  return c;
}

// Everything a trajectory carries from step to step, and its loss history, as host vectors.
struct State {
  std::vector<float> params, m, v, shadow, losses;
};

State state_of(Trainer& tr, size_t i, int64_t steps) {
  const Trajectory& t = tr.trajectory(i);
  const size_t np = static_cast<size_t>(tr.shape().num_params);
  State s{tr.download(t.params, np), tr.download(t.m, np), tr.download(t.v, np), {},
          tr.download(t.loss_hist, static_cast<size_t>(steps))};
  if (t.shadow) s.shadow = tr.download(t.shadow, np);
  return s;
}

void expect_same_state(const State& a, const State& b, const std::string& what) {
  EXPECT_EQ(a.params, b.params) << what;
  EXPECT_EQ(a.m, b.m) << what;
  EXPECT_EQ(a.v, b.v) << what;
  EXPECT_EQ(a.shadow, b.shadow) << what;
  EXPECT_EQ(a.losses, b.losses) << what;
}

}  // namespace

// The entry points `mxlab bench` times, against run(): n unlogged steps, and n steps assembled
// from the pieces (batch, the FP32 trajectory, the MX trajectory's shadow pass, then its part),
// leave each trajectory's weights, optimizer state, loss history and shadow gradient exactly as
// n steps of run() do, for adam, adamw (with the MX trajectories' own targets) and sgd.
TEST(BenchTrainerStep, UnloggedStepsAndPiecesAreTheRunsStep) {
  constexpr int64_t n = 6;
  for (const OptKind opt : {OptKind::adam, OptKind::adamw, OptKind::sgd}) {
    RunConfig cfg = cosine_config(opt);
    cfg.data.mx_teacher_targets = opt == OptKind::adamw;
    const std::string name = opt == OptKind::adam ? "adam" : opt == OptKind::adamw ? "adamw" : "sgd";
    auto be_run = make_cpu_backend(), be_unlogged = make_cpu_backend(), be_pieces = make_cpu_backend();
    MemorySink s1, s2, s3;
    Trainer run(cfg, *be_run, s1), unlogged(cfg, *be_unlogged, s2), pieces(cfg, *be_pieces, s3);
    run.open_output();
    ASSERT_EQ(run.run(RunControl{}, n), "complete");
    for (int64_t t = 0; t < n; ++t) unlogged.step_unlogged();
    EXPECT_EQ(unlogged.step(), n);
    unlogged.run(RunControl{}, unlogged.step());  // flushes the queued shadow rows
    for (int64_t t = 0; t < n; ++t) {
      be_pieces->set_step(step_scalars(pieces.config(), t));
      pieces.step_batch();
      pieces.step_trajectory(0);
      pieces.step_shadow(1);  // at the MX weights before their update, as the step
      pieces.step_trajectory(1);
    }
    EXPECT_EQ(pieces.step(), 0);  // the pieces do not move the counter
    for (size_t i : {size_t{0}, size_t{1}}) {
      const State want = state_of(run, i, n);
      ASSERT_TRUE(std::isfinite(want.losses.back())) << name;
      expect_same_state(want, state_of(unlogged, i, n), name + ": step_unlogged, trajectory " + std::to_string(i));
      expect_same_state(want, state_of(pieces, i, n), name + ": pieces, trajectory " + std::to_string(i));
    }
    // The unlogged steps' shadow rows are the run's after its logged step 0.
    const auto& r1 = s1.groups.at("trajectories/mx").rows;
    const auto& r2 = s2.groups.at("trajectories/mx").rows;
    std::vector<std::pair<int64_t, decltype(MetricRow::cols)>> want, got;
    for (const MetricRow& r : r1)
      if (r.axis == "shadow_step" && r.step > 0) want.push_back({r.step, r.cols});
    for (const MetricRow& r : r2)
      if (r.axis == "shadow_step" && r.step > 0) got.push_back({r.step, r.cols});
    EXPECT_EQ(got.size(), static_cast<size_t>(n - 1)) << name;
    EXPECT_EQ(got, want) << name;
  }
}

// `mxlab bench --device cpu` reports every figure, and the losses it prints are the run's: the
// FP32 and MX figures train steps 0..n-1 (n = warm-up + timed steps), the paired figure steps
// n..2n-1, through the trainer, so the loss at step 2n-1 (n-1 with --only fp32 / mx) is the one
// `mxlab run` writes there. A private copy of the step with a constant learning rate, Adam for
// every optimizer or a step that is not the run's would report other losses.
TEST(BenchCli, ReportsTheLossesMxlabRunWritesAtTheSameStep) {
  mxlab::test::TempDir dir;
  const std::string base = "steps: 16\nseed: 3\nmodel: {depth: 1, width: 32, hidden_mult: 2}\n"
                           "schedule: {name: cosine, warmup: 3, lr_min: 1.0e-5}\nlog: {progress: false}\n";
  const struct {
    const char* name;
    std::string yaml;
  } cases[] = {
      {"adam", base + "optimizer: {name: adam, lr: 3.0e-3}\ndata: {batch: 16}\n"},
      {"sgd", base + "optimizer: {name: sgd, lr: 5.0e-2, momentum: 0.9}\ndata: {batch: 16}\n"},
      {"adamw_mx_targets", base + "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.1}\n"
                                  "data: {batch: 16, mx_teacher_targets: true}\n"},
  };
  const std::string bin = MXLAB_BINARY;  // --bench-file: the bench cache in the test's folder, not $HOME's
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string exp = dir.write(std::string(c.name) + ".yaml", c.yaml);
    std::string file;
    ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/run_" + c.name, &file));
    // n = 1 + 3 = 4: the figures train steps 0..3, the paired one 4..7.
    auto [rc, out] = mxlab::test::run_command(bin + " bench " + exp + " --device cpu --steps 3 --warmup 1 --bench-file " + dir.str() + "/bench.json");
    ASSERT_EQ(rc, 0) << out;
    for (const char* line : {"  FP32 trajectory step", "  MX trajectory step", "  shadow pass (FP32 at MX weights)",
                             "  data + teacher forward", "  paired step (all, on lanes)", "  curvature (probe batch"})
      EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
    for (const char* key : {"fp32_step_ms", "mx_step_ms", "shadow_ms", "data_ms", "paired_ms", "fwd_bwd_ms"})
      EXPECT_GT(json_number(out, key), 0.0) << key << "\n" << out;
    EXPECT_EQ(json_number(out, "fp32_loss_step"), 7.0) << out;
    EXPECT_EQ(json_number(out, "mx_loss_step"), 7.0) << out;
    EXPECT_EQ(static_cast<float>(json_number(out, "fp32_loss")), run_loss(file, "fp32", 7)) << out;
    EXPECT_EQ(static_cast<float>(json_number(out, "mx_loss")), run_loss(file, "mx", 7)) << out;
    // One trajectory's figure alone: its steps 0..3 through Trainer::step_trajectory.
    std::tie(rc, out) = mxlab::test::run_command(bin + " bench " + exp + " --device cpu --steps 3 --warmup 1 --bench-file " + dir.str() + "/bench.json --only fp32");
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(json_number(out, "fp32_loss_step"), 3.0) << out;
    EXPECT_EQ(static_cast<float>(json_number(out, "fp32_loss")), run_loss(file, "fp32", 3)) << out;
    EXPECT_TRUE(std::isnan(json_number(out, "mx_loss"))) << out;  // not trained
    std::tie(rc, out) = mxlab::test::run_command(bin + " bench " + exp + " --device cpu --steps 3 --warmup 1 --bench-file " + dir.str() + "/bench.json --only mx");
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(static_cast<float>(json_number(out, "mx_loss")), run_loss(file, "mx", 3)) << out;
  }
}
