// <dir>/index.csv: one row per run file of a results directory, rebuilt from the run files
// (lab/runs/README.md, "Several processes, one directory").
#pragma once
#include <string>
#include <vector>

#include "lab/runs/run_records.h"

namespace mxlab {

// <dir>/index.csv: one row per run file - run_id, status, steps, the swept keys, then the MX
// trajectory's divergence_step, first_nonfinite_step, final_loss and min_loss, the number of
// branches, start_time, end_time, error, file. Written atomically (temp file + rename), so
// processes sharing the directory never leave a torn index. Returns the path.
std::string write_index(const std::string& dir, const std::vector<RunRecord>& runs);
// Scan `dir` and write its index, holding <dir>/index.lock meanwhile (waiting up to
// kIndexLockWaitSeconds for another process's rebuild): the scans and writes of processes that
// share the directory are serialised, so the last index written comes from the last scan, and
// a process that rebuilds after its own runs ended always lists them as they ended. Returns
// the records it scanned (and writes nothing when there are none).
constexpr int kIndexLockWaitSeconds = 60;
std::vector<RunRecord> rebuild_index(const std::string& dir);

}  // namespace mxlab
