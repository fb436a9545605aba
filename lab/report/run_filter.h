// `mxlab summarize DIR --where KEY=VALUE`: keeping the runs of a results directory whose
// configuration has given values, with the semantics of the Python side's `--where`
// (analysis/mxlab/sweep.py): numbers compared as numbers (6e-4 matches 0.0006, to a
// relative 1e-6), true/false in any case, anything else as text (quotes around VALUE dropped).
#pragma once
#include <string>
#include <vector>

#include "lab/runs/run_records.h"

namespace mxlab {

struct WhereClause {
  std::string key, value;
};

// "optimizer.lr=6e-4" -> {optimizer.lr, 6e-4} (spaces around either trimmed). Throws
// mxlab::Error (one line) when there is no '=' or no key.
WhereClause parse_where(const std::string& text);

// Whether configuration value `have` (as run_records prints it) matches `want`.
bool config_value_matches(const std::string& have, const std::string& want);

// The runs that match every clause. Runs whose configuration could not be read are dropped
// (nothing can be said about their values). Throws mxlab::Error (one line) when a readable run's
// configuration lacks a clause's key (naming the keys that differ between the runs), and when no
// run matches (naming the values the key has here).
std::vector<RunRecord> filter_runs(std::vector<RunRecord> runs, const std::vector<WhereClause>& where);

}  // namespace mxlab
