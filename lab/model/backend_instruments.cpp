// Default implementations of the stability-instrument ops of the Backend interface (backend.h,
// "stability instruments"): a backend that does not override them cannot measure curvature or
// quantization gaps, and says so in one line instead of failing to compile.
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

}  // namespace mxlab
