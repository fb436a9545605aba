// Default implementations of the stability-instrument ops of the Backend interface (backend.h,
// "stability instruments"): a backend that does not override them cannot measure curvature or
// quantization gaps, and says so in one line instead of failing to compile. Also the deferred
// results' default (reductions and scalars computed at once).
#include "lab/core/error.h"
#include "lab/model/backend.h"

namespace mxlab {

namespace {
[[noreturn]] void unsupported(const Backend& be, const char* op) {
  throw Error(msg("backend '", be.name(), "' does not implement ", op,
                  " (needed by the curvature / quantization-gap instruments): use the cpu or cuda backend"));
}
}  // namespace

void Backend::act_jvp(Act, const float*, const float*, float*, int64_t, int64_t) { unsupported(*this, "act_jvp"); }
void Backend::act_bwd_tangent(Act, const float*, const float*, const float*, const float*, float*, int64_t, int64_t) {
  unsupported(*this, "act_bwd_tangent");
}
void Backend::ln_affine_tangent(const float*, const float*, const float*, const float*, const float*, float*, int64_t,
                                int64_t) {
  unsupported(*this, "ln_affine_tangent");
}
void Backend::layernorm_bwd_tangent(const float*, const float*, const float*, const float*, const float*,
                                    const float*, const float*, const float*, float*, int64_t, int64_t) {
  unsupported(*this, "layernorm_bwd_tangent");
}
void Backend::col_dot(const float*, const float*, float*, int64_t, int64_t) { unsupported(*this, "col_dot"); }
void Backend::axpby(float*, const float*, float, float, size_t) { unsupported(*this, "axpby"); }
void Backend::mul(float*, const float*, const float*, size_t) { unsupported(*this, "mul"); }
void Backend::precond_isqrt(const float*, float*, size_t, float, float) { unsupported(*this, "precond_isqrt"); }
void Backend::loss_kl_tangent(const float*, const float*, float*, int64_t, int64_t, float) {
  unsupported(*this, "loss_kl_tangent");
}
Backend::QuantGap Backend::quant_gap(const float*, int64_t, int64_t, Axis, const QuantSpec&, bool, Rounding) {
  unsupported(*this, "quant_gap");
}
void Backend::moments_batch(const float* const* x, const size_t* n, size_t count, double* out) {
  for (size_t i = 0; i < count; ++i) moments(x[i], n[i], out + 4 * i);
}
void Backend::quant_gaps(const QuantGapRequest* reqs, size_t count, QuantGap* out) {
  for (size_t i = 0; i < count; ++i) {
    const QuantGapRequest& r = reqs[i];
    out[i] = quant_gap(r.x, r.rows, r.cols, r.axis, r.q, r.round_bf16_first, r.bf16_mode);
  }
}

// Deferred results, computed at once: a host backend has nothing to overlap.
void Backend::reduce_deferred(const Reduction* reqs, size_t count) {
  const size_t at = deferred_host_.size();
  deferred_host_.resize(at + count);
  if (count) reduce(reqs, count, deferred_host_.data() + at);
}
void Backend::defer_scalar(const float* p) { deferred_host_.push_back(static_cast<double>(read_scalar(p))); }
std::vector<double> Backend::take_deferred() {
  std::vector<double> out;
  out.swap(deferred_host_);
  return out;
}

}  // namespace mxlab
