// Snapshots -> .npy (see snapshot_export.h).
#include "lab/report/snapshot_export.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/io/npy.h"
#include "lab/config/names.h"

namespace mxlab {

namespace {

constexpr const char* kRoot = "snapshots";
constexpr const char* kStepPrefix = "step_";

// One dataset as float32 with its shape (snapshots are stored as float32: the copy is exact).
void dataset_to_npy(const h5::H5File& f, const std::string& path, const std::string& out) {
  const std::vector<uint64_t> shape = f.dataset_shape(path);
  const std::vector<double> v = f.read_doubles(path);
  const std::vector<float> data(v.begin(), v.end());
  write_npy(out, std::vector<int64_t>(shape.begin(), shape.end()), data.data());
}

void make_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(msg("cannot create directory ", dir, ": ", ec.message()));
}

}  // namespace

std::vector<int64_t> snapshot_steps_in(const std::string& run) {
  const h5::H5File f(run, h5::H5File::Mode::read);
  std::set<int64_t> steps;
  if (!f.is_group(kRoot)) return {};
  for (const std::string& t : f.list_groups(kRoot))
    for (const std::string& s : f.list_groups(std::string(kRoot) + "/" + t))
      if (s.rfind(kStepPrefix, 0) == 0) steps.insert(std::stoll(s.substr(5)));
  return {steps.begin(), steps.end()};
}

std::vector<std::string> export_snapshot_npy(const std::string& run, int64_t step, const std::string& dir) {
  const std::vector<int64_t> have = snapshot_steps_in(run);
  if (std::find(have.begin(), have.end(), step) == have.end()) {
    std::string list;
    for (int64_t s : have) list += (list.empty() ? "" : ", ") + std::to_string(s);
    throw Error(msg(run, " has no snapshot at step ", step,
                    have.empty() ? std::string(" (it has none: run with log.snapshot_steps or log.snapshot_every set)")
                                 : msg(" (snapshots at steps ", list, ")")));
  }
  const h5::H5File f(run, h5::H5File::Mode::read);
  std::vector<std::string> written;
  const std::string at = kStepPrefix + std::to_string(step);
  const std::vector<std::string> trajectories = f.list_groups(kRoot);
  // Each becomes a directory under DIR: only plain names (never '.' or '..', lab/config/names.h),
  // checked before anything is written.
  for (const std::string& t : trajectories)
    if (const std::string p = plain_name_problem(t); !p.empty())
      throw Error(msg(run, ": snapshots/", quoted_name(t), " is not a trajectory name: it ", p,
                      "; the file is damaged or was not written by mxlab, nothing was exported"));
  for (const std::string& t : trajectories) {
    const std::string g = std::string(kRoot) + "/" + t + "/" + at;
    if (!f.is_group(g)) continue;
    for (const std::string& sub : {std::string(), std::string("m"), std::string("v")}) {
      const std::string src = sub.empty() ? g : g + "/" + sub;
      if (!f.is_group(src)) continue;
      const std::string out = dir + "/" + t + (sub.empty() ? "" : "/" + sub);
      make_dir(out);
      for (const std::string& d : f.list_datasets(src)) {
        const std::string path = out + "/" + d + ".npy";
        dataset_to_npy(f, src + "/" + d, path);
        written.push_back(path);
      }
    }
  }
  make_dir(dir);
  for (const char* p : {"probe_x", "probe_y"}) {
    const std::string src = std::string(kRoot) + "/" + p;
    if (!f.is_dataset(src)) continue;
    const std::string path = dir + "/" + p + ".npy";
    dataset_to_npy(f, src, path);
    written.push_back(path);
  }
  return written;
}

}  // namespace mxlab
