// Checkpoint pruning and `mxlab gc` (rules in disk_use.h).
#include "lab/runs/disk_use.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "lab/core/error.h"
#include "lab/io/locks.h"
#include "lab/runs/checkpoint.h"
#include "lab/runs/run_file.h"
#include "lab/runs/run_records.h"

namespace mxlab {

namespace {

bool exists(const std::string& p, uint64_t* bytes) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  *bytes = static_cast<uint64_t>(st.st_size);
  return true;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// `<run_id>.step<digits>.ckpt.tmp` in `dir`: what a killed checkpoint write leaves.
std::vector<std::string> checkpoint_temps(const std::string& dir, const std::string& run_id) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  const std::string prefix = run_id + ".step", tail = ".ckpt.tmp";
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || !ends_with(name, tail) || name.size() <= prefix.size() + tail.size()) continue;
    const std::string num = name.substr(prefix.size(), name.size() - prefix.size() - tail.size());
    if (num.find_first_not_of("0123456789") == std::string::npos) out.push_back(dir + "/" + name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int parse_keep_checkpoints(const std::string& text, int min) {
  if (text == "all") return kKeepAllCheckpoints;
  const std::string fix = msg(" (give a count >= ", min, ", or all)");
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(msg("--keep-checkpoints '", text, "' is not a count", fix));
  const int n = std::stoi(text);
  if (n < min) throw Error(msg("--keep-checkpoints ", n, " is too small", fix));
  return n;
}

std::string keep_checkpoints_text(int keep) { return keep < 0 ? std::string("all") : std::to_string(keep); }

std::vector<int64_t> checkpoints_beyond(const std::vector<int64_t>& steps, const std::vector<int64_t>& kept_steps,
                                        int keep) {
  std::vector<int64_t> others;
  for (int64_t s : steps)
    if (std::find(kept_steps.begin(), kept_steps.end(), s) == kept_steps.end()) others.push_back(s);
  std::sort(others.begin(), others.end());
  if (keep < 0 || others.size() <= static_cast<size_t>(keep)) return {};
  others.resize(others.size() - static_cast<size_t>(keep));
  return others;
}

uint64_t prune_checkpoints(const std::string& dir, const std::string& run_id, const std::vector<int64_t>& kept_steps,
                           int keep) {
  uint64_t freed = 0;
  for (int64_t s : checkpoints_beyond(list_checkpoints(dir, run_id), kept_steps, keep)) {
    const std::string p = checkpoint_path(dir, run_id, s);
    uint64_t bytes = 0;
    if (!exists(p, &bytes)) continue;
    if (::unlink(p.c_str()) == 0) freed += bytes;
    else std::fprintf(stderr, "mxlab: warning: cannot remove old checkpoint %s: %s\n", p.c_str(), std::strerror(errno));
  }
  return freed;
}

GcResult gc_run_dir(const std::string& dir, int keep, bool dry_run) {
  GcResult res;
  for (const RunRecord& scanned : scan_run_dir(dir)) {
    const std::string& path = scanned.path;
    std::string name = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
    const std::string run_id = name.substr(0, name.size() - 3);  // <run_id>.h5: checkpoints are named by it
    const std::string holder = live_lock_holder(dir, run_id);
    if (!holder.empty()) {
      res.skipped.push_back({path, "in use by " + holder});
      continue;
    }
    RunLock lock;
    if (!dry_run && !lock.try_acquire(dir, run_id)) {
      res.skipped.push_back({path, "in use by " + lock.holder()});
      continue;
    }
    // Read again under the lock: what was scanned may have changed since.
    const RunRecord r = dry_run ? scanned : read_run_record(path);
    if (!r.readable) {
      res.skipped.push_back({path, "not readable whole (" + r.error + "): its snapshot and checkpoints may repair it"});
      continue;
    }
    if (!is_finished(r.status)) {
      res.skipped.push_back({path, msg("status ", to_string(r.status), ": resuming it needs its snapshot and checkpoints")});
      continue;
    }
    std::vector<GcItem> items;
    uint64_t bytes = 0;
    const std::string snap = RunFile::snapshot_path(path);
    if (exists(snap, &bytes)) items.push_back({snap, bytes, "snapshot of a finished run"});
    for (const std::string& tmp : {path + ".tmp", snap + ".tmp"})
      if (exists(tmp, &bytes)) items.push_back({tmp, bytes, "temporary file of a killed write"});
    for (const std::string& tmp : checkpoint_temps(dir, run_id))
      if (exists(tmp, &bytes)) items.push_back({tmp, bytes, "temporary file of a killed write"});
    std::vector<int64_t> kept_steps;
    for (const GroupRecord& g : r.groups)
      if (g.branch && g.at >= 0) kept_steps.push_back(g.at);
    for (int64_t s : checkpoints_beyond(list_checkpoints(dir, run_id), kept_steps, keep)) {
      const std::string p = checkpoint_path(dir, run_id, s);
      if (exists(p, &bytes))
        items.push_back({p, bytes, msg("checkpoint beyond --keep-checkpoints ", keep_checkpoints_text(keep))});
    }
    for (GcItem& it : items) {
      if (!dry_run && ::unlink(it.path.c_str()) != 0) {
        res.skipped.push_back({it.path, msg("cannot remove it: ", std::strerror(errno))});
        continue;
      }
      res.bytes += it.bytes;
      res.removed.push_back(std::move(it));
    }
  }
  return res;
}

}  // namespace mxlab
