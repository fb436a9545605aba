// `mxlab plan EXP.yaml [--set KEY=VALUE ...]`: the runs an experiment expands to (index, run id,
// the swept keys and their values) and the total, without running anything, so a sweep can
// be checked before it is launched and a run id traced back to its settings.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lab/core/text_table.h"
#include "lab/cli/commands.h"
#include "lab/config/sweep.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 20;  // right after `run` in --help

struct Args {
  std::string path;
  std::vector<std::string> sets;
};


const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("plan", "List the runs an experiment expands to (run ids and swept values)");
  sub->add_option("config", args->path, "experiment YAML file")->required();
  sub->add_option("--set", args->sets, "override a key of every run, e.g. --set steps=200 (repeatable)")
      ->allow_extra_args(false);
  sub->callback([args] {
    const std::vector<ExpandedRun> runs = expand_experiment(args->path, args->sets);
    if (const std::string w = precision_only_sweep_warning(runs); !w.empty())
      std::fprintf(stderr, "mxlab: warning: %s\n", w.c_str());
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> header = {"index", "run_id"};
    for (const auto& kv : runs.front().swept) header.push_back(kv.first);
    rows.push_back(header);
    for (const ExpandedRun& r : runs) {
      std::vector<std::string> row = {std::to_string(r.index), r.id};
      for (const auto& kv : r.swept) row.push_back(kv.second);
      rows.push_back(row);
    }
    const std::string out = aligned_table(rows) + "total: " + std::to_string(runs.size()) + (runs.size() == 1 ? " run\n" : " runs\n");
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
});

}  // namespace
}  // namespace mxlab::cli
