// Settings that only the CPU reference implements so far (lab/config/config.h,
// cuda_pending_setting): a command refuses a CUDA device for them before it does any work, in one
// line naming the setting and the fix, instead of failing inside a run.
#pragma once
#include <string>

#include "lab/config/config.h"
#include "lab/core/error.h"

namespace mxlab::cli {

// Throws mxlab::Error when `device` (a device string, or a backend's name) is a CUDA device and
// `cfg` asks for something the CUDA backend does not have yet. `what` names the run in the message.
inline void refuse_cuda_if_pending(const RunConfig& cfg, const std::string& device, const std::string& what) {
  if (device.rfind("cuda", 0) != 0) return;
  const std::string s = cuda_pending_setting(cfg);
  if (!s.empty())
    throw Error(msg(what, ": ", s, " is not yet on CUDA (only the CPU reference has it): run with --device cpu"));
}

}  // namespace mxlab::cli
