// Experiment expansion: grid/zip/seeds counts and order, extends, stable run ids, the errors
// (with file, line and suggestion) and the `mxlab plan` command.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/wait.h>

#include "lab/core/error.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

using Swept = std::vector<std::pair<std::string, std::string>>;

using mxlab::test::TempDir;
using mxlab::test::run_command;

std::vector<ExpandedRun> expand(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return expand_experiment_string(yaml, "exp.yaml", overrides);
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an mxlab::Error";
  return "";
}


}  // namespace

TEST(Sweep, NoSweepIsOneRun) {
  const auto runs = expand("steps: 10\nmodel: {width: 64}\n");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].index, 0);
  EXPECT_TRUE(runs[0].swept.empty());
  EXPECT_EQ(runs[0].cfg.model.width, 64);
  EXPECT_EQ(runs[0].id, config_hash(runs[0].cfg));
}

TEST(Sweep, GridIsCartesianInKeyOrderFirstKeySlowest) {
  const auto runs = expand(
      "model: {width: 64}\n"
      "sweep:\n  grid:\n    model.depth: [1, 2, 3]\n    precision.weight: [bf16, fp32]\n");
  ASSERT_EQ(runs.size(), 6u);
  const std::vector<Swept> expect = {
      {{"model.depth", "1"}, {"precision.weight", "bf16"}}, {{"model.depth", "1"}, {"precision.weight", "fp32"}},
      {{"model.depth", "2"}, {"precision.weight", "bf16"}}, {{"model.depth", "2"}, {"precision.weight", "fp32"}},
      {{"model.depth", "3"}, {"precision.weight", "bf16"}}, {{"model.depth", "3"}, {"precision.weight", "fp32"}},
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].index, static_cast<int>(i));
    EXPECT_EQ(runs[i].swept, expect[i]) << i;
    EXPECT_EQ(runs[i].cfg.model.depth, static_cast<int>(i / 2 + 1));
    EXPECT_EQ(runs[i].cfg.precision.weight, i % 2 ? NumFmt::fp32 : NumFmt::bf16);
    EXPECT_EQ(runs[i].cfg.model.width, 64);  // base keys reach every run
  }
}

TEST(Sweep, ZipVariesTogetherThenSeedsFastest) {
  const auto runs = expand(
      "model: {width: 64}\n"
      "sweep:\n"
      "  grid: {model.depth: [1, 2]}\n"
      "  zip: {optimizer.lr: [1e-3, 2e-3, 4e-3], schedule.warmup: [10, 20, 40]}\n"
      "  seeds: [7, 8]\n");
  ASSERT_EQ(runs.size(), 2u * 3u * 2u);
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunConfig& c = runs[i].cfg;
    const size_t seed_i = i % 2, zip_i = (i / 2) % 3, grid_i = i / 6;
    EXPECT_EQ(c.seed, 7u + seed_i) << i;
    EXPECT_EQ(c.optimizer.lr, (std::vector<float>{1e-3f, 2e-3f, 4e-3f}[zip_i])) << i;
    EXPECT_EQ(c.schedule.warmup, (std::vector<int>{10, 20, 40}[zip_i])) << i;
    EXPECT_EQ(c.model.depth, static_cast<int>(grid_i + 1)) << i;
  }
  EXPECT_EQ(runs[5].swept, (Swept{{"model.depth", "1"}, {"optimizer.lr", "4e-3"}, {"schedule.warmup", "40"}, {"seed", "8"}}));
}

TEST(Sweep, KeysWithOneValueAreAppliedButNotReported) {
  const auto runs = expand("sweep:\n  grid: {model.width: [64], model.depth: [1, 2]}\n  seeds: [5]\n");
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.cfg.model.width, 64);
    EXPECT_EQ(r.cfg.seed, 5u);
    ASSERT_EQ(r.swept.size(), 1u);
    EXPECT_EQ(r.swept[0].first, "model.depth");
  }
  // A sweep of one run is also a plain configuration for load_config.
  EXPECT_EQ(config_from_yaml_string("sweep: {grid: {model.width: [64]}}\n", "one.yaml").model.width, 64);
}

TEST(Sweep, InterventionsApplyToEveryRun) {
  const auto runs = expand(
      "steps: 100\nmodel: {width: 64}\n"
      "interventions: [{name: f, at: 50, apply: to_fp32}]\n"
      "sweep: {grid: {precision.weight: [bf16, mxfp8_e5m2]}}\n");
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) {
    ASSERT_EQ(r.cfg.interventions.size(), 1u);
    EXPECT_EQ(r.cfg.interventions[0].name, "f");
  }
}

TEST(Sweep, RunIdsAreStable) {
  const std::string a = "model: {width: 64}\nsweep: {grid: {model.depth: [1, 2]}, seeds: [0, 1]}\n";
  // The same experiment written differently: other key order, comments, a name and a device.
  const std::string b =
      "# comment\nname: other\ndevice: cpu\nsweep:\n  seeds: [0, 1]\n  grid:\n    model.depth: [1, 2]\nmodel:\n  width: 64\n";
  const auto ra = expand(a), rb = expand(b);
  ASSERT_EQ(ra.size(), 4u);
  ASSERT_EQ(rb.size(), 4u);
  std::set<std::string> ids;
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(ra[i].id, rb[i].id) << i;
    EXPECT_EQ(ra[i].id, expand(a)[i].id);
    EXPECT_EQ(ra[i].id, config_hash(ra[i].cfg));
    ids.insert(ra[i].id);
  }
  EXPECT_EQ(ids.size(), 4u);
  // The id of a swept run is the id of the same configuration written without a sweep.
  EXPECT_EQ(ra[3].id, expand("model: {width: 64, depth: 2}\nseed: 1\n")[0].id);
}

TEST(Sweep, ExtendsMergesParentAndChild) {
  TempDir dir;
  dir.write("common/parent.yaml",
            "name: parent\nsteps: 300\nmodel: {width: 64, depth: 2}\noptimizer: {lr: 1e-3}\n"
            "sweep:\n  seeds: [0, 1]\n  grid: {model.depth: [1, 2]}\n");
  dir.write("common/grand.yaml", "extends: parent.yaml\nbase:\n  optimizer: {beta1: 0.8}\n  steps: 400\nsteps: 500\n");
  const std::string child = dir.write(
      "exps/child.yaml",
      "extends: ../common/grand.yaml\nmodel: {depth: 3}\nsweep:\n  grid: {precision.weight: [bf16, fp32]}\n");
  const auto runs = expand_experiment(child);
  // Parent grid (model.depth) merged with the child's (precision.weight), seeds inherited.
  ASSERT_EQ(runs.size(), 2u * 2u * 2u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.cfg.name, "parent");
    EXPECT_EQ(r.cfg.steps, 500);            // top-level keys override base: in the same file
    EXPECT_EQ(r.cfg.model.width, 64);       // from the parent
    EXPECT_EQ(r.cfg.optimizer.lr, 1e-3f);   // parent's, merged key by key with ...
    EXPECT_EQ(r.cfg.optimizer.beta1, 0.8f);  // ... the middle file's
  }
  EXPECT_EQ(runs[0].swept, (Swept{{"model.depth", "1"}, {"precision.weight", "bf16"}, {"seed", "0"}}));
  // --set reaches every run; load_config reports that this is a sweep.
  for (const auto& r : expand_experiment(child, {"optimizer.lr=5e-4"})) EXPECT_EQ(r.cfg.optimizer.lr, 5e-4f);
  const std::string e = error_of([&] { load_config(child); });
  EXPECT_NE(e.find("sweep of 8 runs"), std::string::npos) << e;
  EXPECT_NE(e.find("mxlab plan"), std::string::npos) << e;
}

TEST(Sweep, BadSweepsGiveMessagesWithLineAndHint) {
  struct Case {
    const char* what;
    const char* yaml;
    std::vector<std::string> overrides;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"unknown dotted key in grid", "sweep:\n  grid:\n    model.widht: [64, 128]\n", {},
       {"exp.yaml:3:", "unknown key 'model.widht' in sweep.grid", "did you mean 'model.width'?"}},
      {"unknown dotted key in zip", "sweep:\n  zip:\n    optimizer.lrr: [1e-3]\n", {},
       {"exp.yaml:3:", "in sweep.zip", "did you mean 'optimizer.lr'?"}},
      {"unknown sweep key", "sweep:\n  seed: [1, 2]\n", {}, {"exp.yaml:2:", "unknown key 'seed' in sweep", "'seeds'"}},
      {"typo of sweep", "swep:\n  seeds: [1, 2]\n", {}, {"exp.yaml:1:", "unknown key 'swep'", "did you mean 'sweep'?"}},
      {"unequal zip lengths", "sweep:\n  zip:\n    optimizer.lr: [1e-3, 2e-3]\n    schedule.warmup: [1, 2, 3]\n", {},
       {"exp.yaml:4:", "equal lengths", "optimizer.lr has 2 values, schedule.warmup has 3"}},
      {"empty list", "sweep:\n  grid:\n    model.depth: []\n", {}, {"exp.yaml:3:", "non-empty list", "an empty list"}},
      {"not a list", "sweep:\n  grid:\n    model.depth: 3\n", {}, {"exp.yaml:3:", "sweep.grid.model.depth", "non-empty list"}},
      {"empty seeds", "sweep: {seeds: []}\n", {}, {"exp.yaml:1:", "sweep.seeds", "non-empty list"}},
      {"key in grid and zip", "sweep:\n  grid: {model.depth: [1, 2]}\n  zip: {model.depth: [3, 4]}\n", {},
       {"exp.yaml:3:", "model.depth is swept twice"}},
      {"seed in grid and seeds", "sweep:\n  grid: {seed: [1, 2]}\n  seeds: [3]\n", {}, {"seed is swept twice"}},
      {"bad value at its own line", "sweep:\n  grid:\n    model.width:\n      - 64\n      - 100\n", {},
       {"exp.yaml:5:", "model.width = 100 is not a multiple"}},
      {"wrong type in a sweep", "sweep: {grid: {model.depth: [1, two]}}\n", {},
       {"exp.yaml:1:", "model.depth: expected an integer, got 'two'"}},
      {"two runs with the same configuration", "sweep: {grid: {model.depth: [2, 2]}}\n", {},
       {"exp.yaml", "runs 0 and 1", "same configuration"}},
      {"--set of a swept key", "sweep: {grid: {model.depth: [1, 2]}}\n", {"model.depth=3"},
       {"--set model.depth=3", "model.depth is swept (exp.yaml:1)"}},
      {"--set of a section holding a swept key", "sweep: {grid: {model.depth: [1, 2]}}\n", {"model={depth: 3}"},
       {"model.depth is swept"}},
      {"sweep under base", "base:\n  sweep: {seeds: [1]}\n", {}, {"exp.yaml:2:", "belongs at the top level"}},
      {"missing extends", "extends: no_such_parent.yaml\n", {}, {"exp.yaml:1:", "no_such_parent.yaml", "not a readable file"}},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { expand(c.yaml, c.overrides); });
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.what << ": not one line: " << e;
    for (const std::string& s : c.expect) EXPECT_NE(e.find(s), std::string::npos) << c.what << ": '" << s << "' not in: " << e;
  }
}

TEST(Sweep, CyclicExtendsIsAnError) {
  TempDir dir;
  const std::string a = dir.write("a.yaml", "extends: b.yaml\nsteps: 10\n");
  dir.write("sub/keep.yaml", "");
  dir.write("b.yaml", "extends: sub/../a.yaml\n");  // the same file by another path
  std::string e = error_of([&] { expand_experiment(a); });
  EXPECT_NE(e.find("b.yaml:1: extends: cycle"), std::string::npos) << e;
  const std::string self = dir.write("self.yaml", "extends: self.yaml\n");
  e = error_of([&] { expand_experiment(self); });
  EXPECT_NE(e.find("self.yaml:1: extends: cycle"), std::string::npos) << e;
  // Errors inside a parent name the parent.
  dir.write("broken.yaml", "model:\n  widht: 3\n");
  const std::string child = dir.write("child.yaml", "extends: broken.yaml\n");
  e = error_of([&] { expand_experiment(child); });
  EXPECT_NE(e.find("broken.yaml:2: unknown key 'widht' in model"), std::string::npos) << e;
}

TEST(Sweep, PlanCommand) {
  TempDir dir;
  const std::string p = dir.write(
      "exp.yaml", "model: {width: 64}\nsweep:\n  grid: {model.depth: [1, 2], precision.weight: [bf16, fp32]}\n  seeds: [0, 1]\n");
  // stdout only: this sweep varies only a precision key between runs of one seed and depth, so
  // plan also prints a warning on stderr (tested in test_recipe_sweep.cpp).
  auto [rc, out] = run_command("(" + std::string(MXLAB_BINARY) + " plan " + p + " 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  const auto runs = expand_experiment(p);
  ASSERT_EQ(runs.size(), 8u);
  EXPECT_EQ(out.rfind("index  run_id        model.depth  precision.weight  seed\n", 0), 0u) << out;
  for (const auto& r : runs) EXPECT_NE(out.find(std::to_string(r.index) + "      " + r.id), std::string::npos) << out;
  EXPECT_NE(out.find("7      " + runs[7].id + "  2            fp32              1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("total: 8 runs\n"), std::string::npos) << out;

  std::tie(rc, out) = run_command(std::string(MXLAB_BINARY) + " plan " + p + " --set model.depth=3");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("model.depth is swept"), std::string::npos) << out;
  EXPECT_EQ(out.find("total"), std::string::npos) << out;

  // dump-config --run N prints run N of the plan.
  std::tie(rc, out) = run_command(std::string(MXLAB_BINARY) + " dump-config " + p + " --run 5");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, dump_config(runs[5].cfg));
  std::tie(rc, out) = run_command(std::string(MXLAB_BINARY) + " dump-config " + p + " --run 8");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--run 8: " + p + " has runs 0 to 7 (see `mxlab plan"), std::string::npos) << out;
}

TEST(Sweep, RunOfExperimentPicksOneRunOfTheExpansion) {
  TempDir dir;
  const std::string p = dir.write("exp.yaml", "model: {width: 32, depth: 1}\ndata: {batch: 8}\nsweep:\n  seeds: [4, 5, 6]\n");
  const auto runs = expand_experiment(p);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dump_config(run_of_experiment(p, {}, i)), dump_config(runs[i].cfg)) << i;
  EXPECT_EQ(run_of_experiment(p, {"model.width=64"}, 2).model.width, 64);
  EXPECT_NE(error_of([&] { run_of_experiment(p, {}, 3); }).find("--run 3: " + p + " has runs 0 to 2"), std::string::npos);
  const std::string one = dir.write("one.yaml", "model: {width: 32, depth: 1}\n");
  EXPECT_NE(error_of([&] { run_of_experiment(one, {}, 1); }).find("has one run, 0 (see"), std::string::npos);
  // dump-step --run I steps that run: its config.yaml is run I's resolved configuration
  const std::string out = dir.str() + "/step";
  auto [rc, text] = run_command(std::string(MXLAB_BINARY) + " dump-step " + p + " --run 2 --out " + out);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_EQ(load_config(out + "/config.yaml").seed, 6u);
  // without --run a sweep is refused, as before
  std::tie(rc, text) = run_command(std::string(MXLAB_BINARY) + " dump-step " + p + " --out " + out + "2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(text.find("is a sweep of 3 runs"), std::string::npos) << text;
}

// Every experiment committed under experiments/ loads: a schema change that breaks one fails here.
TEST(Sweep, CommittedExperimentsExpand) {
  const std::filesystem::path root = std::filesystem::path(MXLAB_SOURCE_DIR) / "experiments";
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".yaml") continue;
    ++files;
    try {
      EXPECT_FALSE(expand_experiment(entry.path().string()).empty()) << entry.path();
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  EXPECT_GE(files, 1);  // at least defaults.yaml
}
