// `mxlab dump-step --weights DIR`: one step from other student parameters than the initial ones (a
// snapshot that `mxlab export --snapshot S --npy` wrote), through the binary.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "lab/io/npy.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

using mxlab::test::TempDir;
using mxlab::test::run_command;

const char* kExp = "model: {width: 32, depth: 1}\ndata: {batch: 8}\nseed: 3\n";

std::vector<std::string> groups(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(prefix + ".", 0) == 0) names.push_back(f.substr(prefix.size() + 1, f.size() - prefix.size() - 5));
  }
  return names;
}

// DIR/<group>.npy from dump-step's PREFIX.<group>.npy files, as export's snapshot folders hold them.
void as_weights(const std::string& from, const std::string& prefix, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const std::string& g : groups(from, prefix))
    std::filesystem::copy_file(from + "/" + prefix + "." + g + ".npy", dir + "/" + g + ".npy");
}

std::string dump(const std::string& exp, const std::string& out, const std::string& extra = "") {
  auto [rc, text] = run_command(std::string(MXLAB_BINARY) + " dump-step " + exp + " --out " + out + extra);
  EXPECT_EQ(rc, 0) << text;
  return text;
}

TEST(DumpStepWeights, StepsFromTheGivenParameters) {
  TempDir dir;
  const std::string p = dir.write("exp.yaml", kExp);
  const std::string a = dir.str() + "/a", b = dir.str() + "/b", c = dir.str() + "/c";
  dump(p, a);
  ASSERT_EQ(groups(a, "student").size(), 5u);  // gamma, beta, W1, W2, b2
  // From the initial weights given back: the same step, bit for bit.
  as_weights(a, "student", dir.str() + "/w0");
  dump(p, b, " --weights " + dir.str() + "/w0");
  for (const std::string& g : groups(a, "student"))
    for (const char* prefix : {"student", "grad", "updated"})
      EXPECT_EQ(read_npy(a + "/" + prefix + "." + g + ".npy").data, read_npy(b + "/" + prefix + "." + g + ".npy").data)
          << prefix << "." << g;
  // From the updated weights: student.* are they, and the step differs (the loss of other weights).
  as_weights(a, "updated", dir.str() + "/w1");
  dump(p, c, " --weights " + dir.str() + "/w1");
  for (const std::string& g : groups(a, "student"))
    EXPECT_EQ(read_npy(a + "/updated." + g + ".npy").data, read_npy(c + "/student." + g + ".npy").data) << g;
  EXPECT_NE(read_npy(a + "/loss.npy").data, read_npy(c + "/loss.npy").data);
  EXPECT_NE(read_npy(a + "/grad.layer0.W1.npy").data, read_npy(c + "/grad.layer0.W1.npy").data);
}

TEST(DumpStepWeights, RefusesWhatDoesNotFitInOneLine) {
  TempDir dir;
  const std::string p = dir.write("exp.yaml", kExp);
  const std::string a = dir.str() + "/a", w = dir.str() + "/w";
  dump(p, a);
  auto refused = [&](const std::string& weights, const std::string& says) {
    auto [rc, text] =
        run_command(std::string(MXLAB_BINARY) + " dump-step " + p + " --out " + dir.str() + "/x --weights " + weights);
    EXPECT_NE(rc, 0) << text;
    EXPECT_NE(text.find(says), std::string::npos) << text;
  };
  refused(dir.str() + "/none", "no such directory");
  as_weights(a, "student", w);
  std::filesystem::remove(w + "/layer0.b2.npy");
  refused(w, "no layer0.b2.npy (the student has groups layer0.gamma");
  // a W1 of another width (the run's --set not passed)
  const NpyArray w1 = read_npy(w + "/layer0.W1.npy");
  std::filesystem::copy_file(a + "/student.layer0.b2.npy", w + "/layer0.b2.npy");
  write_npy(w + "/layer0.W1.npy", {w1.shape[0] / 2, w1.shape[1]}, w1.data.data());
  refused(w, "layer0.W1.npy: shape [" + std::to_string(w1.shape[0] / 2) + " x 32]");
  std::vector<float> bad = w1.data;
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  write_npy(w + "/layer0.W1.npy", w1.shape, bad.data());
  refused(w, "layer0.W1.npy: element 5 is not finite");
}

}  // namespace
