// End-of-run summary of a loss trajectory (lab/train/SCHEMA.md, "Summary attributes").
// Pure functions of the per-step loss history, so they are easy to test and to recompute.
#pragma once
#include <cstdint>
#include <vector>

namespace mxlab {

struct LossSummary {
  int64_t steps_run = 0;
  int64_t first_nonfinite_step = -1;
  int64_t divergence_step = -1;
  int64_t spike_count = 0;
  double spike_score = 0.0;
  double final_loss = 0.0;  // last finite loss (NaN if none)
  double min_loss = 0.0;    // smallest finite loss (NaN if none)
};

// `loss[t]` is the loss of step `first_step + t`; reported steps are absolute.
// divergence: first step t (> first_step) with loss_s > factor * min(loss before t) for every
// s >= t, non-finite losses counting as above; spikes: loss_t > spike_factor * loss_{t-1};
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
                             double spike_factor);

}  // namespace mxlab
