// An empty or comment-only experiment file is refused by every command that reads one (run,
// plan, dump-config, and as the parent of `extends:`) with one line pointing to
// `mxlab dump-config`, instead of silently running the full-size defaults; `mxlab dump-config`
// without a file still prints the defaults.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/core/exit_codes.h"
#include "lab/config/sweep.h"
#include "tests/cpu/run_binary_util.h"

using namespace mxlab;
using namespace mxlab::testutil;

namespace {

TEST(EmptyExperiment, IsRefusedWithAPointerToDumpConfig) {
  const std::string dir = make_temp_dir("empty");
  for (const std::string& text : {std::string(""), std::string("\n\n   \n"), std::string("# only a comment\n# another\n"),
                                  std::string("---\n"), std::string("~\n"), std::string("{}\n")}) {
    const std::string path = dir + "/empty.yaml";
    write_bytes(path, text);
    for (const std::vector<std::string>& args : {std::vector<std::string>{"run", path, "--out", dir + "/out"},
                                                 {"run", path, "--out", dir + "/out", "--dry-run"},
                                                 {"plan", path},
                                                 {"dump-config", path}}) {
      const Proc p = run_mxlab(args);
      EXPECT_EQ(p.exit_code, kExitBadInput) << args[0] << " on '" << text << "': " << p.output;
      EXPECT_EQ(count_of(p.output, "\n"), 1) << p.output;
      EXPECT_TRUE(contains(p.output, path + ": the experiment file is empty")) << p.output;
      EXPECT_TRUE(contains(p.output, "mxlab dump-config > " + path)) << p.output;
    }
    EXPECT_FALSE(file_exists(dir + "/out")) << "nothing may be written for an empty experiment";
  }
  // As the parent of another experiment, too.
  const std::string child = dir + "/child.yaml";
  write_bytes(child, "extends: empty.yaml\nsteps: 10\n");
  EXPECT_THROW(expand_experiment(child), Error);
}

TEST(EmptyExperiment, DumpConfigWithoutAFileStillPrintsTheDefaults) {
  const Proc p = run_mxlab({"dump-config"});
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "steps:")) << p.output;
}

}  // namespace
