// `mxlab summarize DIR --by`: trajectories grouped by configuration keys, with the statistics
// of lab/stats/stats.h per group and per pair of groups.
#include "lab/report/group_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "lab/core/error.h"
#include "lab/runs/run_status.h"
#include "lab/core/text_table.h"
#include "lab/stats/loss_events.h"
#include "lab/io/table_text.h"

namespace mxlab {

namespace {

constexpr const char* kFp32 = "fp32";
constexpr const char* kAbsent = "-";  // the value of a key a run's configuration does not have
// The FP32 trajectory's value of a precision key: no MX recipe applies to it. Not a value any
// precision key takes (`fp32` is one: precision.grad: fp32), so it never joins an MX group.
constexpr const char* kFp32Recipe = "(fp32)";
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

bool finished(const RunRecord& r) { return r.readable && is_finished(r.status); }

std::string file_name(const RunRecord& r) { return std::filesystem::path(r.path).filename().string(); }

// The run's FP32 trajectory when it ran and has a finite loss (the reference of degraded and of
// the loss ratio), else null.
const GroupRecord* fp32_reference(const RunRecord& r) {
  for (const GroupRecord& g : r.groups)
    if (!g.branch && g.name == kFp32)
      return g.steps_run > 0 && std::isfinite(g.min_loss) && std::isfinite(g.final_loss) ? &g : nullptr;
  return nullptr;
}

bool is_precision_key(const std::string& k) { return k == "precision" || k.rfind("precision.", 0) == 0; }

// The run's FP32 trajectory (not a branch, whatever its recipe): precision keys do not apply to it.
bool is_fp32_trajectory(const GroupRecord& g) { return !g.branch && g.name == kFp32; }

// Whether runs `a` and `b` differ, and only in precision keys (apart from the keys that change
// nothing trained: name, device, log.*, checkpoint_every): their FP32 trajectories are then one
// trajectory trained twice.
bool differ_only_in_precision(const RunRecord& a, const RunRecord& b) {
  if (a.config.empty() || b.config.empty()) return false;
  const std::map<std::string, std::string> ma(a.config.begin(), a.config.end()), mb(b.config.begin(), b.config.end());
  auto ignored = [](const std::string& k) {
    return k == "name" || k == "device" || k == "checkpoint_every" || k.rfind("log.", 0) == 0;
  };
  bool any = false;
  for (const auto* m : {&ma, &mb})
    for (const auto& [k, v] : *m) {
      if (ignored(k)) continue;
      const auto& other = m == &ma ? mb : ma;
      const auto it = other.find(k);
      if (it != other.end() && it->second == v) continue;
      if (!is_precision_key(k)) return false;
      any = true;
    }
  return any;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The seed stratum of a trajectory: its run's configuration without the --by keys and the keys
// that do not change what is trained (`name`, `device`, `log.*`, `checkpoint_every`), and
// without `arms` when the arm is a key (runs that differ only in the arm pair up); plus the
// trajectory's name when the arm is not a key. One run's arms share it, and so do the runs of
// one seed that differ only in the --by keys. A run whose configuration could not be read is a
// stratum of its own.
std::string stratum_of(const RunRecord& r, const GroupRecord& g, const std::vector<std::string>& keys) {
  if (r.config.empty()) return "run " + r.run_id + "\n" + g.h5_path;
  const bool by_arm = contains(keys, kArmKey);
  std::string s;
  for (const auto& [k, v] : r.config) {
    if (k == "name" || k == "device" || k == "checkpoint_every" || k.rfind("log.", 0) == 0 || contains(keys, k))
      continue;
    if (by_arm && (k == "arms" || k.rfind("arms.", 0) == 0)) continue;
    s += k + "=" + v + "\n";
  }
  if (!by_arm) s += "trajectory=" + g.h5_path + "\n";
  return s;
}

TrajectoryOutcome outcome(const RunRecord& r, const GroupRecord& g, const std::vector<std::string>& keys,
                          double degraded_factor) {
  TrajectoryOutcome o;
  o.run_id = r.run_id;
  o.name = g.name;
  o.branch = g.branch;
  for (const std::string& k : keys) {
    bool found = true;
    // The FP32 trajectory has no MX recipe: under a precision key it is `(fp32)`, never the value
    // the run's MX arms were trained with.
    if (k != kArmKey && is_precision_key(k) && is_fp32_trajectory(g)) {
      o.values.push_back(kFp32Recipe);
      continue;
    }
    const std::string v = k == kArmKey ? g.name : config_value(r, k, &found);
    o.values.push_back(found ? format_config_value(v) : kAbsent);
  }
  o.stratum = stratum_of(r, g, keys);
  o.excursion = g.excursion;
  o.excursion_step = g.excursion_step;
  o.tail_log_ratio = g.tail_log_ratio;
  // Diverged to the end as the run's status has it (trainer.cpp): stayed above the divergence
  // factor up to the last step, or became non-finite.
  o.diverged_to_end_step = diverged_at(g.divergence_step, g.first_nonfinite_step);
  o.diverged_to_end = o.diverged_to_end_step >= 0;
  o.end_step = (g.branch && g.at > 0 ? g.at : 0) + g.steps_run;
  // final_loss is the last *finite* loss: a trajectory that became non-finite ends worse than
  // any finite loss.
  const bool nonfinite_end = g.first_nonfinite_step >= 0 || !std::isfinite(g.final_loss);
  const GroupRecord* ref = fp32_reference(r);
  if (ref) {
    o.degraded = nonfinite_end || g.final_loss > degraded_factor * ref->min_loss ? 1 : 0;
    o.loss_ratio = nonfinite_end ? kInf : g.final_loss / ref->final_loss;
  } else {
    o.degraded = -1;
    o.loss_ratio = kNaN;
  }
  return o;
}

bool is_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return *end == '\0';
}

// Group order, key by key: absent values last; the arm fp32 first, and the FP32 trajectory's
// `(fp32)` first under a precision key, then by name; numbers as
// numbers (1e-4 before 5e-4 before 0.001); other text by text.
bool value_less(const std::string& key, const std::string& x, const std::string& y) {
  if (x == y) return false;
  if ((x == kAbsent) != (y == kAbsent)) return y == kAbsent;
  if (key == kArmKey && (x == kFp32 || y == kFp32)) return x == kFp32;
  if (is_precision_key(key) && (x == kFp32Recipe || y == kFp32Recipe)) return x == kFp32Recipe;
  double a = 0, b = 0;
  if (is_number(x, &a) && is_number(y, &b) && a != b) return a < b;
  return x < y;
}

// Steps to excursion: the excursion step, or censored where the trajectory is.
SurvivalObs survival_obs(const TrajectoryOutcome& o) { return {o.excursion_step, o.excursion}; }
std::vector<SurvivalObs> survival_obs(const OutcomeGroup& g) {
  std::vector<SurvivalObs> obs;
  for (const TrajectoryOutcome& o : g.members) obs.push_back(survival_obs(o));
  return obs;
}

OutcomeGroup make_group(std::vector<std::string> values, std::vector<TrajectoryOutcome> members) {
  OutcomeGroup g;
  g.values = std::move(values);
  g.members = std::move(members);
  g.n = static_cast<int64_t>(g.members.size());
  std::vector<double> steps, ratios, tails;
  for (const TrajectoryOutcome& o : g.members) {
    if (o.excursion) {
      ++g.excursions;
      steps.push_back(static_cast<double>(o.excursion_step));
    }
    g.diverged_to_end += o.diverged_to_end ? 1 : 0;
    if (o.degraded >= 0) {
      ++g.degraded_n;
      g.degraded += o.degraded;
      ratios.push_back(o.loss_ratio);
    }
    if (!std::isnan(o.tail_log_ratio)) tails.push_back(o.tail_log_ratio);
  }
  g.excursions_ci = wilson_interval(g.excursions, g.n);
  g.median_excursion_step = median(steps);
  g.median_loss_ratio = median(ratios);
  g.median_tail_log_ratio = median(tails);
  g.km = kaplan_meier(survival_obs(g));
  return g;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string rows_text(const std::vector<std::vector<std::string>>& rows, bool csv) {
  if (!csv) return aligned_table(rows);
  std::string out;
  for (const auto& row : rows) out += csv_line(row);
  return out;
}

// A group's members by seed stratum.
using MembersByStratum = std::map<std::string, std::vector<const TrajectoryOutcome*>>;
MembersByStratum members_by_stratum(const OutcomeGroup& g) {
  MembersByStratum by;
  for (const TrajectoryOutcome& t : g.members) by[t.stratum].push_back(&t);
  return by;
}

// The paired statistics of two groups: over the strata with exactly one trajectory in each,
// the discordant excursion outcomes and McNemar's test; over every stratum with members of
// both, the stratified permutation log-rank.
void pair_by_stratum(const MembersByStratum& a, const MembersByStratum& b, OutcomePair& p) {
  std::vector<std::vector<LabelledObs>> strata;
  for (const auto& [key, ta] : a) {
    const auto it = b.find(key);
    if (it == b.end()) continue;
    const std::vector<const TrajectoryOutcome*>& tb = it->second;
    if (ta.size() == 1 && tb.size() == 1) {
      ++p.paired_n;
      p.only_a += ta[0]->excursion && !tb[0]->excursion;
      p.only_b += tb[0]->excursion && !ta[0]->excursion;
    }
    std::vector<LabelledObs> s;
    for (const TrajectoryOutcome* t : ta) s.push_back({survival_obs(*t), true});
    for (const TrajectoryOutcome* t : tb) s.push_back({survival_obs(*t), false});
    strata.push_back(std::move(s));
  }
  p.mcnemar_p = p.paired_n > 0 ? mcnemar_exact(p.only_a, p.only_b) : std::numeric_limits<double>::quiet_NaN();
  p.permutation = permutation_log_rank(strata);
}

// The pairs table: a header row, then one row per pair.
std::vector<std::vector<std::string>> pair_rows(const GroupedOutcomes& g, const TableCell& cell) {
  auto count = [](int64_t v) { return std::to_string(v); };
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header;
  for (const char* side : {"a_", "b_"})
    for (const std::string& k : g.keys) header.push_back(side + k);
  for (const char* c : {"a_n", "a_excursions", "b_n", "b_excursions", "fisher_p", "logrank_observed_a",
                        "logrank_expected_a", "logrank_chi2", "logrank_p", "paired_n", "paired_only_a",
                        "paired_only_b", "mcnemar_p", "strata", "stratified_u", "stratified_chi2",
                        "stratified_p", "permutation_p", "permutation_exact", "permutation_labelings"})
    header.push_back(c);
  rows.push_back(header);
  for (const OutcomePair& p : g.pairs) {
    const OutcomeGroup &a = g.groups[p.a], &b = g.groups[p.b];
    const PermutationLogRank& pr = p.permutation;
    std::vector<std::string> row = a.values;
    row.insert(row.end(), b.values.begin(), b.values.end());
    for (const std::string& c :
         {count(a.n), count(a.excursions), count(b.n), count(b.excursions), cell.num(p.fisher_p),
          cell.num(p.log_rank.observed_a), cell.num(p.log_rank.expected_a), cell.num(p.log_rank.chi2),
          cell.num(p.log_rank.p), count(p.paired_n), count(p.only_a), count(p.only_b), cell.num(p.mcnemar_p),
          count(pr.strata), pr.strata > 0 ? cell.num(pr.u) : cell.none(), cell.num(pr.chi2), cell.num(pr.p_asymptotic),
          cell.num(pr.p), pr.strata > 0 ? count(pr.exact ? 1 : 0) : cell.none(), count(pr.labelings)})
      row.push_back(c);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

GroupedOutcomes group_outcomes(const std::vector<RunRecord>& runs, const GroupingOptions& opt) {
  if (opt.keys.empty()) throw Error("--by needs at least one key (arm, or a configuration key such as optimizer.lr)");
  std::set<std::string> seen;
  for (const std::string& k : opt.keys) {
    if (k.empty()) throw Error("--by: empty key (write --by arm,optimizer.lr)");
    if (!seen.insert(k).second) throw Error(msg("--by: key '", k, "' given twice"));
  }
  if (!(opt.degraded_factor > 0)) throw Error(msg("--degraded-factor must be > 0, not ", opt.degraded_factor));
  std::vector<size_t> within;  // indices into the keys
  for (const std::string& k : opt.within) {
    const auto it = std::find(opt.keys.begin(), opt.keys.end(), k);
    if (k.empty()) throw Error("--within: empty key (write --within optimizer.lr)");
    if (it == opt.keys.end())
      throw Error(msg("--within: '", k, "' is not one of the --by keys (", join(opt.keys, ", "),
                      "): pairs are restricted to groups with the same value of a --by key"));
    const size_t i = static_cast<size_t>(it - opt.keys.begin());
    if (std::find(within.begin(), within.end(), i) != within.end())
      throw Error(msg("--within: key '", k, "' given twice"));
    within.push_back(i);
  }
  if (!within.empty() && within.size() == opt.keys.size())
    throw Error(msg("--within names every --by key (", join(opt.keys, ", "),
                    "): no two groups share them all; leave one out, e.g. --by arm,optimizer.lr --within optimizer.lr"));
  GroupedOutcomes out;
  out.keys = opt.keys;
  out.degraded_factor = opt.degraded_factor;
  out.events = opt.events;
  out.within = opt.within;
  std::vector<const RunRecord*> used;
  for (const RunRecord& r : runs) {
    if (finished(r)) used.push_back(&r);
    else out.left_out.push_back(msg(file_name(r), ": status ", to_string(r.status),
                                    r.error.empty() ? "" : " (" + r.error + ")"));
  }
  for (const std::string& k : opt.keys) {
    if (k == kArmKey) continue;
    bool anywhere = false;
    for (const RunRecord* r : used) {
      bool found = false;
      config_value(*r, k, &found);
      anywhere = anywhere || found;
    }
    if (!anywhere && !used.empty()) {
      const std::vector<std::string> swept = swept_keys(runs);
      throw Error(msg("--by: '", k, "' is not a configuration key of any finished run here (keys that differ between "
                      "the runs: ", swept.empty() ? "none" : join(swept, ", "), "; every key: mxlab dump-config; ",
                      "the trajectory's name: ", kArmKey, ")"));
    }
  }
  // Pooled by the keys' values and, under `arm`, by kind too: a branch never joins a
  // trajectory's group (the FP32 trajectory's, an arm's) because it has the same name.
  const bool by_arm = std::find(opt.keys.begin(), opt.keys.end(), kArmKey) != opt.keys.end();
  std::map<std::pair<bool, std::vector<std::string>>, std::vector<TrajectoryOutcome>> by_values;
  // FP32 trajectories by group and stratum, to count once the one FP32 trajectory that runs
  // differing only in precision keys each trained again.
  std::map<std::pair<std::vector<std::string>, std::string>, std::vector<const RunRecord*>> fp32_seen;
  for (const RunRecord* r : used) {
    bool any = false;
    for (const GroupRecord& g : r->groups) {
      if (g.branch && !opt.branches) continue;
      if (g.steps_run <= 0) {
        out.left_out.push_back(msg(file_name(*r), ": ", g.h5_path, " ran no step"));
        continue;
      }
      if (!g.has_events) {
        out.left_out.push_back(msg(file_name(*r), ": ", g.h5_path, " has no per-step losses (loss_all): no excursion"));
        continue;
      }
      TrajectoryOutcome o = outcome(*r, g, opt.keys, opt.degraded_factor);
      if (is_fp32_trajectory(g)) {
        std::vector<const RunRecord*>& same = fp32_seen[{o.values, o.stratum}];
        const auto twin = std::find_if(same.begin(), same.end(),
                                       [&](const RunRecord* x) { return differ_only_in_precision(*x, *r); });
        if (twin != same.end()) {
          out.left_out.push_back(msg(file_name(*r), ": ", g.h5_path, " counted once, with ", file_name(**twin),
                                     "'s: the runs differ only in precision keys, so it is the same FP32 trajectory "
                                     "trained again (compare recipes with arms: in one run)"));
          continue;
        }
        same.push_back(r);
      }
      by_values[{by_arm && o.branch, o.values}].push_back(std::move(o));
      any = true;
    }
    out.runs += any ? 1 : 0;
  }
  for (auto& [key, members] : by_values) out.groups.push_back(make_group(key.second, std::move(members)));
  std::stable_sort(out.groups.begin(), out.groups.end(), [&](const OutcomeGroup& x, const OutcomeGroup& y) {
    for (size_t i = 0; i < out.keys.size(); ++i) {
      if (value_less(out.keys[i], x.values[i], y.values[i])) return true;
      if (value_less(out.keys[i], y.values[i], x.values[i])) return false;
    }
    return false;
  });
  std::vector<MembersByStratum> by_stratum;  // once per group, for every pair it is in
  for (const OutcomeGroup& g : out.groups) by_stratum.push_back(members_by_stratum(g));
  for (size_t a = 0; a < out.groups.size(); ++a)
    for (size_t b = a + 1; b < out.groups.size(); ++b) {
      const OutcomeGroup &ga = out.groups[a], &gb = out.groups[b];
      if (!std::all_of(within.begin(), within.end(), [&](size_t i) { return ga.values[i] == gb.values[i]; })) continue;
      OutcomePair p;
      p.a = a;
      p.b = b;
      p.fisher_p = fisher_exact_two_sided(ga.excursions, ga.n - ga.excursions, gb.excursions, gb.n - gb.excursions);
      p.log_rank = log_rank(survival_obs(ga), survival_obs(gb));
      pair_by_stratum(by_stratum[a], by_stratum[b], p);
      out.pairs.push_back(p);
    }
  return out;
}

std::string grouped_tables(const GroupedOutcomes& g, bool compare, bool csv) {
  const TableCell cell{csv};
  auto count = [](int64_t v) { return std::to_string(v); };
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = g.keys;
  for (const char* c : {"n", "excursions", "excursions_lo", "excursions_hi", "median_excursion_step", "km_median_step",
                        "km_end_step", "km_survival_end", "km_survival_lo", "km_survival_hi", "diverged_to_end",
                        "degraded", "degraded_n", "median_loss_ratio", "median_tail_log_ratio"})
    header.push_back(c);
  rows.push_back(header);
  size_t trajectories = 0;
  for (const OutcomeGroup& gr : g.groups) {
    std::vector<std::string> row = gr.values;
    for (const std::string& c :
         {count(gr.n), count(gr.excursions), cell.num(gr.excursions_ci.lo), cell.num(gr.excursions_ci.hi),
          cell.num(gr.median_excursion_step), cell.step(gr.km.median_time), cell.step(gr.km.end_time),
          cell.num(gr.km.survival_end), cell.num(gr.km.survival_end_ci.lo), cell.num(gr.km.survival_end_ci.hi),
          count(gr.diverged_to_end), count(gr.degraded), count(gr.degraded_n), cell.num(gr.median_loss_ratio),
          cell.num(gr.median_tail_log_ratio)})
      row.push_back(c);
    rows.push_back(row);
    trajectories += gr.members.size();
  }
  std::string out;
  if (!csv) {
    char factor[32], ex[32];
    std::snprintf(factor, sizeof factor, "%g", g.degraded_factor);
    std::snprintf(ex, sizeof ex, "%g", g.events.excursion.factor);
    out += msg("by ", join(g.keys, ", "), ": ", g.groups.size(), " groups, ", trajectories, " trajectories of ", g.runs,
               " runs; excursion (primary): ", g.events.excursion.window / g.events.excursion.block, " consecutive ",
               g.events.excursion.block, "-step loss blocks with minimum > ", ex,
               " x the minimum before them, known ", g.events.excursion.window,
               " steps after its step, with Wilson 95 % interval and Kaplan-Meier survival (censored at steps run - ",
               g.events.excursion.window, "); diverged_to_end: the old rule (secondary); degraded: final loss > ", factor,
               " x the run's FP32 min loss; tail log-ratio to FP32 over the last ", g.events.tail_steps, " steps\n");
  }
  out += rows_text(rows, csv);
  if (!compare) return out;

  rows = pair_rows(g, cell);
  out += "\n";
  if (!csv)
    out += msg("pairs: Fisher's exact test of the excursion counts (two-sided); log-rank test of steps to excursion "
               "(chi-square, 1 df, unpaired); paired by seed stratum (trajectories whose runs differ only in the --by "
               "keys): only a / only b had an excursion, exact McNemar test (two-sided); stratified log-rank over the "
               "strata (u = O_a - E_a, chi-square p) and its within-stratum label-permutation p (exact when there are at "
               "most ", kPermutationMaxExact, " labelings, else ", kPermutationDraws,
               " draws from a fixed seed); no correction for multiple comparisons",
               g.within.empty() ? "" : "; only pairs of groups with the same " + join(g.within, ", "), "\n");
  return out + rows_text(rows, csv);
}

std::string pairs_csv(const GroupedOutcomes& g) { return rows_text(pair_rows(g, TableCell{true}), true); }

}  // namespace mxlab
