// Experiment files -> the runs they stand for (see sweep.h): `extends` chains are merged,
// `base:` and top-level run keys are combined, --set options applied, then the sweep is
// expanded by writing each run's values into a copy of the YAML tree, so a bad sweep value
// is reported at its own line by the same strict parser as everything else.
#include "lab/config/sweep.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "lab/core/error.h"
#include "lab/config/config_io.h"
#include "lab/config/yaml_tree.h"

namespace mxlab {

namespace fs = std::filesystem;

namespace {

const char* const kExperimentKeys[] = {"extends", "base", "sweep"};
const char* const kSweepKeys[] = {"grid", "zip", "seeds"};
// Beyond this a sweep is almost surely a mistake (and would take minutes just to expand).
constexpr size_t kMaxRuns = 100000;

[[noreturn]] void fail(const YLoc& loc, const std::string& what) { throw Error(loc.str() + ": " + what); }

bool is_experiment_key(const std::string& k) {
  return std::find(std::begin(kExperimentKeys), std::end(kExperimentKeys), k) != std::end(kExperimentKeys);
}

// One file's content split into the run keys and the sweep.
struct Experiment {
  YNode run;    // a mapping of run keys
  YNode sweep;  // a mapping, or null
};

Experiment normalize(const YNode& root, const std::string& origin) {
  Experiment ex;
  ex.run.kind = YNode::Kind::map;
  ex.run.loc = {origin, 0};
  if (root.is_null()) return ex;
  if (!root.is_map())
    fail(root.loc, msg("expected a mapping of configuration keys (e.g. `steps: 1000`) at the top level, got ",
                       root.describe()));
  if (const YEntry* b = root.find("base"); b && !b->value.is_null()) {
    if (!b->value.is_map()) fail(b->value.loc, msg("base: expected a mapping of run keys, got ", b->value.describe()));
    for (const YEntry& e : b->value.map)
      if (is_experiment_key(e.key))
        fail(e.key_loc, msg(quoted_excerpt(e.key), " belongs at the top level of the experiment, not under base:"));
    yaml_merge(ex.run, b->value);
  }
  YNode top;
  top.kind = YNode::Kind::map;
  top.loc = root.loc;
  for (const YEntry& e : root.map)
    if (!is_experiment_key(e.key)) top.map.push_back(e);
  yaml_merge(ex.run, top);  // top-level run keys override base:
  if (const YEntry* s = root.find("sweep")) ex.sweep = s->value;
  return ex;
}

// `chain` holds the canonical paths of the files being extended (cycle detection).
Experiment load_tree(const YNode& root, const std::string& origin, const fs::path& dir, std::vector<std::string>& chain) {
  Experiment ex = normalize(root, origin);
  const YEntry* ext = root.is_map() ? root.find("extends") : nullptr;
  if (!ext) return ex;
  if (!ext->value.is_scalar() || ext->value.text.empty())
    fail(ext->value.loc, msg("extends: expected the path of a parent experiment file, got ", ext->value.describe()));
  fs::path parent(ext->value.text);
  if (parent.is_relative()) parent = dir / parent;
  std::error_code ec;
  if (!fs::is_regular_file(parent, ec))
    fail(ext->value.loc, msg("extends: ", excerpt(parent.string()),
                             " is not a readable file (paths are relative to the file that extends)"));
  const std::string key = fs::weakly_canonical(parent, ec).string();
  if (std::find(chain.begin(), chain.end(), key) != chain.end()) {
    std::string cycle;
    for (const std::string& c : chain) cycle += c + " -> ";
    fail(ext->value.loc, msg("extends: cycle ", cycle, key, ": a file cannot extend itself, even indirectly"));
  }
  chain.push_back(key);
  Experiment base = load_tree(yaml_load_file(parent.string()), parent.string(), parent.parent_path(), chain);
  chain.pop_back();
  yaml_merge(base.run, ex.run);
  yaml_merge(base.sweep, ex.sweep);
  return base;
}

// One swept key and its values.
struct SweepAxis {
  std::string key;
  YLoc key_loc;
  std::vector<YNode> values;
  bool varies = false;  // at least two different values: the key is reported per run
};

struct Sweep {
  std::vector<SweepAxis> grid, zip;
  std::vector<SweepAxis> seeds;  // zero or one axis, key "seed"
  std::vector<const SweepAxis*> all() const {
    std::vector<const SweepAxis*> v;
    for (const auto* group : {&grid, &zip, &seeds})
      for (const SweepAxis& a : *group) v.push_back(&a);
    return v;
  }
};

SweepAxis parse_axis(const std::string& key, const YLoc& key_loc, const YNode& list, const std::string& label) {
  if (!list.is_seq() || list.seq.empty())
    fail(list.loc.line ? list.loc : key_loc,
         msg(label, ": expected a non-empty list of values (e.g. [1, 2]), got ", list.is_seq() ? "an empty list" : list.describe()));
  SweepAxis a{key, key_loc, list.seq, false};
  std::set<std::string> distinct;
  for (const YNode& v : a.values) distinct.insert(v.flow());
  a.varies = distinct.size() > 1;
  return a;
}

Sweep parse_sweep(const YNode& s) {
  Sweep sw;
  if (s.is_null()) return sw;
  if (!s.is_map()) fail(s.loc, msg("sweep: expected a mapping with grid:, zip: and/or seeds:, got ", s.describe()));
  const std::vector<std::string> sweep_keys(std::begin(kSweepKeys), std::end(kSweepKeys));
  const std::vector<std::string> keys = config_keys();
  std::map<std::string, std::string> used;  // dotted key -> "sweep.grid" / "sweep.zip"
  for (const YEntry& e : s.map) {
    if (std::find(sweep_keys.begin(), sweep_keys.end(), e.key) == sweep_keys.end())
      fail(e.key_loc, msg("unknown key ", quoted_excerpt(e.key), " in sweep", did_you_mean(e.key, sweep_keys)));
    const std::string group = "sweep." + e.key;
    if (e.key == "seeds") {
      if (!e.value.is_null()) sw.seeds.push_back(parse_axis("seed", e.key_loc, e.value, group));
      continue;
    }
    if (e.value.is_null()) continue;
    if (!e.value.is_map())
      fail(e.value.loc, msg(group, ": expected a mapping of dotted keys to lists (e.g. {model.width: [256, 512]}), got ",
                            e.value.describe()));
    for (const YEntry& k : e.value.map) {
      if (std::find(keys.begin(), keys.end(), k.key) == keys.end())
        fail(k.key_loc, msg("unknown key ", quoted_excerpt(k.key), " in ", group, did_you_mean(k.key, keys)));
      if (auto it = used.find(k.key); it != used.end())
        fail(k.key_loc, msg(k.key, " is swept twice (", it->second, " and ", group, "): keep it in one of them"));
      used[k.key] = group;
      (e.key == "grid" ? sw.grid : sw.zip).push_back(parse_axis(k.key, k.key_loc, k.value, group + "." + k.key));
    }
  }
  if (!sw.seeds.empty() && used.count("seed"))
    fail(sw.seeds[0].key_loc, msg("seed is swept twice (", used["seed"], " and sweep.seeds): keep one of them"));
  for (const SweepAxis& a : sw.zip)
    if (a.values.size() != sw.zip[0].values.size())
      fail(a.key_loc, msg("sweep.zip: lists must have equal lengths (they are varied together): ", sw.zip[0].key,
                          " has ", sw.zip[0].values.size(), " values, ", a.key, " has ", a.values.size()));
  return sw;
}

std::vector<ExpandedRun> expand(const Experiment& ex, const std::vector<std::string>& overrides, const std::string& origin) {
  const Sweep sw = parse_sweep(ex.sweep);
  const std::vector<const SweepAxis*> axes = sw.all();
  for (const std::string& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    for (const SweepAxis* a : axes)
      if (a->key == key || a->key.rfind(key + ".", 0) == 0)
        throw Error(msg("--set ", o, ": ", a->key, " is swept (", a->key_loc.str(),
                        "): remove it from the sweep, or drop the --set"));
  }
  YNode run = ex.run;
  apply_overrides(run, overrides);

  // The number of runs, exactly (integer arithmetic: a product that overflows 64 bits is
  // reported as such, never as a rounded floating-point number).
  std::vector<size_t> factors;
  for (const SweepAxis& a : sw.grid) factors.push_back(a.values.size());
  const size_t n_zip = sw.zip.empty() ? 1 : sw.zip[0].values.size();
  const size_t n_seed = sw.seeds.empty() ? 1 : sw.seeds[0].values.size();
  factors.push_back(n_zip);
  factors.push_back(n_seed);
  uint64_t total64 = 1;
  bool overflow = false;
  for (size_t f : factors) overflow = overflow || __builtin_mul_overflow(total64, static_cast<uint64_t>(f), &total64);
  if (overflow || total64 > kMaxRuns)
    throw Error(msg(origin, ": the sweep expands to ",
                    overflow ? msg("more than ", std::numeric_limits<uint64_t>::max()) : std::to_string(total64),
                    " runs (at most ", kMaxRuns, " in one experiment): split it into several experiments"));
  const size_t total = static_cast<size_t>(total64);
  size_t n_grid = 1;
  for (const SweepAxis& a : sw.grid) n_grid *= a.values.size();

  std::vector<ExpandedRun> runs;
  runs.reserve(total);
  std::map<std::string, int> ids;
  for (size_t idx = 0; idx < total; ++idx) {
    // Mixed-radix digits of idx: seeds fastest, then zip, then the grid with its last key fastest.
    std::vector<std::pair<const SweepAxis*, size_t>> pick;
    size_t rest = idx;
    if (!sw.seeds.empty()) pick.emplace_back(&sw.seeds[0], rest % n_seed);
    rest /= n_seed;
    for (const SweepAxis& a : sw.zip) pick.emplace_back(&a, rest % n_zip);
    rest /= n_zip;
    for (auto it = sw.grid.rbegin(); it != sw.grid.rend(); ++it) {
      pick.emplace_back(&*it, rest % it->values.size());
      rest /= it->values.size();
    }
    YNode tree = run;
    ExpandedRun r;
    r.index = static_cast<int>(idx);
    for (const SweepAxis* a : axes)
      for (const auto& [axis, i] : pick)
        if (axis == a) {
          set_config_path(tree, split_dotted(a->key), a->values[i], a->key_loc);
          if (a->varies) r.swept.emplace_back(a->key, a->values[i].flow());
        }
    r.cfg = config_from_tree(tree, origin);
    r.id = config_hash(r.cfg);
    if (auto it = ids.find(r.id); it != ids.end())
      throw Error(msg(origin, ": runs ", it->second, " and ", idx, " of the sweep resolve to the same configuration (run id ",
                      r.id, "): remove the repeated value"));
    ids[r.id] = static_cast<int>(idx);
    runs.push_back(std::move(r));
  }
  return runs;
}

}  // namespace

std::vector<ExpandedRun> expand_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  std::vector<std::string> chain = {fs::weakly_canonical(path, ec).string()};
  const Experiment ex = load_tree(yaml_load_file(path), path, fs::path(path).parent_path(), chain);
  return expand(ex, overrides, path);
}

std::vector<ExpandedRun> expand_experiment_string(const std::string& text, const std::string& origin,
                                                  const std::vector<std::string>& overrides, const std::string& base_dir) {
  std::vector<std::string> chain;
  const Experiment ex = load_tree(yaml_parse(text, origin), origin, fs::path(base_dir), chain);
  return expand(ex, overrides, origin);
}

namespace {

bool is_precision_key(const std::string& k) { return k == "precision" || k.rfind("precision.", 0) == 0; }

// An arm name for the example: the value itself when it is a plain name, else `fallback`.
std::string example_arm_name(const std::string& value, const std::string& fallback) {
  if (value.empty() || value.size() > 64 || value[0] == '.' || value == "fp32") return fallback;  // fp32: reserved
  for (char c : value)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return fallback;
  return value;
}

}  // namespace

RunConfig run_of_experiment(const std::string& path, const std::vector<std::string>& overrides, int run) {
  std::vector<ExpandedRun> runs = expand_experiment(path, overrides);
  if (run < 0 || static_cast<size_t>(run) >= runs.size())
    throw Error(msg("--run ", run, ": ", path, " has ", runs.size() == 1 ? "one run, 0" : msg("runs 0 to ", runs.size() - 1),
                    " (see `mxlab plan ", path, "`)"));
  return std::move(runs[static_cast<size_t>(run)].cfg);
}

std::string precision_only_sweep_warning(const std::vector<ExpandedRun>& runs) {
  std::map<std::vector<std::pair<std::string, std::string>>, const ExpandedRun*> first_of;
  for (const ExpandedRun& r : runs) {
    std::vector<std::pair<std::string, std::string>> rest;
    bool any_precision = false;
    for (const auto& kv : r.swept) {
      if (is_precision_key(kv.first)) any_precision = true;
      else rest.push_back(kv);
    }
    if (!any_precision) continue;
    const auto [it, fresh] = first_of.emplace(rest, &r);
    if (fresh) continue;
    const ExpandedRun& a = *it->second;
    std::string key, va, vb, keys;
    for (size_t i = 0; i < r.swept.size() && i < a.swept.size(); ++i) {
      if (!is_precision_key(r.swept[i].first) || a.swept[i].second == r.swept[i].second) continue;
      keys += (keys.empty() ? "" : ", ") + r.swept[i].first;
      if (key.empty()) {
        key = r.swept[i].first;
        va = a.swept[i].second;
        vb = r.swept[i].second;
      }
    }
    const std::string set_key = key == "precision" ? std::string() : key.substr(std::string("precision.").size());
    const std::string na = example_arm_name(va, "a"), nb = example_arm_name(vb, na == "b" ? "c" : "b");
    const std::string set_a = set_key.empty() ? "set: " + va : "set: {" + set_key + ": " + va + "}";
    const std::string set_b = set_key.empty() ? "set: " + vb : "set: {" + set_key + ": " + vb + "}";
    return msg("runs ", a.index, " and ", r.index, " differ only in ", keys,
               " (same seed, every other key the same): each trains the same FP32 trajectory again, and the "
               "recipes are not paired arms of one run; compare recipes with `arms:` instead, e.g. arms: [{name: ",
               na, ", ", set_a, "}, {name: ", nb == na ? na + "_2" : nb, ", ", set_b, "}] (experiments/README.md, "
               "\"Arms\")");
  }
  return "";
}

}  // namespace mxlab
