// A sweep whose runs differ only in precision keys trains the same FP32 trajectory once per
// recipe and seed: precision_only_sweep_warning says so (pointing to `arms:`), `mxlab plan` and
// `mxlab run` print it once on stderr, and sweeps that also vary another key (or no precision
// key) get no warning.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lab/config/sweep.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;
using mxlab::test::run_command;
using mxlab::test::TempDir;

namespace {

const char* const kRecipeSweep = R"(name: recipes
steps: 20
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
sweep:
  grid:
    precision.weight: [mxfp8_e4m3, mxfp8_e5m2]
  seeds: [0, 1]
)";

int count_of(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(RecipeSweep, WarnsWhenRunsDifferOnlyInPrecisionKeys) {
  const std::string w = precision_only_sweep_warning(expand_experiment_string(kRecipeSweep, "r.yaml"));
  EXPECT_NE(w.find("runs 0 and 2 differ only in precision.weight"), std::string::npos) << w;
  EXPECT_NE(w.find("same FP32 trajectory again"), std::string::npos) << w;
  EXPECT_NE(w.find("arms: [{name: mxfp8_e4m3, set: {weight: mxfp8_e4m3}}, {name: mxfp8_e5m2, set: {weight: "
                   "mxfp8_e5m2}}]"),
            std::string::npos)
      << w;
  EXPECT_EQ(w.find('\n'), std::string::npos) << w;

  // `fp32` names the FP32 trajectory, never an arm: the example names that recipe otherwise.
  std::string to_fp32 = kRecipeSweep;
  to_fp32.replace(to_fp32.find("mxfp8_e5m2"), 10, "fp32");
  const std::string w2 = precision_only_sweep_warning(expand_experiment_string(to_fp32, "r.yaml"));
  EXPECT_NE(w2.find("arms: [{name: mxfp8_e4m3, set: {weight: mxfp8_e4m3}}, {name: b, set: {weight: fp32}}]"),
            std::string::npos)
      << w2;

  // Also with another grid key: the runs with the same learning rate differ only in the recipe.
  std::string with_lr = kRecipeSweep;
  with_lr.replace(with_lr.find("  seeds"), 0, "    optimizer.lr: [1.0e-3, 2.0e-3]\n");
  EXPECT_NE(precision_only_sweep_warning(expand_experiment_string(with_lr, "r.yaml")).find("precision.weight"),
            std::string::npos);
}

TEST(RecipeSweep, NoWarningWhenAnotherKeyVariesWithTheRecipeOrNoRecipeVaries) {
  const char* const zipped = R"(name: zipped
steps: 20
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
sweep:
  zip: {precision.weight: [mxfp8_e4m3, mxfp8_e5m2], optimizer.lr: [1.0e-3, 2.0e-3]}
  seeds: [0, 1]
)";
  EXPECT_EQ(precision_only_sweep_warning(expand_experiment_string(zipped, "z.yaml")), "");
  const char* const lrs = R"(name: lrs
steps: 20
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
sweep:
  grid: {optimizer.lr: [1.0e-3, 2.0e-3]}
  seeds: [0, 1]
)";
  EXPECT_EQ(precision_only_sweep_warning(expand_experiment_string(lrs, "l.yaml")), "");
  // One recipe per seed (a zip of the recipe with the seed list is not possible; one run each).
  const char* const one = R"(name: one
steps: 20
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
sweep:
  grid: {precision.weight: [mxfp8_e4m3]}
  seeds: [0, 1]
)";
  EXPECT_EQ(precision_only_sweep_warning(expand_experiment_string(one, "o.yaml")), "");
}

TEST(RecipeSweep, PlanAndRunPrintTheWarningOnce) {
  TempDir dir;
  const std::string exp = dir.write("r.yaml", kRecipeSweep);
  const std::string bin = MXLAB_BINARY;
  // stderr only (stdout to /dev/null): the warning is a stderr line, not part of the table.
  for (const std::string& cmd : {bin + " plan " + exp, bin + " run " + exp + " --dry-run --out " + dir.str() + "/out"}) {
    const auto [rc, err] = run_command("(" + cmd + " 2>&1 >/dev/null)");
    EXPECT_EQ(rc, 0) << cmd << "\n" << err;
    EXPECT_EQ(count_of(err, "mxlab: warning: runs 0 and 2 differ only in precision.weight"), 1) << cmd << "\n" << err;
    EXPECT_EQ(count_of(err, "\n"), 1) << cmd << "\n" << err;
  }
  const auto [rc, out] = run_command("(" + bin + " plan " + exp + " 2>/dev/null)");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
}
