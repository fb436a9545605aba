#include "lab/runs/bench_records.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "lab/core/error.h"
#include "lab/io/table_text.h"

namespace mxlab {

namespace {

constexpr const char* kFormat = "mxlab-bench-cache";
constexpr int kVersion = 1;

// A JSON string literal.
std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

// A JSON number (non-finite values have none: null).
std::string json_number(double v) { return std::isfinite(v) ? shortest_repr(v) : std::string("null"); }

std::string record_json(const BenchRecord& r) {
  return msg("{\"quantity\": ", json_string(r.quantity), ", \"value\": ", json_number(r.value),
             ", \"unit\": ", json_string(r.unit), ", \"arms\": ", r.arms, ", \"shadow_every\": ", r.shadow_every,
             ", \"device\": ", json_string(r.device), ", \"backend\": ", json_string(r.backend),
             ", \"revision\": ", json_string(r.revision), ", \"command\": ", json_string(r.command),
             ", \"config\": ", json_string(r.config), ", \"shape\": ", json_string(r.shape),
             ", \"step_gflop\": ", json_number(r.step_gflop), ", \"measured_at\": ", json_string(r.measured_at), "}");
}

}  // namespace

std::string bench_records_csv(const std::vector<BenchRecord>& records) {
  std::string out = csv_line({"quantity", "value", "unit", "arms", "shadow_every", "device", "backend", "revision",
                              "command", "config", "shape", "step_gflop", "measured_at"});
  for (const BenchRecord& r : records)
    out += csv_line({r.quantity, json_number(r.value), r.unit, std::to_string(r.arms), std::to_string(r.shadow_every),
                     r.device, r.backend, r.revision, r.command, r.config, r.shape, json_number(r.step_gflop),
                     r.measured_at});
  return out;
}

std::string bench_cache_json(const std::string& device, const std::vector<BenchRecord>& records) {
  std::string out = msg("{\"format\": ", json_string(kFormat), ", \"version\": ", kVersion,
                        ", \"device\": ", json_string(device), ",\n \"records\": [");
  for (size_t i = 0; i < records.size(); ++i) out += (i ? ",\n  " : "\n  ") + record_json(records[i]);
  return out + "\n ]}\n";
}

std::string BenchCache::latest() const {
  std::string t;
  for (const BenchRecord& r : records) t = std::max(t, r.measured_at);
  return t;
}

BenchCache read_bench_cache(const std::string& path) {
  BenchCache c;
  c.path = path;
  auto bad = [&](const std::string& why) {
    return Error(msg(path, ": not a bench cache file (", why, "); `mxlab bench` writes one, or give another with --bench-file"));
  };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(msg(path, ": no such bench file; `mxlab bench EXP --device cuda` writes one (--bench-file FILE names it)"));
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw bad(one_line_message(e.what()));
  }
  if (!root.IsMap() || !root["format"] || !root["format"].IsScalar() || root["format"].as<std::string>() != kFormat)
    throw bad(msg("its \"format\" is not \"", kFormat, "\""));
  try {
    if (root["version"].as<int>() != kVersion) throw bad(msg("version ", root["version"].as<std::string>(), ", this mxlab reads ", kVersion));
    c.device = root["device"].as<std::string>();
    const YAML::Node recs = root["records"];
    if (!recs || !recs.IsSequence()) throw bad("no \"records\" list");
    for (const YAML::Node& n : recs) {
      if (!n.IsMap()) throw bad("a record is not an object");
      BenchRecord r;
      r.quantity = n["quantity"].as<std::string>();
      r.value = n["value"].IsNull() ? std::nan("") : n["value"].as<double>();
      r.unit = n["unit"].as<std::string>("");
      r.arms = n["arms"].as<int>(0);
      r.shadow_every = n["shadow_every"].as<int>(0);
      r.device = n["device"].as<std::string>(c.device);
      r.backend = n["backend"].as<std::string>("");
      r.revision = n["revision"].as<std::string>("");
      r.command = n["command"].as<std::string>("");
      r.config = n["config"].as<std::string>("");
      r.shape = n["shape"].as<std::string>("");
      r.step_gflop = n["step_gflop"] && !n["step_gflop"].IsNull() ? n["step_gflop"].as<double>() : 0.0;
      r.measured_at = n["measured_at"].as<std::string>("");
      if (r.quantity.empty()) throw bad("a record without a quantity");
      c.records.push_back(std::move(r));
    }
  } catch (const YAML::Exception& e) {
    throw bad(one_line_message(e.what()));
  }
  return c;
}

std::vector<BenchRecord> merge_bench_records(const std::vector<BenchRecord>& old, const std::vector<BenchRecord>& fresh) {
  std::vector<BenchRecord> out;
  for (const BenchRecord& o : old) {
    bool replaced = false;
    for (const BenchRecord& f : fresh)
      replaced = replaced || (f.quantity == o.quantity && f.config == o.config && f.shape == o.shape);
    if (!replaced) out.push_back(o);
  }
  out.insert(out.end(), fresh.begin(), fresh.end());
  return out;
}

void write_bench_cache(const std::string& path, const std::string& device, const std::vector<BenchRecord>& fresh) {
  std::vector<BenchRecord> old;
  try {
    old = read_bench_cache(path).records;
  } catch (const Error&) {
    // none yet, or not a cache: replaced by this bench's records
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw IoError(msg("cannot create the bench cache folder ", dir.string(), ": ", ec.message(),
                        " (name a writable file with --bench-file, or set XDG_CACHE_HOME)"),
                    dir.string(), ec.value());
  }
  write_text_atomically(path, bench_cache_json(device, merge_bench_records(old, fresh)));
}

std::string default_bench_dir() {
  // The XDG base directory specification: a relative path in the variable is to be ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return (std::filesystem::path(xdg) / "mxlab" / "bench").string();
  const char* home = std::getenv("HOME");
  if (home && home[0] == '/') return (std::filesystem::path(home) / ".cache" / "mxlab" / "bench").string();
  return "";
}

std::string bench_file_name(const std::string& device) {
  std::string n;
  for (const char ch : device) {
    const unsigned char c = static_cast<unsigned char>(ch);
    const bool keep = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (keep) n += ch;
    else if (!n.empty() && n.back() != '_') n += '_';
  }
  while (!n.empty() && n.back() == '_') n.pop_back();
  return (n.empty() ? std::string("device") : n) + ".json";
}

std::string bench_config_path(const std::string& path) {
  if (path.empty()) return "";
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? path : p.string();
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool bench_arms_were_copies(const BenchRecord& r) {
  const std::string& c = r.command;
  for (size_t at = c.find("--arms"); at != std::string::npos; at = c.find("--arms", at + 1)) {
    const size_t end = at + 6;  // "--arms" followed by a space or '=', at the start of a word
    if ((at == 0 || c[at - 1] == ' ') && end < c.size() && (c[end] == ' ' || c[end] == '=')) return true;
  }
  return false;
}

}  // namespace mxlab
