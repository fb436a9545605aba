// run_one: one configuration from start (or its latest checkpoint) to its final file.
#include "lab/train/run_driver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "lab/core/error.h"
#include "lab/train/checkpoint.h"
#include "lab/train/config_io.h"
#include "lab/train/run_file.h"
#include "lab/train/trainer.h"
#include "mxlab_build_info.h"

namespace mxlab {

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void make_dirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        throw Error(msg("cannot create output directory ", cur, ": ", std::strerror(errno)));
    }
    if (i < dir.size()) cur += dir[i];
  }
}

bool file_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const long v = static_cast<long>(s + 0.5);
  char buf[32];
  if (v >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", v / 3600, (v / 60) % 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", v / 60, v % 60);
  return buf;
}

}  // namespace

const std::atomic<bool>* install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return &g_stop;
}

RunOutcome run_one(const RunConfig& cfg_in, const RunOptions& opt) {
  RunConfig cfg = cfg_in;
  if (!opt.device.empty()) cfg.device = opt.device;
  if (!opt.make_backend) throw Error("run_one: no backend factory given");
  RunOutcome out;
  out.run_id = config_hash(cfg);
  make_dirs(opt.out_dir);
  out.path = opt.out_dir + "/" + out.run_id + ".h5";

  // A finished file of the same configuration is a result: never recompute it.
  if (file_exists(out.path)) {
    const std::string status = RunFile::peek_root_str(out.path, "status");
    const std::string id = RunFile::peek_root_str(out.path, "run_id");
    if ((status == "complete" || status == "diverged") && id == out.run_id) {
      out.status = "skipped";
      return out;
    }
  }

  std::unique_ptr<Backend> be = opt.make_backend(cfg.device);

  // Resume from the latest valid checkpoint of an unfinished file of this configuration.
  std::unique_ptr<RunFile> file;
  int64_t resume_step = 0;
  std::string resume_ckpt;
  if (file_exists(out.path) && RunFile::peek_root_str(out.path, "run_id") == out.run_id) {
    const std::vector<int64_t> steps = list_checkpoints(opt.out_dir, out.run_id);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const std::string p = checkpoint_path(opt.out_dir, out.run_id, *it);
      try {
        checkpoint_step(p, out.run_id);
        resume_step = *it;
        resume_ckpt = p;
        break;
      } catch (const Error& e) {
        std::fprintf(stderr, "mxlab: warning: %s; trying an earlier one\n", e.what());
      }
    }
    if (!resume_ckpt.empty()) {
      try {
        file = RunFile::open(out.path);
      } catch (const Error& e) {
        std::fprintf(stderr, "mxlab: warning: cannot reopen %s (%s): starting the run again\n", out.path.c_str(), e.what());
        file.reset();
        resume_ckpt.clear();
        resume_step = 0;
      }
    }
  }
  if (!file) {
    Attrs root;
    root.ints["schema_version"] = kSchemaVersion;
    root.str["mxlab_version"] = MXLAB_VERSION;
    root.str["git_commit"] = MXLAB_GIT_COMMIT;
    root.str["build_type"] = MXLAB_BUILD_TYPE;
    root.str["device"] = be->name();
    root.str["math_mode"] = be->math_mode();
    for (const auto& [k, v] : be->describe()) root.str[k] = v;
    root.ints["seed"] = static_cast<int64_t>(cfg.seed);
    root.str["run_id"] = out.run_id;
    root.str["config_yaml"] = dump_config(cfg);
    root.str["start_time"] = utc_now();
    root.str["status"] = "running";
    root.ints["steps"] = cfg.steps;
    file = RunFile::create(out.path, root);
  }

  Trainer trainer(cfg, *be, *file);
  if (resume_ckpt.empty()) {
    trainer.open_output();
  } else {
    load_checkpoint(trainer, out.run_id, resume_ckpt);
    file->truncate_from(resume_step);
    Attrs a;
    a.str["status"] = "running";
    file->set_root_attrs(a);
    out.resumed = true;
    out.resumed_from = resume_step;
    if (opt.progress) std::fprintf(stderr, "%s resuming %s from step %lld\n", opt.label.c_str(), out.run_id.c_str(), static_cast<long long>(resume_step));
  }
  file->flush();

  RunControl ctl;
  ctl.stop_requested = [&] { return opt.stop && opt.stop->load(); };
  ctl.checkpoint = [&](int64_t step) {
    file->flush();  // every row before the checkpoint is on disk before the checkpoint is
    save_checkpoint(trainer, out.run_id, checkpoint_path(opt.out_dir, out.run_id, step));
  };
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t first = trainer.step();
  if (opt.progress) {
    ctl.progress = [&](int64_t step, const std::string& losses) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = el > 0 ? static_cast<double>(step + 1 - first) / el : 0.0;
      const double eta = rate > 0 ? static_cast<double>(cfg.steps - step - 1) / rate : -1.0;
      std::fprintf(stderr, "\r%s %s step %lld/%d  %s  %.0f steps/s  ETA %s   ", opt.label.c_str(),
                   out.run_id.c_str(), static_cast<long long>(step + 1), cfg.steps, losses.c_str(), rate,
                   format_duration(eta).c_str());
      std::fflush(stderr);
    };
  }
  std::string status = trainer.run(ctl);
  if (opt.progress) std::fprintf(stderr, "\n");
  if (status == "interrupted") {
    file->flush();
    save_checkpoint(trainer, out.run_id, checkpoint_path(opt.out_dir, out.run_id, trainer.step()));
  }
  trainer.finish(status);
  Attrs end;
  end.str["end_time"] = utc_now();
  file->set_root_attrs(end);
  file->flush();
  out.status = status;
  return out;
}

}  // namespace mxlab
