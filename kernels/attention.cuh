// Launchers of the attention-block and RMS/MX-norm ops of the CUDA backend (lab/model/backend.h,
// "attention blocks and RMS/MX norms"), with the per-element steps of lab/model/elementwise.h:
//   - rmsnorm_fwd / rmsnorm_bwd: one warp per row, like layernorm.cuh; row sums in double in a
//     fixed order (per-lane strided sums, then a warp butterfly), so they may differ from the
//     CPU's sequential sums in the last bits of a double only. MXNorm's block absmaxes are exact
//     (a max does not depend on the order); their p-th powers are summed like the squares.
//   - softmax_fwd / softmax_bwd: one warp per row; the row max is exact, the sums as above.
//   - scale_cols, heads_split / heads_merge, mask_causal: element-wise / copies, bit-exact.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// y, xhat (rows, d); rstd (rows); gamma (d) or null. est.block > 0: MXNorm's estimate.
void launch_rmsnorm_fwd(const float* x, const float* gamma, float* y, float* xhat, float* rstd, int64_t rows,
                        int64_t d, float eps, const Backend::RmsEstimate& est, const ElementwiseRound& r,
                        cudaStream_t s);
// dx (rows, d); dgamma (d) or null (column sums: launch_col_sum_ln's scratch,
// rmsnorm_bwd_scratch_doubles(rows, d) doubles).
int64_t rmsnorm_bwd_scratch_doubles(int64_t rows, int64_t d);
void launch_rmsnorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                        float* dgamma, int64_t rows, int64_t d, const ElementwiseRound& r, double* scratch,
                        cudaStream_t s);
// out (rows, cols) = R(x * g[col]); out may alias x.
void launch_scale_cols(const float* x, const float* g, float* out, int64_t rows, int64_t cols,
                       const ElementwiseRound& r, cudaStream_t s);
// probs (rows, n) = softmax(scale * logits) per row (probs may alias logits); rowmax (rows).
void launch_softmax_fwd(const float* logits, float* probs, float* rowmax, int64_t rows, int64_t n, float scale,
                        const ElementwiseRound& r, cudaStream_t s);
// dlogits (rows, n) from probs and dprobs (dlogits may alias dprobs).
void launch_softmax_bwd(const float* probs, const float* dprobs, float* dlogits, int64_t rows, int64_t n,
                        float scale, const ElementwiseRound& r, cudaStream_t s);
// model.causal: x [items x S x S] gets -inf where key t > query r, the rest untouched (exact).
void launch_mask_causal(float* x, int64_t items, int64_t S, cudaStream_t s);
// Token layout x [nb*S x ld] (columns col0 .. col0 + h*dh) <-> heads layout [nb*h x S x dh];
// to_heads: x -> heads (heads_split), else heads -> x (heads_merge).
void launch_heads_copy(const float* src, float* dst, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                       int64_t col0, bool to_heads, cudaStream_t s);

}  // namespace mxlab::cuda
