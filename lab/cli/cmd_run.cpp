// `mxlab run EXP.yaml`: run an experiment's configuration(s) and write one HDF5 file each.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/train/config_io.h"
#include "lab/train/run_driver.h"
#include "lab/train/run_file.h"

namespace mxlab::cli {
namespace {

struct RunArgs {
  std::string exp;
  std::string out = "runs";
  std::string device;
  int steps = 0;
  std::vector<std::string> sets;
  bool quiet = false;
};

int do_run(const RunArgs& a) {
  std::vector<std::string> overrides = a.sets;
  if (a.steps > 0) overrides.push_back("steps=" + std::to_string(a.steps));
  const RunConfig cfg = load_config(a.exp, overrides);
  RunOptions opt;
  opt.out_dir = a.out;
  opt.device = a.device;
  opt.progress = !a.quiet && ::isatty(STDERR_FILENO) && cfg.log.progress;
  opt.stop = install_stop_handlers();
  opt.make_backend = [](const std::string& dev) { return make_backend(dev); };
  const RunOutcome r = run_one(cfg, opt);
  if (r.status == "skipped") {
    std::printf("%s: already complete (%s), skipped\n", r.run_id.c_str(), r.path.c_str());
    return 0;
  }
  std::printf("%s: %s -> %s%s\n", r.run_id.c_str(), r.status.c_str(), r.path.c_str(),
              r.resumed ? msg(" (resumed from step ", r.resumed_from, ")").c_str() : "");
  if (r.status == "interrupted") {
    std::fprintf(stderr, "mxlab: interrupted; run the same command again to resume\n");
    return 130;
  }
  return 0;
}

const Registrar reg(20, [](CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Train the paired FP32/MX trajectories of an experiment YAML");
  c->add_option("experiment", a->exp, "experiment YAML file")->required()->check(CLI::ExistingFile);
  c->add_option("--out", a->out, "output directory for <run_id>.h5 files")->capture_default_str();
  c->add_option("--device", a->device, "cpu | auto | cuda | cuda:N (overrides the YAML's device)");
  c->add_option("--steps", a->steps, "override the number of steps");
  c->add_option("--set", a->sets, "override a config key: --set optimizer.lr=3e-4 (repeatable)");
  c->add_flag("--quiet", a->quiet, "no progress line");
  c->callback([a] { set_exit_code(do_run(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
