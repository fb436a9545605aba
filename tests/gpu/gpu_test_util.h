// Shared helpers for GPU tests: skip visibly when no CUDA device is present.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

namespace mxlab::test {

// A device buffer of n elements (no error handling beyond what the tests' comparisons catch).
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { cudaMalloc(&p, count * sizeof(T)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void put(const std::vector<T>& h) { cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

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
