// Deterministic two-pass reductions (see reduce.cuh). Element i of a 1-D reduction is added
// by thread (i mod per_block) mod kBlock of block i / per_block, in increasing i; blocks are
// combined by block_sum's fixed tree, partials by a strided sum then the same tree. Scalar
// (not float4) loads keep that order independent of a pointer's alignment.
#include "kernels/reduce.cuh"

#include <cmath>

#include "kernels/elementwise.cuh"
#include "kernels/launch_util.cuh"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

// 8 elements per thread: enough blocks to fill the GPU at n = 1M (512 blocks) while each
// thread's dependent chain of double adds stays short.
constexpr int64_t kChunkPerBlock = 2048;  // elements per block of a 1-D partial pass
constexpr int kMaxPartials = 4096;        // blocks of a 1-D partial pass, at most
constexpr int kReduceBatch = 32;          // requests per launch (passed by value as a parameter)

// Column sums: a block covers kColTile columns x chunk_rows rows with kColTile x kColLanes
// threads; each thread adds every kColLanes-th row of its chunk.
constexpr int kColTile = 32;
constexpr int kColLanes = 8;
constexpr int64_t kColChunkRows = 64;
constexpr int64_t kMaxColChunks = 32768;  // grid.y limit with margin

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t col_chunk_rows(int64_t rows) {
  // Grow the chunk (in multiples of kColLanes) only for very tall inputs, so that grid.y fits.
  return std::max<int64_t>(kColChunkRows, ceil_div(ceil_div(rows, kMaxColChunks), kColLanes) * kColLanes);
}

// Sum of partials[0..count) by one block: thread t adds t, t+BLOCK, ... then block_sum.
__device__ double sum_partials(const double* partials, int64_t count, double* smem) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) s += partials[i];
  return block_sum<kBlock>(s, smem);
}

// ---- batched dot / diff_sq ----

struct ReduceReq {
  const float* a;
  const float* b;
  int64_t n;
  int64_t per_block;
  int64_t offset;  // first partial of this request in the scratch
  int blocks;
  int kind;
};
struct ReduceBatch {
  ReduceReq r[kReduceBatch];
};

__global__ void __launch_bounds__(kBlock) reduce_partial_kernel(ReduceBatch batch, double* partials) {
  __shared__ double smem[kBlock / kWarp];
  const ReduceReq& q = batch.r[blockIdx.y];
  if (static_cast<int>(blockIdx.x) >= q.blocks) return;  // uniform per block
  const int64_t begin = blockIdx.x * q.per_block;
  const int64_t end = std::min(q.n, begin + q.per_block);
  double s = 0.0;
  if (q.kind == Reduction::dot) {
    for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) s += dot_term(q.a[i], q.b[i]);
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) s += diff_sq_term(q.a[i], q.b[i]);
  }
  s = block_sum<kBlock>(s, smem);
  if (threadIdx.x == 0) partials[q.offset + blockIdx.x] = s;
}

__global__ void __launch_bounds__(kBlock) reduce_final_kernel(ReduceBatch batch, const double* partials,
                                                              double* results) {
  __shared__ double smem[kBlock / kWarp];
  const ReduceReq& q = batch.r[blockIdx.x];
  const double s = sum_partials(partials + q.offset, q.blocks, smem);
  if (threadIdx.x == 0) results[blockIdx.x] = s;
}

// ---- column sums ----

template <bool LN>
__global__ void __launch_bounds__(kColTile* kColLanes)
    col_partial_kernel(const float* x, const float* xhat, int64_t rows, int64_t d, int64_t chunk_rows,
                       double* partials, bool xb, Rounding xm) {
  __shared__ double s0[kColLanes][kColTile];
  __shared__ double s1[kColLanes][kColTile];
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = std::min(rows, r0 + chunk_rows);
  double a0 = 0.0, a1 = 0.0;
  if (c < d) {
    for (int64_t r = r0 + ty; r < r1; r += kColLanes) {
      const float v = ew_round(x[r * d + c], xb, xm);  // x read through its input rounding
      if (LN) a1 += dot_term(v, xhat[r * d + c]);
      a0 += static_cast<double>(v);
    }
  }
  s0[ty][tx] = a0;
  if (LN) s1[ty][tx] = a1;
  __syncthreads();
  if (ty == 0 && c < d) {
    double t0 = 0.0, t1 = 0.0;
#pragma unroll
    for (int k = 0; k < kColLanes; ++k) {
      t0 += s0[k][tx];
      if (LN) t1 += s1[k][tx];
    }
    const int64_t chunks = gridDim.y;
    partials[blockIdx.y * d + c] = t0;
    if (LN) partials[(chunks + blockIdx.y) * d + c] = t1;
  }
}

// out0[j] = sum over chunks of partials[chunk, j]; out1 likewise from the second plane.
// One warp per column: lane l adds chunks l, l + 32, ..., then the butterfly (a thread per
// column walking all chunks serially was latency-bound: 12 us for 32 chunks).
constexpr int kColFinalWarps = kBlock / kWarp;
__global__ void __launch_bounds__(kBlock) col_final_kernel(const double* partials, int64_t chunks, int64_t d,
                                                           float* out0, float* out1) {
  const int lane = threadIdx.x % kWarp;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColFinalWarps + threadIdx.x / kWarp;
  if (c >= d) return;  // whole warp
  double s0 = 0.0, s1 = 0.0;
  for (int64_t k = lane; k < chunks; k += kWarp) {
    if (out0) s0 += partials[k * d + c];
    if (out1) s1 += partials[(chunks + k) * d + c];
  }
  s0 = warp_sum(s0);
  s1 = warp_sum(s1);
  if (lane == 0) {
    if (out0) out0[c] = static_cast<float>(s0);
    if (out1) out1[c] = static_cast<float>(s1);
  }
}

// ---- moments ----
// Pass 1: per block (min, max, sum) -> partials[3b..3b+3); final 1: min, max, mean into out.
// Pass 2: per block sum (x - mean)^2 (mean read from out[2]); final 2: std into out[3].

__global__ void __launch_bounds__(kBlock) moments_partial1(const float* x, int64_t n, int64_t per_block,
                                                           double* partials) {
  __shared__ double smem[kBlock / kWarp];
  __shared__ float smin[kBlock], smax[kBlock];
  const int64_t begin = blockIdx.x * per_block, end = std::min(n, begin + per_block);
  double s = 0.0;
  float mn = INFINITY, mx = -INFINITY;
  for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
    const float v = x[i];
    s += static_cast<double>(v);
    mn = fminf(mn, v);
    mx = fmaxf(mx, v);
  }
  smin[threadIdx.x] = mn;
  smax[threadIdx.x] = mx;
  s = block_sum<kBlock>(s, smem);  // contains __syncthreads
  if (threadIdx.x == 0) {
    for (int t = 0; t < kBlock; ++t) {  // min/max are exact: any order gives the same result
      mn = fminf(mn, smin[t]);
      mx = fmaxf(mx, smax[t]);
    }
    partials[3 * blockIdx.x] = mn;
    partials[3 * blockIdx.x + 1] = mx;
    partials[3 * blockIdx.x + 2] = s;
  }
}

__global__ void __launch_bounds__(kBlock) moments_final1(const double* partials, int blocks, int64_t n, double* out) {
  __shared__ double smem[kBlock / kWarp];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < blocks; i += kBlock) s += partials[3 * i + 2];
  s = block_sum<kBlock>(s, smem);
  if (threadIdx.x == 0) {
    double mn = partials[0], mx = partials[1];
    for (int b = 1; b < blocks; ++b) {
      mn = fmin(mn, partials[3 * b]);
      mx = fmax(mx, partials[3 * b + 1]);
    }
    out[0] = mn;
    out[1] = mx;
    out[2] = s / static_cast<double>(n);
  }
}

__global__ void __launch_bounds__(kBlock) moments_partial2(const float* x, int64_t n, int64_t per_block,
                                                           const double* out, double* partials) {
  __shared__ double smem[kBlock / kWarp];
  const double mean = out[2];
  const int64_t begin = blockIdx.x * per_block, end = std::min(n, begin + per_block);
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
    const double e = static_cast<double>(x[i]) - mean;
    s += e * e;
  }
  s = block_sum<kBlock>(s, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kBlock) moments_final2(const double* partials, int blocks, int64_t n, double* out) {
  __shared__ double smem[kBlock / kWarp];
  const double s = sum_partials(partials, blocks, smem);
  if (threadIdx.x == 0) out[3] = sqrt(s / static_cast<double>(n));
}

__global__ void zero_moments(double* out) {
  if (threadIdx.x < 4) out[threadIdx.x] = 0.0;
}

}  // namespace

Partition1D partition_1d(int64_t n) {
  Partition1D p;
  if (n <= 0) return p;
  p.per_block = kChunkPerBlock;
  if (ceil_div(n, p.per_block) > kMaxPartials) p.per_block = ceil_div(ceil_div(n, kMaxPartials), kBlock) * kBlock;
  p.blocks = static_cast<int>(ceil_div(n, p.per_block));
  return p;
}

int64_t reduce_scratch_doubles(const Reduction* reqs, size_t count) {
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += std::max(1, partition_1d(reqs[i].n).blocks);
  return total;
}

void launch_reduce(const Reduction* reqs, size_t count, double* scratch, double* d_results, cudaStream_t s) {
  int64_t offset = 0;
  for (size_t first = 0; first < count; first += kReduceBatch) {
    const int m = static_cast<int>(std::min<size_t>(kReduceBatch, count - first));
    ReduceBatch batch{};
    int max_blocks = 1;
    for (int k = 0; k < m; ++k) {
      const Reduction& q = reqs[first + k];
      const Partition1D p = partition_1d(q.n);
      ReduceReq& r = batch.r[k];
      r = ReduceReq{q.a, q.b, q.n, p.per_block, offset, p.blocks, static_cast<int>(q.kind)};
      offset += std::max(1, p.blocks);
      max_blocks = std::max(max_blocks, p.blocks);
    }
    reduce_partial_kernel<<<dim3(max_blocks, m), kBlock, 0, s>>>(batch, scratch);
    MXLAB_CUDA_LAUNCH_CHECK();
    // A request with n == 0 has no partials: the final pass sums an empty range (0.0).
    reduce_final_kernel<<<m, kBlock, 0, s>>>(batch, scratch, d_results + first);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
}

int64_t col_sum_scratch_doubles(int64_t rows, int64_t d, int outputs) {
  return std::max<int64_t>(1, ceil_div(rows, col_chunk_rows(rows))) * d * outputs;
}

namespace {
template <bool LN>
void col_sum_impl(const float* x, const float* xhat, float* out0, float* out1, int64_t rows, int64_t d,
                  double* scratch, cudaStream_t s, const ElementwiseRound& x_in = ElementwiseRound{}) {
  if (d <= 0) return;
  if (rows <= 0) {  // empty sum: zeros
    if (out0) launch_fill(out0, 0.0f, d, s);
    if (out1) launch_fill(out1, 0.0f, d, s);
    return;
  }
  const int64_t chunk = col_chunk_rows(rows);
  const int64_t chunks = ceil_div(rows, chunk);
  const dim3 grid(static_cast<unsigned>(ceil_div(d, kColTile)), static_cast<unsigned>(chunks));
  col_partial_kernel<LN><<<grid, kColTile * kColLanes, 0, s>>>(x, xhat, rows, d, chunk, scratch, x_in.bf16, x_in.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
  col_final_kernel<<<grid_for(d, kColFinalWarps), kBlock, 0, s>>>(scratch, chunks, d, out0, out1);
  MXLAB_CUDA_LAUNCH_CHECK();
}
}  // namespace

void launch_col_sum(const float* x, float* out, int64_t rows, int64_t d, double* scratch, cudaStream_t s) {
  col_sum_impl<false>(x, nullptr, out, nullptr, rows, d, scratch, s);
}

void launch_col_sum_ln(const float* dy, const float* xhat, float* dgamma, float* dbeta, int64_t rows, int64_t d,
                       double* scratch, cudaStream_t s, const ElementwiseRound& dy_in) {
  if (!dgamma && !dbeta) return;
  // Plane 0 holds sum dy (dbeta), plane 1 sum dy * xhat (dgamma).
  col_sum_impl<true>(dy, xhat, dbeta, dgamma, rows, d, scratch, s, dy_in);
}

namespace {
__global__ void widen_scalar_kernel(const float* x, double* out) { *out = static_cast<double>(*x); }
}  // namespace

void launch_widen_scalar(const float* x, double* d_out, cudaStream_t s) {
  widen_scalar_kernel<<<1, 1, 0, s>>>(x, d_out);
  MXLAB_CUDA_LAUNCH_CHECK();
}

int64_t moments_scratch_doubles(int64_t n) { return 3 * std::max(1, partition_1d(n).blocks); }

void launch_moments(const float* x, int64_t n, double* scratch, double* d_out, cudaStream_t s) {
  if (n <= 0) {
    zero_moments<<<1, kWarp, 0, s>>>(d_out);
    MXLAB_CUDA_LAUNCH_CHECK();
    return;
  }
  const Partition1D p = partition_1d(n);
  moments_partial1<<<p.blocks, kBlock, 0, s>>>(x, n, p.per_block, scratch);
  MXLAB_CUDA_LAUNCH_CHECK();
  moments_final1<<<1, kBlock, 0, s>>>(scratch, p.blocks, n, d_out);
  MXLAB_CUDA_LAUNCH_CHECK();
  moments_partial2<<<p.blocks, kBlock, 0, s>>>(x, n, p.per_block, d_out, scratch);
  MXLAB_CUDA_LAUNCH_CHECK();
  moments_final2<<<1, kBlock, 0, s>>>(scratch, p.blocks, n, d_out);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
