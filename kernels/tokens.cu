// Token-network kernels (see tokens.cuh): the CPU reference's loops of lab/cpu/cpu_backend.cpp,
// with the same scalar code (lab/model/elementwise.h, lab/core/philox.h) and the same sum order.
#include "kernels/tokens.cuh"

#include "kernels/launch_util.cuh"
#include "lab/core/detmath.h"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

constexpr int kEmbedChunk = 128;  // rows per chunk of embed_bwd's scan = columns per block
constexpr int kEmbedWarps = kEmbedChunk / kWarp;

// Sequence b: x = 0; for i: ids = x, x = successor(x, u of position b*S + i), targets = x.
__global__ void __launch_bounds__(kBlock)
    token_batch_kernel(float* ids, float* targets, int64_t sequences, int64_t S, int64_t vocab, uint64_t seed,
                       Stream stream, const StepScalars* d_step) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= sequences) return;
  const uint32_t step = d_step->step;
  int64_t x = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t r = b * S + i;
    ids[r] = static_cast<float>(x);
    x = token_successor(seed, vocab, x, u32_to_uniform(philox(seed, stream, step, static_cast<uint64_t>(r)).v[0]));
    targets[r] = static_cast<float>(x);
  }
}

__global__ void __launch_bounds__(kBlock)
    embed_fwd_kernel(const float* ids, const float* E, float* out, int64_t rows, int64_t d, int64_t vocab, bool rb,
                     Rounding rm) {
  const int64_t n = rows * d;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / d, c = i % d;
    const int64_t id = token_index(ids[r], vocab);
    out[i] = id < 0 ? detmath::canonical_nan() : ew_round(E[id * d + c], rb, rm);
  }
}

// Block (v, column group): thread t owns column c = group * 128 + t. Per chunk of 128 rows, thread t
// tests row r0 + t; the hits are listed in row order (each warp's ballot, placed after the earlier
// warps' hits), then every thread adds its column of the listed rows, in that order.
__global__ void __launch_bounds__(kEmbedChunk)
    embed_bwd_kernel(const float* ids, const float* dout, float* dE, int64_t rows, int64_t d, int64_t vocab) {
  __shared__ int list[kEmbedChunk];
  __shared__ int counts[kEmbedWarps];
  __shared__ int bad;
  const int64_t v = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kEmbedChunk + threadIdx.x;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  double acc = 0.0;
  for (int64_t r0 = 0; r0 < rows; r0 += kEmbedChunk) {
    const int64_t r = r0 + threadIdx.x;
    bool hit = false;
    if (r < rows) {
      const int64_t id = token_index(ids[r], vocab);
      if (id < 0) bad = 1;  // every writer writes 1
      hit = id == v;
    }
    const unsigned mask = __ballot_sync(kFullMask, hit);
    if (lane == 0) counts[warp] = __popc(mask);
    __syncthreads();
    int at = 0, total = 0;
    for (int w = 0; w < kEmbedWarps; ++w) {
      if (w < warp) at += counts[w];
      total += counts[w];
    }
    if (hit) list[at + __popc(mask & ((1u << lane) - 1u))] = threadIdx.x;
    __syncthreads();
    if (c < d)
      for (int k = 0; k < total; ++k) acc += static_cast<double>(dout[(r0 + list[k]) * d + c]);
    __syncthreads();  // the next chunk rewrites list and counts
  }
  if (c < d) dE[v * d + c] = bad ? detmath::canonical_nan() : static_cast<float>(acc);
}

}  // namespace

void launch_token_batch(float* ids, float* targets, int64_t sequences, int64_t S, int64_t vocab, uint64_t seed,
                        Stream stream, const StepScalars* d_step, cudaStream_t s) {
  if (sequences <= 0 || S <= 0) return;
  token_batch_kernel<<<grid_for(sequences), kBlock, 0, s>>>(ids, targets, sequences, S, vocab, seed, stream, d_step);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_embed_fwd(const float* ids, const float* E, float* out, int64_t rows, int64_t d, int64_t vocab,
                      const ElementwiseRound& r, cudaStream_t s) {
  const int64_t n = rows * d;
  if (n <= 0) return;
  embed_fwd_kernel<<<grid_for(n), kBlock, 0, s>>>(ids, E, out, rows, d, vocab, r.bf16, r.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_embed_bwd(const float* ids, const float* dout, float* dE, int64_t rows, int64_t d, int64_t vocab,
                      cudaStream_t s) {
  if (vocab <= 0 || d <= 0) return;
  const dim3 grid(static_cast<unsigned>(vocab), static_cast<unsigned>((d + kEmbedChunk - 1) / kEmbedChunk));
  embed_bwd_kernel<<<grid, kEmbedChunk, 0, s>>>(ids, dout, dE, rows, d, vocab);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
