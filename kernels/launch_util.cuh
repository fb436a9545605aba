// Launch helpers shared by the element-wise, layernorm, loss and reduction kernels: grid
// sizing, the 16-byte alignment test that picks the float4 path, and fixed-order (hence
// run-to-run bit-identical) double reductions within a warp and a block. Device helpers are
// header-only so that each kernel file inlines them.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.cuh"

namespace mxlab::cuda {

constexpr int kWarp = 32;
constexpr int kBlock = 256;               // threads per block of the 1-D kernels
constexpr int64_t kMaxGrid = 1 << 20;     // grid-stride loops above this many blocks
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Blocks of `block` threads for `items` work items (at least one block, at most kMaxGrid).
inline int grid_for(int64_t items, int block = kBlock) {
  const int64_t g = (items + block - 1) / block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(g, kMaxGrid)));
}

// float4 loads and stores need 16-byte aligned addresses. cudaMalloc returns 256-byte aligned
// buffers, but the model passes slices of a flat parameter buffer at arbitrary offsets.
inline bool aligned16(const void* p) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Sum over the warp with an xor butterfly. Addition is commutative, so partners compute
// bit-identical values at every stage: every lane ends with the same sum, and the order
// (hence the rounding) depends only on the lane assignment, never on timing.
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Block-wide sum in a fixed order: warps reduce by butterfly, then warp 0 adds the warp
// sums in warp order. `smem` holds BLOCK/32 doubles. The result is valid in thread 0 only.
template <int BLOCK>
__device__ __forceinline__ double block_sum(double v, double* smem) {
  static_assert(BLOCK % kWarp == 0 && BLOCK <= 1024, "block must be whole warps");
  constexpr int kWarps = BLOCK / kWarp;
  v = warp_sum(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += smem[w];
  }
  __syncthreads();  // smem may be reused by the caller
  return total;
}

}  // namespace mxlab::cuda
