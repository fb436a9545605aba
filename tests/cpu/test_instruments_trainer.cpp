// The stability instruments inside the trainer: curvature rows on their own axis for
// every trajectory, equal to a measurement at the snapshot of that step; the Eq. 10 left-hand
// side and the edge-of-stability threshold from their definitions; the clamp debt of gamma,
// beta and the weights, consistent with the forward pass's own clamped counts; resume.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <tuple>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/curvature.h"
#include "lab/config/config_io.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

RunConfig tiny() {
  RunConfig c;
  c.seed = 21;
  c.steps = 16;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 1;
  c.data.batch = 24;
  c.optimizer.lr = 4e-3f;
  c.precision.rounding = Rounding::nearest_away;
  c.log.log_every = 1;
  c.log.bias_every = 1;
  c.log.progress = false;
  c.log.curvature_every = 5;
  c.log.curvature_iters = 6;
  c.log.probe_batch = 16;
  c.log.snapshot_steps = {10};
  c.log.snapshot_optimizer = true;
  c.interventions = {{"noln", 7, "skip_ln_quant", {}}};
  return c;
}

// (step, value) of a curvature dataset of a group.
std::vector<std::pair<int64_t, double>> curv(const MemorySink& s, const std::string& g, const std::string& name) {
  std::vector<std::pair<int64_t, double>> out;
  for (const MetricRow& r : s.groups.at(g).rows) {
    if (r.axis != "curvature_step") continue;
    for (const auto& [n, v] : r.cols)
      if (n == name) out.push_back({r.step, v[0]});
  }
  return out;
}

// The value of a logged (axis "step") metric of a group at `step`, column `col`.
double logged(const MemorySink& s, const std::string& g, const std::string& name, int64_t step, size_t col = 0) {
  for (const MetricRow& r : s.groups.at(g).rows) {
    if (r.axis != "step" || r.step != step) continue;
    for (const auto& [n, v] : r.cols)
      if (n == name) return v.at(col);
  }
  ADD_FAILURE() << name << " not logged at " << step << " in " << g;
  return std::nan("");
}

}  // namespace

TEST(InstrumentsTrainer, CurvatureRowsEqualAMeasurementAtTheSnapshot) {
  const RunConfig c = tiny();
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(c, *be, sink);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  for (const char* g : {"trajectories/fp32", "trajectories/mx"}) {
    const auto h = curv(sink, g, "hessian_lmax");
    ASSERT_EQ(h.size(), 3u) << g;  // steps 5, 10, 15 (not 0: Adam's v is empty there)
    EXPECT_EQ(h[0].first, 5);
    EXPECT_EQ(h[2].first, 15);
    for (const auto& [st, v] : h) EXPECT_TRUE(std::isfinite(v) && v > 0) << g << " " << st;
  }
  EXPECT_EQ(curv(sink, "branches/noln", "hessian_lmax").size(), 2u);  // 10, 15: after its `at`
  // Thresholds and Eq. 10 from their definitions (Adam, beta1 0.9: 38 / lr).
  const double lr = c.optimizer.lr;
  for (const char* g : {"trajectories/fp32", "trajectories/mx"}) {
    const auto pl = curv(sink, g, "precond_lmax");
    const auto th = curv(sink, g, "precond_threshold");
    const auto eq = curv(sink, g, "eq10_lhs");
    for (size_t i = 0; i < pl.size(); ++i) {
      EXPECT_NEAR(th[i].second, (2.0 + 2.0 * 0.9f) / ((1.0 - 0.9f) * static_cast<double>(static_cast<float>(lr))), 1e-9);
      const double s = static_cast<float>(lr) * pl[i].second;
      // r: the running bias ratio the trainer held at the start of the step (after step - 1).
      const double r = std::string(g) == "trajectories/fp32" ? 0.0 : logged(sink, g, "bias_ratio_avg", pl[i].first - 1);
      EXPECT_NEAR(eq[i].second, std::fabs(1.0 - s) + s * r, 1e-12 * (1 + eq[i].second)) << g;
    }
  }
  // The row at step 10 is a measurement at the weights and Adam moment stored at step 10.
  const NetShape& S = tr.shape();
  const size_t np = static_cast<size_t>(S.num_params);
  auto flat = [&](const std::string& prefix) {
    std::vector<float> v(np);
    for (const ParamGroup& g : S.groups) {
      const auto& a = sink.arrays.at(prefix + g.name).data;
      std::copy(a.begin(), a.end(), v.begin() + g.offset);
    }
    return v;
  };
  const std::vector<float> p = flat("snapshots/mx/step_10/"), v = flat("snapshots/mx/step_10/v/");
  const std::vector<float>& px = sink.arrays.at("snapshots/probe_x").data;
  const std::vector<float>& py = sink.arrays.at("snapshots/probe_y").data;
  auto be2 = make_cpu_backend();
  float* dp = be2->alloc(np);
  float* dv = be2->alloc(np);
  float* dx = be2->alloc(px.size());
  float* dy = be2->alloc(py.size());
  be2->upload(dp, p.data(), np);
  be2->upload(dv, v.data(), np);
  be2->upload(dx, px.data(), px.size());
  be2->upload(dy, py.data(), py.size());
  StepScalars sc;
  sc.step = 10;
  be2->set_step(sc);
  Curvature cv(*be2, S, c.loss_spec(), c.seed, c.log.probe_batch);
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.optimizer.beta2), 10.0));
  const CurvatureResult m = cv.measure(dp, dx, dy, dv, bc2, c.optimizer.eps, c.log.curvature_iters, c.seed);
  EXPECT_EQ(m.hessian_lmax, curv(sink, "trajectories/mx", "hessian_lmax")[1].second);
  EXPECT_EQ(m.precond_lmax, curv(sink, "trajectories/mx", "precond_lmax")[1].second);
  EXPECT_EQ(m.loss, curv(sink, "trajectories/mx", "probe_loss")[1].second);
}

TEST(InstrumentsTrainer, ClampDebtAgreesWithTheForwardPass) {
  RunConfig c = tiny();
  c.log.curvature_every = 0;
  c.log.snapshot_steps.clear();
  c.model.init = InitKind::xavier_normal;  // gamma = 1: above E4M3's 0.875 bin's block max? no: 1 is exact
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(c, *be, sink);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  const int L = c.model.depth;
  for (int64_t st = 0; st < c.steps; ++st)
    for (int l = 0; l < L; ++l) {
      // The stored gamma's clamped fraction is the forward pass's own count of clamped Q(gamma)
      // elements (both under the ln_affine spec, on the weights before the step's update).
      EXPECT_EQ(logged(sink, "trajectories/mx", "gamma_above_frac", st, l),
                logged(sink, "trajectories/mx", "gamma_clamped", st, l)) << st;
      EXPECT_EQ(logged(sink, "trajectories/mx", "beta_above_frac", st, l),
                logged(sink, "trajectories/mx", "beta_clamped", st, l)) << st;
      // FP32 uses what it stores.
      EXPECT_EQ(logged(sink, "trajectories/fp32", "gamma_gap_max", st, l), 0.0);
      if (st >= 7) {  // the branch's LN affine is not quantized from its `at` on
        EXPECT_EQ(logged(sink, "branches/noln", "gamma_gap_max", st, l), 0.0);
      }
    }
  // The weights under MXFP8 lose precision: a positive mean gap, none above its block (floor
  // scales the block's largest element into range... up to the last bin: a few may clamp).
  for (int64_t st : {0, 8, 15})
    for (size_t w = 0; w < static_cast<size_t>(2 * L); ++w) {
      const double gm = logged(sink, "trajectories/mx", "weight_gap_mean", st, w);
      EXPECT_GT(gm, 0.0);
      EXPECT_LT(gm, 0.05);  // E4M3 has 3 mantissa bits: relative error <= 2^-4 per element
    }
  EXPECT_EQ(sink.groups.at("trajectories/mx").dataset_attrs.at("weight_gap_mean").lists.at("names"),
            (std::vector<std::string>{"layer0.W1", "layer0.W2", "layer1.W1", "layer1.W2"}));
}

TEST(InstrumentsTrainer, CurvatureIsRejectedWhereItHasNoProducts) {
  RunConfig c = tiny();
  c.model.norm = NormKind::rmsnorm;
  EXPECT_THROW(validate_config(c), Error);
  c.model.norm = NormKind::layernorm;
  c.model.layernorm = false;  // no norm: covered
  EXPECT_NO_THROW(validate_config(c));
}

// `mxlab export --csv` writes each series with its own axis into a file of its own, with all
// its rows, and leaves the logged rows' file whole.
TEST(InstrumentsTrainer, ExportWritesEachSeriesToItsOwnCsv) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "e.yaml", "steps: 30\nmodel: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
                "log: {log_every: 5, bias_every: 2, progress: false, curvature_every: 10, curvature_iters: 3, "
                "probe_batch: 8}\n");
  const std::string bin = MXLAB_BINARY;
  std::string file;
  ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file));
  const auto [rc, out] = mxlab::test::run_command(bin + " export " + file + " --csv " + dir.str() + "/csv");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  const std::string id = std::filesystem::path(file).stem().string();
  auto lines = [&](const std::string& name) {
    std::vector<std::string> v;
    std::istringstream in(mxlab::test::read_file(dir.str() + "/csv/" + id + "_" + name + ".csv"));
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  };
  const auto rows = lines("mx"), curv = lines("mx_curvature"), shadow = lines("mx_shadow");
  ASSERT_EQ(rows.size(), 1u + 7u);     // steps 0, 5, ..., 25 and the last, 29
  ASSERT_EQ(curv.size(), 1u + 2u);     // steps 10, 20
  ASSERT_EQ(shadow.size(), 1u + 16u);  // steps 0, 2, ..., 28 and 29
  EXPECT_EQ(curv[0].rfind("curvature_step,", 0), 0u) << curv[0];
  EXPECT_NE(curv[0].find("precond_lmax"), std::string::npos);
  EXPECT_EQ(curv[1].rfind("10,", 0), 0u);
  EXPECT_EQ(shadow[0].rfind("shadow_step,", 0), 0u);
  EXPECT_EQ(rows[0].find("curvature"), std::string::npos);
  EXPECT_EQ(rows[0].find("shadow_bias_ratio"), std::string::npos);
  EXPECT_EQ(lines("fp32_curvature").size(), 3u);
}
