// Compiled instead of tests/gpu/* when the build has no CUDA: one test that says so visibly.
#include <gtest/gtest.h>

TEST(Gpu, NotCompiled) { GTEST_SKIP() << "mxlab was built without CUDA (nvcc not found): GPU tests not compiled"; }
