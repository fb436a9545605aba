// Timing helpers for `mxlab bench` on a CUDA backend (plain C++ header: the CLI includes it
// when MXLAB_HAVE_CUDA). Device times come from CUDA events in stream order, never from host
// clocks, and the cuBLAS floors are measured in the same process as the step they bound.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// One GEMM of a step in the Backend's convention: C[M x N] = A[M x K] * B[N x K]^T, A stored
// [M x K] when a_kc else [K x M], B stored [N x K] when b_kc else [K x N].
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool a_kc = true, b_kc = true;
  int64_t batch = 1;  // > 1: that many GEMMs of this shape in one strided-batched call (attention)
};

enum class FloorKind : uint8_t {
  sgemm,          // FP32 in/out, CUBLAS_COMPUTE_32F_PEDANTIC (TF32 off): the FP32 trajectory's GEMMs
  bf16,           // bf16 operands (pre-quantized, not counted), FP32 accumulation and output: the MX GEMMs
  sgemm_default,  // FP32 in/out, CUBLAS_COMPUTE_32F with CUBLAS_DEFAULT_MATH (TF32 still off unless the
                  // environment forces it, which GemmRunner refuses): a candidate for the FP32 GEMMs
};

// Median milliseconds of running `shapes` back to back on `device` with cuBLAS alone (one
// CUDA graph of all of them, `reps` timed replays after `warmup`), on random non-zero
// operands, a separate set per GEMM so that no operand is served from L2 by the previous GEMM.
double gemm_floor_ms(const std::vector<GemmShape>& shapes, FloorKind kind, int device, int warmup, int reps);

// max |C_default - C_pedantic| / max |C_pedantic| for one FP32 GEMM of shape g on random operands:
// FloorKind::sgemm_default against sgemm. IEEE FP32 with another summation order differs by
// ~1e-6 relative; TF32 (10-bit mantissa inputs) would differ by ~1e-3.
double sgemm_default_rel_diff(const GemmShape& g, int device);

// Producer-side quantization (kernels/gemm.cuh) of a backend made by make_cuda_backend: on by
// default; off makes every GEMM quantize its operands itself (same bits; for comparisons).
// producer_quant_hits: GEMM operands taken from producers so far, over all lanes. Both throw
// mxlab::Error for another backend.
void set_producer_quant(Backend& be, bool on);
int64_t producer_quant_hits(Backend& be);

// CUDA-event timer on lane 0 of a backend made by make_cuda_backend: start(i)/stop(i) record
// events in stream order around step i; elapsed_ms() synchronises and returns every step's time.
class LaneTimer {
 public:
  LaneTimer(Backend& be, int steps);
  ~LaneTimer();
  LaneTimer(const LaneTimer&) = delete;
  LaneTimer& operator=(const LaneTimer&) = delete;
  void start(int i);
  void stop(int i);
  std::vector<double> elapsed_ms();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxlab::cuda
