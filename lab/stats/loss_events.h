// End-of-run summary of a loss trajectory (lab/train/SCHEMA.md, "Summary attributes").
// Pure functions of the per-step loss history, so they are easy to test and to recompute.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

// The excursion event (lab/stats/README.md, "Events"): block b covers steps
// [first_step + b*block, first_step + (b+1)*block) (a trailing partial block is not used) and
// its value is the minimum of its losses, a non-finite loss counting as +inf. The event happens
// at block b >= 1 when each of the window/block consecutive blocks b, b+1, ... has a minimum
// above factor x the minimum of all blocks before b; it is reported at b's first step t and is
// known at t + window (nothing later is read, so cutting the run at any step >= t + window
// leaves it unchanged). A history whose last loss is non-finite stays non-finite from then on
// (the trajectory stopped there, or its parameters are no longer finite). Without an event the
// trajectory is censored at first_step + steps_run - window (not before first_step).
struct ExcursionRule {
  double factor = 10.0;
  int64_t window = 500;  // a positive multiple of block
  int64_t block = 100;
};
// Empty when `r` is usable, else a one-line message naming the problem and the fix.
std::string excursion_rule_problem(const ExcursionRule& r);
struct Excursion {
  bool event = false;
  int64_t step = 0;  // the event's step, or the step the trajectory is censored at
};
// Throws mxlab::Error when excursion_rule_problem(r) is not empty.
Excursion excursion(const std::vector<float>& loss, int64_t first_step, const ExcursionRule& r);

// The excursion whose onset lies in the window [from, until): the first block b with first step
// t = first_step + b*block in it that meets the rule of `excursion` (the minimum "before" is
// still that of every block from first_step on, so what happened before `from` counts). Without
// one the series is censored at the window's end it could show, E = until when its last loss is
// non-finite (it stays so), else min(until, first_step + steps - window), not below from: no
// onset in [from, E). Nothing at or after E + window is read. Throws mxlab::Error when
// excursion_rule_problem(r) is not empty.
Excursion excursion_between(const std::vector<float>& loss, int64_t first_step, int64_t from, int64_t until,
                            const ExcursionRule& r);

// The endpoint of a branch against its parent continuing unchanged (E2 of
// results/prereg/why_mx.md; lab/stats/README.md, "Branch endpoint"). `parent[i]` is the loss of
// step i of the parent trajectory (it must hold at least `at` losses), `branch[i]` that of step
// at + i of the branch, which was to train up to `end` (exclusive: at + its `steps`, or the run's
// steps). The window is [at, E) with E = end - window, cut to what the branch's series can show
// (excursion_between); the branch is read on the joined series (the parent's losses before `at`,
// the branch's from `at`: the minimum before an onset includes the parent's blocks), its control
// on the parent's own series, both with excursion_between over the same window [at, E). The pair
// is at risk when the parent had no excursion (the rule of `excursion` on its whole series) with
// onset before `at`. Throws mxlab::Error for an unusable rule or a parent shorter than `at`.
struct BranchEndpoint {
  bool at_risk = false;
  int64_t window_end = 0;  // E
  Excursion branch;        // onset in [at, E) on the joined series, or censored at E
  Excursion control;       // onset in [at, E) on the parent's series, or censored where it is
};
BranchEndpoint branch_endpoint(const std::vector<float>& parent, const std::vector<float>& branch, int64_t at,
                               int64_t end, const ExcursionRule& r);

// The paired continuous outcome of an arm against its FP32 reference: the median, over the last
// `last` steps both histories cover, of log(loss_arm / loss_ref) at the same step (a
// non-finite loss counting as +inf: +inf when only the arm's is, -inf when only the
// reference's is, 0 when both are; a history whose last loss is non-finite stays so up to the
// other's last step). The median of an even count is the mean of the middle two. NaN when no
// step is shared. `arm[i]` is the loss of step first_arm + i, `ref` likewise.
constexpr int64_t kDefaultTailSteps = 2000;
double tail_log_ratio(const std::vector<float>& arm, int64_t first_arm, const std::vector<float>& ref,
                      int64_t first_ref, int64_t last = kDefaultTailSteps);

struct LossSummary {
  int64_t steps_run = 0;
  int64_t first_nonfinite_step = -1;
  // The diverged-to-end rule ("diverged_to_end_step" in mxlab summarize): it reads the loss up to
  // the run's last step, so it depends on the run's length; not the primary event.
  int64_t divergence_step = -1;
  int64_t spike_count = 0;
  int64_t first_spike_step = -1;
  Excursion excursion;
  double spike_score = 0.0;
  double final_loss = 0.0;  // last finite loss (NaN if none)
  double min_loss = 0.0;    // smallest finite loss (NaN if none)
};

// `loss[t]` is the loss of step `first_step + t`; reported steps are absolute.
// diverged to end (divergence_step): first step t (> first_step) with loss_s > factor * min(loss
// before t) for every s >= t, non-finite losses counting as above; spikes (spike_count,
// first_spike_step): steps t with loss_{t-1} finite and loss_t > spike_factor * loss_{t-1}, a
// non-finite loss_t counting as above; excursion: see ExcursionRule;
// spike score: papers/mxnorm.md appendix J (rolling min over 8 steps, sigma = std of the last
// 30 % of the finite losses).
// The step at which a trajectory counts as diverged, as the run's status has it: the earlier of
// its divergence step and its first non-finite step that are >= 0; -1 when neither is.
inline int64_t diverged_at(int64_t divergence_step, int64_t first_nonfinite_step) {
  if (divergence_step < 0) return first_nonfinite_step < 0 ? -1 : first_nonfinite_step;
  return first_nonfinite_step < 0 || divergence_step < first_nonfinite_step ? divergence_step : first_nonfinite_step;
}
inline int64_t diverged_at(const LossSummary& s) { return diverged_at(s.divergence_step, s.first_nonfinite_step); }

LossSummary summarize_losses(const std::vector<float>& loss, int64_t first_step, double divergence_factor,
                             double spike_factor, const ExcursionRule& excursion_rule = ExcursionRule{});

}  // namespace mxlab
