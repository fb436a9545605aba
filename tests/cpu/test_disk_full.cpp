// A full disk or a read-only directory, through the real `mxlab` binary: no crash (HDF5 used to
// segfault at exit after a failed close), one line naming the file, the cause and the fix,
// exit code 1 (a run failed) or 74 (an output could not be written), no HDF5 error dump, the last
// good state of every file readable, no partial output, and a resume that ends bit-identical to
// an uninterrupted run once there is room again. Each case runs twice: on a real small tmpfs
// (when this process may mount one: root with CAP_SYS_ADMIN, as in CI's container) and with an
// LD_PRELOAD shim that fills the disk after N bytes (tests/cpu/enospc_shim).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lab/core/exit_codes.h"
#include "lab/io/h5file.h"
#include "lab/io/npy.h"
#include "tests/cpu/run_binary_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

// A fraction of a second per run: a 660 KB run file (and as much for its snapshot, and as much
// again while the snapshot is refreshed) and 3 MB checkpoints at steps 20 and 40 (wide enough
// that on a tmpfs the second checkpoint, not a snapshot refresh, is what fills the disk).
constexpr const char* kExperiment = R"(name: disk_full_test
seed: 5
steps: 60
device: cpu
model: {depth: 1, width: 128, hidden_mult: 4}
data: {batch: 32}
log: {log_every: 5, progress: false}
checkpoint_every: 20
)";

enum class Disk { tmpfs, shim };

std::string disk_name(const ::testing::TestParamInfo<Disk>& p) { return p.param == Disk::tmpfs ? "Tmpfs" : "Shim"; }

// A tmpfs mounted at `dir` for the lifetime of the object (unmounted lazily at the end).
struct Tmpfs {
  std::string dir;
  bool mounted = false;
  Tmpfs(std::string d, size_t bytes, bool read_only = false) : dir(std::move(d)) {
    std::filesystem::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, size_opt(bytes).c_str()) == 0;
  }
  ~Tmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
  bool remount(size_t bytes, bool read_only = false) {
    return ::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | (read_only ? MS_RDONLY : 0), size_opt(bytes).c_str()) == 0;
  }
  static std::string size_opt(size_t bytes) { return "size=" + std::to_string(bytes); }
};

std::vector<std::string> shim_env(const std::string& dir, const std::string& match, long long after) {
  // The shim compares with the paths the kernel reports (/proc/self/fd): canonical ones.
  const std::string canonical = std::filesystem::weakly_canonical(dir).string();
  return {std::string("LD_PRELOAD=") + MXLAB_ENOSPC_SHIM, "MXLAB_ENOSPC_DIR=" + canonical, "MXLAB_ENOSPC_MATCH=" + match,
          "MXLAB_ENOSPC_AFTER=" + std::to_string(after)};
}

// What every failure must look like: exited (no signal), with `code`, the cause named, one
// line of it, and nothing of HDF5's own error stack.
void expect_clean_failure(const Proc& p, int code, const std::string& cause) {
  EXPECT_EQ(p.term_signal, 0) << p.output;
  EXPECT_EQ(p.exit_code, code) << p.output;
  EXPECT_TRUE(contains(p.output, cause)) << p.output;
  EXPECT_FALSE(contains(p.output, "HDF5-DIAG")) << p.output;
  EXPECT_FALSE(contains(p.output, "errno =")) << "HDF5's driver text leaked: " << p.output;
  EXPECT_LT(p.output.size(), 2000u) << p.output;
}

// Every object, attribute and dataset of a run file reads back (what h5py needs).
void expect_readable(const std::string& path) {
  SCOPED_TRACE(path);
  ASSERT_TRUE(file_exists(path));
  const h5::H5File f(path, h5::H5File::Mode::read);
  attrs_of(f, "/");
  for (const char* top : {"trajectories", "branches"}) {
    if (!f.is_group(top)) continue;
    for (const std::string& g : f.list_groups(top))
      for (const std::string& d : f.list_datasets(std::string(top) + "/" + g)) f.read_doubles(std::string(top) + "/" + g + "/" + d);
  }
}

std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (contains(name, ".tmp") || contains(name, ".mxlab-")) out.push_back(name);
  }
  return out;
}

class DiskFull : public ::testing::TestWithParam<Disk> {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("suite");
    yaml_ = dir_ + "/exp.yaml";
    write_bytes(yaml_, kExperiment);
    const Proc p = run_mxlab({"run", yaml_, "--out", dir_ + "/ref"});
    ASSERT_EQ(p.exit_code, 0) << p.output;
    ref_file_ = run_file_in(dir_ + "/ref");
    ASSERT_FALSE(ref_file_.empty());
    run_name_ = std::filesystem::path(ref_file_).filename().string();
    file_bytes_ = std::filesystem::file_size(ref_file_);
    ckpt_bytes_ = std::filesystem::file_size(ref_file_.substr(0, ref_file_.size() - 3) + ".step20.ckpt");
  }

  void SetUp() override {
    if (GetParam() == Disk::tmpfs) {
      Tmpfs probe(make_temp_dir("probe"), 1 << 20);
      if (!probe.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN); the Shim variant covers it";
    }
  }

  // `mxlab ARGS` with the disk at `dir` full after about `bytes` (tmpfs: its size; shim: bytes
  // written to files whose path contains `match`).
  struct SmallDisk {
    std::unique_ptr<Tmpfs> fs;
    std::vector<std::string> env;
  };
  SmallDisk small_disk(const std::string& dir, size_t bytes, const std::string& match) {
    SmallDisk d;
    if (GetParam() == Disk::tmpfs) {
      d.fs = std::make_unique<Tmpfs>(dir, bytes);
      EXPECT_TRUE(d.fs->mounted);
    } else {
      std::filesystem::create_directories(dir);
      d.env = shim_env(dir, match, static_cast<long long>(bytes));
    }
    return d;
  }

  static std::string dir_, yaml_, ref_file_, run_name_;
  static size_t file_bytes_, ckpt_bytes_;
};

std::string DiskFull::dir_, DiskFull::yaml_, DiskFull::ref_file_, DiskFull::run_name_;
size_t DiskFull::file_bytes_ = 0, DiskFull::ckpt_bytes_ = 0;

// The disk fills while the second checkpoint is written: the run fails (exit 1) naming the
// checkpoint, no partial checkpoint stays, the run file is readable and marked failed, and with
// room again the same command resumes from step 20 to a file identical to the reference.
TEST_P(DiskFull, DuringACheckpointTheRunFailsCleanlyAndResumes) {
  const std::string out = make_temp_dir("ckpt") + "/disk";
  // tmpfs: the run file, its snapshot and a snapshot refresh, one checkpoint and half of the
  // next; shim: checkpoint bytes only, the same point.
  const bool tmpfs = GetParam() == Disk::tmpfs;
  SmallDisk d = small_disk(out, tmpfs ? 3 * file_bytes_ + ckpt_bytes_ * 3 / 2 + (32 << 10) : ckpt_bytes_ * 3 / 2,
                           ".ckpt");
  const Proc p = run_mxlab({"run", yaml_, "--out", out}, {}, SIGKILL, d.env);
  expect_clean_failure(p, kExitRunFailed, "no space left on device");
  EXPECT_TRUE(contains(p.output, ".step40.ckpt")) << p.output;
  const std::string file = out + "/" + run_name_;
  expect_readable(file);
  EXPECT_EQ(root_str(file, "status"), "failed");
  EXPECT_TRUE(contains(root_str(file, "error"), "no space left on device"));
  EXPECT_TRUE(leftovers(out).empty()) << leftovers(out).front();
  EXPECT_FALSE(file_exists(out + "/" + run_name_.substr(0, run_name_.size() - 3) + ".step40.ckpt"));

  // Resuming on a disk still too full for the file's snapshot fails the same way and leaves
  // the file alone (it used to be truncated and the run started over).
  const std::string before = slurp(file);
  std::vector<std::string> env;
  if (tmpfs) {
    struct statvfs st {};
    ASSERT_EQ(::statvfs(out.c_str(), &st), 0);
    ASSERT_TRUE(d.fs->remount((st.f_blocks - st.f_bfree) * st.f_frsize + (64 << 10)));
  } else {
    env = shim_env(out, ".snapshot", 0);
  }
  const Proc again = run_mxlab({"run", yaml_, "--out", out}, {}, SIGKILL, env);
  expect_clean_failure(again, kExitRunFailed, "cannot write " + file + ".snapshot: no space left on device");
  EXPECT_TRUE(slurp(file) == before) << "the run file changed";
  EXPECT_TRUE(leftovers(out).empty()) << leftovers(out).front();

  if (tmpfs) {
    ASSERT_TRUE(d.fs->remount(64 << 20));
  }
  const Proc r = run_mxlab({"run", yaml_, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from step 20")) << r.output;
  expect_same_run_files(ref_file_, file);
}

// The disk fills inside an HDF5 flush of the run file itself: the file cannot be marked failed,
// so it is put back to its last completed flush (its snapshot) and stays readable; with room
// again the run starts over from that state and ends identical to the reference.
TEST_P(DiskFull, InsideTheRunFileItKeepsTheLastFlushedState) {
  const std::string out = make_temp_dir("h5") + "/disk";
  // Room for the new file and its first snapshot (about 10 KB each: root attributes only), not
  // for the datasets' first chunks.
  SmallDisk d = small_disk(out, GetParam() == Disk::tmpfs ? (96 << 10) : (40 << 10), ".h5");
  const Proc p = run_mxlab({"run", yaml_, "--out", out}, {}, SIGKILL, d.env);
  expect_clean_failure(p, kExitRunFailed, "no space left on device");
  const std::string file = out + "/" + run_name_;
  EXPECT_TRUE(contains(p.output, "cannot write " + file)) << p.output;
  EXPECT_TRUE(contains(p.output, "is kept as of its last completed flush")) << p.output;
  expect_readable(file);
  EXPECT_EQ(root_str(file, "status"), "running");
  EXPECT_TRUE(leftovers(out).empty()) << leftovers(out).front();

  if (d.fs) {
    ASSERT_TRUE(d.fs->remount(64 << 20));
  }
  const Proc r = run_mxlab({"run", yaml_, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_run_files(ref_file_, file);
}

// `mxlab branch` on a full disk: the run file is put back as it was (no half-written branch),
// exit 74 with the cause; with room again the same command adds the branch.
TEST_P(DiskFull, DuringABranchTheFileIsKeptAndTheBranchCanBeRetried) {
  const std::string out = make_temp_dir("branch") + "/disk";
  const bool tmpfs = GetParam() == Disk::tmpfs;
  std::unique_ptr<Tmpfs> fs;
  if (tmpfs) {
    fs = std::make_unique<Tmpfs>(out, 64 << 20);
    ASSERT_TRUE(fs->mounted);
  }
  ASSERT_EQ(run_mxlab({"run", yaml_, "--out", out}).exit_code, 0);
  const std::string file = out + "/" + run_name_;
  const std::string before = make_temp_dir("before") + "/" + run_name_;
  write_bytes(before, slurp(file));
  // A finished run's snapshot is not needed (branch makes a new one); without it the space that
  // replacing it would free does not count.
  std::filesystem::remove(file + ".snapshot");
  std::vector<std::string> env;
  if (tmpfs) {
    // Leave room for the snapshot copy that `branch` makes first, not for the branch's chunks.
    struct statvfs st {};
    ASSERT_EQ(::statvfs(out.c_str(), &st), 0);
    const size_t used = (st.f_blocks - st.f_bfree) * st.f_frsize;
    ASSERT_TRUE(fs->remount(used + file_bytes_ + (16 << 10)));
  } else {
    env = shim_env(out, run_name_, static_cast<long long>(file_bytes_ + (4 << 10)));
  }
  const std::vector<std::string> args = {"branch", file, "--at", "40", "--apply", "to_fp32", "--name", "late"};
  const Proc p = run_mxlab(args, {}, SIGKILL, env);
  expect_clean_failure(p, kExitIo, "no space left on device");
  EXPECT_TRUE(contains(p.output, "is kept as of its last completed flush")) << p.output;
  expect_readable(file);
  expect_same_run_files(before, file);  // (the bytes differ: the superblock's "open for writing" flag)
  EXPECT_FALSE(h5::H5File(file, h5::H5File::Mode::read).is_group("branches/late"));
  EXPECT_TRUE(leftovers(out).empty()) << leftovers(out).front();

  if (tmpfs) {
    ASSERT_TRUE(fs->remount(64 << 20));
  }
  const Proc r = run_mxlab(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const h5::H5File f(file, h5::H5File::Mode::read);
  EXPECT_TRUE(f.is_group("branches/late"));
}

// `mxlab export` on a full disk: exit 74 and no CSV at all (not a partial set).
TEST_P(DiskFull, DuringExportNoCsvIsLeft) {
  const std::string out = make_temp_dir("export") + "/disk";
  SmallDisk d = small_disk(out, GetParam() == Disk::tmpfs ? (12 << 10) : (6 << 10), ".csv");
  const Proc p = run_mxlab({"export", ref_file_, "--csv", out}, {}, SIGKILL, d.env);
  expect_clean_failure(p, kExitIo, "no space left on device");
  EXPECT_TRUE(std::filesystem::is_empty(out)) << std::filesystem::directory_iterator(out)->path();
}

// `mxlab quantize` on a full disk: exit 74 and no output .npy (nor its temp file).
TEST_P(DiskFull, DuringQuantizeNoNpyIsLeft) {
  const std::string in = make_temp_dir("npy") + "/in.npy";
  std::vector<float> x(64 * 1024);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.25f - 12.0f;
  write_npy(in, {64, 1024}, x.data());
  const std::string out = make_temp_dir("quantize") + "/disk";
  SmallDisk d = small_disk(out, GetParam() == Disk::tmpfs ? (12 << 10) : (6 << 10), ".npy");
  const Proc p = run_mxlab({"quantize", "--format", "mxfp8_e4m3", "--in", in, "--out", out + "/q.npy"}, {}, SIGKILL, d.env);
  expect_clean_failure(p, kExitIo, "cannot write " + out + "/q.npy: no space left on device");
  EXPECT_TRUE(std::filesystem::is_empty(out)) << std::filesystem::directory_iterator(out)->path();
}

// index.csv cannot be written (at the end of `mxlab summarize`): a one-line warning naming the
// file and the cause, the summary is still printed, no temp file is left.
TEST_P(DiskFull, IndexCsvWarnsAndLeavesNoTempFile) {
  const std::string out = make_temp_dir("index") + "/disk";
  SmallDisk d = small_disk(out, 3 * file_bytes_ + 2 * ckpt_bytes_ + (64 << 10), "index.csv");
  ASSERT_EQ(run_mxlab({"run", yaml_, "--out", out}, {}, SIGKILL, d.env).exit_code, 0);
  std::filesystem::remove(out + "/index.csv");
  if (GetParam() == Disk::tmpfs) {  // fill what is left
    std::FILE* f = std::fopen((out + "/filler").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string block(4096, 'x');
    while (std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
    }
    std::fclose(f);
  } else {
    d.env = shim_env(out, "index.csv", 0);
  }
  const Proc p = run_mxlab({"summarize", out}, {}, SIGKILL, d.env);
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "could not rebuild " + out + "/index.csv")) << p.output;
  EXPECT_TRUE(contains(p.output, "no space left on device")) << p.output;
  EXPECT_TRUE(contains(p.output, "complete")) << p.output;
  EXPECT_FALSE(contains(p.output, "HDF5-DIAG")) << p.output;
  EXPECT_FALSE(file_exists(out + "/index.csv"));
  EXPECT_TRUE(leftovers(out).empty()) << leftovers(out).front();
}

INSTANTIATE_TEST_SUITE_P(Disks, DiskFull, ::testing::Values(Disk::tmpfs, Disk::shim), disk_name);

// A read-only output directory: every writer says so in one line and exits 74 without touching
// anything. A read-only tmpfs where one can be mounted; else, for a non-root user, a directory
// without write permission (root ignores permission bits, so then the test is skipped).
class ReadOnlyDir : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = make_temp_dir("ro");
    yaml_ = base_ + "/exp.yaml";
    write_bytes(yaml_, kExperiment);
    ro_ = base_ + "/ro";
    fs_ = std::make_unique<Tmpfs>(ro_, 64 << 20);
    // A finished run inside the directory, for branch and summarize; then make it read-only.
    ASSERT_EQ(run_mxlab({"run", yaml_, "--out", ro_ + "/runs"}).exit_code, 0);
    if (fs_->mounted) {
      ASSERT_TRUE(fs_->remount(64 << 20, true));
    } else if (::geteuid() != 0) {
      ::chmod((ro_ + "/runs").c_str(), 0555);
      ::chmod(ro_.c_str(), 0555);
    } else {
      GTEST_SKIP() << "root without CAP_SYS_ADMIN: no way to make a directory read-only here";
    }
    cause_ = fs_->mounted ? "read-only file system" : "permission denied";
  }
  void TearDown() override {
    if (!fs_->mounted) {
      ::chmod(ro_.c_str(), 0755);
      ::chmod((ro_ + "/runs").c_str(), 0755);
    }
  }
  std::string base_, yaml_, ro_, cause_;
  std::unique_ptr<Tmpfs> fs_;
};

TEST_F(ReadOnlyDir, EveryWriterSaysSoAndExits74) {
  const std::string file = run_file_in(ro_ + "/runs");
  ASSERT_FALSE(file.empty());
  const std::string before = slurp(file);

  Proc p = run_mxlab({"run", yaml_, "--out", ro_ + "/new"});
  expect_clean_failure(p, kExitIo, "cannot create directory " + ro_ + "/new: " + cause_);
  EXPECT_EQ(count_of(p.output, "\n"), 1) << p.output;

  p = run_mxlab({"run", yaml_, "--out", ro_ + "/runs", "--steps", "80"});
  expect_clean_failure(p, kExitIo, "cannot write in directory " + ro_ + "/runs: " + cause_);
  EXPECT_EQ(count_of(p.output, "\n"), 1) << p.output;

  p = run_mxlab({"export", file, "--csv", ro_ + "/csv"});
  expect_clean_failure(p, kExitIo, cause_);

  p = run_mxlab({"branch", file, "--at", "40", "--apply", "to_fp32", "--name", "late"});
  expect_clean_failure(p, kExitIo, cause_);
  EXPECT_TRUE(slurp(file) == before);

  const std::string in = base_ + "/in.npy";
  const std::vector<float> x(64, 1.5f);
  write_npy(in, {2, 32}, x.data());
  p = run_mxlab({"quantize", "--format", "mxfp4_e2m1", "--in", in, "--out", ro_ + "/q.npy"});
  expect_clean_failure(p, kExitIo, "cannot write " + ro_ + "/q.npy: " + cause_);

  p = run_mxlab({"summarize", ro_ + "/runs"});
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "could not rebuild " + ro_ + "/runs/index.csv")) << p.output;
  EXPECT_TRUE(contains(p.output, cause_)) << p.output;
}

}  // namespace
