// run_one: one configuration from start (or its latest checkpoint) to its final file, under a
// per-run lock so that several processes can share one results directory.
#include "lab/runs/run_driver.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <tuple>
#include <utility>
#include <thread>

#include "lab/core/error.h"
#include "lab/io/table_text.h"
#include "lab/io/h5file.h"
#include "lab/runs/checkpoint.h"
#include "lab/runs/disk_use.h"
#include "lab/config/config_io.h"
#include "lab/runs/run_records.h"
#include "lab/runs/run_file.h"
#include "lab/stats/loss_events.h"
#include "lab/train/trainer.h"
#include "mxlab_build_info.h"

namespace mxlab {

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }



void make_dirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        throw_io_error("create output directory", cur, errno);
    }
    if (i < dir.size()) cur += dir[i];
  }
}

bool file_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }



// ---- the run file behind the HDF5 mutex ----

// Forwards to a RunFile, holding hdf5_mutex() for each call (and for closing the file).
class LockedRunFile : public MetricSink {
 public:
  explicit LockedRunFile(std::unique_ptr<RunFile> f) : f_(std::move(f)) {}
  ~LockedRunFile() override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_.reset();
  }
  void open_group(const std::string& path, const Attrs& attrs, const std::map<std::string, Attrs>& da) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->open_group(path, attrs, da);
  }
  void append(const std::string& group, const MetricRow& row) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->append(group, row);
  }
  void set_group_attrs(const std::string& group, const Attrs& attrs) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->set_group_attrs(group, attrs);
  }
  void set_root_attrs(const Attrs& attrs) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->set_root_attrs(attrs);
  }
  void write_loss_history(const std::string& group, const std::vector<float>& loss) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->write_loss_history(group, loss);
  }
  void write_array(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& data) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->write_array(path, rows, cols, data);
  }
  void flush() override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->flush();
  }
  void truncate_from(int64_t step) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->truncate_from(step);
  }
  void truncate_group_from(const std::string& group, int64_t step) override {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    f_->truncate_group_from(group, step);
  }

 private:
  std::unique_ptr<RunFile> f_;
};

std::string peek(const std::string& path, const std::string& attr) {
  std::lock_guard<std::mutex> g(hdf5_mutex());
  return RunFile::peek_root_str(path, attr);
}

// RunFile::open for a resume, waiting up to h5::append_lock_wait() for another program's HDF5
// lock on the file (FileInUse after that). The wait is spent here, not under hdf5_mutex(): the
// other jobs of `mxlab run --jobs N` go on logging meanwhile.
std::unique_ptr<LockedRunFile> open_waiting_for_locks(const std::string& path) {
  std::unique_ptr<LockedRunFile> file;
  h5::retry_while_in_use(path, h5::append_lock_wait(), [&] {
    std::lock_guard<std::mutex> g(hdf5_mutex());
    file = std::make_unique<LockedRunFile>(RunFile::open(path, std::chrono::milliseconds(0)));
  });
  return file;
}

// Why `path` is not a whole record of its run ("" when it is).
std::string record_damage(const std::string& path) {
  // What summarize calls unreadable, for the same reason: the file does not open whole, or it
  // opens but is not a whole record of its run (a group of a finished run without its summary
  // attributes, a trajectory missing: run_records.h).
  const RunRecord r = read_run_record(path);  // takes hdf5_mutex itself
  if (r.readable) return "";
  // The system refused to read it: that says nothing about the file, which stays as it is.
  if (r.io_errno != 0) throw IoError(r.error, path, r.io_errno);
  // This process holds the run's lock, so the record may say `running` rather than why.
  if (r.status == RunStatus::unreadable && !r.error.empty()) return r.error;
  return "it is not a whole record of its run (`mxlab summarize` of its folder says why)";
}

// Earliest divergence over the MX arms recorded in a finished file, counted as the run's status
// counts it (diverged_at); ties go to the arm listed first: (step, arm); (-1, "") if none. The
// same for the excursion (its `excursion_step` attribute; files written before it have none).
std::pair<int64_t, std::string> recorded_divergence(const std::string& path,
                                                    std::pair<int64_t, std::string>* excursion) {
  std::lock_guard<std::mutex> g(hdf5_mutex());
  std::pair<int64_t, std::string> best{-1, ""};
  *excursion = {-1, ""};
  try {
    h5::H5File f(path, h5::H5File::Mode::read);
    std::vector<std::string> arms{"mx"};
    if (f.has_attr("/", "arms")) {
      const std::vector<std::string> a = f.get_attr_strings("/", "arms");
      if (!a.empty()) arms = a;
    }
    for (const std::string& arm : arms) {
      const std::string grp = "trajectories/" + arm;
      if (!f.is_group(grp) || !f.has_attr(grp, "divergence_step")) continue;
      const int64_t d = diverged_at(f.get_attr_int64(grp, "divergence_step"),
                                    f.has_attr(grp, "first_nonfinite_step") ? f.get_attr_int64(grp, "first_nonfinite_step") : -1);
      if (d >= 0 && (best.first < 0 || d < best.first)) best = {d, arm};
      const int64_t x = f.has_attr(grp, "excursion_step") ? f.get_attr_int64(grp, "excursion_step") : -1;
      if (x >= 0 && (excursion->first < 0 || x < excursion->first)) *excursion = {x, arm};
    }
  } catch (const Error&) {
  }
  return best;
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

  // The lock comes before any look at the file: a process that finished the run just before
  // we got the lock has set its final status by then.
  RunLock lock;
  try {
    if (opt.lock && !lock.try_acquire(opt.out_dir, out.run_id)) {
      out.status = RunStatus::busy;
      out.error = "being run by another process (locked by " + lock.holder() + ")";
      return out;
    }
  } catch (const std::exception& e) {
    out.status = RunStatus::failed;
    out.error = e.what();
    return out;
  }

  // A finished file of the same configuration is a result: never recompute it.
  std::string finished_damage;  // a finished file of this run that is not a whole record: why
  try {
    if (file_exists(out.path)) {
      const std::optional<RunStatus> status = parse_run_status(peek(out.path, "status"));
      const std::string id = peek(out.path, "run_id");
      if (status && is_finished(*status) && id == out.run_id) {
        // What was read may be its snapshot's: a damaged file is put back from it (run_file.h).
        finished_damage = record_damage(out.path);
        if (!finished_damage.empty()) {
          try {
            open_waiting_for_locks(out.path);
          } catch (const FileInUse& e) {
            out.status = RunStatus::busy;
            out.error = e.what();
            return out;
          } catch (const std::exception& e) {
            out.status = RunStatus::failed;
            out.error = e.what();
            return out;
          }
          finished_damage = record_damage(out.path);
        }
        // A finished file that is still not a whole record (no snapshot could mend it) is not a
        // result: the run starts again from step 0 and says so (below).
        if (finished_damage.empty()) {
          out.status = RunStatus::skipped;
          std::pair<int64_t, std::string> excursion;
          std::tie(out.divergence_step, out.divergence_arm) = recorded_divergence(out.path, &excursion);
          std::tie(out.excursion_step, out.excursion_arm) = excursion;
          return out;
        }
      }
    }
  } catch (const IoError& e) {
    // The system refused to look at the file (a read, the check's process): the run fails and
    // its file stays as it is; the same command decides once the system allows it.
    out.status = RunStatus::failed;
    out.error = e.what();
    return out;
  }

  std::unique_ptr<LockedRunFile> file;
  try {
    std::unique_ptr<Backend> be = opt.make_backend(cfg.device);

    // Resume from the latest valid checkpoint of an unfinished file of this configuration.
    int64_t resume_step = 0;
    std::string resume_ckpt;
    std::string restart_why;  // why a file of this run that is there is replaced by a new one
    const bool had_file = file_exists(out.path);
    const std::string had_id = had_file ? peek(out.path, "run_id") : "";
    if (!finished_damage.empty()) {
      // Its results cannot be trusted in part: the run starts again rather than resume over it.
      restart_why = msg("it is a finished run but damaged (", finished_damage, ")");
    } else if (had_file && had_id == out.run_id) {
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
          file = open_waiting_for_locks(out.path);
        } catch (const IoError&) {
          throw;  // a full disk is no reason to start over (and truncate the file): fail, keep it
        } catch (const FileInUse& e) {
          // Another program has the file open: the run is left as it is, to resume later.
          out.status = RunStatus::busy;
          out.error = e.what();
          return out;
        } catch (const Error& e) {
          restart_why = msg("it cannot be reopened (", e.what(), ")");
          file.reset();
          resume_ckpt.clear();
          resume_step = 0;
        }
      }
    }
    // Starting from step 0 over a file of this run is silent only when that file is readable
    // and simply has no checkpoint yet (killed early): anything else is said on stderr, in the
    // report and in the new file's `restart_reason`.
    if (had_file && !file && restart_why.empty()) {
      const std::string damage = record_damage(out.path);
      if (!damage.empty())
        restart_why = msg("it is damaged (", damage, ") and ",
                          had_id == out.run_id ? "no checkpoint of the run is valid" : "has no readable snapshot");
      else if (had_id != out.run_id)
        restart_why = had_id.empty() ? std::string("it is not an mxlab run file (no run_id)")
                                     : msg("it holds run ", had_id, ", not this one");
    }
    if (!restart_why.empty()) {
      std::fprintf(stderr, "mxlab: warning: %s: %s: starting the run again from step 0\n", out.path.c_str(),
                   restart_why.c_str());
      out.note = "started again from step 0 (the file there was damaged or not this run's)";
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
      root.str["status"] = to_string(RunStatus::running);
      root.ints["steps"] = cfg.steps;
      if (!restart_why.empty()) root.str["restart_reason"] = "the file of this run found here was replaced: " + restart_why;
      std::lock_guard<std::mutex> g(hdf5_mutex());
      file = std::make_unique<LockedRunFile>(RunFile::create(out.path, root));
    }

    Trainer trainer(cfg, *be, *file);
    if (resume_ckpt.empty()) {
      trainer.open_output();
    } else {
      load_checkpoint(trainer, out.run_id, resume_ckpt);
      file->truncate_from(resume_step);
      Attrs a;
      a.str["status"] = to_string(RunStatus::running);
      a.str["error"] = "";  // a failed run that is run again starts with a clean slate
      file->set_root_attrs(a);
      out.resumed = true;
      out.resumed_from = resume_step;
      if (opt.progress)
        std::fprintf(stderr, "%s resuming %s from step %lld\n", opt.label.c_str(), out.run_id.c_str(),
                     static_cast<long long>(resume_step));
    }
    file->flush();

    std::vector<int64_t> branch_points;  // checkpoints never pruned: the interventions' steps
    for (const auto& iv : cfg.interventions) branch_points.push_back(iv.at);
    RunControl ctl;
    ctl.stop_requested = [&] {
      lock.heartbeat();
      return opt.stop && opt.stop->load();
    };
    ctl.checkpoint = [&](int64_t step) {
      file->flush();  // every row before the checkpoint is on disk before the checkpoint is
      save_checkpoint(trainer, out.run_id, checkpoint_path(opt.out_dir, out.run_id, step));
      prune_checkpoints(opt.out_dir, out.run_id, branch_points, opt.keep_checkpoints);  // disk_use.h
    };
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t first = trainer.step();
    ctl.progress = [&](int64_t step, const std::string& losses) {
      if (opt.on_progress) {
        RunProgress p;
        p.run_id = out.run_id;
        p.step = step + 1;
        p.steps = cfg.steps;
        p.losses = losses;
        opt.on_progress(p);
      }
      if (!opt.progress) return;
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = el > 0 ? static_cast<double>(step + 1 - first) / el : 0.0;
      const double eta = rate > 0 ? static_cast<double>(cfg.steps - step - 1) / rate : -1.0;
      std::fprintf(stderr, "\r%s %s step %lld/%d  %s  %.0f steps/s  ETA %s   ", opt.label.c_str(),
                   out.run_id.c_str(), static_cast<long long>(step + 1), cfg.steps, losses.c_str(), rate,
                   format_duration(eta).c_str());
      std::fflush(stderr);
    };
    const RunStatus status = run_status_of(trainer.run(ctl));
    if (opt.progress) std::fprintf(stderr, "\n");
    if (status == RunStatus::interrupted) {
      file->flush();
      save_checkpoint(trainer, out.run_id, checkpoint_path(opt.out_dir, out.run_id, trainer.step()));
      prune_checkpoints(opt.out_dir, out.run_id, branch_points, opt.keep_checkpoints);
    }
    trainer.finish(to_string(status));
    Attrs end;
    end.str["end_time"] = utc_now();
    file->set_root_attrs(end);
    file->flush();
    out.status = status;
    out.steps_run = trainer.step() - first;
    // The earliest divergence over the arms (a non-finite loss counts at its step).
    for (size_t a = 1; a <= trainer.num_arms(); ++a) {
      const LossSummary s = trainer.summary(a);
      const int64_t d = diverged_at(s);
      if (d >= 0 && (out.divergence_step < 0 || d < out.divergence_step)) {
        out.divergence_step = d;
        out.divergence_arm = trainer.trajectory(a).name;
      }
      if (s.excursion.event && (out.excursion_step < 0 || s.excursion.step < out.excursion_step)) {
        out.excursion_step = s.excursion.step;
        out.excursion_arm = trainer.trajectory(a).name;
      }
    }
    if (is_finished(status)) {
      // Nothing resumes a finished run, so its snapshot goes, once the closed file reads back
      // whole (a kill before that leaves it for `mxlab gc`; disk_use.h).
      file.reset();
      const std::string damage = record_damage(out.path);
      if (damage.empty()) {
        ::unlink(RunFile::snapshot_path(out.path).c_str());
      } else {
        // Damaged on disk under the writer (another process, the disk): what it says cannot be
        // trusted, so the run is not reported finished.
        out.status = RunStatus::failed;
        out.error = msg("the run finished but its file ", out.path, " does not read back whole (", damage,
                        "): its results cannot be trusted; run the same command again to train it anew");
      }
    }
  } catch (const std::exception& e) {
    if (opt.progress) std::fprintf(stderr, "\n");
    out.status = RunStatus::failed;
    out.error = e.what();
    if (file) {
      // When a write into the run file itself failed (disk full, ...), writing the failure into
      // it would fail again and damage it further: drop it and put its last good state back.
      const auto* io = dynamic_cast<const IoError*>(&e);
      const bool run_file_broken = io && (io->path() == out.path || io->path() == RunFile::snapshot_path(out.path));
      bool keep = false;
      if (!run_file_broken) {
        try {
          Attrs a;
          a.str["status"] = to_string(RunStatus::failed);
          a.str["error"] = out.error;
          a.str["end_time"] = utc_now();
          file->set_root_attrs(a);
          file->flush();
          keep = true;
        } catch (const IoError&) {
        } catch (const std::exception& e2) {
          out.error += msg(" (and the file could not be marked failed: ", e2.what(), ")");
          keep = true;
        }
      }
      if (!keep) {
        file.reset();  // its close fails too; HDF5's view of the file is abandoned
        out.error += "; " + RunFile::restore_snapshot(out.path);
      }
    }
  }
  return out;
}

}  // namespace mxlab
