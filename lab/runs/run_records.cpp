// Run records: one per run file, read back from the HDF5 file (attributes, configuration, the
// summary of every trajectory and branch), and the keys that differ between runs.
#include "lab/runs/run_records.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/config/config_io.h"
#include "lab/runs/run_driver.h"
#include "lab/runs/run_file.h"
#include "lab/stats/loss_events.h"
#include "lab/config/yaml_tree.h"

namespace mxlab {

namespace {

constexpr const char* kTrajectories = "trajectories";
constexpr const char* kBranches = "branches";
constexpr const char* kFp32 = "fp32";
constexpr const char* kLossAll = "loss_all";
constexpr const char* kStep = "step";
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
  if (branch) g.parent = f.has_attr(h5_path, "from") ? f.get_attr_string(h5_path, "from") : "mx";
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
  g.max_bias_ratio = name == kFp32 && !branch ? kNaN : finite_max(f, h5_path + "/bias_ratio");
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

// Text read from a file, for a one-line message: at most 40 characters, control and non-ASCII
// bytes as \xHH (a damaged string can hold anything).
std::string shown(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return text.size() > 40 ? out + "..." : out;
}

// Throws mxlab::Error when a file that HDF5 reads whole is still not a whole run record: a
// status outside the schema's; or, once the run has ended (complete, diverged, interrupted),
// a missing part of what the file itself declares: with the root attribute `arms` (every file
// of a build that knows arms has it) the fp32 trajectory and each arm; a branch of each
// intervention of its configuration; the summary attributes of each group (a branch that never
// started has none). Damage can rename an object or an attribute as well as break it. (Files
// without `arms`, of older builds or made by hand, are taken as they are.)
// Returns the status, which `status_text` spells.
RunStatus check_whole(const h5::H5File& f, const RunRecord& rec, const std::string& status_text, const std::string& yaml) {
  const std::optional<RunStatus> parsed = parse_run_status(status_text);
  const bool in_schema = parsed && (*parsed == RunStatus::running || *parsed == RunStatus::complete ||
                                    *parsed == RunStatus::diverged || *parsed == RunStatus::failed ||
                                    *parsed == RunStatus::interrupted);
  if (!in_schema)
    throw Error(msg("its status '", shown(status_text), "' is none of running, complete, diverged, failed, interrupted: "
                    "the file is damaged"));
  const RunStatus status = *parsed;
  if (!is_finished(status) && status != RunStatus::interrupted) return status;
  const std::string ended = status == RunStatus::interrupted ? "was interrupted" : "ended";
  std::vector<std::string> expected;
  if (f.has_attr("/", "arms")) {
    expected.push_back(std::string(kTrajectories) + "/" + kFp32);
    for (const std::string& a : f.get_attr_strings("/", "arms")) expected.push_back(std::string(kTrajectories) + "/" + a);
  }
  try {
    for (const InterventionConfig& iv : config_from_yaml_string(yaml, rec.path).interventions)
      expected.push_back(std::string(kBranches) + "/" + iv.name);
  } catch (const Error&) {  // a configuration of another schema: its branches are not known
  }
  for (const std::string& g : expected)
    if (!f.is_group(g)) throw Error(msg("it has no group ", shown(g), " although its run ", ended, ": the file is damaged"));
  for (const GroupRecord& g : rec.groups) {
    if (g.source == "file") continue;
    const bool never_started = f.has_attr(g.h5_path, "state") && f.get_attr_string(g.h5_path, "state") == "not_started";
    if (!never_started)
      throw Error(msg("group ", shown(g.h5_path), " has no summary attributes (steps_run, ...) although its run ", ended,
                      ": the file is damaged"));
  }
  return status;
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

}  // namespace

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

std::string config_value(const RunRecord& r, const std::string& key, bool* found) {
  for (const auto& [k, v] : r.config)
    if (k == key) {
      *found = true;
      return v;
    }
  *found = false;
  return "";
}

const GroupRecord* RunRecord::group(const std::string& name) const {
  for (const auto& g : groups)
    if (g.name == name && !g.branch) return &g;
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
    rec.error = str("error");
    rec.start_time = str("start_time");
    rec.end_time = str("end_time");
    if (f.has_attr("/", "steps")) rec.steps = f.get_attr_int64("/", "steps");
    double div = LogConfig{}.divergence_factor, spike = LogConfig{}.spike_factor;
    rec.config = canonical_config(str("config_yaml"), path, &div, &spike);
    for (const auto& [k, v] : rec.config)
      if (k == "name") rec.name = v;
    // Every trajectory the file holds (fp32, mx, or the named arms of a multi-arm run), FP32
    // first: it is the reference of the others.
    if (f.is_group(kTrajectories)) {
      std::vector<std::string> names = f.list_groups(kTrajectories);
      std::stable_partition(names.begin(), names.end(), [](const std::string& t) { return t == kFp32; });
      for (const std::string& t : names)
        rec.groups.push_back(read_group(f, std::string(kTrajectories) + "/" + t, t, false, div, spike));
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
    rec.status = check_whole(f, rec, str("status"), str("config_yaml"));
    rec.readable = true;
  } catch (const std::exception& e) {
    rec.readable = false;
    rec.groups.clear();
    if (const auto* io = dynamic_cast<const IoError*>(&e)) rec.io_errno = io->error_number();
    const std::string holder = live_lock_holder(dir_of(path), rec.run_id);
    if (!holder.empty()) {
      rec.status = RunStatus::running;
      rec.error = "being written by " + holder;
    } else {
      rec.status = RunStatus::unreadable;
      rec.error = e.what();
      if (::access(RunFile::snapshot_path(path).c_str(), F_OK) == 0)
        rec.error += msg(" (", RunFile::snapshot_path(path), " holds its state at its last flush: `mxlab run` of its "
                         "experiment puts it back)");
    }
    return rec;
  }
  // A `running` file that nobody holds was left by a process that was killed.
  if (rec.status == RunStatus::running && live_lock_holder(dir_of(path), rec.run_id).empty() && rec.error.empty())
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

}  // namespace mxlab
