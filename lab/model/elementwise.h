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

// ---- the MX emulation library's ops (precision.layernorm, gelu, residual, bias) -----------------
// The library rounds to bf16 as sign(x) floor(|x| 2^k + 1/2) 2^-k: a zero, +0 or -0, comes out +0
// (its sign(-0) is 0), every other value as round_bf16 (a negative value that rounds to zero
// keeps its sign). Its ops below round with this; without bf16 (rb false) nothing is rounded.
MXLAB_HD float lib_round(float x, bool rb, Rounding rm) { return rb && x == 0.0f ? 0.0f : ew_round(x, rb, rm); }

// ---- the MX emulation library's GeLU in vector ops (precision.gelu: vector) --------------------
// microxcaling's GELUFunction (mx/activations.py): the tanh approximation in sigmoid form,
// x sigmoid(1.5958 (x + 0.044715 x^3)), with the library's bf16 coefficients, each op rounded per R.
constexpr float kMxGeluA = 0.044677734375f;  // 0.044715 in bf16
constexpr float kMxGeluC = 1.59375f;         // 1.5958 (= 2 sqrt(2 / pi)) in bf16
constexpr float kMxGeluD = 0.2138671875f;    // 0.21406859 (= 3 * 0.044715 * 1.5958) in bf16

// phi = sigmoid(C (q + A q^3)) of a rounded input q: s = R(q q), s = R(s q), s = R(A s), s = R(s + q),
// s = R(C s); phi = R(exp(-s)), phi = R(phi + 1), phi = R(1 / phi).
MXLAB_HD float gelu_vector_phi(float q, bool rb, Rounding rm) {
  float s = lib_round(q * q, rb, rm);
  s = lib_round(s * q, rb, rm);
  s = lib_round(kMxGeluA * s, rb, rm);
  s = lib_round(s + q, rb, rm);
  s = lib_round(kMxGeluC * s, rb, rm);
  float phi = lib_round(det_exp(-s), rb, rm);
  phi = lib_round(phi + 1.0f, rb, rm);
  return lib_round(1.0f / phi, rb, rm);
}
// a = R(q phi), q = R(x).
MXLAB_HD float gelu_vector_fwd(float x, bool rb, Rounding rm) {
  const float q = lib_round(x, rb, rm);
  return lib_round(q * gelu_vector_phi(q, rb, rm), rb, rm);
}
// The library's derivative (the factor its backward multiplies the gradient by): with q = R(x) and
// phi as above, dphi = R(phi R(1 - phi)), dy = R(C + R(D R(q q))), dphi = R(dy dphi),
// grad = R(phi + R(q dphi)).
MXLAB_HD float gelu_vector_grad(float x, bool rb, Rounding rm) {
  const float q = lib_round(x, rb, rm);
  const float phi = gelu_vector_phi(q, rb, rm);
  float dphi = lib_round(1.0f - phi, rb, rm);
  dphi = lib_round(phi * dphi, rb, rm);
  float dy = lib_round(q * q, rb, rm);
  dy = lib_round(kMxGeluD * dy, rb, rm);
  dy = lib_round(kMxGeluC + dy, rb, rm);
  dphi = lib_round(dy * dphi, rb, rm);
  const float xd = lib_round(q * dphi, rb, rm);
  return lib_round(phi + xd, rb, rm);
}

// Activations: a = R(act(h)), dh = R(da * act'(h)); gelu_vector: a = gelu_vector_fwd(h),
// dh = R(gelu_vector_grad(h) * da) (the library's vec_mul(grad_gelu, grad_output)).
MXLAB_HD float act_fwd_elem(Act act, float h, bool rb, Rounding rm) {
  if (act == Act::gelu_vector) return gelu_vector_fwd(h, rb, rm);
  return ew_round(act_value(act, h), rb, rm);
}
MXLAB_HD float act_bwd_elem(Act act, float h, float da, bool rb, Rounding rm) {
  if (act == Act::gelu_vector) return lib_round(gelu_vector_grad(h, rb, rm) * da, rb, rm);
  return ew_round(da * act_deriv(act, h), rb, rm);
}

// ---- the MX emulation library's LayerNorm in vector ops (precision.layernorm: vector) ----------
// mx/layernorm.py + mx/norm_utils.py, one row of d at a time (lab/model/README.md). Every sum is
// a double sum in index order made a float once; vec_mean = R(R(sum) / n) is the library's
// vec_reduce_mean (vec_reduce_sum rounds the sum, vec_div the quotient). Both backends run these
// row and column functions as they are (the CUDA backend one thread per row / column).
MXLAB_HD float vec_mean(double sum, int64_t n, bool rb, Rounding rm) {
  return lib_round(lib_round(static_cast<float>(sum), rb, rm) / static_cast<float>(n), rb, rm);
}
MXLAB_HD void ln_vec_fwd_row(const float* x, const float* gamma, const float* beta, float* y, float* xn, float* vare,
                             int64_t d, float eps, bool rb, Rounding rm) {
  double sum = 0.0;
  for (int64_t j = 0; j < d; ++j) sum += static_cast<double>(lib_round(x[j], rb, rm));
  const float mean = vec_mean(sum, d, rb, rm);
  double sq = 0.0;
  for (int64_t j = 0; j < d; ++j) {
    const float xs = lib_round(lib_round(x[j], rb, rm) - mean, rb, rm);
    sq += static_cast<double>(lib_round(xs * xs, rb, rm));
  }
  const float var = vec_mean(sq, d, rb, rm);
  const float ve = lib_round(var + eps, rb, rm);
  const float sd = lib_round(sqrtf_ieee(ve), rb, rm);
  const float rinv = lib_round(1.0f / sd, rb, rm);
  *vare = ve;
  for (int64_t j = 0; j < d; ++j) {
    const float xs = lib_round(lib_round(x[j], rb, rm) - mean, rb, rm);
    const float n = lib_round(xs * rinv, rb, rm);
    xn[j] = n;
    y[j] = gamma ? lib_round(lib_round(gamma[j] * n, rb, rm) + beta[j], rb, rm) : n;
  }
}
// dx of one row; dy is read through (db, dm) = dy_in, then g = R(dy).
MXLAB_HD void ln_vec_bwd_row(const float* dy, const float* xn, float vare, const float* gamma, float* dx, int64_t d,
                             bool rb, Rounding rm, bool db, Rounding dm) {
  const float sd = lib_round(sqrtf_ieee(vare), rb, rm);
  const float rinv = lib_round(1.0f / sd, rb, rm);
  double st = 0.0;
  for (int64_t j = 0; j < d; ++j) {
    const float g = lib_round(lib_round(dy[j], db, dm), rb, rm);
    const float dxn = gamma ? lib_round(g * gamma[j], rb, rm) : g;
    st += static_cast<double>(lib_round(lib_round(dxn * xn[j], rb, rm) * sd, rb, rm));
  }
  const float m = vec_mean(st, d, rb, rm);
  const float vinv = lib_round(1.0f / vare, rb, rm);
  const float s = lib_round(m * vinv, rb, rm);
  double sx = 0.0;
  for (int64_t j = 0; j < d; ++j) {
    const float g = lib_round(lib_round(dy[j], db, dm), rb, rm);
    const float dxn = gamma ? lib_round(g * gamma[j], rb, rm) : g;
    const float dxs = lib_round(dxn * rinv, rb, rm);
    const float dx1 = lib_round(dxs + lib_round(-s * xn[j], rb, rm), rb, rm);
    dx[j] = dx1;
    sx += static_cast<double>(dx1);
  }
  const float dmean = vec_mean(sx, d, rb, rm);
  for (int64_t j = 0; j < d; ++j) dx[j] = lib_round(dx[j] - dmean, rb, rm);
}
// Column j's parameter gradients over `rows` rows of stride d: dgamma = R(sum R(g xn)),
// dbeta = R(sum g), g = R(R_dy(dy)) (each written when non-null).
MXLAB_HD void ln_vec_bwd_col(const float* dy, const float* xn, float* dgamma, float* dbeta, int64_t rows, int64_t d,
                             int64_t j, bool rb, Rounding rm, bool db, Rounding dm) {
  double sg = 0.0, sb = 0.0;
  // Rows in groups of 8 loaded first (so that a GPU thread has 8 loads in flight); the sums
  // still run over the rows in order.
  constexpr int kAhead = 8;
  for (int64_t i0 = 0; i0 < rows; i0 += kAhead) {
    const int n = rows - i0 < kAhead ? static_cast<int>(rows - i0) : kAhead;
    float gv[kAhead], xv[kAhead];
    for (int k = 0; k < n; ++k) {
      gv[k] = dy[(i0 + k) * d + j];
      xv[k] = xn[(i0 + k) * d + j];
    }
    for (int k = 0; k < n; ++k) {
      const float g = lib_round(lib_round(gv[k], db, dm), rb, rm);
      sg += static_cast<double>(lib_round(g * xv[k], rb, rm));
      sb += static_cast<double>(g);
    }
  }
  if (dgamma) dgamma[j] = lib_round(static_cast<float>(sg), rb, rm);
  if (dbeta) dbeta[j] = lib_round(static_cast<float>(sb), rb, rm);
}

// residual_add_r: out = R_out(x + R_in(R_y(y) + R_b(b))), without a bias R_out(x + R_y(y)).
// Each rounding the library's (lib_round).
MXLAB_HD float residual_r_elem(float x, float y, float b, bool has_bias, bool yb, Rounding ym, bool bb, Rounding bm,
                               bool ib, Rounding im, bool ob, Rounding om) {
  const float yr = lib_round(y, yb, ym);
  const float o = has_bias ? lib_round(yr + lib_round(b, bb, bm), ib, im) : yr;
  return lib_round(x + o, ob, om);
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

// The fixed random Markov chain of data.kind: tokens (Backend::token_batch): token v has
// kTokenSuccessors successors succ(v, j) = 1 + philox(seed, token_chain, 0, v * K + j).v[0] % (V - 1)
// (never the BOS 0), taken for a uniform u in [0, 1) with probabilities 8/15, 4/15, 2/15, 1/15
// (u < 8/15: j = 0; < 12/15: 1; < 14/15: 2; else 3). Sparse and skewed, so that tokens and whole
// n-grams repeat within a sequence.
constexpr int kTokenSuccessors = 4;
MXLAB_HD int64_t token_successor(uint64_t seed, int64_t vocab, int64_t v, float u) {
  const int j = u < 8.0f / 15.0f ? 0 : u < 12.0f / 15.0f ? 1 : u < 14.0f / 15.0f ? 2 : 3;
  const uint32_t w = philox(seed, Stream::token_chain, 0, static_cast<uint64_t>(v * kTokenSuccessors + j)).v[0];
  return 1 + static_cast<int64_t>(w % static_cast<uint32_t>(vocab - 1));
}

// The token id an ids / targets entry holds (floats holding integers), or -1 when it is not an
// integer in [0, vocab): the CPU reference throws mxlab::Error for it; a CUDA kernel, which cannot
// throw, writes NaN wherever the id is used (backend.h, "token networks").
MXLAB_HD int64_t token_index(float v, int64_t vocab) {
  if (!(v >= 0.0f && v < static_cast<float>(vocab))) return -1;
  const int64_t i = static_cast<int64_t>(v);
  return static_cast<float>(i) == v ? i : -1;
}

// Next-token cross-entropy (loss_xent): dlogit = R((q - onehot) * scale), scale = 1 / rows rounded
// to float once (kl_grad_scale(1, rows)), q = kl_prob(e, S).
MXLAB_HD float xent_grad_elem(float q, bool is_target, float scale, bool rb, Rounding rm) {
  return ew_round((q - (is_target ? 1.0f : 0.0f)) * scale, rb, rm);
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
