// `mxlab summarize DIR --by KEY[,KEY...]`: the trajectories of a results directory grouped by
// configuration keys (and `arm`, the trajectory's name), with per group the divergence count
// and its Wilson interval, the degraded count, median divergence step and final-loss ratio to
// FP32, and Kaplan-Meier survival of steps to divergence; per pair of groups Fisher's exact
// test, the log-rank test and, over the runs both groups share, the exact McNemar test. Columns and definitions: lab/train/README.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/train/run_records.h"
#include "lab/train/stats.h"

namespace mxlab {

// The key that stands for the trajectory's name: fp32, mx, an arm's name, a branch's name.
constexpr const char* kArmKey = "arm";
constexpr double kDefaultDegradedFactor = 2.0;

struct GroupingOptions {
  std::vector<std::string> keys;  // kArmKey or dotted configuration keys (optimizer.lr, seed)
  bool branches = false;          // also every branch (branches/<name>), its name as the arm
  double degraded_factor = kDefaultDegradedFactor;
};

// One trajectory (or branch) of a finished run as an outcome.
struct TrajectoryOutcome {
  std::string run_id, name;
  bool branch = false;
  std::vector<std::string> values;  // of the keys, printed like summarize's swept keys; "-" absent
  bool diverged = false;            // divergence_step >= 0 or first_nonfinite_step >= 0
  int64_t divergence_step = -1;     // the earlier of the two that is >= 0; -1 when not diverged
  int64_t end_step = 0;             // first step (0, or a branch's `at`) + steps_run
  int degraded = -1;                // 1 / 0; -1 unknown (no FP32 reference)
  double loss_ratio = 0;            // final_loss / the FP32 trajectory's; NaN unknown, inf non-finite
};

struct OutcomeGroup {
  std::vector<std::string> values;  // of the keys
  std::vector<TrajectoryOutcome> members;
  int64_t n = 0, diverged = 0;
  Interval diverged_ci{0, 0};  // Wilson 95 %
  int64_t degraded = 0, degraded_n = 0;  // degraded_n: members with an FP32 reference
  double median_divergence_step = 0;     // over the diverged members; NaN when none
  double median_loss_ratio = 0;          // over the degraded_n members; NaN when none
  KaplanMeier km;                        // steps to divergence, censored at end_step
};

struct OutcomePair {
  size_t a = 0, b = 0;  // indices into groups, a < b
  double fisher_p = 0;  // diverged counts, two-sided
  LogRank log_rank;     // steps to divergence
  // Paired by run: the runs with exactly one trajectory in each group (arms of one run share its
  // seed, initial weights and batches); of those, the ones where only a's / only b's diverged,
  // and the exact McNemar p (NaN when no run pairs the groups).
  int64_t paired_n = 0, only_a = 0, only_b = 0;
  double mcnemar_p = 0;
};

struct GroupedOutcomes {
  std::vector<std::string> keys;
  double degraded_factor = kDefaultDegradedFactor;
  std::vector<OutcomeGroup> groups;   // sorted by their values (numbers as numbers, fp32 first)
  std::vector<OutcomePair> pairs;     // every pair of groups
  size_t runs = 0;                    // runs that contributed
  std::vector<std::string> left_out;  // "<file>: <why>", one per run or trajectory left out
};

// Groups the trajectories of the finished runs (status complete or diverged) of `runs`; other
// runs (running, interrupted, failed, unreadable) and trajectories that ran no step are listed
// in left_out. Throws mxlab::Error for a key that no run's configuration has.
GroupedOutcomes group_outcomes(const std::vector<RunRecord>& runs, const GroupingOptions& opt);

// The groups table, and with `compare` an empty line and the pairs table. Text: a title line
// over each aligned table, floats to 4 significant digits, "-" for none. CSV: the same columns
// without titles, floats as the shortest decimal that reads back to the same double, empty for
// none, -1 for "no such step".
std::string grouped_tables(const GroupedOutcomes& g, bool compare, bool csv);

}  // namespace mxlab
