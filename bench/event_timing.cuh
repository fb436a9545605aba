// Timing helper shared by the GPU benchmark programs (bench/*.cu): CUDA events around batches of
// calls on one stream, warm-up first, the median over repetitions.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/cuda_check.cuh"

namespace mxlab::bench {

// Calls f(0), f(1), ... on stream s: `warmup` calls, then `reps` batches of `per_batch` calls, each
// batch between two events. Returns the median over the batches of the time per call, in ms.
inline double median_event_ms(cudaStream_t s, int warmup, int reps, int per_batch, const std::function<void(int)>& f) {
  cudaEvent_t a, b;
  MXLAB_CUDA_CHECK(cudaEventCreate(&a));
  MXLAB_CUDA_CHECK(cudaEventCreate(&b));
  int call = 0;
  for (int i = 0; i < warmup; ++i) f(call++);
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    MXLAB_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < per_batch; ++i) f(call++);
    MXLAB_CUDA_CHECK(cudaEventRecord(b, s));
    MXLAB_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    MXLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(static_cast<double>(ms) / per_batch);
  }
  MXLAB_CUDA_CHECK(cudaEventDestroy(a));
  MXLAB_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace mxlab::bench
