// Flash attention in bf16 (see flash_attention.cuh). Two sets of kernels, with the same bits:
//   tiled      (the backend's): a block per (item, group of 16 query rows or keys), a warp per row
//              or key, K/V (Q/dO) staged in shared memory as bf16 and each logit computed once;
//              every lane runs the pieces of lab/model/flash_attention_tiled.h, whose composition in
//              this order tests/cpu/test_flash_tiled.cpp checks against the scalar functions on
//              the CPU (that header says why each piece keeps the scalar order of every sum).
//   reference  one thread per query row or key calling fa_fwd_row / fa_delta_row / fa_bwd_key /
//              fa_bwd_query of lab/model/flash_attention.h: the launchers use them where the tiled
//              ones do not apply (dh > kFaMaxDh, or more shared memory than the device has), and
//              bench/bench_flash_gpu.cu times the tiled kernels against them.
#include "kernels/flash_attention.cuh"

#include <algorithm>
#include <atomic>

#include "kernels/launch_util.cuh"
#include "lab/model/flash_attention.h"
#include "lab/model/flash_attention_tiled.h"

namespace mxlab::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Reference kernels: one thread per row or key.

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

// Thread i: delta of row i (delta_lp or delta_hp, as the backward uses it) and delta_hp. Used by
// both backwards.
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

// ---------------------------------------------------------------------------------------------
// Tiled kernels: blockIdx.x = item, blockIdx.y = group of FaPlan::per_block rows or keys; warp w
// owns rows (keys) w * kFaPerWarp + j of the group. Shared memory (dynamic) per kernel below.

constexpr int kFaThreads = kFaWarps * kFaLanes;

__device__ __forceinline__ float* fa_smem() {
  extern __shared__ float4 fa_smem_raw[];
  return reinterpret_cast<float*>(fa_smem_raw);
}

// Rows [r0, r1) of one item's [S x dh] tensor src into dst (row r at dst + (r - r0) * ld), as bf16;
// a warp per row, lanes over its columns (coalesced reads).
__device__ __forceinline__ void fa_stage(float* dst, int ld, const float* src, int r0, int r1, int dh) {
  const int lane = threadIdx.x % kFaLanes, warp = threadIdx.x / kFaLanes;
  for (int r = r0 + warp; r < r1; r += kFaWarps) {
    const float* s = src + static_cast<int64_t>(r) * dh;
    float* d = dst + (r - r0) * ld;
    for (int c = lane; c < dh; c += kFaLanes) d[c] = fa_bf16(s[c]);
  }
}

// The tile maximum over the warp (xor butterfly; fa_max_combine is commutative and associative, so
// every lane ends with the same value, the one any order gives).
__device__ __forceinline__ FaTileMax fa_warp_max(FaTileMax m) {
#pragma unroll
  for (int o = kFaLanes / 2; o > 0; o >>= 1) {
    FaTileMax x;
    x.v = __shfl_xor_sync(kFullMask, m.v, o);
    x.idx = __shfl_xor_sync(kFullMask, m.idx, o);
    x.count = __shfl_xor_sync(kFullMask, m.count, o);
    m = fa_max_combine(m, x);
  }
  return m;
}

__device__ __forceinline__ int fa_warp_count(int c) {
#pragma unroll
  for (int o = kFaLanes / 2; o > 0; o >>= 1) c += __shfl_xor_sync(kFullMask, c, o);
  return c;
}

// Forward. Shared memory: P [per_block x bc] FaPair (each row's tile: logits, then (p, bf16 p)),
// Ks [chunk x ld], Vs [chunk x dh], Qs [per_block x dh]. A key tile is staged in chunks of
// plan.chunk keys: all its logits first (K chunks), then its statistics, then l and O (V chunks;
// staged with K when the tile is one chunk).
__global__ void __launch_bounds__(kFaThreads, 4)
    flash_fwd_tiled_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           float* o, float* o_hp, float* lse, float* rowmax, float* row_stats, int S, int dh,
                           float scale, Backend::FlashSpec f, FaPlan plan) {
  const int lane = threadIdx.x % kFaLanes, warp = threadIdx.x / kFaLanes;
  const int64_t item = blockIdx.x;
  // Heaviest groups first (causal rows further down see more keys).
  const int row0 = (gridDim.y - 1 - blockIdx.y) * plan.per_block;
  const int64_t off = item * S * dh;
  const int bc = plan.bc, chunk = plan.chunk, ld = plan.ld;
  FaPair* P = reinterpret_cast<FaPair*>(fa_smem());
  float* Ks = fa_smem() + 2 * plan.per_block * bc;
  float* Vs = Ks + chunk * ld;
  float* Qs = Vs + chunk * dh;
  const int row1 = min(row0 + plan.per_block, S);
  fa_stage(Qs, dh, q + off, row0, row1, dh);

  int keys[kFaPerWarp], ones[kFaPerWarp];
  FaRowState st[kFaPerWarp];
  float acc[kFaPerWarp][kFaMaxCols];
#pragma unroll
  for (int j = 0; j < kFaPerWarp; ++j) {
    const int r = row0 + warp * kFaPerWarp + j;
    keys[j] = r < S ? static_cast<int>(fa_keys(r, S, f.causal)) : 0;
    ones[j] = 0;
    st[j] = fa_row_start();
    fa_cols_zero(acc[j]);
  }
  const int kend = f.causal ? row1 : S;
  for (int c0 = 0; c0 < kend; c0 += bc) {
    const int tend = min(c0 + bc, kend);
    const bool one = tend - c0 <= chunk;
    for (int k0 = c0; k0 < tend; k0 += chunk) {
      const int k1 = min(k0 + chunk, tend);
      __syncthreads();
      fa_stage(Ks, ld, k + off, k0, k1, dh);
      if (one) fa_stage(Vs, dh, v + off, k0, k1, dh);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kFaPerWarp; ++j) {
        const int lr = warp * kFaPerWarp + j;
        if (c0 < keys[j])
          fa_fwd_logits_lane(lane, Qs + lr * dh, Ks, ld, k0, min(k1, keys[j]), c0, dh, scale, P + lr * bc);
      }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kFaPerWarp; ++j) {
      if (c0 >= keys[j]) continue;  // warp-uniform: the row has no visible key in this tile
      FaPair* pr = P + (warp * kFaPerWarp + j) * bc;
      const int n = min(c0 + bc, keys[j]) - c0;
      const FaTileMax tm = fa_warp_max(fa_tile_max_lane(lane, pr, n));
      const int rs = f.stabilized ? fa_warp_count(fa_tile_ties_lane(lane, pr, n, tm.v, f.eps)) : 0;
      const float alpha = fa_row_enter_tile(st[j], tm, rs, f);
      fa_fwd_rescale_lane(lane, dh, acc[j], alpha);
      ones[j] += fa_tile_probs_lane(lane, pr, n, st[j].m);
    }
    __syncwarp();
    for (int k0 = c0; k0 < tend; k0 += chunk) {
      const int k1 = min(k0 + chunk, tend);
      if (!one) {
        __syncthreads();
        fa_stage(Vs, dh, v + off, k0, k1, dh);
        __syncthreads();
      }
#pragma unroll
      for (int j = 0; j < kFaPerWarp; ++j) {
        const int lr = warp * kFaPerWarp + j;
        if (c0 < keys[j])
          fa_fwd_accumulate_lane(lane, dh, P + lr * bc, Vs, dh, k0, min(k1, keys[j]), c0, acc[j], &st[j].l);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kFaPerWarp; ++j) {
    if (keys[j] == 0) continue;
    const int64_t i = item * S + row0 + warp * kFaPerWarp + j;
    st[j].nones = fa_warp_count(ones[j]);
    fa_fwd_finish_lane(lane, dh, acc[j], st[j].l, o + i * dh, o_hp + i * dh);
    if (lane == 0) fa_row_finish(st[j], lse + i, rowmax + i, row_stats + i * Backend::kFlashRowStats);
  }
}

// dK, dV. Shared memory: PD [per_block x rchunk] FaPair (bf16 P-bar, dS of each key's rows),
// Kt, Vt [per_block x dh] (the group's keys), Qs, Ds [rchunk x ld] (a chunk of query rows of Q and
// dO), Ls, Es [rchunk] (their lse and delta). Rows run in increasing order, chunk after chunk.
__global__ void __launch_bounds__(kFaThreads, 3)  // 80 registers: 4 blocks (64) spill the 2 keys' dK, dV
    flash_bwd_key_tiled_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                               const float* __restrict__ dout, const float* __restrict__ lse,
                               const float* __restrict__ delta, float* dk, float* dv, int S, int dh, float scale,
                               Backend::FlashSpec f, FaPlan plan) {
  const int lane = threadIdx.x % kFaLanes, warp = threadIdx.x / kFaLanes;
  const int64_t item = blockIdx.x;
  const int t0 = blockIdx.y * plan.per_block;  // causal: the first groups see the most rows
  const int64_t off = item * S * dh;
  const int rc = plan.rchunk, ld = plan.ld;
  FaPair* PD = reinterpret_cast<FaPair*>(fa_smem());
  float* Kt = fa_smem() + 2 * plan.per_block * rc;
  float* Vt = Kt + plan.per_block * dh;
  float* Qs = Vt + plan.per_block * dh;
  float* Ds = Qs + rc * ld;
  float* Ls = Ds + rc * ld;
  float* Es = Ls + rc;
  const int t1 = min(t0 + plan.per_block, S);
  fa_stage(Kt, dh, k + off, t0, t1, dh);
  fa_stage(Vt, dh, v + off, t0, t1, dh);

  float dkacc[kFaPerWarp][kFaMaxCols], dvacc[kFaPerWarp][kFaMaxCols];
#pragma unroll
  for (int j = 0; j < kFaPerWarp; ++j) {
    fa_cols_zero(dkacc[j]);
    fa_cols_zero(dvacc[j]);
  }
  for (int r0 = f.causal ? t0 : 0; r0 < S; r0 += rc) {
    const int r1 = min(r0 + rc, S);
    __syncthreads();
    fa_stage(Qs, ld, q + off, r0, r1, dh);
    fa_stage(Ds, ld, dout + off, r0, r1, dh);
    for (int r = r0 + static_cast<int>(threadIdx.x); r < r1; r += kFaThreads) {
      Ls[r - r0] = lse[item * S + r];
      Es[r - r0] = delta[item * S + r];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kFaPerWarp; ++j) {
      const int lt = warp * kFaPerWarp + j, t = t0 + lt;
      const int rb = f.causal ? max(r0, t) : r0;
      if (t < t1 && rb < r1)
        fa_bwd_key_pds_lane(lane, Kt + lt * dh, Vt + lt * dh, Qs, Ds, ld, Ls, Es, r0, rb, r1, dh, scale, PD + lt * rc);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kFaPerWarp; ++j) {
      const int lt = warp * kFaPerWarp + j, t = t0 + lt;
      const int rb = f.causal ? max(r0, t) : r0;
      if (t < t1 && rb < r1) fa_bwd_key_accumulate_lane(lane, dh, PD + lt * rc, Qs, Ds, ld, r0, rb, r1, dkacc[j], dvacc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kFaPerWarp; ++j) {
    const int t = t0 + warp * kFaPerWarp + j;
    if (t >= t1) continue;
    const int64_t i = item * S + t;
    fa_bwd_key_finish_lane(lane, dh, dkacc[j], dvacc[j], scale, dk + i * dh, dv + i * dh);
  }
}

// dQ. Shared memory: DS [per_block x chunk] (each row's dS over a chunk of keys), Ks, Vs
// [chunk x ld], Qr, Dr [per_block x dh] (the group's rows of Q and dO). Keys run in increasing
// order, chunk after chunk; a key tile's part may span chunks (it lives in registers).
__global__ void __launch_bounds__(kFaThreads, 4)
    flash_bwd_query_tiled_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                 const float* __restrict__ dout, const float* __restrict__ lse,
                                 const float* __restrict__ delta, float* dq, int S, int dh, float scale,
                                 Backend::FlashSpec f, FaPlan plan) {
  const int lane = threadIdx.x % kFaLanes, warp = threadIdx.x / kFaLanes;
  const int64_t item = blockIdx.x;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * plan.per_block;
  const int64_t off = item * S * dh;
  const int chunk = plan.chunk, ld = plan.ld;
  float* DS = fa_smem();
  float* Ks = DS + plan.per_block * chunk;
  float* Vs = Ks + chunk * ld;
  float* Qr = Vs + chunk * ld;
  float* Dr = Qr + plan.per_block * dh;
  const int row1 = min(row0 + plan.per_block, S);
  fa_stage(Qr, dh, q + off, row0, row1, dh);
  fa_stage(Dr, dh, dout + off, row0, row1, dh);

  int keys[kFaPerWarp];
  float rlse[kFaPerWarp], rdelta[kFaPerWarp], part[kFaPerWarp][kFaMaxCols], dqacc[kFaPerWarp][kFaMaxCols];
#pragma unroll
  for (int j = 0; j < kFaPerWarp; ++j) {
    const int r = row0 + warp * kFaPerWarp + j;
    keys[j] = r < S ? static_cast<int>(fa_keys(r, S, f.causal)) : 0;
    rlse[j] = r < S ? lse[item * S + r] : 0.0f;
    rdelta[j] = r < S ? delta[item * S + r] : 0.0f;
    fa_cols_zero(part[j]);
    fa_cols_zero(dqacc[j]);
  }
  const int kend = f.causal ? row1 : S;
  for (int k0 = 0; k0 < kend; k0 += chunk) {
    const int k1 = min(k0 + chunk, kend);
    __syncthreads();
    fa_stage(Ks, ld, k + off, k0, k1, dh);
    fa_stage(Vs, ld, v + off, k0, k1, dh);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kFaPerWarp; ++j) {
      const int lr = warp * kFaPerWarp + j, e = min(k1, keys[j]);
      if (k0 < e)
        fa_bwd_query_ds_lane(lane, Qr + lr * dh, Dr + lr * dh, rlse[j], rdelta[j], Ks, Vs, ld, k0, e, dh, scale,
                             DS + lr * chunk);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kFaPerWarp; ++j) {
      const int lr = warp * kFaPerWarp + j, e = min(k1, keys[j]);
      if (k0 < e)
        fa_bwd_query_accumulate_lane(lane, dh, DS + lr * chunk, Ks, ld, k0, e, keys[j], plan.bc, part[j], dqacc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kFaPerWarp; ++j) {
    if (keys[j] == 0) continue;
    const int64_t i = item * S + row0 + warp * kFaPerWarp + j;
    fa_bwd_query_finish_lane(lane, dh, dqacc[j], scale, dq + i * dh);
  }
}

constexpr int64_t kDefaultSmem = 48 * 1024;

int64_t fwd_smem_bytes(const FaPlan& p, int64_t dh) { return 4 * fa_fwd_smem_floats(p, dh); }
int64_t bwd_key_smem_bytes(const FaPlan& p, int64_t dh) { return 4 * fa_bwd_key_smem_floats(p, dh); }
int64_t bwd_query_smem_bytes(const FaPlan& p, int64_t dh) { return 4 * fa_bwd_query_smem_floats(p, dh); }

// Whether a block may have `bytes` of dynamic shared memory on the current device (48 KB needs no
// opt-in; above it, the device's opt-in limit).
bool smem_fits(int64_t bytes) {
  if (bytes <= kDefaultSmem) return true;
  int dev = 0, optin = 0;
  MXLAB_CUDA_CHECK(cudaGetDevice(&dev));
  MXLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return bytes <= optin;
}

// Raises `kernel`'s dynamic shared memory limit to `bytes` where above 48 KB, once per kernel, device
// and size (the call is a host-side setting, not a stream operation; kept off the common shapes'
// path, which stay under 48 KB).
constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_smem_set[3][kMaxDevices];
void ensure_smem(const void* kernel, int which, int64_t bytes) {
  if (bytes <= kDefaultSmem) return;
  int dev = 0;
  MXLAB_CUDA_CHECK(cudaGetDevice(&dev));
  std::atomic<int64_t>* slot = dev < kMaxDevices ? &g_smem_set[which][dev] : nullptr;
  if (slot && slot->load() >= bytes) return;
  MXLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  if (slot) {
    int64_t cur = slot->load();
    while (cur < bytes && !slot->compare_exchange_weak(cur, bytes)) {
    }
  }
}

dim3 tiled_grid(int64_t items, int64_t S, const FaPlan& p) {
  return dim3(static_cast<unsigned>(items), static_cast<unsigned>((S + p.per_block - 1) / p.per_block));
}

bool tiled_shape_ok(int64_t items, int64_t S, int64_t dh) {
  return dh >= 1 && dh <= kFaMaxDh && S <= (int64_t{1} << 24) && items <= (int64_t{1} << 31) - 1 &&
         (S + kFaWarps * kFaPerWarp - 1) / (kFaWarps * kFaPerWarp) <= 65535;
}

}  // namespace

bool flash_fwd_tiled(int64_t items, int64_t S, int64_t dh, const Backend::FlashSpec& f) {
  return tiled_shape_ok(items, S, dh) && f.bc >= 1 && smem_fits(fwd_smem_bytes(fa_plan(S, dh, f.bc), dh));
}

bool flash_bwd_tiled(int64_t items, int64_t S, int64_t dh, const Backend::FlashSpec& f) {
  if (!tiled_shape_ok(items, S, dh) || f.bc < 1) return false;
  const FaPlan p = fa_plan(S, dh, f.bc);
  return smem_fits(bwd_key_smem_bytes(p, dh)) && smem_fits(bwd_query_smem_bytes(p, dh));
}

void launch_flash_attn_fwd_reference(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                                     float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                                     const Backend::FlashSpec& f, cudaStream_t s) {
  const int64_t n = items * S;
  if (n <= 0) return;
  flash_fwd_kernel<<<grid_of(n), kFlashBlock, 0, s>>>(q, k, v, o, o_hp, lse, rowmax, row_stats, items, S, dh, scale,
                                                       f);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                           float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, cudaStream_t s) {
  if (items * S <= 0) return;
  if (!flash_fwd_tiled(items, S, dh, f)) {
    launch_flash_attn_fwd_reference(q, k, v, o, o_hp, lse, rowmax, row_stats, items, S, dh, scale, f, s);
    return;
  }
  const FaPlan p = fa_plan(S, dh, f.bc);
  const int64_t smem = fwd_smem_bytes(p, dh);
  ensure_smem(reinterpret_cast<const void*>(&flash_fwd_tiled_kernel), 0, smem);
  flash_fwd_tiled_kernel<<<tiled_grid(items, S, p), kFaThreads, static_cast<size_t>(smem), s>>>(
      q, k, v, o, o_hp, lse, rowmax, row_stats, static_cast<int>(S), static_cast<int>(dh), scale, f, p);
  MXLAB_CUDA_LAUNCH_CHECK();
}

int64_t flash_bwd_scratch_floats(int64_t items, int64_t S, int64_t dh) { return items * S * dh; }

void launch_flash_attn_bwd_reference(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
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

void launch_flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                           const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                           float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, float* scratch, cudaStream_t s) {
  const int64_t n = items * S;
  if (n <= 0) return;
  if (!flash_bwd_tiled(items, S, dh, f)) {
    launch_flash_attn_bwd_reference(q, k, v, o, o_hp, dout, lse, dq, dk, dv, delta, delta_hp, items, S, dh, scale, f,
                                    scratch, s);
    return;
  }
  const FaPlan p = fa_plan(S, dh, f.bc);
  flash_delta_kernel<<<grid_of(n), kFlashBlock, 0, s>>>(o, o_hp, dout, delta, delta_hp, n, dh, f.delta_hp);
  MXLAB_CUDA_LAUNCH_CHECK();
  const int64_t key_smem = bwd_key_smem_bytes(p, dh), query_smem = bwd_query_smem_bytes(p, dh);
  ensure_smem(reinterpret_cast<const void*>(&flash_bwd_key_tiled_kernel), 1, key_smem);
  ensure_smem(reinterpret_cast<const void*>(&flash_bwd_query_tiled_kernel), 2, query_smem);
  const dim3 grid = tiled_grid(items, S, p);
  flash_bwd_key_tiled_kernel<<<grid, kFaThreads, static_cast<size_t>(key_smem), s>>>(
      q, k, v, dout, lse, delta, dk, dv, static_cast<int>(S), static_cast<int>(dh), scale, f, p);
  MXLAB_CUDA_LAUNCH_CHECK();
  flash_bwd_query_tiled_kernel<<<grid, kFaThreads, static_cast<size_t>(query_smem), s>>>(
      q, k, v, dout, lse, delta, dq, static_cast<int>(S), static_cast<int>(dh), scale, f, p);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
