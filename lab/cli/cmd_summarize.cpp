// `mxlab summarize DIR [--csv]`: one row per run and branch of a results directory (status,
// events, divergence to the end, spikes, losses, bias, last-bin; the keys that differ between
// runs as columns), the C++ twin of `python -m mxlab summary`. Also rebuilds
// DIR/index.csv.
// `mxlab summarize DIR --by KEY[,KEY...] [--compare]`: the trajectories grouped by those keys,
// with excursion and survival statistics per group and tests per pair (group_stats.h).
// --excursion-factor/-window/-block: the excursion rule the events are read with (lab/stats/loss_events.h);
// --tail-steps: the tail of tail_log_ratio.
// --where KEY=VALUE (repeatable): only the runs with those configuration values (run_filter.h).
// --within KEY[,KEY...]: with --compare, only pairs of groups with the same values of those --by
// keys; --compare-csv FILE: the pairs table as one CSV file (pandas reads it; stdout unchanged).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/report/group_stats.h"
#include "lab/runs/index.h"
#include "lab/report/run_events.h"
#include "lab/report/run_filter.h"
#include "lab/io/table_text.h"
#include "lab/report/summary_table.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 40;  // after run, plan and branch in --help

constexpr size_t kMaxLeftOutLines = 10;  // notes on stderr about runs left out of --by

struct Args {
  std::string dir;
  bool csv = false;
  bool no_index = false;
  std::string by;  // KEY[,KEY...]
  bool by_given = false;
  GroupingOptions grouping;
  bool compare = false;
  std::vector<std::string> where;  // KEY=VALUE
  std::string within;              // KEY[,KEY...]
  std::string compare_csv;         // FILE
};

std::vector<std::string> split_keys(const std::string& text) {
  std::vector<std::string> keys(1);
  for (char c : text) {
    if (c == ',') keys.emplace_back();
    else keys.back() += c;
  }
  return keys;
}

std::string grouped(const std::vector<RunRecord>& runs, const Args& a) {
  GroupingOptions opt = a.grouping;
  opt.keys = split_keys(a.by);
  if (!a.within.empty()) opt.within = split_keys(a.within);
  const GroupedOutcomes g = group_outcomes(runs, opt);
  for (size_t i = 0; i < g.left_out.size() && i < kMaxLeftOutLines; ++i)
    std::fprintf(stderr, "mxlab: note: left out %s\n", g.left_out[i].c_str());
  if (g.left_out.size() > kMaxLeftOutLines)
    std::fprintf(stderr, "mxlab: note: left out %zu more\n", g.left_out.size() - kMaxLeftOutLines);
  if (g.groups.empty())
    throw Error(msg(a.dir, ": no trajectory of a finished run (status complete or diverged) to group"));
  if (!a.compare_csv.empty()) write_text_atomically(a.compare_csv, pairs_csv(g));
  return grouped_tables(g, a.compare, a.csv);
}

int do_summarize(const Args& a) {
  std::vector<WhereClause> where;
  for (const std::string& w : a.where) where.push_back(parse_where(w));
  const std::string problem = excursion_rule_problem(a.grouping.events.excursion);
  if (!problem.empty()) throw Error("--excursion-factor/--excursion-window/--excursion-block: " + problem);
  // Read without HDF5's file lock, as the Python side does: a run in progress holds its file
  // open for writing, and a locked open would refuse to read it. This process writes no HDF5.
  ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);
  std::vector<RunRecord> runs;
  if (a.no_index) {
    runs = scan_run_dir(a.dir);
  } else {
    try {
      runs = rebuild_index(a.dir);
    } catch (const Error& e) {
      // A read-only directory can still be summarized.
      std::fprintf(stderr, "mxlab: warning: could not rebuild %s/index.csv: %s\n", a.dir.c_str(), e.what());
      runs = scan_run_dir(a.dir);
    }
  }
  if (runs.empty()) throw Error(msg(a.dir, ": no .h5 run files in this directory (give the --out directory of mxlab run)"));
  runs = filter_runs(std::move(runs), where);
  read_events(runs, a.grouping.events);
  const std::string table = !a.by_given ? summary_table(runs, a.csv) : grouped(runs, a);
  std::fwrite(table.data(), 1, table.size(), stdout);
  std::fflush(stdout);
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("summarize", "One row per run and branch of a results directory, or with --by statistics per group of "
                                    "trajectories; rebuilds its index.csv");
  c->add_option("dir", a->dir, "results directory (the --out of mxlab run)")->required();
  c->add_flag("--csv", a->csv, "CSV instead of an aligned table");
  c->add_flag("--no-index", a->no_index, "do not rewrite DIR/index.csv (a read-only directory)");
  CLI::Option* by =
      c->add_option("--by", a->by,
                    "group the trajectories of the finished runs by these keys (comma-separated: arm = the "
                    "trajectory's name, or configuration keys such as optimizer.lr): per group n, excursions with a "
                    "Wilson 95% interval, median excursion step and Kaplan-Meier survival of steps to excursion, "
                    "diverged to the end, degraded, final-loss and tail log-ratio to FP32 (lab/report/README.md)")
          ->type_name("KEY[,KEY...]");
  c->add_flag("--compare", a->compare,
              "with --by: a second table, every pair of groups: Fisher's exact test of the excursion counts, "
              "log-rank test of steps to excursion, paired by seed: exact McNemar test and the stratified log-rank "
              "with its within-seed label-permutation p")
      ->needs(by);
  c->add_option("--where", a->where,
                 "only the runs whose configuration has this value (repeatable; numbers compared as numbers: "
                 "optimizer.lr=6e-4 matches 0.0006)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c->add_option("--compare-csv", a->compare_csv,
                "with --by: write the pairs table of --compare to this CSV file (one table, header first), "
                "whether or not --compare prints it")
      ->type_name("FILE")
      ->needs(by);
  c->add_option("--within", a->within,
                "with --compare or --compare-csv: only pairs of groups with the same values of these --by keys "
                "(--by arm,optimizer.lr --within optimizer.lr: the arms compared at each learning rate)")
      ->type_name("KEY[,KEY...]")
      ->needs(by);
  ExcursionRule& ex = a->grouping.events.excursion;
  c->add_option("--excursion-factor", ex.factor,
                "excursion: a loss block's minimum above this x the minimum of the blocks before (lab/stats/README.md)")
      ->capture_default_str();
  c->add_option("--excursion-window", ex.window,
                "excursion: for this many steps (a multiple of --excursion-block); known this many steps after it")
      ->capture_default_str();
  c->add_option("--excursion-block", ex.block, "excursion: steps per loss block (its minimum is its value)")
      ->capture_default_str();
  c->add_option("--tail-steps", a->grouping.events.tail_steps,
                "tail_log_ratio: median of log(loss / FP32 loss) over this many last shared steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_flag("--branches", a->grouping.branches, "with --by: also the intervention branches (arm = branch name)")
      ->needs(by);
  c->add_option("--degraded-factor", a->grouping.degraded_factor,
                "with --by: degraded = final loss > this x the run's FP32 min loss")
      ->capture_default_str()
      ->check(finite_positive())
      ->needs(by);
  c->callback([a, by] {
    a->by_given = by->count() > 0;
    if (!a->within.empty() && !a->compare && a->compare_csv.empty())
      throw Error("--within restricts the pairs of --compare / --compare-csv FILE: give one of them");
    set_exit_code(do_summarize(*a));
  });
});

}  // namespace
}  // namespace mxlab::cli
