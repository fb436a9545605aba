// Launchers of the element-wise ops of the CUDA backend (fill, bf16 rounding, Gaussian
// samples, activations, residual add, add). Each element evaluates the shared scalar code of
// lab/model/elementwise.h, so the results equal the CPU backend's bit for bit. Every launcher
// enqueues on `s`, checks the launch, and reads step-dependent scalars from the device copy
// of StepScalars (`d_step`), never by value, so a captured graph stays valid across steps.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mx_produce.cuh"
#include "lab/model/backend.h"

namespace mxlab::cuda {

// dst[0..n) = value.
void launch_fill(float* dst, float value, int64_t n, cudaStream_t s);

// x = round_bf16(x, mode), in place.
void launch_round_bf16(float* x, int64_t n, Rounding mode, cudaStream_t s);

// out[i] (= or +=) scale * N(0,1) sample i of (seed, stream, d_step->step).
void launch_randn(float* out, int64_t n, uint64_t seed, Stream stream, float scale, bool accumulate,
                  const StepScalars* d_step, cudaStream_t s);

// a = R(act(R_h(h))); h: (rows, cols), or (rows, 2*cols) = [u | gate] for swiglu; a: (rows, cols).
// R_h (h_in): the rounding of a GEMM output deferred to this consumer (Backend::act_fwd).
// pq (optional): also write a's MX quantization (kernels/mx_produce.cuh) in the same pass.
// Returns whether it did: only for relu, gelu, gelu_tanh, linear and gelu_vector, cols % 32 == 0 and
// 16-byte aligned h and a (otherwise a alone is written, as without pq).
bool launch_act_fwd(Act act, const float* h, float* a, int64_t rows, int64_t cols, const ElementwiseRound& r,
                    const ElementwiseRound& h_in, cudaStream_t s, const ProducedQuant* pq = nullptr);

// dh = R(R_da(da) * act'(R_h(h))); for swiglu dh is (rows, 2*cols) = [du | dgate].
// pq: as launch_act_fwd's, for dh (same conditions, with da aligned too).
bool launch_act_bwd(Act act, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
                    const ElementwiseRound& r, const ElementwiseRound& h_in, const ElementwiseRound& da_in,
                    cudaStream_t s, const ProducedQuant* pq = nullptr);

// out (rows, d) = R(x + R(R_y(y) + bias)) (bias (d) broadcast over rows; without bias
// R(x + R_y(y))); R_y = y_in rounds y as it is read. out may be x.
void launch_residual_add(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                         const ElementwiseRound& r, const ElementwiseRound& y_in, cudaStream_t s);

// out (rows, d) = R_out(x + R_in(R_y(y) + R_b(bias))) (without bias R_out(x + R_y(y))): the
// roundings of Backend::residual_add_r. out may be x.
void launch_residual_add_r(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                           const Backend::ResidualRound& rr, cudaStream_t s);

// dst = R(a + b). pq: as launch_act_fwd's, with dst seen as rows of 32-multiple length (the
// caller checked); returns whether it wrote pq's operand (n % 32 == 0, aligned pointers).
bool launch_add(float* dst, const float* a, const float* b, int64_t n, const ElementwiseRound& r, cudaStream_t s,
                const ProducedQuant* pq = nullptr);

}  // namespace mxlab::cuda
