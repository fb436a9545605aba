// `mxlab eval`: the loss of a stored parameter snapshot under its trajectory's precision policy
// and under patched ones, on the fixed probe batch or on the training batch of the snapshot's
// step. It answers "does this policy change alone change the function?" without training:
// e.g. the loss with Q(gamma) (as trained) against the stored gamma (skip_ln_quant) at the
// step an intervention switches.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/config/config.h"

namespace mxlab {

struct EvalRow {
  std::string label;   // "as trained", "apply: to_fp32", "set: {...}"
  std::string policy;  // one-line description of the policy evaluated
  double loss = 0.0;
};

// Rows: the trajectory's own policy at `step`, then one per patch (applied to that policy).
// `trajectory`: fp32, an arm, or a branch (its patched policy). train_batch: the batch step
// `step` trained on instead of the probe batch. Throws mxlab::Error when the file has no such
// trajectory or snapshot.
std::vector<EvalRow> eval_snapshot(Backend& be, const std::string& run_file, const std::string& trajectory,
                                   int64_t step, const std::vector<InterventionConfig>& patches, bool train_batch);

// The policy a trajectory of `cfg` trains under at `step` (fp32, an arm's, a branch's from its `at`).
PrecisionConfig trajectory_policy(const RunConfig& cfg, const std::string& trajectory, int64_t step);

}  // namespace mxlab
