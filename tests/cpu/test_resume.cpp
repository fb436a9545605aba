// Crash-safe resume through the real `mxlab run` binary: a run killed with SIGKILL at random
// moments (or stopped with SIGINT/SIGTERM) and started again ends with an HDF5 file whose every
// dataset and attribute is bit-identical to an uninterrupted run's; corrupted, truncated,
// foreign and future-version checkpoints are refused with a one-line warning and an earlier
// valid one is used instead, never the bad one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "lab/io/h5file.h"
#include "lab/runs/run_file.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

// Small enough for CI (about a second per run on one core), long enough for ten checkpoints,
// forty logged rows and four branches, one starting off the log grid (117), one forking from
// the FP32 trajectory and two that stop after their `steps` (one ends between checkpoints, one
// before a later checkpoint that a resume starts from). flush_every: 2 flushes the file every
// other row, so kills often land inside an HDF5 flush.
constexpr const char* kExperiment = R"(name: resume_test
seed: 3
steps: 200
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 32}
optimizer: {lr: 3.0e-3}
log: {log_every: 5, flush_every: 2, progress: false}
checkpoint_every: 20
interventions:
  - {name: fp32_early, at: 50, apply: to_fp32}
  - {name: no_ln_q, at: 117, apply: skip_ln_quant}
  - {name: mx_from_fp32, at: 70, steps: 37, from: fp32}
  - {name: short_fp32, at: 30, steps: 45, apply: to_fp32}
)";
constexpr int kSteps = 200;
constexpr int kCheckpointEvery = 20;
constexpr int kDefaultKillRounds = 3;  // MXLAB_RESUME_ROUNDS=N for a longer stress run
constexpr int kMaxReruns = 8;          // a rerun that is not killed must finish: this is slack
constexpr int kInterruptedExit = 130;

class Resume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("exp");
    yaml_ = dir_ + "/exp.yaml";
    write_bytes(yaml_, kExperiment);
    const std::string ref = dir_ + "/A";
    // Every checkpoint kept: the tests copy them all (copy_as_unfinished).
    const Proc p = run_mxlab({"run", yaml_, "--out", ref, "--keep-checkpoints", "all"});
    ASSERT_EQ(p.exit_code, 0) << p.output;
    ref_file_ = run_file_in(ref);
    ASSERT_FALSE(ref_file_.empty()) << p.output;
    run_id_ = ref_file_.substr(ref.size() + 1, ref_file_.size() - ref.size() - 4);
    ref_wall_s_ = p.wall_s;
    ASSERT_TRUE(file_exists(ref_file_)) << p.output;
    ASSERT_EQ(root_str(ref_file_, "status"), "complete");
  }

  static std::vector<std::string> run_args(const std::string& out) { return {"run", yaml_, "--out", out}; }
  static std::string ckpt(const std::string& dir, int step) {
    return dir + "/" + run_id_ + ".step" + std::to_string(step) + ".ckpt";
  }

  // Reruns the experiment into `out` until it reports complete; returns every rerun's output.
  static std::string rerun_to_completion(const std::string& out) {
    std::string log;
    for (int i = 0; i < kMaxReruns; ++i) {
      const Proc p = run_mxlab(run_args(out));
      log += p.output;
      EXPECT_EQ(p.exit_code, 0) << p.output;
      // "<id> complete:" when this rerun finished it; "already complete" when a killed start
      // had finished before the kill landed.
      if (p.exit_code == 0 && (contains(p.output, run_id_ + " complete:") || contains(p.output, "already complete")))
        return log;
    }
    ADD_FAILURE() << "the run did not complete after " << kMaxReruns << " reruns:\n" << log;
    return log;
  }

  static std::string dir_, yaml_, run_id_, ref_file_;
  static double ref_wall_s_;
};

std::string Resume::dir_, Resume::yaml_, Resume::run_id_, Resume::ref_file_;
double Resume::ref_wall_s_ = 0.0;

// FNV-1a-64 as lab/runs/checkpoint.cpp computes it, to forge a well-formed file.
uint64_t fnv1a(const std::string& b, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(b[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Re-seal a checkpoint after editing its bytes (checksum before the 8-byte end marker).
void reseal(std::string& b) {
  const uint64_t h = fnv1a(b, b.size() - 16);
  std::memcpy(&b[b.size() - 16], &h, sizeof h);
}

void copy_file(const std::string& from, const std::string& to) { write_bytes(to, slurp(from)); }

// Pretend the finished reference run was killed: copy its file and checkpoints into `dir`
// and mark the file `running`.
void copy_as_unfinished(const std::string& ref_file, const std::string& ref_dir, const std::string& run_id,
                        const std::string& dir) {
  copy_file(ref_file, dir + "/" + run_id + ".h5");
  for (int s = kCheckpointEvery; s < kSteps; s += kCheckpointEvery)
    copy_file(ref_dir + "/" + run_id + ".step" + std::to_string(s) + ".ckpt",
              dir + "/" + run_id + ".step" + std::to_string(s) + ".ckpt");
  h5::H5File f(dir + "/" + run_id + ".h5", h5::H5File::Mode::append);
  f.set_attr("/", "status", std::string("running"));
}

}  // namespace

// A kill inside a flush can leave a group's datasets extended over rows whose values never
// reached the disk: they read as zeros. On resume, rows from the checkpoint step on are cut, and
// so are such zero rows, although 0 is below the checkpoint step (seen in CI: a resumed file had
// rows 150, 155, 0, 0, 0, 0, 160, ...).
TEST(RunFileResume, RowsThatNeverReachedTheDiskAreCutToo) {
  mxlab::test::TempDir dir("mxlab_zeros");
  const std::string path = dir.str() + "/r.h5";
  {
    std::unique_ptr<RunFile> f = RunFile::create(path, Attrs{});
    f->open_group("trajectories/mx", Attrs{}, {});
    for (int64_t s : {0, 5, 10}) {
      MetricRow row;
      row.step = s;
      row.add("step", static_cast<double>(s));
      row.add("loss", 1.0 + static_cast<double>(s));
      f->append("trajectories/mx", row);
    }
    f->flush();
  }
  {
    h5::H5File f(path, h5::H5File::Mode::append);
    h5::H5Series step = h5::H5Series::open(f, "trajectories/mx/step");
    h5::H5Series loss = h5::H5Series::open(f, "trajectories/mx/loss");
    for (int i = 0; i < 3; ++i) {  // the extents of three lost rows, read back as fill values
      if (step.dtype() == h5::DType::i64) step.append(int64_t{0});
      else step.append(0.0);
      loss.append(0.0);
    }
  }
  std::unique_ptr<RunFile> f = RunFile::open(path);
  f->truncate_from(15);
  f.reset();
  h5::H5File r(path, h5::H5File::Mode::read);
  EXPECT_EQ(r.read_int64s("trajectories/mx/step"), (std::vector<int64_t>{0, 5, 10}));
  EXPECT_EQ(r.read_doubles("trajectories/mx/loss"), (std::vector<double>{1.0, 6.0, 11.0}));
}

TEST_F(Resume, SigkillAtRandomMomentsThenRerunEndsBitIdentical) {
  int rounds = kDefaultKillRounds;
  if (const char* e = std::getenv("MXLAB_RESUME_ROUNDS")) rounds = std::max(1, std::atoi(e));
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<double> frac(0.02, 0.98);
  constexpr int kKillsPerRound = 2;  // the first start and the first resume are both killed
  int resumed = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::string out = make_temp_dir("B" + std::to_string(round));
    std::string trace;
    for (int k = 0; k < kKillsPerRound; ++k) {
      Proc p;
      if (round == 0 && k == 0) {
        // Deterministic part: killed right after a mid-run checkpoint, so a resume is certain.
        const std::string marker = ckpt(out, kSteps / 2);
        p = run_mxlab(run_args(out), [&](double) { return file_exists(marker); });
        trace += "kill after " + marker + " appeared\n";
      } else {
        const double at = frac(rng) * ref_wall_s_;
        p = run_mxlab(run_args(out), [at](double t) { return t >= at; });
        trace += "kill at " + std::to_string(at) + " s\n";
      }
      trace += p.output;
      // Killed, or finished before the kill landed: both are fine; nothing else is.
      EXPECT_TRUE(p.term_signal == SIGKILL || p.exit_code == 0) << trace;
    }
    const std::string log = rerun_to_completion(out);
    resumed += contains(trace + log, "resumed from step");  // also a killed start that had finished
    SCOPED_TRACE("round " + std::to_string(round) + ":\n" + trace + log);
    const std::string file = out + "/" + run_id_ + ".h5";
    ASSERT_EQ(root_str(file, "status"), "complete");
    expect_same_run_files(ref_file_, file);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(resumed, 1) << "no round resumed from a checkpoint";
}

TEST_F(Resume, SigintAndSigtermCheckpointMarkInterruptedAndResume) {
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    const std::string out = make_temp_dir(sig == SIGINT ? "int" : "term");
    const std::string marker = ckpt(out, 2 * kCheckpointEvery);
    const Proc p = run_mxlab(run_args(out), [&](double) { return file_exists(marker); }, sig);
    ASSERT_EQ(p.term_signal, 0) << "died of the signal instead of stopping cleanly:\n" << p.output;
    ASSERT_EQ(p.exit_code, kInterruptedExit) << p.output;
    EXPECT_TRUE(contains(p.output, "run the same command again to resume")) << p.output;
    const std::string file = out + "/" + run_id_ + ".h5";
    EXPECT_EQ(root_str(file, "status"), "interrupted");
    const Proc r = run_mxlab(run_args(out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "resumed from step")) << r.output;
    EXPECT_EQ(root_str(file, "status"), "complete");
    expect_same_run_files(ref_file_, file);
  }
}

TEST_F(Resume, BadCheckpointsAreRefusedAndAnEarlierOneIsUsed) {
  const std::string ref_dir = ref_file_.substr(0, ref_file_.rfind('/'));
  const std::string out = make_temp_dir("bad");
  copy_as_unfinished(ref_file_, ref_dir, run_id_, out);

  // A checkpoint of another configuration (seed 4), renamed into this run's name space.
  const std::string other = make_temp_dir("other");
  const Proc o = run_mxlab({"run", yaml_, "--out", other, "--steps", "30", "--set", "seed=4", "--set", "interventions=[]"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const std::string other_file = run_file_in(other);
  ASSERT_FALSE(other_file.empty()) << o.output;
  ASSERT_NE(other_file.substr(other.size() + 1), run_id_ + ".h5");
  copy_file(other_file.substr(0, other_file.size() - 3) + ".step20.ckpt", ckpt(out, 190));
  // One flipped byte in the payload.
  std::string b = slurp(ckpt(out, 180));
  b[b.size() / 2] ^= 0x10;
  write_bytes(ckpt(out, 180), b);
  // Cut short (a copy that ran out of disk).
  b = slurp(ckpt(out, 160));
  write_bytes(ckpt(out, 160), b.substr(0, b.size() * 2 / 3));
  // A future format version, otherwise well-formed (checksum valid).
  b = slurp(ckpt(out, 140));
  const uint32_t future = 2;
  std::memcpy(&b[8], &future, sizeof future);
  reseal(b);
  write_bytes(ckpt(out, 140), b);

  const Proc r = run_mxlab(run_args(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "step190.ckpt belongs to a different configuration")) << r.output;
  EXPECT_TRUE(contains(r.output, "step180.ckpt is corrupted (checksum mismatch)")) << r.output;
  EXPECT_TRUE(contains(r.output, "step160.ckpt is truncated")) << r.output;
  EXPECT_TRUE(contains(r.output, "step140.ckpt has format version 2, this mxlab reads version 1")) << r.output;
  EXPECT_EQ(count_of(r.output, "mxlab: warning: "), 4) << r.output;
  EXPECT_EQ(count_of(r.output, "; trying an earlier one\n"), 4) << "one line per refused checkpoint:\n" << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from step 120")) << r.output;
  const std::string file = out + "/" + run_id_ + ".h5";
  EXPECT_EQ(root_str(file, "status"), "complete");
  expect_same_run_files(ref_file_, file);
}

TEST_F(Resume, NoValidCheckpointMeansTheRunStartsOver) {
  const std::string ref_dir = ref_file_.substr(0, ref_file_.rfind('/'));
  const std::string out = make_temp_dir("allbad");
  copy_as_unfinished(ref_file_, ref_dir, run_id_, out);
  int n = 0;
  for (int s = kCheckpointEvery; s < kSteps; s += kCheckpointEvery, ++n) {
    std::string b = slurp(ckpt(out, s));
    b[40] ^= 0x01;  // inside the header
    write_bytes(ckpt(out, s), b);
  }
  const Proc r = run_mxlab(run_args(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "is corrupted (checksum mismatch)"), n) << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from step")) << r.output;
  const std::string file = out + "/" + run_id_ + ".h5";
  EXPECT_EQ(root_str(file, "status"), "complete");
  expect_same_run_files(ref_file_, file);
}

// When the system refuses to look at a run file (mxlab reads each file in a child process
// first; a node at its process limit refuses the fork, the out-of-memory killer or a
// scheduler's cancel kills the child), that is not damage: the run fails with the reason and
// its file stays as it is, whether finished or resumable; once the system allows it again, the
// same command skips or resumes it. Never "started again from step 0".
TEST_F(Resume, ARunFileThatCannotBeCheckedIsLeftAsItIs) {
  const std::string shim = std::string("LD_PRELOAD=") + MXLAB_FORK_SHIM;
  const std::string ref_dir = ref_file_.substr(0, ref_file_.rfind('/'));
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {"MXLAB_FORK_FAILS=1", "fork: Resource temporarily unavailable"},
      {"MXLAB_FORK_CHILD_SIGNAL=9", "stopped from outside (SIGKILL"},
      {"MXLAB_FORK_CHILD_SIGNAL=15", "stopped from outside (SIGTERM"}};
  int k = 0;
  for (const auto& [refusal, said] : refusals)
  for (const bool finished : {true, false}) {
    SCOPED_TRACE(refusal + (finished ? ", a finished run" : ", an interrupted run"));
    const std::string out = make_temp_dir("nocheck" + std::to_string(k++));
    const std::string file = out + "/" + run_id_ + ".h5";
    if (finished) copy_file(ref_file_, file);
    else copy_as_unfinished(ref_file_, ref_dir, run_id_, out);
    const std::string before = slurp(file);
    const Proc p = run_mxlab(run_args(out), {}, SIGKILL, {shim, refusal});
    EXPECT_NE(p.exit_code, 0) << p.output;
    EXPECT_TRUE(contains(p.output, said)) << p.output;
    EXPECT_TRUE(contains(p.output, "the file is left as it is")) << p.output;
    EXPECT_FALSE(contains(p.output, "started again from step 0")) << p.output;
    EXPECT_TRUE(slurp(file) == before) << "the file was changed:\n" << p.output;
    if (!finished) {
      EXPECT_TRUE(file_exists(ckpt(out, kSteps - kCheckpointEvery))) << p.output;
    }
    const Proc r = run_mxlab(run_args(out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, finished ? "already complete" : "resumed from step 180")) << r.output;
    expect_same_run_files(ref_file_, file);
  }
}

// A kill inside an HDF5 flush can leave a file that no longer opens, or opens but fails on one
// group. Here the file is cut in half (what a half-extended file looks like to HDF5).
TEST_F(Resume, DamagedFileIsRestoredFromItsSnapshot) {
  const std::string ref_dir = ref_file_.substr(0, ref_file_.rfind('/'));
  const std::string out = make_temp_dir("damaged");
  copy_as_unfinished(ref_file_, ref_dir, run_id_, out);
  const std::string file = out + "/" + run_id_ + ".h5";
  copy_file(file, file + ".snapshot");  // the state of its last flush
  const std::string bytes = slurp(file);
  write_bytes(file, bytes.substr(0, bytes.size() / 2));
  const Proc r = run_mxlab(run_args(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "is damaged")) << r.output;
  EXPECT_TRUE(contains(r.output, "restored from " + file + ".snapshot")) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from step 180")) << r.output;
  EXPECT_EQ(root_str(file, "status"), "complete");
  expect_same_run_files(ref_file_, file);
}

TEST_F(Resume, DamagedFileWithoutSnapshotStartsOver) {
  const std::string ref_dir = ref_file_.substr(0, ref_file_.rfind('/'));
  const std::string out = make_temp_dir("damaged_nosnap");
  copy_as_unfinished(ref_file_, ref_dir, run_id_, out);
  const std::string file = out + "/" + run_id_ + ".h5";
  const std::string bytes = slurp(file);
  write_bytes(file, bytes.substr(0, bytes.size() / 2));
  const Proc r = run_mxlab(run_args(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from step")) << r.output;
  // Not silently: a one-line warning, the report's note and the new file's restart_reason.
  EXPECT_EQ(count_of(r.output, "mxlab: warning: " + file + ": it is damaged ("), 1) << r.output;
  EXPECT_TRUE(contains(r.output, "starting the run again from step 0\n")) << r.output;
  EXPECT_EQ(count_of(r.output, "started again from step 0"), 2) << r.output;  // its line and the table
  EXPECT_EQ(root_str(file, "status"), "complete");
  EXPECT_TRUE(contains(root_str(file, "restart_reason"), "it is damaged")) << root_str(file, "restart_reason");
  expect_same_run_files(ref_file_, file);
}

// Deterministic kills inside HDF5 writes: the process dies at the N-th write() to its .h5 file,
// for N across the whole run (every MXLAB_CRASH_STRIDE-th write, default 97), optionally after
// writing half of it (TORN). Needs the LD_PRELOAD shim of tests/cpu/crash_shim/kill_at_write.c;
// skipped without it (takes minutes: not for CI).
TEST_F(Resume, KillAtTheNthWriteOfTheRunFile) {
  const char* shim = std::getenv("MXLAB_CRASH_SHIM");
  if (!shim) GTEST_SKIP() << "set MXLAB_CRASH_SHIM to the library built from tests/cpu/crash_shim/kill_at_write.c";
  const std::string preload = std::string("LD_PRELOAD=") + shim;
  const Proc count = run_mxlab(run_args(make_temp_dir("count")), {}, SIGKILL, {preload, "COUNT_WRITES=1"});
  ASSERT_EQ(count.exit_code, 0) << count.output;
  const auto pos = count.output.find("h5writes=");
  ASSERT_NE(pos, std::string::npos) << "the shim is not loaded:\n" << count.output;
  const long writes = std::atol(count.output.c_str() + pos + 9);
  long stride = 97;
  if (const char* e = std::getenv("MXLAB_CRASH_STRIDE")) stride = std::max(1L, std::atol(e));
  int restored = 0;
  for (const char* torn : {"TORN=0", "TORN=1"}) {
    for (long n = 1 + (torn[5] == '1' ? stride / 2 : 0); n <= writes; n += stride) {
      SCOPED_TRACE(std::string(torn) + " KILL_AT=" + std::to_string(n) + " of " + std::to_string(writes));
      const std::string out = make_temp_dir("nth");
      const Proc k = run_mxlab(run_args(out), {}, SIGKILL, {preload, "KILL_AT=" + std::to_string(n), torn});
      ASSERT_EQ(k.term_signal, SIGKILL) << k.output;
      const std::string log = rerun_to_completion(out);
      restored += contains(log, "restored from");
      const std::string file = out + "/" + run_id_ + ".h5";
      ASSERT_EQ(root_str(file, "status"), "complete") << log;
      expect_same_run_files(ref_file_, file);
      if (HasFailure()) return;
    }
  }
  std::printf("%ld writes to the run file; %d kills left a damaged file that its snapshot restored\n", writes, restored);
}
