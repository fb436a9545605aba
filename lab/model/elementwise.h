// Scalar element-wise math shared verbatim by the CPU backend and the CUDA kernels, so that
// element-wise ops and optimizer updates agree bit for bit (see lab/core/hd.h for the rules).
// Transcendentals come from lab/core/detmath.h (deterministic, libm-free).
#pragma once
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/core/hd.h"
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

// Stochastic-rounding seed of one quantized GEMM operand: the run seed mixed with the op id;
// the step (StepScalars.step) is the Philox counter's step word, the flat index the index.
MXLAB_HD uint64_t sr_seed(uint64_t seed, uint64_t op) { return seed ^ (op * 0x9E3779B97F4A7C15ull); }

}  // namespace mxlab
