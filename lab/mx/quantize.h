// Tensor-level MX quantization on the CPU: the reference the CUDA kernels are tested against.
// A tensor is a row-major (rows x cols) float32 matrix (any rank folds to this: rows = product
// of the leading dims). Blocks of `block` elements run along one axis:
//   Axis::contiguous - along each row (the last axis), as `mxlab quantize` does;
//   Axis::strided    - down each column (the backward GEMMs quantize along the batch or
//                      output axis, DESIGN.md section 3).
// A final partial block is zero-padded: padding never changes any output (zeros do not
// raise amax and are not counted in the statistics).
#pragma once
#include <cstdint>

#include "lab/mx/format.h"

namespace mxlab {

enum class Axis : uint8_t { contiguous = 0, strided = 1 };

// How one operand is quantized.
struct QuantSpec {
  NumFmt fmt = NumFmt::fp32;  // fp32: identity; bf16/fp16: element-wise rounding; mx*: blocks
  int block = 32;
  ScaleRule rule = ScaleRule::floor;
  Rounding rounding = Rounding::nearest_even;  // element rounding (bf16/fp16: nearest_* only)
  Bump bump = Bump::clamp;
  // Random word of element (r, c) for stochastic rounding and noise (element_word in scalar.h):
  // philox(seed, Stream::stochastic_round or Stream::mx_noise, salt, r * cols + c).v[0].
  uint64_t seed = 0;
  uint32_t salt = 0;
};

// Per-tensor counts (fractions = count / n).
struct QuantStats {
  uint64_t n = 0;           // elements (padding excluded)
  uint64_t lastbin = 0;     // |Q(v)| == max_normal * X
  uint64_t clamped = 0;     // |v / X| > max_normal before saturation
  uint64_t nan_blocks = 0;  // blocks that held NaN or Inf or whose exponent is beyond E8M0 (all NaN)
  uint64_t blocks = 0;
  void add(const QuantStats& o) {
    n += o.n; lastbin += o.lastbin; clamped += o.clamped; nan_blocks += o.nan_blocks; blocks += o.blocks;
  }
  double lastbin_frac() const { return n ? static_cast<double>(lastbin) / static_cast<double>(n) : 0.0; }
  double clamped_frac() const { return n ? static_cast<double>(clamped) / static_cast<double>(n) : 0.0; }
};

// Quantize-dequantize `in` into `out` (may alias `in`). `out` may be null to compute only
// the statistics (the "diagnostic" use: what would clamp if this tensor were quantized).
// For fp32/bf16/fp16 formats the statistics are zero. Throws mxlab::Error on bad arguments.
void quantize_dequantize(const float* in, float* out, int64_t rows, int64_t cols, Axis axis,
                         const QuantSpec& spec, QuantStats* stats = nullptr);

// Statistics of a tensor under an MX format without writing anything.
QuantStats mx_stats(const float* in, int64_t rows, int64_t cols, Axis axis, const QuantSpec& spec);

// How far Q(x) is from x, as `mxlab quantize --stats` and the Python binding report it:
// ||Q(x) - x|| / ||x|| in double over the elements both sides hold as finite numbers
// (`nonfinite` counts the others: NaN blocks, NaN/Inf input, bf16/fp16 overflow to Inf).
struct QuantError {
  uint64_t nonfinite = 0;
  double rel = 0.0;
};
QuantError quant_error(const float* x, const float* q, int64_t n);

}  // namespace mxlab
