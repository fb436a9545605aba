// `mxlab plan EXP.yaml [--set KEY=VALUE ...] [--bench-file FILE] [--device DEV]`: the runs an
// experiment expands to (index, run id, the swept keys and their values) and the total, without
// running anything, so a sweep can be checked before it is launched and a run id traced back to
// its settings; then the device time they will take, predicted from the last bench on the device
// (the bench cache, lab/runs/bench_records.h) or, without one, from the stated H100 model
// (lab/runs/cost_estimate.h; kernels/PERF.md, "Arms at the GPU's throughput: plan"), saying which.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/config/sweep.h"
#include "lab/core/error.h"
#include "lab/core/text_table.h"
#include "lab/runs/bench_records.h"
#include "lab/runs/cost_estimate.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 20;  // right after `run` in --help

struct Args {
  std::string path;
  std::vector<std::string> sets;
  std::string bench_file;  // --bench-file FILE
  std::string device;      // --device: cpu, cuda (any GPU) or part of a GPU's name
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Which bench cache the prediction comes from: the one named, else the newest in the cache folder
// of the wanted device; `why` says what was looked for when there is none.
struct Choice {
  std::optional<BenchCache> cache;
  bool cpu = false;  // the runs are planned for the CPU
  std::string why;
  std::vector<std::string> skipped;  // files in the folder that are not bench caches
};

Choice choose_cache(const Args& a, const std::vector<ExpandedRun>& runs) {
  Choice c;
  if (!a.bench_file.empty()) {
    c.cache = read_bench_cache(a.bench_file);
    c.cpu = c.cache->device == "cpu";
    return c;
  }
  const std::string want = lower(a.device.empty() ? runs.front().cfg.device : a.device);
  c.cpu = want == "cpu";
  const bool any_gpu = want.empty() || want == "auto" || want == "gpu" || want.rfind("cuda", 0) == 0;
  const std::string wanted = c.cpu ? "the CPU" : any_gpu ? "a GPU" : "a device named like '" + a.device + "'";
  const std::string dir = default_bench_dir();
  if (dir.empty()) {
    c.why = "no bench cache folder (neither XDG_CACHE_HOME nor HOME is set)";
    return c;
  }
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".json") files.push_back(it->path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    BenchCache b;
    try {
      b = read_bench_cache(f.string());
    } catch (const Error&) {
      c.skipped.push_back(f.string());
      continue;
    }
    const std::string dev = lower(b.device);
    const bool fits = c.cpu ? dev == "cpu" : any_gpu ? dev != "cpu" : dev.find(want) != std::string::npos;
    if (fits && (!c.cache || b.latest() > c.cache->latest())) c.cache = std::move(b);
  }
  if (!c.cache) c.why = msg("no bench of ", wanted, " in ", dir);
  return c;
}

// Run indices as ranges: 0-39, or 0, 2-5, 9.
std::string index_ranges(const std::vector<int>& idx) {
  std::string out;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && idx[j + 1] == idx[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(idx[i]) + (j > i ? "-" + std::to_string(idx[j]) : "");
    i = j + 1;
  }
  return out;
}

std::string num(double v) { return msg(v); }  // 6 significant digits

std::string term_line(const char* sym, const CostTerm& t, const std::string& what) {
  std::string where = t.stated ? "stated: " + t.measured : t.from + ": " + t.measured;
  if (t.scale != 1.0) where += msg(", scaled x", num(t.scale), " by the student's GEMM FLOPs");
  return msg("    ", sym, " = ", num(t.ms), "  ", what, "  [", where, "]\n");
}

std::string constants_text(const CostModel& m) {
  std::string s = "  constants (ms):\n";
  s += term_line("t1", m.t1, msg("the trainer's step with 1 arm, shadow every ", m.t1.shadow_every));
  s += term_line("A ", m.extra, msg("per extra arm, shadow every ", m.extra.shadow_every));
  s += term_line("S ", m.shadow, "shadow pass (FP32 forward + backward at an arm's weights)");
  s += term_line("L ", m.logged, msg("a logged step over an unlogged one, with ", m.logged.arms, " arm",
                                     m.logged.arms == 1 ? "" : "s"));
  s += term_line("C ", m.curvature, msg("a curvature measurement of one trajectory, ", m.curvature.arms, " iterations"));
  s += term_line("T0", m.startup, "a run's start-up");
  s += msg("  per run: T0 + N u + (branch steps) a + (logged steps) L (1 + K)/(1 + ", std::max(m.logged.arms, 1),
           ") + (curvature measurements) C (1 + K) iters/", std::max(m.curvature.arms, 1), "\n",
           "    u = t1 + S (1/b - 1/", std::max(m.t1.shadow_every, 1), ") + (K - 1) a,  a = A + S (1/b - 1/",
           std::max(m.extra.shadow_every, 1), ")  (K arms, the shadow pass every b steps)\n");
  double lo = 1.0;
  for (const CostTerm* t : {&m.t1, &m.extra, &m.shadow, &m.logged, &m.curvature}) lo = std::min(lo, t->scale);
  if (lo < 0.5)
    s += msg("  scaled down from a larger model by GEMM FLOPs (x", num(lo), "): a small model's step is bound by "
             "latency, not FLOPs, so this is a lower bound; bench this configuration on the device\n");
  return s;
}

std::string run_line(const RunCost& c) {
  return msg("N ", c.steps, ", K ", c.arms, ", b ", c.shadow_every, ": u ", num(c.step_ms), " ms, a ", num(c.extra_ms),
             " ms; ", c.logged_steps, " logged steps (+", num(c.logged_extra_ms), " ms each), ", c.branch_steps,
             " branch steps, ", c.curvature_measurements, " curvature measurements (", num(c.curvature_ms),
             " ms each), start-up ", num(c.startup_ms), " ms: ", msg(c.total_ms() / 1000.0), " s a run");
}

// The prediction's lines (computed before anything is printed: a bad --bench-file prints nothing).
std::string prediction_text(const Args& a, const std::vector<ExpandedRun>& runs) {
  const Choice choice = choose_cache(a, runs);
  std::string out = "\n";
  if (!choice.cache && choice.cpu) {
    out += msg("predicted device time: none (", choice.why, "; `mxlab bench EXP --device cpu` writes one, and the "
               "stated model is an H100's)\n");
    return out;
  }
  struct Group {
    std::string constants, line;
    std::vector<int> runs;
    double ms = 0.0;
  };
  std::vector<Group> groups;
  double total_ms = 0.0;
  std::string device;
  for (const ExpandedRun& r : runs) {
    const CostModel m = choice.cache ? cost_model_from_bench(*choice.cache, r.cfg, a.path) : stated_cost_model(r.cfg);
    device = m.device;
    const RunCost c = run_cost(r.cfg, m);
    const std::string k = constants_text(m), line = run_line(c);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.constants == k && x.line == line; });
    if (g == groups.end()) {
      groups.push_back({k, line, {}, 0.0});
      g = groups.end() - 1;
    }
    g->runs.push_back(r.index);
    g->ms += c.total_ms();
    total_ms += c.total_ms();
  }
  const bool cpu = device == "cpu";
  out += msg("predicted device time: ", num(total_ms / 3.6e6), cpu ? " CPU-hours (" : " GPU-hours (",
             msg(total_ms / 1000.0), " s) on ", device, ", one run at a time per device\n");
  if (choice.cache)
    out += msg("  from: bench file ", choice.cache->path, " (last written ", choice.cache->latest(),
               "); quantities it lacks from the stated H100 model\n");
  else
    out += msg("  from: the stated H100 model (kernels/PERF.md, \"Arms at the GPU's throughput: plan\"): ", choice.why,
               "; `mxlab bench EXP --device cuda --arms K --log-steps N` writes one there, --bench-file FILE reads "
               "another\n");
  out += "  rough: every arm costs what the benched recipe's arm does; snapshots, checkpoints and runs sharing a "
         "device are not counted\n";
  for (const std::string& f : choice.skipped) out += msg("  skipped ", f, ": not a bench cache file\n");
  bool one_model = true;
  for (const Group& g : groups) one_model = one_model && g.constants == groups.front().constants;
  if (one_model) out += groups.front().constants;
  for (const Group& g : groups) {
    if (!one_model) out += g.constants;
    out += g.runs.size() == 1 ? msg("  run ", g.runs.front(), ": ", g.line, "\n")
                              : msg("  runs ", index_ranges(g.runs), " (", g.runs.size(), "): ", g.line, "; ",
                                    num(g.ms / 3.6e6), " h in all\n");
  }
  return out;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "plan", "List the runs an experiment expands to (run ids and swept values) and predict their device time");
  sub->add_option("config", args->path, "experiment YAML file")->required();
  sub->add_option("--set", args->sets, "override a key of every run, e.g. --set steps=200 (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--bench-file", args->bench_file,
                  "predict from this bench cache file (default: the newest of the device in "
                  "$XDG_CACHE_HOME/mxlab/bench, which mxlab bench writes)");
  sub->add_option("--device", args->device,
                  "whose bench to predict from: cpu, cuda (any GPU) or part of a GPU's name, e.g. h100 (default: the "
                  "experiment's device key; auto counts as a GPU)");
  sub->callback([args] {
    const std::vector<ExpandedRun> runs = expand_experiment(args->path, args->sets);
    if (const std::string w = precision_only_sweep_warning(runs); !w.empty())
      std::fprintf(stderr, "mxlab: warning: %s\n", w.c_str());
    const std::string prediction = prediction_text(*args, runs);
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> header = {"index", "run_id"};
    for (const auto& kv : runs.front().swept) header.push_back(kv.first);
    rows.push_back(header);
    for (const ExpandedRun& r : runs) {
      std::vector<std::string> row = {std::to_string(r.index), r.id};
      for (const auto& kv : r.swept) row.push_back(kv.second);
      rows.push_back(row);
    }
    const std::string out = aligned_table(rows) + "total: " + std::to_string(runs.size()) +
                            (runs.size() == 1 ? " run\n" : " runs\n") + prediction;
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
});

}  // namespace
}  // namespace mxlab::cli
