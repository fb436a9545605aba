// Reading a results directory back: one record per run file (status, configuration, the
// summary of every trajectory and branch) and the configuration keys that differ between runs.
// Everything is rebuilt from the run files; nothing here is maintained by hand. The tables
// built on these records: summary_table.h (`mxlab summarize`), index.h (DIR/index.csv),
// csv_export.h (`mxlab export`).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lab/runs/run_status.h"
#include "lab/stats/loss_events.h"

namespace mxlab {

// Summary of one trajectory (`fp32`, `mx`, or an arm of a multi-arm run) or branch of a run
// file (lab/train/SCHEMA.md).
struct GroupRecord {
  std::string name;        // fp32 | mx | the arm's name | the branch name
  std::string h5_path;     // trajectories/<name>, branches/<name>
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
  // The events of lab/stats/loss_events.h, from the per-step losses (loss_all) by read_events
  // (run_events.h) under the rules it is given; has_events is false until then, or when the
  // file holds no per-step losses for the group (a run killed before it ended).
  bool has_events = false;
  bool excursion = false;
  int64_t excursion_step = -1;    // the event's step, or the step it is censored at when !excursion
  int64_t first_spike_step = -1;  // spike_count's first step, -1 when none
  double tail_log_ratio = 0.0;    // against the run's FP32 trajectory; NaN for it or when unknown
  // Branches: the trajectory the branch forked from (its `from` attribute; `mx` in files written
  // before it), and its endpoint against that parent continuing unchanged (branch_endpoint of
  // lab/stats/loss_events.h: the parent's losses before `at` joined to the branch's), filled by
  // read_events with the events; has_endpoint is false for trajectories, until then, and when
  // the parent's or the branch's loss_all is missing or the parent stopped before `at`.
  std::string parent;
  bool has_endpoint = false;
  BranchEndpoint endpoint;
  // "file": the loss summaries are the group's attributes (written when the run ended);
  // "computed": recomputed from loss_all (or the logged losses) of a run that did not end.
  // max_bias_ratio and max_gamma_lastbin are always the maxima of their datasets.
  std::string source;
};

struct RunRecord {
  std::string path;
  std::string run_id;   // root attribute (the file name when unreadable)
  // root attribute (complete, diverged, ...), or unreadable; running files whose lock is held
  // say so in `error`
  RunStatus status = RunStatus::unreadable;
  std::string error;    // failed: the message; unreadable: why
  bool readable = false;
  // Unreadable because the system refused (an IoError: the check's process could not be made, a
  // read failed with EIO or EACCES): its errno. 0 when the file itself is the reason.
  int io_errno = 0;
  std::string name, start_time, end_time;
  int64_t steps = 0;
  // The canonical resolved configuration (config_yaml parsed and printed again), flattened to
  // dotted keys in configuration order, values as printed ("0.0006", "mxfp8_e4m3", "true").
  std::vector<std::pair<std::string, std::string>> config;
  // Every group under trajectories/ (fp32 first, then the others - mx or the arms - by name),
  // then the branches by (at, name).
  std::vector<GroupRecord> groups;

  // The trajectory (under trajectories/, never a branch) of that name, or null.
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
// order, leaving out `name` and `interventions` (as analysis/mxlab/sweep.py does).
std::vector<std::string> swept_keys(const std::vector<RunRecord>& runs);

// The value of dotted configuration key `key` in `r` (as printed in the canonical config);
// *found says whether the run's configuration has the key at all.
std::string config_value(const RunRecord& r, const std::string& key, bool* found);

// A config value as a short label, like analysis/mxlab/yamlcfg.format_value
// (6e-4 -> "0.0006", 1.0e-05 -> "1e-05", true -> "True").
std::string format_config_value(const std::string& text);

}  // namespace mxlab
