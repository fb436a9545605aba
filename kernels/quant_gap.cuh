// The quantization gap of a stored tensor (backend.h, quant_gap): per element |x - Q(x)| / |x|
// and the clamp flag, from the scalar code of lab/mx/scalar.h (shared_exponent,
// quantize_element, round_bf16, round_fp16) and lab/model/instrument_elementwise.h
// (quant_gap_rel), then the sums in the fixed order the CPU reference uses (chunks of
// kQuantGapChunk flat indices in index order, then chunk sums in order), so the result equals
// the CPU's bit for bit. It runs once per log step on each parameter tensor (16 per trajectory
// at L = 4): the sums run a warp per chunk (quant_gap.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// Scratch: quant_gap_scratch_doubles(n) doubles for a tensor of n elements.
int64_t quant_gap_scratch_doubles(int64_t n);
// d_results[0..5) = sum_rel, max_rel, above, n, nonfinite (counts as exact doubles).
// Stochastic rounding reads the salt from d_step->step.
void launch_quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q,
                      bool round_bf16_first, Rounding bf16_mode, const StepScalars* d_step, double* scratch,
                      double* d_results, cudaStream_t s);

}  // namespace mxlab::cuda
