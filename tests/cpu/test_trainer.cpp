// The paired-run trainer on the CPU backend: determinism, FP32-under-MX-path identity,
// metrics present and sane, branches, checkpoint resume, summaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/runs/checkpoint.h"
#include "lab/config/config_io.h"
#include "lab/stats/loss_events.h"
#include "lab/train/trainer.h"

using namespace mxlab;

namespace {

RunConfig tiny_config() {
  RunConfig c;
  c.seed = 7;
  c.steps = 24;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 48;
  c.optimizer.lr = 3e-3f;
  c.precision.rounding = Rounding::nearest_away;
  c.precision.elementwise_rounding = Rounding::nearest_away;
  c.log.log_every = 4;
  c.log.bias_every = 4;
  c.log.progress = false;
  return c;
}

// Run a config to the end into a memory sink.
MemorySink run_to_end(const RunConfig& cfg, std::string* status = nullptr) {
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(cfg, *be, sink);
  tr.open_output();
  const std::string st = tr.run(RunControl{});
  tr.finish(st);
  if (status) *status = st;
  return sink;
}

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

void expect_groups_identical(const MemorySink& a, const MemorySink& b, const std::string& group,
                             int64_t from_step = 0) {
  const auto& ra = a.groups.at(group).rows;
  const auto& rb = b.groups.at(group).rows;
  size_t ia = 0, ib = 0;
  while (ia < ra.size() && ra[ia].step < from_step) ++ia;
  while (ib < rb.size() && rb[ib].step < from_step) ++ib;
  ASSERT_EQ(ra.size() - ia, rb.size() - ib) << group;
  for (; ia < ra.size(); ++ia, ++ib) {
    ASSERT_EQ(ra[ia].step, rb[ib].step);
    ASSERT_EQ(ra[ia].cols.size(), rb[ib].cols.size()) << group << " step " << ra[ia].step;
    for (size_t c = 0; c < ra[ia].cols.size(); ++c) {
      ASSERT_EQ(ra[ia].cols[c].first, rb[ib].cols[c].first);
      const auto& va = ra[ia].cols[c].second;
      const auto& vb = rb[ib].cols[c].second;
      ASSERT_EQ(va.size(), vb.size());
      for (size_t k = 0; k < va.size(); ++k)
        ASSERT_TRUE(same_bits(va[k], vb[k])) << group << " step " << ra[ia].step << " " << ra[ia].cols[c].first
                                             << "[" << k << "]: " << va[k] << " vs " << vb[k];
    }
  }
}

}  // namespace

TEST(Summary, DefinitionsOnHandMadeHistories) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Decreasing loss: no divergence, no spikes.
  LossSummary s = summarize_losses({4, 3, 2, 1.5f, 1.2f, 1.0f}, 0, 10.0, 100.0);
  EXPECT_EQ(s.divergence_step, -1);
  EXPECT_EQ(s.spike_count, 0);
  EXPECT_EQ(s.first_nonfinite_step, -1);
  EXPECT_DOUBLE_EQ(s.final_loss, 1.0);
  EXPECT_DOUBLE_EQ(s.min_loss, 1.0);
  // A recovered spike is a spike, not a divergence.
  s = summarize_losses({1, 0.9f, 200, 0.8f, 0.7f}, 0, 10.0, 100.0);
  EXPECT_EQ(s.spike_count, 1);
  EXPECT_EQ(s.divergence_step, -1);
  // Loss that leaves and never returns below 10x the earlier minimum diverges where it left;
  // a NaN at the end counts as above, and offsets are absolute steps.
  // Here 8 > 10 * 0.4 already at step 104 and the loss never comes back.
  s = summarize_losses({1, 0.5f, 0.4f, 3, 8, 50, nan}, 100, 10.0, 100.0);
  EXPECT_EQ(s.divergence_step, 104);
  EXPECT_EQ(s.first_nonfinite_step, 106);
  EXPECT_DOUBLE_EQ(s.final_loss, 50.0);
  // Spike score: sigma of the last 30 % (6 of 20 values alternating 1.0/1.1) is 0.05; the
  // spike at step 5 stands (10 - 1)/0.05 - 3 = 177 sigmas above its rolling minimum.
  std::vector<float> flat(20, 1.0f);
  flat[5] = 10.0f;
  for (int t = 14; t < 20; t += 2) flat[t] = 1.1f;
  s = summarize_losses(flat, 0, 10.0, 100.0);
  EXPECT_NEAR(s.spike_score, 177.0, 1e-3);
  EXPECT_EQ(s.spike_count, 0);  // 10x is below the default spike factor of 100
  EXPECT_EQ(s.divergence_step, -1);
}

TEST(Trainer, SameSeedGivesBitIdenticalMetrics) {
  const RunConfig cfg = tiny_config();
  const MemorySink a = run_to_end(cfg);
  const MemorySink b = run_to_end(cfg);
  for (const char* g : {"trajectories/fp32", "trajectories/mx"}) {
    expect_groups_identical(a, b, g);
    const auto& la = a.groups.at(g).loss_all;
    const auto& lb = b.groups.at(g).loss_all;
    ASSERT_EQ(la.size(), static_cast<size_t>(cfg.steps));
    for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(std::memcmp(&la[i], &lb[i], 4), 0) << i;
  }
}

TEST(Trainer, Fp32PolicyOnTheMxPathReproducesTheFp32Trajectory) {
  RunConfig cfg = tiny_config();
  cfg.precision = PrecisionConfig::fp32();
  const MemorySink s = run_to_end(cfg);
  const auto& f = s.groups.at("trajectories/fp32");
  const auto& m = s.groups.at("trajectories/mx");
  ASSERT_EQ(f.loss_all.size(), m.loss_all.size());
  for (size_t i = 0; i < f.loss_all.size(); ++i) ASSERT_EQ(f.loss_all[i], m.loss_all[i]) << "step " << i;
  for (double w : s.series("trajectories/mx", "weight_distance")) EXPECT_EQ(w, 0.0);
  for (double b : s.series("trajectories/mx", "bias_ratio")) EXPECT_EQ(b, 0.0);
  for (double c : s.series("trajectories/mx", "cross_ratio")) EXPECT_EQ(c, 0.0);
}

TEST(Trainer, EveryMetricIsLoggedWithItsShape) {
  const RunConfig cfg = tiny_config();
  const MemorySink s = run_to_end(cfg);
  const int L = cfg.model.depth;
  const size_t G = NetShape::student(cfg.model).groups.size();
  const std::set<std::string> scalars_all = {"step", "loss", "lr", "grad_norm", "update_norm", "weight_norm"};
  const std::set<std::string> scalars_mx = {"bias_ratio",     "cosine",       "bias_ratio_avg",     "cross_ratio",
                                            "cross_cosine",   "weight_distance", "cross_ratio_sq", "cross_ratio_sq_avg",
                                            "eps_norm",       "gbar_norm",    "gtilde_norm",        "eps_par",
                                            "eps_perp",       "shadow_loss"};
  std::set<std::string> per_layer = {"gamma_mean", "gamma_std", "gamma_min", "gamma_max"};
  for (const char* t : {"gamma", "beta", "ln_out", "act_out", "grad_out", "grad_hidden"}) {
    per_layer.insert(std::string(t) + "_lastbin");
    per_layer.insert(std::string(t) + "_clamped");
  }
  for (const char* t : {"gamma", "beta"})  // clamp debt
    for (const char* q : {"_gap_mean", "_gap_max", "_above_frac"}) per_layer.insert(std::string(t) + q);
  const std::set<std::string> per_weight = {"weight_gap_mean", "weight_above_frac"};
  for (const char* g : {"trajectories/fp32", "trajectories/mx"}) {
    const bool mx = std::string(g) == "trajectories/mx";
    std::vector<MetricRow> rows;  // the logged rows (not the shadow_step series)
    for (const MetricRow& r : s.groups.at(g).rows)
      if (r.axis == "step") rows.push_back(r);
    // Every log_every-th step, plus the last step.
    const size_t expected_rows = static_cast<size_t>((cfg.steps + cfg.log.log_every - 1) / cfg.log.log_every) +
                                 ((cfg.steps - 1) % cfg.log.log_every != 0 ? 1 : 0);
    ASSERT_EQ(rows.size(), expected_rows);
    for (const MetricRow& r : rows) {
      std::set<std::string> seen;
      for (const auto& [name, v] : r.cols) {
        seen.insert(name);
        if (scalars_all.count(name) || scalars_mx.count(name)) {
          EXPECT_EQ(v.size(), 1u) << name;
          EXPECT_TRUE(std::isfinite(v[0])) << g << " " << name << " at step " << r.step;
        } else if (per_layer.count(name)) {
          EXPECT_EQ(v.size(), static_cast<size_t>(L)) << name;
          for (double x : v) {
            EXPECT_TRUE(std::isfinite(x)) << name;
            if (name.find("gamma_") != 0) {
              EXPECT_TRUE(x >= 0.0 && x <= 1.0) << name << " = " << x;
            }
          }
        } else if (per_weight.count(name)) {
          EXPECT_EQ(v.size(), static_cast<size_t>(2 * L)) << name;
          for (double x : v) EXPECT_TRUE(x >= 0.0 && x <= 1.0) << name << " = " << x;
          if (!mx) {
            for (double x : v) EXPECT_EQ(x, 0.0) << "FP32 stores what it uses: " << name;
          }
        } else if (name == "bias_ratio_group" || name == "cosine_group" || name == "eps_norm_group" ||
                   name == "gbar_norm_group" || name == "gtilde_norm_group") {
          EXPECT_EQ(v.size(), G);
        } else {
          ADD_FAILURE() << "undocumented metric " << name;
        }
      }
      for (const auto& n : scalars_all) EXPECT_TRUE(seen.count(n)) << g << " lacks " << n;
      for (const auto& n : per_layer) EXPECT_TRUE(seen.count(n)) << g << " lacks " << n;
      if (mx) {
        for (const auto& n : scalars_mx) EXPECT_TRUE(seen.count(n)) << g << " lacks " << n;
      }
    }
  }
  // MX run: the bias ratio is positive (quantization changes the gradient) and cosine < 1.
  const auto br = s.series("trajectories/mx", "bias_ratio");
  for (double b : br) EXPECT_GT(b, 0.0);
  // Summary attributes: the largest logged bias ratio and gamma last-bin fraction.
  const auto& mx_attrs = s.groups.at("trajectories/mx").attrs.num;
  EXPECT_EQ(mx_attrs.at("max_bias_ratio"), *std::max_element(br.begin(), br.end()));
  double gmax = 0.0;
  for (const MetricRow& r : s.groups.at("trajectories/mx").rows)
    for (const auto& [name, v] : r.cols)
      if (name == "gamma_lastbin")
        for (double x : v) gmax = std::max(gmax, x);
  EXPECT_EQ(mx_attrs.at("max_gamma_lastbin"), gmax);
  EXPECT_EQ(s.groups.at("trajectories/fp32").attrs.num.count("max_bias_ratio"), 0u);
  // Quantized tensors are marked as such; the fp32 trajectory's statistics are diagnostics.
  EXPECT_EQ(s.groups.at("trajectories/mx").dataset_attrs.at("gamma_lastbin").ints.at("quantized"), 1);
  EXPECT_EQ(s.groups.at("trajectories/fp32").dataset_attrs.at("gamma_lastbin").ints.at("quantized"), 0);
}

TEST(Trainer, EmptyPatchBranchReproducesTheBaselineAfterAt) {
  RunConfig cfg = tiny_config();
  InterventionConfig iv;
  iv.name = "same";
  iv.at = 9;
  cfg.interventions.push_back(iv);
  const MemorySink s = run_to_end(cfg);
  const auto& base = s.groups.at("trajectories/mx");
  const auto& br = s.groups.at("branches/same");
  EXPECT_EQ(br.attrs.ints.at("at"), 9);
  ASSERT_EQ(br.loss_all.size(), static_cast<size_t>(cfg.steps - 9));
  for (size_t i = 0; i < br.loss_all.size(); ++i) ASSERT_EQ(br.loss_all[i], base.loss_all[9 + i]) << i;
  // Logged rows after `at` are bit-identical, cross metrics included.
  MemorySink only_base, only_branch;
  only_base.groups["g"] = base;
  only_branch.groups["g"] = br;
  expect_groups_identical(only_base, only_branch, "g", 12);
}

TEST(Trainer, PresetBranchDiffersFromTheBaseline) {
  RunConfig cfg = tiny_config();
  InterventionConfig iv;
  iv.name = "fp32";
  iv.at = 8;
  iv.apply = "to_fp32";
  cfg.interventions.push_back(iv);
  const MemorySink s = run_to_end(cfg);
  const auto& base = s.groups.at("trajectories/mx").loss_all;
  const auto& br = s.groups.at("branches/fp32").loss_all;
  int differ = 0;
  for (size_t i = 1; i < br.size(); ++i) differ += br[i] != base[8 + i];
  EXPECT_GT(differ, 0);
  // The to_fp32 branch's own bias ratio is zero (its gradient is the FP32 one).
  for (double b : s.series("branches/fp32", "bias_ratio")) EXPECT_EQ(b, 0.0);
}

TEST(Trainer, CheckpointResumeEqualsUninterrupted) {
  RunConfig cfg = tiny_config();
  InterventionConfig iv;
  iv.name = "late";
  iv.at = 14;
  iv.apply = "skip_ln_quant";
  cfg.interventions.push_back(iv);
  const MemorySink full = run_to_end(cfg);
  char tmpl[] = "/tmp/mxlab-ckpt-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  for (int stop_at : {5, 11, 17}) {  // before the branch, before and after a log step, after it
    const std::string path = dir + "/c" + std::to_string(stop_at) + ".ckpt";
    MemorySink first;
    {
      auto be = make_cpu_backend();
      Trainer tr(cfg, *be, first);
      tr.open_output();
      tr.run(RunControl{}, stop_at);
      save_checkpoint(tr, "hash", path);
    }
    auto be = make_cpu_backend();
    MemorySink resumed = first;
    resumed.truncate_from(stop_at);
    Trainer tr(cfg, *be, resumed);
    load_checkpoint(tr, "hash", path);
    EXPECT_EQ(tr.step(), stop_at);
    const std::string st = tr.run(RunControl{});
    tr.finish(st);
    for (const char* g : {"trajectories/fp32", "trajectories/mx", "branches/late"}) {
      expect_groups_identical(full, resumed, g);
      EXPECT_EQ(full.groups.at(g).loss_all, resumed.groups.at(g).loss_all) << g;
    }
  }
}

// The shadow rows of unlogged steps are queued on the backend and written at flushes (every
// shadow_flush_every queued steps, and before log steps, branch starts, curvature, checkpoints
// and the run's end): every row, its values and its place among the other rows are those of
// writing each step at once (flush every 1), for a branch that starts between flushes too.
TEST(Trainer, QueuedShadowRowsEqualRowsWrittenAtOnce) {
  RunConfig cfg = tiny_config();
  cfg.steps = 26;
  cfg.log.log_every = 6;
  cfg.log.bias_every = 1;
  cfg.log.curvature_every = 10;
  cfg.log.curvature_iters = 4;
  InterventionConfig iv;
  iv.name = "late";
  iv.at = 15;
  iv.apply = "to_fp32_keep_gamma_q";
  cfg.interventions.push_back(iv);
  auto run_with = [&](int64_t every) {
    auto be = make_cpu_backend();
    MemorySink sink;
    Trainer tr(cfg, *be, sink);
    tr.set_shadow_flush_every(every);
    tr.open_output();
    tr.finish(tr.run(RunControl{}));
    return sink;
  };
  const MemorySink once = run_with(1);
  size_t shadow_rows = 0;
  int64_t last = -1;
  for (const MetricRow& r : once.groups.at("trajectories/mx").rows) {
    if (r.axis != "shadow_step") continue;
    ++shadow_rows;
    EXPECT_GT(r.step, last);
    last = r.step;
  }
  EXPECT_EQ(shadow_rows, static_cast<size_t>(cfg.steps));  // bias_every 1: every step
  for (int64_t every : {4, 64}) {
    const MemorySink queued = run_with(every);
    for (const char* g : {"trajectories/fp32", "trajectories/mx", "branches/late"}) {
      SCOPED_TRACE(std::string(g) + ", flush every " + std::to_string(every));
      expect_groups_identical(once, queued, g);
      ASSERT_EQ(once.groups.at(g).rows.size(), queued.groups.at(g).rows.size());
      for (size_t i = 0; i < once.groups.at(g).rows.size(); ++i)
        ASSERT_EQ(once.groups.at(g).rows[i].axis, queued.groups.at(g).rows[i].axis) << i;
    }
  }
  // A run stopped between flushes still writes its queued rows.
  auto be = make_cpu_backend();
  MemorySink stopped;
  Trainer tr(cfg, *be, stopped);
  tr.set_shadow_flush_every(64);
  tr.open_output();
  tr.run(RunControl{}, 9);
  size_t rows_to_9 = 0;
  for (const MetricRow& r : stopped.groups.at("trajectories/mx").rows) rows_to_9 += r.axis == "shadow_step";
  EXPECT_EQ(rows_to_9, 9u);
}

TEST(Trainer, CorruptedOrForeignCheckpointsAreRefused) {
  const RunConfig cfg = tiny_config();
  char tmpl[] = "/tmp/mxlab-ckpt-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/a.ckpt";
  {
    auto be = make_cpu_backend();
    MemorySink sink;
    Trainer tr(cfg, *be, sink);
    tr.run(RunControl{}, 3);
    save_checkpoint(tr, "hash", path);
  }
  auto expect_refused = [&](const std::string& p, const std::string& hash, const std::string& what) {
    auto be = make_cpu_backend();
    MemorySink sink;
    Trainer tr(cfg, *be, sink);
    try {
      load_checkpoint(tr, hash, p);
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_refused(path, "other", "different configuration");
  // Flip one payload byte: checksum.
  std::string bytes;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
    std::fclose(f);
  }
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  const std::string p2 = dir + "/flipped.ckpt", p3 = dir + "/truncated.ckpt";
  FILE* f = std::fopen(p2.c_str(), "wb");
  std::fwrite(flipped.data(), 1, flipped.size(), f);
  std::fclose(f);
  expect_refused(p2, "hash", "checksum");
  f = std::fopen(p3.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size() - 100, f);
  std::fclose(f);
  expect_refused(p3, "hash", "truncated");
}

// When a trajectory counts as diverged (the run status, summaries and the run report): the
// earlier of its divergence step and its first non-finite step that are >= 0.
TEST(Summary, DivergedAtTakesTheEarlierStep) {
  EXPECT_EQ(mxlab::diverged_at(-1, -1), -1);
  EXPECT_EQ(mxlab::diverged_at(500, -1), 500);
  EXPECT_EQ(mxlab::diverged_at(-1, 30), 30);
  EXPECT_EQ(mxlab::diverged_at(500, 30), 30);
  EXPECT_EQ(mxlab::diverged_at(20, 30), 20);
  mxlab::LossSummary s;
  s.divergence_step = 7;
  s.first_nonfinite_step = 9;
  EXPECT_EQ(mxlab::diverged_at(s), 7);
}

// The phase clock (`mxlab bench --log-steps`): called on logged steps only (once with nullptr
// as each begins, then once per phase), with the phases of a logged step in their order, and
// without changing a bit of what the run writes.
TEST(Trainer, PhaseClockSeesLoggedStepsOnlyAndChangesNothing) {
  RunConfig cfg = tiny_config();
  cfg.steps = 10;
  cfg.log.log_every = 4;  // logged: 0, 4, 8 and the last step 9
  cfg.log.bias_every = 2;
  const MemorySink plain = run_to_end(cfg);
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(cfg, *be, sink);
  tr.open_output();
  std::vector<std::string> calls;
  tr.set_phase_clock([&](const char* phase) { calls.push_back(phase ? phase : "<begin>"); });
  tr.finish(tr.run(RunControl{}));
  for (const char* g : {"trajectories/fp32", "trajectories/mx"}) {
    expect_groups_identical(plain, sink, g);
    EXPECT_EQ(plain.groups.at(g).loss_all, sink.groups.at(g).loss_all) << g;
  }
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "<begin>"), 4);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), "<begin>");
  // One logged step: the phases in order (two trajectories: the per-trajectory ones twice;
  // the MX one with its shadow row, the step being a shadow step).
  const std::vector<std::string> step0(calls.begin(), std::find(calls.begin() + 1, calls.end(), "<begin>"));
  const std::vector<std::string> want = {"<begin>", "eager compute with statistics", "gradient reductions",
                                         "statistics counters",
                                         "losses", "gradient metrics (host)", "clamp debt (quantization gaps)",
                                         "last-bin statistics (host)",
                                         "losses", "shadow row (with its sink write)", "gradient metrics (host)",
                                         "clamp debt (quantization gaps)", "last-bin statistics (host)",
                                         "update", "weight reductions",
                                         "gamma moments", "sink write", "gamma moments", "sink write", "sink flush"};
  EXPECT_EQ(step0, want);
}
