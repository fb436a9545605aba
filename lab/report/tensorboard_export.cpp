// `mxlab export RUN_OR_DIR --tensorboard OUTDIR`: the datasets of run files as TensorBoard
// scalar summaries, one event file per trajectory and branch.
#include "lab/report/tensorboard_export.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/io/locks.h"
#include "lab/io/table_text.h"
#include "lab/io/tfevents.h"
#include "lab/runs/run_records.h"

namespace mxlab {

namespace {

constexpr const char* kLossAll = "loss_all";
constexpr const char* kStep = "step";

// A directory name made from text read in the file: letters, digits, '-', '_', '.' kept (not a
// leading '.'), anything else '_', so that nothing lands outside OUT.
std::string dir_part(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  if (!s.empty() && s[0] == '.') s[0] = '_';
  return s.empty() ? "_" : s;
}

bool is_axis(const std::string& d) {
  return d == kStep || (d.size() > 5 && d.compare(d.size() - 5, 5, "_step") == 0);
}

// "2026-11-26T23:43:26Z" -> seconds since the epoch; 0 when it does not parse.
int64_t epoch_of(const std::string& utc) {
  std::tm tm{};
  if (!strptime(utc.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm)) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

std::vector<std::string> export_one(const std::string& run_path, const std::string& out_dir) {
  const RunRecord rec = read_run_record(run_path);
  if (!rec.readable) throw Error(msg(run_path, ": ", rec.error));
  const int64_t start = epoch_of(rec.start_time);
  std::vector<std::pair<std::string, std::string>> files;  // path, bytes
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::H5File f(run_path, h5::H5File::Mode::read);
    for (const GroupRecord& g : rec.groups) {
      std::map<int64_t, std::vector<std::pair<std::string, double>>> by_step;
      for (const std::string& d : f.list_datasets(g.h5_path)) {
        if (d == kLossAll || is_axis(d)) continue;
        const std::string p = g.h5_path + "/" + d;
        const std::string axis = f.has_attr(p, "axis") ? f.get_attr_string(p, "axis") : std::string(kStep);
        const std::string axis_path = g.h5_path + "/" + axis;
        if (!f.is_dataset(axis_path)) continue;
        const std::vector<uint64_t> shape = f.dataset_shape(p);
        if (shape.empty() || shape.size() > 2) continue;
        const std::vector<int64_t> steps = f.read_int64s(axis_path);
        const std::vector<double> values = f.read_doubles(p);
        const size_t width = shape.size() == 2 ? static_cast<size_t>(shape[1]) : 1;
        const std::vector<std::string> names =
            shape.size() == 2 && f.has_attr(p, "names") ? f.get_attr_strings(p, "names") : std::vector<std::string>{};
        const size_t rows = std::min<size_t>(steps.size(), static_cast<size_t>(shape[0]));
        for (size_t i = 0; i < rows; ++i)
          for (size_t k = 0; k < width; ++k) {
            const std::string tag = shape.size() == 1 ? d
                                    : names.size() == width ? d + "/" + names[k]
                                                            : msg(d, "/layer", k);
            by_step[steps[i]].emplace_back(tag, values[i * width + k]);
          }
      }
      const std::string all = g.h5_path + "/" + kLossAll;
      if (f.is_dataset(all)) {
        const int64_t first = g.branch && g.at > 0 ? g.at : 0;
        const std::vector<double> loss = f.read_doubles(all);
        for (size_t i = 0; i < loss.size(); ++i) by_step[first + static_cast<int64_t>(i)].emplace_back(kLossAll, loss[i]);
      }
      tfevents::EventFile ev(static_cast<double>(start));
      for (const auto& [step, values] : by_step) ev.add_scalars(step, values);
      const std::string dir = out_dir + "/" + dir_part(rec.run_id) + "/" + dir_part(g.branch ? "branch-" + g.name : g.name);
      files.emplace_back(dir + "/events.out.tfevents." + std::to_string(start) + ".mxlab", ev.bytes());
    }
  }
  std::vector<std::string> written;
  for (const auto& [p, bytes] : files) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path(), ec);
    if (ec) throw Error(msg("cannot create directory ", std::filesystem::path(p).parent_path().string(), ": ", ec.message()));
    write_text_atomically(p, bytes);
    written.push_back(p);
  }
  return written;
}

}  // namespace

std::vector<std::string> export_run_tensorboard(const std::string& run_or_dir, const std::string& out_dir) {
  std::vector<std::string> written;
  if (!std::filesystem::is_directory(run_or_dir)) return export_one(run_or_dir, out_dir);
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(run_or_dir))
    if (e.is_regular_file() && e.path().extension() == ".h5") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) throw Error(msg(run_or_dir, ": no run files (*.h5) here to export"));
  for (const std::string& p : paths) {
    const RunRecord rec = read_run_record(p);
    if (!rec.readable) {  // a run in progress, a damaged file: the others are still exported
      std::fprintf(stderr, "mxlab: warning: %s left out of the TensorBoard export: %s\n", p.c_str(), rec.error.c_str());
      continue;
    }
    for (std::string& w : export_one(p, out_dir)) written.push_back(std::move(w));
  }
  return written;
}

}  // namespace mxlab
