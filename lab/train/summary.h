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
LossSummary summarize_losses(const std::vector<float>& loss, int64_t first_step, double divergence_factor,
                             double spike_factor);

}  // namespace mxlab
