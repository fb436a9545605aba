// `mxlab summarize DIR --by`: grouping of trajectories (arms beside fp32, branches, runs left
// out, runs without an FP32 trajectory) and the numbers of each group and pair, on run files
// written here with only what summarize reads (root attributes, config_yaml, the summary
// attributes and per-step losses of each trajectory), so that every expected value can be
// worked out by hand. The formulas themselves are tested in test_stats.cpp and
// test_events.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/config/config_io.h"
#include "lab/report/group_stats.h"
#include "lab/report/run_events.h"
#include "lab/report/run_filter.h"
#include "lab/runs/run_records.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;
using mxlab::test::read_file;
using mxlab::test::run_command;
using mxlab::test::TempDir;

namespace {

constexpr int64_t kSteps = 1000;

struct Traj {
  std::string name;
  int64_t divergence_step = -1, first_nonfinite_step = -1;
  double final_loss = 0.002, min_loss = 0.0019;
  int64_t steps_run = kSteps;
  int64_t at = -1;  // >= 0: a branch starting there
};

// The excursion rule of these tests: two 10-step blocks above 10 x the minimum before them. The
// losses written below sit at min_loss (0.0019) and jump to final_loss (0.05, 0.03: above 0.019)
// at divergence_step, so that the excursion happens there (and the diverged-to-end rule too);
// a trajectory is censored at its first step + steps_run - 20.
const EventRules kRules{ExcursionRule{10.0, 20, 10}, 100};

// The per-step losses of a trajectory: min_loss, final_loss from divergence_step on, NaN from
// first_nonfinite_step on; a healthy one ends at its final_loss.
std::vector<float> losses(const Traj& t) {
  const int64_t first = t.at >= 0 ? t.at : 0;
  std::vector<float> v(static_cast<size_t>(t.steps_run), static_cast<float>(t.min_loss));
  for (int64_t i = 0; i < t.steps_run; ++i) {
    const int64_t step = first + i;
    if (t.divergence_step >= 0 && step >= t.divergence_step) v[static_cast<size_t>(i)] = static_cast<float>(t.final_loss);
    if (t.first_nonfinite_step >= 0 && step >= t.first_nonfinite_step)
      v[static_cast<size_t>(i)] = std::numeric_limits<float>::quiet_NaN();
  }
  if (!v.empty() && t.divergence_step < 0 && t.first_nonfinite_step < 0) v.back() = static_cast<float>(t.final_loss);
  return v;
}

// A run file with the root attributes and per-trajectory summary attributes of SCHEMA.md.
void write_run(const std::string& dir, const std::string& id, const std::string& status, uint64_t seed, float lr,
               const std::vector<Traj>& trajs, const std::function<void(RunConfig&)>& tweak = nullptr) {
  RunConfig c;
  c.name = "by";
  c.seed = seed;
  c.steps = static_cast<int>(kSteps);
  c.optimizer.lr = lr;
  if (tweak) tweak(c);
  h5::H5File f(dir + "/" + id + ".h5", h5::H5File::Mode::create);
  f.set_attr("/", "schema_version", int64_t{1});
  f.set_attr("/", "run_id", id);
  f.set_attr("/", "status", status);
  f.set_attr("/", "config_yaml", dump_config(c));
  f.set_attr("/", "steps", kSteps);
  for (const Traj& t : trajs) {
    const std::string g = (t.at >= 0 ? "branches/" : "trajectories/") + t.name;
    f.create_group(g);
    if (t.at >= 0) f.set_attr(g, "at", t.at);
    f.set_attr(g, "steps_run", t.steps_run);
    f.set_attr(g, "first_nonfinite_step", t.first_nonfinite_step);
    f.set_attr(g, "divergence_step", t.divergence_step);
    f.set_attr(g, "spike_count", int64_t{0});
    f.set_attr(g, "spike_score", 0.0);
    f.set_attr(g, "final_loss", t.final_loss);
    f.set_attr(g, "min_loss", t.min_loss);
    const std::vector<float> v = losses(t);
    h5::H5Series::create(f, g + "/loss_all", h5::DType::f32).append_rows(v.data(), v.size());
  }
}

std::vector<RunRecord> scan(const std::string& dir) {
  std::vector<RunRecord> runs = scan_run_dir(dir);
  read_events(runs, kRules);
  return runs;
}

Traj fp32() { return {"fp32"}; }
Traj healthy(const std::string& arm) { return {arm, -1, -1, 0.0021}; }
Traj diverged(const std::string& arm, int64_t step) { return {arm, step, -1, 0.05}; }

// Two arms, "ta" and "ne", beside fp32 (no `mx`), five seeds at two learning rates:
//   lr 5e-4: ta diverges on seeds 0, 1, 4 (480, 870, 970; seed 4 also becomes non-finite at
//            990, its last finite loss 0.03); ne never diverges, seed 2 ends degraded (0.0045).
//   lr 3e-4: ta seed 3 becomes non-finite at 500 (no divergence_step); nothing else happens.
// FP32: final 0.002, min 0.0019 everywhere: degraded above 0.0038.
// Plus a run still running (left out).
void write_study(const std::string& dir) {
  for (uint64_t s = 0; s < 5; ++s) {
    Traj ta = healthy("ta");
    if (s == 0) ta = diverged("ta", 480);
    if (s == 1) ta = diverged("ta", 870);
    if (s == 4) ta = {"ta", 970, 990, 0.03};
    Traj ne = healthy("ne");
    if (s == 2) ne.final_loss = 0.0045;
    write_run(dir, "a5" + std::to_string(s), "diverged", s, 5e-4f, {fp32(), ta, ne});
    Traj ta3 = healthy("ta");
    if (s == 3) ta3 = {"ta", -1, 500, 0.004, 0.0019, 501};
    write_run(dir, "a3" + std::to_string(s), "complete", s, 3e-4f, {fp32(), ta3, healthy("ne")});
  }
  write_run(dir, "a55", "running", 5, 5e-4f, {fp32(), diverged("ta", 100), healthy("ne")});
}

const OutcomeGroup& find(const GroupedOutcomes& g, const std::vector<std::string>& values) {
  for (const auto& gr : g.groups)
    if (gr.values == values) return gr;
  throw Error("no group");
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells(1);
  for (char c : line) {
    if (c == ',') cells.emplace_back();
    else cells.back() += c;
  }
  return cells;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST(SummarizeBy, ArmsAndLearningRatesGroupedWithHandWorkedNumbers) {
  TempDir dir;
  write_study(dir.str());
  const std::vector<RunRecord> runs = scan(dir.str());
  // Every trajectory group is read, fp32 first, then the arms by name.
  ASSERT_EQ(runs.size(), 11u);
  ASSERT_EQ(runs[0].groups.size(), 3u);
  EXPECT_EQ(runs[0].groups[0].name, "fp32");
  EXPECT_EQ(runs[0].groups[1].name, "ne");
  EXPECT_EQ(runs[0].groups[2].name, "ta");

  const GroupedOutcomes g = group_outcomes(runs, {{"arm", "optimizer.lr"}});
  EXPECT_EQ(g.runs, 10u);
  ASSERT_EQ(g.left_out.size(), 1u);
  EXPECT_NE(g.left_out[0].find("a55.h5: status running"), std::string::npos) << g.left_out[0];
  // fp32 first, then arms by name; learning rates as numbers.
  ASSERT_EQ(g.groups.size(), 6u);
  const std::vector<std::vector<std::string>> order = {{"fp32", "0.0003"}, {"fp32", "0.0005"}, {"ne", "0.0003"},
                                                       {"ne", "0.0005"},   {"ta", "0.0003"},   {"ta", "0.0005"}};
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(g.groups[i].values, order[i]);

  // ta at 5e-4: 3/5 excursions, Wilson [0.2307, 0.8824] (test_stats.cpp), as many diverged to
  // the end; degraded: seeds 0, 1 (0.05 > 0.0038) and 4 (non-finite) = 3/5; median excursion
  // step of 480, 870, 970 = 870 (seed 4's loss is NaN from 990 to its end: non-finite counts as
  // above); loss ratios 25, 25, 1.05, 1.05, inf -> median 25. KM: events 480, 870, 970, two
  // censored at 1000 - 20: S = 0.8, 0.6, 0.4; median 970; S(980) = 0.4.
  const OutcomeGroup& ta5 = find(g, {"ta", "0.0005"});
  EXPECT_EQ(ta5.n, 5);
  EXPECT_EQ(ta5.excursions, 3);
  EXPECT_EQ(ta5.diverged_to_end, 3);
  EXPECT_NEAR(ta5.excursions_ci.lo, 0.2307242813, 1e-10);
  EXPECT_NEAR(ta5.excursions_ci.hi, 0.8823792258, 1e-10);
  EXPECT_EQ(ta5.degraded, 3);
  EXPECT_EQ(ta5.degraded_n, 5);
  EXPECT_EQ(ta5.median_excursion_step, 870);
  EXPECT_NEAR(ta5.median_loss_ratio, 25, 1e-12);
  EXPECT_EQ(ta5.km.median_time, 970);
  EXPECT_EQ(ta5.km.end_time, 980);
  EXPECT_NEAR(ta5.km.survival_end, 0.4, 1e-15);
  // Tail log-ratio over the last 100 steps (900..999) against FP32 (0.0019 there, 0.002 at 999):
  // seed 0 log(0.05 / 0.0019) for 99 steps and log(0.05 / 0.002) at 999: median the former;
  // seed 4 0 x 70, log(0.03 / 0.0019) x 20, +inf x 10 (NaN to its end): median 0; seeds 2, 3
  // (0.0021 at 999): 0. Over the group: 0, 0, 0, log 26.3, log 26.3 -> 0.
  auto tail_of = [&](const std::string& run) {
    for (const TrajectoryOutcome& o : ta5.members)
      if (o.run_id == run) return o.tail_log_ratio;
    return -1.0;
  };
  EXPECT_EQ(tail_of("a50"), std::log(static_cast<double>(0.05f) / static_cast<double>(0.0019f)));
  EXPECT_EQ(tail_of("a54"), 0.0);
  EXPECT_EQ(tail_of("a52"), 0.0);
  EXPECT_EQ(ta5.median_tail_log_ratio, 0.0);
  const KaplanMeier ref = kaplan_meier({{480, true}, {870, true}, {970, true}, {980, false}, {980, false}});
  EXPECT_EQ(ta5.km.survival_end_ci.lo, ref.survival_end_ci.lo);
  EXPECT_EQ(ta5.km.survival_end_ci.hi, ref.survival_end_ci.hi);

  // ne at 5e-4: 0/5 excursions (Wilson [0, 0.4345]), degraded 1/5 (seed 2: 0.0045 > 0.0038),
  // ratios 1.05 x4 and 2.25: median 1.05; no event: S = 1, no median.
  const OutcomeGroup& ne5 = find(g, {"ne", "0.0005"});
  EXPECT_EQ(ne5.excursions, 0);
  EXPECT_NEAR(ne5.excursions_ci.hi, 0.4344824648, 1e-10);
  EXPECT_EQ(ne5.degraded, 1);
  EXPECT_NEAR(ne5.median_loss_ratio, 1.05, 1e-12);
  EXPECT_TRUE(std::isnan(ne5.median_excursion_step));
  EXPECT_EQ(ne5.km.survival_end, 1.0);
  EXPECT_EQ(ne5.km.median_time, -1);

  // ta at 3e-4: seed 3 non-finite at 500 (its last loss: it stopped after 501 steps, and counts
  // as non-finite from then on) has its excursion at step 500 and is diverged to the end without a
  // divergence_step; degraded (non-finite).
  const OutcomeGroup& ta3 = find(g, {"ta", "0.0003"});
  EXPECT_EQ(ta3.excursions, 1);
  EXPECT_EQ(ta3.diverged_to_end, 1);
  EXPECT_EQ(ta3.median_excursion_step, 500);
  EXPECT_EQ(ta3.degraded, 1);
  EXPECT_NEAR(ta3.km.survival_end, 0.8, 1e-15);

  // FP32: ratio 1 to itself, nothing degraded, no tail log-ratio (it is the reference).
  const OutcomeGroup& f5 = find(g, {"fp32", "0.0005"});
  EXPECT_EQ(f5.median_loss_ratio, 1.0);
  EXPECT_EQ(f5.degraded, 0);
  EXPECT_TRUE(std::isnan(f5.median_tail_log_ratio));

  // Pairs: all 15; ne vs ta at 5e-4: Fisher 0/5 vs 3/5 = 1/6. Log-rank (a = ne, all censored
  // at 980; b = ta): t=480: n 5+5, E_a = 1/2, V = 1/4; t=870: 5+4, E_a = 5/9, V = 20/81;
  // t=970: 5+3, E_a = 5/8, V = 15/64; O_a = 0: chi2 = E_a^2 / V.
  ASSERT_EQ(g.pairs.size(), 15u);
  bool seen = false;
  for (const OutcomePair& p : g.pairs) {
    if (g.groups[p.a].values != std::vector<std::string>{"ne", "0.0005"} ||
        g.groups[p.b].values != std::vector<std::string>{"ta", "0.0005"})
      continue;
    seen = true;
    EXPECT_NEAR(p.fisher_p, 1.0 / 6, 1e-12);
    const double e = 0.5 + 5.0 / 9 + 5.0 / 8, v = 0.25 + 20.0 / 81 + 15.0 / 64;
    EXPECT_EQ(p.log_rank.observed_a, 0);
    EXPECT_NEAR(p.log_rank.expected_a, e, 1e-12);
    EXPECT_NEAR(p.log_rank.chi2, e * e / v, 1e-12);
    EXPECT_NEAR(p.log_rank.p, chi2_1df_sf(e * e / v), 1e-15);
    // Paired by seed: the five 5e-4 runs each have one ne and one ta; ta alone had an excursion
    // in seeds 0, 1, 4, ne alone in none: McNemar 0 / 3 = 2 * (1/2)^3.
    EXPECT_EQ(p.paired_n, 5);
    EXPECT_EQ(p.only_a, 0);
    EXPECT_EQ(p.only_b, 3);
    EXPECT_NEAR(p.mcnemar_p, 0.25, 1e-15);
    // Stratified log-rank: seeds 2, 3 (both censored) carry nothing; in seeds 0, 1, 4 ta's event
    // comes first with both at risk: u = 0 - 1/2, v = 1/4 each. U = -3/2, V = 3/4, chi2 = 3.
    // Permuting the labels within the three seeds: U in {+-3/2 (2 of 8), +-1/2}: p = 2/8.
    EXPECT_EQ(p.permutation.strata, 3);
    EXPECT_DOUBLE_EQ(p.permutation.u, -1.5);
    EXPECT_DOUBLE_EQ(p.permutation.chi2, 3.0);
    EXPECT_TRUE(p.permutation.exact);
    EXPECT_EQ(p.permutation.labelings, 8);
    EXPECT_DOUBLE_EQ(p.permutation.p, 0.25);
  }
  EXPECT_TRUE(seen);
  // Groups of different learning rates pair by seed too: their runs differ only in the --by keys
  // (same seed, initial weights and batches). Every group has one trajectory per seed.
  for (const OutcomePair& p : g.pairs) EXPECT_EQ(p.paired_n, 5);

  // One key: the seeds' trajectories of both learning rates together.
  const GroupedOutcomes by_arm = group_outcomes(runs, {{"arm"}});
  ASSERT_EQ(by_arm.groups.size(), 3u);
  EXPECT_EQ(by_arm.groups[2].values, std::vector<std::string>{"ta"});
  EXPECT_EQ(by_arm.groups[2].n, 10);
  EXPECT_EQ(by_arm.groups[2].excursions, 4);
  // ne vs ta over both learning rates: 10 runs paired (the learning rate is not a --by key: it
  // is part of the stratum), ta alone had an excursion in 4: 2 * (1/2)^4.
  const OutcomePair& ne_ta = by_arm.pairs.back();
  EXPECT_EQ(by_arm.groups[ne_ta.a].values[0] + by_arm.groups[ne_ta.b].values[0], "neta");
  EXPECT_EQ(ne_ta.paired_n, 10);
  EXPECT_EQ(ne_ta.only_b, 4);
  EXPECT_NEAR(ne_ta.mcnemar_p, 0.125, 1e-15);
  // By learning rate alone, a run puts three trajectories into one group; each pairs with the
  // same trajectory of the same seed at the other learning rate: 5 seeds x 3 trajectories.
  const GroupedOutcomes by_lr = group_outcomes(runs, {{"optimizer.lr"}});
  ASSERT_EQ(by_lr.pairs.size(), 1u);
  EXPECT_EQ(by_lr.pairs[0].paired_n, 15);
  // A group member without per-step losses has no excursion: left out, with a note.
  std::vector<RunRecord> no_losses = runs;
  no_losses[0].groups[1].has_events = false;
  const GroupedOutcomes left = group_outcomes(no_losses, {{"arm"}});
  EXPECT_EQ(left.groups[1].n, 9);
  ASSERT_EQ(left.left_out.size(), 2u);
  EXPECT_NE(left.left_out[1].find("trajectories/ne has no per-step losses"), std::string::npos) << left.left_out[1];
  // --degraded-factor 30 (degraded above 0.057): of ta at 5e-4 only seed 4 (non-finite).
  GroupingOptions o{{"arm", "optimizer.lr"}};
  o.degraded_factor = 30;
  EXPECT_EQ(find(group_outcomes(runs, o), {"ta", "0.0005"}).degraded, 1);
}

TEST(SummarizeBy, NoFp32TrajectoryGivesUnknownRatioNotAnError) {
  TempDir dir;
  write_run(dir.str(), "b0", "complete", 0, 5e-4f, {healthy("mx")});
  write_run(dir.str(), "b1", "diverged", 1, 5e-4f, {diverged("mx", 300)});
  write_run(dir.str(), "b2", "complete", 2, 5e-4f, {{"fp32", -1, -1, 0.002, 0.0019, 0}, healthy("mx")});  // ran no step
  const GroupedOutcomes g = group_outcomes(scan(dir.str()), {{"arm"}});
  ASSERT_EQ(g.groups.size(), 1u);  // fp32 of b2 ran no step: left out
  const OutcomeGroup& mx = g.groups[0];
  EXPECT_EQ(mx.n, 3);
  EXPECT_EQ(mx.excursions, 1);
  EXPECT_EQ(mx.degraded_n, 0);
  EXPECT_TRUE(std::isnan(mx.median_loss_ratio));
  ASSERT_EQ(g.left_out.size(), 1u);
  EXPECT_NE(g.left_out[0].find("trajectories/fp32 ran no step"), std::string::npos) << g.left_out[0];
  // The CSV row: unknown degraded ratio and tail log-ratio empty; Wilson(1, 3) and KM
  // S(980) = 2/3 with its interval as scipy gives them (binomtest(1, 3).proportion_ci(
  // method='wilson'): 0.06149194472039626, 0.7923403991979523; ecdf log-log: 0.05407343,
  // 0.94520639).
  const std::vector<std::string> row = split_csv(lines_of(grouped_tables(g, false, true))[1]);
  ASSERT_EQ(row.size(), 16u);
  EXPECT_EQ(std::vector<std::string>(row.begin(), row.begin() + 3), (std::vector<std::string>{"mx", "3", "1"}));
  EXPECT_NEAR(std::stod(row[3]), 0.06149194472039626, 1e-15);
  EXPECT_NEAR(std::stod(row[4]), 0.7923403991979523, 1e-15);
  EXPECT_EQ(std::vector<std::string>(row.begin() + 5, row.begin() + 8), (std::vector<std::string>{"300.0", "-1", "980"}));
  EXPECT_NEAR(std::stod(row[8]), 2.0 / 3, 1e-15);
  EXPECT_NEAR(std::stod(row[9]), 0.05407343, 1e-8);
  EXPECT_NEAR(std::stod(row[10]), 0.94520639, 1e-8);
  EXPECT_EQ(std::vector<std::string>(row.begin() + 11, row.end()), (std::vector<std::string>{"1", "0", "0", "", ""}));
}

// Runs of one seed that differ only in their arm (one arm each) and in what does not change the
// training (name, log.*) pair up by seed; the FP32 trajectories of two runs of a seed make a
// stratum of three with one arm: no McNemar pair, but a stratum of the permutation log-rank.
TEST(SummarizeBy, SeedStrataPairRunsThatDifferOnlyInTheArm) {
  TempDir dir;
  for (uint64_t s = 0; s < 3; ++s) {
    Traj ta = healthy("ta");
    if (s == 0) ta = diverged("ta", 480);
    if (s == 1) ta = diverged("ta", 870);
    write_run(dir.str(), "x" + std::to_string(s), "diverged", s, 5e-4f, {fp32(), ta},
              [](RunConfig& c) { c.arms = {ArmConfig{"ta", {}, {}}}; });
    write_run(dir.str(), "y" + std::to_string(s), "complete", s, 5e-4f, {fp32(), healthy("ne")}, [](RunConfig& c) {
      c.arms = {ArmConfig{"ne", {}, {}}};
      c.name = "other";
      c.log.flush_every = 7;
    });
  }
  // Another seed's run does not pair, nor does a run with another learning rate.
  write_run(dir.str(), "z", "complete", 9, 5e-4f, {fp32(), healthy("ne")},
            [](RunConfig& c) { c.arms = {ArmConfig{"ne", {}, {}}}; });
  write_run(dir.str(), "w", "complete", 0, 3e-4f, {fp32(), healthy("ne")},
            [](RunConfig& c) { c.arms = {ArmConfig{"ne", {}, {}}}; });
  const GroupedOutcomes g = group_outcomes(scan(dir.str()), {{"arm"}});
  ASSERT_EQ(g.groups.size(), 3u);  // fp32, ne, ta
  const OutcomePair& ne_ta = g.pairs[2];
  ASSERT_EQ(g.groups[ne_ta.a].values[0] + g.groups[ne_ta.b].values[0], "neta");
  EXPECT_EQ(ne_ta.paired_n, 3);
  EXPECT_EQ(ne_ta.only_b, 2);
  // Seeds 0, 1: ta's excursion first, u = -1/2 each; seed 2 carries nothing. U = -1; of the 4
  // labelings 2 are as extreme.
  EXPECT_EQ(ne_ta.permutation.strata, 2);
  EXPECT_DOUBLE_EQ(ne_ta.permutation.u, -1.0);
  EXPECT_DOUBLE_EQ(ne_ta.permutation.p, 0.5);
  const OutcomePair& fp32_ta = g.pairs[1];
  ASSERT_EQ(g.groups[fp32_ta.b].values[0], "ta");
  EXPECT_EQ(fp32_ta.paired_n, 0);  // two FP32 trajectories per seed
  // Seeds 0, 1: ta's excursion comes first among three at risk, the two FP32 (label a) at risk
  // with it: u = 0 - 2/3 each, U = -4/3. A stratum's 3 labelings give u = -2/3 once, +1/3 twice
  // (ta labelled a): of the 9, only (-2/3, -2/3) is as extreme.
  EXPECT_EQ(fp32_ta.permutation.strata, 2);
  EXPECT_NEAR(fp32_ta.permutation.u, -4.0 / 3.0, 1e-15);
  EXPECT_EQ(fp32_ta.permutation.labelings, 9);
  EXPECT_NEAR(fp32_ta.permutation.p, 1.0 / 9.0, 1e-15);
}

TEST(SummarizeBy, BranchesWithTheFlagOnly) {
  TempDir dir;
  for (uint64_t s = 0; s < 2; ++s)
    write_run(dir.str(), "c" + std::to_string(s), "complete", s, 5e-4f,
              {fp32(), healthy("mx"), {"to32", s == 0 ? 900 : -1, -1, s == 0 ? 0.05 : 0.0021, 0.0019, 600, 400}});
  const std::vector<RunRecord> runs = scan(dir.str());
  EXPECT_EQ(group_outcomes(runs, {{"arm"}}).groups.size(), 2u);
  GroupingOptions o{{"arm"}};
  o.branches = true;
  const GroupedOutcomes g = group_outcomes(runs, o);
  ASSERT_EQ(g.groups.size(), 3u);
  const OutcomeGroup& b = find(g, {"to32"});
  EXPECT_EQ(b.n, 2);
  EXPECT_EQ(b.excursions, 1);
  EXPECT_EQ(b.degraded, 1);
  // Censored at at + steps_run - 20 = 980; the event at its absolute step.
  EXPECT_EQ(b.km.end_time, 980);
  ASSERT_EQ(b.km.steps.size(), 1u);
  EXPECT_EQ(b.km.steps[0].time, 900);
}

TEST(SummarizeBy, KeyErrors) {
  TempDir dir;
  write_study(dir.str());
  const std::vector<RunRecord> runs = scan(dir.str());
  try {
    group_outcomes(runs, {{"optimizer.lrr"}});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'optimizer.lrr' is not a configuration key"), std::string::npos) << m;
    EXPECT_NE(m.find("seed, optimizer.lr"), std::string::npos) << m;  // the keys that differ
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_THROW(group_outcomes(runs, {{"arm", "arm"}}), Error);
  EXPECT_THROW(group_outcomes(runs, {{}}), Error);
  // A key that every run has but that does not vary makes one group.
  EXPECT_EQ(group_outcomes(runs, {{"model.width"}}).groups.size(), 1u);
}

TEST(SummarizeBy, BinaryTablesAndColumns) {
  TempDir dir;
  write_study(dir.str());
  const std::string bin = MXLAB_BINARY, d = dir.str();
  const std::string rule = " --excursion-window 20 --excursion-block 10 --excursion-factor 10";
  auto [rc, out] =
      run_command("(" + bin + " summarize --by arm,optimizer.lr --compare --csv --no-index " + d + rule + " 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  const std::vector<std::string> lines = lines_of(out);
  ASSERT_EQ(lines.size(), 1 + 6 + 1 + 1 + 15u) << out;
  EXPECT_EQ(lines[0],
            "arm,optimizer.lr,n,excursions,excursions_lo,excursions_hi,median_excursion_step,km_median_step,"
            "km_end_step,km_survival_end,km_survival_lo,km_survival_hi,diverged_to_end,degraded,degraded_n,"
            "median_loss_ratio,median_tail_log_ratio");
  EXPECT_EQ(lines[6].substr(0, 26), "ta,0.0005,5,3,0.2307242812") << lines[6];
  EXPECT_EQ(lines[7], "");
  EXPECT_EQ(lines[8],
            "a_arm,a_optimizer.lr,b_arm,b_optimizer.lr,a_n,a_excursions,b_n,b_excursions,fisher_p,logrank_observed_a,"
            "logrank_expected_a,logrank_chi2,logrank_p,paired_n,paired_only_a,paired_only_b,mcnemar_p,strata,"
            "stratified_u,stratified_chi2,stratified_p,permutation_p,permutation_exact,permutation_labelings");
  // ne vs ta at 5e-4 (the last pair of ne at 5e-4): the permutation p of the test above, exact.
  const std::string ne_ta = "ne,0.0005,ta,0.0005,5,0,5,3,";
  const auto row = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(ne_ta, 0) == 0; });
  ASSERT_NE(row, lines.end()) << out;
  const std::vector<std::string> cells = split_csv(*row);
  EXPECT_EQ(std::vector<std::string>(cells.end() - 7, cells.end()),
            (std::vector<std::string>{"3", "-1.5", "3.0", cells[cells.size() - 4], "0.25", "1", "8"}));
  // The default rule (5 blocks of 100): seed 0's loss is above from 480, so from block 500 on
  // (event at 500); seed 1 (870) has too few steps left (censored at 500); seed 4, non-finite
  // from 990 to its end, counts as above from there: block 900 holds finite losses, the event is
  // at block 1000, its first step after the run (the non-finite losses are taken to continue).
  std::tie(rc, out) = run_command("(" + bin + " summarize --by arm,optimizer.lr --csv --no-index " + d + " 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(lines_of(out)[6].substr(0, 14), "ta,0.0005,5,2,") << out;
  EXPECT_NE(lines_of(out)[6].find(",750.0,"), std::string::npos) << out;  // median of 500, 1000
  // A window that is not a multiple of the block is refused, in one line naming the options.
  std::tie(rc, out) = run_command(bin + " summarize --excursion-window 450 --no-index " + d + " 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("--excursion-window"), std::string::npos) << out;
  EXPECT_NE(out.find("multiple of the block 100 (e.g. 500)"), std::string::npos) << out;
  // The left-out run is named on stderr, one line.
  std::tie(rc, out) = run_command("(" + bin + " summarize --by arm --no-index " + d + " >/dev/null)");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, "mxlab: note: left out a55.h5: status running (abandoned (no live process holds its lock): "
                 "mxlab run resumes it)\n");
  // Text: a title line over the table.
  std::tie(rc, out) = run_command("(" + bin + " summarize " + d + " --no-index --by arm 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("by arm: 3 groups, 30 trajectories of 10 runs;", 0), 0u) << out;
  EXPECT_EQ(lines_of(out).size(), 5u) << out;
  // Without --by, summarize lists every trajectory of every run as before, arms included.
  std::tie(rc, out) = run_command(bin + " summarize --csv --no-index " + d);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(lines_of(out).size(), 1 + 3 * 11u) << out;
  // The grouping options need --by; an unknown key is one line and a non-zero exit.
  std::tie(rc, out) = run_command(bin + " summarize --compare --no-index " + d);
  EXPECT_NE(rc, 0);
  std::tie(rc, out) = run_command(bin + " summarize --by nosuch --no-index " + d);
  EXPECT_NE(rc, 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  std::tie(rc, out) = run_command(bin + " summarize --by arm --degraded-factor 0 --no-index " + d);
  EXPECT_NE(rc, 0);
}

// --where: the Python side's semantics (analysis/mxlab/sweep.py matches): numbers as
// numbers to a relative 1e-6, booleans in any case, anything else as text.
TEST(SummarizeWhere, ValuesMatchLikeThePythonSide) {
  EXPECT_TRUE(config_value_matches("0.0006", "6e-4"));
  EXPECT_TRUE(config_value_matches("0.0006", "6.0000001e-4"));
  EXPECT_FALSE(config_value_matches("0.0006", "6.1e-4"));
  EXPECT_TRUE(config_value_matches("10", "10.0"));
  EXPECT_FALSE(config_value_matches("10", "1"));
  EXPECT_TRUE(config_value_matches("true", "True"));
  EXPECT_FALSE(config_value_matches("true", "false"));
  EXPECT_FALSE(config_value_matches("1", "true"));
  EXPECT_TRUE(config_value_matches("mxfp8_e4m3", "mxfp8_e4m3"));
  EXPECT_TRUE(config_value_matches("mxfp8_e4m3", "'mxfp8_e4m3'"));
  EXPECT_FALSE(config_value_matches("mxfp8_e4m3", "mxfp8"));
  EXPECT_FALSE(config_value_matches("nan", "nan"));  // as math.isclose
  const WhereClause w = parse_where(" optimizer.lr = 6e-4 ");
  EXPECT_EQ(w.key, "optimizer.lr");
  EXPECT_EQ(w.value, "6e-4");
  EXPECT_THROW(parse_where("optimizer.lr"), Error);
  EXPECT_THROW(parse_where("=1"), Error);
}

TEST(SummarizeWhere, BinaryFiltersRunsAndRefusesBadClauses) {
  TempDir dir;
  write_study(dir.str());
  const std::string bin = MXLAB_BINARY, d = dir.str();
  // lr 5e-4 is printed 0.0005 in the files: matched as a number. Five runs, three groups of 5.
  auto [rc, out] = run_command("(" + bin + " summarize --by arm --csv --no-index " + d +
                               " --where optimizer.lr=5e-4 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  std::vector<std::string> lines = lines_of(out);
  ASSERT_EQ(lines.size(), 4u) << out;
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(split_csv(lines[i])[1], "5") << lines[i];
  // Repeated clauses all hold: one seed at one lr.
  std::tie(rc, out) = run_command("(" + bin + " summarize --by arm --csv --no-index " + d +
                                  " --where optimizer.lr=0.0005 --where seed=2 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  lines = lines_of(out);
  ASSERT_EQ(lines.size(), 4u) << out;
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(split_csv(lines[i])[1], "1") << lines[i];
  // Without --by: the summary table of the matching runs only (the running one is 5e-4 too).
  std::tie(rc, out) = run_command(bin + " summarize --csv --no-index " + d + " --where optimizer.lr=3e-4");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(lines_of(out).size(), 1 + 5 * 3u) << out;
  EXPECT_EQ(out.find("a5"), std::string::npos) << out;
  // Bad clauses: exit 2, one line naming the problem.
  for (const auto& [clause, says] : std::vector<std::pair<std::string, std::string>>{
           {"optimizer.lrr=1", "--where optimizer.lrr: no such key in the configuration of"},
           {"optimizer.lr", "expected KEY=VALUE"},
           {"optimizer.lr=1e-3", "no run matches every clause (optimizer.lr here: 0.0003, 0.0005)"}}) {
    std::tie(rc, out) = run_command(bin + " summarize --no-index " + d + " --where " + clause + " 2>&1");
    EXPECT_EQ(rc, 2) << clause << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_NE(out.find(says), std::string::npos) << out;
  }
}

// --within: only pairs of groups with the same values of those --by keys, each pair's numbers
// those of the unrestricted table.
TEST(SummarizeWithin, PairsOnlyWithinTheKeys) {
  TempDir dir;
  write_study(dir.str());
  const std::vector<RunRecord> runs = scan(dir.str());
  GroupingOptions all{{"arm", "optimizer.lr"}};
  GroupingOptions within = all;
  within.within = {"optimizer.lr"};
  const GroupedOutcomes ga = group_outcomes(runs, all), gw = group_outcomes(runs, within);
  ASSERT_EQ(ga.pairs.size(), 15u);
  ASSERT_EQ(gw.pairs.size(), 6u);  // 3 arms at each of 2 learning rates: 3 + 3 pairs
  for (const OutcomePair& p : gw.pairs) {
    EXPECT_EQ(gw.groups[p.a].values[1], gw.groups[p.b].values[1]);
    const auto same = std::find_if(ga.pairs.begin(), ga.pairs.end(),
                                   [&](const OutcomePair& q) { return q.a == p.a && q.b == p.b; });
    ASSERT_NE(same, ga.pairs.end());
    auto same_p = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
    EXPECT_TRUE(same_p(same->fisher_p, p.fisher_p));
    EXPECT_TRUE(same_p(same->log_rank.p, p.log_rank.p));
    EXPECT_TRUE(same_p(same->mcnemar_p, p.mcnemar_p));
    EXPECT_TRUE(same_p(same->permutation.p, p.permutation.p));
    EXPECT_EQ(same->paired_n, p.paired_n);
  }
  within.within = {"seed"};
  EXPECT_THROW(group_outcomes(runs, within), Error);
  within.within = {"arm", "optimizer.lr"};
  EXPECT_THROW(group_outcomes(runs, within), Error);
  within.within = {"arm", "arm"};
  EXPECT_THROW(group_outcomes(runs, within), Error);
}

// --compare-csv FILE: the pairs table of --compare --csv, alone in a file (stdout as without it);
// --within in the binary; the errors of both options.
TEST(SummarizeWithin, CompareCsvFileAndErrors) {
  TempDir dir;
  write_study(dir.str());
  const std::string bin = MXLAB_BINARY, d = dir.str(), file = d + "/pairs.csv";
  const std::string rule = " --excursion-window 20 --excursion-block 10 --excursion-factor 10 2>/dev/null)";
  auto [rc, both] = run_command("(" + bin + " summarize --by arm,optimizer.lr --compare --csv --no-index " + d + rule);
  ASSERT_EQ(rc, 0) << both;
  auto [rc2, groups] = run_command("(" + bin + " summarize --by arm,optimizer.lr --csv --no-index " + d +
                                   " --compare-csv " + file + rule);
  ASSERT_EQ(rc2, 0) << groups;
  const size_t blank = both.find("\n\n");
  ASSERT_NE(blank, std::string::npos) << both;
  EXPECT_EQ(groups, both.substr(0, blank + 1));               // stdout: the groups table as before
  EXPECT_EQ(read_file(file), both.substr(blank + 2));         // the file: the pairs table
  EXPECT_EQ(lines_of(read_file(file)).size(), 1 + 15u);
  // --within in the binary: 6 pairs, each at one learning rate; the text title says so.
  std::tie(rc, groups) = run_command("(" + bin + " summarize --by arm,optimizer.lr --compare --csv --no-index " + d +
                                     " --within optimizer.lr" + rule);
  ASSERT_EQ(rc, 0) << groups;
  const std::vector<std::string> lines = lines_of(groups);
  ASSERT_EQ(lines.size(), 1 + 6 + 1 + 1 + 6u) << groups;
  for (size_t i = 9; i < lines.size(); ++i) {
    const std::vector<std::string> c = split_csv(lines[i]);
    EXPECT_EQ(c[1], c[3]) << lines[i];
  }
  std::tie(rc, groups) = run_command("(" + bin + " summarize --by arm,optimizer.lr --compare --no-index " + d +
                                     " --within optimizer.lr" + rule);
  EXPECT_NE(groups.find("; only pairs of groups with the same optimizer.lr\n"), std::string::npos) << groups;
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--by arm,optimizer.lr --compare --within seed", "'seed' is not one of the --by keys"},
           {"--by arm,optimizer.lr --compare --within arm,optimizer.lr", "--within names every --by key"},
           {"--by arm,optimizer.lr --within optimizer.lr", "--within restricts the pairs of --compare"},
           {"--within arm", "--within requires --by"},
           {"--compare-csv " + file, "--compare-csv requires --by"}}) {
    std::tie(rc, groups) = run_command(bin + " summarize --no-index " + d + " " + args + " 2>&1");
    EXPECT_EQ(rc, 2) << args << ": " << groups;
    EXPECT_EQ(std::count(groups.begin(), groups.end(), '\n'), 1) << groups;
    EXPECT_NE(groups.find(says), std::string::npos) << groups;
  }
}

// A sweep of an MX recipe key (precision.weight) over three seeds: each run trains the same FP32
// trajectory. Under the precision key the FP32 trajectory reads "(fp32)", never the run's
// recipe; it is counted once per seed (the other runs' copies are listed as left out); and the
// recipes and FP32 pair by seed.
TEST(SummarizeBy, PrecisionSweepNeverLabelsTheFp32TrajectoryWithARecipe) {
  TempDir dir;
  for (uint64_t s = 0; s < 3; ++s) {
    write_run(dir.str(), "e4" + std::to_string(s), s == 0 ? "diverged" : "complete", s, 5e-4f,
              {fp32(), s == 0 ? diverged("mx", 480) : healthy("mx")},
              [](RunConfig& c) { c.precision.weight = NumFmt::mxfp8_e4m3; });
    write_run(dir.str(), "e5" + std::to_string(s), "complete", s, 5e-4f, {fp32(), healthy("mx")},
              [](RunConfig& c) { c.precision.weight = NumFmt::mxfp8_e5m2; });
  }
  for (const std::vector<std::string>& keys :
       {std::vector<std::string>{"precision.weight"}, std::vector<std::string>{"arm", "precision.weight"}}) {
    SCOPED_TRACE(keys.size());
    const GroupedOutcomes g = group_outcomes(scan(dir.str()), {keys});
    ASSERT_EQ(g.groups.size(), 3u);
    const size_t k = keys.size() - 1;  // the precision key's column
    EXPECT_EQ(g.groups[0].values[k], "(fp32)");
    EXPECT_EQ(g.groups[1].values[k], "mxfp8_e4m3");
    EXPECT_EQ(g.groups[2].values[k], "mxfp8_e5m2");
    for (const TrajectoryOutcome& o : g.groups[0].members) EXPECT_EQ(o.name, "fp32");
    for (size_t i : {1, 2})
      for (const TrajectoryOutcome& o : g.groups[i].members) EXPECT_EQ(o.name, "mx");
    EXPECT_EQ(g.groups[0].n, 3);  // one FP32 trajectory per seed, not two
    EXPECT_EQ(g.groups[1].excursions, 1);
    size_t once = 0;
    for (const std::string& l : g.left_out) once += l.find("counted once") != std::string::npos;
    EXPECT_EQ(once, 3u);
    const OutcomePair& e4_e5 = g.pairs[2];
    ASSERT_EQ(e4_e5.a, 1u);
    EXPECT_EQ(e4_e5.paired_n, 3);
    EXPECT_EQ(e4_e5.only_a, 1);
    if (keys.size() == 2) {  // by arm: the strata hold FP32 and both recipes of a seed
      EXPECT_EQ(g.pairs[0].paired_n, 3);
      EXPECT_EQ(g.pairs[1].paired_n, 3);
    }
  }
  // A recipe value that is itself "fp32" stays apart from the FP32 trajectory.
  TempDir dir2;
  write_run(dir2.str(), "g", "complete", 0, 5e-4f, {fp32(), healthy("mx")},
            [](RunConfig& c) { c.precision.grad = NumFmt::fp32; });
  const GroupedOutcomes g2 = group_outcomes(scan(dir2.str()), {{"precision.grad"}});
  ASSERT_EQ(g2.groups.size(), 2u);
  EXPECT_EQ(g2.groups[0].values[0], "(fp32)");
  EXPECT_EQ(g2.groups[1].values[0], "fp32");
  EXPECT_EQ(g2.groups[1].members.at(0).name, "mx");
}
