// Launchers of layernorm forward and backward over the last axis of (rows, d) tensors, with
// the exact per-element steps of lab/model/elementwise.h (ln_center, ln_rstd, ln_xhat,
// ln_affine, ln_bwd_g, ln_bwd_dx). Row sums are double, in a fixed order (per-lane strided
// sums, then a warp butterfly), so they may differ from the CPU's sequential sums in the
// last bits of a double only; the parameter gradients use the deterministic column sums of
// reduce.cuh.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mx_produce.cuh"
#include "lab/model/backend.h"

namespace mxlab::cuda {

// Which backward kernel: automatic picks the register-resident one for d <= 512 (layernorm.cu);
// loop forces the row loop (for tests: both must give the same bits).
enum class LnKernel { automatic, loop };
// Whether automatic takes the register-resident backward for rows of d (given d % 4 == 0 and
// 16-byte aligned pointers).
bool layernorm_register_kernels_cover(int64_t d);

// y, xhat (rows, d); rstd (rows). gamma and beta (d) are both set or both null.
// pq (optional): also write y's MX quantization (kernels/mx_produce.cuh) in the same pass.
// Returns whether it did: only for d % 32 == 0 and 16-byte aligned x, gamma, beta, y, xhat.
bool launch_layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xhat,
                          float* rstd, int64_t rows, int64_t d, float eps, const ElementwiseRound& r, cudaStream_t s,
                          const ProducedQuant* pq = nullptr);

// dx (rows, d); dgamma, dbeta (d) written (not accumulated), either may be null.
// Scratch: layernorm_bwd_scratch_doubles(rows, d) doubles.
int64_t layernorm_bwd_scratch_doubles(int64_t rows, int64_t d);
// dy is read through dy_in (a GEMM output left unrounded; ElementwiseRound{}: as it is).
void launch_layernorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                          float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                          const ElementwiseRound& dy_in, double* scratch, cudaStream_t s,
                          LnKernel kernel = LnKernel::automatic);

// The MX emulation library's layernorm in vector ops (Backend::layernorm_vec_fwd / _bwd): one
// thread per row (and per column for dgamma, dbeta) running lab/model/elementwise.h's
// ln_vec_fwd_row / ln_vec_bwd_row / ln_vec_bwd_col as the CPU does, so every double sum runs in the
// same order and the results equal the CPU's bit for bit. Slow (uncoalesced rows); the mode exists
// for fidelity to the paper's emulator, not for speed. dx must not alias dy.
void launch_layernorm_vec_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xn, float* vare,
                              int64_t rows, int64_t d, float eps, const ElementwiseRound& r, cudaStream_t s);
void launch_layernorm_vec_bwd(const float* dy, const float* xn, const float* vare, const float* gamma, float* dx,
                              float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                              const ElementwiseRound& dy_in, cudaStream_t s);

}  // namespace mxlab::cuda
