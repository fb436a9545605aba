// A whole run on the CPU backend into memory, for the trainer-level tests.
#pragma once
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

}  // namespace mxlab::test
