// CUDA quantization kernels; semantics in quantize.cuh. Every number is produced by the
// scalar code of lab/mx/scalar.h (the same functions the CPU reference calls: the float path
// quantize_element_fast for the deterministic roundings, the integer path for stochastic
// rounding, noise_element for noise, exactly as quantize_element() dispatches), so the only
// GPU-specific code here is the walk over blocks, the block amax and the counters. Tuning notes:
// kernels/PERF-quantize.md.
//
// Kernels (all grid-stride, one atomicAdd per counter per CTA at the end):
//   mx_contiguous_kernel   - blocks along rows, block size 8*G with G | 32 lanes per block: each
//       lane owns 8 consecutive elements (two 16-byte loads when rows are 16-byte aligned), the
//       block amax is a butterfly of G lanes, the next unit is loaded while the current one is
//       computed. k = 32 -> 4 lanes per block, 8 blocks per warp.
//   mx_strided_tile_kernel - blocks of 32 down columns, cols % 4 == 0 (the backward GEMMs'
//       operands): each lane owns a 4-row x 4-column tile (16-byte loads, a warp's 4 lanes of
//       a row read 64 contiguous bytes), 8 lanes stacked per block, the next tile loaded while
//       the current one is computed.
//   mx_strided_kernel      - other strided blocks (block <= kMaxStridedBlock, or rows that are
//       not 16-byte multiples): one thread per column of a block, loads of 32 consecutive floats
//       of one row per warp, the block staged in shared memory (own column only, no barrier).
//   mx_generic_kernel      - any other block size: one thread per block, two passes (correctness
//       path; not tuned).
//   scalar_fmt_kernel      - fp32 / bf16 / fp16 roles: element-wise.
// The MX kernels are templates over the element format (its constants fold into the scalar
// code), the rounding mode (each instance holds one element path) and, for the two tuned
// kernels, whether statistics are wanted (the instances without skip the lastbin/clamped
// bookkeeping).
#include "kernels/quantize.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/mx_produce.cuh"
#include "lab/core/error.h"
#include "lab/core/philox.h"
#include "lab/mx/scalar.h"

namespace mxlab::cuda {

namespace {

constexpr int kThreads = 256;          // CTA size of the contiguous, generic and element-wise kernels
constexpr int kStridedThreads = 128;   // columns per CTA in the shared-memory strided kernel
constexpr int kVec = 4;                // elements per thread and step in the element-wise kernels (one 16-byte load)
constexpr int kLaneElems = 8;          // elements per lane in the contiguous MX kernel (two 16-byte loads)
constexpr int kStridedBatch = 16;      // loads in flight per thread in the shared-memory strided kernel
constexpr int kMaxStridedBlock = 64;   // shared staging: 64 rows x 128 columns x 4 B = 32 KiB
constexpr int kTileBlock = 32;         // the strided tile kernel's block size (the default k): 8 lanes x 4 rows
constexpr int kTileRows = 4;           // rows per lane in the strided tile kernel
constexpr int kTileCols = 4;           // columns per lane (one 16-byte load per row)
constexpr int kTileLanesPerBand = kTileBlock / kTileRows;        // lanes stacked down one column block: 8
constexpr int kTileLanesPerRow = 32 / kTileLanesPerBand;         // lanes side by side in a row: 4
constexpr int kTileWarpCols = kTileLanesPerRow * kTileCols;      // columns per warp item: 16
constexpr int kTileMinCtas = 4;        // register cap (64): two 4 x 4 tiles (current, next) per lane
constexpr int kCtasPerSm = 8;          // grid size cap: enough resident warps to hide latency
constexpr int kStridedMinCtas = 8;    // register cap (64): 32 resident warps per SM to keep loads in flight
constexpr int kContigMinCtas = 4;     // register cap (64): 32 resident warps per SM
constexpr uint32_t kQuietNaN = kMxQuietNaN;  // what the CPU reference writes (quiet_NaN())
constexpr unsigned kFullMask = 0xFFFFFFFFu;

enum class OutKind : uint8_t { none, f32, bf16 };

struct KParams {
  const float* in;
  void* out;  // float* or uint16_t* (bf16 bits), null for statistics only
  OutKind out_kind;
  int64_t rows, cols;
  int block;
  ScaleRule rule;
  Rounding rounding;
  Bump bump;
  uint64_t seed;
  uint32_t salt;
  const uint32_t* d_step;
  bool round_first;
  Rounding bf16_mode;
  unsigned long long* stats;    // kStatWords counters or null
  unsigned long long* inexact;  // bf16-inexact counter or null
};

// Up to kMaxQuantBatch tensors quantized by one launch of the contiguous or the strided tile
// kernel (quantize_bf16_batch): blockIdx.y picks the tensor, and each tensor's CTAs stride
// through it. A single quantization is a batch of one. Passed as a __grid_constant__ parameter (read in place).
constexpr int kMaxQuantBatch = 8;
struct KBatch {
  KParams p[kMaxQuantBatch];
};

// Per-thread counts are 32-bit (registers are the scarce resource here): a thread sees at most
// total / (grid threads) elements, and the grid has >= 2048 threads, so they overflow only for
// tensors above 2^43 elements (launch() refuses those). CTA sums are 64-bit.
struct Counters {
  uint32_t n = 0, lastbin = 0, clamped = 0, nan_blocks = 0, blocks = 0, inexact = 0;
};
constexpr int64_t kMaxElements = int64_t{1} << 43;

__device__ __forceinline__ uint32_t step_salt(const KParams& p) { return p.d_step ? *p.d_step : p.salt; }

__device__ __forceinline__ float input_value(const KParams& p, float v) {
  return p.round_first ? round_bf16(v, p.bf16_mode) : v;
}

// One element under the rounding mode R (a template parameter, so each kernel instance holds
// only its own path): the float path for the deterministic modes, with the block's 2^-s and
// 2^s computed once per block, the integer path for stochastic rounding and noise_element for
// noise. Exactly what quantize_element() (the CPU reference's call) does for each mode.
template <Rounding R>
__device__ __forceinline__ ElemResult element(float v, int s, ElemScale sc, const ElemSpec& es, uint32_t rnd) {
  if constexpr (fast_rounding(R)) {
    return quantize_element_fast(v, sc, es, R);
  } else {
    return quantize_element(v, s, es, R, rnd);
  }
}

// bf16 bits of a dequantized value: round_bf16 (exact when the value is bf16-exact).
__device__ __forceinline__ uint16_t bf16_bits(float v) {
  return static_cast<uint16_t>(f32_bits(round_bf16(v, Rounding::nearest_even)) >> 16);
}

__device__ __forceinline__ bool bf16_inexact(float v) {
  const uint32_t b = f32_bits(v);
  return is_finite_bits(b) && (b & 0xFFFFu) != 0u;
}

__device__ __forceinline__ void store1(const KParams& p, int64_t idx, float v) {
  if (p.out_kind == OutKind::f32) {
    static_cast<float*>(p.out)[idx] = v;
  } else if (p.out_kind == OutKind::bf16) {
    static_cast<uint16_t*>(p.out)[idx] = bf16_bits(v);
  }
}

// Four consecutive outputs of the element-wise kernel; `vec`: the address is 16-byte (f32) /
// 8-byte (bf16) aligned.
__device__ __forceinline__ void store4(const KParams& p, int64_t idx, const float (&r)[kVec], int nv, bool vec) {
  if (p.out_kind == OutKind::none) return;
  if (vec && nv == kVec) {
    if (p.out_kind == OutKind::f32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p.out) + idx) = make_float4(r[0], r[1], r[2], r[3]);
    } else {
      const uint32_t lo = static_cast<uint32_t>(bf16_bits(r[0])) | (static_cast<uint32_t>(bf16_bits(r[1])) << 16);
      const uint32_t hi = static_cast<uint32_t>(bf16_bits(r[2])) | (static_cast<uint32_t>(bf16_bits(r[3])) << 16);
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + idx) = make_uint2(lo, hi);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j)
    if (j < nv) store1(p, idx + j, r[j]);
}

// Reduce the counters of the CTA and add them to the device counters: exact integer atomics,
// one per counter per CTA. Every thread of the CTA must call this.
__device__ void flush_counters(Counters c, const KParams& p) {
  __shared__ unsigned long long part[32][6];
  unsigned long long w[6] = {c.n, c.lastbin, c.clamped, c.nan_blocks, c.blocks, c.inexact};  // widened
#pragma unroll
  for (int i = 0; i < 6; ++i)
    for (int o = 16; o > 0; o >>= 1) w[i] += __shfl_xor_sync(kFullMask, w[i], o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0)
    for (int i = 0; i < 6; ++i) part[warp][i] = w[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    unsigned long long t[6] = {0, 0, 0, 0, 0, 0};
    for (int k = 0; k < nwarps; ++k)
      for (int i = 0; i < 6; ++i) t[i] += part[k][i];
    if (p.stats)
      for (int i = 0; i < kStatWords; ++i)
        if (t[i]) atomicAdd(p.stats + i, t[i]);
    if (p.inexact && t[5]) atomicAdd(p.inexact, t[5]);
  }
}

// ---- contiguous axis ----------------------------------------------------------------------
// A "unit" is one block: units are numbered row-major (row, block-in-row). When cols is a
// multiple of the block size the tensor is a flat array of blocks and no division is needed.
// Each lane owns kLaneElems = 8 consecutive elements of a unit (two 16-byte loads when `vec`),
// so G = block / 8 lanes share a block (k = 32: 4 lanes, 8 blocks per warp).
struct LaneSlice {
  int64_t off;  // flat index of the lane's first element
  int nv;       // how many of its 8 elements exist (0 past the end; fewer in a partial block)
  int nblock;   // elements in the whole block (the leader counts them)
};

__device__ __forceinline__ LaneSlice locate(const KParams& p, int64_t u, int64_t units, int64_t nb_row, int sub,
                                            bool flat) {
  LaneSlice ls{0, 0, 0};
  if (u >= units) return ls;
  if (flat) {
    ls.off = u * p.block + sub * kLaneElems;
    ls.nv = kLaneElems;
    ls.nblock = p.block;
  } else {
    const int64_t row = u / nb_row;
    const int64_t c0 = (u - row * nb_row) * p.block;
    const int64_t left = p.cols - (c0 + sub * kLaneElems);
    ls.off = row * p.cols + c0 + sub * kLaneElems;
    ls.nv = left <= 0 ? 0 : (left >= kLaneElems ? kLaneElems : static_cast<int>(left));
    const int64_t bl = p.cols - c0;
    ls.nblock = bl >= p.block ? p.block : static_cast<int>(bl);
  }
  return ls;
}

__device__ __forceinline__ void load8(const KParams& p, const LaneSlice& ls, bool vec, float (&v)[kLaneElems]) {
  if (vec && ls.nv == kLaneElems) {
    const float4 a = *reinterpret_cast<const float4*>(p.in + ls.off);
    const float4 b = *reinterpret_cast<const float4*>(p.in + ls.off + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) v[j] = j < ls.nv ? p.in[ls.off + j] : 0.0f;
  }
}

// Eight consecutive MX outputs; `vec`: the address is 16-byte (f32) / 8-byte (bf16) aligned.
__device__ __forceinline__ void store8(const KParams& p, int64_t idx, const float (&r)[kLaneElems], int nv, bool vec) {
  if (p.out_kind == OutKind::none) return;
  if (vec && nv == kLaneElems) {
    if (p.out_kind == OutKind::f32) {
      float4* o = reinterpret_cast<float4*>(static_cast<float*>(p.out) + idx);
      o[0] = make_float4(r[0], r[1], r[2], r[3]);
      o[1] = make_float4(r[4], r[5], r[6], r[7]);
    } else {
      uint2* o = reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + idx);
      o[0] = make_uint2(mx_bf16x2(r[0], r[1]), mx_bf16x2(r[2], r[3]));
      o[1] = make_uint2(mx_bf16x2(r[4], r[5]), mx_bf16x2(r[6], r[7]));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kLaneElems; ++j)
    if (j < nv) store1(p, idx + j, r[j]);
}

// The next unit's loads are issued before the current one is quantized, so every lane keeps
// 32 bytes in flight while it computes. kCount: statistics are wanted (p.stats != null); the
// instances without them skip the lastbin/clamped bookkeeping.
template <Elem E, Rounding R, bool kCount>
__global__ void __launch_bounds__(kThreads, kContigMinCtas)
    mx_contiguous_kernel(const __grid_constant__ KBatch batch, bool vec, bool flat) {
  const KParams p = batch.p[blockIdx.y];
  const ElemSpec es = device_elem_spec<E>();
  const int G = p.block / kLaneElems;  // lanes per block: a power of two <= 32 (checked by the launcher)
  const int lane = threadIdx.x & 31;
  const int sub = lane & (G - 1);
  const int groups_per_warp = 32 / G;
  const int grp = lane / G;
  const int64_t nb_row = (p.cols + p.block - 1) / p.block;
  const int64_t units = p.rows * nb_row;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t step = ((static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5) * groups_per_warp;
  const uint32_t salt = step_salt(p);
  constexpr bool draws = draws_word(R);
  Counters cnt;
  int64_t base = warp * groups_per_warp;
  LaneSlice cur = locate(p, base + grp, units, nb_row, sub, flat);
  float v[kLaneElems];
  load8(p, cur, vec, v);
  // `base` is warp-uniform, so every lane reaches the shuffles below.
  for (; base < units; base += step) {
    const LaneSlice nxt = locate(p, base + step + grp, units, nb_row, sub, flat);
    float w[kLaneElems];
    load8(p, nxt, vec, w);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) {
      v[j] = input_value(p, v[j]);
      amax = max_nan(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      if (o < G) amax = max_nan(amax, __shfl_xor_sync(kFullMask, amax, o));
    const int s = block_scale_exp(amax, es, p.rule, p.bump);
    const bool special = s == kScaleExpNaN;
    if (base + grp < units) {
      if (special) {
#pragma unroll
        for (int j = 0; j < kLaneElems; ++j) v[j] = bits_f32(kQuietNaN);
      } else {
        const ElemScale sc = elem_scale(s);
#pragma unroll
        for (int j = 0; j < kLaneElems; ++j) {
          if (j < cur.nv) {
            const uint32_t rnd = draws ? element_word(R, p.seed, salt, static_cast<uint64_t>(cur.off + j)) : 0u;
            const ElemResult e = element<R>(v[j], s, sc, es, rnd);
            if constexpr (kCount) {
              cnt.lastbin += e.lastbin;
              cnt.clamped += e.clamped;
            }
            v[j] = e.value;
          }
        }
      }
      if (kCount && sub == 0) {
        cnt.blocks += 1;
        cnt.n += static_cast<uint32_t>(cur.nblock);
        cnt.nan_blocks += special ? 1u : 0u;
      }
      if (p.inexact) {
#pragma unroll
        for (int j = 0; j < kLaneElems; ++j)
          if (j < cur.nv && bf16_inexact(v[j])) cnt.inexact += 1;
      }
      store8(p, cur.off, v, cur.nv, vec);
    }
    cur = nxt;
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) v[j] = w[j];
  }
  if (kCount || p.inexact) flush_counters(cnt, p);
}

// ---- strided axis -------------------------------------------------------------------------
// An "item" is (row band b of `block` rows, tile t of kStridedThreads columns); consecutive
// items are neighbouring tiles of one band. Dynamic shared memory: block x kStridedThreads floats.
template <Elem E, Rounding R>
__global__ void __launch_bounds__(kStridedThreads, kStridedMinCtas) mx_strided_kernel(KParams p) {
  const ElemSpec es = device_elem_spec<E>();
  extern __shared__ float tile[];  // [block][kStridedThreads]; each thread uses its own column
  const int tid = threadIdx.x;
  const int64_t nbands = (p.rows + p.block - 1) / p.block;
  const int64_t ntiles = (p.cols + kStridedThreads - 1) / kStridedThreads;
  const int64_t items = nbands * ntiles;
  const uint32_t salt = step_salt(p);
  constexpr bool draws = draws_word(R);
  const bool count = p.stats != nullptr;
  Counters cnt;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t b = item / ntiles;
    const int64_t col = (item - b * ntiles) * kStridedThreads + tid;
    if (col >= p.cols) continue;
    const int64_t r0 = b * p.block;
    const int64_t left = p.rows - r0;
    const int nv = left >= p.block ? p.block : static_cast<int>(left);
    const float* src = p.in + r0 * p.cols + col;
    float amax = 0.0f;
    for (int i0 = 0; i0 < nv; i0 += kStridedBatch) {
      float x[kStridedBatch];
#pragma unroll
      for (int j = 0; j < kStridedBatch; ++j) x[j] = i0 + j < nv ? src[static_cast<int64_t>(i0 + j) * p.cols] : 0.0f;
#pragma unroll
      for (int j = 0; j < kStridedBatch; ++j) {
        const float v = input_value(p, x[j]);
        amax = max_nan(amax, fabsf(v));
        if (i0 + j < nv) tile[(i0 + j) * kStridedThreads + tid] = v;
      }
    }
    const int s = block_scale_exp(amax, es, p.rule, p.bump);
    const bool special = s == kScaleExpNaN;
    const ElemScale sc = elem_scale(special ? 0 : s);
#pragma unroll 2
    for (int i = 0; i < nv; ++i) {
      const int64_t idx = (r0 + i) * p.cols + col;
      float r = bits_f32(kQuietNaN);
      if (!special) {
        const uint32_t rnd = draws ? element_word(R, p.seed, salt, static_cast<uint64_t>(idx)) : 0u;
        const ElemResult e = element<R>(tile[i * kStridedThreads + tid], s, sc, es, rnd);
        if (count) {
          cnt.lastbin += e.lastbin;
          cnt.clamped += e.clamped;
        }
        r = e.value;
      }
      if (p.inexact && bf16_inexact(r)) cnt.inexact += 1;
      store1(p, idx, r);
    }
    cnt.blocks += 1;
    cnt.n += static_cast<uint32_t>(nv);
    cnt.nan_blocks += special ? 1u : 0u;
  }
  if (p.stats || p.inexact) flush_counters(cnt, p);
}

// ---- strided axis, block size 32: 4 x 4 tiles per lane ---------------------------------------
// A warp item is (band b of 32 rows, group of 16 columns). Lane l owns columns 4 (l % 4) .. +3
// of the group and rows 4 (l / 4) .. +3 of the band: one 16-byte load per row (the 4 lanes of a
// row read 64 contiguous bytes; one load instruction covers 8 rows). The 8 lanes holding the
// same columns (l, l ^ 4, l ^ 8, ..., l ^ 28) finish each column's block amax with three
// shuffles. The next warp item's 4 loads are issued before the current one is computed (the
// layout of the contiguous kernel, transposed). Items of 512 elements (not 1024, as with 8 x 4
// tiles: kernels/PERF.md, "4 × 4 tiles per lane") give a [2048 x 512] operand 2048 warps with
// work, and the smaller tiles leave room for 4 CTAs per SM. Needs cols % 4 == 0, `in` 16-byte
// and `out` 16-byte (f32) / 8-byte (bf16) aligned (the launcher checks; other shapes take mx_strided_kernel).
struct TileSlice {
  int64_t off;  // flat index of the lane's first element (its first row, first column)
  int nv;       // of the lane's kTileRows rows, how many exist (0: the lane has nothing here)
  int band;     // rows in the whole band (the counting lanes use it)
};

__device__ __forceinline__ TileSlice locate_tile(const KParams& p, int64_t witem, int64_t witems, int64_t ngroups,
                                                 int lane) {
  TileSlice ts{0, 0, 0};
  if (witem >= witems) return ts;
  const int64_t b = witem / ngroups;
  const int64_t col = (witem - b * ngroups) * kTileWarpCols + (lane % kTileLanesPerRow) * kTileCols;
  const int64_t r0 = b * kTileBlock;
  const int64_t r = r0 + (lane / kTileLanesPerRow) * kTileRows;
  if (col >= p.cols || r >= p.rows) return ts;
  ts.off = r * p.cols + col;
  ts.nv = p.rows - r >= kTileRows ? kTileRows : static_cast<int>(p.rows - r);
  ts.band = p.rows - r0 >= kTileBlock ? kTileBlock : static_cast<int>(p.rows - r0);
  return ts;
}

__device__ __forceinline__ void load_tile(const KParams& p, const TileSlice& ts, float (&v)[kTileRows][kTileCols]) {
#pragma unroll
  for (int i = 0; i < kTileRows; ++i) {
    const float4 t = i < ts.nv ? *reinterpret_cast<const float4*>(p.in + ts.off + i * p.cols)
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v[i][0] = t.x; v[i][1] = t.y; v[i][2] = t.z; v[i][3] = t.w;
  }
}

template <Elem E, Rounding R, bool kCount>
__global__ void __launch_bounds__(kThreads, kTileMinCtas) mx_strided_tile_kernel(const __grid_constant__ KBatch batch) {
  const KParams p = batch.p[blockIdx.y];
  const ElemSpec es = device_elem_spec<E>();
  const int lane = threadIdx.x & 31;
  const int64_t nbands = (p.rows + kTileBlock - 1) / kTileBlock;
  const int64_t ngroups = (p.cols + kTileWarpCols - 1) / kTileWarpCols;
  const int64_t witems = nbands * ngroups;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const uint32_t salt = step_salt(p);
  constexpr bool draws = draws_word(R);
  Counters cnt;
  int64_t witem = warp;
  TileSlice cur = locate_tile(p, witem, witems, ngroups, lane);
  float v[kTileRows][kTileCols];
  load_tile(p, cur, v);
  // `witem` is warp-uniform, so every lane reaches the shuffles below.
  for (; witem < witems; witem += nwarps) {
    const TileSlice nxt = locate_tile(p, witem + nwarps, witems, ngroups, lane);
    float w[kTileRows][kTileCols];
    load_tile(p, nxt, w);
    float amax[kTileCols];
#pragma unroll
    for (int c = 0; c < kTileCols; ++c) amax[c] = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileRows; ++i)
#pragma unroll
      for (int c = 0; c < kTileCols; ++c) {
        v[i][c] = input_value(p, v[i][c]);
        amax[c] = max_nan(amax[c], fabsf(v[i][c]));
      }
#pragma unroll
    for (int c = 0; c < kTileCols; ++c)
#pragma unroll
      for (int o = kTileLanesPerRow; o < 32; o <<= 1) amax[c] = max_nan(amax[c], __shfl_xor_sync(kFullMask, amax[c], o));
    if (cur.nv > 0) {
      bool special[kTileCols];
      int s[kTileCols];
      ElemScale sc[kTileCols];
#pragma unroll
      for (int c = 0; c < kTileCols; ++c) {
        s[c] = block_scale_exp(amax[c], es, p.rule, p.bump);
        special[c] = s[c] == kScaleExpNaN;
        sc[c] = elem_scale(special[c] ? 0 : s[c]);
      }
#pragma unroll
      for (int i = 0; i < kTileRows; ++i) {
        if (i < cur.nv) {
          const int64_t idx = cur.off + i * p.cols;
          float r[kTileCols];
#pragma unroll
          for (int c = 0; c < kTileCols; ++c) {
            r[c] = bits_f32(kQuietNaN);
            if (!special[c]) {
              const uint32_t rnd = draws ? element_word(R, p.seed, salt, static_cast<uint64_t>(idx + c)) : 0u;
              const ElemResult e = element<R>(v[i][c], s[c], sc[c], es, rnd);
              if constexpr (kCount) {
                cnt.lastbin += e.lastbin;
                cnt.clamped += e.clamped;
              }
              r[c] = e.value;
            }
            if (p.inexact && bf16_inexact(r[c])) cnt.inexact += 1;
          }
          if (p.out_kind == OutKind::f32) {
            *reinterpret_cast<float4*>(static_cast<float*>(p.out) + idx) = make_float4(r[0], r[1], r[2], r[3]);
          } else if (p.out_kind == OutKind::bf16) {
            *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + idx) =
                make_uint2(mx_bf16x2(r[0], r[1]), mx_bf16x2(r[2], r[3]));
          }
        }
      }
      if (kCount && lane < kTileLanesPerRow) {  // the lanes holding each column group's first rows count its blocks
        cnt.blocks += kTileCols;
        cnt.n += static_cast<uint32_t>(kTileCols * cur.band);
#pragma unroll
        for (int c = 0; c < kTileCols; ++c) cnt.nan_blocks += special[c] ? 1u : 0u;
      }
    }
    cur = nxt;
#pragma unroll
    for (int i = 0; i < kTileRows; ++i)
#pragma unroll
      for (int c = 0; c < kTileCols; ++c) v[i][c] = w[i][c];
  }
  if (kCount || p.inexact) flush_counters(cnt, p);
}

// ---- any block size, either axis (one thread per block, two passes) -------------------------
__global__ void __launch_bounds__(kThreads) mx_generic_kernel(KParams p, ElemSpec es, Axis axis) {
  const bool contiguous = axis == Axis::contiguous;
  const int64_t lines = contiguous ? p.rows : p.cols;
  const int64_t length = contiguous ? p.cols : p.rows;
  const int64_t nb = (length + p.block - 1) / p.block;
  const int64_t total = lines * nb;
  const uint32_t salt = step_salt(p);
  Counters cnt;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // Strided: neighbouring threads take neighbouring columns (coalesced); contiguous: blocks.
    const int64_t line = contiguous ? u / nb : u % lines;
    const int64_t b = contiguous ? u % nb : u / lines;
    const int64_t begin = b * p.block;
    const int64_t end = begin + p.block < length ? begin + p.block : length;
    auto index = [&](int64_t pos) { return contiguous ? line * p.cols + pos : pos * p.cols + line; };
    float amax = 0.0f;
    bool special = false;
    for (int64_t q = begin; q < end; ++q) {
      const float v = input_value(p, p.in[index(q)]);
      special |= !is_finite_bits(f32_bits(v));
      amax = fmaxf(amax, fabsf(v));
    }
    const int s = block_scale_exp(special ? bits_f32(kQuietNaN) : amax, es, p.rule, p.bump);
    special = s == kScaleExpNaN;
    for (int64_t q = begin; q < end; ++q) {
      const int64_t idx = index(q);
      float r = bits_f32(kQuietNaN);
      if (!special) {
        const uint32_t rnd = element_word(p.rounding, p.seed, salt, static_cast<uint64_t>(idx));
        const ElemResult e = quantize_element(input_value(p, p.in[idx]), s, es, p.rounding, rnd);
        cnt.lastbin += e.lastbin;
        cnt.clamped += e.clamped;
        r = e.value;
      }
      if (p.inexact && bf16_inexact(r)) cnt.inexact += 1;
      store1(p, idx, r);
    }
    cnt.blocks += 1;
    cnt.n += static_cast<uint32_t>(end - begin);
    cnt.nan_blocks += special ? 1u : 0u;
  }
  if (p.stats || p.inexact) flush_counters(cnt, p);
}

// ---- fp32 / bf16 / fp16 roles (element-wise) ----------------------------------------------
__global__ void __launch_bounds__(kThreads) scalar_fmt_kernel(KParams p, NumFmt fmt, bool vec) {
  const int64_t n = p.rows * p.cols;
  Counters cnt;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    const int nv = n - i >= kVec ? kVec : static_cast<int>(n - i);
    float r[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (vec && nv == kVec) {
      const float4 t = *reinterpret_cast<const float4*>(p.in + i);
      r[0] = t.x; r[1] = t.y; r[2] = t.z; r[3] = t.w;
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (j < nv) r[j] = p.in[i + j];
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float v = input_value(p, r[j]);
      if (fmt == NumFmt::bf16) v = round_bf16(v, p.rounding);
      else if (fmt == NumFmt::fp16) v = round_fp16(v, p.rounding);
      r[j] = v;
      if (p.inexact && j < nv && bf16_inexact(v)) cnt.inexact += 1;
    }
    store4(p, i, r, nv, vec);
  }
  if (p.inexact) flush_counters(cnt, p);
}

__global__ void add_counter_kernel(unsigned long long* word, unsigned long long value) { *word += value; }

__global__ void __launch_bounds__(kThreads) round_bf16_kernel(float* x, int64_t n, Rounding mode, bool vec) {
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    if (vec && n - i >= kVec) {
      float4 t = *reinterpret_cast<float4*>(x + i);
      t.x = round_bf16(t.x, mode); t.y = round_bf16(t.y, mode);
      t.z = round_bf16(t.z, mode); t.w = round_bf16(t.w, mode);
      *reinterpret_cast<float4*>(x + i) = t;
    } else {
      for (int64_t j = i; j < n && j < i + kVec; ++j) x[j] = round_bf16(x[j], mode);
    }
  }
}

// ---- host side ------------------------------------------------------------------------------

int sm_count() {
  int dev = 0, sms = 0;
  MXLAB_CUDA_CHECK(cudaGetDevice(&dev));
  MXLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Enough CTAs for the work, at most ctas_per_sm per SM (the MX kernels pass how many of them
// fit on an SM at once, so that the whole grid is resident and strides through the work).
unsigned grid_for(int64_t work_items, int64_t items_per_cta, int ctas_per_sm = kCtasPerSm) {
  const int64_t want = (work_items + items_per_cta - 1) / items_per_cta;
  const int64_t cap = static_cast<int64_t>(sm_count()) * ctas_per_sm;
  return static_cast<unsigned>(want < 1 ? 1 : (want < cap ? want : cap));
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

KParams make_params(const QuantLaunch& L, const QuantSpec& q, void* out, OutKind kind, unsigned long long* stats,
                    unsigned long long* inexact) {
  KParams p;
  p.in = L.in;
  p.out = out;
  p.out_kind = out ? kind : OutKind::none;
  p.rows = L.rows;
  p.cols = L.cols;
  p.block = q.block;
  p.rule = q.rule;
  p.rounding = q.rounding;
  p.bump = q.bump;
  p.seed = q.seed;
  p.salt = q.salt;
  p.d_step = L.d_step;
  p.round_first = L.round_bf16_first;
  p.bf16_mode = L.bf16_mode;
  p.stats = stats;
  p.inexact = inexact;
  return p;
}

#define MXLAB_FOR_EACH_ELEM(CASE)                    \
  switch (elem) {                                    \
    case Elem::fp8_e4m3: CASE(Elem::fp8_e4m3); break; \
    case Elem::fp8_e5m2: CASE(Elem::fp8_e5m2); break; \
    case Elem::fp6_e3m2: CASE(Elem::fp6_e3m2); break; \
    case Elem::fp6_e2m3: CASE(Elem::fp6_e2m3); break; \
    case Elem::fp4_e2m1: CASE(Elem::fp4_e2m1); break; \
    case Elem::int8: CASE(Elem::int8); break;         \
    default: throw Error("quantize: unknown MX element format");  \
  }

// Kernel instances per (element format, rounding mode): the mode decides which element path
// (float or integer) the instance contains.
#define MXLAB_FOR_EACH_ROUNDING(CASE)                                     \
  switch (p.rounding) {                                                   \
    case Rounding::nearest_even: CASE(Rounding::nearest_even); break;     \
    case Rounding::nearest_away: CASE(Rounding::nearest_away); break;     \
    case Rounding::toward_zero: CASE(Rounding::toward_zero); break;       \
    case Rounding::stochastic: CASE(Rounding::stochastic); break;         \
    case Rounding::noise: CASE(Rounding::noise); break;                   \
    default: throw Error("quantize: unknown rounding mode");              \
  }

// Instances per rounding mode x with/without statistics (the stochastic and noise ones always
// count: they are not the fast path, and this halves their number).
#define MXLAB_FOR_EACH_ROUNDING_COUNT(CASE)                                      \
  switch (p.rounding) {                                                          \
    case Rounding::nearest_even:                                                 \
      if (count) CASE(Rounding::nearest_even, true); else CASE(Rounding::nearest_even, false); break;  \
    case Rounding::nearest_away:                                                 \
      if (count) CASE(Rounding::nearest_away, true); else CASE(Rounding::nearest_away, false); break;  \
    case Rounding::toward_zero:                                                  \
      if (count) CASE(Rounding::toward_zero, true); else CASE(Rounding::toward_zero, false); break;    \
    case Rounding::stochastic: CASE(Rounding::stochastic, true); break;           \
    case Rounding::noise: CASE(Rounding::noise, true); break;                     \
    default: throw Error("quantize: unknown rounding mode");                     \
  }

// The batch's tensors share the kernel instance: its element format, rounding, statistics or
// not (b.p[0]'s), and vec / flat.
template <Elem E>
void launch_contiguous(const KBatch& b, int n, unsigned grid, cudaStream_t s, bool vec, bool flat) {
  const KParams& p = b.p[0];
  const bool count = p.stats != nullptr;
  const dim3 g(grid, static_cast<unsigned>(n));
#define MXLAB_CASE(R, C) mx_contiguous_kernel<E, R, C><<<g, kThreads, 0, s>>>(b, vec, flat)
  MXLAB_FOR_EACH_ROUNDING_COUNT(MXLAB_CASE)
#undef MXLAB_CASE
}

template <Elem E>
void launch_strided_tile(const KBatch& b, int n, unsigned grid, cudaStream_t s) {
  const KParams& p = b.p[0];
  const bool count = p.stats != nullptr;
  const dim3 g(grid, static_cast<unsigned>(n));
#define MXLAB_CASE(R, C) mx_strided_tile_kernel<E, R, C><<<g, kThreads, 0, s>>>(b)
  MXLAB_FOR_EACH_ROUNDING_COUNT(MXLAB_CASE)
#undef MXLAB_CASE
}

template <Elem E>
void launch_strided(const KParams& p, unsigned grid, size_t smem, cudaStream_t s) {
#define MXLAB_CASE(R) mx_strided_kernel<E, R><<<grid, kStridedThreads, smem, s>>>(p)
  MXLAB_FOR_EACH_ROUNDING(MXLAB_CASE)
#undef MXLAB_CASE
}

// Which MX kernel quantizes L under q (and its grid and flags): the two tuned ones, which can
// also take a batch, or another.
enum class MxPath : uint8_t { contiguous, tile, other };
struct MxPlan {
  MxPath path = MxPath::other;
  unsigned grid = 1;    // for contiguous / tile
  int ctas_per_sm = 1;  // the kernel's resident CTAs per SM (the cap of grid)
  bool vec = false, flat = false;
};

MxPlan plan_mx(const QuantLaunch& L, const QuantSpec& q, const void* out, OutKind kind) {
  MxPlan m;
  const int k = q.block;
  const int G = k / kLaneElems;
  const bool lanes_ok = k % kLaneElems == 0 && G >= 1 && G <= 32 && (32 % G) == 0;
  const bool writes = out != nullptr && kind != OutKind::none;
  if (L.axis == Axis::contiguous && lanes_ok) {
    const uintptr_t out_align = kind == OutKind::f32 ? 16 : 8;
    m.path = MxPath::contiguous;
    m.vec = L.cols % kVec == 0 && aligned(L.in, 16) && (!writes || aligned(out, out_align));
    m.flat = L.cols % k == 0;
    const int64_t units = L.rows * ((L.cols + k - 1) / k);
    m.ctas_per_sm = kContigMinCtas;
    m.grid = grid_for(units, (kThreads / 32) * (32 / G), m.ctas_per_sm);
  } else if (L.axis == Axis::strided && k == kTileBlock && L.cols % kTileCols == 0 && aligned(L.in, 16) &&
             (!writes || aligned(out, kind == OutKind::f32 ? 16 : 8))) {
    m.path = MxPath::tile;
    const int64_t witems = ((L.rows + k - 1) / k) * ((L.cols + kTileWarpCols - 1) / kTileWarpCols);
    m.ctas_per_sm = kTileMinCtas;
    m.grid = grid_for(witems, kThreads / 32, m.ctas_per_sm);
  }
  return m;
}

// Launches the contiguous or tile kernel over b.p[0..n) (same instance, same vec / flat).
void launch_tuned(const MxPlan& m, const KBatch& b, int n, unsigned grid, Elem elem, cudaStream_t s) {
  if (m.path == MxPath::contiguous) {
#define MXLAB_LAUNCH_CONTIG(E) launch_contiguous<E>(b, n, grid, s, m.vec, m.flat)
    MXLAB_FOR_EACH_ELEM(MXLAB_LAUNCH_CONTIG)
#undef MXLAB_LAUNCH_CONTIG
  } else {
#define MXLAB_LAUNCH_TILE(E) launch_strided_tile<E>(b, n, grid, s)
    MXLAB_FOR_EACH_ELEM(MXLAB_LAUNCH_TILE)
#undef MXLAB_LAUNCH_TILE
  }
}

// One MX pass over the tensor under spec q (quantization and/or statistics).
void launch_mx(const QuantLaunch& L, const QuantSpec& q, void* out, OutKind kind, unsigned long long* stats,
               unsigned long long* inexact, cudaStream_t s) {
  MXLAB_ASSERT(q.block > 0, "quantize: block size ", q.block,
               " (configuration and `mxlab quantize --block-size` admit only positive sizes)");
  const KParams p = make_params(L, q, out, kind, stats, inexact);
  const Elem elem = mx_elem(q.fmt);
  const int k = q.block;
  const MxPlan m = plan_mx(L, q, out, kind);
  if (m.path != MxPath::other) {
    KBatch b{};
    b.p[0] = p;
    launch_tuned(m, b, 1, m.grid, elem, s);
  } else if (L.axis == Axis::strided && k <= kMaxStridedBlock) {
    const int64_t items = ((L.rows + k - 1) / k) * ((L.cols + kStridedThreads - 1) / kStridedThreads);
    const unsigned grid = grid_for(items, 1);
    const size_t smem = static_cast<size_t>(k) * kStridedThreads * sizeof(float);
#define MXLAB_LAUNCH_STRIDED(E) launch_strided<E>(p, grid, smem, s)
    MXLAB_FOR_EACH_ELEM(MXLAB_LAUNCH_STRIDED)
#undef MXLAB_LAUNCH_STRIDED
  } else {
    const int64_t lines = L.axis == Axis::contiguous ? L.rows : L.cols;
    const int64_t length = L.axis == Axis::contiguous ? L.cols : L.rows;
    const unsigned grid = grid_for(lines * ((length + k - 1) / k), kThreads);
    // (kElemSpecs read directly: nvcc rejects the HD accessor elem_spec() here.)
    mx_generic_kernel<<<grid, kThreads, 0, s>>>(p, kElemSpecs[static_cast<int>(elem)], L.axis);
  }
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_scalar_fmt(const QuantLaunch& L, void* out, OutKind kind, unsigned long long* inexact, cudaStream_t s) {
  const KParams p = make_params(L, L.q, out, kind, nullptr, inexact);
  const uintptr_t out_align = kind == OutKind::f32 ? 16 : 8;
  const bool vec = aligned(L.in, 16) && aligned(out, out_align);
  const unsigned grid = grid_for(L.rows * L.cols, static_cast<int64_t>(kThreads) * kVec);
  scalar_fmt_kernel<<<grid, kThreads, 0, s>>>(p, L.q.fmt, vec);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void validate(const QuantLaunch& L) {
  if (L.rows < 0 || L.cols < 0) throw Error(msg("quantize: negative shape (", L.rows, " x ", L.cols, ")"));
  if (L.rows > 0 && L.cols > 0 && !L.in) throw Error("quantize: null input pointer");
  if (L.rows > 0 && L.cols > kMaxElements / L.rows)
    throw Error(msg("quantize: tensor of ", L.rows, " x ", L.cols, " elements is larger than supported (2^43)"));
  // Before plan_mx (the batch plans before it launches); launch_mx checks every MX pass again.
  MXLAB_ASSERT(!is_mx(L.q.fmt) || L.q.block > 0, "quantize: block size ", L.q.block,
               " (configuration and `mxlab quantize --block-size` admit only positive sizes)");
}

// Statistics pass under stats_q (when not fused into the quantization pass).
void launch_stats(const QuantLaunch& L, cudaStream_t s) {
  if (is_mx(L.stats_q.fmt)) {
    launch_mx(L, L.stats_q, nullptr, OutKind::none, L.d_stats, nullptr, s);
  } else {
    // Like the CPU reference: a non-MX spec counts the elements and nothing else.
    add_counter_kernel<<<1, 1, 0, s>>>(L.d_stats + kStatN, static_cast<unsigned long long>(L.rows * L.cols));
    MXLAB_CUDA_LAUNCH_CHECK();
  }
}

void launch(const QuantLaunch& L, void* out, OutKind kind, cudaStream_t s) {
  validate(L);
  if (L.rows == 0 || L.cols == 0) return;
  const bool fuse = L.d_stats && is_mx(L.q.fmt) && same_spec(L.q, L.stats_q);
  // A separate statistics pass runs first: `out` may alias `in`.
  if (L.d_stats && !fuse) launch_stats(L, s);
  if (is_mx(L.q.fmt)) {
    launch_mx(L, L.q, out, kind, fuse ? L.d_stats : nullptr, L.d_inexact, s);
  } else {
    launch_scalar_fmt(L, out, kind, L.d_inexact, s);
  }
}

}  // namespace

void quantize_f32(const QuantLaunch& L, float* out, cudaStream_t s) {
  if (!out && L.rows * L.cols > 0) throw Error("quantize_f32: null output pointer");
  launch(L, out, OutKind::f32, s);
}

void quantize_bf16(const QuantLaunch& L, __nv_bfloat16* out, cudaStream_t s) {
  if (!out && L.rows * L.cols > 0) throw Error("quantize_bf16: null output pointer");
  launch(L, out, OutKind::bf16, s);
}

int quantize_bf16_batch(const QuantLaunch* Ls, __nv_bfloat16* const* outs, int n, cudaStream_t s) {
  // Launches that can share a grid: deterministic MX roundings through one of the two tuned
  // kernels, without statistics (those always take their own launch, as quantize_bf16 would).
  struct Item {
    int i;
    MxPlan m;
    Elem elem;
  };
  std::vector<Item> items;
  int launches = 0;
  for (int i = 0; i < n; ++i) {
    const QuantLaunch& L = Ls[i];
    if (!outs[i] && L.rows * L.cols > 0) throw Error("quantize_bf16_batch: null output pointer");
    validate(L);
    if (L.rows == 0 || L.cols == 0) continue;
    const MxPlan m = is_mx(L.q.fmt) ? plan_mx(L, L.q, outs[i], OutKind::bf16) : MxPlan{};
    if (m.path == MxPath::other || L.d_stats || !fast_rounding(L.q.rounding)) {
      launch(L, outs[i], OutKind::bf16, s);
      ++launches;
      continue;
    }
    items.push_back({i, m, mx_elem(L.q.fmt)});
  }
  // Greedy grouping in order: an item joins the first open group of its kernel instance.
  std::vector<bool> done(items.size(), false);
  for (size_t a = 0; a < items.size(); ++a) {
    if (done[a]) continue;
    KBatch b{};
    int count = 0;
    unsigned grid = 1;
    for (size_t c = a; c < items.size() && count < kMaxQuantBatch; ++c) {
      const Item& x = items[c];
      const Item& h = items[a];
      if (done[c] || x.m.path != h.m.path || x.elem != h.elem || Ls[x.i].q.rounding != Ls[h.i].q.rounding ||
          x.m.vec != h.m.vec || x.m.flat != h.m.flat)
        continue;
      const QuantLaunch& L = Ls[x.i];
      b.p[count++] = make_params(L, L.q, outs[x.i], OutKind::bf16, nullptr, L.d_inexact);
      grid = std::max(grid, x.m.grid);
      done[c] = true;
    }
    // One resident wave over the whole batch, as a single launch's grid is (grid_for's cap): each
    // CTA then strides through several units of its tensor, and the next unit's loads overlap the
    // current one's arithmetic. (grid.x = the largest tensor's own grid would oversubscribe the SMs
    // n times over, with about one unit per warp: measured 28 µs for 8 x 1 M elements.)
    const unsigned wave = static_cast<unsigned>(std::max(1, sm_count() * items[a].m.ctas_per_sm / count));
    launch_tuned(items[a].m, b, count, std::min(grid, wave), items[a].elem, s);
    MXLAB_CUDA_LAUNCH_CHECK();
    ++launches;
  }
  return launches;
}

void quant_stats(const QuantLaunch& L, cudaStream_t s) {
  validate(L);
  if (!L.d_stats || L.rows == 0 || L.cols == 0) return;
  launch_stats(L, s);
}

void round_bf16_inplace(float* x, int64_t n, Rounding mode, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec = aligned(x, 16);
  const unsigned grid = grid_for(n, static_cast<int64_t>(kThreads) * kVec);
  round_bf16_kernel<<<grid, kThreads, 0, s>>>(x, n, mode, vec);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
