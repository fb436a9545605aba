// `mxlab export RUN.h5 --csv DIR`: every trajectory's and branch's datasets as flat CSV files.
#include "lab/report/csv_export.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/runs/run_driver.h"
#include "lab/runs/run_records.h"
#include "lab/io/table_text.h"

namespace mxlab {

namespace {

constexpr const char* kLossAll = "loss_all";
constexpr const char* kStep = "step";

// A part of an output file name made from text read in the file (the run id, a group's name):
// letters, digits, '-', '_' and '.' kept (not a leading '.'), anything else '_', so that no file
// lands outside DIR, however the file was made.
std::string file_part(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  if (!s.empty() && s[0] == '.') s[0] = '_';
  return s;
}

}  // namespace

std::vector<std::string> export_run_csv(const std::string& run_path, const std::string& out_dir) {
  const RunRecord rec = read_run_record(run_path);
  if (!rec.readable) throw Error(msg(run_path, ": ", rec.error));
  {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec) throw Error(msg("cannot create directory ", out_dir, ": ", ec.message()));
  }
  std::vector<std::pair<std::string, std::string>> files;  // path, text
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::H5File f(run_path, h5::H5File::Mode::read);
    for (const GroupRecord& g : rec.groups) {
      const std::string tag = file_part(g.branch ? "branch-" + g.name : g.name);
      const std::string prefix = out_dir + "/" + file_part(rec.run_id) + "_" + tag;
      // One table per step axis: the logged rows (`step`) in <prefix>.csv, a series with its own
      // axis (SCHEMA.md: `shadow_step`, `curvature_step`; its datasets carry `axis`) in
      // <prefix>_<series>.csv.
      std::map<std::string, std::vector<std::string>> by_axis;  // axis dataset -> its datasets
      for (const std::string& d : f.list_datasets(g.h5_path)) {
        if (d == kLossAll) continue;
        const std::string p = g.h5_path + "/" + d;
        const bool is_axis = d == kStep || (d.size() > 5 && d.compare(d.size() - 5, 5, "_step") == 0);
        if (is_axis) {
          by_axis[d];
          continue;
        }
        by_axis[f.has_attr(p, "axis") ? f.get_attr_string(p, "axis") : std::string(kStep)].push_back(d);
      }
      for (auto& [axis, names] : by_axis) {
        const std::string step_ds = g.h5_path + "/" + axis;
        if (!f.is_dataset(step_ds)) continue;
        const std::vector<int64_t> steps = f.read_int64s(step_ds);
        std::stable_partition(names.begin(), names.end(), [](const std::string& d) { return d == "loss"; });
        struct Col {
          std::vector<double> values;
          size_t width = 1, offset = 0;
        };
        std::vector<std::string> header = {axis};
        std::vector<Col> cols;
        size_t rows = steps.size();
        for (const std::string& d : names) {
          const std::string p = g.h5_path + "/" + d;
          const std::vector<uint64_t> shape = f.dataset_shape(p);
          if (shape.empty() || shape.size() > 2) continue;
          const std::vector<double> values = f.read_doubles(p);
          rows = std::min<size_t>(rows, static_cast<size_t>(shape[0]));
          const size_t width = shape.size() == 2 ? static_cast<size_t>(shape[1]) : 0;
          const std::vector<std::string> group_names =
              width && f.has_attr(p, "names") ? f.get_attr_strings(p, "names") : std::vector<std::string>{};
          if (width == 0) {
            header.push_back(d);
            cols.push_back({values, 1, 0});
          }
          for (size_t k = 0; k < width; ++k) {
            header.push_back(group_names.size() == width ? d + "_" + group_names[k] : msg(d, "_layer", k));
            cols.push_back({values, width, k});
          }
        }
        if (rows < steps.size())
          std::fprintf(stderr, "mxlab: warning: %s: datasets of %s (axis %s) have different lengths (a run that was "
                       "killed?); exporting the first %zu rows that all have\n",
                       run_path.c_str(), g.h5_path.c_str(), axis.c_str(), rows);
        std::string text = csv_line(header);
        for (size_t i = 0; i < rows; ++i) {
          text += std::to_string(steps[i]);
          for (const Col& c : cols) text += "," + csv_number(c.values[i * c.width + c.offset]);
          text += "\n";
        }
        const std::string suffix = axis == kStep ? "" : "_" + axis.substr(0, axis.size() - 5);
        files.emplace_back(prefix + suffix + ".csv", text);
      }
      const std::string all = g.h5_path + "/" + kLossAll;
      if (f.is_dataset(all)) {
        const int64_t first = g.branch && g.at > 0 ? g.at : 0;
        std::string text = "step,loss\n";
        const std::vector<double> loss = f.read_doubles(all);
        for (size_t i = 0; i < loss.size(); ++i)
          text += std::to_string(first + static_cast<int64_t>(i)) + "," + csv_number(loss[i]) + "\n";
        files.emplace_back(prefix + "_loss_all.csv", text);
      }
    }
  }
  std::string summary = csv_line({"run_id", "group", "at", "status", "steps_run", "first_nonfinite_step",
                                  "divergence_step", "spike_count", "spike_score", "final_loss", "min_loss",
                                  "max_bias_ratio", "max_gamma_lastbin", "source"});
  for (const GroupRecord& g : rec.groups)
    summary += csv_line({rec.run_id, g.name, g.branch ? std::to_string(g.at) : "", to_string(rec.status),
                         std::to_string(g.steps_run), std::to_string(g.first_nonfinite_step),
                         std::to_string(g.divergence_step), std::to_string(g.spike_count), csv_number(g.spike_score),
                         csv_number(g.final_loss), csv_number(g.min_loss), csv_number(g.max_bias_ratio),
                         csv_number(g.max_gamma_lastbin), g.source});
  files.emplace_back(out_dir + "/" + file_part(rec.run_id) + "_summary.csv", summary);
  std::vector<std::string> written;
  for (const auto& [p, text] : files) {
    write_text_atomically(p, text);
    written.push_back(p);
  }
  return written;
}

}  // namespace mxlab
