// MX / bf16 / fp16 quantization on the GPU: the CUDA twin of lab/mx/quantize.cpp.
// The kernels call the scalar code of lab/mx/scalar.h (block_scale_exp; for each element
// what quantize_element() calls: quantize_element_fast for the deterministic roundings,
// quantize_element_exact for stochastic, noise_element for noise; element_word for the random
// words; round_bf16, round_fp16) and lab/core/philox.h, so
// every output bit equals the CPU reference quantize_dequantize() by construction;
// tests/gpu/test_quantize_gpu.cu and test_quantize_fast_gpu.cu check it. (The bf16 output of
// the MX kernels packs round_bf16's result without its NaN branch, which changes nothing for
// the values they write: see mx_bf16x2 in quantize.cu.)
//
// Semantics (identical to the CPU reference):
//   - `in` is row-major [rows x cols]; blocks of q.block elements run along `axis`
//     (contiguous: along each row; strided: down each column). A final partial block is
//     zero-padded (padding never changes an output and is not counted).
//   - round_bf16_first: every input is rounded to bf16 (per bf16_mode) before quantizing.
//   - A block holding NaN or Inf, or without a scale (block_scale_exp: its rule's exponent is
//     beyond E8M0), becomes all NaN (counted in nan_blocks). In a block with a scale, an element
//     whose dequantized value reaches 2^128 is +-Inf (possible only within one element rounding
//     step of FLT_MAX), the rest of the block unaffected.
//   - Stochastic rounding: the random word of element (r, c) is
//     philox(q.seed, Stream::stochastic_round, salt, r * cols + c).v[0], with
//     salt = *d_step when d_step is given (read on the device, so a captured CUDA graph sees
//     the current step) and q.salt otherwise. GEMM operands pass q.seed = sr_seed(seed, sr_op)
//     (kernels/gemm.cuh does this). Noise (Rounding::noise) draws its word the same way from
//     Stream::mx_noise; its outputs are float32 values off the MX grid, so their bf16 output is
//     a lossy rounding (gemm.cuh sends such operands down the FP32 path).
//
// bf16 output (quantize_bf16, the GEMM's tensor-core input): each dequantized value is written
// as round_bf16(value, nearest_even). For MX formats this is exact (a dequantized MX value has
// at most 8 significant bits: 7 for int8's k/64, |k| <= 127, and 1 + mbits <= 4 for the fp
// elements, and bf16 holds 8) EXCEPT for a value below 2^-126 (a float32 subnormal) that is not
// a multiple of 2^-133, bf16's smallest subnormal. An element's grid is 2^(s + min_sub_exp), s
// the block's scale exponent (>= -127), so this needs s + min_sub_exp < -133: possible only for
// fp8_e4m3 (min_sub_exp -9: s < -124, i.e. block amax below 2^-116 under the floor rule) and
// fp8_e5m2 (-16: s < -117, amax below 2^-102); never for fp6, fp4 or int8. Such an element is
// off by at most 2^-134 in absolute value. At the top, every MX value up to FLT_MAX fits in
// bf16 (<= 8 significant bits never exceed bf16's max (2 - 2^-7) * 2^127) and Inf stays Inf.
// Elements that are not bf16-exact are counted into *d_inexact when it is given
// (kernels/gemm.cuh can use this to fall back to the FP32 path).
// For fp32/fp16 roles the bf16 output is an ordinary (lossy) nearest-even rounding.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/mx/quantize.h"

namespace mxlab::cuda {

// Device counters of one statistics slot: n, lastbin, clamped, nan_blocks, blocks (exact
// integer atomics), in this order (the fields of mxlab::QuantStats).
constexpr int kStatWords = 5;
enum StatWord : int { kStatN = 0, kStatLastbin = 1, kStatClamped = 2, kStatNanBlocks = 3, kStatBlocks = 4 };

struct QuantLaunch {
  const float* in = nullptr;
  int64_t rows = 0, cols = 0;
  Axis axis = Axis::contiguous;  // row-major [rows x cols], blocks along axis
  QuantSpec q;                   // fp32 / bf16 / fp16 / MX, as in lab/mx/quantize.h
  bool round_bf16_first = false;
  Rounding bf16_mode = Rounding::nearest_even;
  const uint32_t* d_step = nullptr;       // device pointer to the step (stochastic salt); null -> q.salt
  unsigned long long* d_stats = nullptr;  // kStatWords counters to add to, or null
  // Spec for the statistics (MX; a non-MX spec counts n only, like the CPU). Used when
  // d_stats != null. Set stats_q = q for the statistics of this very quantization: then they
  // are computed in the same pass. Its stochastic salt is *d_step too when d_step is given.
  QuantSpec stats_q;
  // Optional: adds the number of finite outputs that are not exactly representable in bf16
  // (see the header comment). Counted by quantize_f32 and quantize_bf16.
  unsigned long long* d_inexact = nullptr;
};

// Whether two specs quantize identically (every field, the stochastic stream included).
inline bool same_spec(const QuantSpec& a, const QuantSpec& b) {
  return a.fmt == b.fmt && a.block == b.block && a.rule == b.rule && a.rounding == b.rounding &&
         a.bump == b.bump && a.seed == b.seed && a.salt == b.salt;
}

// Quantize-dequantize into `out` (float32, same layout); out may alias in.
void quantize_f32(const QuantLaunch& L, float* out, cudaStream_t s);
// Dequantized values as bf16 (exact for MX elements in range, see above), same layout.
void quantize_bf16(const QuantLaunch& L, __nv_bfloat16* out, cudaStream_t s);
// quantize_bf16 of Ls[i] into outs[i] for i < n, with the same bits, in fewer launches: those
// that take the contiguous or the strided tile kernel with a deterministic rounding and no
// statistics share one launch per kernel instance, up to 8 tensors each (a step's
// weights quantized together). Returns the number of launches issued.
int quantize_bf16_batch(const QuantLaunch* Ls, __nv_bfloat16* const* outs, int n, cudaStream_t s);
// Statistics only (under L.stats_q) into L.d_stats; nothing written.
void quant_stats(const QuantLaunch& L, cudaStream_t s);

// Element-wise bf16 rounding in place (round_bf16 of lab/mx/scalar.h), e.g. of a GEMM output.
void round_bf16_inplace(float* x, int64_t n, Rounding mode, cudaStream_t s);

}  // namespace mxlab::cuda
