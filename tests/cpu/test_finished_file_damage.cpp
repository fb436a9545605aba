// A run whose file does not read back whole once it has finished (damaged on disk under the
// writer: another process, a failing disk, or a defect of our own like the forked checker that
// once flushed stale state into a sibling run's file) is not reported `complete`: run_one says
// failed (a failed run, for `mxlab run`'s summary and exit status), with the damage and what to
// do, and doing that trains the run anew.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "lab/cpu/cpu_backend.h"
#include "lab/runs/run_driver.h"
#include "lab/runs/run_file.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;
using mxlab::test::TempDir;

namespace {

RunConfig small_run() {
  RunConfig c;
  c.name = "damage";
  c.seed = 4;
  c.steps = 400;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 16;
  c.optimizer.lr = 3e-3f;
  c.log.log_every = 1;  // enough rows that the loss series' chunks are on disk before the end
  c.log.progress = false;
  return c;
}

// Overwrites the middle third of `path` with 0xAB bytes (under HDF5's feet: it does not read them
// back before it closes the file).
void scribble(const std::string& path) {
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  const off_t n = st.st_size / 3;
  const std::vector<char> junk(static_cast<size_t>(n), static_cast<char>(0xAB));
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), n), static_cast<ssize_t>(junk.size()));
  ::close(fd);
}

}  // namespace

TEST(FinishedFileDamage, ARunWhoseFileDoesNotReadBackWholeIsFailedNotComplete) {
  TempDir dir;
  RunOptions opt;
  opt.out_dir = dir.str();
  opt.make_backend = [](const std::string&) { return make_cpu_backend(); };
  std::string path;
  bool scribbled = false;
  opt.on_progress = [&](const RunProgress& p) {
    path = dir.str() + "/" + p.run_id + ".h5";
    if (!scribbled && p.step == p.steps) {  // the last logged step: nothing reads the file after it
      scribble(path);
      scribbled = true;
    }
  };
  const RunOutcome r = run_one(small_run(), opt);
  ASSERT_TRUE(scribbled);
  EXPECT_EQ(to_string(r.status), std::string("failed")) << "a damaged file was reported " << to_string(r.status);
  EXPECT_NE(r.error.find("does not read back whole"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(r.path), std::string::npos) << r.error;
  // What the message says to do works: the same run again trains it anew, whole.
  opt.on_progress = nullptr;
  const RunOutcome again = run_one(small_run(), opt);
  EXPECT_EQ(to_string(again.status), std::string("complete")) << again.error;
  EXPECT_EQ(::access(RunFile::snapshot_path(again.path).c_str(), F_OK), -1);
}

TEST(FinishedFileDamage, AnUndamagedRunIsCompleteAndLeavesNoSnapshot) {
  TempDir dir;
  RunOptions opt;
  opt.out_dir = dir.str();
  opt.make_backend = [](const std::string&) { return make_cpu_backend(); };
  const RunOutcome r = run_one(small_run(), opt);
  EXPECT_EQ(to_string(r.status), std::string("complete")) << r.error;
  EXPECT_NE(::access(r.path.c_str(), F_OK), -1);
  EXPECT_EQ(::access(RunFile::snapshot_path(r.path).c_str(), F_OK), -1) << "the snapshot of a finished run stays";
}
