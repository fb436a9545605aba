// Loss kernels (see loss.cuh). MSE: pass 1 writes dout and per-block partial sums of
// diff_sq_term over the 1-D partition of reduce.cuh; pass 2 (one block) adds the partials in
// a fixed order and stores the loss. KL: one warp per row computes both softmaxes the way
// the CPU's softmax_row does (row max, double sum of exponentials, det_log of the sum) and the
// row's KL term; a final block adds the row terms in a fixed order. Cross-entropy: one warp per
// row, the CPU's sums in the CPU's order (bit-identical), a final warp adds the rows in order.
#include "kernels/loss.cuh"

#include "kernels/launch_util.cuh"
#include "kernels/reduce.cuh"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

constexpr int kKlRowsPerBlock = 4;

__device__ void store_loss(float loss, float* loss_out, float* loss_history, const StepScalars* d_step) {
  loss_out[0] = loss;
  if (loss_history) loss_history[d_step->step] = loss;
}

__global__ void __launch_bounds__(kBlock) mse_partial_kernel(const float* out, const float* target, float* dout,
                                                             int64_t n, int64_t per_block, float scale, bool rb,
                                                             Rounding rm, double* partials) {
  __shared__ double smem[kBlock / kWarp];
  const int64_t begin = blockIdx.x * per_block, end = std::min(n, begin + per_block);
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
    const float o = out[i], t = target[i];
    s += diff_sq_term(o, t);
    dout[i] = mse_grad_elem(o, t, scale, rb, rm);
  }
  s = block_sum<kBlock>(s, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// loss = mean_from_sum(sum of partials[0..count), denom).
__global__ void __launch_bounds__(kBlock) loss_final_kernel(const double* partials, int64_t count, int64_t denom,
                                                            float* loss_out, float* loss_history,
                                                            const StepScalars* d_step) {
  __shared__ double smem[kBlock / kWarp];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) s += partials[i];
  s = block_sum<kBlock>(s, smem);
  if (threadIdx.x == 0) store_loss(mean_from_sum(s, denom), loss_out, loss_history, d_step);
}

struct RowSoftmax {
  float max;      // row maximum of the logits z / T
  double sum;     // sum of kl_exp(logit, max), in double
  float log_sum;  // det_log((float)sum)
};

__device__ RowSoftmax row_softmax(const float* z, int64_t d, float temperature, int lane) {
  RowSoftmax r;
  float m = -INFINITY;
  for (int64_t j = lane; j < d; j += kWarp) m = fmaxf(m, kl_logit(z[j], temperature));
  r.max = warp_max(m);
  double s = 0.0;
  for (int64_t j = lane; j < d; j += kWarp) s += static_cast<double>(kl_exp(kl_logit(z[j], temperature), r.max));
  r.sum = warp_sum(s);
  r.log_sum = det_log(static_cast<float>(r.sum));
  return r;
}

__global__ void __launch_bounds__(kKlRowsPerBlock* kWarp)
    kl_row_kernel(const float* out, const float* target, float* dout, int64_t rows, int64_t d, float temperature,
                  float scale, bool rb, Rounding rm, double* row_terms) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kKlRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float* t = target + row * d;
  const float* o = out + row * d;
  const RowSoftmax P = row_softmax(t, d, temperature, lane);
  const RowSoftmax Q = row_softmax(o, d, temperature, lane);
  double acc = 0.0;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float lp = kl_logit(t[j], temperature), lq = kl_logit(o[j], temperature);
    const float p = kl_prob(kl_exp(lp, P.max), P.sum), q = kl_prob(kl_exp(lq, Q.max), Q.sum);
    acc += kl_term(p, kl_logprob(lp, P.max, P.log_sum), kl_logprob(lq, Q.max, Q.log_sum));
    dout[row * d + j] = kl_grad_elem(q, p, scale, rb, rm);
  }
  acc = warp_sum(acc);
  if (lane == 0) row_terms[row] = acc;
}

// Next-token cross-entropy, one warp per row, in the CPU's order: the row maximum by the CPU's scan
// (m = l[0], then m = l[j] > m ? l[j] : m in index order, so NaNs and signed zeros pick the CPU's
// value) and the double sum of the exponentials added in index order. Each 32-element window is
// loaded (and exponentiated) by the lanes at once, then every lane adds the window's values one
// after another through shuffles, so each lane holds the CPU's sum. Invalid target: NaN term and row.
__global__ void __launch_bounds__(kKlRowsPerBlock* kWarp)
    xent_row_kernel(const float* logits, const float* target, float* dlogits, int64_t rows, int64_t vocab,
                    float scale, bool rb, Rounding rm, double* row_terms) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kKlRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warp
  const float* l = logits + row * vocab;
  const int64_t t = token_index(target[row], vocab);
  float m = l[0];
  for (int64_t j0 = 0; j0 < vocab; j0 += kWarp) {
    const float x = j0 + lane < vocab ? l[j0 + lane] : 0.0f;
    const int n = static_cast<int>(min(static_cast<int64_t>(kWarp), vocab - j0));
    for (int k = 0; k < n; ++k) {
      const float y = __shfl_sync(kFullMask, x, k);
      m = y > m ? y : m;
    }
  }
  double S = 0.0;
  for (int64_t j0 = 0; j0 < vocab; j0 += kWarp) {
    const float e = j0 + lane < vocab ? kl_exp(l[j0 + lane], m) : 0.0f;
    const int n = static_cast<int>(min(static_cast<int64_t>(kWarp), vocab - j0));
    for (int k = 0; k < n; ++k) S += static_cast<double>(__shfl_sync(kFullMask, e, k));
  }
  const float ls = det_log(static_cast<float>(S));
  const float nan = detmath::canonical_nan();
  if (lane == 0) row_terms[row] = t < 0 ? static_cast<double>(nan) : -static_cast<double>(kl_logprob(l[t], m, ls));
  float* dl = dlogits + row * vocab;
  for (int64_t j = lane; j < vocab; j += kWarp)
    dl[j] = t < 0 ? nan : xent_grad_elem(kl_prob(kl_exp(l[j], m), S), j == t, scale, rb, rm);
}

// loss = mean_from_sum(terms[0] + terms[1] + ..., rows), added in row order (the CPU's), one warp
// loading 32 terms at a time.
__global__ void xent_final_kernel(const double* terms, int64_t rows, float* loss_out, float* loss_history,
                                  const StepScalars* d_step) {
  const int lane = threadIdx.x;
  double total = 0.0;
  for (int64_t i0 = 0; i0 < rows; i0 += kWarp) {
    const double x = i0 + lane < rows ? terms[i0 + lane] : 0.0;
    const int n = static_cast<int>(min(static_cast<int64_t>(kWarp), rows - i0));
    for (int k = 0; k < n; ++k) total += __shfl_sync(kFullMask, x, k);
  }
  if (lane == 0) store_loss(mean_from_sum(total, rows), loss_out, loss_history, d_step);
}

}  // namespace

int64_t loss_scratch_doubles(int64_t rows, int64_t d) {
  return std::max<int64_t>({1, rows, static_cast<int64_t>(partition_1d(rows * d).blocks)});
}

void launch_loss_mse(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
                     int64_t rows, int64_t d, const ElementwiseRound& r, const StepScalars* d_step, double* scratch,
                     cudaStream_t s) {
  const int64_t n = rows * d;
  const Partition1D p = partition_1d(n);
  if (p.blocks > 0) {
    mse_partial_kernel<<<p.blocks, kBlock, 0, s>>>(out, target, dout, n, p.per_block, mse_grad_scale(n), r.bf16,
                                                   r.mode, scratch);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  loss_final_kernel<<<1, kBlock, 0, s>>>(scratch, p.blocks, n, loss_out, loss_history, d_step);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_loss_kl(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
                    int64_t rows, int64_t d, float temperature, const ElementwiseRound& r, const StepScalars* d_step,
                    double* scratch, cudaStream_t s) {
  if (rows > 0) {
    const int grid = static_cast<int>((rows + kKlRowsPerBlock - 1) / kKlRowsPerBlock);
    kl_row_kernel<<<grid, kKlRowsPerBlock * kWarp, 0, s>>>(out, target, dout, rows, d, temperature,
                                                          kl_grad_scale(temperature, rows), r.bf16, r.mode, scratch);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  loss_final_kernel<<<1, kBlock, 0, s>>>(scratch, rows, rows, loss_out, loss_history, d_step);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_loss_xent(const float* logits, const float* target, float* dlogits, float* loss_out, float* loss_history,
                      int64_t rows, int64_t vocab, const ElementwiseRound& r, const StepScalars* d_step,
                      double* scratch, cudaStream_t s) {
  if (rows > 0 && vocab > 0) {
    const int grid = static_cast<int>((rows + kKlRowsPerBlock - 1) / kKlRowsPerBlock);
    xent_row_kernel<<<grid, kKlRowsPerBlock * kWarp, 0, s>>>(logits, target, dlogits, rows, vocab,
                                                            kl_grad_scale(1.0f, rows), r.bf16, r.mode, scratch);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  xent_final_kernel<<<1, kWarp, 0, s>>>(scratch, rows, loss_out, loss_history, d_step);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
