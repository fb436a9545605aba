// The quantization gap of a stored tensor (backend.h, quant_gap): per element |x - Q(x)| / |x|
// and the clamp flag, with Q from the quantizer's own scalar code of lab/mx/scalar.h
// (block_scale_exp: NaN blocks as the quantizer makes them; quantize_element, round_bf16,
// round_fp16) and lab/model/instrument_elementwise.h (quant_gap_counts: which elements enter
// the sums; quant_gap_rel), then the sums in the fixed order the CPU reference uses (chunks of
// kQuantGapChunk flat indices in index order, then chunk sums in order), so the result equals
// the CPU's bit for bit. It runs once per log step on each parameter tensor (16 per trajectory
// at L = 4), all of a trajectory's in one batch (CudaBackend::quant_gaps, one read-back): the
// sums run a warp per chunk (quant_gap.cu), which also computes the elements itself where a
// warp's 32 consecutive elements are one block or need no block (quant_gap_one_pass).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// Whether one pass does it (nothing written per element): scalar formats, and MX blocks of 32
// along the contiguous axis of rows that are whole blocks (cols % 32 == 0). Else a first pass
// writes each element's rel and flag (one thread per block) and a second sums them.
bool quant_gap_one_pass(int64_t cols, Axis axis, const QuantSpec& q);
// Scratch: quant_gap_scratch_doubles(...) doubles for a tensor of rows x cols.
int64_t quant_gap_scratch_doubles(int64_t rows, int64_t cols, Axis axis, const QuantSpec& q);
// d_results[0..5) = sum_rel, max_rel, above, n, nonfinite (counts as exact doubles).
// Stochastic rounding reads the salt from d_step->step.
void launch_quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q,
                      bool round_bf16_first, Rounding bf16_mode, const StepScalars* d_step, double* scratch,
                      double* d_results, cudaStream_t s);

}  // namespace mxlab::cuda
