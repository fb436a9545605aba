// Attention-block and RMS/MX-norm kernels (see attention.cuh). Row kernels use one warp per
// row; lane l owns the elements l, l + 32, ... of its row in every pass, so an in-place call
// (probs == logits, dlogits == dprobs) never reads an element another lane has written.
#include "kernels/attention.cuh"

#include "kernels/launch_util.cuh"
#include "kernels/reduce.cuh"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

int grid_rows(int64_t rows) {
  return static_cast<int>(std::max<int64_t>(1, (rows + kRowsPerBlock - 1) / kRowsPerBlock));
}

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}

__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    rmsnorm_fwd_kernel(const float* x, const float* gamma, float* y, float* xhat, float* rstd, int64_t rows,
                       int64_t d, float eps, Backend::RmsEstimate est, bool rb, Rounding rm) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = warp_row();
  if (row >= rows) return;  // whole warp
  const float* xr = x + row * d;
  float ms;
  if (est.block > 0) {
    // MXNorm: lane l takes the blocks l, l + 32, ...; each block's absmax is exact.
    double sum = 0.0;
    const int64_t blocks = (d + est.block - 1) / est.block;
    for (int64_t b = lane; b < blocks; b += kWarp) {
      float m = 0.0f;
      const int64_t end = min(d, (b + 1) * est.block);
      for (int64_t j = b * est.block; j < end; ++j) m = fmaxf(m, fabsf(xr[j]));
      sum += est.p == 2 ? dot_term(m, m) : static_cast<double>(m);
    }
    sum = warp_sum(sum);
    ms = mxnorm_ms(sum, blocks, est.p, est.c, rb, rm);
  } else {
    double sq = 0.0;
    for (int64_t j = lane; j < d; j += kWarp) sq += dot_term(xr[j], xr[j]);
    sq = warp_sum(sq);
    ms = ew_round(mean_from_sum(sq, d), rb, rm);
  }
  const float rs = ln_rstd(ms, eps, rb, rm);
  if (lane == 0) rstd[row] = rs;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float h = ln_xhat(xr[j], rs, rb, rm);
    xhat[row * d + j] = h;
    y[row * d + j] = gamma ? mul_elem(h, gamma[j], rb, rm) : h;
  }
}

__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    rmsnorm_bwd_kernel(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                       int64_t rows, int64_t d, bool rb, Rounding rm) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = warp_row();
  if (row >= rows) return;
  const float* dyr = dy + row * d;
  const float* hr = xhat + row * d;
  double sgx = 0.0;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float g = gamma ? ln_bwd_g(dyr[j], gamma[j], rb, rm) : dyr[j];
    sgx += dot_term(g, hr[j]);
  }
  sgx = warp_sum(sgx);
  const float mgx = mean_from_sum(sgx, d);
  const float rs = rstd[row];
  for (int64_t j = lane; j < d; j += kWarp) {
    const float g = gamma ? ln_bwd_g(dyr[j], gamma[j], rb, rm) : dyr[j];
    dx[row * d + j] = rms_bwd_dx(rs, g, hr[j], mgx, rb, rm);
  }
}

__global__ void __launch_bounds__(kBlock)
    scale_cols_kernel(const float* x, const float* g, float* out, int64_t n, int64_t cols, bool rb, Rounding rm) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = mul_elem(x[i], g[i % cols], rb, rm);
}

__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    softmax_fwd_kernel(const float* logits, float* probs, float* rowmax, int64_t rows, int64_t n, float scale,
                       bool rb, Rounding rm) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = warp_row();
  if (row >= rows) return;
  const float* lr = logits + row * n;
  float m = -INFINITY;
  for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, attn_logit(lr[j], scale, rb, rm));
  m = warp_max(m);
  double sum = 0.0;
  for (int64_t j = lane; j < n; j += kWarp) sum += softmax_exp(attn_logit(lr[j], scale, rb, rm), m, rb, rm);
  sum = warp_sum(sum);
  float* pr = probs + row * n;
  for (int64_t j = lane; j < n; j += kWarp)
    pr[j] = softmax_prob(softmax_exp(attn_logit(lr[j], scale, rb, rm), m, rb, rm), sum, rb, rm);
  if (lane == 0) rowmax[row] = m;
}

__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    softmax_bwd_kernel(const float* probs, const float* dprobs, float* dlogits, int64_t rows, int64_t n, float scale,
                       bool rb, Rounding rm) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = warp_row();
  if (row >= rows) return;
  const float* pr = probs + row * n;
  const float* dpr = dprobs + row * n;
  double dot = 0.0;
  for (int64_t j = lane; j < n; j += kWarp) dot += dot_term(pr[j], dpr[j]);
  const float D = static_cast<float>(warp_sum(dot));
  float* dl = dlogits + row * n;
  for (int64_t j = lane; j < n; j += kWarp) dl[j] = softmax_bwd_elem(pr[j], dpr[j], D, scale, rb, rm);
}

// model.causal: -inf above the diagonal of each item's [S x S] logits, one thread per element.
__global__ void __launch_bounds__(kBlock) mask_causal_kernel(float* x, int64_t n, int64_t S) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i % S, r = (i / S) % S;
    if (t > r) x[i] = -INFINITY;
  }
}

// One thread per element of the heads layout (index decomposed as in backend.h).
__global__ void __launch_bounds__(kBlock)
    heads_copy_kernel(const float* src, float* dst, int64_t n, int64_t S, int64_t h, int64_t dh, int64_t ld,
                      int64_t col0, bool to_heads) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t c = i % dh, s = (i / dh) % S, bj = i / (dh * S), j = bj % h, b = bj / h;
    const int64_t xi = (b * S + s) * ld + col0 + j * dh + c;
    if (to_heads)
      dst[i] = src[xi];
    else
      dst[xi] = src[i];
  }
}

}  // namespace

void launch_rmsnorm_fwd(const float* x, const float* gamma, float* y, float* xhat, float* rstd, int64_t rows,
                        int64_t d, float eps, const Backend::RmsEstimate& est, const ElementwiseRound& r,
                        cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  rmsnorm_fwd_kernel<<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, y, xhat, rstd, rows, d, eps, est,
                                                                        r.bf16, r.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
}

int64_t rmsnorm_bwd_scratch_doubles(int64_t rows, int64_t d) { return col_sum_scratch_doubles(rows, d, 2); }

void launch_rmsnorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                        float* dgamma, int64_t rows, int64_t d, const ElementwiseRound& r, double* scratch,
                        cudaStream_t s) {
  if (d <= 0) return;
  if (rows > 0) {
    rmsnorm_bwd_kernel<<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, xhat, rstd, gamma, dx, rows, d, r.bf16,
                                                                          r.mode);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  if (dgamma) launch_col_sum_ln(dy, xhat, dgamma, nullptr, rows, d, scratch, s);
}

void launch_scale_cols(const float* x, const float* g, float* out, int64_t rows, int64_t cols,
                       const ElementwiseRound& r, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  scale_cols_kernel<<<grid_for(n), kBlock, 0, s>>>(x, g, out, n, cols, r.bf16, r.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_softmax_fwd(const float* logits, float* probs, float* rowmax, int64_t rows, int64_t n, float scale,
                        const ElementwiseRound& r, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  softmax_fwd_kernel<<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(logits, probs, rowmax, rows, n, scale, r.bf16,
                                                                        r.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_softmax_bwd(const float* probs, const float* dprobs, float* dlogits, int64_t rows, int64_t n,
                        float scale, const ElementwiseRound& r, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  softmax_bwd_kernel<<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(probs, dprobs, dlogits, rows, n, scale, r.bf16,
                                                                        r.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_mask_causal(float* x, int64_t items, int64_t S, cudaStream_t s) {
  const int64_t n = items * S * S;
  if (n <= 0) return;
  mask_causal_kernel<<<grid_for(n), kBlock, 0, s>>>(x, n, S);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_heads_copy(const float* src, float* dst, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                       int64_t col0, bool to_heads, cudaStream_t s) {
  const int64_t n = nb * h * S * dh;
  if (n <= 0) return;
  heads_copy_kernel<<<grid_for(n), kBlock, 0, s>>>(src, dst, n, S, h, dh, ld, col0, to_heads);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
