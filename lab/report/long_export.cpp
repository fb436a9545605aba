// `mxlab export DIR --long OUT.csv`: the run files of a results directory as one long table.
#include "lab/report/long_export.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/io/locks.h"
#include "lab/io/out_file.h"
#include "lab/io/table_text.h"
#include "lab/io/writable_dir.h"
#include "lab/runs/run_records.h"

namespace mxlab {

namespace {

constexpr const char* kLossAll = "loss_all";
constexpr const char* kStep = "step";
constexpr const char* kSeed = "seed";
constexpr const char* kFp32 = "fp32";
constexpr size_t kBufferBytes = 1 << 20;

bool is_axis(const std::string& d) {
  return d == kStep || (d.size() > 5 && d.compare(d.size() - 5, 5, "_step") == 0);
}

// The output: a temp file beside OUT (created fresh, never through a link), renamed over OUT by
// commit(); removed when destroyed before that.
class AtomicOut {
 public:
  explicit AtomicOut(const std::string& path) : path_(path) {
    tmp_ = msg(path, ".tmp.", ::getpid());
    const int fd = create_fresh_file(tmp_, path_);
    f_ = ::fdopen(fd, "wb");
    if (!f_) {
      const int e = errno;
      ::close(fd);
      std::remove(tmp_.c_str());
      throw_io_error("write", path_, e);
    }
    std::setvbuf(f_, nullptr, _IOFBF, kBufferBytes);
  }
  ~AtomicOut() {
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  AtomicOut(const AtomicOut&) = delete;
  AtomicOut& operator=(const AtomicOut&) = delete;

  void write(const std::string& s) {
    if (std::fwrite(s.data(), 1, s.size(), f_) != s.size()) throw_io_error("write", path_, errno);
  }
  void commit() {
    const bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
    const int err = errno;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok || !closed) throw_io_error("write", path_, ok ? errno : err);
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) throw_io_error("write", path_, errno);
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// The run's seed: root attribute `seed`, else the configuration's.
std::string seed_of(const h5::H5File& f, const RunRecord& r) {
  if (f.has_attr("/", kSeed)) return std::to_string(f.get_attr_uint64("/", kSeed));
  bool found = false;
  const std::string v = config_value(r, kSeed, &found);
  return found ? v : "";
}

// Every row of one trajectory or branch, `prefix` being its identifying cells with a trailing
// comma.
size_t write_group(h5::H5File& f, const RunRecord& rec, const GroupRecord& g, const std::string& prefix,
                   AtomicOut& out) {
  std::map<std::string, std::vector<std::string>> by_axis;  // axis dataset -> its datasets
  for (const std::string& d : f.list_datasets(g.h5_path)) {
    if (d == kLossAll) continue;
    if (is_axis(d)) {
      by_axis[d];
      continue;
    }
    const std::string p = g.h5_path + "/" + d;
    by_axis[f.has_attr(p, "axis") ? f.get_attr_string(p, "axis") : std::string(kStep)].push_back(d);
  }
  std::vector<std::string> axes;
  if (by_axis.count(kStep)) axes.push_back(kStep);
  for (const auto& kv : by_axis)
    if (kv.first != kStep) axes.push_back(kv.first);
  size_t written = 0;
  std::string line;
  for (const std::string& axis : axes) {
    std::vector<std::string>& names = by_axis[axis];
    const std::string step_ds = g.h5_path + "/" + axis;
    if (!f.is_dataset(step_ds) || names.empty()) continue;
    const std::vector<int64_t> steps = f.read_int64s(step_ds);
    std::stable_partition(names.begin(), names.end(), [](const std::string& d) { return d == "loss"; });
    // Rows that every dataset of the axis has.
    size_t rows = steps.size();
    std::vector<std::string> kept;
    for (const std::string& d : names) {
      const std::vector<uint64_t> shape = f.dataset_shape(g.h5_path + "/" + d);
      if (shape.empty() || shape.size() > 2) continue;
      rows = std::min<size_t>(rows, static_cast<size_t>(shape[0]));
      kept.push_back(d);
    }
    if (rows < steps.size())
      std::fprintf(stderr, "mxlab: warning: %s: datasets of %s (axis %s) have different lengths (a run that was "
                   "killed?); exporting the first %zu rows that all have\n",
                   rec.path.c_str(), g.h5_path.c_str(), axis.c_str(), rows);
    std::vector<std::string> step_text(rows);
    for (size_t i = 0; i < rows; ++i) step_text[i] = prefix + std::to_string(steps[i]) + ",";
    for (const std::string& d : kept) {
      const std::string p = g.h5_path + "/" + d;
      const std::vector<uint64_t> shape = f.dataset_shape(p);
      const size_t width = shape.size() == 2 ? static_cast<size_t>(shape[1]) : 0;
      const std::vector<std::string> group_names =
          width && f.has_attr(p, "names") ? f.get_attr_strings(p, "names") : std::vector<std::string>{};
      const std::vector<double> values = f.read_doubles(p);
      for (size_t k = 0; k < std::max<size_t>(width, 1); ++k) {
        const std::string column = width == 0                     ? std::string()
                                   : group_names.size() == width ? group_names[k]
                                                                 : msg("layer", k);
        const std::string mid = csv_field(d) + "," + csv_field(column) + ",";
        for (size_t i = 0; i < rows; ++i) {
          line = step_text[i];
          line += mid;
          line += csv_number(values[i * std::max<size_t>(width, 1) + k]);
          line += '\n';
          out.write(line);
        }
        written += rows;
      }
    }
  }
  const std::string all = g.h5_path + "/" + kLossAll;
  if (f.is_dataset(all)) {
    const int64_t first = g.branch && g.at > 0 ? g.at : 0;
    const std::vector<double> loss = f.read_doubles(all);
    const std::string mid = std::string(",") + kLossAll + ",,";
    for (size_t i = 0; i < loss.size(); ++i) {
      line = prefix;
      line += std::to_string(first + static_cast<int64_t>(i));
      line += mid;
      line += csv_number(loss[i]);
      line += '\n';
      out.write(line);
    }
    written += loss.size();
  }
  return written;
}

}  // namespace

LongExportResult export_long_csv(const std::string& input, const std::string& out_path) {
  struct stat st {};
  if (::stat(input.c_str(), &st) != 0)
    throw Error(msg(input, ": no such file or directory (give a results directory or a run file)"));
  std::vector<RunRecord> runs;
  if (S_ISDIR(st.st_mode)) runs = scan_run_dir(input);
  else runs.push_back(read_run_record(input));
  LongExportResult res;
  std::vector<RunRecord> readable;
  for (RunRecord& r : runs) {
    if (r.readable) readable.push_back(std::move(r));
    else res.left_out.push_back(msg(std::filesystem::path(r.path).filename().string(), ": ", r.error));
  }
  if (readable.empty()) {
    if (runs.size() == 1) throw Error(msg(runs[0].path, ": ", runs[0].error));
    throw Error(msg(input, runs.empty() ? ": no .h5 run files in this directory (give the --out directory of mxlab run)"
                                        : ": none of its run files can be read"));
  }
  std::vector<std::string> keys;
  for (const std::string& k : swept_keys(readable))
    if (k != kSeed) keys.push_back(k);

  std::error_code ec;
  if (std::filesystem::is_directory(out_path, ec))
    throw Error(msg("--long ", out_path, ": is a directory; give the name of the CSV file to write (e.g. ", out_path,
                    "/long.csv)"));
  const std::string parent = std::filesystem::path(out_path).parent_path().string();
  if (!parent.empty()) ensure_writable_dir(parent);

  AtomicOut out(out_path);
  std::vector<std::string> header = {"run_id"};
  header.insert(header.end(), keys.begin(), keys.end());
  for (const char* c : {"seed", "trajectory", "kind", "arm", "step", "metric", "column", "value"}) header.push_back(c);
  out.write(csv_line(header));
  for (const RunRecord& r : readable) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::H5File f(r.path, h5::H5File::Mode::read);
    std::string run_cells = csv_field(r.run_id) + ",";
    for (const std::string& k : keys) {
      bool found = false;
      const std::string v = config_value(r, k, &found);
      run_cells += csv_field(v) + ",";
    }
    run_cells += csv_field(seed_of(f, r)) + ",";
    for (const GroupRecord& g : r.groups) {
      const bool fp32 = !g.branch && g.name == kFp32;
      std::string arm = g.name;
      if (g.branch) arm = f.has_attr(g.h5_path, "from") ? f.get_attr_string(g.h5_path, "from") : "mx";
      const std::string prefix = run_cells + csv_field(g.name) + "," + (fp32 ? "fp32" : g.branch ? "branch" : "arm") +
                                 "," + csv_field(arm) + ",";
      res.rows += write_group(f, r, g, prefix, out);
    }
    ++res.runs;
  }
  out.commit();
  return res;
}

}  // namespace mxlab
