// The tests that drive the mxlab binary find it at the build's path, or at $MXLAB_TEST_BINARY
// (test binaries carried to the GPU machine without the build tree: bench/pack_devbin.sh).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <string>

#include "tests/cpu/run_binary_util.h"

namespace {

using mxlab::testutil::contains;
using mxlab::testutil::make_temp_dir;
using mxlab::testutil::run_mxlab;
using mxlab::testutil::write_bytes;

// Restores MXLAB_TEST_BINARY as the test found it.
struct EnvGuard {
  std::string old;
  bool had;
  EnvGuard() {
    const char* e = std::getenv("MXLAB_TEST_BINARY");
    had = e != nullptr;
    if (had) old = e;
  }
  ~EnvGuard() {
    if (had) ::setenv("MXLAB_TEST_BINARY", old.c_str(), 1);
    else ::unsetenv("MXLAB_TEST_BINARY");
  }
};

TEST(RunBinaryUtil, MxlabTestBinaryReplacesTheBuildsPath) {
  EnvGuard guard;
  const std::string stand_in = make_temp_dir("bin") + "/mxlab";
  write_bytes(stand_in, "#!/bin/sh\necho \"stand-in mxlab: $*\"\nexit 7\n");
  ASSERT_EQ(::chmod(stand_in.c_str(), 0755), 0);
  ::setenv("MXLAB_TEST_BINARY", stand_in.c_str(), 1);
  EXPECT_EQ(mxlab::testutil::mxlab_binary(), stand_in);
  const auto p = run_mxlab({"run", "x.yaml"});
  EXPECT_EQ(p.exit_code, 7) << p.output;
  EXPECT_TRUE(contains(p.output, "stand-in mxlab: run x.yaml")) << p.output;
  // unset or empty: the build's binary
  ::setenv("MXLAB_TEST_BINARY", "", 1);
  EXPECT_EQ(mxlab::testutil::mxlab_binary(), std::string(MXLAB_BINARY));
  ::unsetenv("MXLAB_TEST_BINARY");
  const auto q = run_mxlab({"--help"});
  EXPECT_EQ(q.exit_code, 0) << q.output;
  EXPECT_TRUE(contains(q.output, "mxlab")) << q.output;
}

}  // namespace
