// Trajectory names (lab/config/names.h) and where they lead: the one check every name passes
// (arms, interventions and their `from`, `mxlab branch --name/--from`), the reserved names
// `fp32` and `mx`, a branch that forks from its arm whatever it is called (the fork source is
// the arm's index, checkpoints are matched by group), export paths that stay inside their
// folder whatever a file holds, `summarize --by arm --branches` pooling by kind, and the capture
// keys of unlogged steps (lab/train/capture_key.h), which must tell every trajectory apart.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/train/capture_key.h"
#include "lab/runs/checkpoint.h"
#include "lab/config/config_io.h"
#include "lab/report/group_stats.h"
#include "lab/runs/index.h"
#include "lab/config/names.h"
#include "lab/report/run_events.h"
#include "lab/runs/run_records.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;
using mxlab::test::TempDir;
using mxlab::testutil::contains;
using mxlab::testutil::Proc;
using mxlab::testutil::run_mxlab;

namespace fs = std::filesystem;

namespace {

std::string config_error(const std::string& yaml) {
  try {
    config_from_yaml_string(yaml, "names.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A small MXFP4 run: depth 2, width 32, batch 64, 200 steps, MXFP4, a checkpoint every 20.
constexpr const char* kRepro = R"(name: names
seed: 1
steps: 200
device: cpu
model: {depth: 2, width: 32}
data: {batch: 64}
precision: {weight: mxfp4_e2m1, activation: mxfp4_e2m1, grad: mxfp4_e2m1}
checkpoint_every: 20
)";
constexpr const char* kLog = "log: {log_every: 20, progress: false, snapshot_steps: [100]}\n";

bool one_line(const std::string& out) {
  const size_t nl = out.find('\n');
  return nl == std::string::npos || nl + 1 == out.size();
}

std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> v;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); ++it)
    v.push_back(fs::relative(it->path(), dir).string());
  std::sort(v.begin(), v.end());
  return v;
}

RunConfig small() {
  RunConfig c;
  c.seed = 7;
  c.steps = 30;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 32;
  c.optimizer.lr = 3e-3f;
  c.precision.weight = c.precision.activation = c.precision.grad = NumFmt::mxfp4_e2m1;
  c.log.log_every = 5;
  c.log.progress = false;
  c.checkpoint_every = 10;
  return c;
}

}  // namespace

// ---- the one check ------------------------------------------------------------------------

TEST(Names, PlainNamesAndReservedOnes) {
  for (const char* ok : {"a", "mx2", "fp32_late", "x-1", "a.b", "A_9.z-", "fp32.5"}) {
    EXPECT_EQ(plain_name_problem(ok), "") << ok;
    EXPECT_EQ(arm_name_problem(ok), "") << ok;
    EXPECT_EQ(branch_name_problem(ok), "") << ok;
  }
  struct Bad {
    std::string name;
    const char* expect;
  };
  for (const Bad& b : {Bad{"", "is empty"}, Bad{".", "starts with '.'"}, Bad{"..", "starts with '.'"},
                       Bad{".hidden", "starts with '.'"}, Bad{"a/b", "holds the character '/'"},
                       Bad{"a b", "holds the character ' '"}, Bad{"a\nb", "holds the character 0x0a"},
                       Bad{std::string(65, 'x'), "is 65 characters long: at most 64"}}) {
    const std::string p = plain_name_problem(b.name);
    EXPECT_TRUE(contains(p, b.expect)) << quoted_name(b.name) << ": " << p;
    EXPECT_EQ(arm_name_problem(b.name), p);
    EXPECT_EQ(branch_name_problem(b.name), p);
    EXPECT_EQ(p.find('\n'), std::string::npos);
  }
  EXPECT_EQ(plain_name_problem(std::string(64, 'x')), "");
  // Reserved for a kind of trajectory; still plain (they are looked up, e.g. --from mx). `mx`
  // names an arm (the default one, or one of `arms:`), never a branch.
  EXPECT_EQ(plain_name_problem("fp32"), "");
  EXPECT_EQ(plain_name_problem("mx"), "");
  EXPECT_TRUE(contains(arm_name_problem("fp32"), "reserved for the FP32 trajectory"));
  EXPECT_TRUE(contains(branch_name_problem("fp32"), "reserved for the FP32 trajectory"));
  EXPECT_EQ(arm_name_problem("mx"), "");
  EXPECT_TRUE(contains(branch_name_problem("mx"), "reserved for an arm"));
  // Quoted for messages: one line, bounded.
  EXPECT_EQ(quoted_name("a\nb"), "'a\\x0ab'");
  EXPECT_EQ(quoted_name(std::string(1000, 'y')), "'" + std::string(40, 'y') + "...'");
}

TEST(Names, ExperimentsRefuseReservedAndDotNames) {
  struct Case {
    std::string yaml;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"interventions:\n  - {name: fp32, at: 10, apply: to_fp32}\n",
       {"names.yaml:2:", "interventions[0].name 'fp32' is reserved for the FP32 trajectory"}},
      {"interventions:\n  - {name: mx, at: 10, apply: to_fp32}\n",
       {"names.yaml:2:", "interventions[0].name 'mx' is reserved"}},
      {"interventions:\n  - {name: '.', at: 10, apply: to_fp32}\n", {"names.yaml:2:", "'.' starts with '.'"}},
      {"interventions:\n  - {name: '..', at: 10, apply: to_fp32}\n", {"names.yaml:2:", "'..' starts with '.'"}},
      {"interventions:\n  - {name: a/b, at: 10, apply: to_fp32}\n", {"names.yaml:2:", "holds the character '/'"}},
      {"interventions:\n  - {name: b, at: 10, apply: to_fp32, from: '..'}\n",
       {"names.yaml:2:", "interventions[0].from '..' starts with '.'"}},
      {"arms:\n  - {name: '.'}\n", {"names.yaml:2:", "arms[0].name '.' starts with '.'"}},
      {"arms:\n  - {name: a}\n  - {name: '..'}\n", {"names.yaml:3:", "arms[1].name '..' starts with '.'"}},
      {"arms:\n  - {name: .x}\n", {"names.yaml:2:", "arms[0].name '.x' starts with '.'"}},
      {"arms:\n  - {name: fp32}\n", {"names.yaml:2:", "arms[0].name 'fp32' is reserved for the FP32 trajectory"}},
      {"arms:\n  - {name: mx}\n  - {name: b}\ninterventions:\n  - {name: mx, at: 10, apply: to_fp32, from: b}\n",
       {"names.yaml:5:", "interventions[0].name 'mx' is reserved for an arm"}},
  };
  for (const Case& c : cases) {
    const std::string e = config_error(c.yaml);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    for (const std::string& s : c.expect) EXPECT_TRUE(contains(e, s)) << c.yaml << "-> " << e;
  }
  // The default arm keeps its name, and interventions fork from it by default.
  const RunConfig c = config_from_yaml_string("interventions:\n  - {name: late, at: 10, apply: to_fp32}\n", "ok.yaml");
  EXPECT_EQ(c.interventions[0].from, "mx");
  EXPECT_EQ(resolved_arms(c)[0].name, "mx");
  EXPECT_NO_THROW(config_from_yaml_string("interventions:\n  - {name: fp32_late, at: 10, apply: to_fp32, from: mx}\n",
                                          "ok.yaml"));
  // An arm may be called mx (it is an arm, like the default one), and branches fork from it.
  const RunConfig arms = config_from_yaml_string(
      "arms:\n  - {name: mx}\n  - {name: f32, apply: to_fp32}\ninterventions:\n  - {name: late, at: 10, apply: to_fp32}\n",
      "ok.yaml");
  EXPECT_EQ(resolved_arms(arms)[0].name, "mx");
}

// ---- the fork source ----------------------------------------------------------------------

// A branch added after the fact (as `mxlab branch` does it: restrict_output, a checkpoint, run)
// continues from its arm, also when its name is another trajectory's. The names are refused
// before they get here; this holds the trainer and the checkpoint to the kind, not the name.
TEST(NamesTrainer, ABranchForksFromItsArmWhateverItsName) {
  TempDir dir;
  const std::string ckpt = dir.str() + "/at20.ckpt";
  const RunConfig base = small();
  MemorySink full;
  {
    auto be = make_cpu_backend();
    Trainer tr(base, *be, full);
    tr.open_output();
    RunControl ctl;
    ctl.checkpoint = [&](int64_t step) {
      if (step == 20) save_checkpoint(tr, "h", ckpt);
    };
    tr.finish(tr.run(ctl));
  }
  auto branch = [&](const std::string& name) {
    RunConfig c = base;
    c.interventions = {{name, 20, "to_fp32", {}}};
    auto be = make_cpu_backend();
    MemorySink s;
    Trainer t(c, *be, s);
    EXPECT_EQ(t.trajectory(2).kind, TrajectoryKind::branch);
    EXPECT_EQ(t.trajectory(2).source, 1);
    t.restrict_output({name});
    load_checkpoint(t, "h", ckpt);
    t.open_output();
    t.finish(t.run(RunControl{}));
    EXPECT_EQ(s.groups.count("trajectories/fp32"), 0u) << name << ": only the branch is written";
    return s.groups.at("branches/" + name).loss_all;
  };
  const std::vector<float> ref = branch("late");
  const std::vector<float>& fp32 = full.groups.at("trajectories/fp32").loss_all;
  ASSERT_EQ(ref.size(), 10u);
  // The branch is not the FP32 trajectory: it starts at the MX weights.
  EXPECT_NE(std::memcmp(ref.data(), fp32.data() + 20, 10 * sizeof(float)), 0);
  for (const char* name : {"fp32", "mx"}) {
    const std::vector<float> b = branch(name);
    ASSERT_EQ(b.size(), ref.size()) << name;
    EXPECT_EQ(std::memcmp(b.data(), ref.data(), ref.size() * sizeof(float)), 0) << "a branch named " << name;
  }
}

// Checkpoints written before trajectories were matched by group (no `tN.group` lines) still
// resume, by name: the resumed run equals the uninterrupted one, branch included.
TEST(NamesTrainer, CheckpointsWithoutGroupsResumeByName) {
  TempDir dir;
  const std::string ckpt = dir.str() + "/at20.ckpt";
  RunConfig c = small();
  c.interventions = {{"late", 10, "to_fp32", {}}};
  MemorySink full;
  {
    auto be = make_cpu_backend();
    Trainer tr(c, *be, full);
    tr.open_output();
    RunControl ctl;
    ctl.checkpoint = [&](int64_t step) {
      if (step == 20) save_checkpoint(tr, "h", ckpt);
    };
    tr.finish(tr.run(ctl));
  }
  // The same checkpoint as the earlier format wrote it: header without the group lines, its
  // length and the checksum (FNV-1a 64 of everything before it) redone.
  std::string b = testutil::slurp(ckpt);
  uint32_t hlen = 0;
  std::memcpy(&hlen, b.data() + 12, 4);
  std::string header = b.substr(16, hlen), old;
  for (size_t at = 0; at < header.size();) {
    const size_t nl = header.find('\n', at);
    const std::string line = header.substr(at, nl - at + 1);
    if (line.find(".group=") == std::string::npos) old += line;
    at = nl + 1;
  }
  ASSERT_LT(old.size(), header.size());
  std::string body = b.substr(0, 12);
  const uint32_t new_len = static_cast<uint32_t>(old.size());
  body.append(reinterpret_cast<const char*>(&new_len), 4);
  body += old + b.substr(16 + hlen, b.size() - 16 - 16 - hlen);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : body) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  body.append(reinterpret_cast<const char*>(&h), 8);
  body += b.substr(b.size() - 8);
  testutil::write_bytes(ckpt, body);

  auto be = make_cpu_backend();
  MemorySink resumed;
  Trainer tr(c, *be, resumed);
  load_checkpoint(tr, "h", ckpt);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  for (const char* g : {"trajectories/fp32", "trajectories/mx", "branches/late"}) {
    const std::vector<float>& x = full.groups.at(g).loss_all;
    const std::vector<float>& y = resumed.groups.at(g).loss_all;
    ASSERT_EQ(x.size(), y.size()) << g;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << g;
  }
}

// ---- through the binary -------------------------------------------------------------------

class NamesCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("mxlab_names");
    const std::string exp = dir_->write("repro.yaml", std::string(kRepro) + kLog);
    testutil::train_cpu(exp, dir_->str() + "/run", &file_);
    // The same branch in-line, for comparison.
    const std::string inl = dir_->write(
        "inline.yaml", std::string(kRepro) + kLog + "interventions:\n  - {name: to32, at: 100, apply: to_fp32}\n");
    testutil::train_cpu(inl, dir_->str() + "/inline", &inline_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // A copy of the finished run (file and checkpoints) in a fresh folder.
  static std::string copy_run(const std::string& tag) {
    const std::string out = dir_->str() + "/" + tag;
    fs::create_directories(out);
    for (const auto& e : fs::directory_iterator(fs::path(file_).parent_path()))
      fs::copy_file(e.path(), out + "/" + e.path().filename().string());
    return out + "/" + fs::path(file_).filename().string();
  }
  static TempDir* dir_;
  static std::string file_, inline_;
};

TempDir* NamesCli::dir_ = nullptr;
std::string NamesCli::file_, NamesCli::inline_;

TEST_F(NamesCli, BranchRefusesReservedAndDotNamesAndForksFromTheArm) {
  ASSERT_FALSE(file_.empty());
  const std::string file = copy_run("branch");
  for (const char* name : {"fp32", "mx", ".", "..", ".x", "a/b"}) {
    const Proc p = run_mxlab({"branch", file, "--at", "100", "--apply", "to_fp32", "--name", name});
    EXPECT_EQ(p.exit_code, 2) << name << ": " << p.output;
    EXPECT_TRUE(one_line(p.output)) << p.output;
    EXPECT_TRUE(contains(p.output, std::string("--name '") + name + "'")) << p.output;
  }
  const Proc from = run_mxlab({"branch", file, "--at", "100", "--apply", "to_fp32", "--name", "b", "--from", ".."});
  EXPECT_EQ(from.exit_code, 2) << from.output;
  EXPECT_TRUE(contains(from.output, "--from '..' starts with '.'")) << from.output;
  {
    const h5::H5File f(file, h5::H5File::Mode::read);
    EXPECT_FALSE(f.is_group("branches")) << "a refused branch left a group";
  }
  // The same branch under a plain name forks from the MX arm: it is the in-line branch, not
  // the FP32 trajectory's tail.
  const Proc ok = run_mxlab({"branch", file, "--at", "100", "--apply", "to_fp32", "--name", "to32"});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const h5::H5File f(file, h5::H5File::Mode::read);
  const h5::H5File g(inline_, h5::H5File::Mode::read);
  const std::vector<double> br = f.read_doubles("branches/to32/loss_all");
  const std::vector<double> fp32 = f.read_doubles("trajectories/fp32/loss_all");
  ASSERT_EQ(br.size(), 100u);
  EXPECT_EQ(br, g.read_doubles("branches/to32/loss_all"));
  EXPECT_NE(br, std::vector<double>(fp32.begin() + 100, fp32.end()));
  EXPECT_EQ(f.get_attr_string("branches/to32", "from"), "mx");
}

TEST_F(NamesCli, RunRefusesAnArmNamedDotInOneLine) {
  int i = 0;
  for (const char* name : {".", "..", "fp32"}) {
    const std::string exp =
        dir_->write(msg("arm", i++, ".yaml"), std::string(kRepro) + kLog + "arms:\n  - {name: '" + name + "'}\n");
    const Proc p = run_mxlab({"run", exp, "--out", dir_->str() + "/never", "--device", "cpu"});
    EXPECT_EQ(p.exit_code, 2) << name << ": " << p.output;
    EXPECT_TRUE(one_line(p.output)) << p.output;
    EXPECT_TRUE(contains(p.output, std::string("arms[0].name '") + name + "'")) << p.output;
    EXPECT_FALSE(contains(p.output, "HDF5")) << p.output;
  }
  EXPECT_FALSE(fs::exists(dir_->str() + "/never") && !files_under(dir_->str() + "/never").empty());
}

// Export builds paths from names it reads in the file: a damaged (or hand-made) file must not
// make it write outside its folders. snapshots/.. as --npy's trajectory folder is refused before
// anything is written; a run id with '/' or '..' is made a plain file name.
TEST_F(NamesCli, ExportWritesOnlyInsideItsFolders) {
  ASSERT_FALSE(file_.empty());
  const std::string file = copy_run("export");
  {
    h5::H5File f(file, h5::H5File::Mode::append);
    ASSERT_GE(H5Lmove(f.id(), "snapshots/mx", f.id(), "snapshots/..", H5P_DEFAULT, H5P_DEFAULT), 0);
    f.set_attr("/", "run_id", std::string("../../escaped"));
  }
  const std::string out = dir_->str() + "/out";
  fs::create_directories(out);
  const Proc npy = run_mxlab({"export", file, "--snapshot", "100", "--npy", out + "/inner"});
  EXPECT_EQ(npy.exit_code, 2) << npy.output;
  EXPECT_TRUE(one_line(npy.output)) << npy.output;
  EXPECT_TRUE(contains(npy.output, "snapshots/'..' is not a trajectory name")) << npy.output;
  EXPECT_EQ(files_under(out), std::vector<std::string>{}) << "written into the parent of --npy";

  // --csv DIR: the run id "../../escaped" must not reach two folders up (the staging folder is
  // DIR/.mxlab-export.PID, so "../../" from there is DIR's parent).
  const std::string csv = out + "/a/b";
  fs::create_directories(csv);
  mxlab::testutil::write_bytes(out + "/a/escaped_summary.csv", "keep");
  const Proc p = run_mxlab({"export", file, "--csv", csv});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(mxlab::testutil::slurp(out + "/a/escaped_summary.csv"), "keep");
  for (const std::string& f : files_under(out + "/a"))
    EXPECT_TRUE(f == "b" || f == "escaped_summary.csv" || f.rfind("b/", 0) == 0) << f;
  bool summary = false;
  for (const std::string& f : files_under(csv)) {
    EXPECT_EQ(f.find('/'), std::string::npos) << f;
    EXPECT_NE(f[0], '.') << f;
    summary = summary || f.find("escaped_summary.csv") != std::string::npos;
  }
  EXPECT_TRUE(summary);
}

// ---- summarize --by arm --branches --------------------------------------------------------

namespace {

// A run file holding only what summarize and the index read, with trajectories/<t> for each of
// `trajectories` and branches/<b> (at 500, diverged at 700) for each of `branches`.
void write_summary_file(const std::string& path, uint64_t seed, const std::vector<std::string>& trajectories,
                        const std::vector<std::string>& branches) {
  RunConfig c;
  c.seed = seed;
  c.steps = 1000;
  h5::H5File f(path, h5::H5File::Mode::create);
  f.set_attr("/", "schema_version", int64_t{1});
  f.set_attr("/", "run_id", fs::path(path).stem().string());
  f.set_attr("/", "status", std::string("complete"));
  f.set_attr("/", "config_yaml", dump_config(c));
  f.set_attr("/", "steps", int64_t{1000});
  std::vector<std::string> groups;
  for (const std::string& t : trajectories) groups.push_back("trajectories/" + t);
  for (const std::string& b : branches) groups.push_back("branches/" + b);
  for (const std::string& g : groups) {
    const bool branch = g[0] == 'b';
    f.create_group(g);
    if (branch) f.set_attr(g, "at", int64_t{500});
    f.set_attr(g, "steps_run", int64_t{branch ? 500 : 1000});
    f.set_attr(g, "first_nonfinite_step", int64_t{-1});
    f.set_attr(g, "divergence_step", int64_t{branch ? 700 : -1});  // only branches diverge
    f.set_attr(g, "spike_count", int64_t{0});
    f.set_attr(g, "spike_score", 0.0);
    f.set_attr(g, "final_loss", branch ? 0.05 : 0.002);
    f.set_attr(g, "min_loss", 0.0019);
    // The per-step losses the events are computed from (a branch's from its `at`).
    std::vector<float> v(branch ? 500 : 1000, 0.002f);
    if (branch) std::fill(v.begin() + 200, v.end(), 0.05f);
    h5::H5Series::create(f, g + "/loss_all", h5::DType::f32).append_rows(v.data(), v.size());
  }
}

}  // namespace

// A branch is pooled with branches, never with the trajectory whose name it has (files written
// before the names were reserved may hold branches/fp32 or branches/mx).
TEST(NamesSummarize, BranchesPoolByKindNotByName) {
  TempDir dir;
  for (int s = 0; s < 2; ++s)
    write_summary_file(dir.str() + "/r" + std::to_string(s) + ".h5", static_cast<uint64_t>(s), {"fp32", "mx"},
                       {"fp32"});
  GroupingOptions o{{kArmKey}};
  o.branches = true;
  std::vector<RunRecord> recs = scan_run_dir(dir.str());
  for (const RunRecord& r : recs) ASSERT_TRUE(r.readable) << r.path << ": " << to_string(r.status) << " " << r.error;
  read_events(recs, EventRules{});  // the per-step losses the groups' events come from
  const GroupedOutcomes g = group_outcomes(recs, o);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].values, std::vector<std::string>{"fp32"});
  EXPECT_EQ(g.groups[0].n, 2);
  EXPECT_EQ(g.groups[0].diverged_to_end, 0) << "the FP32 group holds a branch";
  for (const TrajectoryOutcome& t : g.groups[0].members) EXPECT_FALSE(t.branch);
  EXPECT_EQ(g.groups[0].degraded_n, 2);
  EXPECT_EQ(g.groups[0].degraded, 0);
  const OutcomeGroup& br = g.groups[1].members[0].branch ? g.groups[1] : g.groups[2];
  EXPECT_EQ(br.n, 2);
  EXPECT_EQ(br.diverged_to_end, 2);
  for (const TrajectoryOutcome& t : br.members) EXPECT_TRUE(t.branch);
}

// index.csv's MX columns are the trajectory `mx`'s, never a branch's of that name (a multi-arm
// run has no trajectory mx; a file made before the names were reserved may hold branches/mx).
TEST(NamesSummarize, TheIndexReadsTheMxTrajectoryNotABranch) {
  TempDir dir;
  write_summary_file(dir.str() + "/arms.h5", 0, {"fp32", "a", "b"}, {"mx"});
  write_summary_file(dir.str() + "/one.h5", 1, {"fp32", "mx"}, {"mx"});
  const std::string text = testutil::slurp(write_index(dir.str(), scan_run_dir(dir.str())));
  std::vector<std::vector<std::string>> rows;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    std::vector<std::string> cells(1);
    for (char ch : text.substr(at, nl - at)) {
      if (ch == ',') cells.emplace_back();
      else cells.back() += ch;
    }
    rows.push_back(cells);
    at = nl + 1;
  }
  ASSERT_EQ(rows.size(), 3u) << text;
  const auto col = std::find(rows[0].begin(), rows[0].end(), "divergence_step") - rows[0].begin();
  ASSERT_LT(static_cast<size_t>(col), rows[0].size()) << text;
  for (size_t r = 1; r < rows.size(); ++r) {
    ASSERT_LT(static_cast<size_t>(col), rows[r].size()) << text;
    EXPECT_NE(rows[r][col], "700") << "a branch's divergence as the run's: " << text;
  }
}

// ---- capture keys -------------------------------------------------------------------------

TEST(CaptureKeys, EveryTrajectoryAndTheShadowCount) {
  StepCaptureKeys k;
  const std::vector<bool> all(40, true);
  const int base = k.key(false, all);
  EXPECT_GE(base, StepCaptureKeys::kFirstKey);
  EXPECT_EQ(k.key(false, all), base);
  EXPECT_NE(k.key(true, all), base);
  std::set<int> seen = {base, k.key(true, all)};
  for (size_t i = 0; i < all.size(); ++i) {  // trajectory i alone not live: its own key, beyond 28 too
    std::vector<bool> one = all;
    one[i] = false;
    EXPECT_TRUE(seen.insert(k.key(false, one)).second) << "trajectory " << i;
    EXPECT_EQ(k.key(false, one), k.key(false, one));
  }
  EXPECT_TRUE(seen.insert(k.key(false, std::vector<bool>(41, true))).second);  // one more trajectory
  EXPECT_EQ(k.size(), seen.size());
  EXPECT_TRUE(k.seen(false, all));
  EXPECT_FALSE(k.seen(false, std::vector<bool>(39, true)));
  // Another trainer (on the same backend, perhaps) never replays this one's recordings.
  StepCaptureKeys other;
  EXPECT_EQ(seen.count(other.key(false, all)), 0u);
}

// The trainer keys an unlogged step on every trajectory: a branch at index 32 (behind the FP32
// trajectory and 31 arms) that starts mid-run gives the steps after it their own key, so a
// backend with graphs records them afresh instead of replaying steps without the branch.
TEST(CaptureKeys, TheTrainerKeysOnEveryTrajectory) {
  RunConfig c = small();
  c.steps = 10;
  c.model.depth = 1;
  c.data.batch = 8;
  c.log.log_every = 100;  // steps 0 and 9 log; 1..8 are captured units
  c.log.bias_every = 100;
  c.checkpoint_every = 0;
  for (int a = 0; a < 31; ++a) c.arms.push_back({"a" + std::to_string(a), "", {}});
  c.interventions = {{"late", 5, "to_fp32", {}, "a30"}};
  validate_config(c);
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(c, *be, sink);
  ASSERT_EQ(tr.num_trajectories(), 33u);
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  std::vector<bool> before(33, true), after(33, true);
  before[32] = false;
  EXPECT_TRUE(tr.capture_keys().seen(false, before));
  EXPECT_TRUE(tr.capture_keys().seen(false, after));
  EXPECT_EQ(tr.capture_keys().size(), 2u);
  EXPECT_EQ(sink.groups.at("branches/late").loss_all.size(), 5u);
}
