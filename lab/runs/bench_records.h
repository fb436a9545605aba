// What `mxlab bench` measured, one record per quantity, as a CSV table (`mxlab bench --csv FILE`)
// and as the bench cache that `mxlab plan` predicts device time from: one small JSON file per
// device, by default $XDG_CACHE_HOME/mxlab/bench/<device>.json ($HOME/.cache when XDG_CACHE_HOME
// is unset), e.g. ~/.cache/mxlab/bench/NVIDIA_H100_80GB_HBM3.json.
//
// The cache file (JSON; read back with yaml-cpp, JSON being YAML):
//   {"format": "mxlab-bench-cache", "version": 1, "device": "NVIDIA H100 80GB HBM3",
//    "records": [{"quantity": "mx_step_ms", "value": 0.983, "unit": "ms", "arms": 0,
//                 "shadow_every": 0, "device": ..., "backend": "cuda:0", "revision": "e3ab3a5c1d2f",
//                 "command": "mxlab bench ...", "config": "/abs/path/exp.yaml",
//                 "shape": "mlp layernorm L4 d512 H2048 tokens2048", "step_gflop": 103.08,
//                 "measured_at": "2026-11-28T10:00:00Z"}, ...]}
// A bench adds its records to the file of its device, replacing those of the same quantity,
// configuration file and shape (so a file keeps the latest measurement of every quantity of every
// configuration benched there).
#pragma once
#include <string>
#include <vector>

namespace mxlab {

struct BenchRecord {
  std::string quantity;     // e.g. mx_step_ms, per_extra_arm_ms (lab/cli/cmd_bench.cpp's JSON keys)
  double value = 0.0;
  std::string unit;         // ms | ratio | count
  int arms = 0;             // the MX arms of the trainer step it timed (0: not a whole trainer step)
  int shadow_every = 0;     // that step's shadow cadence (0: not a whole trainer step)
  std::string device;       // the GPU's model name, or "cpu"
  std::string backend;      // the backend's name (cuda:0 (...), cpu)
  std::string revision;     // the git commit the binary was built from
  std::string command;      // the command line that measured it
  std::string config;       // the experiment file (absolute path); empty for the built-in defaults
  std::string shape;        // cost_shape_key() of the benched run (lab/runs/cost_estimate.h)
  double step_gflop = 0.0;  // GEMM GFLOP of one forward + backward of that student
  std::string measured_at;  // UTC, ISO 8601 (2026-11-28T10:00:00Z)
};

// Whether the record's trainer step timed K copies of the experiment's base recipe (its command
// passed `--arms K`) rather than the experiment's own `arms:` (recipe-specific costs).
bool bench_arms_were_copies(const BenchRecord& r);

// A header line and one CSV line per record (columns: the fields above, in order).
std::string bench_records_csv(const std::vector<BenchRecord>& records);

// The cache file's text (format above).
std::string bench_cache_json(const std::string& device, const std::vector<BenchRecord>& records);

// The records of a cache file. Throws mxlab::Error (exit 2) naming the file and what is wrong when
// it cannot be read or is not a bench cache file.
struct BenchCache {
  std::string path, device;
  std::vector<BenchRecord> records;
  std::string latest() const;  // the newest measured_at of its records ("" when none)
};
BenchCache read_bench_cache(const std::string& path);

// `old` with every record of `fresh` added, replacing an old one of the same quantity, config
// and shape.
std::vector<BenchRecord> merge_bench_records(const std::vector<BenchRecord>& old, const std::vector<BenchRecord>& fresh);

// Adds `fresh` to the cache file `path` (created with its directories; a file there that is not a
// readable cache is replaced). Throws IoError (exit 74) when it cannot be written.
void write_bench_cache(const std::string& path, const std::string& device, const std::vector<BenchRecord>& fresh);

// The folder of the cache: $XDG_CACHE_HOME/mxlab/bench, else $HOME/.cache/mxlab/bench; "" when
// neither variable is set (or is a relative path, which the XDG specification says to ignore).
std::string default_bench_dir();
// The cache file's name for a device: letters and digits kept, every other run of bytes one '_',
// then ".json" ("NVIDIA H100 80GB HBM3" -> NVIDIA_H100_80GB_HBM3.json).
std::string bench_file_name(const std::string& device);

// An experiment file as records name it: its absolute path, links resolved ("" for none).
std::string bench_config_path(const std::string& path);

// Now in UTC as ISO 8601, to the second.
std::string utc_now_iso();

}  // namespace mxlab
