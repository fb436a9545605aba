// Round trips through lab/io/h5file: every attribute kind, every dataset kind, groups,
// append across reopen, truncate (resume), flush-then-kill leaves a readable file, errors
// that name the file and the object, the atomic .tmp-then-rename writer, and file locks
// (reading takes none; appending waits out another process's lock, then says FileInUse).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5file.h"

using namespace mxlab;
using namespace mxlab::h5;

namespace {

// A fresh file name per test in the temp dir (removed at the end of the test).
class H5FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const char* tmpdir = std::getenv("TMPDIR");
    path_ = std::string(tmpdir ? tmpdir : "/tmp") + "/mxlab_test_h5_" + std::to_string(getpid()) + "_" + info->name() + ".h5";
    std::remove(path_.c_str());
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + ".tmp").c_str());
  }
  std::string path_;
};

bool file_exists(const std::string& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr;
}

// The message of the mxlab::Error thrown by fn, or "" if none was thrown.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_F(H5FileTest, AttributesOfEveryKindRoundTrip) {
  const std::vector<std::string> names = {"layer0.gamma", "layer0.beta", "", "µ-unicode"};
  const std::vector<double> values = {1.5, -0.0, std::numeric_limits<double>::infinity(), 1e-300};
  const std::string yaml = "model:\n  layers: 4\n  width: 512\n";
  {
    H5File f(path_, H5File::Mode::create);
    f.set_attr("/", "status", "running");
    f.set_attr("/", "config_yaml", yaml);
    f.set_attr("/", "schema_version", 1);
    f.set_attr("/", "seed", uint64_t{0xFEDCBA9876543210ull});
    f.set_attr("/", "first_nonfinite_step", int64_t{-1});
    f.set_attr("/", "lr", 3e-4);
    f.set_attr("/", "param_groups", names);
    f.set_attr("/", "curve", values);
    f.set_attr("/", "empty_names", std::vector<std::string>{});
    f.set_attr("/", "empty_values", std::vector<double>{});
    f.create_group("trajectories/mx");
    f.set_attr("trajectories/mx", "layers", 4);
    // Replacing an attribute, even with another type, leaves only the new one.
    f.set_attr("/", "status", "complete");
    f.set_attr("trajectories/mx", "layers", "four");
  }
  H5File f(path_, H5File::Mode::read);
  EXPECT_EQ(f.get_attr_string("/", "status"), "complete");
  EXPECT_EQ(f.get_attr_string("", "config_yaml"), yaml);
  EXPECT_EQ(f.get_attr_int64("/", "schema_version"), 1);
  EXPECT_EQ(f.get_attr_uint64("/", "seed"), 0xFEDCBA9876543210ull);
  EXPECT_EQ(f.get_attr_int64("/", "first_nonfinite_step"), -1);
  EXPECT_EQ(f.get_attr_double("/", "lr"), 3e-4);
  EXPECT_EQ(f.get_attr_double("/", "schema_version"), 1.0);  // integers read as double too
  EXPECT_EQ(f.get_attr_strings("/", "param_groups"), names);
  const std::vector<double> back = f.get_attr_doubles("/", "curve");
  ASSERT_EQ(back.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(back[i], values[i]) << i;
  EXPECT_TRUE(std::signbit(back[1]));
  EXPECT_TRUE(f.get_attr_strings("/", "empty_names").empty());
  EXPECT_TRUE(f.get_attr_doubles("/", "empty_values").empty());
  EXPECT_EQ(f.get_attr_string("trajectories/mx", "layers"), "four");
  EXPECT_TRUE(f.has_attr("/", "seed"));
  EXPECT_FALSE(f.has_attr("/", "nope"));
  const std::vector<std::string> attrs = f.object("/").attr_names();
  EXPECT_EQ(attrs, (std::vector<std::string>{"config_yaml", "curve", "empty_names", "empty_values",
                                             "first_nonfinite_step", "lr", "param_groups", "schema_version", "seed",
                                             "status"}));
}

TEST_F(H5FileTest, WrongAttributeTypeOrNameIsAnErrorNamingFileAndObject) {
  H5File f(path_, H5File::Mode::create);
  f.set_attr("/", "status", "running");
  f.set_attr("/", "lr", 0.1);
  f.set_attr("/", "neg", -5);
  std::string e = error_of([&] { f.get_attr_int64("/", "status"); });
  EXPECT_NE(e.find(path_), std::string::npos) << e;
  EXPECT_NE(e.find("status"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { f.get_attr_int64("/", "lr"); }), "");  // float is not an integer
  EXPECT_NE(error_of([&] { f.get_attr_string("/", "lr"); }), "");
  EXPECT_NE(error_of([&] { f.get_attr_uint64("/", "neg"); }), "");  // negative is not a uint64
  e = error_of([&] { f.get_attr_string("/", "missing"); });
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  e = error_of([&] { f.set_attr("no/such/group", "x", 1.0); });
  EXPECT_NE(e.find("no/such/group"), std::string::npos) << e;
}

TEST_F(H5FileTest, GroupsNestAndList) {
  H5File f(path_, H5File::Mode::create);
  f.create_group("trajectories/mx");
  f.create_group("trajectories/fp32");
  f.create_group("trajectories/mx");  // again: no-op
  f.create_group("branches/clamp_off");
  H5Series::create(f, "trajectories/mx/loss", DType::f64);
  H5Series::create(f, "trajectories/mx/step", DType::i64);
  EXPECT_TRUE(f.is_group("trajectories"));
  EXPECT_TRUE(f.is_group("trajectories/mx"));
  EXPECT_TRUE(f.is_dataset("trajectories/mx/loss"));
  EXPECT_FALSE(f.is_group("trajectories/mx/loss"));
  EXPECT_FALSE(f.exists("trajectories/nope"));
  EXPECT_FALSE(f.exists("nope/deeper/still"));
  EXPECT_EQ(f.list_groups("/"), (std::vector<std::string>{"branches", "trajectories"}));
  EXPECT_EQ(f.list_groups("trajectories"), (std::vector<std::string>{"fp32", "mx"}));
  EXPECT_EQ(f.list_datasets("trajectories/mx"), (std::vector<std::string>{"loss", "step"}));
  EXPECT_TRUE(f.list_datasets("trajectories/fp32").empty());
  EXPECT_NE(error_of([&] { f.create_group("trajectories/mx/loss"); }), "");  // a dataset is there
  EXPECT_NE(error_of([&] { f.list_groups("nope"); }), "");
}

TEST_F(H5FileTest, SeriesOfEveryKindRoundTrip) {
  {
    H5File f(path_, H5File::Mode::create);
    H5Series loss = H5Series::create(f, "trajectories/mx/loss", DType::f64);
    H5Series loss_all = H5Series::create(f, "trajectories/mx/loss_all", DType::f32, 0, 4);
    H5Series step = H5Series::create(f, "trajectories/mx/step", DType::i64);
    H5Series gamma = H5Series::create(f, "trajectories/mx/gamma_lastbin", DType::f64, 3, 2);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (int64_t t = 0; t < 10; ++t) {  // 10 rows across chunks of 2 and 4 rows
      loss.append(1.0 / static_cast<double>(t + 1));
      loss_all.append(static_cast<float>(t) + 0.25f);
      step.append(t * 7);
      gamma.append_row(std::vector<double>{0.1 * static_cast<double>(t), t % 2 ? nan : 0.5, -1.0});
    }
    const double block[2 * 3] = {1, 2, 3, 4, 5, 6};
    gamma.append_rows(block, 2);
    gamma.set_attr("quantized", 1);
    gamma.set_attr("names", std::vector<std::string>{"layer0", "layer1", "layer2"});
    EXPECT_EQ(loss.size(), 10u);
    EXPECT_EQ(gamma.size(), 12u);
    EXPECT_EQ(gamma.width(), 3u);
    EXPECT_EQ(loss.width(), 0u);
  }
  H5File f(path_, H5File::Mode::read);
  EXPECT_EQ(f.dataset_shape("trajectories/mx/loss"), (std::vector<uint64_t>{10}));
  EXPECT_EQ(f.dataset_shape("trajectories/mx/gamma_lastbin"), (std::vector<uint64_t>{12, 3}));
  const std::vector<double> loss = f.read_doubles("trajectories/mx/loss");
  const std::vector<double> loss_all = f.read_doubles("trajectories/mx/loss_all");
  const std::vector<int64_t> step = f.read_int64s("trajectories/mx/step");
  const std::vector<double> gamma = f.read_doubles("trajectories/mx/gamma_lastbin");
  ASSERT_EQ(loss.size(), 10u);
  ASSERT_EQ(step.size(), 10u);
  ASSERT_EQ(gamma.size(), 36u);
  for (int t = 0; t < 10; ++t) {
    EXPECT_EQ(loss[t], 1.0 / (t + 1));
    EXPECT_EQ(loss_all[t], static_cast<double>(static_cast<float>(t) + 0.25f));
    EXPECT_EQ(step[t], 7 * t);
    EXPECT_EQ(gamma[3 * t + 0], 0.1 * t);
    EXPECT_EQ(std::isnan(gamma[3 * t + 1]), t % 2 == 1);
    EXPECT_EQ(gamma[3 * t + 2], -1.0);
  }
  EXPECT_EQ(gamma[30], 1.0);
  EXPECT_EQ(gamma[35], 6.0);
  EXPECT_EQ(f.get_attr_int64("trajectories/mx/gamma_lastbin", "quantized"), 1);
  EXPECT_EQ(f.get_attr_strings("trajectories/mx/gamma_lastbin", "names"),
            (std::vector<std::string>{"layer0", "layer1", "layer2"}));
  EXPECT_NE(error_of([&] { f.read_int64s("trajectories/mx/loss"); }), "");  // float64 is not an integer dataset
}

TEST_F(H5FileTest, SeriesRejectsWrongRowsAndFloatsIntoIntegers) {
  H5File f(path_, H5File::Mode::create);
  H5Series gamma = H5Series::create(f, "g", DType::f64, 3);
  H5Series step = H5Series::create(f, "step", DType::i64);
  EXPECT_NE(error_of([&] { gamma.append_row(std::vector<double>{1.0, 2.0}); }), "");
  EXPECT_NE(error_of([&] { gamma.append(1.0); }), "");
  EXPECT_NE(error_of([&] { step.append(1.5); }), "");
  EXPECT_EQ(gamma.size(), 0u);
  EXPECT_EQ(step.size(), 0u);
  EXPECT_NE(error_of([&] { H5Series::create(f, "g", DType::f64); }), "");  // exists
  EXPECT_NE(error_of([&] { H5Series::open(f, "nope"); }), "");
}

// Resume: reopen the file, reopen each series (dtype and width from the file), drop the
// rows past the checkpoint, append, and read back one continuous series.
TEST_F(H5FileTest, AppendAcrossReopenAndTruncate) {
  {
    H5File f(path_, H5File::Mode::create);
    H5Series loss = H5Series::create(f, "trajectories/fp32/loss", DType::f64, 0, 3);
    H5Series grp = H5Series::create(f, "trajectories/fp32/bias_ratio_group", DType::f32, 2, 3);
    for (int t = 0; t < 8; ++t) {
      loss.append(static_cast<double>(t));
      grp.append_row(std::vector<float>{static_cast<float>(t), static_cast<float>(-t)});
    }
  }
  {
    H5File f(path_, H5File::Mode::append);
    H5Series loss = H5Series::open(f, "trajectories/fp32/loss");
    H5Series grp = H5Series::open(f, "trajectories/fp32/bias_ratio_group");
    EXPECT_EQ(loss.size(), 8u);
    EXPECT_EQ(loss.dtype(), DType::f64);
    EXPECT_EQ(grp.dtype(), DType::f32);
    EXPECT_EQ(grp.width(), 2u);
    loss.truncate(5);  // checkpoint was at row 5
    grp.truncate(5);
    EXPECT_NE(error_of([&] { loss.truncate(6); }), "");  // cannot grow by truncating
    for (int t = 5; t < 7; ++t) {
      loss.append(100.0 + t);
      grp.append_row(std::vector<double>{100.0 + t, 0.5});  // doubles into float32: rounded by HDF5
    }
    EXPECT_EQ(loss.size(), 7u);
  }
  H5File f(path_, H5File::Mode::read);
  EXPECT_EQ(f.read_doubles("trajectories/fp32/loss"), (std::vector<double>{0, 1, 2, 3, 4, 105, 106}));
  EXPECT_EQ(f.read_doubles("trajectories/fp32/bias_ratio_group"),
            (std::vector<double>{0, 0, 1, -1, 2, -2, 3, -3, 4, -4, 105, 0.5, 106, 0.5}));
}

// A writer killed after flush() (no close, no destructors) leaves a file that opens, reads
// and can be resumed.
TEST_F(H5FileTest, FlushedFileSurvivesKill) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    H5File f(path_, H5File::Mode::create);
    f.set_attr("/", "status", "running");
    H5Series loss = H5Series::create(f, "trajectories/mx/loss", DType::f64, 0, 4);
    for (int t = 0; t < 10; ++t) loss.append(0.5 * t);
    f.flush();
    loss.append(99.0);  // after the last flush: may or may not survive
    raise(SIGKILL);
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  {
    H5File f(path_, H5File::Mode::read);
    EXPECT_EQ(f.get_attr_string("/", "status"), "running");
    const std::vector<double> loss = f.read_doubles("trajectories/mx/loss");
    ASSERT_GE(loss.size(), 10u);
    for (int t = 0; t < 10; ++t) EXPECT_EQ(loss[t], 0.5 * t);
  }
  H5File f(path_, H5File::Mode::append);
  H5Series loss = H5Series::open(f, "trajectories/mx/loss");
  loss.truncate(10);
  loss.append(5.0);
  f.set_attr("/", "status", "complete");
  f.close();
  H5File r(path_, H5File::Mode::read);
  EXPECT_EQ(r.read_doubles("trajectories/mx/loss").size(), 11u);
  EXPECT_EQ(r.get_attr_string("/", "status"), "complete");
}

TEST_F(H5FileTest, OpenErrorsNameTheFile) {
  std::string e = error_of([&] { H5File f(path_, H5File::Mode::read); });
  EXPECT_NE(e.find(path_), std::string::npos) << e;
  e = error_of([&] { H5File f(path_, H5File::Mode::append); });
  EXPECT_NE(e.find(path_), std::string::npos) << e;
  e = error_of([&] { H5File f("/nonexistent_dir_mxlab/x.h5", H5File::Mode::create); });
  EXPECT_NE(e.find("/nonexistent_dir_mxlab/x.h5"), std::string::npos) << e;
  // Not an HDF5 file: HDF5's reason is in the message.
  {
    std::FILE* junk = std::fopen(path_.c_str(), "wb");
    ASSERT_NE(junk, nullptr);
    std::fputs("not hdf5", junk);
    std::fclose(junk);
  }
  e = error_of([&] { H5File f(path_, H5File::Mode::read); });
  EXPECT_NE(e.find(path_), std::string::npos) << e;
  EXPECT_NE(e.find("signature"), std::string::npos) << e;  // "unable to find a valid file signature"
}

TEST_F(H5FileTest, AtomicWriteAppearsOnlyWhenComplete) {
  EXPECT_NE(error_of([&] {
              write_file_atomically(path_, [](H5File& f) {
                f.set_attr("/", "status", "half");
                throw Error("fill failed");
              });
            }),
            "");
  EXPECT_FALSE(file_exists(path_));
  EXPECT_FALSE(file_exists(path_ + ".tmp"));
  write_file_atomically(path_, [](H5File& f) {
    f.set_attr("/", "status", "complete");
    H5Series s = H5Series::create(f, "x", DType::i64);
    s.append(int64_t{42});
  });
  EXPECT_TRUE(file_exists(path_));
  EXPECT_FALSE(file_exists(path_ + ".tmp"));
  H5File f(path_, H5File::Mode::read);
  EXPECT_EQ(f.get_attr_string("/", "status"), "complete");
  EXPECT_EQ(f.read_int64s("x"), (std::vector<int64_t>{42}));
}

// Reading a file checks it in a forked child first (h5check.h). The child starts as a copy of this
// process, with the HDF5 state of every file this process has open for writing: it must leave
// those files alone. (It used to shut HDF5 down before exiting, which flushed the copy of that
// state into the other files: with `mxlab run --jobs 2`, the first run to finish read its file
// back and wrote the state of the other run's file, as it was at the fork, into it; that file then
// failed to decode, "inflate() failed".)
TEST_F(H5FileTest, CheckingAFileLeavesTheFilesThisProcessHasOpenAlone) {
  const std::string other = path_ + ".other.h5";
  {
    H5File f(other, H5File::Mode::create);
    f.set_attr("/", "status", "complete");
  }
  std::vector<char> before;
  auto bytes_of = [](const std::string& p) {
    std::vector<char> b;
    if (std::FILE* f = std::fopen(p.c_str(), "rb")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) b.insert(b.end(), buf, buf + n);
      std::fclose(f);
    }
    return b;
  };
  {
    H5File w(path_, H5File::Mode::create);
    w.set_attr("/", "status", "running");
    H5Series s = H5Series::create(w, "trajectories/mx/loss", DType::f64, 0, 64);
    for (int t = 0; t < 1000; ++t) s.append(0.25 * t);  // rows in HDF5's caches, not yet on disk
    before = bytes_of(path_);
    {
      H5File r(other, H5File::Mode::read);  // the check's child runs now
      EXPECT_EQ(r.get_attr_string("/", "status"), "complete");
    }
    EXPECT_TRUE(bytes_of(path_) == before) << "the check's child wrote into " << path_
                                            << ", which only this process has open";
    for (int t = 1000; t < 2000; ++t) s.append(0.25 * t);
  }
  H5File r(path_, H5File::Mode::read);
  const std::vector<double> loss = r.read_doubles("trajectories/mx/loss");
  ASSERT_EQ(loss.size(), 2000u);
  for (int t = 0; t < 2000; ++t) ASSERT_EQ(loss[t], 0.25 * t) << "row " << t;
  std::remove(other.c_str());
}

namespace {

// What another program that has `path` open through HDF5 holds: an flock(2) lock on its own
// open file (shared for a reader such as h5py's File(path, "r"), exclusive for a writer).
// HDF5 in this process conflicts with it exactly as with another process's lock.
class ForeignLock {
 public:
  ForeignLock(const std::string& path, int how) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    EXPECT_GE(fd_, 0) << path;
    EXPECT_EQ(::flock(fd_, how | LOCK_NB), 0) << path;
  }
  ~ForeignLock() { release(); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
 private:
  int fd_;
};

// Restores the default wait at the end of a test.
struct LockWait {
  explicit LockWait(std::chrono::milliseconds w) { set_append_lock_wait(w); }
  ~LockWait() { set_append_lock_wait(kDefaultAppendLockWait); }
};

std::string file_bytes(const std::string& p) {
  std::string b;
  if (std::FILE* f = std::fopen(p.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) b.append(buf, n);
    std::fclose(f);
  }
  return b;
}

}  // namespace

// A writer elsewhere (an exclusive lock) does not keep mxlab from reading: its readers take no
// lock, so they never make a writer fail either (a shard rebuilding index.csv while another
// shard resumes a run in the same folder).
TEST_F(H5FileTest, ReadingTakesNoLock) {
  {
    H5File w(path_, H5File::Mode::create);
    w.set_attr("/", "status", "interrupted");
  }
  EXPECT_FALSE(locked_by_another_open(path_));
  ForeignLock writer(path_, LOCK_EX);
  EXPECT_TRUE(locked_by_another_open(path_));
  H5File r(path_, H5File::Mode::read);
  EXPECT_EQ(r.get_attr_string("/", "status"), "interrupted");
  writer.release();
  EXPECT_FALSE(locked_by_another_open(path_));
  EXPECT_FALSE(locked_by_another_open(path_ + ".absent"));
  // A file this process has open to write (with HDF5's lock) still reads: the check's child
  // shares that open, whose locking flag a lock-free open would not match.
  H5File w(path_, H5File::Mode::append);
  w.set_attr("/", "status", "running");
  w.flush();
  H5File r2(path_, H5File::Mode::read);
  EXPECT_EQ(r2.get_attr_string("/", "status"), "running");
}

// Another program's lock is waited for and, when it is released, the file opens to append.
TEST_F(H5FileTest, AppendWaitsForAnotherProgramsLock) {
  {
    H5File w(path_, H5File::Mode::create);
    w.set_attr("/", "status", "interrupted");
  }
  const LockWait wait(std::chrono::seconds(30));
  auto reader = std::make_unique<ForeignLock>(path_, LOCK_SH);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    reader->release();
  });
  const auto t0 = std::chrono::steady_clock::now();
  {
    H5File a(path_, H5File::Mode::append);
    a.set_attr("/", "status", "running");
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  releaser.join();
  EXPECT_GE(waited, 0.35) << "it opened although the lock was held";
  H5File r(path_, H5File::Mode::read);
  EXPECT_EQ(r.get_attr_string("/", "status"), "running");
}

// A lock still held after the wait is FileInUse, naming the file, and the file is untouched.
TEST_F(H5FileTest, AppendToAFileStillLockedIsFileInUseAndLeavesItAlone) {
  {
    H5File w(path_, H5File::Mode::create);
    w.set_attr("/", "status", "interrupted");
  }
  const std::string before = file_bytes(path_);
  const LockWait wait(std::chrono::milliseconds(300));
  for (int how : {LOCK_SH, LOCK_EX}) {
    ForeignLock other(path_, how);
    try {
      H5File a(path_, H5File::Mode::append);
      ADD_FAILURE() << "opened a file another program holds locked";
    } catch (const FileInUse& e) {
      EXPECT_EQ(e.path(), path_);
      EXPECT_NE(std::string(e.what()).find(path_ + " is open in another process"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("close it there and run the same command again"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(file_bytes(path_), before);
  }
  // Any other failure to open is not FileInUse.
  const std::string junk = path_ + ".junk.h5";
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("not hdf5", f);
    std::fclose(f);
  }
  bool in_use = false, other_error = false;
  try {
    H5File a(junk, H5File::Mode::append);
  } catch (const FileInUse&) {
    in_use = true;
  } catch (const Error&) {
    other_error = true;
  }
  EXPECT_FALSE(in_use);
  EXPECT_TRUE(other_error);
  std::remove(junk.c_str());
}
