// Shared helpers for GPU tests: skip visibly when no CUDA device is present.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace mxlab::test {

inline bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace mxlab::test

#define MXLAB_REQUIRE_GPU()                                                          \
  do {                                                                               \
    if (!::mxlab::test::cuda_device_available()) GTEST_SKIP() << "no CUDA device";   \
  } while (0)

#define MXLAB_CUDA_OK(expr)                                                                 \
  do {                                                                                      \
    cudaError_t err_ = (expr);                                                              \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);              \
  } while (0)
