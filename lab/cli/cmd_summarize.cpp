// `mxlab summarize DIR [--csv]`: one row per run and branch of a results directory (status,
// divergence, spikes, losses, bias, last-bin; the keys that differ between runs as columns),
// the C++ twin of `python -m mxlab_analysis summary`. Also rebuilds DIR/index.csv.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/train/index.h"
#include "lab/train/summary_table.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 40;  // after run, plan and branch in --help

struct Args {
  std::string dir;
  bool csv = false;
  bool no_index = false;
};

int do_summarize(const Args& a) {
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
  const std::string table = summary_table(runs, a.csv);
  std::fwrite(table.data(), 1, table.size(), stdout);
  std::fflush(stdout);
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("summarize", "One row per run and branch of a results directory; rebuilds its index.csv");
  c->add_option("dir", a->dir, "results directory (the --out of mxlab run)")->required();
  c->add_flag("--csv", a->csv, "CSV instead of an aligned table");
  c->add_flag("--no-index", a->no_index, "do not rewrite DIR/index.csv (a read-only directory)");
  c->callback([a] { set_exit_code(do_summarize(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
