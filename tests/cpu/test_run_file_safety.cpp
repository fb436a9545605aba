// Run files and the files beside them, through the real `mxlab` binary:
//  - nothing is written through a symbolic link planted in an output folder (a run file that is
//    a link is refused with exit 74 and one line; temp, snapshot, checkpoint, index and export
//    names that are links are replaced, never followed; an export subfolder that is a link is
//    refused);
//  - a run file whose metadata is damaged where HDF5 itself crashes or corrupts its heap (a
//    global-heap entry whose length runs past its collection) is one line and exit 2 for every
//    reader, never a signal;
//  - a file that HDF5 reads but that is not a whole run record (a trajectory renamed, summary
//    attributes gone) is `unreadable` with the reason, and export fails without output;
//  - a trajectory stopped on a non-finite loss records exactly the steps it ran.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lab/core/exit_codes.h"
#include "lab/io/h5file.h"
#include "tests/cpu/run_binary_util.h"

namespace fs = std::filesystem;
using namespace mxlab;
using namespace mxlab::testutil;

namespace {

// The reproducer of the defect reports, shortened to 60 steps: depth 2, width 32, batch 64,
// MXFP4 operands, checkpoints every 20 steps; a snapshot at the end for eval and --npy.
constexpr const char* kExperiment = R"(name: safety
seed: 1
steps: 60
device: cpu
model: {depth: 2, width: 32, hidden_mult: 4}
data: {batch: 64}
optimizer: {lr: 2.0e-3}
precision: {weight: mxfp4_e2m1, activation: mxfp4_e2m1, grad: mxfp4_e2m1}
checkpoint_every: 20
log: {log_every: 10, snapshot_steps: [60], progress: false}
)";

bool is_link(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

bool is_regular(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void make_link(const std::string& target, const std::string& at) {
  ASSERT_EQ(::symlink(target.c_str(), at.c_str()), 0) << at << " -> " << target;
}

// One line "mxlab: error: ..." and nothing else.
void expect_one_error_line(const Proc& p) {
  EXPECT_EQ(count_of(p.output, "\n"), 1) << p.output;
  EXPECT_EQ(p.output.rfind("mxlab: error: ", 0), 0u) << p.output;
}

class RunFileSafety : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("ref");
    yaml_ = dir_ + "/exp.yaml";
    write_bytes(yaml_, kExperiment);
    ASSERT_NO_FATAL_FAILURE(train_cpu(yaml_, dir_ + "/out", &ref_file_));
    name_ = fs::path(ref_file_).filename().string();
    run_id_ = name_.substr(0, name_.size() - 3);
  }
  // A copy of the finished run (file and checkpoints) in a fresh folder; returns the folder.
  static std::string copy_run(const std::string& tag) {
    const std::string d = make_temp_dir(tag);
    for (const auto& e : fs::directory_iterator(dir_ + "/out")) {
      const std::string n = e.path().filename().string();
      if (n == name_ || e.path().extension() == ".ckpt") fs::copy_file(e.path(), d + "/" + n);
    }
    return d;
  }
  static std::string dir_, yaml_, ref_file_, name_, run_id_;
};

std::string RunFileSafety::dir_, RunFileSafety::yaml_, RunFileSafety::ref_file_, RunFileSafety::name_,
    RunFileSafety::run_id_;

// ---- writes outside the output folder ---------------------------------------------------------

TEST_F(RunFileSafety, RunFileThatIsALinkIsRefusedWithExit74) {
  const std::string elsewhere = make_temp_dir("elsewhere");
  const std::string precious = elsewhere + "/precious.h5";
  write_bytes(precious, "precious bytes");
  const std::string dangling = elsewhere + "/not_yet.h5";
  for (const std::string& target : {precious, dangling}) {
    SCOPED_TRACE(target);
    const std::string out = make_temp_dir("out");
    make_link(target, out + "/" + name_);
    const Proc p = run_mxlab({"run", yaml_, "--out", out, "--quiet"});
    EXPECT_EQ(p.exit_code, kExitIo) << p.output;
    expect_one_error_line(p);
    EXPECT_TRUE(contains(p.output, "symbolic link")) << p.output;
    EXPECT_TRUE(is_link(out + "/" + name_));
  }
  EXPECT_EQ(slurp(precious), "precious bytes");
  EXPECT_FALSE(file_exists(dangling));
}

// A link to an unfinished run elsewhere: resuming it, or adding a branch through the link, would
// write into the other folder's file.
TEST_F(RunFileSafety, ResumeAndBranchThroughALinkAreRefused) {
  const std::string other = copy_run("other");
  const std::string target = other + "/" + name_;
  {
    h5::H5File f(target, h5::H5File::Mode::append);
    f.set_attr("/", "status", "running");
  }
  const std::string before = slurp(target);
  const std::string out = copy_run("out");
  fs::remove(out + "/" + name_);
  make_link(target, out + "/" + name_);
  const Proc run = run_mxlab({"run", yaml_, "--out", out, "--quiet"});
  EXPECT_EQ(run.exit_code, kExitIo) << run.output;
  expect_one_error_line(run);
  EXPECT_TRUE(slurp(target) == before) << "the linked file was written";
  // A branch added to a finished run through a link (its checkpoints beside the link).
  const std::string finished = copy_run("finished") + "/" + name_;
  const std::string finished_before = slurp(finished);
  const std::string out2 = copy_run("out2");
  fs::remove(out2 + "/" + name_);
  make_link(finished, out2 + "/" + name_);
  const Proc branch = run_mxlab({"branch", out2 + "/" + name_, "--at", "30", "--apply", "to_fp32", "--name", "b"});
  EXPECT_EQ(branch.exit_code, kExitIo) << branch.output;
  expect_one_error_line(branch);
  EXPECT_TRUE(contains(branch.output, "symbolic link")) << branch.output;
  EXPECT_TRUE(slurp(finished) == finished_before) << "the linked file was written";
}

// Every other file a run writes in its folder: the snapshot and its temp file, a checkpoint's
// temp file, the index. Links at those names are replaced by the files, never followed.
TEST_F(RunFileSafety, LinksAtTheNamesOfFilesBesideTheRunAreNotFollowed) {
  const std::string elsewhere = make_temp_dir("elsewhere");
  const std::string out = make_temp_dir("out");
  const std::vector<std::string> names = {name_ + ".snapshot", name_ + ".snapshot.tmp", run_id_ + ".step20.ckpt.tmp",
                                          run_id_ + ".step40.ckpt", "index.csv"};
  for (size_t i = 0; i < names.size(); ++i) {
    write_bytes(elsewhere + "/t" + std::to_string(i), "untouched");
    make_link(elsewhere + "/t" + std::to_string(i), out + "/" + names[i]);
  }
  // Every checkpoint kept, so that the one at step 40 is still there to look at.
  const Proc p = run_mxlab({"run", yaml_, "--out", out, "--quiet", "--keep-checkpoints", "all"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_EQ(slurp(elsewhere + "/t" + std::to_string(i)), "untouched") << names[i] << " was written through";
  for (const std::string& n : {name_, run_id_ + ".step40.ckpt", std::string("index.csv")})
    EXPECT_TRUE(is_regular(out + "/" + n)) << n;
  // The snapshot (a file that replaced the link) was removed when the run finished.
  EXPECT_FALSE(file_exists(out + "/" + name_ + ".snapshot"));
  expect_same_run_files(ref_file_, out + "/" + name_);
}

TEST_F(RunFileSafety, ExportWritesNothingThroughLinks) {
  const std::string elsewhere = make_temp_dir("elsewhere");
  const std::string csv = make_temp_dir("csv");
  write_bytes(elsewhere + "/table", "untouched");
  make_link(elsewhere + "/table", csv + "/" + run_id_ + "_fp32.csv");
  const Proc e = run_mxlab({"export", ref_file_, "--csv", csv});
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_EQ(slurp(elsewhere + "/table"), "untouched");
  EXPECT_TRUE(is_regular(csv + "/" + run_id_ + "_fp32.csv"));
  // A subfolder of the .npy export that is a link: refused, nothing written there or beside.
  const std::string npy = make_temp_dir("npy");
  const std::string outside = make_temp_dir("outside");
  make_link(outside, npy + "/fp32");
  const Proc n = run_mxlab({"export", ref_file_, "--snapshot", "60", "--npy", npy});
  EXPECT_EQ(n.exit_code, kExitIo) << n.output;
  expect_one_error_line(n);
  EXPECT_TRUE(fs::is_empty(outside)) << "files were written into the linked folder";
  for (const auto& entry : fs::directory_iterator(npy))
    EXPECT_EQ(entry.path().filename().string(), "fp32") << "left behind: " << entry.path();
}

// ---- damaged files ----------------------------------------------------------------------------

// The entries of the first global heap collection ("GCOL": variable-length strings such as
// config_yaml and status live there): offsets of their 8-byte size fields.
std::vector<size_t> global_heap_size_fields(const std::string& b) {
  std::vector<size_t> out;
  const size_t at = b.find("GCOL");
  if (at == std::string::npos || at + 16 > b.size()) return out;
  uint64_t collection = 0;
  std::memcpy(&collection, b.data() + at + 8, 8);
  size_t p = at + 16;
  while (p + 16 <= b.size() && p + 16 <= at + collection) {
    uint16_t index = 0;
    uint64_t size = 0;
    std::memcpy(&index, b.data() + p, 2);
    std::memcpy(&size, b.data() + p + 8, 8);
    if (index == 0) break;  // the free space
    out.push_back(p + 8);
    p += 16 + (size + 7) / 8 * 8;
  }
  return out;
}

// A string's heap entry whose length runs far past its collection: HDF5 1.10 reads past its
// buffer (SIGSEGV). Every reader says in one line that the file is damaged. By a little (4 KB):
// HDF5 copies past its buffer and may corrupt its heap (later SIGABRT in free(), or silence,
// depending on the heap's layout): no reader may die of it, whatever it concludes.
TEST_F(RunFileSafety, HeapEntryRunningPastItsCollectionIsAnErrorNotACrash) {
  const std::string original = slurp(ref_file_);
  const std::vector<size_t> fields = global_heap_size_fields(original);
  ASSERT_GE(fields.size(), 3u) << "no global heap collection found";
  int cases = 0;
  for (size_t k = 0; k < 3; ++k) {
    for (const uint64_t grow : {uint64_t{1} << 40, uint64_t{4096}}) {
      const bool far = grow > (uint64_t{1} << 32);
      SCOPED_TRACE("entry " + std::to_string(k) + " grown by " + std::to_string(grow));
      std::string b = original;
      uint64_t size = 0;
      std::memcpy(&size, b.data() + fields[k], 8);
      size += grow;
      std::memcpy(&b[fields[k]], &size, 8);
      const std::string d = copy_run("heap");
      const std::string file = d + "/" + name_;
      write_bytes(file, b);
      const std::string csv = d + "/csv", npy = d + "/npy";
      for (const std::vector<std::string>& args :
           {std::vector<std::string>{"export", file, "--csv", csv}, {"export", file, "--snapshot", "60", "--npy", npy},
            {"eval", file, "--snapshot", "60"}, {"branch", file, "--at", "30", "--apply", "to_fp32", "--name", "b"}}) {
        const Proc p = run_mxlab(args);
        EXPECT_EQ(p.term_signal, 0) << args[0] << ": " << p.output;
        if (far || p.exit_code != 0) {
          EXPECT_EQ(p.exit_code, kExitBadInput) << args[0] << ": " << p.output;
          expect_one_error_line(p);
        }
      }
      const Proc s = run_mxlab({"summarize", d, "--csv", "--no-index"});
      EXPECT_EQ(s.term_signal, 0) << s.output;
      EXPECT_EQ(s.exit_code, 0) << s.output;
      if (far) {
        EXPECT_TRUE(!file_exists(csv) || fs::is_empty(csv));
        EXPECT_TRUE(!file_exists(npy) || fs::is_empty(npy));
        EXPECT_TRUE(contains(s.output, ",unreadable,")) << s.output;
        EXPECT_TRUE(contains(s.output, "is damaged")) << s.output;
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 6);
}

// Replaces the name `from` by `to` (same length) at its first occurrence at or after `at`.
void rename_bytes(std::string& b, const std::string& from, const std::string& to, size_t at = 0) {
  const size_t p = b.find(from, at);
  ASSERT_NE(p, std::string::npos) << from;
  b.replace(p, to.size(), to);
}

// The name of the link to trajectories/fp32 in its group's local heap ("HEAP", names 8-byte
// aligned in its data segment): renamed, HDF5 reads the file fine, without fp32.
void rename_fp32_link(std::string& b) {
  for (size_t h = b.find("HEAP"); h != std::string::npos; h = b.find("HEAP", h + 1)) {
    if (h + 32 > b.size()) break;
    uint64_t size = 0, addr = 0;
    std::memcpy(&size, b.data() + h + 8, 8);
    std::memcpy(&addr, b.data() + h + 24, 8);
    if (addr >= b.size() || size > b.size() - addr) continue;
    for (size_t p = addr; p + 5 <= addr + size; p += 8)
      if (b.compare(p, 5, std::string("fp32\0", 5)) == 0) {
        b[p + 1] = 'q';
        return;
      }
  }
  FAIL() << "no link named fp32 in a local heap";
}

TEST_F(RunFileSafety, FileThatIsNotAWholeRecordIsUnreadableAndExportFails) {
  const std::string original = slurp(ref_file_);
  for (int k = 0; k < 2; ++k) {
    std::string b = original;
    std::string reason;
    if (k == 0) {
      ASSERT_NO_FATAL_FAILURE(rename_fp32_link(b));
      reason = "trajectories/fp32";
    } else {
      ASSERT_NO_FATAL_FAILURE(rename_bytes(b, std::string("steps_run\0", 10), std::string("steps_rux\0", 10)));
      reason = "summary attributes";
    }
    SCOPED_TRACE(reason);
    const std::string d = copy_run("partial");
    const std::string file = d + "/" + name_;
    write_bytes(file, b);
    const Proc s = run_mxlab({"summarize", d, "--csv", "--no-index"});
    ASSERT_EQ(s.exit_code, 0) << s.output;
    EXPECT_TRUE(contains(s.output, ",unreadable,")) << s.output;
    EXPECT_FALSE(contains(s.output, ",complete,")) << s.output;
    EXPECT_TRUE(contains(s.output, reason)) << s.output;
    const Proc t = run_mxlab({"summarize", d, "--no-index"});
    EXPECT_TRUE(contains(t.output, "unreadable")) << t.output;
    const std::string csv = d + "/csv";
    const Proc e = run_mxlab({"export", file, "--csv", csv});
    EXPECT_EQ(e.exit_code, kExitBadInput) << e.output;
    expect_one_error_line(e);
    EXPECT_TRUE(contains(e.output, reason)) << e.output;
    EXPECT_TRUE(!file_exists(csv) || fs::is_empty(csv)) << "partial output in " << csv;
    // `run` does not skip it as finished: it opens, but it is not a result. The run resumes from
    // its checkpoint (or starts again, and says so) to a whole record.
    fs::remove_all(csv);
    const Proc r = run_mxlab({"run", yaml_, "--out", d, "--quiet"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_FALSE(contains(r.output, "skipped")) << r.output;
    const Proc after = run_mxlab({"summarize", d, "--csv", "--no-index"});
    EXPECT_FALSE(contains(after.output, "unreadable")) << after.output;
    EXPECT_TRUE(contains(after.output, ",complete,")) << after.output;
  }
}

// ---- consistent records -----------------------------------------------------------------------

// SGD at lr 1e4: the loss is non-finite from step 2, noticed at the next log step. Every series
// of a stopped trajectory ends at the steps it ran: loss_all has steps_run entries, no row of
// any series lies beyond them, and export lists no later step.
TEST_F(RunFileSafety, StoppedTrajectoryRecordsOnlyTheStepsItRan) {
  const std::string out = make_temp_dir("sgd");
  const Proc p = run_mxlab({"run", yaml_, "--out", out, "--quiet", "--set", "optimizer.name=sgd", "--set",
                            "optimizer.lr=1e4"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const std::string file = run_file_in(out);
  ASSERT_FALSE(file.empty());
  const std::string csv = out + "/csv";
  const Proc e = run_mxlab({"export", file, "--csv", csv});
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const h5::H5File f(file, h5::H5File::Mode::read);
  EXPECT_EQ(f.get_attr_string("/", "status"), "diverged");
  for (const std::string& t : f.list_groups("trajectories")) {
    SCOPED_TRACE(t);
    const std::string g = "trajectories/" + t;
    EXPECT_EQ(f.get_attr_string(g, "state"), "stopped_nonfinite");
    const int64_t ran = f.get_attr_int64(g, "steps_run");
    const int64_t first_bad = f.get_attr_int64(g, "first_nonfinite_step");
    EXPECT_EQ(ran, first_bad + 1);
    EXPECT_EQ(static_cast<int64_t>(f.dataset_shape(g + "/loss_all")[0]), ran);
    for (const std::string& d : f.list_datasets(g)) {
      if (d != "step" && (d.size() < 5 || d.compare(d.size() - 5, 5, "_step") != 0)) continue;
      for (int64_t s : f.read_int64s(g + "/" + d)) EXPECT_LT(s, ran) << d;
    }
    const std::string id = fs::path(file).stem().string();
    const std::string all = slurp(csv + "/" + id + "_" + t + "_loss_all.csv");
    EXPECT_EQ(count_of(all, "\n"), ran + 1) << all;  // the header and one line per step run
    // The logged rows: the step in the first column.
    const std::string table = slurp(csv + "/" + id + "_" + t + ".csv");
    ASSERT_FALSE(table.empty());
    for (size_t at = table.find('\n'); at != std::string::npos && at + 1 < table.size(); at = table.find('\n', at + 1))
      EXPECT_LT(std::atoll(table.c_str() + at + 1), ran) << table;
  }
}

}  // namespace
