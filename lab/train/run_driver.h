// Running one configuration end to end: output file, resume from checkpoints, signals,
// progress. `mxlab run` (and sweeps) call run_one for each expanded run.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lab/model/backend.h"
#include "lab/train/config.h"

namespace mxlab {

struct RunOptions {
  std::string out_dir = "runs";
  std::string device;                  // overrides cfg.device when not empty
  bool progress = false;               // live progress line (on a terminal)
  std::string label;                   // prefix of progress lines, e.g. "[3/8]"
  const std::atomic<bool>* stop = nullptr;  // set by SIGINT/SIGTERM handlers
  // Backend factory (make_backend from lab/model/backend.h; passed in so that this library
  // does not depend on the CUDA one).
  std::function<std::unique_ptr<Backend>(const std::string&)> make_backend;
};

struct RunOutcome {
  std::string run_id, path, status;  // status: complete | diverged | interrupted | skipped
  bool resumed = false;
  int64_t resumed_from = 0;
};

RunOutcome run_one(const RunConfig& cfg, const RunOptions& opt);

// Install SIGINT/SIGTERM handlers that set the returned flag (idempotent).
const std::atomic<bool>* install_stop_handlers();

}  // namespace mxlab
