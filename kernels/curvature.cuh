// Launchers of the curvature ops of the CUDA backend (backend.h, "stability instruments"): the
// tangents of the activation, the layernorm affine, the layernorm backward and the KL loss,
// and the eigensolver's vector algebra. Each element evaluates the shared scalar code of
// lab/model/instrument_elementwise.h, so element-wise results equal the CPU backend's bit for
// bit; row sums are double in a fixed order (per-lane strided sums, then a warp butterfly), as
// in layernorm.cuh. All FP32, never rounded. Every launcher enqueues on `s` and checks the launch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// ra = act'(h) rh; swiglu: h, rh (rows, 2*cols), ra (rows, cols).
void launch_act_jvp(Act act, const float* h, const float* rh, float* ra, int64_t rows, int64_t cols, cudaStream_t s);

// rdh = act'(h) rda + (da act''(h)) rh; swiglu: h, rh, rdh (rows, 2*cols), da, rda (rows, cols).
void launch_act_bwd_tangent(Act act, const float* h, const float* rh, const float* da, const float* rda, float* rdh,
                            int64_t rows, int64_t cols, cudaStream_t s);

// ry (rows, d) = (rxhat gamma + xhat vgamma) + vbeta; rxhat may be null (zeros).
void launch_ln_affine_tangent(const float* rxhat, const float* xhat, const float* gamma, const float* vgamma,
                              const float* vbeta, float* ry, int64_t rows, int64_t d, cudaStream_t s);

// rdx (rows, d): the tangent of layernorm_bwd's dx (one warp per row).
void launch_layernorm_bwd_tangent(const float* dy, const float* rdy, const float* xhat, const float* rxhat,
                                  const float* rx, const float* rstd, const float* gamma, const float* vgamma,
                                  float* rdx, int64_t rows, int64_t d, cudaStream_t s);

// y = a x + b y (b == 0: a x); dst = a * b; out = P^{-1/2} of Adam's v.
void launch_axpby(float* y, const float* x, float a, float b, int64_t n, cudaStream_t s);
void launch_mul(float* dst, const float* a, const float* b, int64_t n, cudaStream_t s);
void launch_precond_isqrt(const float* v, float* out, int64_t n, float bc2, float eps, cudaStream_t s);

// rdout (rows, d): the KL loss Hessian in `out` applied to rout (one warp per row).
void launch_loss_kl_tangent(const float* out, const float* rout, float* rdout, int64_t rows, int64_t d,
                            float temperature, cudaStream_t s);

}  // namespace mxlab::cuda
