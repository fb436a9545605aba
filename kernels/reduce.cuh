// Launchers of the deterministic reductions: batched dot / squared-difference sums, column
// sums over rows (bias and layernorm parameter gradients) and moments. No float atomics:
// every reduction is two passes, per-block partials in double written to a scratch buffer,
// then one block (or one thread per column) adding the partials in a fixed order. How the
// work is split depends only on the shapes, so a repeated call gives identical bits.
// Scratch sizes are queried first (the backend grows its buffers outside graph capture).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// ---- 1-D partition shared by reduce, moments and the MSE loss ----
struct Partition1D {
  int64_t per_block = 0;  // elements per block (a multiple of the block size)
  int blocks = 0;         // blocks (= partials); 0 when n == 0
};
Partition1D partition_1d(int64_t n);

// ---- batched reductions: results[i] = sum over reqs[i] (double) ----
// Scratch: reduce_scratch_doubles(reqs, count) doubles; `d_results` holds `count` doubles.
int64_t reduce_scratch_doubles(const Reduction* reqs, size_t count);
void launch_reduce(const Reduction* reqs, size_t count, double* scratch, double* d_results, cudaStream_t s);

// ---- column sums over rows of (rows, d) ----
// out[j] = (float) sum_i x[i, j]. Scratch: col_sum_scratch_doubles(rows, d, 1).
int64_t col_sum_scratch_doubles(int64_t rows, int64_t d, int outputs);
void launch_col_sum(const float* x, float* out, int64_t rows, int64_t d, double* scratch, cudaStream_t s);
// Layernorm parameter gradients: dgamma[j] = (float) sum_i dot_term(dy, xhat), dbeta[j] =
// (float) sum_i dy (either may be null), dy read through dy_in. Scratch: col_sum_scratch_doubles(rows, d, 2).
void launch_col_sum_ln(const float* dy, const float* xhat, float* dgamma, float* dbeta, int64_t rows, int64_t d,
                       double* scratch, cudaStream_t s, const ElementwiseRound& dy_in = ElementwiseRound{});

// ---- *d_out = (double) *x: a float's value queued with deferred results (Backend::defer_scalar) ----
void launch_widen_scalar(const float* x, double* d_out, cudaStream_t s);

// ---- moments: d_out[0..4) = min, max, mean, population std of x[0..n) ----
// Scratch: moments_scratch_doubles(n).
int64_t moments_scratch_doubles(int64_t n);
void launch_moments(const float* x, int64_t n, double* scratch, double* d_out, cudaStream_t s);

}  // namespace mxlab::cuda
