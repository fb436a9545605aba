// `mxlab summarize --where`: runs filtered by configuration values.
#include "lab/report/run_filter.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "lab/core/error.h"

namespace mxlab {

namespace {

constexpr size_t kMaxValuesNamed = 8;  // values of a key listed when nothing matches

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string unquote(const std::string& s) {
  if (s.size() >= 2 && s.front() == s.back() && (s.front() == '\'' || s.front() == '"')) return s.substr(1, s.size() - 2);
  return s;
}

// A YAML number (int, float, .inf, .nan) as the Python side's yamlcfg.scalar reads one.
bool yaml_number(const std::string& s, double* v) {
  const std::string l = lower(s);
  if (l == ".inf" || l == "+.inf" || l == "inf") return *v = HUGE_VAL, true;
  if (l == "-.inf" || l == "-inf") return *v = -HUGE_VAL, true;
  if (l == ".nan" || l == "nan") return *v = NAN, true;
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+' || s[0] == '.'))
    return false;
  if (l.find_first_of("xp") != std::string::npos) return false;  // no hex floats
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0';
}

bool yaml_bool(const std::string& s, bool* b) {
  const std::string l = lower(s);
  if (l != "true" && l != "false") return false;
  *b = l == "true";
  return true;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

}  // namespace

WhereClause parse_where(const std::string& text) {
  const size_t eq = text.find('=');
  const std::string key = eq == std::string::npos ? "" : trim(text.substr(0, eq));
  if (eq == std::string::npos || key.empty())
    throw Error(msg("--where ", quoted_excerpt(text), ": expected KEY=VALUE, e.g. optimizer.lr=6e-4"));
  return {key, trim(text.substr(eq + 1))};
}

bool config_value_matches(const std::string& have_text, const std::string& want_text) {
  const std::string have = unquote(have_text), want = unquote(want_text);
  const bool have_quoted = have != have_text, want_quoted = want != want_text;
  double a = 0, b = 0;
  bool x = false, y = false;
  if (!have_quoted && !want_quoted && yaml_number(have, &a) && yaml_number(want, &b)) {
    if (std::isnan(a) || std::isnan(b)) return false;
    if (a == b) return true;
    return std::fabs(a - b) <= 1e-6 * std::max(std::fabs(a), std::fabs(b));
  }
  if (!have_quoted && !want_quoted && yaml_bool(have, &x) && yaml_bool(want, &y)) return x == y;
  return have == want;
}

std::vector<RunRecord> filter_runs(std::vector<RunRecord> runs, const std::vector<WhereClause>& where) {
  if (where.empty()) return runs;
  std::vector<RunRecord> kept;
  const std::vector<std::string> swept = swept_keys(runs);
  for (RunRecord& r : runs) {
    if (!r.readable || r.config.empty()) continue;
    bool all = true;
    for (const WhereClause& w : where) {
      bool found = false;
      const std::string v = config_value(r, w.key, &found);
      if (!found)
        throw Error(msg("--where ", w.key, ": no such key in the configuration of ",
                        std::filesystem::path(r.path).filename().string(), " (keys that differ between the runs: ",
                        swept.empty() ? "none" : join(swept), "; every key: mxlab dump-config)"));
      all = all && config_value_matches(v, w.value);
    }
    if (all) kept.push_back(std::move(r));
  }
  if (kept.empty()) {
    // Name the values the first clause's key has, to show what would match.
    const WhereClause& w = where.front();
    std::vector<std::string> values;
    std::set<std::string> seen;
    for (const RunRecord& r : runs) {
      bool found = false;
      const std::string v = r.readable ? config_value(r, w.key, &found) : "";
      if (found && seen.insert(v).second) values.push_back(v);
    }
    if (values.size() > kMaxValuesNamed) {
      values.resize(kMaxValuesNamed);
      values.push_back("...");
    }
    throw Error(msg("--where: no run matches every clause (", w.key, " here: ",
                    values.empty() ? "no readable run" : join(values), ")"));
  }
  return kept;
}

}  // namespace mxlab
