// Scalar code of the stability instruments, shared verbatim by the CPU backend and the CUDA
// kernels (like lab/model/elementwise.h, which it extends): the tangent (R-operator) steps of
// the exact Hessian-vector product (lab/model/hvp.h) and the per-element quantization gap of
// `quant_gap`. Everything here is FP32 and never rounded to bf16: curvature is measured on the
// FP32 loss whatever the trajectory's precision policy. lab/model/README.md ("Curvature")
// derives each formula.
#pragma once
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/core/hd.h"
#include "lab/model/backend.h"
#include "lab/model/elementwise.h"

namespace mxlab {

// gelu_tanh's constants (act_value): u = c (x + a x^3).
constexpr float kGeluTanhC = 0.7978845608028654f;
constexpr float kGeluTanhA = 0.044715f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // the normal density at 0

// Second derivative of the activation at x (relu and linear: 0, relu's kink ignored as a
// measure-zero set, as its first derivative already does).
MXLAB_HD float act_deriv2(Act act, float x) {
  switch (act) {
    case Act::gelu: {
      // phi = x Phi(x): phi'' = 2 pdf + x pdf' = pdf (2 - x^2).
      const float pdf = kInvSqrt2Pi * det_exp(-0.5f * x * x);
      return pdf * (2.0f - x * x);
    }
    case Act::gelu_tanh: {
      // phi = x (1 + t) / 2, t = tanh(u): phi'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2).
      const float x2 = x * x;
      const float t = det_tanh(kGeluTanhC * (x + kGeluTanhA * x2 * x));
      const float du = kGeluTanhC * (1.0f + 3.0f * kGeluTanhA * x2);
      const float d2u = 6.0f * kGeluTanhC * kGeluTanhA * x;
      return (1.0f - t * t) * (du + 0.5f * x * (d2u - 2.0f * t * du * du));
    }
    default: return 0.0f;  // relu, linear
  }
}

// silu'' = s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x).
MXLAB_HD float silu_deriv2(float x) {
  const float s = sigmoid(x);
  return s * (1.0f - s) * (2.0f + x * (1.0f - 2.0f * s));
}

// ---- forward tangent ------------------------------------------------------------------------
// R{a} = act'(h) R{h}: the very expression of act_bwd_elem (da * act'(h)) without rounding, so
// act_jvp and an FP32 act_bwd give the same bits.
MXLAB_HD float act_jvp_elem(Act act, float h, float rh) { return rh * act_deriv(act, h); }
// SwiGLU a = u silu(g): R{a} = R{u} silu(g) + (u silu'(g)) R{g}.
MXLAB_HD float swiglu_jvp_elem(float u, float g, float ru, float rg) {
  return ru * silu(g) + (u * silu_deriv(g)) * rg;
}
// Layernorm affine y = xhat gamma + beta: R{y} = (R{xhat} gamma + xhat v_gamma) + v_beta.
MXLAB_HD float ln_affine_tangent_elem(float rxhat, float xhat, float gamma, float vgamma, float vbeta) {
  return (rxhat * gamma + xhat * vgamma) + vbeta;
}

// ---- backward tangent -----------------------------------------------------------------------
// dh = act'(h) da: R{dh} = act'(h) R{da} + (da act''(h)) R{h}.
MXLAB_HD float act_bwd_tangent_elem(Act act, float h, float rh, float da, float rda) {
  return rda * act_deriv(act, h) + (da * act_deriv2(act, h)) * rh;
}
// SwiGLU backward du = da silu(g), dg = (da u) silu'(g):
//   R{du} = R{da} silu(g) + (da silu'(g)) R{g}
//   R{dg} = (R{da} u + da R{u}) silu'(g) + ((da u) silu''(g)) R{g}
MXLAB_HD void swiglu_bwd_tangent_elem(float u, float g, float ru, float rg, float da, float rda, float& rdu,
                                      float& rdg) {
  const float s1 = silu_deriv(g);
  rdu = rda * silu(g) + (da * s1) * rg;
  rdg = (rda * u + da * ru) * s1 + ((da * u) * silu_deriv2(g)) * rg;
}

// Layernorm backward tangent, per row (lab/model/README.md): with g = dy gamma (or dy) and
// R{g} = R{dy} gamma + dy v_gamma (or R{dy}), and the row means mg = mean g, mgx = mean g xhat,
// rmg = mean R{g}, rmgx = mean (R{g} xhat + g R{xhat}), sx = mean xhat R{x}:
//   R{rstd} = -rstd^2 sx
//   R{dx_j} = R{rstd} ((g_j - mg) - xhat_j mgx) + rstd (((R{g}_j - rmg) - R{xhat}_j mgx) - xhat_j rmgx)
MXLAB_HD float ln_bwd_tangent_g(float rdy, float dy, float gamma, float vgamma) { return rdy * gamma + dy * vgamma; }
MXLAB_HD float ln_tangent_rrstd(float rstd, float sx) { return -(rstd * rstd) * sx; }
MXLAB_HD float ln_bwd_tangent_dx(float rstd, float rrstd, float g, float mg, float xhat, float mgx, float rg, float rmg,
                                 float rxhat, float rmgx) {
  return rrstd * ((g - mg) - xhat * mgx) + rstd * (((rg - rmg) - rxhat * mgx) - xhat * rmgx);
}
// Term of rmgx's double sum: R{g} xhat + g R{xhat}, each product exact in double.
MXLAB_HD double ln_tangent_rmgx_term(float rg, float xhat, float g, float rxhat) {
  return dot_term(rg, xhat) + dot_term(g, rxhat);
}

// KL loss on softmax(out / T), one row (lab/model/README.md): with q the row's softmax (the
// kl_* steps of loss_kl) and s = (float) double sum q_j R{out}_j,
//   R{dout_j} = (q_j (R{out}_j - s)) * kl_tangent_scale(T, rows),  scale = 1 / (T^2 rows).
MXLAB_HD float kl_tangent_scale(float temperature, int64_t rows) {
  return 1.0f / ((temperature * temperature) * static_cast<float>(rows));
}
MXLAB_HD float kl_tangent_elem(float q, float rout, float s, float scale) { return (q * (rout - s)) * scale; }

// ---- vector algebra of the eigensolver --------------------------------------------------------
// y = a x + b y; b == 0 writes a x (the old y is ignored: it may be garbage or NaN).
MXLAB_HD float axpby_elem(float x, float y, float a, float b) { return b == 0.0f ? a * x : a * x + b * y; }
// Adam's preconditioner P = diag(sqrt(v / bc2) + eps) (the denominator of adam_scalar, same
// operations), as P^{-1/2} = 1 / sqrt(sqrt(v / bc2) + eps).
MXLAB_HD float precond_isqrt_elem(float v, float bc2, float eps) {
  return 1.0f / sqrtf_ieee(sqrtf_ieee(v / bc2) + eps);
}

// ---- quantization gap (quant_gap) -----------------------------------------------------------
// Whether an element enters the gap's sums: its stored value x and what the quantizer returned
// for it, q, are both finite. Else it counts in `nonfinite` only: every element of a block the
// quantizer makes NaN (a NaN or Inf inside, or no E8M0 scale: block_scale_exp), an element whose
// dequantized value overflowed to +-Inf (a block within one rounding step of FLT_MAX), and a
// non-finite scalar-format result. Both backends decide with this, from the quantizer's own q.
MXLAB_HD bool quant_gap_counts(float x, float q) {
  return (f32_bits(x) & 0x7F800000u) != 0x7F800000u && (f32_bits(q) & 0x7F800000u) != 0x7F800000u;
}
// |x - q| / |x| in double (0 for x == 0): x the stored value, q what the quantizer returns.
MXLAB_HD double quant_gap_rel(float x, float q) {
  if (x == 0.0f) return 0.0;
  const double dx = static_cast<double>(x);
  const double e = dx - static_cast<double>(q);
  return (e < 0.0 ? -e : e) / (dx < 0.0 ? -dx : dx);
}
// The gap's sum runs over chunks of this many consecutive flat indices (in index order), then
// over the chunk sums in chunk order: a fixed order both backends follow exactly.
constexpr int64_t kQuantGapChunk = 1024;

}  // namespace mxlab
