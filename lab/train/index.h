// Reading a results directory back: one record per run file (status, configuration, the
// summary of every trajectory and branch), the keys that differ between runs, the summary
// table of `mxlab summarize` (the C++ twin of `python -m mxlab_analysis summary`), the
// directory's index.csv, and the flat CSV export of one run file (`mxlab export`).
// Everything is rebuilt from the run files; nothing here is maintained by hand.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mxlab {

// Summary of one trajectory (`fp32`, `mx`) or branch of a run file (lab/train/SCHEMA.md).
struct GroupRecord {
  std::string name;        // fp32 | mx | the branch name
  std::string h5_path;     // trajectories/mx, branches/<name>
  bool branch = false;
  int64_t at = -1;         // branches: first step of the patch
  int64_t steps_run = 0;
  int64_t first_nonfinite_step = -1;
  int64_t divergence_step = -1;
  int64_t spike_count = 0;
  double spike_score = 0.0;
  double final_loss = 0.0, min_loss = 0.0;  // NaN when no finite loss
  double max_bias_ratio = 0.0;              // NaN for fp32 or when never logged
  double max_gamma_lastbin = 0.0;           // NaN when not logged
  // "file": the loss summaries are the group's attributes (written when the run ended);
  // "computed": recomputed from loss_all (or the logged losses) of a run that did not end.
  // max_bias_ratio and max_gamma_lastbin are always the maxima of their datasets.
  std::string source;
};

struct RunRecord {
  std::string path;
  std::string run_id;   // root attribute (the file name when unreadable)
  std::string status;   // root attribute; "running" files whose lock is held say so in `error`
  std::string error;    // failed: the message; unreadable: why
  bool readable = false;
  std::string name, start_time, end_time;
  int64_t steps = 0;
  // The canonical resolved configuration (config_yaml parsed and printed again), flattened to
  // dotted keys in configuration order, values as printed ("0.0006", "mxfp8_e4m3", "true").
  std::vector<std::pair<std::string, std::string>> config;
  std::vector<GroupRecord> groups;  // fp32, mx, then branches by (at, name)

  const GroupRecord* group(const std::string& name) const;
};

// Reads one run file. Never throws: a file that cannot be read gives readable = false,
// status "unreadable" and the reason in `error` (or status "running" when a live process
// holds the run's lock: HDF5 refuses to open a file while another process writes it).
RunRecord read_run_record(const std::string& path);
// Every `*.h5` file of `dir` (not recursive), sorted by run id then path. Throws
// mxlab::Error when `dir` is not a readable directory.
std::vector<RunRecord> scan_run_dir(const std::string& dir);

// Configuration keys whose values are not the same in every readable record, in configuration
// order, leaving out `name` and `interventions` (as analysis/mxlab_analysis/sweep.py does).
std::vector<std::string> swept_keys(const std::vector<RunRecord>& runs);

// `mxlab summarize`: one row per trajectory and branch of every run, columns
//   run_id group at <swept keys> status divergence_step first_nonfinite_step spike_count
//   spike_score final_loss min_loss max_bias_ratio max_gamma_lastbin steps_run source file error
// (the columns of the Python `summary`, plus `error`). Text: aligned, floats to 4 significant
// digits, "-" for none. CSV: floats in the shortest form that reads back to the same double,
// empty for none, -1 for "no such step".
std::string summary_table(const std::vector<RunRecord>& runs, bool csv);

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

// `mxlab export RUN.h5 --csv DIR`: per trajectory/branch T (fp32, mx, branch-<name>)
//   DIR/<run_id>_<T>.csv           step, then one column per metric dataset (loss first, the
//                                  rest by name); [n, L] per-layer datasets as <metric>_layer<k>,
//                                  per-group datasets (attribute `names`) as <metric>_<group>
//   DIR/<run_id>_<T>_loss_all.csv  step, loss for every step run
// and DIR/<run_id>_summary.csv: one row per trajectory/branch with the summary values.
// Numbers: a value that is a float32 number (most metrics; loss_all is float32) with %.9g,
// which reads back to the same float32; any other double with %.17g, which reads back to the
// same double; nan, inf, -inf as such. Each file is written atomically. Returns the paths.
std::vector<std::string> export_run_csv(const std::string& run_path, const std::string& out_dir);

// Writes `text` to `path` through a temp file in the same directory and rename(2).
void write_text_atomically(const std::string& path, const std::string& text);

// The CSV number format of export_run_csv (see above).
std::string csv_number(double v);

}  // namespace mxlab
