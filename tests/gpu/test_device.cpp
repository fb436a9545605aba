// The device the GPU tests run on: name it in the test log, check it is Hopper-or-newer
// when the kernels were compiled for sm_90.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

TEST(Device, ReportsNameAndCapability) {
  MXLAB_REQUIRE_GPU();
  cudaDeviceProp p{};
  MXLAB_CUDA_OK(cudaGetDeviceProperties(&p, 0));
  std::printf("[device] %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor, p.multiProcessorCount,
              p.totalGlobalMem / 1073741824.0);
  EXPECT_GT(p.multiProcessorCount, 0);
}
