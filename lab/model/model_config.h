// What the model needs to know about itself: its shape (ModelConfig), the teacher's, the loss,
// and the precision policy of a pass (PrecisionConfig: the MX recipe). The run's configuration
// (lab/config/config.h) holds these as its `model`, `teacher`, `loss`/`kl_temperature` and
// `precision` sections; the model layer never sees the rest of it.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include "lab/model/backend.h"
#include "lab/mx/format.h"

namespace mxlab {

enum class LossKind : uint8_t { mse = 0, kl, xent };  // xent: next-token cross-entropy (data.kind: tokens)
enum class InitKind : uint8_t { pytorch = 0, xavier_normal };
// Residual block of the student (and, with teacher.block, of the teacher): the paper's Eq. 1
// MLP block, or Eq. 11's self-attention sub-block followed by the MLP sub-block (appendix D).
enum class BlockKind : uint8_t { mlp = 0, attention };
// Normalisation before each GEMM input (lab/model/README.md "Norms"): none = layernorm: false.
enum class NormKind : uint8_t { layernorm = 0, rmsnorm, mxnorm, none };

struct ModelConfig {
  int depth = 4;               // L residual blocks
  int width = 512;             // d
  int hidden_mult = 4;         // H = hidden_mult * d (swiglu: H' = round(hidden_mult*2/3 * d) = round(8d/3))
  Act activation = Act::gelu;  // relu | gelu | gelu_tanh | swiglu | linear
  bool layernorm = true;
  bool ln_affine = true;       // learnable gamma, beta
  float ln_eps = 1e-5f;
  bool fc2_bias = true;        // b2
  InitKind init = InitKind::pytorch;
  float init_gain = 1.0f;      // xavier_normal gain
  BlockKind block = BlockKind::mlp;
  int heads = 1;               // attention heads (block: attention); head dim = width / heads
  NormKind norm = NormKind::layernorm;  // with layernorm: false there is no norm (see effective_norm)
  int mxnorm_p = 2;            // MXNorm power mean of the block absmaxes: 1 | 2
  int mxnorm_block = 32;       // MXNorm block length along the width (16 | 32 | 64)
  bool causal = false;         // attention blocks: query r of a sequence sees keys t <= r only

  // The norm the model applies: `norm`, or none when `layernorm` is false.
  NormKind effective_norm() const { return layernorm ? norm : NormKind::none; }
};

struct TeacherConfig {
  int depth = 0;               // 0 = model.depth
  int width = 0;               // 0 = model.width (hidden width w of each block)
  std::optional<Act> activation;  // unset = model.activation
  bool residual = false;       // false: plain MLP of the paper's code; true: student-shaped, no LN
  BlockKind block = BlockKind::mlp;  // attention: Eq. 11 blocks without norms (heads = model.heads)
};

// The training loss and its one parameter (the run's `loss` and `kl_temperature`).
struct LossSpec {
  LossKind kind = LossKind::mse;
  float kl_temperature = 1.0f;
};

// How the MX step evaluates the ops between its GEMMs (lab/model/README.md, "The paper's
// emulator"): the lab's fused ops (each rounded once, the default), or the MX emulation
// library's (microxcaling) compositions of bf16 vector ops, as the proxy-model paper's code ran them.
enum class LnOps : uint8_t { fused = 0, vector };                       // precision.layernorm
enum class GeluOps : uint8_t { fused = 0, vector, vector_teacher };     // precision.gelu
enum class ResidualPrec : uint8_t { elementwise = 0, fp32 };            // precision.residual
enum class BiasPrec : uint8_t { fp32 = 0, elementwise };                // precision.bias

// The GEMMs of a linear layer: Fprop Y = X W^T, Dgrad dX = dY W, Wgrad dW = dY^T X (YAML names
// fprop, dgrad, wgrad: precision.gemm, precision.rotation).
enum class Gemm : uint8_t { fprop = 0, dgrad, wgrad };
constexpr int kLinearGemms = 3;
// precision.rotation (lab/mx/README.md, "Block Hadamard rotation"): a GEMM's two operands
// rotated along its reduction axis before quantization by a block Hadamard matrix, after a random
// +-1 diagonal for random_hadamard.
enum class Rotation : uint8_t { none = 0, hadamard, random_hadamard };
// How the attention sub-block computes softmax(scale Q K^T) V (lab/model/README.md, "Flash
// attention in bf16"): exact = the lab's two GEMMs and row softmax under the policy's roles;
// flash_bf16 = a CPU reference of FlashAttention-2's kernel in bf16 (tiles, online softmax, S and
// P-bar in FP32, P-bar, V, O in bf16), the numerics whose rounding bias the flash-attention paper
// traces (Qiu & Yao).
enum class AttnImpl : uint8_t { exact = 0, flash_bf16 };                // precision.attention
enum class AttnSoftmax : uint8_t { standard = 0, stabilized };          // precision.attention_softmax
enum class AttnDelta : uint8_t { lp = 0, hp };                          // precision.attention_delta

// DESIGN.md section 4. Roles name a NumFmt; `same` in YAML resolves weight_bwd/activation_bwd/
// grad_wgrad. By GEMM of a linear layer: Fprop Y = X W^T reads (activation, weight), Dgrad
// dX = dY W reads (grad, weight_bwd), Wgrad dW = dY^T X reads (grad_wgrad, activation_bwd).
// YAML `precision.gemm: {fprop, dgrad, wgrad}` sets those pairs (config_io.h, apply_gemm).
struct PrecisionConfig {
  NumFmt weight = NumFmt::mxfp8_e4m3;
  NumFmt activation = NumFmt::mxfp8_e4m3;
  NumFmt grad = NumFmt::mxfp8_e4m3;       // dY in the dgrad GEMMs (and the attention-internal backward GEMMs)
  std::optional<NumFmt> weight_bwd;       // unset ("same") = weight
  std::optional<NumFmt> activation_bwd;   // unset ("same") = activation
  std::optional<NumFmt> grad_wgrad;       // dY in the wgrad GEMMs; unset ("same") = grad
  NumFmt ln_affine = NumFmt::mxfp8_e4m3;  // fp32 means "none" (YAML: none|bf16|<mx format>)
  bool elementwise_bf16 = true;           // YAML: elementwise: fp32 | bf16
  bool backward = true;                   // false: forward-only quantization
  int block_size = 32;
  ScaleRule scale_rule = ScaleRule::floor;
  Bump bump = Bump::clamp;                // floor_bump: clamp (only blocks that would clamp) | always
  // Element rounding of the MX roles. `rounding` is the mode of every role; a role may
  // override it (YAML `rounding: {weight: M, activation: M, grad: M, ln_affine: M, grad_wgrad: M}`):
  // weight = W in every GEMM (weight, weight_bwd), activation = X in the forward and
  // wgrad GEMMs (activation, activation_bwd), grad = dY in both backward GEMMs (grad, and
  // grad_wgrad unless grad_wgrad has a mode of its own), ln_affine = Q(gamma), Q(beta).
  Rounding rounding = Rounding::nearest_even;
  std::optional<Rounding> rounding_weight, rounding_activation, rounding_grad, rounding_ln_affine;
  std::optional<Rounding> rounding_grad_wgrad;  // unset = the grad role's mode
  Rounding elementwise_rounding = Rounding::nearest_even;  // nearest_even | nearest_away
  NumFmt diagnostic_format = NumFmt::mxfp8_e4m3;  // last-bin statistics of tensors not quantized
  // Attention GEMM operands (model.block: attention; lab/model/README.md "Attention"):
  std::optional<NumFmt> attn_logits;      // Q and K in S = Q K^T (and in dQ, dK); unset ("same") = activation
  std::optional<NumFmt> attn_probs;       // P and V in O = P V (and in dV, dP); unset ("same") = activation
  // The emulator's op compositions (lab/model/README.md, "The paper's emulator"; MLP blocks only):
  LnOps layernorm = LnOps::fused;         // vector: microxcaling's LayerNorm, forward and backward, in vector ops
  GeluOps gelu = GeluOps::fused;          // vector: microxcaling's GeLU (tanh form in bf16 vector ops) for
                                          // student and teacher; vector_teacher: for the teacher only
  ResidualPrec residual = ResidualPrec::elementwise;  // fp32: the residual stream, its gradient and the
                                          // loss gradient stay FP32 (their readers round them)
  BiasPrec bias = BiasPrec::fp32;         // elementwise: fc2's bias rounded before it is added, its
                                          // gradient after its sum (microxcaling's Linear)
  bool ln_beta_grad = true;               // false: the layernorm bias gets no gradient (the paper's copy of
                                          // microxcaling)
  // Block Hadamard rotation per GEMM of the linear layers, indexed by Gemm (YAML `rotation: M` for all
  // three, or `rotation: {fprop: M, dgrad: M, wgrad: M}`), with blocks of rotation_block along K.
  std::array<Rotation, kLinearGemms> rotation = {Rotation::none, Rotation::none, Rotation::none};
  int rotation_block = 32;
  // Attention numerics (model.block: attention; lab/model/README.md, "Flash attention in bf16"):
  AttnImpl attention = AttnImpl::exact;
  int attention_tile_r = 128;             // flash_bf16: Br (query rows per tile)
  int attention_tile_c = 64;              // flash_bf16: Bc (keys per tile): the online softmax's blocks
  AttnSoftmax attention_softmax = AttnSoftmax::standard;  // stabilized: the paper's Algorithm 3
  float attention_beta = 2.0f;            // Algorithm 3's beta (> 1): m = beta r_m for a repeated positive max
  float attention_eps = 1e-3f;            // Algorithm 3's epsilon: entries within it of the row max are ties
  AttnDelta attention_delta = AttnDelta::lp;  // hp: delta = rowsum(dO o O) from the FP32 O, not the bf16 one

  NumFmt weight_bwd_fmt() const { return weight_bwd.value_or(weight); }
  NumFmt activation_bwd_fmt() const { return activation_bwd.value_or(activation); }
  NumFmt grad_wgrad_fmt() const { return grad_wgrad.value_or(grad); }
  enum class Role : uint8_t { weight = 0, activation, grad, ln_affine, grad_wgrad };
  Rounding rounding_of(Role r) const;
  bool rounding_uniform() const;  // every role (grad_wgrad included) rounds with the same mode
  NumFmt attn_logits_fmt() const { return attn_logits.value_or(activation); }
  NumFmt attn_probs_fmt() const { return attn_probs.value_or(activation); }
  Rotation rotation_of(Gemm g) const { return rotation[static_cast<size_t>(g)]; }
  // Whether GEMM g of every linear layer is rotated: its rotation is not none, its pass quantizes
  // (the dgrad and wgrad GEMMs only under backward: true), and an operand is rounded at all (a
  // format other than fp32, or bf16 element-wise rounding): rotating two FP32 operands would
  // only add rounding to an FP32 product.
  bool rotates(Gemm g) const;
  bool flash() const { return attention == AttnImpl::flash_bf16; }
  // Every role FP32, no bf16 element-wise rounding, the lab's own (fused) ops, no rotation and exact
  // attention (standard softmax, delta from O); the block sizes, scale rule, roundings and the flash
  // tile, beta and epsilon are left as they are. The `to_fp32` intervention preset.
  void make_fp32();
  // The all-FP32 policy of the reference trajectory and the shadow pass: make_fp32() of the
  // defaults.
  static PrecisionConfig fp32();
};

bool operator==(const ModelConfig& a, const ModelConfig& b);
bool operator==(const TeacherConfig& a, const TeacherConfig& b);
bool operator==(const PrecisionConfig& a, const PrecisionConfig& b);

}  // namespace mxlab
