// run_sweep: the runs of an experiment over N job threads, with live progress and a report.
#include "lab/runs/sweep_runner.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "lab/core/error.h"
#include "lab/io/table_text.h"
#include "lab/core/exit_codes.h"
#include "lab/io/out_file.h"
#include "lab/core/text_table.h"

namespace mxlab {

namespace {

constexpr auto kLiveRefresh = std::chrono::milliseconds(250);
constexpr size_t kDefaultTerminalWidth = 120;

// A whole decimal integer, or an error naming where it came from.
long parse_long(const std::string& text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) throw Error(msg(what, ": expected a whole number, got ", quoted_excerpt(text)));
  return v;
}


std::string swept_text(const std::vector<std::pair<std::string, std::string>>& swept) {
  std::string s;
  for (const auto& [k, v] : swept) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

size_t terminal_width() {
  struct winsize ws {};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return kDefaultTerminalWidth;
}


// What one job is doing, for the live line. Written by the job on log steps, read by the
// monitor; the mutex is per job, so jobs never wait for each other.
struct JobState {
  std::mutex m;
  bool active = false;
  std::string run_id, losses;
  int64_t step = 0, steps = 0;
  // The first and the latest log step this process saw of the run, and when: the run's average
  // rate for the plain progress lines (a stable ETA, not the last interval's).
  int64_t first_step = -1;
  std::chrono::steady_clock::time_point first_time, last_time;
};

// One plain progress line of a job (SweepOptions::progress_every): "[done/total] run_id step
// s/n  r steps/s  ETA t  fp32 0.0152  mx 0.0165". The rate is the average since the first log
// step seen; the ETA counts down from the latest log step, so it does not grow between updates.
std::string plain_progress_line(JobState& js, size_t done, size_t total, std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> g(js.m);
  std::string line = msg("mxlab: [", done, "/", total, "] ", js.run_id);
  if (js.first_step < 0) return line + " starting";
  line += msg(" step ", js.step, "/", js.steps);
  const double span = std::chrono::duration<double>(js.last_time - js.first_time).count();
  const double rate = span > 0 ? static_cast<double>(js.step - js.first_step) / span : 0.0;
  if (rate > 0) {
    const double since = std::chrono::duration<double>(now - js.last_time).count();
    const double eta = std::max(0.0, static_cast<double>(js.steps - js.step) / rate - since);
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %.3g steps/s", rate);
    line += buf;
    line += "  ETA " + format_duration(eta);
  } else {
    line += "  ? steps/s  ETA ?";
  }
  if (!js.losses.empty()) line += "  " + js.losses;
  return line;
}

}  // namespace

ShardSpec parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  const std::string form = " (expected i/n with 0 <= i < n, e.g. --shard 0/4)";
  const std::string option = "--shard " + excerpt(text);
  if (slash == std::string::npos) throw Error(msg(option, ": no '/'", form));
  long index = 0, count = 0;
  try {
    index = parse_long(text.substr(0, slash), option);
    count = parse_long(text.substr(slash + 1), option);
  } catch (const Error& e) {
    throw Error(e.what() + form);
  }
  // Checked before narrowing to int: 0/4294967297 is not shard 0 of 1.
  if (count < 1 || count > INT_MAX || index < 0 || index >= count) throw Error(msg(option, ": out of range", form));
  ShardSpec s;
  s.index = static_cast<int>(index);
  s.count = static_cast<int>(count);
  s.origin = option;
  return s;
}

std::optional<ShardSpec> shard_from_env(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) -> std::optional<long> {
    const char* v = getenv(name);
    if (!v || !*v) return std::nullopt;
    return parse_long(v, name);
  };
  const std::optional<long> id = get("SLURM_ARRAY_TASK_ID");
  if (!id) return std::nullopt;
  const std::optional<long> min = get("SLURM_ARRAY_TASK_MIN"), max = get("SLURM_ARRAY_TASK_MAX");
  const std::optional<long> count = get("SLURM_ARRAY_TASK_COUNT"), step_env = get("SLURM_ARRAY_TASK_STEP");
  const std::string fix = " (pass --shard i/n explicitly, or submit the array as a range such as --array=0-15)";
  ShardSpec s;
  if (min && max) {
    const long step = step_env.value_or(1);
    if (step < 1 || *max < *min) throw Error(msg("Slurm array ", *min, "-", *max, ":", step, " is not a range", fix));
    const long n = (*max - *min) / step + 1;
    if (n > INT_MAX) throw Error(msg("Slurm array ", *min, "-", *max, ":", step, " has more than ", INT_MAX, " tasks", fix));
    if (*id < *min || *id > *max || (*id - *min) % step != 0)
      throw Error(msg("SLURM_ARRAY_TASK_ID=", *id, " is not a task of the array ", *min, "-", *max, ":", step, fix));
    if (count && *count != n)
      throw Error(msg("Slurm array ", *min, "-", *max, ":", step, " has ", *count, " tasks, not ", n,
                      ": it is not a regular range", fix));
    s.index = static_cast<int>((*id - *min) / step);
    s.count = static_cast<int>(n);
    s.origin = msg("SLURM_ARRAY_TASK_ID=", *id, " of the array ", *min, "-", *max, step > 1 ? msg(":", step) : "");
  } else if (count) {
    if (*count < 1 || *count > INT_MAX || *id < 0 || *id >= *count)
      throw Error(msg("SLURM_ARRAY_TASK_ID=", *id, " is outside 0..SLURM_ARRAY_TASK_COUNT-1 (count ", *count, ")", fix));
    s.index = static_cast<int>(*id);
    s.count = static_cast<int>(*count);
    s.origin = msg("SLURM_ARRAY_TASK_ID=", *id, " of SLURM_ARRAY_TASK_COUNT=", *count);
  } else {
    throw Error(msg("SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MIN/MAX", fix));
  }
  return s;
}

std::vector<ExpandedRun> select_shard(const std::vector<ExpandedRun>& runs, const ShardSpec& shard) {
  std::vector<ExpandedRun> out;
  for (const ExpandedRun& r : runs)
    if (r.index % shard.count == shard.index) out.push_back(r);
  return out;
}

std::vector<int> parse_gpu_list(const std::string& text) {
  std::vector<int> gpus;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const long g = parse_long(item, "--gpus " + excerpt(text) + " (a list of GPU indices such as 0,1,2,3)");
    if (g < 0 || g > INT_MAX) throw Error(msg("--gpus ", excerpt(text), ": GPU indices are integers from 0 to ", INT_MAX));
    gpus.push_back(static_cast<int>(g));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return gpus;
}

int sweep_exit_code(const std::vector<SweepRunResult>& runs) {
  bool failed = false, stopped = false, busy = false;
  for (const auto& r : runs) {
    if (r.status == RunStatus::failed) failed = true;
    if (r.status == RunStatus::interrupted || r.status == RunStatus::not_run) stopped = true;
    if (r.status == RunStatus::busy) busy = true;
  }
  if (failed) return kExitRunFailed;
  if (stopped) return kExitInterrupted;
  if (busy) return kExitBusy;
  return kExitOk;
}

SweepResult run_sweep(const std::vector<ExpandedRun>& runs, const SweepOptions& opt) {
  if (opt.jobs < 1) throw Error(msg("--jobs ", opt.jobs, ": need at least 1"));
  if (!opt.make_backend) throw Error("run_sweep: no backend factory given");
  {
    std::error_code ec;
    std::filesystem::create_directories(opt.out_dir, ec);
    if (ec) throw Error(msg("cannot create output directory ", opt.out_dir, ": ", ec.message()));
  }
  // A run file name that is a symbolic link would fail its run the same way at any time: say
  // so before any run starts (lab/io/out_file.h).
  for (const ExpandedRun& r : runs) refuse_symlink(opt.out_dir + "/" + r.id + ".h5");
  SweepResult result;
  result.runs.resize(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    result.runs[k].index = runs[k].index;
    result.runs[k].run_id = runs[k].id;
    result.runs[k].swept = runs[k].swept;
  }
  const size_t total = runs.size();
  const int jobs = static_cast<int>(std::min<size_t>(static_cast<size_t>(opt.jobs), std::max<size_t>(total, 1)));

  // Steps of the runs from position k on, for the ETA.
  std::vector<int64_t> steps_from(total + 1, 0);
  for (size_t k = total; k-- > 0;) steps_from[k] = steps_from[k + 1] + runs[k].cfg.steps;

  std::atomic<size_t> next{0}, done{0};
  std::atomic<int64_t> steps_done{0};
  std::vector<JobState> state(static_cast<size_t>(jobs));
  std::mutex out_mu;  // serialises output lines only
  const auto t_start = std::chrono::steady_clock::now();

  auto clear_live = [&] {
    if (opt.live) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
  };

  auto report_line = [&](size_t k_done, const ExpandedRun& run, const SweepRunResult& r, int64_t stopped_at) {
    std::string detail;
    if (r.status == RunStatus::complete) detail = msg(run.cfg.steps, " steps");
    else if (r.status == RunStatus::diverged) {
      detail = r.divergence_step >= 0 ? msg("diverged at step ", r.divergence_step) : std::string("diverged");
      if (!r.divergence_arm.empty() && r.divergence_arm != "mx") detail += " (arm " + r.divergence_arm + ")";
    }
    else if (r.status == RunStatus::skipped) detail = "already complete";
    else if (r.status == RunStatus::interrupted) detail = msg("stopped at step ", stopped_at, ", checkpoint saved");
    else if (r.status == RunStatus::failed) detail = "error: " + r.error;
    else if (r.status == RunStatus::busy) detail = r.error;
    if (r.excursion_step >= 0 && is_finished(r.status)) {
      detail += msg(r.status == RunStatus::complete ? ", " : "; ", "excursion at step ", r.excursion_step);
      if (!r.excursion_arm.empty() && r.excursion_arm != "mx") detail += " (arm " + r.excursion_arm + ")";
    }
    if (r.resumed) detail += msg(", resumed from step ", r.resumed_from);
    if (!r.note.empty()) detail += ", " + r.note;
    if (r.status != RunStatus::skipped && r.status != RunStatus::busy) detail += msg(", ", format_duration(r.seconds));
    if (!r.device.empty() && r.status != RunStatus::skipped && r.status != RunStatus::busy) detail += ", " + r.device;
    const std::string sw = swept_text(run.swept);
    std::lock_guard<std::mutex> g(out_mu);
    clear_live();
    std::fprintf(opt.out, "[%zu/%zu] %s %s: %s%s%s\n", k_done, total, run.id.c_str(), to_string(r.status),
                 detail.c_str(), sw.empty() ? "" : "  ", sw.c_str());
    std::fflush(opt.out);
  };

  auto worker = [&](int j) {
    JobState& js = state[static_cast<size_t>(j)];
    const std::string device =
        opt.gpus.empty() ? opt.device : "cuda:" + std::to_string(opt.gpus[static_cast<size_t>(j) % opt.gpus.size()]);
    for (;;) {
      if (opt.stop && opt.stop->load()) break;
      const size_t k = next.fetch_add(1);
      if (k >= total) break;
      const ExpandedRun& run = runs[k];
      int64_t last_step = -1;
      {
        std::lock_guard<std::mutex> g(js.m);
        js.active = true;
        js.run_id = run.id;
        js.step = 0;
        js.steps = run.cfg.steps;
        js.losses.clear();
        js.first_step = -1;
      }
      RunOptions ro;
      ro.out_dir = opt.out_dir;
      ro.device = device;
      ro.stop = opt.stop;
      ro.keep_checkpoints = opt.keep_checkpoints;
      ro.make_backend = opt.make_backend;
      ro.on_progress = [&](const RunProgress& p) {
        if (last_step >= 0) steps_done.fetch_add(p.step - last_step);
        last_step = p.step;
        {
          std::lock_guard<std::mutex> g(js.m);
          js.step = p.step;
          js.losses = p.losses;
          js.last_time = std::chrono::steady_clock::now();
          if (js.first_step < 0) {
            js.first_step = p.step;
            js.first_time = js.last_time;
          }
        }
        if (opt.on_progress) opt.on_progress(run, p);
      };
      const auto t0 = std::chrono::steady_clock::now();
      RunOutcome o;
      try {
        o = run_one(run.cfg, ro);
      } catch (const std::exception& e) {  // run_one reports run problems itself; this is the rest
        o.status = RunStatus::failed;
        o.error = e.what();
      }
      SweepRunResult& r = result.runs[k];
      r.status = o.status;
      r.error = o.error;
      r.resumed = o.resumed;
      r.resumed_from = o.resumed_from;
      r.divergence_step = o.divergence_step;
      r.divergence_arm = o.divergence_arm;
      r.excursion_step = o.excursion_step;
      r.excursion_arm = o.excursion_arm;
      r.note = o.note;
      r.device = device.empty() ? run.cfg.device : device;
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      {
        std::lock_guard<std::mutex> g(js.m);
        js.active = false;
      }
      report_line(done.fetch_add(1) + 1, run, r, o.resumed_from + o.steps_run);
    }
  };

  // The live line: every job's run and step, the overall rate and the ETA.
  std::mutex live_mu;
  std::condition_variable live_cv;
  bool finished = false;
  auto monitor = [&] {
    std::unique_lock<std::mutex> lk(live_mu);
    while (!live_cv.wait_for(lk, kLiveRefresh, [&] { return finished; })) {
      int64_t remaining = steps_from[std::min(next.load(), total)];
      std::string jobs_text;
      int active = 0;
      for (auto& js : state) {
        std::lock_guard<std::mutex> g(js.m);
        if (!js.active) continue;
        ++active;
        remaining += std::max<int64_t>(0, js.steps - js.step);
        jobs_text += msg(jobs_text.empty() ? "" : " | ", js.run_id, jobs == 1 ? " step " : " ", js.step, "/", js.steps);
        if (jobs == 1 && !js.losses.empty()) jobs_text += "  " + js.losses;
      }
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double rate = el > 0 ? static_cast<double>(steps_done.load()) / el : 0.0;
      char tail[96];
      std::snprintf(tail, sizeof tail, "  %.0f steps/s  ETA %s", rate,
                    rate > 0 ? format_duration(static_cast<double>(remaining) / rate).c_str() : "?");
      std::string line = msg("[", done.load(), "/", total, "] ", active ? jobs_text : std::string("starting")) + tail;
      const size_t width = terminal_width();
      if (line.size() >= width) line = line.substr(0, width > 4 ? width - 4 : width) + "...";
      std::lock_guard<std::mutex> g(out_mu);
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      std::fflush(stderr);
    }
  };

  // Without a terminal: every progress_every seconds, one plain line per active run.
  auto plain_monitor = [&] {
    const auto every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opt.progress_every));
    std::unique_lock<std::mutex> lk(live_mu);
    while (!live_cv.wait_for(lk, every, [&] { return finished; })) {
      const auto now = std::chrono::steady_clock::now();
      std::string text;
      for (auto& js : state) {
        {
          std::lock_guard<std::mutex> g(js.m);
          if (!js.active) continue;
        }
        text += plain_progress_line(js, done.load(), total, now) + "\n";
      }
      if (text.empty()) continue;
      std::lock_guard<std::mutex> g(out_mu);
      std::fputs(text.c_str(), stderr);
      std::fflush(stderr);
    }
  };
  const bool plain = !opt.live && opt.progress_every > 0;

  std::thread live_thread;
  if (opt.live) live_thread = std::thread(monitor);
  else if (plain) live_thread = std::thread(plain_monitor);
  std::vector<std::thread> threads;
  for (int j = 0; j < jobs; ++j) threads.emplace_back(worker, j);
  for (auto& t : threads) t.join();
  if (plain) {
    {
      std::lock_guard<std::mutex> lk(live_mu);
      finished = true;
    }
    live_cv.notify_all();
    live_thread.join();
  }
  if (opt.live) {
    {
      std::lock_guard<std::mutex> lk(live_mu);
      finished = true;
    }
    live_cv.notify_all();
    live_thread.join();
    std::lock_guard<std::mutex> g(out_mu);
    clear_live();
  }
  result.exit_code = sweep_exit_code(result.runs);
  return result;
}

std::string format_sweep_report(const SweepResult& result) {
  if (result.runs.empty()) return "no runs\n";
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"index", "run_id"};
  for (const auto& kv : result.runs.front().swept) header.push_back(kv.first);
  for (const char* h : {"status", "excursion_step", "diverged_to_end_step", "note"}) header.push_back(h);
  rows.push_back(header);
  std::map<RunStatus, int> counts;
  for (const SweepRunResult& r : result.runs) {
    std::vector<std::string> row = {std::to_string(r.index), r.run_id};
    for (const auto& kv : r.swept) row.push_back(kv.second);
    row.push_back(to_string(r.status));
    row.push_back(r.excursion_step >= 0 ? std::to_string(r.excursion_step) : "-");
    row.push_back(r.divergence_step >= 0 ? std::to_string(r.divergence_step) : "-");
    std::string note = r.error;
    if (!r.divergence_arm.empty() && r.divergence_arm != "mx")
      note = "first diverged: arm " + r.divergence_arm + (note.empty() ? "" : "; " + note);
    if (!r.excursion_arm.empty() && r.excursion_arm != "mx")
      note = "first excursion: arm " + r.excursion_arm + (note.empty() ? "" : "; " + note);
    if (r.resumed) note = msg("resumed from step ", r.resumed_from) + (note.empty() ? "" : "; " + note);
    if (!r.note.empty()) note = r.note + (note.empty() ? "" : "; " + note);
    row.push_back(note);
    rows.push_back(row);
    ++counts[r.status];
  }
  std::string out = aligned_table(rows);
  out += msg(result.runs.size(), result.runs.size() == 1 ? " run:" : " runs:");
  bool first = true;
  for (RunStatus s : {RunStatus::complete, RunStatus::diverged, RunStatus::skipped, RunStatus::interrupted,
                      RunStatus::not_run, RunStatus::failed, RunStatus::busy}) {
    auto it = counts.find(s);
    if (it == counts.end()) continue;
    out += msg(first ? " " : ", ", it->second, " ", s == RunStatus::not_run ? "not started" : to_string(s));
    first = false;
  }
  out += "\n";
  if (counts.count(RunStatus::interrupted) || counts.count(RunStatus::not_run))
    out += "stopped: run the same command again to resume (finished runs are skipped, interrupted ones resume "
           "from their checkpoint)\n";
  if (counts.count(RunStatus::failed))
    out += "failed: the message is in the table (and in the file's `error` attribute where it could be written); "
           "fix the cause and run the same command again\n";
  if (counts.count(RunStatus::busy))
    out += "busy: another process holds these runs' locks (<out>/<run_id>.lock) or has their files open; run again "
           "once it is done\n";
  return out;
}

}  // namespace mxlab
