// Pieces of the model shared by its two translation units (mlp.cpp: shapes, norms, the MLP
// sub-block and the passes; attention.cpp: the self-attention sub-block of Eq. 11): how GEMM
// operands are built from the precision policy, the stochastic-rounding op ids, and the norm
// helpers. Internal to lab/model; nothing outside includes it.
#pragma once
#include <cstdint>
#include <optional>

#include "lab/core/error.h"
#include "lab/model/elementwise.h"
#include "lab/model/fused_plan.h"
#include "lab/model/mlp.h"

namespace mxlab::model_detail {

// Stochastic-rounding op ids: one per (layer, quantized operand), so that no two quantizations
// of a step share a random stream (lab/model/README.md lists them).
enum class OpId : int {
  fc1_x = 0, fc1_w,   // forward h = y W1^T
  fc2_x, fc2_w,       // forward o = a W2^T
  dw2_dy, dw2_x,      // wgrad dW2 = dA^T a
  da_dy, da_w,        // dgrad da = dA W2
  dw1_dy, dw1_x,      // wgrad dW1 = dh^T y
  dy_dy, dy_w,        // dgrad dy = dh W1
  ln_gamma, ln_beta,  // Q(gamma), Q(beta)
};
constexpr int kOpsPerLayer = 16;
inline uint64_t op_id(int layer, OpId op) {
  return static_cast<uint64_t>(layer) * kOpsPerLayer + static_cast<uint64_t>(op) + 1;
}

// The attention sub-block's operands get ids of their own (above every MLP id, so the MLP's
// random streams are those of a network without attention).
enum class AttnOp : int {
  qkv_x = 0, qkv_w,       // forward qkv = y1 Wqkv^T
  s_q, s_k,               // forward S = Q K^T
  o_p, o_v,               // forward O = P V
  out_x, out_w,           // forward o = ctx Wo^T
  dwo_dz, dwo_x,          // wgrad dWo = dZ^T ctx
  dctx_dz, dctx_w,        // dgrad dctx = dZ Wo
  dp_do, dp_v,            // dP = dO V^T
  dv_p, dv_do,            // dV = P^T dO
  dq_ds, dq_k,            // dQ = dS K
  dk_ds, dk_q,            // dK = dS^T Q
  dwqkv_dq, dwqkv_x,      // wgrad dWqkv = dQKV^T y1
  dy1_dq, dy1_w,          // dgrad dy1 = dQKV Wqkv
  ln_gamma, ln_beta,      // Q(gamma1), Q(beta1)
};
constexpr int kAttnOpsPerLayer = 32;
constexpr uint64_t kAttnOpBase = uint64_t{1} << 40;
inline uint64_t op_id(int layer, AttnOp op) {
  return kAttnOpBase + static_cast<uint64_t>(layer) * kAttnOpsPerLayer + static_cast<uint64_t>(op) + 1;
}

// The linear-layer GEMM an operand belongs to (what precision.rotation names), or none: the norm
// gains and the attention-internal GEMMs (S = Q K^T, O = P V and their backward GEMMs).
inline std::optional<Gemm> linear_gemm(OpId op) {
  switch (op) {
    case OpId::fc1_x: case OpId::fc1_w: case OpId::fc2_x: case OpId::fc2_w: return Gemm::fprop;
    case OpId::da_dy: case OpId::da_w: case OpId::dy_dy: case OpId::dy_w: return Gemm::dgrad;
    case OpId::dw2_dy: case OpId::dw2_x: case OpId::dw1_dy: case OpId::dw1_x: return Gemm::wgrad;
    case OpId::ln_gamma: case OpId::ln_beta: break;
  }
  return std::nullopt;
}
inline std::optional<Gemm> linear_gemm(AttnOp op) {
  switch (op) {
    case AttnOp::qkv_x: case AttnOp::qkv_w: case AttnOp::out_x: case AttnOp::out_w: return Gemm::fprop;
    case AttnOp::dctx_dz: case AttnOp::dctx_w: case AttnOp::dy1_dq: case AttnOp::dy1_w: return Gemm::dgrad;
    case AttnOp::dwo_dz: case AttnOp::dwo_x: case AttnOp::dwqkv_dq: case AttnOp::dwqkv_x: return Gemm::wgrad;
    default: break;
  }
  return std::nullopt;
}
// A GEMM's two operands have consecutive op ids, the first even: the first one's id names the GEMM
// (its rotation's random signs are keyed on it, so both operands get the same signs).
template <class Op>
Op gemm_first_operand(Op op) {
  return static_cast<Op>(static_cast<int>(op) & ~1);
}
// The unembedding GEMM of a token network (logits = A_L U^T) and its backward, above every
// layer's ids.
enum class UnembedOp : int {
  x = 0, w,     // forward logits = A_L U^T
  dw_dy, dw_x,  // wgrad dU = dlogits^T A_L
  dx_dy, dx_w,  // dgrad dA_L = dlogits U
};
constexpr uint64_t kUnembedOpBase = uint64_t{1} << 41;
inline uint64_t op_id(int /*layer*/, UnembedOp op) { return kUnembedOpBase + static_cast<uint64_t>(op) + 1; }
// The token network's unembedding is not one of the layers' linear GEMMs precision.rotation names:
// never rotated (its Dgrad reduces over the vocabulary, which need not be a multiple of the block).
inline std::optional<Gemm> linear_gemm(UnembedOp) { return std::nullopt; }

using Role = PrecisionConfig::Role;

// The QuantSpec of a role with format f under policy p. MX formats round elements with the
// role's rounding mode (precision.rounding, per role); scalar formats (bf16/fp16) only round to
// nearest, so they take the element-wise rounding mode.
inline QuantSpec role_spec(const PrecisionConfig& p, NumFmt f, Role role, uint64_t seed) {
  QuantSpec s;
  s.fmt = f;
  s.block = p.block_size;
  s.rule = p.scale_rule;
  s.bump = p.bump;
  s.rounding = is_mx(f) ? p.rounding_of(role) : p.elementwise_rounding;
  s.seed = seed;
  return s;
}

// The spec the last-bin statistics of a role are counted under: the role's own MX spec, or
// the diagnostic format for a role that is not MX-quantized (round to nearest even there:
// a diagnostic must not depend on random bits).
inline QuantSpec stats_spec(const PrecisionConfig& p, NumFmt f, Role role, uint64_t seed) {
  if (is_mx(f)) return role_spec(p, f, role, seed);
  QuantSpec s = role_spec(p, p.diagnostic_format, role, seed);
  if (s.rounding == Rounding::stochastic) s.rounding = Rounding::nearest_even;
  return s;
}

// How a GEMM operand is stored against its reduction axis K (GemmOperand::k_contiguous): rows
// along K (A stored [M x K], B [N x K]), or K down the rows (A stored [K x M], B [K x N]).
enum class Layout : uint8_t { k_contiguous, k_strided };

// How the GEMM operands of one pass direction are built from the policy. The rounding role of
// an operand: weight (W of every GEMM), activation (X of forward and wgrad GEMMs, and the
// attention GEMMs' Q, K, P, V), grad (dY of the dgrad and attention-internal GEMMs), grad_wgrad
// (dY of the linear layers' wgrad GEMMs; its mode is grad's unless it has its own).
struct OperandRules {
  const PrecisionConfig* p;  // configured policy (formats, and the statistics specs)
  bool quantize;             // false: operands stay FP32 (backward with `backward: false`)
  uint64_t seed;
  bool collect;              // fill statistics slots
  int stats_base;            // slot offset of this pass (PassPolicy::stats_base)

  // The forward pass's operands: quantized per their formats.
  static OperandRules forward(const PassPolicy& pol) {
    return {&pol.p, true, pol.seed, pol.collect_stats, pol.stats_base};
  }
  // The backward pass's: FP32 under `backward: false` (statistics still counted under the formats).
  static OperandRules backward(const PassPolicy& pol) {
    return {&pol.p, pol.p.backward, pol.seed, pol.collect_stats, pol.stats_base};
  }

  template <class Op>
  GemmOperand make(const float* data, Layout layout, NumFmt fmt, Role role, int layer, Op op, int slot = -1) const {
    GemmOperand o;
    o.p = data;
    o.k_contiguous = layout == Layout::k_contiguous;
    o.q = role_spec(*p, quantize ? fmt : NumFmt::fp32, role, seed);
    o.round_bf16_first = quantize && p->elementwise_bf16;
    o.bf16_mode = p->elementwise_rounding;
    o.sr_op = op_id(layer, op);
    // precision.rotation: both operands of a rotated linear-layer GEMM, the same signs for both
    // (random_hadamard: keyed on sr_seed(seed, id of the GEMM's first operand), salt = the step).
    if (const std::optional<Gemm> g = linear_gemm(op); g && quantize && p->rotates(*g)) {
      o.rot.block = p->rotation_block;
      o.rot.random_signs = p->rotation_of(*g) == Rotation::random_hadamard;
      o.rot.seed = sr_seed(seed, op_id(layer, gemm_first_operand(op)));
    }
    if (collect && slot >= 0) {
      o.stats_slot = stats_base + slot;
      o.stats_q = stats_spec(*p, fmt, role, seed);
    }
    return o;
  }
};

inline ElementwiseRound policy_round(const PrecisionConfig& p) {
  return ElementwiseRound{p.elementwise_bf16, p.elementwise_rounding};
}

// The emulator's op compositions of a pass (lab/model/README.md, "The paper's emulator").
struct PassOps {
  bool ln_vector = false;      // precision.layernorm: vector
  bool beta_grad = true;       // precision.ln_beta_grad
  bool residual_fp32 = false;  // precision.residual: fp32
  bool bias_rounded = false;   // precision.bias: elementwise
};
inline PassOps pass_ops(const PrecisionConfig& p) {
  PassOps o;
  o.ln_vector = p.layernorm == LnOps::vector;
  o.beta_grad = p.ln_beta_grad;
  o.residual_fp32 = p.residual == ResidualPrec::fp32;
  o.bias_rounded = p.bias == BiasPrec::elementwise;
  return o;
}
// The rounding of the residual stream, its gradient and the loss gradient: R, or none under
// precision.residual: fp32.
inline ElementwiseRound residual_round(const PassOps& o, const ElementwiseRound& R) {
  return o.residual_fp32 ? ElementwiseRound{} : R;
}
// The activation a pass evaluates: the network's, or the library's vector GeLU in its place
// (precision.gelu: vector for every network, vector_teacher for the teacher only).
inline Act pass_act(const NetShape& s, const PrecisionConfig& p) {
  const bool gelu = s.act == Act::gelu || s.act == Act::gelu_tanh;
  const bool vec = p.gelu == GeluOps::vector || (p.gelu == GeluOps::vector_teacher && s.is_teacher);
  return gelu && vec ? Act::gelu_vector : s.act;
}

inline const ParamGroup& group(const NetShape& s, int layer, ParamGroup::Kind kind) {
  const ParamGroup* g = s.find(layer, kind);
  MXLAB_ASSERT(g != nullptr, "layer ", layer, " has no parameter group of kind ", static_cast<int>(kind));
  return *g;
}

// One norm of a block and the parameters, statistics and random streams of its gain and bias:
// the norm before the MLP sub-block (LN_2 of Eq. 11, LN of Eq. 1) or before attention (LN_1).
struct NormSite {
  ParamGroup::Kind gamma, beta;
  StatTensor gamma_stat, beta_stat;
  uint64_t gamma_op, beta_op;  // stochastic-rounding op ids
};
NormSite mlp_norm_site(int layer);
NormSite attn_norm_site(int layer);

// Q(gamma) (and Q(beta) for layernorm) of `site` into layer `layer`'s slot of ws.gq_gamma /
// ws.gq_beta, counting their statistics when pol.collect_stats; returns the Q(gamma) slot, or
// null without affine gains.
const float* norm_gains(Backend& be, const NetShape& s, const float* params, int layer, const NormSite& site,
                        Workspace& ws, const PassPolicy& pol);
// The backward's Q(gamma): the one the forward of this workspace wrote for `layer` and `site`
// (kept per layer; the trainer runs forward and backward on one workspace, the same params and
// policy). Null without affine gains.
const float* backward_gain(const NetShape& s, int layer, const NormSite& site, const Workspace& ws);
// The norm of `site` on x [rows x d] into y (the next GEMM's activation operand), xhat, rstd.
// Returns the weight the next GEMM uses: W itself, or for MXNorm with gains ws.w_fused =
// R(W o Q(gamma)) (W is [w_rows x d]; the gain moves onto the weight, papers/mxnorm.md 3.7).
// y_op (optional, with the pass's plan): the GEMM operand that reads y next. The layernorm
// hands it to layernorm_fwd as its q_out (FusedPlan::produced_by_writer); the emulator's vector
// layernorm, RMSNorm and MXNorm do not.
const float* norm_forward(Backend& be, const NetShape& s, const float* params, int layer, const NormSite& site,
                          const float* x, float* y, float* xhat, float* rstd, const float* W, int64_t w_rows,
                          Workspace& ws, const PassPolicy& pol, const ElementwiseRound& R,
                          FusedPlan* plan = nullptr, const GemmOperand* y_op = nullptr);
// After the wgrad of the GEMM that follows the norm: MXNorm with gains scales that weight's
// gradient [w_rows x d] by Q(gamma) (gq, from norm_gains), since the GEMM saw W o Q(gamma).
void norm_scale_wgrad(Backend& be, const NetShape& s, const float* gq, float* dW, int64_t w_rows,
                      const ElementwiseRound& R);
// The norm's backward: dy (gradient of y, read through dy_in) -> dx; gain/bias gradients into
// `grads`. dy_in may round only where norm_rounds_dy_as_read(s).
void norm_backward(Backend& be, const NetShape& s, int layer, const NormSite& site, const float* gq,
                   const float* dy, const float* xhat, const float* rstd, float* dx, float* grads, Workspace& ws,
                   const ElementwiseRound& R, const ElementwiseRound& dy_in, const PassOps& po = PassOps{});
// Whether the norm's backward is dy's only reader and rounds it as it reads it (layernorm): the
// GEMM that computes dy then leaves it unrounded (lab/model/README.md, "Deferred output rounding").
inline bool norm_rounds_dy_as_read(const NetShape& s) { return s.layernorm && s.norm == NormKind::layernorm; }

// The end of a sub-block's backward: the norm's backward on dy (the gradient of the norm's
// output; without a norm dy is already the input's gradient), then the residual stream:
// dA = R(dA + dx) (plain teacher: dA = dx). dA_q (optional): the GEMM operand that reads dA
// next, handed to the add as its q_out (Backend::add; "Producer-side quantization").
// `po` (the MLP sub-block): the emulator's layernorm backward, its beta gradient, and dA's rounding
// (dA = dA + dx unrounded under residual: fp32).
void norm_backward_into_residual(Backend& be, const NetShape& s, int layer, const NormSite& site, const float* gq,
                                 const float* dy, const float* xhat, const float* rstd, float* dA, float* grads,
                                 Workspace& ws, const ElementwiseRound& R, const ElementwiseRound& dy_in,
                                 const GemmOperand* dA_q = nullptr, const PassOps& po = PassOps{});

// The self-attention sub-block of Eq. 11 for layer k (attention.cpp): forward A -> ws.z[k];
// backward consumes dZ (gradient of z_k, in place) and leaves the gradient of A_{k-1} in it.
void attention_forward(Backend& be, const NetShape& s, const float* params, int k, const float* A, Workspace& ws,
                       const PassPolicy& pol);
void attention_backward(Backend& be, const NetShape& s, const float* params, int k, float* dZ, Workspace& ws,
                        float* grads, const PassPolicy& pol);

}  // namespace mxlab::model_detail
