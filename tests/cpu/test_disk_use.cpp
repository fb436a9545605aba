// What a run keeps on disk (lab/runs/disk_use.h), through the real binary: by default a run
// keeps the latest two checkpoints besides those at intervention steps and removes its
// snapshot once finished, with run files identical to a run that keeps everything; `mxlab
// branch` replays from step 0 when no checkpoint is left at or before its step; `mxlab gc`
// removes what finished runs no longer need (and --dry-run nothing), never touches an
// unfinished or locked run, and resume and branch work after it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/io/locks.h"
#include "lab/runs/disk_use.h"
#include "tests/cpu/run_binary_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

constexpr const char* kBaseline = R"(name: disk_use_test
seed: 9
steps: 120
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 32}
optimizer: {lr: 3.0e-3}
log: {log_every: 5, progress: false}
checkpoint_every: 20
)";
constexpr const char* kInline = "interventions:\n  - {name: b30, at: 30, apply: to_fp32}\n";

// Every file of `dir` with its size.
std::map<std::string, long long> listing(const std::string& dir) {
  std::map<std::string, long long> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat st {};
      ::stat((dir + "/" + n).c_str(), &st);
      out[n] = static_cast<long long>(st.st_size);
    }
    ::closedir(d);
  }
  return out;
}

std::string id_of(const std::string& file) {
  const std::string n = file.substr(file.rfind('/') + 1);
  return n.substr(0, n.size() - 3);
}

std::vector<int> ckpt_steps(const std::string& dir) {
  std::vector<int> s;
  for (const auto& [n, size] : listing(dir)) {
    const auto p = n.find(".step");
    if (p != std::string::npos && n.size() > 5 && n.compare(n.size() - 5, 5, ".ckpt") == 0)
      s.push_back(std::stoi(n.substr(p + 5)));
  }
  std::sort(s.begin(), s.end());
  return s;
}

// A copy of a finished run's file and checkpoints in a fresh folder; returns the new file.
std::string copy_run(const std::string& file, const std::string& tag) {
  const std::string from = file.substr(0, file.rfind('/')), to = make_temp_dir(tag);
  for (const auto& [n, size] : listing(from))
    if (n.size() > 5 && (n.compare(n.size() - 3, 3, ".h5") == 0 || n.compare(n.size() - 5, 5, ".ckpt") == 0))
      write_bytes(to + "/" + n, slurp(from + "/" + n));
  return to + "/" + file.substr(file.rfind('/') + 1);
}

class DiskUse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("disk");
    yaml_ = dir_ + "/baseline.yaml";
    write_bytes(yaml_, kBaseline);
    write_bytes(dir_ + "/inline.yaml", std::string(kBaseline) + kInline);
    base_ = run({"run", yaml_, "--out", dir_ + "/base"});
    all_ = run({"run", yaml_, "--out", dir_ + "/all", "--keep-checkpoints", "all"});
    inline_ = run({"run", dir_ + "/inline.yaml", "--out", dir_ + "/inline"});
  }
  static std::string run(const std::vector<std::string>& args) {
    const Proc p = run_mxlab(args);
    EXPECT_EQ(p.exit_code, 0) << p.output;
    return run_file_in(args[3]);
  }
  static std::string dir_, yaml_, base_, all_, inline_;
};
std::string DiskUse::dir_, DiskUse::yaml_, DiskUse::base_, DiskUse::all_, DiskUse::inline_;

}  // namespace

TEST(DiskUseRules, CheckpointsBeyondKeepTheLatestAndTheBranchSteps) {
  const std::vector<int64_t> steps = {100, 20, 47, 40, 60, 80};
  EXPECT_EQ(checkpoints_beyond(steps, {47}, 2), (std::vector<int64_t>{20, 40, 60}));
  EXPECT_EQ(checkpoints_beyond(steps, {47}, 0), (std::vector<int64_t>{20, 40, 60, 80, 100}));
  EXPECT_EQ(checkpoints_beyond(steps, {47, 100}, 1), (std::vector<int64_t>{20, 40, 60}));
  EXPECT_TRUE(checkpoints_beyond(steps, {}, kKeepAllCheckpoints).empty());
  EXPECT_TRUE(checkpoints_beyond(steps, {}, 6).empty());
  EXPECT_EQ(parse_keep_checkpoints("all", 1), kKeepAllCheckpoints);
  EXPECT_EQ(parse_keep_checkpoints("3", 1), 3);
  EXPECT_EQ(parse_keep_checkpoints("0", 0), 0);
  EXPECT_THROW(parse_keep_checkpoints("0", 1), Error);
  EXPECT_THROW(parse_keep_checkpoints("-1", 0), Error);
  EXPECT_THROW(parse_keep_checkpoints("two", 0), Error);
}

TEST_F(DiskUse, ARunKeepsTheLatestTwoCheckpointsAndTheInterventionStepsAndNoSnapshot) {
  ASSERT_FALSE(base_.empty());
  EXPECT_EQ(ckpt_steps(dir_ + "/base"), (std::vector<int>{80, 100}));
  EXPECT_EQ(ckpt_steps(dir_ + "/all"), (std::vector<int>{20, 40, 60, 80, 100}));
  EXPECT_EQ(ckpt_steps(dir_ + "/inline"), (std::vector<int>{30, 80, 100}));  // 30: the intervention's
  for (const char* d : {"/base", "/all", "/inline"})
    for (const auto& [n, size] : listing(dir_ + d)) {
      EXPECT_EQ(n.find(".snapshot"), std::string::npos) << d << "/" << n << ": a finished run keeps no snapshot";
      EXPECT_EQ(n.find(".tmp"), std::string::npos) << d << "/" << n;
    }
  // What is kept changes no byte of the result.
  expect_same_run_files(all_, base_);
  // The run's own checkpoints are still good for resume: a file pretending to be unfinished
  // resumes from the latest and ends identical.
  const std::string copy = copy_run(base_, "resume");
  { h5::H5File(copy, h5::H5File::Mode::append).set_attr("/", "status", std::string("interrupted")); }
  const Proc r = run_mxlab({"run", yaml_, "--out", copy.substr(0, copy.rfind('/'))});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from step 100")) << r.output;
  expect_same_run_files(all_, copy);
}

TEST_F(DiskUse, BranchWithNoCheckpointAtOrBeforeItsStepReplaysFromStepZero) {
  const std::string file = copy_run(base_, "branch0");  // checkpoints 80 and 100 only
  const Proc p = run_mxlab({"branch", file, "--at", "30", "--apply", "to_fp32", "--name", "b30"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "replaying steps 0..29 from the start")) << p.output;
  EXPECT_TRUE(contains(p.output, "from step 0, no checkpoint")) << p.output;
  EXPECT_FALSE(file_exists(file + ".snapshot")) << "branch leaves the snapshot it made";
  const h5::H5File a(inline_, h5::H5File::Mode::read), b(file, h5::H5File::Mode::read);
  expect_same_group(a, "branches/b30", b, "branches/b30");
}

TEST_F(DiskUse, GcDryRunRemovesNothingAndGcRemovesWhatFinishedRunsNoLongerNeed) {
  const std::string file = copy_run(all_, "gc");
  const std::string dir = file.substr(0, file.rfind('/')), id = id_of(file);
  write_bytes(file + ".snapshot", slurp(file));  // what a run of an earlier build leaves
  write_bytes(file + ".snapshot.tmp", "partial");
  write_bytes(dir + "/" + id + ".step20.ckpt.tmp", "partial");
  write_bytes(dir + "/notes.txt", "mine");
  const auto before = listing(dir);
  long long expect_bytes = before.at(id + ".h5.snapshot") + 7 + 7;
  for (int s : {20, 40, 60}) expect_bytes += before.at(id + ".step" + std::to_string(s) + ".ckpt");

  const Proc dry = run_mxlab({"gc", dir, "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_EQ(listing(dir), before) << "--dry-run removed something:\n" << dry.output;
  EXPECT_EQ(count_of(dry.output, "would remove " + dir), 6) << dry.output;
  EXPECT_TRUE(contains(dry.output, "would remove 6 files, " + std::to_string(expect_bytes) + " bytes")) << dry.output;

  const Proc gc = run_mxlab({"gc", dir});
  ASSERT_EQ(gc.exit_code, 0) << gc.output;
  EXPECT_TRUE(contains(gc.output, "removed 6 files, " + std::to_string(expect_bytes) + " bytes")) << gc.output;
  EXPECT_EQ(ckpt_steps(dir), (std::vector<int>{80, 100}));
  auto after = listing(dir);
  EXPECT_EQ(after.size(), 4u) << "the run file, checkpoints 80 and 100, notes.txt";
  EXPECT_EQ(after.count("notes.txt"), 1u);
  expect_same_run_files(all_, file);
  // Nothing left to remove; then every checkpoint goes with --keep-checkpoints 0, and a branch
  // still works (replaying from step 0), identical to the in-line one.
  EXPECT_TRUE(contains(run_mxlab({"gc", dir}).output, "removed 0 files, 0 bytes"));
  ASSERT_EQ(run_mxlab({"gc", dir, "--keep-checkpoints", "0"}).exit_code, 0);
  EXPECT_TRUE(ckpt_steps(dir).empty());
  const Proc b = run_mxlab({"branch", file, "--at", "30", "--apply", "to_fp32", "--name", "b30"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const h5::H5File x(inline_, h5::H5File::Mode::read), y(file, h5::H5File::Mode::read);
  expect_same_group(x, "branches/b30", y, "branches/b30");
}

TEST_F(DiskUse, GcKeepsTheCheckpointsOfBranchSteps) {
  const std::string file = copy_run(inline_, "gcbranch");
  const std::string dir = file.substr(0, file.rfind('/'));
  const Proc gc = run_mxlab({"gc", dir, "--keep-checkpoints", "0"});
  ASSERT_EQ(gc.exit_code, 0) << gc.output;
  EXPECT_EQ(ckpt_steps(dir), (std::vector<int>{30})) << gc.output;
  const Proc b = run_mxlab({"branch", file, "--at", "30", "--apply", "skip_ln_quant", "--name", "noln30"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "from checkpoint 30")) << b.output;
}

TEST_F(DiskUse, GcLeavesUnfinishedAndLockedRunsAlone) {
  // An interrupted run: its snapshot and every checkpoint stay, and it resumes afterwards.
  const std::string file = copy_run(all_, "gcunfinished");
  const std::string dir = file.substr(0, file.rfind('/'));
  { h5::H5File(file, h5::H5File::Mode::append).set_attr("/", "status", std::string("interrupted")); }
  write_bytes(file + ".snapshot", slurp(file));
  const auto before = listing(dir);
  const Proc gc = run_mxlab({"gc", dir, "--keep-checkpoints", "0"});
  ASSERT_EQ(gc.exit_code, 0) << gc.output;
  EXPECT_TRUE(contains(gc.output, "status interrupted: resuming it needs its snapshot and checkpoints")) << gc.output;
  EXPECT_EQ(listing(dir), before);
  const Proc r = run_mxlab({"run", yaml_, "--out", dir});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from step 100")) << r.output;
  expect_same_run_files(all_, file);

  // A finished run whose lock a live process holds (this one).
  const std::string locked = copy_run(all_, "gclocked");
  const std::string ldir = locked.substr(0, locked.rfind('/'));
  write_bytes(locked + ".snapshot", slurp(locked));
  RunLock lock;
  ASSERT_TRUE(lock.try_acquire(ldir, id_of(locked)));
  const auto lbefore = listing(ldir);
  const Proc l = run_mxlab({"gc", ldir});
  ASSERT_EQ(l.exit_code, 0) << l.output;
  EXPECT_TRUE(contains(l.output, "in use by pid")) << l.output;
  EXPECT_EQ(listing(ldir), lbefore);
}

// Metric series are stored with shuffle + deflate: a short series no longer costs a whole
// uncompressed chunk (1024 rows) on disk, and the values read back unchanged.
TEST(DiskUseRules, SeriesAreCompressedAndReadBackExactly) {
  const std::string path = make_temp_dir("h5z") + "/series.h5";
  std::vector<double> row(8);
  {
    h5::H5File f(path, h5::H5File::Mode::create);
    for (int d = 0; d < 40; ++d) {
      h5::H5Series s = h5::H5Series::create(f, "g/m" + std::to_string(d), h5::DType::f64, 8);
      for (int r = 0; r < 10; ++r) {
        for (int c = 0; c < 8; ++c) row[c] = std::ldexp(1.0 + d * 0.01 + r * 0.1 + c, -r) / 3.0;
        s.append_rows(row.data(), 1);
      }
    }
    f.close();
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  // Uncompressed: 40 chunks of 1024 x 8 doubles, 2.6 MB.
  EXPECT_LT(st.st_size, 300 * 1000) << "the datasets are not compressed";
  const h5::H5File f(path, h5::H5File::Mode::read);
  for (int d = 0; d < 40; ++d) {
    const std::vector<double> v = f.read_doubles("g/m" + std::to_string(d));
    ASSERT_EQ(v.size(), 80u);
    for (int r = 0; r < 10; ++r)
      for (int c = 0; c < 8; ++c)
        EXPECT_EQ(v[r * 8 + c], std::ldexp(1.0 + d * 0.01 + r * 0.1 + c, -r) / 3.0);
  }
}
