// The block Hadamard rotation kernels (hadamard.cuh). A thread block holds whole Hadamard blocks
// in shared memory: the contiguous kernel a run of kChunk consecutive floats (whole blocks, since
// n divides kChunk), the strided kernel a tile of n rows by up to 32 columns. Loads and stores are
// coalesced; the butterflies of each stage run in parallel between barriers.
#include "kernels/hadamard.cuh"

#include "kernels/cuda_check.cuh"
#include "kernels/launch_util.cuh"
#include "lab/core/error.h"
#include "lab/mx/scalar.h"

namespace mxlab::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = kMaxRotationBlock;   // floats per thread block, contiguous kernel
constexpr int kTileFloats = 8192;           // floats per thread block, strided kernel
constexpr int kTileCols = 32;               // columns of a strided tile (fewer for n > 256)
static_assert(kChunk % kMaxRotationBlock == 0, "a chunk must hold whole Hadamard blocks");
static_assert(kTileFloats >= kMaxRotationBlock * 2, "a strided tile must hold two columns of the largest block");

struct Signs {
  bool random;
  uint64_t seed;
  uint32_t salt;
  const uint32_t* d_step;
};

__device__ __forceinline__ float load_signed(const float* in, int64_t idx, bool bf16_first, Rounding mode,
                                             const Signs& sg, uint32_t salt, int64_t k) {
  float v = in[idx];
  if (bf16_first) v = round_bf16(v, mode);
  return rotation_signed(v, sg.random, sg.seed, salt, k);
}

// Blocks along each row: the flat tensor is a sequence of n-float blocks (cols is a multiple of n).
__global__ void rotate_contiguous(const float* in, float* out, int64_t total, int64_t cols, int64_t period, int n,
                                  float scale, Signs sg, bool bf16_first, Rounding mode) {
  __shared__ float sm[kChunk];
  const uint32_t salt = sg.d_step ? *sg.d_step : sg.salt;
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t base = c * kChunk;
    const int len = static_cast<int>(total - base < kChunk ? total - base : kChunk);  // whole blocks
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      const int64_t p = base + i;
      sm[i] = load_signed(in, p, bf16_first, mode, sg, salt, (p % cols) % period);
    }
    const int half = n / 2;
    for (int h = 1; h < n; h *= 2) {
      __syncthreads();
      for (int t = threadIdx.x; t < len / 2; t += blockDim.x) {
        const int i = (t / half) * n + hadamard_pair_first(t % half, h);
        hadamard_butterfly(sm[i], sm[i + h]);
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < len; i += blockDim.x) out[base + i] = hadamard_output(sm[i], scale);
    __syncthreads();  // sm is refilled by the next chunk
  }
}

// Blocks down each column: tiles of n rows x tc columns (rows is a multiple of n).
__global__ void rotate_strided(const float* in, float* out, int64_t rows, int64_t cols, int64_t period, int n, int tc,
                               float scale, Signs sg, bool bf16_first, Rounding mode) {
  __shared__ float sm[kTileFloats];
  const uint32_t salt = sg.d_step ? *sg.d_step : sg.salt;
  const int64_t col_tiles = (cols + tc - 1) / tc;
  const int64_t tiles = (rows / n) * col_tiles;
  const int size = n * tc;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = (tile / col_tiles) * n, c0 = (tile % col_tiles) * tc;
    for (int idx = threadIdx.x; idx < size; idx += blockDim.x) {
      const int i = idx / tc;
      const int64_t col = c0 + idx % tc;
      sm[idx] = col < cols ? load_signed(in, (r0 + i) * cols + col, bf16_first, mode, sg, salt, (r0 + i) % period)
                           : 0.0f;  // beyond the last column: computed, never stored
    }
    const int half = n / 2;
    for (int h = 1; h < n; h *= 2) {
      __syncthreads();
      for (int t = threadIdx.x; t < half * tc; t += blockDim.x) {
        const int c = t % tc, i = hadamard_pair_first(t / tc, h);
        hadamard_butterfly(sm[i * tc + c], sm[(i + h) * tc + c]);
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < size; idx += blockDim.x) {
      const int64_t col = c0 + idx % tc;
      if (col < cols) out[(r0 + idx / tc) * cols + col] = hadamard_output(sm[idx], scale);
    }
    __syncthreads();
  }
}

}  // namespace

void hadamard_rotate(const RotateLaunch& L, cudaStream_t s) {
  if (L.rows < 0 || L.cols < 0) throw Error(msg("hadamard_rotate: negative shape ", L.rows, " x ", L.cols));
  const int64_t length = L.axis == Axis::contiguous ? L.cols : L.rows;
  if (const char* problem = rotation_shape_problem(length, L.period, L.r); *problem)
    throw Error(msg("hadamard_rotate: ", problem, " (block ", L.r.block, ", reduction length ", L.period, ", length ",
                    length, ")"));
  if (L.rows == 0 || L.cols == 0) return;
  if (!L.in || !L.out) throw Error("hadamard_rotate: null tensor");
  const int n = L.r.block;
  const float scale = hadamard_scale(n);
  const Signs sg{L.r.random_signs, L.r.seed, L.r.salt, L.d_step};
  if (L.axis == Axis::contiguous) {
    const int64_t total = L.rows * L.cols;
    rotate_contiguous<<<grid_for(total, kChunk), kThreads, 0, s>>>(L.in, L.out, total, L.cols, L.period, n, scale, sg,
                                                                   L.round_bf16_first, L.bf16_mode);
  } else {
    const int tc = n <= kTileFloats / kTileCols ? kTileCols : kTileFloats / n;
    const int64_t tiles = (L.rows / n) * ((L.cols + tc - 1) / tc);
    rotate_strided<<<grid_for(tiles, 1), kThreads, 0, s>>>(L.in, L.out, L.rows, L.cols, L.period, n, tc, scale, sg,
                                                           L.round_bf16_first, L.bf16_mode);
  }
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
