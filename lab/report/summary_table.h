// The table of `mxlab summarize DIR` (without --by): one row per trajectory and branch of every
// run, the C++ twin of `python -m mxlab summary` (plus the events).
#pragma once
#include <string>
#include <vector>

#include "lab/runs/run_records.h"

namespace mxlab {

// One row per trajectory and branch of every run, columns
//   run_id group at <swept keys> status excursion_step excursion_censored_at first_spike_step
//   tail_log_ratio parent at_risk branch_excursion_step branch_censored_at control_excursion_step
//   control_censored_at diverged_to_end_step first_nonfinite_step spike_count spike_score
//   final_loss min_loss max_bias_ratio max_gamma_lastbin steps_run source file error
// (the columns of the Python `summary`, its divergence_step named diverged_to_end_step, plus the
// events of read_events (run_events.h), which the records must have been given, a branch's
// endpoint against its parent (GroupRecord::endpoint; empty for trajectories), and `error`).
// Text: aligned, floats to 4 significant digits, "-" for none. CSV: floats in the shortest form
// that reads back to the same double, empty for none, -1 for "no such step".
std::string summary_table(const std::vector<RunRecord>& runs, bool csv);

}  // namespace mxlab
