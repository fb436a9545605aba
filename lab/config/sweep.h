// Experiments: one YAML file -> the list of runs it stands for (DESIGN.md section 7).
//
//   extends: ../base.yaml    # optional: a parent experiment (path relative to this file); this
//                            # file's keys override the parent's, mappings merged key by key
//   base: {...}              # a run configuration; run keys may also sit at the top level
//   steps: 5000              #   (they override `base:`)
//   sweep:
//     grid: {model.width: [256, 512], precision.weight: [mxfp8_e4m3, bf16]}   # cartesian
//     zip: {optimizer.lr: [1e-3, 5e-4], schedule.warmup: [100, 200]}        # varied together
//     seeds: [0, 1, 2]
//
// Expansion order (stable, part of the contract: run indices and shards depend on it): the grid
// as nested loops in the order its keys appear (first key slowest), then each zip position,
// then each seed (fastest). `--set` overrides apply to the base before the sweep and may not
// name a swept key. Interventions in the file apply to every run.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "lab/config/config.h"

namespace mxlab {

struct ExpandedRun {
  int index = 0;   // position in the expansion order
  std::string id;  // config_hash(cfg): the run's output is <out>/<id>.h5
  RunConfig cfg;
  // The swept keys whose values differ between runs, in sweep order, with this run's value as
  // YAML text (e.g. {"model.width", "256"}, {"seed", "1"}). Empty without a sweep.
  std::vector<std::pair<std::string, std::string>> swept;
};

// Every run of an experiment file. Throws mxlab::Error (FILE:LINE: ...) on any problem:
// unknown or repeated sweep keys (with a suggestion), empty lists, zip lists of unequal
// length, `--set` of a swept key, a cyclic or unreadable `extends`, two runs with the same
// resolved configuration, and everything load_config rejects.
std::vector<ExpandedRun> expand_experiment(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from text; `extends` paths are relative to `base_dir`.
std::vector<ExpandedRun> expand_experiment_string(const std::string& text, const std::string& origin,
                                                  const std::vector<std::string>& overrides = {},
                                                  const std::string& base_dir = ".");

// Run `run` (its index in the expansion order, as `mxlab plan` lists it) of an experiment file;
// Error naming the valid range when there is no such run.
RunConfig run_of_experiment(const std::string& path, const std::vector<std::string>& overrides, int run);

// When two runs differ only in `precision` keys (the same seed and every other swept key), each
// trains the same FP32 trajectory again and the recipes are not one run's paired arms: the one
// line that says so and shows the `arms:` form of the first such pair (for `mxlab plan` and
// `mxlab run` to print as a warning); "" when no two runs are like that.
std::string precision_only_sweep_warning(const std::vector<ExpandedRun>& runs);

}  // namespace mxlab
