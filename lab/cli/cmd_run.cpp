// `mxlab run EXP.yaml`: run every run of an experiment that is not complete yet - N at once
// (--jobs), over the GPUs of a host (--gpus), or one shard of it (--shard i/n or a Slurm array)
// - writing <out>/<run_id>.h5 each, then rebuild <out>/index.csv and print what happened.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lab/backends/backends.h"
#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/runs/run_status.h"
#include "lab/core/exit_codes.h"
#include "lab/io/writable_dir.h"
#include "lab/runs/checkpoint.h"
#include "lab/runs/disk_use.h"
#include "lab/runs/index.h"
#include "lab/runs/memory_estimate.h"
#include "lab/runs/run_driver.h"
#include "lab/runs/run_file.h"
#include "lab/config/sweep.h"
#include "lab/runs/sweep_runner.h"

namespace mxlab::cli {
namespace {

struct RunArgs {
  std::string exp;
  std::string out = "runs";
  std::string device;
  std::string gpus;
  std::string shard;
  int jobs = 0;  // 0: 1, or one per GPU with --gpus
  int steps = 0;
  std::string keep_checkpoints = "2";
  std::vector<std::string> sets;
  bool quiet = false;
  bool dry_run = false;
  double progress_every = 30.0;  // seconds between plain progress lines when stderr is not a terminal
};

// What a run would do, without doing it (--dry-run).
std::string pending_state(const ExpandedRun& r, const std::string& out) {
  const std::string path = out + "/" + r.id + ".h5";
  if (::access(path.c_str(), F_OK) != 0) return "run";
  const std::string holder = live_lock_holder(out, r.id);
  if (!holder.empty()) return "busy (locked by " + holder + ")";
  const std::string status = RunFile::peek_root_str(path, "status");
  const std::optional<RunStatus> parsed = parse_run_status(status);
  if (parsed && is_finished(*parsed)) return "skip (" + status + ")";
  const std::string shown = status.empty() ? to_string(RunStatus::unreadable) : status;
  const std::vector<int64_t> ck = list_checkpoints(out, r.id);
  if (!ck.empty()) return msg("resume (", shown, ", checkpoint at step ", ck.back(), ")");
  return msg("run again (", shown, ", no checkpoint)");
}

int do_run(const RunArgs& a) {
  std::vector<std::string> overrides = a.sets;
  if (a.steps > 0) overrides.push_back("steps=" + std::to_string(a.steps));
  const std::vector<ExpandedRun> all = expand_experiment(a.exp, overrides);
  if (const std::string w = precision_only_sweep_warning(all); !w.empty())
    std::fprintf(stderr, "mxlab: warning: %s\n", w.c_str());

  std::optional<ShardSpec> shard;
  if (!a.shard.empty()) shard = parse_shard(a.shard);
  else shard = shard_from_env([](const char* name) { return std::getenv(name); });
  const std::vector<ExpandedRun> runs = shard ? select_shard(all, *shard) : all;
  if (shard)
    std::fprintf(stderr, "mxlab: shard %d/%d (%s): %zu of %zu runs\n", shard->index, shard->count,
                 shard->origin.c_str(), runs.size(), all.size());

  SweepOptions opt;
  opt.out_dir = a.out;
  opt.device = a.device;
  opt.keep_checkpoints = parse_keep_checkpoints(a.keep_checkpoints, 1);
  if (!a.gpus.empty()) {
    opt.gpus = parse_gpu_list(a.gpus);
    if (!a.device.empty()) throw Error("--gpus and --device exclude each other (--gpus 0,1 runs on cuda:0 and cuda:1)");
  }
  opt.jobs = a.jobs > 0 ? a.jobs : (opt.gpus.empty() ? 1 : static_cast<int>(opt.gpus.size()));
  if (!opt.gpus.empty() && opt.jobs < static_cast<int>(opt.gpus.size()))
    std::fprintf(stderr, "mxlab: warning: --jobs %d < %zu GPUs: only the first %d are used\n", opt.jobs,
                 opt.gpus.size(), opt.jobs);

  if (a.dry_run) {
    for (const ExpandedRun& r : runs) {
      std::string sw;
      for (const auto& [k, v] : r.swept) sw += "  " + k + "=" + v;
      std::printf("%d %s %s%s\n", r.index, r.id.c_str(), pending_state(r, a.out).c_str(), sw.c_str());
    }
    std::printf("%zu runs in this shard, %zu in the experiment\n", runs.size(), all.size());
    return 0;
  }
  if (runs.empty()) {
    std::printf("no runs in this shard (%zu runs in the experiment, %d shards): nothing to do\n", all.size(),
                shard ? shard->count : 1);
    return 0;
  }

  // A device that cannot be opened, or an --out that cannot be written, would fail every run the
  // same way: say it once, up front.
  ensure_writable_dir(a.out);
  std::set<std::string> devices;
  if (!opt.gpus.empty()) {
    for (int j = 0; j < opt.jobs; ++j) devices.insert("cuda:" + std::to_string(opt.gpus[static_cast<size_t>(j) % opt.gpus.size()]));
  } else if (!opt.device.empty()) {
    devices.insert(opt.device);
  } else {
    for (const ExpandedRun& r : runs) devices.insert(r.cfg.device);
  }
  std::map<std::string, bool> on_cpu;  // device -> whether its runs live in host memory
  for (const std::string& d : devices) on_cpu[d] = make_backend(d)->name().rfind("cuda", 0) != 0;  // throws with the fix
  // A model too large for this machine: refused with the bytes it needs, before any run starts.
  for (const ExpandedRun& r : runs) {
    const bool cpu = opt.gpus.empty() && on_cpu[opt.device.empty() ? r.cfg.device : opt.device];
    check_run_fits_memory(r.cfg, cpu, msg(a.exp, ": run ", r.index, " (", r.id, ")"));
  }

  bool show_progress = true;
  for (const ExpandedRun& r : runs) show_progress = show_progress && r.cfg.log.progress;
  opt.live = !a.quiet && show_progress && ::isatty(STDERR_FILENO);
  if (!a.quiet && show_progress && !opt.live) opt.progress_every = a.progress_every;
  opt.stop = install_stop_handlers();
  opt.make_backend = [](const std::string& dev) { return make_backend(dev); };
  const SweepResult result = run_sweep(runs, opt);

  try {
    rebuild_index(a.out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mxlab: warning: could not rebuild %s/index.csv: %s\n", a.out.c_str(), e.what());
  }
  const std::string report = format_sweep_report(result);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  return result.exit_code;
}

const Registrar reg(20, [](CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Train the paired FP32/MX runs of an experiment YAML (every run not yet complete)");
  c->add_option("experiment", a->exp, "experiment YAML file")->required()->check(CLI::ExistingFile);
  c->add_option("--out", a->out, "output directory for <run_id>.h5 files and index.csv")->capture_default_str();
  c->add_option("--device", a->device, "cpu | auto | cuda | cuda:N (overrides the YAML's device)");
  c->add_option("--jobs,-j", a->jobs, "runs at once (threads; on one GPU they share it through concurrent streams); "
                                      "default 1, or one per GPU with --gpus")
      ->check(integer_in(1));
  c->add_option("--gpus", a->gpus, "spread the runs over these GPUs of this host, e.g. 0,1,2,3 (job j uses the "
                                   "(j mod n)-th)");
  c->add_option("--shard", a->shard, "run only runs with index % n == i (0-based), e.g. --shard 3/16; default: "
                                     "from SLURM_ARRAY_TASK_ID/COUNT (or MIN/MAX) when set");
  c->add_option("--steps", a->steps, "override the number of steps of every run")->check(integer_in(1));
  c->add_option("--set", a->sets, "override a config key of every run: --set optimizer.lr=3e-4 (repeatable)");
  c->add_option("--keep-checkpoints", a->keep_checkpoints,
                "checkpoints each run keeps besides those at intervention steps: the latest N (>= 1), or all; "
                "older ones are removed as newer ones are written")
      ->capture_default_str();
  c->add_flag("--quiet", a->quiet, "no progress: neither the live line nor the plain lines");
  c->add_option("--progress-every", a->progress_every,
                "when stderr is not a terminal (nohup, Slurm, a pipe): one plain line per active run every "
                "SECONDS (step, steps/s, ETA, latest losses); 0: none")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  c->add_flag("--dry-run", a->dry_run, "list this shard's runs and what would happen to each, run nothing");
  c->footer(exit_codes_help());
  c->callback([a] { set_exit_code(do_run(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
