// `mxlab export RUN_OR_DIR --tensorboard OUTDIR`: run files as TensorBoard event files
// (lab/io/tfevents.h), for `tensorboard --logdir OUTDIR`.
#pragma once
#include <string>
#include <vector>

namespace mxlab {

// For each run file (RUN.h5, or every *.h5 of a directory) and each of its trajectories and
// branches T (fp32, mx or the arms, branch-<name>):
//   OUT/<run_id>/<T>/events.out.tfevents.<start>.mxlab
// one TensorBoard run per trajectory, so that one chart overlays FP32, the arms and the
// branches. Scalars (simple_value, stored as float): every 1-D metric dataset under its name at
// its logged steps (`step`, or its own axis such as `shadow_step`), a per-layer [n, L] dataset
// as <metric>/layer<k>, a per-group one (attribute `names`) as <metric>/<group>, and `loss_all`
// at every step run (a branch's from its `at`). Wall times are the run's start_time (seconds
// since the epoch; <start> in the file name), so exporting again writes the same bytes.
// Returns the paths written (each atomically) under `out_dir`. Throws mxlab::Error for a file
// that cannot be read, a directory without run files.
std::vector<std::string> export_run_tensorboard(const std::string& run_or_dir, const std::string& out_dir);

}  // namespace mxlab
