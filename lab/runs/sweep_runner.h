// Running the runs of an experiment (lab/config/sweep.h): shards (--shard i/n or a Slurm array),
// N runs at once in threads (--jobs, one backend each), GPUs of one host (--gpus), live
// progress, and the table of what happened. Each run goes through run_one (run_driver.h), so
// finished runs are skipped, interrupted ones resume and the per-run lock keeps several
// processes on one directory from running a run twice.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lab/runs/run_driver.h"
#include "lab/config/sweep.h"

namespace mxlab {

// This process runs the runs whose index in the expansion order satisfies index % count == index_of_shard.
struct ShardSpec {
  int index = 0;
  int count = 1;
  std::string origin;  // "--shard 2/8", "SLURM_ARRAY_TASK_ID=5 (array 0-15)", ... for messages
};

// "i/n", 0 <= i < n. Throws mxlab::Error with the expected form.
ShardSpec parse_shard(const std::string& text);
// The shard of a Slurm array task, from SLURM_ARRAY_TASK_ID with SLURM_ARRAY_TASK_MIN/MAX (and
// SLURM_ARRAY_TASK_STEP) or, without MIN/MAX, SLURM_ARRAY_TASK_COUNT (ids 0..count-1): task
// `id` of an array `min-max:step` is shard (id - min) / step of (max - min) / step + 1. Empty
// when SLURM_ARRAY_TASK_ID is unset. `getenv` is a parameter so tests can pass their own.
// Throws mxlab::Error for an array that is not a range (e.g. --array=1,4,9): use --shard.
std::optional<ShardSpec> shard_from_env(const std::function<const char*(const char*)>& getenv);
// The runs of a shard, in expansion order.
std::vector<ExpandedRun> select_shard(const std::vector<ExpandedRun>& runs, const ShardSpec& shard);

// "0,1,3" -> {0, 1, 3}. Throws mxlab::Error.
std::vector<int> parse_gpu_list(const std::string& text);

struct SweepOptions {
  std::string out_dir = "runs";
  std::string device;     // overrides every run's device when not empty
  std::vector<int> gpus;  // when not empty, job j runs on cuda:gpus[j % gpus.size()]
  int jobs = 1;           // runs at once (threads, each run its own backend)
  bool live = false;      // a live progress line on stderr (a terminal)
  // When not live and > 0: every `progress_every` seconds, one plain line per active run on
  // stderr (a file, a pipe, a Slurm log): run id, step/steps, steps/s and ETA (the run's average
  // rate since this process started it), and the latest logged loss of each trajectory.
  double progress_every = 0.0;
  int keep_checkpoints = kDefaultKeepCheckpoints;  // RunOptions::keep_checkpoints
  std::FILE* out = stdout;  // one line per finished run
  const std::atomic<bool>* stop = nullptr;  // SIGINT/SIGTERM: every job checkpoints and stops
  std::function<std::unique_ptr<Backend>(const std::string&)> make_backend;
  // Called on each log step of each run (from the job's thread); see RunOptions::on_progress.
  std::function<void(const ExpandedRun&, const RunProgress&)> on_progress;
};

struct SweepRunResult {
  int index = 0;  // in the expansion order
  std::string run_id;
  std::vector<std::pair<std::string, std::string>> swept;
  // complete | diverged | skipped | interrupted | failed | busy | not_run (stopped before it began)
  RunStatus status = RunStatus::not_run;
  std::string error;
  std::string device;
  bool resumed = false;
  int64_t resumed_from = 0;
  int64_t divergence_step = -1;  // earliest over the MX arms
  std::string divergence_arm;    // which arm ("" when none)
  int64_t excursion_step = -1;   // earliest excursion (lab/stats/loss_events.h) over the MX arms
  std::string excursion_arm;     // which arm ("" when none)
  std::string note;              // RunOutcome::note: the run started again over a damaged file
  double seconds = 0.0;
};

struct SweepResult {
  std::vector<SweepRunResult> runs;  // in expansion order
  int exit_code = 0;
};

// Exit status of a sweep (lab/core/exit_codes.h): 1 if any run failed, else 130 if any was
// interrupted or not run because of a stop request, else 75 if any was busy (being run by
// another live process: this sweep is not finished yet), else 0 (complete, diverged, skipped).
int sweep_exit_code(const std::vector<SweepRunResult>& runs);

// Runs `runs` (already sharded) with opt.jobs threads. Jobs take runs in expansion order; a
// failing run does not stop the others; a stop request lets each running job checkpoint and
// mark its file interrupted, and no new run starts. Throws mxlab::Error only for bad options
// or an output directory that cannot be created, and IoError (before any run starts) when a
// run's file name <out>/<run_id>.h5 is a symbolic link: nothing is written through it.
SweepResult run_sweep(const std::vector<ExpandedRun>& runs, const SweepOptions& opt);

// The table of what happened (index, run id, swept values, status, divergence step, note)
// followed by a line of counts and, where useful, what to do next.
std::string format_sweep_report(const SweepResult& result);

}  // namespace mxlab
