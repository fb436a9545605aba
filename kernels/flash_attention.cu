// Flash attention in bf16 (see flash_attention.cuh): one thread per query row or key, each calling
// the scalar function of lab/model/flash_attention.h that the CPU reference calls for it.
#include "kernels/flash_attention.cuh"

#include "kernels/launch_util.cuh"
#include "lab/model/flash_attention.h"

namespace mxlab::cuda {

namespace {

constexpr int kFlashBlock = 64;  // threads per block: rows or keys are few (items * S) and heavy

__device__ __forceinline__ int64_t flash_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// Thread i = b*S + r: query row r of item b.
__global__ void __launch_bounds__(kFlashBlock)
    flash_fwd_kernel(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse, float* rowmax,
                     float* row_stats, int64_t items, int64_t S, int64_t dh, float scale, Backend::FlashSpec f) {
  const int64_t i = flash_index();
  if (i >= items * S) return;
  const int64_t b = i / S, r = i % S, off = b * S * dh;
  fa_fwd_row(q + off, k + off, v + off, S, dh, scale, f, r, o + i * dh, o_hp + i * dh, lse + i, rowmax + i,
             row_stats + i * Backend::kFlashRowStats);
}

// Thread i: delta of row i (delta_lp or delta_hp, as the backward uses it) and delta_hp.
__global__ void __launch_bounds__(kFlashBlock)
    flash_delta_kernel(const float* o, const float* o_hp, const float* dout, float* delta, float* delta_hp, int64_t n,
                       int64_t dh, bool use_hp) {
  const int64_t i = flash_index();
  if (i >= n) return;
  float lp, hp;
  fa_delta_row(dout + i * dh, o + i * dh, o_hp + i * dh, dh, &lp, &hp);
  delta[i] = use_hp ? hp : lp;
  delta_hp[i] = hp;
}

// Thread i = b*S + t: dK and dV of key t of item b.
__global__ void __launch_bounds__(kFlashBlock)
    flash_bwd_key_kernel(const float* q, const float* k, const float* v, const float* dout, const float* lse,
                         const float* delta, float* dk, float* dv, int64_t items, int64_t S, int64_t dh, float scale,
                         Backend::FlashSpec f) {
  const int64_t i = flash_index();
  if (i >= items * S) return;
  const int64_t b = i / S, t = i % S, off = b * S * dh;
  fa_bwd_key(q + off, k + off, v + off, dout + off, lse + b * S, delta + b * S, S, dh, scale, f, t, dk + i * dh,
             dv + i * dh);
}

// Thread i = b*S + r: dQ of query row r of item b; part: its own dh floats of scratch.
__global__ void __launch_bounds__(kFlashBlock)
    flash_bwd_query_kernel(const float* q, const float* k, const float* v, const float* dout, const float* lse,
                           const float* delta, float* dq, float* part, int64_t items, int64_t S, int64_t dh,
                           float scale, Backend::FlashSpec f) {
  const int64_t i = flash_index();
  if (i >= items * S) return;
  const int64_t b = i / S, r = i % S, off = b * S * dh;
  fa_bwd_query(q + off, k + off, v + off, dout + off, lse + b * S, delta + b * S, S, dh, scale, f, r, dq + i * dh,
               part + i * dh);
}

int grid_of(int64_t n) { return grid_for(n, kFlashBlock); }

}  // namespace

void launch_flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                           float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, cudaStream_t s) {
  const int64_t n = items * S;
  if (n <= 0) return;
  flash_fwd_kernel<<<grid_of(n), kFlashBlock, 0, s>>>(q, k, v, o, o_hp, lse, rowmax, row_stats, items, S, dh, scale,
                                                       f);
  MXLAB_CUDA_LAUNCH_CHECK();
}

int64_t flash_bwd_scratch_floats(int64_t items, int64_t S, int64_t dh) { return items * S * dh; }

void launch_flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                           const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                           float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, float* scratch, cudaStream_t s) {
  const int64_t n = items * S;
  if (n <= 0) return;
  flash_delta_kernel<<<grid_of(n), kFlashBlock, 0, s>>>(o, o_hp, dout, delta, delta_hp, n, dh, f.delta_hp);
  MXLAB_CUDA_LAUNCH_CHECK();
  flash_bwd_key_kernel<<<grid_of(n), kFlashBlock, 0, s>>>(q, k, v, dout, lse, delta, dk, dv, items, S, dh, scale, f);
  MXLAB_CUDA_LAUNCH_CHECK();
  flash_bwd_query_kernel<<<grid_of(n), kFlashBlock, 0, s>>>(q, k, v, dout, lse, delta, dq, scratch, items, S, dh,
                                                            scale, f);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
