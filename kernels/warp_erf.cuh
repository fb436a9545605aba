// det_erf (lab/core/detmath.h) of a warp's values with its tail branch compacted onto as few
// lanes as there are tail values (issue 16, v21).
//
// det_erf has two polynomial branches: |x| < 1 (a degree-7 polynomial) and 1 <= |x| < 4 (an
// IEEE reciprocal, det_exp and a degree-10 polynomial, ~4x the work). GeLU evaluates it at
// x / sqrt 2 of a roughly unit-variance pre-activation, so ~16 % of the values take the tail,
// and almost every warp has a lane in each branch: evaluated per element, every warp pays
// both branches for each of its four values per lane. Here each lane evaluates the short
// branch for its own values; the values that need the tail are packed into a per-warp list in
// shared memory and the warp evaluates that list 32 at a time (one pass for up to 32 tail
// values out of the warp's 128), then every lane reads its results back. Each value goes
// through exactly det_erf's operations (detmath::erf_small / erf_tail, the same functions
// det_erf calls), so the bits are det_erf's: tests/gpu/test_warp_erf_gpu.cu compares them
// over 2^24 inputs and every mix of branches.
#pragma once
#include <cuda_runtime.h>

#include "kernels/launch_util.cuh"
#include "lab/core/detmath.h"

namespace mxlab::cuda {

constexpr int kWarpErfSlots = 4 * kWarp;  // floats of shared memory one warp's call needs

// det_erf of the four components of x on every active lane, bit for bit. Warp-collective: all
// 32 lanes must call it together (an inactive lane passes active = false and gets zeros back);
// `slots` is this warp's kWarpErfSlots floats of shared memory, free again on return.
__device__ __forceinline__ float4 warp_det_erf4(float4 x, bool active, float* slots) {
  using namespace detmath;
  const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
  const unsigned below = (1u << lane) - 1u;
  const float v[4] = {x.x, x.y, x.z, x.w};
  float a[4];
  bool tail[4];
  int rank[4];
  int count = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j] = abs_bits(v[j]);
    tail[j] = active && erf_in_tail(a[j]);  // false for NaN
    const unsigned m = __ballot_sync(kFullMask, tail[j]);
    rank[j] = count + __popc(m & below);
    count += __popc(m);
    if (tail[j]) slots[rank[j]] = a[j];
  }
  __syncwarp();
  for (int r = lane; r < count; r += kWarp) slots[r] = erf_tail(slots[r]);
  __syncwarp();
  float e[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float y = tail[j] ? slots[rank[j]] : (a[j] < kErfSplit ? erf_small(a[j]) : 1.0f);
    e[j] = !active ? 0.0f : is_nan(v[j]) ? canonical_nan() : with_sign_of(y, v[j]);
  }
  __syncwarp();  // every lane has read its results before the caller's next call writes slots
  return make_float4(e[0], e[1], e[2], e[3]);
}

}  // namespace mxlab::cuda
