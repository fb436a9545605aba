// Launchers of the optimizer updates (FP32 masters and state). lr and the Adam bias
// corrections are read from the device copy of StepScalars, so a captured step replays with
// the current step's values; the hyper-parameters are constant over a run and passed by value.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// adam_scalar (lab/model/elementwise.h) on every element of p, g, m, v.
void launch_adam(float* p, const float* g, float* m, float* v, int64_t n, const Backend::AdamHyper& h,
                 const StepScalars* d_step, cudaStream_t s);

// sgd_scalar on every element; buf may be null when momentum == 0.
void launch_sgd(float* p, const float* g, float* buf, int64_t n, float momentum, float weight_decay,
                const StepScalars* d_step, cudaStream_t s);

}  // namespace mxlab::cuda
