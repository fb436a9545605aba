// The status of a run, one enum for what run files, sweeps and tables say. Its spellings are
// what files (the root attribute `status`), index.csv, summaries and terminal lines contain:
//   running complete diverged failed interrupted   (a run file's `status`, train/SCHEMA.md)
//   unreadable                                     (a file that does not read whole: run_records.h)
//   skipped busy not_run                           (what a sweep did with a run: sweep_runner.h)
#pragma once
#include <optional>
#include <string>

namespace mxlab {

enum class RunStatus { running, complete, diverged, failed, interrupted, unreadable, skipped, busy, not_run };

// Every value, in the order above.
inline constexpr RunStatus kAllRunStatuses[] = {RunStatus::running,     RunStatus::complete,   RunStatus::diverged,
                                                RunStatus::failed,      RunStatus::interrupted, RunStatus::unreadable,
                                                RunStatus::skipped,     RunStatus::busy,       RunStatus::not_run};

// The spelling written to files and tables ("complete", "not_run", ...).
const char* to_string(RunStatus s);
// The status of that spelling; nullopt for any other text (the caller says what it means).
std::optional<RunStatus> parse_run_status(const std::string& text);
// A status that a trainer or a file is known to hold: MXLAB_ASSERT (an internal error) on any
// other text.
RunStatus run_status_of(const std::string& text);

// complete or diverged: the run ended and its file is a result.
inline bool is_finished(RunStatus s) { return s == RunStatus::complete || s == RunStatus::diverged; }

}  // namespace mxlab
