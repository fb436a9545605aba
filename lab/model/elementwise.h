// Scalar element-wise math shared verbatim by the CPU backend and the CUDA kernels, so that
// element-wise ops and optimizer updates agree bit for bit (see lab/core/hd.h for the rules).
// Transcendentals come from lab/core/detmath.h (deterministic, libm-free).
#pragma once
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/core/hd.h"
#include "lab/core/philox.h"
#include "lab/model/backend.h"
#include "lab/mx/scalar.h"

namespace mxlab {

// Apply the element-wise rounding of the policy (bf16 or nothing).
MXLAB_HD float ew_round(float x, bool bf16, Rounding mode) { return bf16 ? round_bf16(x, mode) : x; }

// Activation functions, forward. x is a pre-activation; swiglu is handled by the caller as
// a * silu(gate).
MXLAB_HD float act_value(Act act, float x) {
  switch (act) {
    case Act::relu: return x > 0.0f ? x : 0.0f;
    case Act::gelu: return 0.5f * x * (1.0f + det_erf(x * 0.70710678118654752f));
    case Act::gelu_tanh: {
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + det_tanh(u));
    }
    case Act::linear: return x;
    default: return x;
  }
}

// Derivative of the activation at x.
MXLAB_HD float act_deriv(Act act, float x) {
  switch (act) {
    case Act::relu: return x > 0.0f ? 1.0f : 0.0f;
    case Act::gelu: {
      const float cdf = 0.5f * (1.0f + det_erf(x * 0.70710678118654752f));
      const float pdf = 0.3989422804014327f * det_exp(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case Act::gelu_tanh: {
      const float x2 = x * x;
      const float u = 0.7978845608028654f * (x + 0.044715f * x2 * x);
      const float t = det_tanh(u);
      const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x2);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case Act::linear: return 1.0f;
    default: return 1.0f;
  }
}

MXLAB_HD float sigmoid(float x) { return 1.0f / (1.0f + det_exp(-x)); }
MXLAB_HD float silu(float x) { return x * sigmoid(x); }
MXLAB_HD float silu_deriv(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// One Adam/AdamW step for one parameter; lr, bc1, bc2 from StepScalars (host-computed).
MXLAB_HD void adam_scalar(float& p, float g, float& m, float& v, float lr, float bc1, float bc2,
                          float beta1, float beta2, float eps, float wd, bool decoupled) {
  if (decoupled) {
    p = p - lr * wd * p;
  } else if (wd != 0.0f) {
    g = g + wd * p;
  }
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * (g * g);
  const float mhat = m / bc1;
  const float vhat = v / bc2;
  p = p - lr * mhat / (sqrtf_ieee(vhat) + eps);
}

// One SGD(+momentum) step for one parameter.
MXLAB_HD void sgd_scalar(float& p, float g, float& buf, float lr, float momentum, float wd) {
  if (wd != 0.0f) g = g + wd * p;
  if (momentum != 0.0f) {
    buf = momentum * buf + g;
    g = buf;
  }
  p = p - lr * g;
}

// ---- element steps of the vector ops ------------------------------------------------------
// Each op of lab/model/README.md ("Exact semantics") is a sequence of these calls; the CPU
// loops and the CUDA kernels call them in the same order, so the float results agree bit for
// bit. Reductions (the double sums) are done by the caller; only how a sum becomes a float
// lives here. `rb`/`rm` are ElementwiseRound's fields.

// mean or any "sum / count" of a double reduction, as a float: (float)(sum / count).
MXLAB_HD float mean_from_sum(double sum, int64_t count) {
  return static_cast<float>(sum / static_cast<double>(count));
}

// Layernorm forward, per element, after mean = R(mean_from_sum(sum x, d)):
MXLAB_HD float ln_center(float x, float mean, bool rb, Rounding rm) { return ew_round(x - mean, rb, rm); }
// var = R(mean_from_sum(sum xc^2, d)) -> rstd = R(1 / sqrt(var + eps)).
MXLAB_HD float ln_rstd(float var, float eps, bool rb, Rounding rm) {
  return ew_round(1.0f / sqrtf_ieee(var + eps), rb, rm);
}
MXLAB_HD float ln_xhat(float xc, float rstd, bool rb, Rounding rm) { return ew_round(xc * rstd, rb, rm); }
// y = R(R(xhat * gamma) + beta).
MXLAB_HD float ln_affine(float xhat, float gamma, float beta, bool rb, Rounding rm) {
  return ew_round(ew_round(xhat * gamma, rb, rm) + beta, rb, rm);
}
// Layernorm backward: g = R(dy * gamma) (g = dy without affine), then with
// mg = mean_from_sum(sum g, d), mgx = mean_from_sum(sum g * xhat, d):
MXLAB_HD float ln_bwd_g(float dy, float gamma, bool rb, Rounding rm) { return ew_round(dy * gamma, rb, rm); }
MXLAB_HD float ln_bwd_dx(float rstd, float g, float mg, float xhat, float mgx, bool rb, Rounding rm) {
  return ew_round(rstd * ((g - mg) - xhat * mgx), rb, rm);
}

// Activations: a = R(act(h)), dh = R(da * act'(h)).
MXLAB_HD float act_fwd_elem(Act act, float h, bool rb, Rounding rm) { return ew_round(act_value(act, h), rb, rm); }
MXLAB_HD float act_bwd_elem(Act act, float h, float da, bool rb, Rounding rm) {
  return ew_round(da * act_deriv(act, h), rb, rm);
}
// SwiGLU on one (u, g) pair of h's row [u (cols) | g (cols)]: a = R(u * silu(g)).
MXLAB_HD float swiglu_fwd_elem(float u, float g, bool rb, Rounding rm) { return ew_round(u * silu(g), rb, rm); }
// du = R(da * silu(g)); dg = R((da * u) * silu'(g)).
MXLAB_HD void swiglu_bwd_elem(float u, float g, float da, float& du, float& dg, bool rb, Rounding rm) {
  du = ew_round(da * silu(g), rb, rm);
  dg = ew_round((da * u) * silu_deriv(g), rb, rm);
}

// Residual stream update x = R(x + R(y + b)); without a bias x = R(x + y).
MXLAB_HD float residual_elem(float x, float y, float b, bool has_bias, bool rb, Rounding rm) {
  return has_bias ? ew_round(x + ew_round(y + b, rb, rm), rb, rm) : ew_round(x + y, rb, rm);
}
MXLAB_HD float add_elem(float a, float b, bool rb, Rounding rm) { return ew_round(a + b, rb, rm); }

// Reduction terms (exact in double: a float product or difference of floats fits).
MXLAB_HD double dot_term(float a, float b) { return static_cast<double>(a) * static_cast<double>(b); }
MXLAB_HD double diff_sq_term(float a, float b) {
  const double e = static_cast<double>(a) - static_cast<double>(b);
  return e * e;
}

// MSE over n = rows * d elements: loss = mean_from_sum(sum diff_sq_term(out, t), n);
// dout = R((out - t) * mse_grad_scale(n)), with the scale 2/n rounded to float once.
MXLAB_HD float mse_grad_scale(int64_t n) { return 2.0f / static_cast<float>(n); }
MXLAB_HD float mse_grad_elem(float out, float t, float scale, bool rb, Rounding rm) {
  return ew_round((out - t) * scale, rb, rm);
}

// KL on softmax(z / T), one row at a time (lab/model/README.md): logits z / T, shifted by
// the row maximum m, exponentiated; probabilities and log-probabilities from the double sum S.
MXLAB_HD float kl_logit(float z, float temperature) { return z / temperature; }
MXLAB_HD float kl_exp(float logit, float row_max) { return det_exp(logit - row_max); }
MXLAB_HD float kl_prob(float e, double sum) { return static_cast<float>(static_cast<double>(e) / sum); }
// log p = (logit - m) - log(S), with log(S) = det_log((float)S) computed once per row.
MXLAB_HD float kl_logprob(float logit, float row_max, float log_sum) { return (logit - row_max) - log_sum; }
// Term of a row's KL sum: p * (log p - log q), in double.
MXLAB_HD double kl_term(float p, float logp, float logq) {
  return static_cast<double>(p) * (static_cast<double>(logp) - static_cast<double>(logq));
}
// dout = R((q - p) * kl_grad_scale(T, rows)), scale = 1 / (T * rows) rounded to float once.
MXLAB_HD float kl_grad_scale(float temperature, int64_t rows) {
  return 1.0f / (temperature * static_cast<float>(rows));
}
MXLAB_HD float kl_grad_elem(float q, float p, float scale, bool rb, Rounding rm) {
  return ew_round((q - p) * scale, rb, rm);
}

// ---- RMSNorm / MXNorm, softmax, products (attention blocks; lab/model/README.md) -------------

// R(a * b): the RMSNorm gain (y = xhat * gamma), scale_cols.
MXLAB_HD float mul_elem(float a, float b, bool rb, Rounding rm) { return ew_round(a * b, rb, rm); }
// MXNorm's mean-square estimate of a row from `sum` over its K blocks of m_k^p (double; m_k the
// block absmax): G = (sum / K)^(1/p) for p in {1, 2}, the RMS estimate r = c * G, ms = R(r * r).
MXLAB_HD float mxnorm_ms(double sum, int64_t blocks, int p, float c, bool rb, Rounding rm) {
  const float mean = mean_from_sum(sum, blocks);
  const float g = p == 2 ? sqrtf_ieee(mean) : mean;
  const float r = c * g;
  return ew_round(r * r, rb, rm);
}
// RMSNorm backward (no centring): dx = R(rstd * (g - xhat * mgx)), mgx = mean_from_sum(sum g * xhat, d).
MXLAB_HD float rms_bwd_dx(float rstd, float g, float xhat, float mgx, bool rb, Rounding rm) {
  return ew_round(rstd * (g - xhat * mgx), rb, rm);
}
// Softmax over a row of attention logits l: z = R(l * scale), m = max z, e = R(exp(z - m)),
// S = double sum of e, p = R((float)(e / S)).
MXLAB_HD float attn_logit(float l, float scale, bool rb, Rounding rm) { return ew_round(l * scale, rb, rm); }
MXLAB_HD float softmax_exp(float z, float row_max, bool rb, Rounding rm) { return ew_round(det_exp(z - row_max), rb, rm); }
MXLAB_HD float softmax_prob(float e, double sum, bool rb, Rounding rm) { return ew_round(kl_prob(e, sum), rb, rm); }
// Softmax backward: dl = R((p * (dp - D)) * scale), D = (float) double sum_j dot_term(p_j, dp_j).
MXLAB_HD float softmax_bwd_elem(float p, float dp, float dot, float scale, bool rb, Rounding rm) {
  return ew_round((p * (dp - dot)) * scale, rb, rm);
}

// One standard normal sample per index i of (seed, stream, step): the pair i/2 of Philox words
// through det_box_muller, z0 for even i and z1 for odd i.
MXLAB_HD float randn_elem(uint64_t seed, Stream stream, uint32_t step, uint64_t i) {
  const U32x4 w = philox(seed, stream, step, i / 2);
  float z0, z1;
  det_box_muller(w.v[0], w.v[1], z0, z1);
  return (i & 1u) ? z1 : z0;
}

// Stochastic-rounding seed of one quantized GEMM operand: the run seed mixed with the op id;
// the step (StepScalars.step) is the Philox counter's step word, the flat index the index.
MXLAB_HD uint64_t sr_seed(uint64_t seed, uint64_t op) { return seed ^ (op * 0x9E3779B97F4A7C15ull); }

}  // namespace mxlab
