// Fuzzing the readers of run files with damaged files: bytes of a real run file (a small MXFP4
// run with checkpoints, a parameter snapshot and an intervention branch) set to random values,
// mostly in its first 8 KB (superblock, root object header, B-trees, local and global heaps:
// HDF5's metadata), the rest anywhere in the file. Each mutant goes through `mxlab export --csv`
// and `summarize`, and by turns `eval --snapshot`, `export --snapshot --npy`, `branch` and
// `run --dry-run`; every 20th also through `mxlab run` of its experiment over it.
//
// What must hold: every process exits (no signal, no hang) with 0 or 2; an error is one line
// "mxlab: error: ..." with nothing on stdout and nothing left in the export folders. Across
// commands: `summarize` lists the file either as unreadable (with the reason) or whole, and
// `export` succeeds exactly when summarize does not call it unreadable, writing then one CSV
// per trajectory and branch that summarize lists (fp32 first of all) and a summary.csv with a
// row for each. `run` exits 0 and leaves a complete, readable file; when it found the file
// unreadable it says that it starts the run again from step 0.
//
// Deterministic: mutant i of shard k uses seed MXLAB_FUZZ_SEED + 2 i + k (default base 1), and
// what is done to it depends on the seed alone. A failure prints the seed and the command and
// keeps the mutant on disk; reproduce with
//   MXLAB_FUZZ_SEED=<seed> MXLAB_FUZZ_COUNT=1 build/mxlab_tests --gtest_filter='Shards/FuzzRunFile.*/0'
// MXLAB_FUZZ_COUNT=N mutants per shard (default kDefaultMutants).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lab/core/error.h"
#include "tests/cpu/run_binary_util.h"

namespace fs = std::filesystem;
using namespace mxlab;
using testutil::contains;

namespace {

constexpr int kDefaultMutants = 120;  // per shard; 2 shards
constexpr int kShards = 2;
constexpr int kRunEvery = 20;         // mutants that also go through `mxlab run`
constexpr double kTimeoutS = 60.0;    // a process running longer counts as a hang
constexpr int kMaxReported = 5;
constexpr size_t kMetadataBytes = 8192;

constexpr const char* kExperiment = R"(name: fuzz_source
seed: 1
steps: 60
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 64}
optimizer: {lr: 2.0e-3}
precision: {weight: mxfp4_e2m1, activation: mxfp4_e2m1, grad: mxfp4_e2m1}
checkpoint_every: 20
log: {log_every: 10, snapshot_steps: [60], progress: false}
interventions:
  - {name: late_fp32, at: 40, apply: to_fp32}
)";
constexpr int kSnapshotStep = 60;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

struct Result {
  int exit_code = -1;
  int term_signal = 0;
  bool timed_out = false;
  std::string out, err;
};

// Runs MXLAB_BINARY with `args`, stdout and stderr into files of `dir`, killed after kTimeoutS.
Result run(const std::vector<std::string>& args, const std::string& dir) {
  const std::string out_path = dir + "/.stdout", err_path = dir + "/.stderr";
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("fuzz: fork failed");
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) std::_Exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX"})
      ::unsetenv(v);
    std::vector<std::string> copy = args;
    std::string bin = MXLAB_BINARY;
    std::vector<char*> argv = {bin.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0) throw Error("fuzz: waitpid failed");
    if (!r.timed_out && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > kTimeoutS) {
      ::kill(pid, SIGKILL);
      r.timed_out = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  r.out = testutil::slurp(out_path);
  r.err = testutil::slurp(err_path);
  fs::remove(out_path);
  fs::remove(err_path);
  return r;
}

std::string joined(const std::vector<std::string>& args) {
  std::string s = "mxlab";
  for (const auto& a : args) s += " " + a;
  return s;
}

// Files below `dir` (recursive), as paths relative to it.
std::vector<std::string> files_below(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (!e.is_directory()) out.push_back(fs::relative(e.path(), dir).string());
  return out;
}

// What is wrong with a reader's result ("" if nothing): a signal, a hang, an exit other than 0
// or 2, or an error that is not one line or leaves files in `export_dirs`.
std::string judge(const Result& r, const std::vector<std::string>& export_dirs) {
  if (r.timed_out) return "did not finish in time";
  if (r.term_signal != 0) return "killed by signal " + std::to_string(r.term_signal);
  if (r.exit_code != 0 && r.exit_code != 2) return "exit code " + std::to_string(r.exit_code);
  if (r.exit_code == 0) return contains(r.err, "mxlab: error") ? "exit 0 with an error message" : "";
  if (testutil::count_of(r.err, "\n") != 1 || r.err.rfind("mxlab: error: ", 0) != 0)
    return "the error is not one line 'mxlab: error: ...'";
  if (!r.out.empty()) return "an error, and something on stdout";
  for (const std::string& d : export_dirs)
    for (const std::string& f : files_below(d)) return "an error, and " + d + "/" + f + " was left behind";
  return "";
}

// RFC 4180 CSV (quoted fields may hold commas, quotes and newlines).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    any = true;
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      row.push_back(field);
      field.clear();
    } else if (c == '\n') {
      row.push_back(field);
      field.clear();
      rows.push_back(row);
      row.clear();
      any = false;
    } else if (c != '\r') {
      field += c;
    }
  }
  if (any) {
    row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

// `summarize --csv` of a directory with one run file: its status, error and groups.
struct Listed {
  std::string run_id, status, error;
  std::vector<std::pair<std::string, bool>> groups;  // name, is a branch
};

bool parse_summary(const std::string& csv, Listed* l, std::string* why) {
  const auto rows = parse_csv(csv);
  if (rows.size() < 2) {
    *why = "summarize --csv printed no row";
    return false;
  }
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < rows[0].size(); ++i) col[rows[0][i]] = i;
  for (const char* c : {"run_id", "group", "at", "status", "error"})
    if (!col.count(c)) {
      *why = std::string("summarize --csv has no column ") + c;
      return false;
    }
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r.size() != rows[0].size()) {
      *why = "summarize --csv: a row of " + std::to_string(r.size()) + " fields under a header of " +
             std::to_string(rows[0].size());
      return false;
    }
    l->run_id = r[col["run_id"]];
    l->status = r[col["status"]];
    l->error = r[col["error"]];
    if (l->status != "unreadable") l->groups.push_back({r[col["group"]], !r[col["at"]].empty()});
  }
  return true;
}

// The CSVs an export of a whole record writes (csv_export.h): one table per group, its
// loss_all, and the summary with one row per group.
std::string check_export(const std::string& dir, const Listed& l) {
  std::set<std::string> have;
  for (const std::string& f : files_below(dir)) have.insert(f);
  if (l.groups.empty() || l.groups.front().first != "fp32") return "summarize lists no fp32 trajectory first";
  // File names are made of the text read in the file with anything but letters, digits, '-', '_'
  // and '.' (and a leading '.') as '_': a damaged run id may hold control characters.
  auto file_part = [](std::string t) {
    for (char& c : t)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
    if (!t.empty() && t[0] == '.') t[0] = '_';
    return t;
  };
  const std::string id = file_part(l.run_id);
  for (const auto& [name, branch] : l.groups) {
    const std::string table = id + "_" + file_part(branch ? "branch-" + name : name) + ".csv";
    if (!have.count(table)) return "export wrote no " + table;
  }
  const std::string summary = dir + "/" + id + "_summary.csv";
  if (!have.count(id + "_summary.csv")) return "export wrote no summary.csv";
  const size_t rows = parse_csv(testutil::slurp(summary)).size();
  if (rows != l.groups.size() + 1)
    return "summary.csv has " + std::to_string(rows - 1) + " rows for " + std::to_string(l.groups.size()) + " groups";
  return "";
}

class FuzzRunFile : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    root_ = testutil::make_temp_dir("src");
    yaml_ = root_ + "/exp.yaml";
    testutil::write_bytes(yaml_, kExperiment);
    const testutil::Proc p = testutil::run_mxlab({"run", yaml_, "--out", root_ + "/out", "--quiet"});
    ASSERT_EQ(p.exit_code, 0) << p.output;
    source_ = testutil::run_file_in(root_ + "/out");
    ASSERT_FALSE(source_.empty()) << p.output;
    for (const auto& e : fs::directory_iterator(root_ + "/out"))
      if (e.path().extension() == ".ckpt") checkpoints_.push_back(e.path().string());
    ASSERT_FALSE(checkpoints_.empty());
  }
  static std::string root_, yaml_, source_;
  static std::vector<std::string> checkpoints_;
};

std::string FuzzRunFile::root_, FuzzRunFile::yaml_, FuzzRunFile::source_;
std::vector<std::string> FuzzRunFile::checkpoints_;

TEST_P(FuzzRunFile, DamagedRunFilesGiveResultsOrOneLineErrors) {
  const int shard = GetParam();
  const int base = env_int("MXLAB_FUZZ_SEED", 1);
  const int count = env_int("MXLAB_FUZZ_COUNT", kDefaultMutants);
  const std::string original = testutil::slurp(source_);
  ASSERT_GT(original.size(), kMetadataBytes);
  const std::string name = fs::path(source_).filename().string();
  int failures = 0, unreadable = 0, readable = 0, commands = 0;
  std::map<std::string, int> exits;
  for (int i = 0; i < count; ++i) {
    const int seed = base + kShards * i + shard;
    std::mt19937_64 g(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull);
    auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(g); };
    std::string bytes = original;
    const size_t region = seed % 3 != 0 ? kMetadataBytes : bytes.size();
    const size_t flips = std::vector<size_t>{1, 2, 4, 8, 20}[pick(5)];
    for (size_t k = 0; k < flips; ++k) bytes[pick(region)] ^= static_cast<char>(1 + pick(255));
    const std::string dir = testutil::make_temp_dir("mutant_" + std::to_string(seed));
    const std::string file = dir + "/" + name;
    testutil::write_bytes(file, bytes);

    std::vector<std::string> problems;
    auto check = [&](const std::vector<std::string>& args, const std::vector<std::string>& export_dirs) {
      const Result r = run(args, dir);
      ++commands;
      ++exits[args[0] + " " + std::to_string(r.exit_code)];
      const std::string why = judge(r, export_dirs);
      if (!why.empty()) problems.push_back(joined(args) + ": " + why + "\nstderr: " + r.err + "stdout: " + r.out.substr(0, 300));
      return r;
    };
    const Result listed = check({"summarize", dir, "--csv", "--no-index"}, {});
    Listed l;
    std::string why;
    if (listed.exit_code == 0 && !parse_summary(listed.out, &l, &why)) problems.push_back("summarize: " + why);
    const bool whole = listed.exit_code == 0 && why.empty() && l.status != "unreadable";
    if (listed.exit_code == 0 && l.status == "unreadable" && l.error.empty())
      problems.push_back("summarize lists the file as unreadable without a reason");
    (whole ? readable : unreadable) += 1;

    const std::string csv = dir + "/csv";
    const Result ex = check({"export", file, "--csv", csv}, {csv});
    // Where HDF5 corrupts its heap without crashing at once, whether the abort comes (and the
    // file counts as damaged) depends on the heap's layout, which differs between commands:
    // those verdicts may disagree.
    const bool heap_luck = contains(l.error, "library crashes") || contains(ex.err, "library crashes");
    if (ex.exit_code == 0 && !whole && !heap_luck)
      problems.push_back("export succeeded on a file summarize calls unreadable: " + l.error);
    if (ex.exit_code == 2 && whole && !heap_luck) problems.push_back("export failed on a file summarize lists whole: " + ex.err);
    if (ex.exit_code == 0 && whole) {
      const std::string missing = check_export(csv, l);
      if (!missing.empty()) problems.push_back("export exited 0 but " + missing);
    }
    switch (seed % 4) {
      case 0: check({"eval", file, "--snapshot", std::to_string(kSnapshotStep)}, {}); break;
      case 1: {
        const std::string npy = dir + "/npy";
        check({"export", file, "--snapshot", std::to_string(kSnapshotStep), "--npy", npy}, {npy});
        break;
      }
      case 2: {
        for (const std::string& c : checkpoints_) fs::copy_file(c, dir + "/" + fs::path(c).filename().string());
        check({"branch", file, "--at", "30", "--apply", "to_fp32", "--name", "fuzz"}, {});
        break;
      }
      default: {
        const Result r = check({"run", yaml_, "--out", dir, "--dry-run"}, {});  // reads the file's state
        if (r.exit_code != 0) problems.push_back("run --dry-run failed");
        break;
      }
    }
    if (seed % (2 * kRunEvery) >= 2 * kRunEvery - 2) {  // one seed in kRunEvery, in either shard
      const Result r = check({"run", yaml_, "--out", dir, "--quiet"}, {});
      const bool restarted = contains(r.err, "starting the run again from step 0");
      if (r.exit_code != 0) problems.push_back("run did not finish the run over the mutant");
      if (!whole && !restarted && !heap_luck)
        problems.push_back("run found an unreadable file and did not say it starts again");
      const Result after = run({"summarize", dir, "--csv", "--no-index"}, dir);
      Listed l2;
      std::string why2;
      if (after.exit_code != 0 || !parse_summary(after.out, &l2, &why2) || l2.status != "complete")
        problems.push_back("after run the file is not a complete run: " + after.out.substr(0, 300) + why2);
    }
    if (!problems.empty()) {
      if (failures++ < kMaxReported) {
        std::string text;
        for (const std::string& p : problems) text += "\n  " + p;
        ADD_FAILURE() << "seed " << seed << " (" << flips << " bytes in the first " << region << "):" << text
                      << "\nthe mutant is kept at " << file << "\nreproduce: MXLAB_FUZZ_SEED=" << seed
                      << " MXLAB_FUZZ_COUNT=1 build/mxlab_tests --gtest_filter='Shards/FuzzRunFile.*/0'";
      }
    } else {
      fs::remove_all(dir);
    }
  }
  std::string tally;
  for (const auto& [k, n] : exits) tally += " " + k + ":" + std::to_string(n);
  std::printf("[fuzz] shard %d: %d damaged run files (seeds from %d, step %d), %d commands: %d read whole, %d "
              "unreadable, %d failures; exits%s\n",
              shard, count, base + shard, kShards, commands, readable, unreadable, failures, tally.c_str());
  EXPECT_EQ(failures, 0);
  // Both kinds must occur, or the mutations miss either the metadata or the readers' checks.
  EXPECT_GT(readable, 0);
  EXPECT_GT(unreadable, 0);
}

INSTANTIATE_TEST_SUITE_P(Shards, FuzzRunFile, ::testing::Range(0, kShards));

}  // namespace
