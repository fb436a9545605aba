// Run records, summaries, index.csv and CSV export, all read back from the HDF5 run files.
#include "lab/train/index.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/train/config_io.h"
#include "lab/train/run_driver.h"
#include "lab/train/summary.h"
#include "lab/train/yaml_tree.h"
#include "lab/core/text_table.h"

namespace mxlab {

namespace {

constexpr const char* kTrajectories = "trajectories";
constexpr const char* kBranches = "branches";
constexpr const char* kLossAll = "loss_all";
constexpr const char* kStep = "step";
constexpr const char* kIndexFile = "index.csv";
constexpr const char* kIndexLockName = "index";  // <dir>/index.lock (run ids are hex, never "index")
constexpr auto kIndexLockPoll = std::chrono::milliseconds(100);
constexpr int kTextFloatDigits = 4;  // significant digits of floats in the text table
// Attributes the trainer writes when a trajectory ends (lab/train/SCHEMA.md).
const char* const kSummaryAttrs[] = {"steps_run",   "first_nonfinite_step", "divergence_step", "spike_count",
                                     "spike_score", "final_loss",           "min_loss"};

const double kNaN = std::nan("");

std::string stem(const std::string& path) {
  std::string base = std::filesystem::path(path).filename().string();
  const auto dot = base.rfind(".h5");
  return dot == std::string::npos ? base : base.substr(0, dot);
}

std::string dir_of(const std::string& path) {
  const std::string d = std::filesystem::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

// Finite maximum of a dataset (NaN when absent or without a finite value).
double finite_max(const h5::H5File& f, const std::string& ds) {
  if (!f.is_dataset(ds)) return kNaN;
  double m = kNaN;
  for (double v : f.read_doubles(ds))
    if (std::isfinite(v) && (std::isnan(m) || v > m)) m = v;
  return m;
}

GroupRecord read_group(const h5::H5File& f, const std::string& h5_path, const std::string& name, bool branch,
                       double divergence_factor, double spike_factor) {
  GroupRecord g;
  g.name = name;
  g.h5_path = h5_path;
  g.branch = branch;
  if (f.has_attr(h5_path, "at")) g.at = f.get_attr_int64(h5_path, "at");
  bool from_file = true;
  for (const char* a : kSummaryAttrs) from_file = from_file && f.has_attr(h5_path, a);
  if (from_file) {
    g.steps_run = f.get_attr_int64(h5_path, "steps_run");
    g.first_nonfinite_step = f.get_attr_int64(h5_path, "first_nonfinite_step");
    g.divergence_step = f.get_attr_int64(h5_path, "divergence_step");
    g.spike_count = f.get_attr_int64(h5_path, "spike_count");
    g.spike_score = f.get_attr_double(h5_path, "spike_score");
    g.final_loss = f.get_attr_double(h5_path, "final_loss");
    g.min_loss = f.get_attr_double(h5_path, "min_loss");
    g.source = "file";
  } else {
    // A run that did not end (killed): the same definitions on what was written.
    g.source = "computed";
    const std::string all = h5_path + "/" + kLossAll, loss = h5_path + "/loss", step = h5_path + "/" + kStep;
    std::vector<float> hist;
    std::vector<int64_t> steps;  // absolute step of each hist entry when it is not contiguous
    int64_t first = 0;
    if (f.is_dataset(all) && f.dataset_shape(all)[0] > 0) {
      for (double v : f.read_doubles(all)) hist.push_back(static_cast<float>(v));
      first = branch && g.at > 0 ? g.at : 0;
    } else if (f.is_dataset(loss) && f.is_dataset(step)) {
      for (double v : f.read_doubles(loss)) hist.push_back(static_cast<float>(v));
      steps = f.read_int64s(step);
      const size_t n = std::min(hist.size(), steps.size());
      hist.resize(n);
      steps.resize(n);
    }
    const LossSummary s = summarize_losses(hist, first, divergence_factor, spike_factor);
    auto absolute = [&](int64_t t) { return t < 0 || steps.empty() ? t : steps[static_cast<size_t>(t)]; };
    g.steps_run = static_cast<int64_t>(hist.size());
    g.first_nonfinite_step = absolute(s.first_nonfinite_step);
    g.divergence_step = absolute(s.divergence_step);
    g.spike_count = s.spike_count;
    g.spike_score = s.spike_score;
    g.final_loss = hist.empty() ? kNaN : s.final_loss;
    g.min_loss = hist.empty() ? kNaN : s.min_loss;
  }
  g.max_bias_ratio = name == "fp32" && !branch ? kNaN : finite_max(f, h5_path + "/bias_ratio");
  g.max_gamma_lastbin = finite_max(f, h5_path + "/gamma_lastbin");
  return g;
}

void flatten(const YNode& n, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (n.is_map()) {
    for (const YEntry& e : n.map) flatten(e.value, prefix.empty() ? e.key : prefix + "." + e.key, out);
  } else if (n.is_scalar()) {
    out.emplace_back(prefix, n.text);
  } else if (n.is_seq()) {
    out.emplace_back(prefix, n.flow());
  } else {
    out.emplace_back(prefix, "");
  }
}

// The resolved configuration, canonical: parsed and printed again by this build, so that two
// files that wrote the same values differently compare equal. Files this build cannot parse
// (another schema) fall back to their text as written.
std::vector<std::pair<std::string, std::string>> canonical_config(const std::string& yaml, const std::string& origin,
                                                                  double* divergence_factor, double* spike_factor) {
  std::vector<std::pair<std::string, std::string>> out;
  if (yaml.empty()) return out;
  std::string text = yaml;
  try {
    const RunConfig cfg = config_from_yaml_string(yaml, origin);
    text = dump_config(cfg);
    *divergence_factor = cfg.log.divergence_factor;
    *spike_factor = cfg.log.spike_factor;
  } catch (const Error&) {
  }
  try {
    flatten(yaml_parse(text, origin), "", out);
  } catch (const Error&) {
  }
  return out;
}

bool is_int_text(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  if (i >= s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

bool is_float_text(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return *end == '\0' && s.find_first_of("0123456789") != std::string::npos;
}

// A config value as a short label, like analysis/mxlab_analysis/yamlcfg.format_value
// (6e-4 -> "0.0006", 1.0e-05 -> "1e-05", true -> "True").
std::string format_config_value(const std::string& text) {
  if (text == "true") return "True";
  if (text == "false") return "False";
  double v = 0;
  if (!is_int_text(text) && is_float_text(text, &v)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }
  return text;
}

// The shortest decimal that reads back to the same double, spelled like Python's repr():
// fixed notation for exponents in [-4, 16), else d.ddde+XX; integral values keep ".0".
std::string shortest_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  int p = 1;
  for (; p < 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", p - 1, v);
  // buf: [-]d[.ddd]e[+-]XX
  std::string s = buf;
  const bool neg = s[0] == '-';
  if (neg) s = s.substr(1);
  const auto e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_line(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + csv_field(cells[i]);
  return line + "\n";
}


// Cells of the summary table.
struct Cell {
  bool csv;
  std::string none() const { return csv ? "" : "-"; }
  std::string step(int64_t s) const { return s < 0 ? (csv ? "-1" : "-") : std::to_string(s); }
  std::string num(double v) const {
    if (std::isnan(v)) return none();
    if (csv) return shortest_repr(v);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", kTextFloatDigits, v);
    return buf;
  }
  std::string text(const std::string& s) const { return s.empty() ? none() : s; }
};

std::string config_value(const RunRecord& r, const std::string& key, bool* found) {
  for (const auto& [k, v] : r.config)
    if (k == key) {
      *found = true;
      return v;
    }
  *found = false;
  return "";
}

}  // namespace

const GroupRecord* RunRecord::group(const std::string& name) const {
  for (const auto& g : groups)
    if (g.name == name && !g.branch) return &g;
  for (const auto& g : groups)
    if (g.name == name) return &g;
  return nullptr;
}

RunRecord read_run_record(const std::string& path) {
  RunRecord rec;
  rec.path = path;
  rec.run_id = stem(path);
  try {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::H5File f(path, h5::H5File::Mode::read);
    if (!f.has_attr("/", "schema_version")) throw Error(msg(path, ": no schema_version attribute: not an mxlab run file"));
    auto str = [&](const char* name) { return f.has_attr("/", name) ? f.get_attr_string("/", name) : std::string(); };
    if (!str("run_id").empty()) rec.run_id = str("run_id");
    rec.status = str("status");
    rec.error = str("error");
    rec.start_time = str("start_time");
    rec.end_time = str("end_time");
    if (f.has_attr("/", "steps")) rec.steps = f.get_attr_int64("/", "steps");
    double div = LogConfig{}.divergence_factor, spike = LogConfig{}.spike_factor;
    rec.config = canonical_config(str("config_yaml"), path, &div, &spike);
    for (const auto& [k, v] : rec.config)
      if (k == "name") rec.name = v;
    for (const char* t : {"fp32", "mx"}) {
      const std::string p = std::string(kTrajectories) + "/" + t;
      if (f.is_group(p)) rec.groups.push_back(read_group(f, p, t, false, div, spike));
    }
    if (f.is_group(kBranches)) {
      std::vector<GroupRecord> br;
      for (const std::string& b : f.list_groups(kBranches))
        br.push_back(read_group(f, std::string(kBranches) + "/" + b, b, true, div, spike));
      std::stable_sort(br.begin(), br.end(), [](const GroupRecord& a, const GroupRecord& b) {
        return a.at != b.at ? a.at < b.at : a.name < b.name;
      });
      rec.groups.insert(rec.groups.end(), br.begin(), br.end());
    }
    rec.readable = true;
  } catch (const std::exception& e) {
    rec.readable = false;
    rec.groups.clear();
    const std::string holder = live_lock_holder(dir_of(path), rec.run_id);
    if (!holder.empty()) {
      rec.status = "running";
      rec.error = "being written by " + holder;
    } else {
      rec.status = "unreadable";
      rec.error = e.what();
    }
    return rec;
  }
  // A `running` file that nobody holds was left by a process that was killed.
  if (rec.status == "running" && live_lock_holder(dir_of(path), rec.run_id).empty() && rec.error.empty())
    rec.error = "abandoned (no live process holds its lock): mxlab run resumes it";
  return rec;
}

std::vector<RunRecord> scan_run_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw Error(msg("cannot read directory ", dir, ": ", std::strerror(errno), " (give the --out directory of mxlab run)"));
  std::vector<std::string> files;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 3 && n.compare(n.size() - 3, 3, ".h5") == 0) files.push_back(dir + "/" + n);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  std::vector<RunRecord> out;
  for (const auto& p : files) out.push_back(read_run_record(p));
  std::stable_sort(out.begin(), out.end(), [](const RunRecord& a, const RunRecord& b) {
    return a.run_id != b.run_id ? a.run_id < b.run_id : a.path < b.path;
  });
  return out;
}

std::vector<std::string> swept_keys(const std::vector<RunRecord>& runs) {
  std::vector<const RunRecord*> readable;
  for (const auto& r : runs)
    if (r.readable && !r.config.empty()) readable.push_back(&r);
  if (readable.size() < 2) return {};
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const RunRecord* r : readable)
    for (const auto& kv : r->config)
      if (seen.insert(kv.first).second) keys.push_back(kv.first);
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (k == "name" || k == "interventions" || k.rfind("interventions.", 0) == 0) continue;
    std::set<std::string> values;
    for (const RunRecord* r : readable) {
      bool found = false;
      const std::string v = config_value(*r, k, &found);
      values.insert(found ? "=" + v : "absent");
    }
    if (values.size() > 1) out.push_back(k);
  }
  return out;
}

std::string summary_table(const std::vector<RunRecord>& runs, bool csv) {
  const std::vector<std::string> swept = swept_keys(runs);
  std::vector<std::string> header = {"run_id", "group", "at"};
  header.insert(header.end(), swept.begin(), swept.end());
  for (const char* c : {"status", "divergence_step", "first_nonfinite_step", "spike_count", "spike_score", "final_loss",
                        "min_loss", "max_bias_ratio", "max_gamma_lastbin", "steps_run", "source", "file", "error"})
    header.push_back(c);
  const Cell cell{csv};
  std::vector<std::vector<std::string>> rows = {header};
  for (const RunRecord& r : runs) {
    auto base = [&](const GroupRecord* g) {
      std::vector<std::string> row = {r.run_id, g ? g->name : cell.none(),
                                      g && g->branch && g->at >= 0 ? std::to_string(g->at) : cell.none()};
      for (const auto& k : swept) {
        bool found = false;
        const std::string v = config_value(r, k, &found);
        row.push_back(found ? format_config_value(v) : cell.none());
      }
      row.push_back(cell.text(r.status));
      return row;
    };
    const std::string file = csv ? r.path : std::filesystem::path(r.path).filename().string();
    if (r.groups.empty()) {
      std::vector<std::string> row = base(nullptr);
      for (int i = 0; i < 10; ++i) row.push_back(cell.none());
      row.push_back(file);
      row.push_back(cell.text(r.error));
      rows.push_back(row);
      continue;
    }
    for (const GroupRecord& g : r.groups) {
      std::vector<std::string> row = base(&g);
      row.push_back(cell.step(g.divergence_step));
      row.push_back(cell.step(g.first_nonfinite_step));
      row.push_back(std::to_string(g.spike_count));
      row.push_back(cell.num(g.spike_score));
      row.push_back(cell.num(g.final_loss));
      row.push_back(cell.num(g.min_loss));
      row.push_back(cell.num(g.max_bias_ratio));
      row.push_back(cell.num(g.max_gamma_lastbin));
      row.push_back(std::to_string(g.steps_run));
      row.push_back(g.source);
      row.push_back(file);
      row.push_back(cell.text(r.error));
      rows.push_back(row);
    }
  }
  if (!csv) return aligned_table(rows);
  std::string out;
  for (const auto& row : rows) out += csv_line(row);
  return out;
}

std::string write_index(const std::string& dir, const std::vector<RunRecord>& runs) {
  const std::vector<std::string> swept = swept_keys(runs);
  std::vector<std::string> header = {"run_id", "status", "steps"};
  header.insert(header.end(), swept.begin(), swept.end());
  for (const char* c : {"divergence_step", "first_nonfinite_step", "final_loss", "min_loss", "branches", "start_time",
                        "end_time", "error", "file"})
    header.push_back(c);
  std::string text = csv_line(header);
  const Cell cell{true};
  for (const RunRecord& r : runs) {
    std::vector<std::string> row = {r.run_id, r.status, r.readable ? std::to_string(r.steps) : ""};
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

void write_text_atomically(const std::string& path, const std::string& text) {
  // A temp name of our own (host, pid, thread): processes sharing the directory never write
  // into each other's temp file; the last rename wins with a complete file.
  const std::string tmp = msg(path, ".tmp.", host_name(), ".", ::getpid(), ".",
                              std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw_io_error("write", path, errno);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    throw_io_error("write", path, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw_io_error("write", path, e);
  }
}

std::string csv_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  const float f = static_cast<float>(v);
  if (static_cast<double>(f) == v) std::snprintf(buf, sizeof buf, "%.9g", v);
  else std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

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
      std::string tag = g.branch ? "branch-" + g.name : g.name;
      for (char& c : tag)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
      const std::string prefix = out_dir + "/" + rec.run_id + "_" + tag;
      const std::string step_ds = g.h5_path + "/" + kStep;
      if (f.is_dataset(step_ds)) {
        const std::vector<int64_t> steps = f.read_int64s(step_ds);
        std::vector<std::string> names;
        for (const std::string& d : f.list_datasets(g.h5_path))
          if (d != kStep && d != kLossAll) names.push_back(d);
        std::stable_partition(names.begin(), names.end(), [](const std::string& d) { return d == "loss"; });
        struct Col {
          std::vector<double> values;
          size_t width = 1, offset = 0;
        };
        std::vector<std::string> header = {kStep};
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
          std::fprintf(stderr, "mxlab: warning: %s: datasets of %s have different lengths (a run that was killed?); "
                       "exporting the first %zu rows that all have\n", run_path.c_str(), g.h5_path.c_str(), rows);
        std::string text = csv_line(header);
        for (size_t i = 0; i < rows; ++i) {
          text += std::to_string(steps[i]);
          for (const Col& c : cols) text += "," + csv_number(c.values[i * c.width + c.offset]);
          text += "\n";
        }
        files.emplace_back(prefix + ".csv", text);
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
    summary += csv_line({rec.run_id, g.name, g.branch ? std::to_string(g.at) : "", rec.status,
                         std::to_string(g.steps_run), std::to_string(g.first_nonfinite_step),
                         std::to_string(g.divergence_step), std::to_string(g.spike_count), csv_number(g.spike_score),
                         csv_number(g.final_loss), csv_number(g.min_loss), csv_number(g.max_bias_ratio),
                         csv_number(g.max_gamma_lastbin), g.source});
  files.emplace_back(out_dir + "/" + rec.run_id + "_summary.csv", summary);
  std::vector<std::string> written;
  for (const auto& [p, text] : files) {
    write_text_atomically(p, text);
    written.push_back(p);
  }
  return written;
}

}  // namespace mxlab
