// Sweeps end to end on the CPU backend with tiny models: shards partition the runs exactly
// (--shard and Slurm variables), a stopped sweep resumes to the same files as an uninterrupted
// one, --jobs 2 writes the same files as --jobs 1, a failing run is marked failed while the
// others complete, the per-run lock keeps two processes apart (and stale locks are taken
// over), a run file that another program holds open is waited for and never started over,
// SIGINT stops the built binary cleanly, and summarize lists every run.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "lab/core/error.h"
#include "lab/core/exit_codes.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/runs/index.h"
#include "lab/report/run_events.h"
#include "lab/report/summary_table.h"
#include "lab/runs/run_driver.h"
#include "lab/config/sweep.h"
#include "lab/runs/sweep_runner.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

// 2 depths x 2 learning rates x 2 seeds = 8 runs of 40 steps, with a branch at step 20 (so each
// run also checkpoints there). Each run takes tens of milliseconds on one core.
const char* const kSweepYaml = R"(name: tiny_sweep
steps: 40
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
data: {batch: 32}
optimizer: {lr: 3.0e-3}
log: {log_every: 5, progress: false}
interventions:
  - {name: to32, at: 20, apply: to_fp32}
sweep:
  grid:
    model.depth: [1, 2]
    optimizer.lr: [3.0e-3, 1.0e-2]
  seeds: [0, 1]
)";
constexpr size_t kSweepRuns = 8;

using mxlab::test::TempDir;
using mxlab::test::read_file;


std::vector<ExpandedRun> sweep_runs() { return expand_experiment_string(kSweepYaml, "sweep.yaml"); }

SweepOptions cpu_options(const std::string& out, int jobs = 1) {
  SweepOptions o;
  o.out_dir = out;
  o.jobs = jobs;
  o.out = std::tmpfile();  // the per-run lines are not under test here
  o.make_backend = [](const std::string&) { return make_cpu_backend(); };
  return o;
}

std::string root_attr(const std::string& path, const std::string& name) {
  h5::H5File f(path, h5::H5File::Mode::read);
  return f.has_attr("/", name) ? f.get_attr_string("/", name) : "";
}

// Every dataset of every trajectory/branch group of two run files is bit-identical.
void expect_same_datasets(const std::string& a, const std::string& b) {
  h5::H5File fa(a, h5::H5File::Mode::read), fb(b, h5::H5File::Mode::read);
  EXPECT_EQ(fa.get_attr_string("/", "run_id"), fb.get_attr_string("/", "run_id"));
  EXPECT_EQ(fa.get_attr_string("/", "config_yaml"), fb.get_attr_string("/", "config_yaml"));
  size_t compared = 0;
  for (const char* top : {"trajectories", "branches"}) {
    ASSERT_EQ(fa.is_group(top), fb.is_group(top)) << a << " " << top;
    if (!fa.is_group(top)) continue;
    ASSERT_EQ(fa.list_groups(top), fb.list_groups(top)) << a;
    for (const std::string& g : fa.list_groups(top)) {
      const std::string gp = std::string(top) + "/" + g;
      ASSERT_EQ(fa.list_datasets(gp), fb.list_datasets(gp)) << a << " " << gp;
      for (const std::string& d : fa.list_datasets(gp)) {
        const std::string p = gp + "/" + d;
        ASSERT_EQ(fa.dataset_shape(p), fb.dataset_shape(p)) << a << " " << p;
        const std::vector<double> va = fa.read_doubles(p), vb = fb.read_doubles(p);
        ASSERT_EQ(va.size(), vb.size());
        for (size_t i = 0; i < va.size(); ++i)
          ASSERT_TRUE(std::memcmp(&va[i], &vb[i], sizeof(double)) == 0 || (std::isnan(va[i]) && std::isnan(vb[i])))
              << a << " " << p << "[" << i << "]: " << va[i] << " vs " << vb[i];
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 20u) << "too few datasets compared in " << a;
}

// A run of the built binary in the background, stdout+stderr to a file.
struct Child {
  pid_t pid = -1;
  std::string log;
};

Child spawn(const std::vector<std::string>& args, const std::string& log, const std::map<std::string, std::string>& env = {}) {
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return c;
}

int wait_exit(const Child& c) {
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

int run_binary(const std::vector<std::string>& args, const std::string& log,
               const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> full = {MXLAB_BINARY};
  full.insert(full.end(), args.begin(), args.end());
  return wait_exit(spawn(full, log, env));
}

// Run ids a process reported with a given status in its per-run lines "[k/n] <id> <status>: ...".
std::set<std::string> reported(const std::string& log_text, const std::string& status) {
  std::set<std::string> ids;
  std::istringstream in(log_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '[') continue;
    std::istringstream ls(line);
    std::string count, id, st;
    ls >> count >> id >> st;
    if (st == status + ":") ids.insert(id);
  }
  return ids;
}

std::map<std::string, int> status_counts(const SweepResult& r) {
  std::map<std::string, int> m;
  for (const auto& x : r.runs) ++m[to_string(x.status)];
  return m;
}

// The uninterrupted sweep with one job, computed once for every test that compares with it.
class SweepRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_ = new TempDir();
    const SweepResult r = run_sweep(sweep_runs(), cpu_options(reference_->str()));
    ASSERT_EQ(r.exit_code, 0) << format_sweep_report(r);
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  static std::string reference(const std::string& id) { return reference_->str() + "/" + id + ".h5"; }
  static TempDir* reference_;
};
TempDir* SweepRun::reference_ = nullptr;

}  // namespace

TEST(SweepShard, ParseShardAndGpuList) {
  const ShardSpec s = parse_shard("3/16");
  EXPECT_EQ(s.index, 3);
  EXPECT_EQ(s.count, 16);
  for (const char* bad : {"16/16", "-1/4", "1", "a/2", "1/0", "1/2/3", ""}) {
    try {
      parse_shard(bad);
      ADD_FAILURE() << "accepted --shard " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("i/n"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_gpu_list("0,1,3"), (std::vector<int>{0, 1, 3}));
  EXPECT_THROW(parse_gpu_list("0,,1"), Error);
  EXPECT_THROW(parse_gpu_list("-1"), Error);
}

TEST(SweepShard, ShardsPartitionTheRunsExactly) {
  // 23 runs so that most shard counts do not divide it.
  std::vector<ExpandedRun> runs(23);
  for (int i = 0; i < 23; ++i) {
    runs[static_cast<size_t>(i)].index = i;
    runs[static_cast<size_t>(i)].id = "run" + std::to_string(i);
  }
  for (int n = 1; n <= 30; ++n) {
    std::multiset<int> seen;
    for (int i = 0; i < n; ++i) {
      const std::vector<ExpandedRun> part = select_shard(runs, parse_shard(std::to_string(i) + "/" + std::to_string(n)));
      for (size_t k = 0; k < part.size(); ++k) {
        seen.insert(part[k].index);
        EXPECT_EQ(part[k].index % n, i);
        if (k) {
          EXPECT_LT(part[k - 1].index, part[k].index) << "shards keep the expansion order";
        }
      }
    }
    ASSERT_EQ(seen.size(), runs.size()) << "n=" << n;
    for (int i = 0; i < 23; ++i) EXPECT_EQ(seen.count(i), 1u) << "run " << i << ", n=" << n;
  }
}

TEST(SweepShard, SlurmArrayVariables) {
  std::map<std::string, std::string> env;
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_FALSE(shard_from_env(getenv).has_value());

  std::vector<ExpandedRun> runs(17);
  for (int i = 0; i < 17; ++i) runs[static_cast<size_t>(i)].index = i;
  // Every array form of n tasks covers every run once: --array=0-(n-1) (ID + COUNT, as well as
  // MIN/MAX), --array=1-n (MIN 1), --array=0-(3n-3):3 (a step).
  for (int n : {1, 2, 3, 5, 8, 17, 20}) {
    for (int form = 0; form < 4; ++form) {
      std::multiset<int> seen;
      for (int t = 0; t < n; ++t) {
        env.clear();
        if (form == 0) {
          env = {{"SLURM_ARRAY_TASK_ID", std::to_string(t)}, {"SLURM_ARRAY_TASK_COUNT", std::to_string(n)}};
        } else if (form == 1) {
          env = {{"SLURM_ARRAY_TASK_ID", std::to_string(t)}, {"SLURM_ARRAY_TASK_MIN", "0"},
                 {"SLURM_ARRAY_TASK_MAX", std::to_string(n - 1)}, {"SLURM_ARRAY_TASK_COUNT", std::to_string(n)}};
        } else if (form == 2) {
          env = {{"SLURM_ARRAY_TASK_ID", std::to_string(t + 1)}, {"SLURM_ARRAY_TASK_MIN", "1"},
                 {"SLURM_ARRAY_TASK_MAX", std::to_string(n)}};
        } else {
          env = {{"SLURM_ARRAY_TASK_ID", std::to_string(3 * t)}, {"SLURM_ARRAY_TASK_MIN", "0"},
                 {"SLURM_ARRAY_TASK_MAX", std::to_string(3 * (n - 1))}, {"SLURM_ARRAY_TASK_STEP", "3"},
                 {"SLURM_ARRAY_TASK_COUNT", std::to_string(n)}};
        }
        const std::optional<ShardSpec> s = shard_from_env(getenv);
        ASSERT_TRUE(s.has_value());
        EXPECT_EQ(s->index, t);
        EXPECT_EQ(s->count, n);
        for (const auto& r : select_shard(runs, *s)) seen.insert(r.index);
      }
      ASSERT_EQ(seen.size(), runs.size()) << "n=" << n << " form " << form;
      for (int i = 0; i < 17; ++i) EXPECT_EQ(seen.count(i), 1u) << "run " << i << " n=" << n << " form " << form;
    }
  }
  // An array that is not a range, and incomplete variables, are errors that say what to do.
  env = {{"SLURM_ARRAY_TASK_ID", "4"}, {"SLURM_ARRAY_TASK_MIN", "1"}, {"SLURM_ARRAY_TASK_MAX", "9"},
         {"SLURM_ARRAY_TASK_COUNT", "3"}};
  try {
    shard_from_env(getenv);
    ADD_FAILURE() << "accepted --array=1,4,9";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--shard"), std::string::npos) << e.what();
  }
  env = {{"SLURM_ARRAY_TASK_ID", "2"}};
  EXPECT_THROW(shard_from_env(getenv), Error);
  env = {{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_COUNT", "5"}};
  EXPECT_THROW(shard_from_env(getenv), Error);
}

TEST(SweepShard, BinaryShardsBySlurmVariablesAndByOption) {
  TempDir dir;
  const std::string exp = dir.write("sweep.yaml", kSweepYaml);
  const std::string out = dir.str() + "/out";
  std::set<std::string> all;
  for (const auto& r : sweep_runs()) all.insert(r.id);
  // --dry-run lines: "<index> <run_id> run ..."
  auto ids_of = [&](const std::string& log) {
    std::set<std::string> ids;
    std::istringstream in(read_file(log));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string index, id, what;
      if (ls >> index >> id >> what && what == "run") ids.insert(id);
    }
    return ids;
  };
  for (int n : {2, 3}) {
    std::multiset<std::string> by_env, by_opt;
    for (int t = 0; t < n; ++t) {
      const std::string log = dir.str() + "/log" + std::to_string(t);
      ASSERT_EQ(run_binary({"run", exp, "--out", out, "--dry-run"}, log,
                           {{"SLURM_ARRAY_TASK_ID", std::to_string(t)}, {"SLURM_ARRAY_TASK_COUNT", std::to_string(n)}}),
                0)
          << read_file(log);
      EXPECT_NE(read_file(log).find("SLURM_ARRAY_TASK_ID=" + std::to_string(t)), std::string::npos) << read_file(log);
      for (const auto& id : ids_of(log)) by_env.insert(id);
      // --shard wins over the environment.
      ASSERT_EQ(run_binary({"run", exp, "--out", out, "--dry-run", "--shard", std::to_string(t) + "/" + std::to_string(n)},
                           log, {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_COUNT", "1"}}),
                0)
          << read_file(log);
      for (const auto& id : ids_of(log)) by_opt.insert(id);
    }
    EXPECT_EQ(std::set<std::string>(by_env.begin(), by_env.end()), all) << "n=" << n;
    EXPECT_EQ(by_env.size(), all.size()) << "no run in two shards, n=" << n;
    EXPECT_EQ(std::multiset<std::string>(by_opt), by_env) << "n=" << n;
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/index.csv")) << "--dry-run writes nothing";
}

TEST_F(SweepRun, StoppedSweepResumesToTheUninterruptedFiles) {
  TempDir dir;
  const std::vector<ExpandedRun> runs = sweep_runs();
  ASSERT_EQ(runs.size(), kSweepRuns);
  std::atomic<bool> stop{false};
  SweepOptions opt = cpu_options(dir.str());
  opt.stop = &stop;
  // Stop while run 3 is at step 25 (after its checkpoint at 20): runs 0-2 finish, run 3 is
  // interrupted, 4-7 never start.
  opt.on_progress = [&](const ExpandedRun& r, const RunProgress& p) {
    if (r.index == 3 && p.step >= 25) stop.store(true);
  };
  SweepResult first = run_sweep(runs, opt);
  EXPECT_EQ(first.exit_code, 130) << format_sweep_report(first);
  for (size_t k = 0; k < kSweepRuns; ++k) {
    const std::string want = k < 3 ? "complete" : k == 3 ? "interrupted" : "not_run";
    EXPECT_EQ(to_string(first.runs[k].status), want) << "run " << k;
  }
  const std::string p3 = dir.str() + "/" + runs[3].id + ".h5";
  EXPECT_EQ(root_attr(p3, "status"), "interrupted");
  EXPECT_FALSE(std::filesystem::exists(dir.str() + "/" + runs[4].id + ".h5"));
  EXPECT_FALSE(std::filesystem::exists(RunLock::lock_path(dir.str(), runs[3].id))) << "locks are released";
  const std::string report = format_sweep_report(first);
  EXPECT_NE(report.find("run the same command again to resume"), std::string::npos) << report;

  stop.store(false);
  opt.on_progress = nullptr;
  const SweepResult second = run_sweep(runs, opt);
  EXPECT_EQ(second.exit_code, 0) << format_sweep_report(second);
  for (size_t k = 0; k < kSweepRuns; ++k) {
    EXPECT_EQ(to_string(second.runs[k].status), k < 3 ? "skipped" : "complete") << "run " << k;
    EXPECT_EQ(second.runs[k].resumed, k == 3) << "run " << k;
  }
  EXPECT_GE(second.runs[3].resumed_from, 20);
  for (const auto& r : runs) expect_same_datasets(dir.str() + "/" + r.id + ".h5", reference(r.id));

  // summarize lists every run (fp32, mx and the branch of each), all complete, by run id.
  const std::vector<RunRecord> recs = scan_run_dir(dir.str());
  ASSERT_EQ(recs.size(), kSweepRuns);
  for (size_t k = 0; k < recs.size(); ++k) {
    EXPECT_EQ(to_string(recs[k].status), "complete") << recs[k].path;
    EXPECT_EQ(recs[k].groups.size(), 3u) << recs[k].path;
    if (k) {
      EXPECT_LT(recs[k - 1].run_id, recs[k].run_id);
    }
  }
  // index.csv: one row per run, rebuilt from the files.
  EXPECT_EQ(rebuild_index(dir.str()).size(), kSweepRuns);
  EXPECT_FALSE(std::filesystem::exists(dir.str() + "/index.lock"));
  const std::string index = read_file(dir.str() + "/index.csv");
  size_t lines = 0;
  for (char c : index) lines += c == '\n';
  EXPECT_EQ(lines, kSweepRuns + 1) << index;
  for (const auto& r : runs) EXPECT_NE(index.find(r.id + ",complete,40,"), std::string::npos) << index;
}

// An interrupted run whose file another program has open (an h5py session: a shared HDF5 lock;
// or another shard reading it, before mxlab's readers took no lock) is busy, not damaged: it is
// left byte for byte as it was, with its checkpoints, and resumes once the file is closed. It
// used to be started again from step 0 ("it cannot be reopened").
TEST_F(SweepRun, ARunFileOpenElsewhereIsWaitedForAndNeverStartedOver) {
  TempDir dir;
  const std::vector<ExpandedRun> all = sweep_runs();
  const std::vector<ExpandedRun> runs = {all[3]};
  std::atomic<bool> stop{false};
  SweepOptions opt = cpu_options(dir.str());
  opt.stop = &stop;
  opt.on_progress = [&](const ExpandedRun&, const RunProgress& p) {
    if (p.step >= 25) stop.store(true);
  };
  const SweepResult first = run_sweep(runs, opt);
  ASSERT_EQ(to_string(first.runs[0].status), "interrupted") << format_sweep_report(first);
  stop.store(false);
  opt.on_progress = nullptr;
  const std::string path = dir.str() + "/" + runs[0].id + ".h5";
  const std::string before = read_file(path);
  auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir.str())) names.insert(e.path().filename().string());
    return names;
  };
  const std::set<std::string> files_before = listing();
  ASSERT_TRUE(std::any_of(files_before.begin(), files_before.end(),
                          [](const std::string& n) { return n.find(".ckpt") != std::string::npos; }));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH | LOCK_NB), 0);

  // Held throughout a short wait: busy (exit 75), the file and its checkpoint as they were.
  h5::set_append_lock_wait(std::chrono::milliseconds(300));
  const SweepResult held = run_sweep(runs, opt);
  EXPECT_EQ(held.exit_code, kExitBusy) << format_sweep_report(held);
  EXPECT_EQ(to_string(held.runs[0].status), "busy");
  EXPECT_NE(held.runs[0].error.find("is open in another process"), std::string::npos) << held.runs[0].error;
  const std::string report = format_sweep_report(held);
  EXPECT_NE(report.find("is open in another process"), std::string::npos) << report;
  EXPECT_EQ(report.find("started again from step 0"), std::string::npos) << report;
  EXPECT_TRUE(read_file(path) == before) << "the busy run's file was changed";
  EXPECT_EQ(listing(), files_before) << "files were added or removed beside the busy run (its lock released)";

  // Released while the run waits: it resumes from its checkpoint, to the uninterrupted file.
  h5::set_append_lock_wait(std::chrono::seconds(30));
  std::thread releaser([fd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::close(fd);
  });
  const SweepResult resumed = run_sweep(runs, opt);
  releaser.join();
  h5::set_append_lock_wait(h5::kDefaultAppendLockWait);
  EXPECT_EQ(resumed.exit_code, 0) << format_sweep_report(resumed);
  EXPECT_EQ(to_string(resumed.runs[0].status), "complete");
  EXPECT_TRUE(resumed.runs[0].resumed);
  EXPECT_GE(resumed.runs[0].resumed_from, 25);
  EXPECT_TRUE(resumed.runs[0].note.empty()) << resumed.runs[0].note;
  expect_same_datasets(path, reference(runs[0].id));
}

// While one run waits for another program to close its file, the other jobs of the sweep go on:
// the wait is not spent holding the lock that serialises HDF5 calls.
TEST_F(SweepRun, OtherJobsGoOnWhileARunWaitsForItsFile) {
  TempDir dir;
  const std::vector<ExpandedRun> all = sweep_runs();
  std::atomic<bool> stop{false};
  SweepOptions opt = cpu_options(dir.str(), 2);
  opt.stop = &stop;
  opt.on_progress = [&](const ExpandedRun&, const RunProgress& p) {
    if (p.step >= 25) stop.store(true);
  };
  ASSERT_EQ(to_string(run_sweep({all[3]}, opt).runs[0].status), "interrupted");
  stop.store(false);
  const std::string path = dir.str() + "/" + all[3].id + ".h5";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH | LOCK_NB), 0);
  constexpr double kWaitS = 5.0;
  h5::set_append_lock_wait(std::chrono::milliseconds(static_cast<int64_t>(kWaitS * 1000)));
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<double> other_done_s{-1.0};
  opt.on_progress = [&](const ExpandedRun& r, const RunProgress& p) {
    if (r.index == all[4].index && p.step >= 30 && other_done_s.load() < 0)
      other_done_s.store(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  const SweepResult r = run_sweep({all[3], all[4]}, opt);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  h5::set_append_lock_wait(h5::kDefaultAppendLockWait);
  ::close(fd);
  EXPECT_EQ(to_string(r.runs[0].status), "busy") << format_sweep_report(r);
  EXPECT_EQ(to_string(r.runs[1].status), "complete") << format_sweep_report(r);
  EXPECT_GE(total_s, kWaitS - 0.5) << "the busy run did not wait";
  EXPECT_GE(other_done_s.load(), 0.0);
  EXPECT_LT(other_done_s.load(), kWaitS - 1.5) << "the other job waited for the busy run";
}

TEST_F(SweepRun, TwoJobsWriteTheSameFilesAsOne) {
  TempDir dir;
  const SweepResult r = run_sweep(sweep_runs(), cpu_options(dir.str(), 2));
  ASSERT_EQ(r.exit_code, 0) << format_sweep_report(r);
  EXPECT_EQ(status_counts(r)["complete"], static_cast<int>(kSweepRuns));
  for (const auto& run : sweep_runs()) expect_same_datasets(dir.str() + "/" + run.id + ".h5", reference(run.id));
}

TEST_F(SweepRun, FailingRunIsMarkedFailedAndTheOthersComplete) {
  TempDir dir;
  const std::vector<ExpandedRun> runs = sweep_runs();
  SweepOptions opt = cpu_options(dir.str(), 2);
  opt.on_progress = [](const ExpandedRun& r, const RunProgress& p) {
    if (r.index == 2 && p.step >= 10) throw Error("injected failure in run 2");
  };
  const SweepResult first = run_sweep(runs, opt);
  EXPECT_EQ(first.exit_code, 1);
  for (size_t k = 0; k < kSweepRuns; ++k) EXPECT_EQ(to_string(first.runs[k].status), k == 2 ? "failed" : "complete") << k;
  EXPECT_EQ(first.runs[2].error, "injected failure in run 2");
  const std::string p2 = dir.str() + "/" + runs[2].id + ".h5";
  EXPECT_EQ(root_attr(p2, "status"), "failed");
  EXPECT_EQ(root_attr(p2, "error"), "injected failure in run 2");
  const std::string report = format_sweep_report(first);
  EXPECT_NE(report.find("injected failure in run 2"), std::string::npos) << report;
  EXPECT_NE(report.find("7 complete, 1 failed"), std::string::npos) << report;

  // summarize shows it, with the message.
  const std::string table = summary_table(scan_run_dir(dir.str()), true);
  EXPECT_NE(table.find(runs[2].id + ",fp32,,"), std::string::npos) << table;
  EXPECT_NE(table.find(",failed,"), std::string::npos) << table;
  EXPECT_NE(table.find("injected failure in run 2"), std::string::npos) << table;

  // Run again without the fault: only run 2 runs, and its file is the uninterrupted one.
  opt.on_progress = nullptr;
  const SweepResult second = run_sweep(runs, opt);
  EXPECT_EQ(second.exit_code, 0) << format_sweep_report(second);
  for (size_t k = 0; k < kSweepRuns; ++k) EXPECT_EQ(to_string(second.runs[k].status), k == 2 ? "complete" : "skipped") << k;
  EXPECT_EQ(root_attr(p2, "error"), "");
  expect_same_datasets(p2, reference(runs[2].id));
}

TEST(SweepJobs, GpusAssignJobsToDevicesRoundRobin) {
  // The backend factory records the device strings and hands out CPU backends.
  const std::vector<ExpandedRun> runs = expand_experiment_string(
      "steps: 5\ndevice: cpu\nmodel: {depth: 1, width: 32, hidden_mult: 2}\ndata: {batch: 16}\n"
      "log: {log_every: 5, progress: false}\nsweep: {seeds: [0, 1, 2, 3, 4, 5]}\n",
      "gpus.yaml");
  for (const auto& [gpus, jobs, allowed] :
       std::vector<std::tuple<std::vector<int>, int, std::set<std::string>>>{
           {{0, 1}, 2, {"cuda:0", "cuda:1"}}, {{5}, 3, {"cuda:5"}}, {{2, 3, 7}, 2, {"cuda:2", "cuda:3"}}}) {
    TempDir dir;
    std::mutex m;
    std::multiset<std::string> asked;
    SweepOptions opt = cpu_options(dir.str(), jobs);
    opt.gpus = gpus;
    opt.make_backend = [&](const std::string& dev) {
      std::lock_guard<std::mutex> g(m);
      asked.insert(dev);
      return make_cpu_backend();
    };
    const SweepResult r = run_sweep(runs, opt);
    ASSERT_EQ(r.exit_code, 0) << format_sweep_report(r);
    EXPECT_EQ(asked.size(), runs.size()) << "one backend per run";
    for (const auto& d : asked) EXPECT_TRUE(allowed.count(d)) << d;
    for (const auto& x : r.runs) EXPECT_TRUE(allowed.count(x.device)) << x.device;
  }
}

TEST(SweepLock, OneHolderAtATimeAndStaleLocksAreTakenOver) {
  TempDir dir;
  const std::string d = dir.str();
  RunLock a, b;
  ASSERT_TRUE(a.try_acquire(d, "r1"));
  EXPECT_FALSE(b.try_acquire(d, "r1"));
  EXPECT_NE(b.holder().find("pid " + std::to_string(::getpid())), std::string::npos) << b.holder();
  EXPECT_EQ(live_lock_holder(d, "r1"), b.holder());
  a.release();
  EXPECT_FALSE(std::filesystem::exists(RunLock::lock_path(d, "r1")));
  EXPECT_EQ(live_lock_holder(d, "r1"), "");
  ASSERT_TRUE(b.try_acquire(d, "r1"));
  b.release();

  // A lock of a process of this host that is gone is stale.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string path = RunLock::lock_path(d, "r2");
  dir.write("r2.lock", "pid=" + std::to_string(child) + " host=" + host_name() + " time=x\n");
  EXPECT_EQ(live_lock_holder(d, "r2"), "");
  RunLock c;
  EXPECT_TRUE(c.try_acquire(d, "r2"));
  EXPECT_NE(read_file(path).find("pid=" + std::to_string(::getpid())), std::string::npos);
  c.release();

  // A lock of another host is respected while it is fresh, stale once not refreshed.
  dir.write("r3.lock", "pid=1 host=some-other-node time=x\n");
  RunLock e;
  EXPECT_FALSE(e.try_acquire(d, "r3"));
  EXPECT_NE(e.holder().find("some-other-node"), std::string::npos) << e.holder();
  const std::string p3 = RunLock::lock_path(d, "r3");
  const timespec old[2] = {{std::time(nullptr) - kStaleRemoteLockSeconds - 60, 0},
                           {std::time(nullptr) - kStaleRemoteLockSeconds - 60, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p3.c_str(), old, 0), 0);
  EXPECT_TRUE(e.try_acquire(d, "r3"));

  // release() never removes a lock that someone else holds now.
  dir.write("r3.lock", "pid=1 host=some-other-node time=y\n");
  e.release();
  EXPECT_TRUE(std::filesystem::exists(p3));
}

TEST(SweepLock, BinarySkipsLockedRunsAndTakesOverStaleOnes) {
  TempDir dir;
  const std::string exp = dir.write("sweep.yaml", kSweepYaml);
  const std::string out = dir.str() + "/out";
  std::filesystem::create_directories(out);
  const std::vector<ExpandedRun> runs = sweep_runs();
  // Run 0 is held by a live process (this test); run 1 by one that is gone.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string host = host_name();
  std::ofstream(out + "/" + runs[0].id + ".lock") << "pid=" << ::getpid() << " host=" << host << " time=x\n";
  std::ofstream(out + "/" + runs[1].id + ".lock") << "pid=" << child << " host=" << host << " time=x\n";
  const std::string log = dir.str() + "/log";
  EXPECT_EQ(run_binary({"run", exp, "--out", out}, log), kExitBusy) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_EQ(reported(text, "busy"), std::set<std::string>{runs[0].id}) << text;
  EXPECT_EQ(reported(text, "complete").size(), kSweepRuns - 1) << text;
  EXPECT_NE(text.find("taking over the stale lock"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(out + "/" + runs[0].id + ".h5"));
  EXPECT_TRUE(std::filesystem::exists(out + "/" + runs[0].id + ".lock")) << "someone else's lock stays";
  EXPECT_FALSE(std::filesystem::exists(out + "/" + runs[1].id + ".lock"));
}

TEST(SweepLock, TwoProcessesOnOneDirectoryNeverRunTheSameRun) {
  TempDir dir;
  // Longer runs than kSweepYaml so that the two processes overlap for most of their lives.
  std::string yaml = kSweepYaml;
  yaml.replace(yaml.find("steps: 40"), 9, "steps: 80");
  const std::string exp = dir.write("sweep.yaml", yaml);
  const std::string out = dir.str() + "/out";
  const std::vector<std::string> args = {MXLAB_BINARY, "run", exp, "--out", out};
  const Child a = spawn(args, dir.str() + "/a.log");
  const Child b = spawn(args, dir.str() + "/b.log");
  // A process that met a run the other one held exits "busy" (75): it cannot vouch for that run.
  const int ea = wait_exit(a), eb = wait_exit(b);
  const std::string la = read_file(a.log), lb = read_file(b.log);
  EXPECT_EQ(ea, reported(la, "busy").empty() ? kExitOk : kExitBusy) << la;
  EXPECT_EQ(eb, reported(lb, "busy").empty() ? kExitOk : kExitBusy) << lb;
  const std::set<std::string> ca = reported(la, "complete"), cb = reported(lb, "complete");
  std::set<std::string> both;
  for (const auto& id : ca)
    if (cb.count(id)) both.insert(id);
  EXPECT_TRUE(both.empty()) << "run by both processes: " << *both.begin() << "\n" << la << lb;
  EXPECT_EQ(ca.size() + cb.size(), kSweepRuns) << la << lb;
  for (const auto& r : expand_experiment(exp)) EXPECT_EQ(root_attr(out + "/" + r.id + ".h5", "status"), "complete");
}

TEST(SweepSignal, SigintStopsEveryJobAndTheRerunResumes) {
  TempDir dir;
  // Two runs long enough (hundreds of milliseconds) to be stopped midway.
  const std::string yaml = R"(name: sig
steps: 400
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
data: {batch: 32}
log: {log_every: 10, progress: false}
sweep: {seeds: [0, 1]}
)";
  const std::string exp = dir.write("sig.yaml", yaml);
  const std::string out = dir.str() + "/out";
  const std::vector<ExpandedRun> runs = expand_experiment(exp);
  const Child c = spawn({MXLAB_BINARY, "run", exp, "--out", out, "--jobs", "2"}, dir.str() + "/first.log");
  // Signal once both runs have their files (they are then inside their step loops).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto started = [&] {
    for (const auto& r : runs)
      if (!std::filesystem::exists(out + "/" + r.id + ".h5")) return false;
    return true;
  };
  while (!started() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(started()) << read_file(c.log);
  ::kill(c.pid, SIGINT);
  const int rc = wait_exit(c);
  const std::string first = read_file(c.log);
  std::set<std::string> interrupted;
  for (const auto& r : runs) {
    const std::string status = root_attr(out + "/" + r.id + ".h5", "status");
    EXPECT_TRUE(status == "interrupted" || status == "complete") << r.id << ": " << status << "\n" << first;
    if (status == "interrupted") interrupted.insert(r.id);
  }
  ASSERT_FALSE(interrupted.empty()) << "nothing was interrupted:\n" << first;
  EXPECT_EQ(rc, 130) << first;
  EXPECT_EQ(reported(first, "interrupted"), interrupted) << first;

  const std::string log2 = dir.str() + "/second.log";
  EXPECT_EQ(run_binary({"run", exp, "--out", out, "--jobs", "2"}, log2), 0) << read_file(log2);
  const std::string second = read_file(log2);
  EXPECT_EQ(reported(second, "complete"), interrupted) << second;
  EXPECT_NE(second.find("resumed from step"), std::string::npos) << second;

  // The resumed files equal an uninterrupted sweep's.
  TempDir ref;
  const SweepResult r = run_sweep(runs, cpu_options(ref.str()));
  ASSERT_EQ(r.exit_code, 0);
  for (const auto& run : runs) expect_same_datasets(out + "/" + run.id + ".h5", ref.str() + "/" + run.id + ".h5");
  EXPECT_TRUE(std::filesystem::exists(out + "/index.csv"));
}

// One run (or one seed) in a directory: nothing is swept, yet the CSV still names the seed, so that
// an analysis joining shards by seed reads a shard where only one run finished.
TEST_F(SweepRun, SummarizeCsvNamesTheSeedOfASingleRun) {
  std::vector<RunRecord> recs = scan_run_dir(reference_->str());
  ASSERT_FALSE(recs.empty());
  recs.resize(1);
  read_events(recs, EventRules{});
  EXPECT_TRUE(swept_keys(recs).empty());
  std::istringstream in(summary_table(recs, true));
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  EXPECT_EQ(header.rfind("run_id,group,at,seed,status,", 0), 0u) << header;
  bool found = false;
  const std::string seed = config_value(recs[0], "seed", &found);
  ASSERT_TRUE(found);
  std::vector<std::string> cells;
  std::stringstream ls(row);
  for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
  ASSERT_GT(cells.size(), 3u) << row;
  EXPECT_EQ(cells[3], seed) << row;
  // The text table for people keeps only what varies.
  EXPECT_EQ(summary_table(recs, false).find(" seed "), std::string::npos);
}

TEST_F(SweepRun, SummarizeRowsAndSweptKeyColumns) {
  const std::string dir = reference_->str();
  std::vector<RunRecord> recs = scan_run_dir(dir);
  read_events(recs, EventRules{});
  ASSERT_EQ(recs.size(), kSweepRuns);
  EXPECT_EQ(swept_keys(recs), (std::vector<std::string>{"seed", "model.depth", "optimizer.lr"}));

  const std::string csv = summary_table(recs, true);
  std::istringstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header,
            "run_id,group,at,seed,model.depth,optimizer.lr,status,excursion_step,excursion_censored_at,"
            "first_spike_step,tail_log_ratio,parent,at_risk,branch_excursion_step,branch_censored_at,"
            "control_excursion_step,control_censored_at,diverged_to_end_step,first_nonfinite_step,spike_count,"
            "spike_score,final_loss,min_loss,max_bias_ratio,max_gamma_lastbin,steps_run,source,file,error");
  std::map<std::string, const ExpandedRun*> by_id;
  const std::vector<ExpandedRun> runs = sweep_runs();
  for (const auto& r : runs) by_id[r.id] = &r;
  std::string line;
  size_t rows = 0;
  std::string last_id;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    ASSERT_EQ(cells.size(), 29u) << line;
    ASSERT_TRUE(by_id.count(cells[0])) << line;
    EXPECT_LE(last_id, cells[0]) << "rows sorted by run id";
    last_id = cells[0];
    const ExpandedRun& r = *by_id[cells[0]];
    // Swept values: the run's own (as the Python summary prints them: 3.0e-3 -> 0.003).
    EXPECT_EQ(cells[3], std::to_string(r.cfg.seed)) << line;
    EXPECT_EQ(cells[4], std::to_string(r.cfg.model.depth)) << line;
    EXPECT_EQ(cells[5], r.cfg.optimizer.lr == 3.0e-3f ? "0.003" : "0.01") << line;
    EXPECT_EQ(cells[6], "complete") << line;
    EXPECT_EQ(cells[26], "file") << line;
    // The excursion: its step or where it is censored, the other -1 (the runs are shorter than
    // the default window: censored at their first step).
    EXPECT_EQ(cells[7], "-1") << line;
    EXPECT_EQ(cells[8], cells[2].empty() ? "0" : cells[2]) << line;
    EXPECT_EQ(cells[10].empty(), cells[1] == "fp32") << line;  // tail_log_ratio: arms and branches
    // The branch's endpoint against its parent (mx: the file's `from`), its window [20, 20 - 500)
    // empty: censored at 20 in both; the columns are empty for the trajectories.
    const bool branch = cells[1] == "to32";
    const std::vector<std::string> endpoint =
        branch ? std::vector<std::string>{"mx", "1", "-1", "20", "-1", "20"} : std::vector<std::string>(6, "");
    EXPECT_EQ(std::vector<std::string>(cells.begin() + 11, cells.begin() + 17), endpoint) << line;
    // final_loss reads back to the attribute exactly.
    const std::string group = cells[1] == "to32" ? "branches/to32" : "trajectories/" + cells[1];
    h5::H5File f(dir + "/" + r.id + ".h5", h5::H5File::Mode::read);
    EXPECT_EQ(std::strtod(cells[21].c_str(), nullptr), f.get_attr_double(group, "final_loss")) << line;
    EXPECT_EQ(cells[2], cells[1] == "to32" ? "20" : "") << line;
    ++rows;
  }
  EXPECT_EQ(rows, 3 * kSweepRuns);

  // The binary prints the same table (and rebuilds index.csv).
  TempDir tmp;
  const std::string log = tmp.str() + "/log";
  ASSERT_EQ(run_binary({"summarize", dir, "--csv"}, log), 0) << read_file(log);
  EXPECT_EQ(read_file(log), csv);
  EXPECT_TRUE(std::filesystem::exists(dir + "/index.csv"));
  ASSERT_EQ(run_binary({"summarize", dir}, log), 0);
  const std::string text = read_file(log);
  std::istringstream words(text.substr(0, text.find('\n')));
  std::vector<std::string> head{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  ASSERT_GE(head.size(), 7u) << text;
  EXPECT_EQ(std::vector<std::string>(head.begin(), head.begin() + 7),
            (std::vector<std::string>{"run_id", "group", "at", "seed", "model.depth", "optimizer.lr", "status"}));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), static_cast<long>(3 * kSweepRuns + 1)) << text;
}

// The report's columns: the earliest excursion over the MX arms beside the earliest divergence
// to the end, each with the arm it happened in when that is not `mx`.
TEST(SweepReport, ExcursionAndDivergedToEndColumns) {
  SweepResult result;
  SweepRunResult a;
  a.index = 0;
  a.run_id = "r0";
  a.status = RunStatus::complete;
  a.excursion_step = 1200;
  a.excursion_arm = "floor_away";
  SweepRunResult b;
  b.index = 1;
  b.run_id = "r1";
  b.status = RunStatus::diverged;
  b.divergence_step = 19950;
  b.divergence_arm = "mx";
  result.runs = {a, b};
  const std::string report = format_sweep_report(result);
  std::istringstream lines(report);
  std::string header, row0, row1;
  std::getline(lines, header);
  std::getline(lines, row0);
  std::getline(lines, row1);
  auto words = [](const std::string& s) {
    std::istringstream in(s);
    return std::vector<std::string>{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
  };
  EXPECT_EQ(words(header), (std::vector<std::string>{"index", "run_id", "status", "excursion_step", "diverged_to_end_step", "note"}));
  EXPECT_EQ(words(row0), (std::vector<std::string>{"0", "r0", "complete", "1200", "-", "first", "excursion:", "arm", "floor_away"}));
  EXPECT_EQ(words(row1), (std::vector<std::string>{"1", "r1", "diverged", "-", "19950"}));
}
