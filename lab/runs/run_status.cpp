#include "lab/runs/run_status.h"

#include "lab/core/error.h"

namespace mxlab {

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::running: return "running";
    case RunStatus::complete: return "complete";
    case RunStatus::diverged: return "diverged";
    case RunStatus::failed: return "failed";
    case RunStatus::interrupted: return "interrupted";
    case RunStatus::unreadable: return "unreadable";
    case RunStatus::skipped: return "skipped";
    case RunStatus::busy: return "busy";
    case RunStatus::not_run: return "not_run";
  }
  MXLAB_ASSERT(false, "RunStatus ", static_cast<int>(s), " has no spelling");
  return "";
}

std::optional<RunStatus> parse_run_status(const std::string& text) {
  for (RunStatus s : kAllRunStatuses)
    if (text == to_string(s)) return s;
  return std::nullopt;
}

RunStatus run_status_of(const std::string& text) {
  const std::optional<RunStatus> s = parse_run_status(text);
  MXLAB_ASSERT(s.has_value(), "'", excerpt(text), "' is not a run status");
  return *s;
}

}  // namespace mxlab
