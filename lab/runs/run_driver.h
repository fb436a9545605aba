// Running one configuration end to end: per-run lock, output file, resume from checkpoints,
// signals, progress, failures. `mxlab run` (through lab/runs/sweep_runner.h) calls run_one for
// each expanded run; several threads and several processes may call it on one directory.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "lab/model/backend.h"
#include "lab/config/config.h"
#include "lab/io/locks.h"
#include "lab/runs/disk_use.h"
#include "lab/runs/run_status.h"

namespace mxlab {

// Where a run stands, as run_one reports it on a log step.
struct RunProgress {
  std::string run_id;
  int64_t step = 0;   // steps done (the step just logged + 1)
  int64_t steps = 0;  // steps configured
  std::string losses; // e.g. "fp32 0.0152  mx 0.0165"
};

struct RunOptions {
  std::string out_dir = "runs";
  std::string device;                  // overrides cfg.device when not empty
  bool progress = false;               // print a live progress line to stderr (a terminal, one run)
  std::string label;                   // prefix of progress lines, e.g. "[3/8]"
  const std::atomic<bool>* stop = nullptr;  // set by SIGINT/SIGTERM handlers
  // Backend factory (make_backend from lab/backends/backends.h; passed in so that this library
  // does not depend on the CUDA one). Called once per run: a backend frees its buffers only
  // when destroyed, so each run gets its own.
  std::function<std::unique_ptr<Backend>(const std::string&)> make_backend;
  // Called on every log step (from the thread running the run). An exception thrown here fails
  // the run like any other error (the tests use it to inject one).
  std::function<void(const RunProgress&)> on_progress;
  // Take the per-run lock <out>/<run_id>.lock so that no two processes run the same run at once.
  bool lock = true;
  // Checkpoints kept besides those at intervention steps: the latest N (-1: all; disk_use.h).
  int keep_checkpoints = kDefaultKeepCheckpoints;
};

struct RunOutcome {
  // complete | diverged | interrupted | skipped (already complete) | failed | busy (locked by
  // another live process, or its file held open by another program: left as it is)
  RunStatus status = RunStatus::failed;
  std::string run_id, path;
  std::string error;  // failed: the message (also stored in the file's `error` attribute);
                      // busy: why, in words (who holds the lock; the file open elsewhere)
  bool resumed = false;
  int64_t resumed_from = 0;
  int64_t divergence_step = -1;  // earliest over the MX arms (-1: none or unknown)
  std::string divergence_arm;    // the arm that diverged first ("" when none)
  int64_t excursion_step = -1;   // earliest excursion (lab/stats/loss_events.h) over the MX arms (-1: none or unknown)
  std::string excursion_arm;     // the arm it happened in ("" when none)
  int64_t steps_run = 0;         // steps trained by this call
  // Set when a file of this run that was there (damaged, or not this run's) was replaced and
  // the run started again from step 0 (also warned on stderr and kept in the file's
  // `restart_reason`).
  std::string note;
};

// Never throws for a problem of the run itself (bad device, I/O or numeric error inside the
// trainer): the outcome is `failed`, with the message, and the run file, when one was opened,
// gets status `failed` and attribute `error`. Throws mxlab::Error only when the output
// directory cannot be created or no backend factory is given.
RunOutcome run_one(const RunConfig& cfg, const RunOptions& opt);

// Install SIGINT/SIGTERM handlers that set the returned flag (idempotent).
const std::atomic<bool>* install_stop_handlers();


}  // namespace mxlab
