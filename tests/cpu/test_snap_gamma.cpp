// The presets that separate the two explanations of the loss jump at a switch:
// `snap_gamma` (stored gamma/beta := the quantized values the forward pass used, a change of
// state when the branch starts), `to_fp32_keep_gamma_q` (to_fp32 with the norm's affine weights
// still quantized as before), and presets joined by '+'.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/config/config_io.h"
#include "lab/train/eval.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

std::string load_error(const std::string& yaml) {
  try {
    config_from_yaml_string(yaml, "snap.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A small run whose MX gamma are clamped (lr high enough to move them off 1.0 in 30 steps),
// snapshots at 20 and branches at 20.
std::string run_small(mxlab::test::TempDir& dir, const std::string& interventions) {
  const std::string exp = dir.write(
      "s.yaml",
      "steps: 30\nseed: 5\nmodel: {depth: 2, width: 64, hidden_mult: 1}\ndata: {batch: 32}\noptimizer: {lr: 0.01}\n"
      "precision: {rounding: nearest_away}\n"
      "log: {log_every: 5, bias_every: 5, progress: false, snapshot_steps: [20], probe_batch: 16}\n" +
          interventions);
  std::string file;
  mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file);
  return file;
}

}  // namespace

TEST(SnapGamma, PresetsParseJoinAndRejectUnknownParts) {
  const RunConfig c = config_from_yaml_string(
      "interventions:\n  - {name: a, at: 5, apply: snap_gamma+to_fp32}\n  - {name: b, at: 5, apply: to_fp32_keep_gamma_q}\n",
      "snap.yaml");
  ASSERT_EQ(c.interventions.size(), 2u);
  EXPECT_EQ(c.interventions[0].apply, "snap_gamma+to_fp32");
  EXPECT_EQ(preset_parts("snap_gamma+to_fp32"), (std::vector<std::string>{"snap_gamma", "to_fp32"}));
  EXPECT_TRUE(snaps_gamma(c.interventions[0]));
  EXPECT_FALSE(snaps_gamma(c.interventions[1]));
  // keep_gamma_q is to_fp32 except for the norm's affine weights.
  const PrecisionConfig base = c.precision;
  PrecisionConfig want = apply_intervention(base, {"x", 0, "to_fp32", {}});
  want.ln_affine = base.ln_affine;
  const PrecisionConfig got = apply_intervention(base, c.interventions[1]);
  EXPECT_EQ(got.ln_affine, base.ln_affine);
  EXPECT_EQ(got.weight, NumFmt::fp32);
  EXPECT_EQ(got.grad, NumFmt::fp32);
  EXPECT_FALSE(got.elementwise_bf16);
  EXPECT_EQ(describe_policy(got), describe_policy(want));
  // snap_gamma changes no policy field.
  EXPECT_EQ(describe_policy(apply_intervention(base, {"x", 0, "snap_gamma", {}})), describe_policy(base));
  const std::string e = load_error("interventions:\n  - {name: a, at: 5, apply: snap_gamma+to_fp33}\n");
  EXPECT_NE(e.find("unknown preset 'to_fp33' in 'snap_gamma+to_fp33'"), std::string::npos) << e;
  EXPECT_NE(load_error("interventions:\n  - {name: a, at: 5, apply: none+to_fp32}\n").find("unknown preset 'none'"),
            std::string::npos);
}

// mxlab eval of the snapshot at 20: snapping alone changes nothing the forward pass sees;
// snapping then removing gamma's quantization (skip_ln_quant) evaluates the same function as
// trained, bit for bit, while skip_ln_quant alone changes it (the clamp debt); snap + to_fp32
// equals to_fp32_keep_gamma_q.
TEST(SnapGamma, EvalSeparatesTheGammaChangeFromTheRestOfTheSwitch) {
  mxlab::test::TempDir dir;
  const std::string file = run_small(dir, "");
  ASSERT_FALSE(file.empty());
  auto be = make_cpu_backend();
  const std::vector<EvalRow> r =
      eval_snapshot(*be, file, "mx", 20,
                    {{"e", 0, "snap_gamma", {}}, {"e", 0, "skip_ln_quant", {}}, {"e", 0, "snap_gamma+skip_ln_quant", {}},
                     {"e", 0, "snap_gamma+to_fp32", {}}, {"e", 0, "to_fp32_keep_gamma_q", {}}, {"e", 0, "to_fp32", {}}},
                    false);
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[1].loss, r[0].loss);
  EXPECT_NE(r[2].loss, r[0].loss) << "no gamma clamped in this run: the test cannot see the snap";
  EXPECT_EQ(r[3].loss, r[0].loss);
  EXPECT_EQ(r[4].loss, r[5].loss);
  EXPECT_NE(r[4].loss, r[6].loss);
}

// In a run: a snap_gamma branch's first step sees the function its arm saw (same loss at `at`,
// bit for bit), its clamp debt is gone at `at`, and it then trains on its own; a snap on an
// attention model is refused.
TEST(SnapGamma, BranchStartsFromTheQuantizedGamma) {
  mxlab::test::TempDir dir;
  const std::string file = run_small(dir, "interventions:\n  - {name: snap, at: 20, apply: snap_gamma}\n"
                                          "  - {name: plain, at: 20, apply: skip_ln_quant}\n");
  ASSERT_FALSE(file.empty());
  const h5::H5File f(file, h5::H5File::Mode::read);
  const std::vector<double> mx = f.read_doubles("trajectories/mx/loss_all");
  const std::vector<double> snap = f.read_doubles("branches/snap/loss_all");
  ASSERT_EQ(snap.size(), 10u);
  EXPECT_EQ(static_cast<float>(snap[0]), static_cast<float>(mx[20]));
  EXPECT_NE(static_cast<float>(snap[9]), static_cast<float>(mx[29]));
  // Clamp debt at the branch's first logged step (20): none for the snapped gamma, some for the arm.
  const std::vector<int64_t> steps = f.read_int64s("branches/snap/step");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0], 20);
  const std::vector<double> gap = f.read_doubles("branches/snap/gamma_gap_mean");
  for (size_t l = 0; l < 2; ++l) EXPECT_EQ(gap[l], 0.0) << l;
  const std::vector<int64_t> msteps = f.read_int64s("trajectories/mx/step");
  const size_t k = static_cast<size_t>(std::find(msteps.begin(), msteps.end(), 20) - msteps.begin());
  ASSERT_LT(k, msteps.size());
  const std::vector<double> mgap = f.read_doubles("trajectories/mx/gamma_gap_mean");
  EXPECT_GT(mgap[2 * k] + mgap[2 * k + 1], 0.0);
  const std::string a = load_error("model: {block: attention, heads: 2}\ndata: {seq_len: 32, batch: 2}\n"
                                   "interventions:\n  - {name: s, at: 5, apply: snap_gamma}\n");
  EXPECT_EQ(a, "");  // the config is valid; the trainer refuses it
  mxlab::test::TempDir d2;
  const std::string exp = d2.write("a.yaml", "steps: 6\nmodel: {depth: 1, width: 32, hidden_mult: 1, block: attention, heads: 2}\n"
                                             "data: {seq_len: 32, batch: 2}\nlog: {progress: false}\n"
                                             "interventions:\n  - {name: s, at: 5, apply: snap_gamma}\n");
  const auto [rc, out] = mxlab::test::run_command(std::string(MXLAB_BINARY) + " run " + exp + " --out " + d2.str() +
                                                  "/r --device cpu --quiet");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("snap_gamma covers the norms of MLP blocks only"), std::string::npos) << out;
}

// reset_adam_v: the branch's v at its start is bc2 * g^2 with g its first gradient. With the
// policy unchanged, g is the arm's gradient at that step, which the arm's v at the next step
// gives back: v21 = b2 v20 + (1 - b2) g^2. The branch's first loss is the arm's (same weights);
// its later losses differ. SGD refuses the preset.
TEST(SnapGamma, ResetAdamVRecalibratesOnTheFirstGradient) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "v.yaml",
      "steps: 24\nseed: 5\nmodel: {depth: 2, width: 64, hidden_mult: 1}\ndata: {batch: 32}\noptimizer: {lr: 0.01}\n"
      "log: {log_every: 5, bias_every: 5, progress: false, snapshot_steps: [20, 21], snapshot_optimizer: true,"
      " probe_batch: 16}\n"
      "interventions:\n  - {name: rv, at: 20, apply: reset_adam_v}\n");
  const std::string bin = MXLAB_BINARY;
  std::string file;
  ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file));
  const h5::H5File f(file, h5::H5File::Mode::read);
  const double b2 = 0.999;
  const double bc2 = 1.0 - std::pow(b2, 21.0);  // step 20: 1 - beta2^(t+1)
  const std::string grp = "layer1.W1";
  const std::vector<double> v20 = f.read_doubles("snapshots/mx/step_20/v/" + grp);
  const std::vector<double> v21 = f.read_doubles("snapshots/mx/step_21/v/" + grp);
  const std::vector<double> rv = f.read_doubles("snapshots/rv/step_20/v/" + grp);
  ASSERT_EQ(rv.size(), v20.size());
  size_t compared = 0, differs = 0;
  for (size_t i = 0; i < rv.size(); ++i) {
    const double g2 = (v21[i] - b2 * v20[i]) / (1.0 - b2);
    if (g2 < 1e-3 * v21[i] / (1.0 - b2)) continue;  // too small to recover from float v
    EXPECT_NEAR(rv[i] / bc2, g2, 2e-3 * g2) << i;
    differs += rv[i] != v20[i];
    ++compared;
  }
  EXPECT_GT(compared, rv.size() / 2);
  EXPECT_GT(differs, compared / 2);
  // Weights and m are the arm's.
  EXPECT_EQ(f.read_doubles("snapshots/rv/step_20/m/" + grp), f.read_doubles("snapshots/mx/step_20/m/" + grp));
  EXPECT_EQ(f.read_doubles("snapshots/rv/step_20/" + grp), f.read_doubles("snapshots/mx/step_20/" + grp));
  const std::vector<double> mx = f.read_doubles("trajectories/mx/loss_all");
  const std::vector<double> br = f.read_doubles("branches/rv/loss_all");
  EXPECT_EQ(static_cast<float>(br[0]), static_cast<float>(mx[20]));
  EXPECT_NE(static_cast<float>(br[3]), static_cast<float>(mx[23]));
  const std::string sgd = dir.write("s.yaml", "steps: 6\nmodel: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
                                              "optimizer: {name: sgd, lr: 0.01}\nlog: {progress: false}\n"
                                              "interventions:\n  - {name: rv, at: 3, apply: reset_adam_v}\n");
  const auto [rc, out] = mxlab::test::run_command(bin + " run " + sgd + " --out " + dir.str() + "/s --device cpu --quiet");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("reset_adam_v needs Adam"), std::string::npos) << out;
}
