// The model's configuration types (model_config.h): the precision policy's derived values, the
// FP32 policy, and equality.
#include "lab/model/model_config.h"

namespace mxlab {

Rounding PrecisionConfig::rounding_of(Role r) const {
  switch (r) {
    case Role::weight: return rounding_weight.value_or(rounding);
    case Role::activation: return rounding_activation.value_or(rounding);
    case Role::grad: return rounding_grad.value_or(rounding);
    case Role::ln_affine: return rounding_ln_affine.value_or(rounding);
    case Role::grad_wgrad: return rounding_grad_wgrad.value_or(rounding_of(Role::grad));
  }
  return rounding;
}

bool PrecisionConfig::rounding_uniform() const {
  const Rounding w = rounding_of(Role::weight);
  return rounding_of(Role::activation) == w && rounding_of(Role::grad) == w && rounding_of(Role::ln_affine) == w &&
         rounding_of(Role::grad_wgrad) == w;
}

bool PrecisionConfig::rotates(Gemm g) const {
  if (rotation_of(g) == Rotation::none) return false;
  if (g != Gemm::fprop && !backward) return false;
  NumFmt a = activation, b = weight;
  if (g == Gemm::dgrad) a = grad, b = weight_bwd_fmt();
  if (g == Gemm::wgrad) a = grad_wgrad_fmt(), b = activation_bwd_fmt();
  return elementwise_bf16 || a != NumFmt::fp32 || b != NumFmt::fp32;
}

void PrecisionConfig::make_fp32() {
  weight = activation = grad = NumFmt::fp32;
  weight_bwd = NumFmt::fp32;
  activation_bwd = NumFmt::fp32;
  grad_wgrad = NumFmt::fp32;
  ln_affine = NumFmt::fp32;
  attn_logits = NumFmt::fp32;
  attn_probs = NumFmt::fp32;
  elementwise_bf16 = false;
  // The lab's FP32 ops (the FP32 trajectory's), not the emulator's compositions.
  layernorm = LnOps::fused;
  gelu = GeluOps::fused;
  residual = ResidualPrec::elementwise;
  bias = BiasPrec::fp32;
  ln_beta_grad = true;
  rotation = {Rotation::none, Rotation::none, Rotation::none};
  attention = AttnImpl::exact;
  attention_softmax = AttnSoftmax::standard;
  attention_delta = AttnDelta::lp;
}

PrecisionConfig PrecisionConfig::fp32() {
  PrecisionConfig p;
  p.make_fp32();
  return p;
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.depth == b.depth && a.width == b.width && a.hidden_mult == b.hidden_mult && a.activation == b.activation &&
         a.layernorm == b.layernorm && a.ln_affine == b.ln_affine && a.ln_eps == b.ln_eps && a.fc2_bias == b.fc2_bias &&
         a.init == b.init && a.init_gain == b.init_gain && a.block == b.block && a.heads == b.heads &&
         a.norm == b.norm && a.mxnorm_p == b.mxnorm_p && a.mxnorm_block == b.mxnorm_block && a.causal == b.causal;
}

bool operator==(const TeacherConfig& a, const TeacherConfig& b) {
  return a.depth == b.depth && a.width == b.width && a.activation == b.activation && a.residual == b.residual &&
         a.block == b.block;
}

bool operator==(const PrecisionConfig& a, const PrecisionConfig& b) {
  return a.weight == b.weight && a.activation == b.activation && a.grad == b.grad && a.weight_bwd == b.weight_bwd &&
         a.activation_bwd == b.activation_bwd && a.ln_affine == b.ln_affine && a.elementwise_bf16 == b.elementwise_bf16 &&
         a.backward == b.backward && a.block_size == b.block_size && a.scale_rule == b.scale_rule && a.bump == b.bump &&
         a.rounding_of(PrecisionConfig::Role::weight) == b.rounding_of(PrecisionConfig::Role::weight) &&
         a.rounding_of(PrecisionConfig::Role::activation) == b.rounding_of(PrecisionConfig::Role::activation) &&
         a.rounding_of(PrecisionConfig::Role::grad) == b.rounding_of(PrecisionConfig::Role::grad) &&
         a.rounding_of(PrecisionConfig::Role::ln_affine) == b.rounding_of(PrecisionConfig::Role::ln_affine) &&
         a.grad_wgrad == b.grad_wgrad && a.rounding_grad_wgrad == b.rounding_grad_wgrad &&
         a.elementwise_rounding == b.elementwise_rounding &&
         a.diagnostic_format == b.diagnostic_format && a.attn_logits == b.attn_logits && a.attn_probs == b.attn_probs &&
         a.layernorm == b.layernorm && a.gelu == b.gelu && a.residual == b.residual && a.bias == b.bias &&
         a.ln_beta_grad == b.ln_beta_grad && a.rotation == b.rotation && a.rotation_block == b.rotation_block &&
         a.attention == b.attention && a.attention_tile_r == b.attention_tile_r &&
         a.attention_tile_c == b.attention_tile_c && a.attention_softmax == b.attention_softmax &&
         a.attention_beta == b.attention_beta && a.attention_eps == b.attention_eps &&
         a.attention_delta == b.attention_delta;
}

}  // namespace mxlab
