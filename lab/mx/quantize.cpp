// CPU reference for tensor-level MX quantization (see quantize.h). Deliberately plain:
// one loop over blocks, one over elements, calling the shared scalar code in scalar.h.
#include "lab/mx/quantize.h"

#include <cmath>
#include <limits>
#include <vector>

#include "lab/core/error.h"
#include "lab/mx/scalar.h"

namespace mxlab {

namespace {

// Element (i-th of a block) -> flat index into the row-major matrix.
struct BlockWalk {
  int64_t rows, cols;
  Axis axis;
  // Block b of line `line`: contiguous -> row `line`, columns [b*k, b*k+k);
  //                         strided    -> column `line`, rows [b*k, b*k+k).
  int64_t lines() const { return axis == Axis::contiguous ? rows : cols; }
  int64_t length() const { return axis == Axis::contiguous ? cols : rows; }
  int64_t index(int64_t line, int64_t pos) const {
    return axis == Axis::contiguous ? line * cols + pos : pos * cols + line;
  }
};

void quantize_block(const float* in, float* out, const BlockWalk& w, int64_t line, int64_t begin,
                    int64_t end, const QuantSpec& spec, const ElemSpec& es, QuantStats& st) {
  float amax = 0.0f;
  bool special = false;
  for (int64_t p = begin; p < end; ++p) {
    const float v = in[w.index(line, p)];
    if (!std::isfinite(v)) special = true;
    const float a = std::fabs(v);
    if (a > amax) amax = a;
  }
  st.blocks += 1;
  st.n += static_cast<uint64_t>(end - begin);
  const int s = block_scale_exp(special ? std::numeric_limits<float>::quiet_NaN() : amax, es, spec.rule, spec.bump);
  if (s == kScaleExpNaN) {
    // The OCP NaN scale makes the whole block NaN: a block holding NaN/Inf, or one whose rule's
    // exponent is beyond E8M0 (block_scale_exp); other blocks unaffected.
    st.nan_blocks += 1;
    if (out)
      for (int64_t p = begin; p < end; ++p) out[w.index(line, p)] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  for (int64_t p = begin; p < end; ++p) {
    const int64_t idx = w.index(line, p);
    const uint32_t rnd = element_word(spec.rounding, spec.seed, spec.salt, static_cast<uint64_t>(idx));
    const ElemResult r = quantize_element(in[idx], s, es, spec.rounding, rnd);
    st.lastbin += r.lastbin;
    st.clamped += r.clamped;
    if (out) out[idx] = r.value;
  }
}

}  // namespace

void quantize_dequantize(const float* in, float* out, int64_t rows, int64_t cols, Axis axis,
                         const QuantSpec& spec, QuantStats* stats) {
  if (rows < 0 || cols < 0) throw Error(msg("quantize: negative shape (", rows, " x ", cols, ")"));
  QuantStats st;
  const int64_t n = rows * cols;
  if (!is_mx(spec.fmt)) {
    if (out) {
      for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        switch (spec.fmt) {
          case NumFmt::bf16: out[i] = round_bf16(v, spec.rounding); break;
          case NumFmt::fp16: out[i] = round_fp16(v, spec.rounding); break;
          default: out[i] = v; break;
        }
      }
    }
    st.n = static_cast<uint64_t>(n);
    if (stats) *stats = st;
    return;
  }
  MXLAB_ASSERT(spec.block > 0, "quantize: block size ", spec.block,
               " (configuration and `mxlab quantize --block-size` admit only positive sizes)");
  const ElemSpec& es = elem_spec(mx_elem(spec.fmt));
  const BlockWalk w{rows, cols, axis};
  const int64_t k = spec.block;
  for (int64_t line = 0; line < w.lines(); ++line)
    for (int64_t b = 0; b < w.length(); b += k)
      quantize_block(in, out, w, line, b, std::min(b + k, w.length()), spec, es, st);
  if (stats) *stats = st;
}

QuantStats mx_stats(const float* in, int64_t rows, int64_t cols, Axis axis, const QuantSpec& spec) {
  QuantStats st;
  quantize_dequantize(in, nullptr, rows, cols, axis, spec, &st);
  return st;
}

QuantError quant_error(const float* x, const float* q, int64_t n) {
  double err2 = 0.0, ref2 = 0.0;
  QuantError e;
  for (int64_t i = 0; i < n; ++i) {
    const double a = x[i], b = q[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      ++e.nonfinite;
      continue;
    }
    err2 += (b - a) * (b - a);
    ref2 += a * a;
  }
  e.rel = ref2 > 0.0 ? std::sqrt(err2 / ref2) : 0.0;
  return e;
}

}  // namespace mxlab
