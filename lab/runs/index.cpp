// <dir>/index.csv: one row per run file, rebuilt from the run files under <dir>/index.lock.
#include "lab/runs/index.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "lab/runs/run_driver.h"
#include "lab/io/table_text.h"

namespace mxlab {

namespace {

constexpr const char* kIndexFile = "index.csv";
constexpr const char* kIndexLockName = "index";  // <dir>/index.lock (run ids are hex, never "index")
constexpr auto kIndexLockPoll = std::chrono::milliseconds(100);

}  // namespace

std::string write_index(const std::string& dir, const std::vector<RunRecord>& runs) {
  const std::vector<std::string> swept = swept_keys(runs);
  std::vector<std::string> header = {"run_id", "status", "steps"};
  header.insert(header.end(), swept.begin(), swept.end());
  for (const char* c : {"divergence_step", "first_nonfinite_step", "final_loss", "min_loss", "branches", "start_time",
                        "end_time", "error", "file"})
    header.push_back(c);
  std::string text = csv_line(header);
  const TableCell cell{true};
  for (const RunRecord& r : runs) {
    std::vector<std::string> row = {r.run_id, to_string(r.status), r.readable ? std::to_string(r.steps) : ""};
    for (const auto& k : swept) {
      bool found = false;
      const std::string v = config_value(r, k, &found);
      row.push_back(found ? format_config_value(v) : "");
    }
    const GroupRecord* mx = r.group("mx");
    row.push_back(mx ? cell.step(mx->divergence_step) : "");
    row.push_back(mx ? cell.step(mx->first_nonfinite_step) : "");
    row.push_back(mx ? cell.num(mx->final_loss) : "");
    row.push_back(mx ? cell.num(mx->min_loss) : "");
    size_t branches = 0;
    for (const auto& g : r.groups) branches += g.branch ? 1 : 0;
    row.push_back(r.readable ? std::to_string(branches) : "");
    row.push_back(r.start_time);
    row.push_back(r.end_time);
    row.push_back(r.error);
    row.push_back(std::filesystem::path(r.path).filename().string());
    text += csv_line(row);
  }
  const std::string path = dir + "/" + kIndexFile;
  write_text_atomically(path, text);
  return path;
}

std::vector<RunRecord> rebuild_index(const std::string& dir) {
  RunLock lock;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kIndexLockWaitSeconds);
  while (!lock.try_acquire(dir, kIndexLockName)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "mxlab: warning: %s/%s.lock is held by %s for more than %d s; writing the index anyway\n",
                   dir.c_str(), kIndexLockName, lock.holder().c_str(), kIndexLockWaitSeconds);
      break;
    }
    std::this_thread::sleep_for(kIndexLockPoll);
  }
  std::vector<RunRecord> runs = scan_run_dir(dir);
  if (!runs.empty()) write_index(dir, runs);  // no index for a directory without runs
  return runs;
}

}  // namespace mxlab
