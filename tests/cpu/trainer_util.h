// A whole run on the CPU backend into memory, for the trainer-level tests.
#pragma once
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/train/trainer.h"

namespace mxlab::test {

// Train `cfg` to the end on the CPU backend; the sink holds every row and loss history.
inline MemorySink run_in_memory(const RunConfig& cfg) {
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(cfg, *be, sink);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  return sink;
}

// The one-line error that loading `yaml` (named `origin` in messages) gives, or "" when it loads.
inline std::string config_error(const std::string& yaml, const std::string& origin,
                                const std::vector<std::string>& overrides = {}) {
  try {
    config_from_yaml_string(yaml, origin, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mxlab::test
