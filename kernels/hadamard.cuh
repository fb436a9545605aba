// The block Hadamard rotation on the GPU: the CUDA twin of lab/mx/hadamard.cpp (hadamard_rotate),
// for the GEMM operands that precision.rotation rotates along their reduction axis
// (kernels/gemm.cu). Every output is the CPU reference's float for float: the same sign flip, the
// butterflies of lab/mx/hadamard.h's network in the same stage order (those of one stage run in
// parallel, each the same two-value hadamard_butterfly), the same scaling and NaN
// canonicalisation; tests/gpu/test_rotation_gpu.cu checks the bits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/mx/hadamard.h"

namespace mxlab::cuda {

struct RotateLaunch {
  const float* in = nullptr;
  float* out = nullptr;          // may alias in (each tile is read whole before it is written)
  int64_t rows = 0, cols = 0;    // row-major [rows x cols]
  Axis axis = Axis::contiguous;  // blocks of r.block along each row (contiguous) or down each column
  int64_t period = 0;            // the GEMM's reduction length K (signs repeat with it)
  RotationSpec r;                // salt = *d_step when d_step is given, r.salt otherwise
  bool round_bf16_first = false; // the input rounded to bf16 (bf16_mode) as it is read, as a GEMM operand is
  Rounding bf16_mode = Rounding::nearest_even;
  const uint32_t* d_step = nullptr;
};

// Rotate L.in into L.out on stream s. Throws mxlab::Error for a block or shape hadamard_rotate
// refuses.
void hadamard_rotate(const RotateLaunch& L, cudaStream_t s);

}  // namespace mxlab::cuda
