// data.mx_teacher_targets: the MX trajectories train on targets computed through the
// teacher under their own precision policy, with fresh label noise (the paper code's target
// path); the FP32 trajectory keeps the FP32 targets.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/config/config_io.h"
#include "lab/train/eval.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

RunConfig tiny(bool mx_targets, float noise) {
  RunConfig c;
  c.seed = 7;
  c.steps = 16;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 24;
  c.data.label_noise = noise;
  c.data.mx_teacher_targets = mx_targets;
  c.optimizer.lr = 3e-3f;
  c.precision.rounding = Rounding::nearest_away;
  c.log.log_every = 4;
  c.log.bias_every = 2;
  c.log.progress = false;
  c.arms = {{"mx", "", {}}, {"f32", "to_fp32", {}}};
  return c;
}

MemorySink run(const RunConfig& cfg) { return mxlab::test::run_in_memory(cfg); }

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(MxTeacherTargets, OnlyTheMxTrajectoriesTrainOnTheirOwnTargets) {
  const MemorySink off = run(tiny(false, 0.005f));
  const MemorySink on = run(tiny(true, 0.005f));
  const auto loss = [](const MemorySink& s, const std::string& g) { return s.groups.at(g).loss_all; };
  // The FP32 trajectory is untouched by the option.
  EXPECT_TRUE(same(loss(off, "trajectories/fp32"), loss(on, "trajectories/fp32")));
  // The MX arm trains on MX-teacher targets with fresh noise.
  EXPECT_FALSE(same(loss(off, "trajectories/mx"), loss(on, "trajectories/mx")));
  // Without the option, an arm under the all-FP32 policy is the FP32 trajectory bit for bit; with
  // it, it differs only by the fresh noise: without label noise it is the FP32 trajectory again.
  EXPECT_TRUE(same(loss(off, "trajectories/f32"), loss(off, "trajectories/fp32")));
  EXPECT_FALSE(same(loss(on, "trajectories/f32"), loss(on, "trajectories/fp32")));
  const MemorySink quiet = run(tiny(true, 0.0f));
  EXPECT_TRUE(same(loss(quiet, "trajectories/f32"), loss(quiet, "trajectories/fp32")));
  EXPECT_FALSE(same(loss(quiet, "trajectories/mx"), loss(run(tiny(false, 0.0f)), "trajectories/mx")));
}

TEST(MxTeacherTargets, RunIdAndYaml) {
  RunConfig a = tiny(false, 0.005f);
  RunConfig b = tiny(true, 0.005f);
  EXPECT_NE(config_hash(a), config_hash(b));
  EXPECT_TRUE(config_from_yaml_string(dump_config(b), "b") == b);
  EXPECT_NE(dump_config(b).find("mx_teacher_targets: true"), std::string::npos);
  // At its default the key is left out of the hashed text (run ids of earlier files hold).
  EXPECT_EQ(canonical_config_text(a).find("mx_teacher_targets"), std::string::npos);
}

// mxlab eval on the step's training batch reproduces the MX trajectory's recorded loss with the
// option on (its own targets) and the FP32 trajectory's.
TEST(MxTeacherTargets, EvalOnTheTrainingBatchUsesTheTrajectorysTargets) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "t.yaml",
      "steps: 16\nseed: 7\nmodel: {depth: 2, width: 32, hidden_mult: 2}\ndata: {batch: 24, mx_teacher_targets: true}\n"
      "precision: {rounding: nearest_away}\n"
      "log: {log_every: 4, bias_every: 2, progress: false, snapshot_steps: [10], probe_batch: 8}\n");
  std::string file;
  ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file));
  const h5::H5File f(file, h5::H5File::Mode::read);
  auto be = make_cpu_backend();
  for (const char* t : {"mx", "fp32"}) {
    const std::vector<EvalRow> rows = eval_snapshot(*be, file, t, 10, {}, true);
    EXPECT_EQ(static_cast<float>(rows[0].loss),
              static_cast<float>(f.read_doubles(std::string("trajectories/") + t + "/loss_all")[10]))
        << t;
  }
}
