// Launchers of the losses: MSE, KL on softmax(z / T) and cross-entropy, each writing the gradient (rounded
// per the policy, exactly as the CPU's mse_grad_elem / kl_grad_elem) and the loss value to
// device memory (loss_out[0], and loss_history[step] when given, with step read from the
// device StepScalars). The loss sum is a deterministic two-pass double reduction.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// Scratch: loss_scratch_doubles(rows, d) doubles (enough for either loss).
int64_t loss_scratch_doubles(int64_t rows, int64_t d);

void launch_loss_mse(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
                     int64_t rows, int64_t d, const ElementwiseRound& r, const StepScalars* d_step, double* scratch,
                     cudaStream_t s);

void launch_loss_kl(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
                    int64_t rows, int64_t d, float temperature, const ElementwiseRound& r, const StepScalars* d_step,
                    double* scratch, cudaStream_t s);

// Next-token cross-entropy (Backend::loss_xent): bit-identical to the CPU (its row maximum scan and
// its double sums in index order, the row terms added in row order). A target that is not an
// integer in [0, vocab) makes its row of dlogits and the loss NaN (the CPU throws mxlab::Error).
void launch_loss_xent(const float* logits, const float* target, float* dlogits, float* loss_out, float* loss_history,
                      int64_t rows, int64_t vocab, const ElementwiseRound& r, const StepScalars* d_step,
                      double* scratch, cudaStream_t s);

}  // namespace mxlab::cuda
