// The events of a results directory's trajectories (lab/stats/loss_events.h: excursion, spikes,
// tail log-ratio, a branch's endpoint against its parent), computed from each group's per-step losses (`loss_all`) under rules given
// on the command line (`mxlab summarize --excursion-*`), so that a directory can be read
// under other rules than the ones its run files were summarized with.
#pragma once
#include <cstdint>
#include <vector>

#include "lab/runs/run_records.h"
#include "lab/stats/loss_events.h"

namespace mxlab {

struct EventRules {
  ExcursionRule excursion;
  int64_t tail_steps = kDefaultTailSteps;  // tail_log_ratio: the last this many shared steps
};

// Fills has_events, excursion, excursion_step, first_spike_step and tail_log_ratio of every
// group of every readable record (spikes with the run's log.spike_factor; tail_log_ratio
// against the run's FP32 trajectory, NaN for that one), and of every branch has_endpoint and
// endpoint: branch_endpoint (loss_events.h) of its parent's loss_all (the trajectory its
// `parent` names) and its own, to its end_step (else the run's steps), under the same rule. A
// group without loss_all keeps has_events = false, a branch whose parent has none (or stopped
// before `at`) has_endpoint = false. A file that cannot be read now leaves its groups so. Throws
// mxlab::Error for unusable rules (excursion_rule_problem).
void read_events(std::vector<RunRecord>& runs, const EventRules& rules);

}  // namespace mxlab
