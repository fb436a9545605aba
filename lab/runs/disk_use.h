// What a run directory keeps on disk, and what finished runs no longer need (`mxlab gc`).
//
// Beside `<run_id>.h5` a run writes `<run_id>.h5.snapshot` (the run file at its last completed
// flush, which repairs a file torn by a kill inside a flush: run_file.h) and checkpoints
// `<run_id>.step<S>.ckpt` (resume after a kill, and `mxlab branch`: checkpoint.h). Rules:
// - the checkpoints at the step of an intervention or branch (its `at`) are always kept;
// - of the others a run keeps the latest `keep` (kDefaultKeepCheckpoints; kKeepAllCheckpoints
//   keeps every one); older ones are removed as soon as a newer one is written whole. Resume
//   needs only the latest valid one; `mxlab branch` starts from the latest at or before its
//   step, or replays from step 0 when there is none;
// - a run that finishes (complete or diverged) removes its snapshot once its file is closed and
//   reads back whole: nothing resumes a finished run, and `mxlab branch` takes a new snapshot
//   when it opens the file.
// `mxlab gc DIR` applies the same rules to the finished runs of a directory after the fact
// (runs written before these rules, or with another --keep-checkpoints) and removes the
// temporary files of killed writes; it never touches a run that is unfinished, unreadable or
// locked by a live process.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

constexpr int kKeepAllCheckpoints = -1;
constexpr int kDefaultKeepCheckpoints = 2;

// Parses a --keep-checkpoints value: a count >= `min` or "all". Throws mxlab::Error otherwise.
int parse_keep_checkpoints(const std::string& text, int min);
std::string keep_checkpoints_text(int keep);  // "2", "all"

// The checkpoint steps of `steps` that the rule removes: every step not in `kept_steps`,
// except the latest `keep` of them.
std::vector<int64_t> checkpoints_beyond(const std::vector<int64_t>& steps, const std::vector<int64_t>& kept_steps,
                                        int keep);

// Removes the checkpoints of run `run_id` in `dir` beyond the rule (never a temporary file);
// returns the bytes freed. A file that cannot be removed is left with a warning on stderr.
uint64_t prune_checkpoints(const std::string& dir, const std::string& run_id,
                           const std::vector<int64_t>& kept_steps, int keep);

// One file `mxlab gc` removes (or would, with --dry-run).
struct GcItem {
  std::string path;
  uint64_t bytes = 0;
  std::string why;
};
// One run it leaves alone, and why.
struct GcSkip {
  std::string path, why;
};
struct GcResult {
  std::vector<GcItem> removed;  // with dry_run: what would be removed
  std::vector<GcSkip> skipped;
  uint64_t bytes = 0;           // sum of removed[i].bytes
};

// The files the finished runs of `dir` (its `*.h5`, not recursive) no longer need, removed
// unless `dry_run`. Each run is handled under its lock. Throws mxlab::Error when `dir` is not
// a readable directory.
GcResult gc_run_dir(const std::string& dir, int keep, bool dry_run);

}  // namespace mxlab
