// `mxlab summarize DIR --by KEY[,KEY...]`: the trajectories of a results directory grouped by
// configuration keys (and `arm`, the trajectory's name), with per group the count of the
// primary event, the excursion (lab/stats/loss_events.h), and its Wilson interval, the median excursion step,
// Kaplan-Meier survival of steps to excursion, the count of the old diverged-to-end rule
// (secondary), the degraded count, final-loss ratio and tail log-ratio to FP32; per pair of
// groups Fisher's exact test, the log-rank test and, paired by seed stratum, the exact McNemar
// test and the stratified log-rank with its within-stratum label-permutation p. Columns and
// definitions: lab/report/README.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/report/run_events.h"
#include "lab/runs/run_records.h"
#include "lab/stats/stats.h"

namespace mxlab {

// The key that stands for the trajectory's name: fp32, mx, an arm's name, a branch's name.
constexpr const char* kArmKey = "arm";
constexpr double kDefaultDegradedFactor = 2.0;

struct GroupingOptions {
  std::vector<std::string> keys;  // kArmKey or dotted configuration keys (optimizer.lr, seed)
  bool branches = false;          // also every branch (branches/<name>), its name as the arm
  double degraded_factor = kDefaultDegradedFactor;
  // The rules the records' events were read with (read_events): named in the text tables' titles.
  EventRules events{};
  // Pairs only of groups with the same values of these keys (a subset of `keys`, not all of
  // them); empty: every pair.
  std::vector<std::string> within{};
};

// One trajectory (or branch) of a finished run as an outcome.
struct TrajectoryOutcome {
  std::string run_id, name;
  bool branch = false;
  // Of the keys, printed like summarize's swept keys; "-" absent. The FP32 trajectory (not a
  // branch) reads "(fp32)" under a precision key (`precision`, `precision.*`): the run's MX
  // recipe is not its own.
  std::vector<std::string> values;
  // The seed stratum: trajectories with the same one share initial weights and batches (their
  // runs' configurations agree on every key but the --by keys); see group_outcomes.
  std::string stratum;
  bool excursion = false;            // the primary event (GroupRecord::excursion)
  int64_t excursion_step = 0;        // its step, or the step the trajectory is censored at
  bool diverged_to_end = false;      // secondary: divergence_step >= 0 or first_nonfinite_step >= 0
  int64_t diverged_to_end_step = -1; // the earlier of the two that is >= 0; -1 when not
  int64_t end_step = 0;              // first step (0, or a branch's `at`) + steps_run
  int degraded = -1;                 // 1 / 0; -1 unknown (no FP32 reference)
  double loss_ratio = 0;             // final_loss / the FP32 trajectory's; NaN unknown, inf non-finite
  double tail_log_ratio = 0;         // GroupRecord::tail_log_ratio (NaN for FP32 or unknown)
};

struct OutcomeGroup {
  std::vector<std::string> values;  // of the keys
  std::vector<TrajectoryOutcome> members;
  int64_t n = 0, excursions = 0;
  Interval excursions_ci{0, 0};          // Wilson 95 %
  double median_excursion_step = 0;      // over the members with an excursion; NaN when none
  int64_t diverged_to_end = 0;           // secondary: members that diverged to the end
  int64_t degraded = 0, degraded_n = 0;  // degraded_n: members with an FP32 reference
  double median_loss_ratio = 0;          // over the degraded_n members; NaN when none
  double median_tail_log_ratio = 0;      // over the members that have one; NaN when none
  KaplanMeier km;                        // steps to excursion, censored where the members are
};

struct OutcomePair {
  size_t a = 0, b = 0;  // indices into groups, a < b
  double fisher_p = 0;  // excursion counts, two-sided
  LogRank log_rank;     // steps to excursion, unpaired
  // Paired by seed stratum: the strata with exactly one trajectory in each group; of those, the
  // ones where only a's / only b's had an excursion, and the exact McNemar p (NaN when no
  // stratum pairs the groups).
  int64_t paired_n = 0, only_a = 0, only_b = 0;
  double mcnemar_p = 0;
  // The stratified log-rank of steps to excursion over every stratum holding members of both
  // groups, with its within-stratum label-permutation p (stats.h permutation_log_rank).
  PermutationLogRank permutation;
};

struct GroupedOutcomes {
  std::vector<std::string> keys;
  double degraded_factor = kDefaultDegradedFactor;
  EventRules events;
  std::vector<OutcomeGroup> groups;   // sorted by their values (numbers as numbers, fp32 first)
  std::vector<std::string> within;    // GroupingOptions::within
  std::vector<OutcomePair> pairs;     // every pair of groups (of the same `within` values)
  size_t runs = 0;                    // runs that contributed
  std::vector<std::string> left_out;  // "<file>: <why>", one per run or trajectory left out
};

// Runs that differ only in precision keys each train the same FP32 trajectory: when those keys
// are all --by keys (so the FP32 trajectories share their group and seed stratum), it is counted
// once, and the others are listed in left_out.
// Groups the trajectories of the finished runs (status complete or diverged) of `runs`, whose
// events read_events has filled; other runs (running, interrupted, failed, unreadable) and
// trajectories that ran no step or have no events are listed in left_out. Throws mxlab::Error for a key that no run's configuration has,
// and for `within` keys that are not --by keys (or are all of them).
GroupedOutcomes group_outcomes(const std::vector<RunRecord>& runs, const GroupingOptions& opt);

// The groups table, and with `compare` an empty line and the pairs table. Text: a title line
// over each aligned table, floats to 4 significant digits, "-" for none. CSV: the same columns
// without titles, floats as the shortest decimal that reads back to the same double, empty for
// none, -1 for "no such step".
std::string grouped_tables(const GroupedOutcomes& g, bool compare, bool csv);

// The pairs table alone as CSV (the columns of grouped_tables' second table): what
// `--compare-csv FILE` writes, one table that pandas.read_csv reads.
std::string pairs_csv(const GroupedOutcomes& g);

}  // namespace mxlab
