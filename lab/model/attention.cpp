// The self-attention sub-block of the paper's Eq. 11 (appendix D): z_k = A_{k-1} +
// SelfAttn(LN_1(A_{k-1})), multi-head (causal with model.causal), on sequences of s.seq_len tokens (rows
// b*S .. b*S + S - 1 of a pass form sequence b). Every GEMM quantizes its operands per the
// policy's roles (lab/model/README.md "Attention" lists the op sequence, roles and statistics);
// under precision.attention: flash_bf16 the flash kernel in bf16 replaces the two attention GEMMs
// and the softmax between them ("Flash attention in bf16").
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/model/model_internal.h"

namespace mxlab::model_detail {

namespace {

// Shapes of one attention pass: T tokens = nb sequences of S, h heads of dh features.
struct AttnDims {
  int64_t T, d, h, dh, S, nb, bh;
  float scale;  // 1 / sqrt(dh), the logit scale (rounded to float once)
};

AttnDims dims(const NetShape& s, const Workspace& ws) {
  AttnDims a;
  a.T = ws.batch;
  a.d = s.d;
  a.h = s.heads;
  a.dh = s.head_dim();
  a.S = s.seq_len;
  a.nb = a.T / a.S;
  a.bh = a.nb * a.h;
  a.scale = 1.0f / sqrtf_ieee(static_cast<float>(a.dh));
  return a;
}

// softmax(scale Q K^T) V per (sequence, head) as two GEMMs around a row softmax, each GEMM
// quantizing its operands per attn_logits / attn_probs (precision.attention: exact); the heads
// merged into ws.ctx[k].
void exact_attention_forward(Backend& be, int k, Workspace& ws, const OperandRules& ops, const AttnDims& a,
                             NumFmt f_logits, NumFmt f_probs, const ElementwiseRound& R, bool causal) {
  // Logits [S x S] = Q [S x dh] . K [S x dh]^T per (sequence, head); P = softmax(scale * logits).
  be.gemm_batched(a.bh, a.S, a.S, a.dh,
                  ops.make(ws.qh[k], Layout::k_contiguous, f_logits, Role::activation, k, AttnOp::s_q,
                           stats_slot(k, StatTensor::attn_q)),
                  ops.make(ws.kh[k], Layout::k_contiguous, f_logits, Role::activation, k, AttnOp::s_k,
                           stats_slot(k, StatTensor::attn_k)),
                  ws.probs[k], 0.0f, R);
  // model.causal: the logits of later keys are -inf, so their P is exactly 0 (and so is their dS).
  if (causal) be.mask_causal(ws.probs[k], a.bh, a.S);
  be.softmax_fwd(ws.probs[k], ws.probs[k], ws.rowmax[k], a.bh * a.S, a.S, a.scale, R);
  // O [S x dh] = P [S x S] . V: V is stored [S x dh] = [K x N], so its blocks run along the sequence.
  be.gemm_batched(a.bh, a.S, a.dh, a.S,
                  ops.make(ws.probs[k], Layout::k_contiguous, f_probs, Role::activation, k, AttnOp::o_p,
                           stats_slot(k, StatTensor::attn_p)),
                  ops.make(ws.vh[k], Layout::k_strided, f_probs, Role::activation, k, AttnOp::o_v,
                           stats_slot(k, StatTensor::attn_v)),
                  ws.ctx_h, 0.0f, R);
  be.heads_merge(ws.ctx_h, ws.ctx[k], a.nb, a.S, a.h, a.dh, a.d, 0);
}

// The backward of exact_attention_forward from dO (in ws.ctx_h): dQ, dK, dV into ws.d_qh, d_kh, d_vh.
void exact_attention_backward(Backend& be, int k, Workspace& ws, const OperandRules& ops, const AttnDims& a,
                              NumFmt f_grad, NumFmt f_logits, NumFmt f_probs, const ElementwiseRound& R) {
  // dP [S x S] = dO [S x dh] . V [S x dh]^T (over dh); dV [S x dh] = P^T dO (over the queries).
  be.gemm_batched(a.bh, a.S, a.S, a.dh,
                  ops.make(ws.ctx_h, Layout::k_contiguous, f_grad, Role::grad, k, AttnOp::dp_do,
                           stats_slot(k, StatTensor::grad_ctx)),
                  ops.make(ws.vh[k], Layout::k_contiguous, f_probs, Role::activation, k, AttnOp::dp_v), ws.d_probs,
                  0.0f, R);
  be.gemm_batched(a.bh, a.S, a.dh, a.S,
                  ops.make(ws.probs[k], Layout::k_strided, f_probs, Role::activation, k, AttnOp::dv_p),
                  ops.make(ws.ctx_h, Layout::k_strided, f_grad, Role::grad, k, AttnOp::dv_do), ws.d_vh, 0.0f, R);
  // dS = scale * softmax' (the logits' gradient), in place over dP.
  be.softmax_bwd(ws.probs[k], ws.d_probs, ws.d_probs, a.bh * a.S, a.S, a.scale, R);
  // dQ [S x dh] = dS K (over the keys); dK [S x dh] = dS^T Q (over the queries).
  be.gemm_batched(a.bh, a.S, a.dh, a.S,
                  ops.make(ws.d_probs, Layout::k_contiguous, f_grad, Role::grad, k, AttnOp::dq_ds,
                           stats_slot(k, StatTensor::grad_logits)),
                  ops.make(ws.kh[k], Layout::k_strided, f_logits, Role::activation, k, AttnOp::dq_k), ws.d_qh, 0.0f, R);
  be.gemm_batched(a.bh, a.S, a.dh, a.S, ops.make(ws.d_probs, Layout::k_strided, f_grad, Role::grad, k, AttnOp::dk_ds),
                  ops.make(ws.qh[k], Layout::k_strided, f_logits, Role::activation, k, AttnOp::dk_q), ws.d_kh, 0.0f, R);
}

}  // namespace

void attention_forward(Backend& be, const NetShape& s, const float* params, int k, const float* A, Workspace& ws,
                       const PassPolicy& pol) {
  const PrecisionConfig& p = pol.p;
  const ElementwiseRound R = policy_round(p);
  const OperandRules ops = OperandRules::forward(pol);
  const AttnDims a = dims(s, ws);
  const float* Wqkv = params + group(s, k, ParamGroup::wqkv).offset;
  const float* Wo = params + group(s, k, ParamGroup::wo).offset;
  if (s.layernorm)
    Wqkv = norm_forward(be, s, params, k, attn_norm_site(k), A, ws.attn_y[k], ws.attn_xhat[k], ws.attn_rstd[k],
                        Wqkv, 3 * a.d, ws, pol, R);
  // Without a norm ws.attn_y[k] is A itself (Workspace::make aliases it).
  const float* y1 = ws.attn_y[k];

  // qkv [T x 3d] = y1 [T x d] . Wqkv [3d x d]^T, then Q, K, V to the heads layout [nb*h x S x dh].
  be.gemm(a.T, 3 * a.d, a.d,
          ops.make(y1, Layout::k_contiguous, p.activation, Role::activation, k, AttnOp::qkv_x,
                   stats_slot(k, StatTensor::attn_ln_out)),
          ops.make(Wqkv, Layout::k_contiguous, p.weight, Role::weight, k, AttnOp::qkv_w), ws.qkv[k], 0.0f, R);
  be.heads_split(ws.qkv[k], ws.qh[k], a.nb, a.S, a.h, a.dh, 3 * a.d, 0);
  be.heads_split(ws.qkv[k], ws.kh[k], a.nb, a.S, a.h, a.dh, 3 * a.d, a.d);
  be.heads_split(ws.qkv[k], ws.vh[k], a.nb, a.S, a.h, a.dh, 3 * a.d, 2 * a.d);
  ws.attn_flash[static_cast<size_t>(k)] = p.flash();
  if (p.flash()) {
    // The flash kernel in bf16 (lab/model/flash_attention.h): O_lp, O_hp, lse, the row maxima and the
    // row statistics per (sequence, head); Wo reads O_lp.
    be.flash_attn_fwd(ws.qh[k], ws.kh[k], ws.vh[k], ws.fa_o[k], ws.fa_o_hp[k], ws.fa_lse[k], ws.rowmax[k],
                      ws.fa_stats[k], a.bh, a.S, a.dh, a.scale, flash_spec(p, s));
    be.heads_merge(ws.fa_o[k], ws.ctx[k], a.nb, a.S, a.h, a.dh, a.d, 0);
  } else {
    exact_attention_forward(be, k, ws, ops, a, p.attn_logits_fmt(), p.attn_probs_fmt(), R, s.causal);
  }
  // o [T x d] = ctx . Wo^T; z = A + R(o + bo) (the plain teacher: z = o).
  const ParamGroup* bo = s.find(k, ParamGroup::bo);
  // With the residual, o stays unrounded in ws.y and residual_add (its one reader) rounds it as it reads it.
  const OutputRounding o_round = output_rounding(R, s.residual ? OutputReader::one_op : OutputReader::several);
  float* o = s.residual ? ws.y : ws.z[k];
  be.gemm(a.T, a.d, a.d,
          ops.make(ws.ctx[k], Layout::k_contiguous, p.activation, Role::activation, k, AttnOp::out_x,
                   stats_slot(k, StatTensor::attn_ctx)),
          ops.make(Wo, Layout::k_contiguous, p.weight, Role::weight, k, AttnOp::out_w), o, 0.0f, o_round.by_gemm);
  MXLAB_ASSERT(s.residual || bo == nullptr, "a plain (non-residual) block has no output bias");
  if (s.residual) be.residual_add(ws.z[k], A, ws.y, bo ? params + bo->offset : nullptr, a.T, a.d, R, o_round.by_reader);
}

void attention_backward(Backend& be, const NetShape& s, const float* params, int k, float* dZ, Workspace& ws,
                        float* grads, const PassPolicy& pol) {
  const PrecisionConfig& p = pol.p;
  // As in backward(): `backward: false` runs this in FP32 (statistics still counted), except the flash
  // kernel's backward, which is the kernel's own bf16 arithmetic under either setting.
  const ElementwiseRound R = p.backward ? policy_round(p) : ElementwiseRound{};
  const OperandRules ops = OperandRules::backward(pol);
  // The projections' wgrad GEMMs read dY under grad_wgrad; the attention-internal GEMMs' gradient
  // operands (dO, dS) stay under grad.
  const NumFmt w_bwd = p.weight_bwd_fmt(), x_bwd = p.activation_bwd_fmt(), g_wgrad = p.grad_wgrad_fmt();
  const AttnDims a = dims(s, ws);
  const ParamGroup& gqkv = group(s, k, ParamGroup::wqkv);
  const ParamGroup& go = group(s, k, ParamGroup::wo);
  const float* Wqkv = params + gqkv.offset;
  const float* Wo = params + go.offset;

  if (const ParamGroup* bo = s.find(k, ParamGroup::bo)) be.col_sum(dZ, grads + bo->offset, a.T, a.d);
  // dWo [d x d] = dZ^T ctx (reduction over tokens); dctx [T x d] = dZ Wo (over d).
  be.gemm(a.d, a.d, a.T, ops.make(dZ, Layout::k_strided, g_wgrad, Role::grad_wgrad, k, AttnOp::dwo_dz),
          ops.make(ws.ctx[k], Layout::k_strided, x_bwd, Role::activation, k, AttnOp::dwo_x), grads + go.offset, 0.0f,
          R);
  be.gemm(a.T, a.d, a.d,
          ops.make(dZ, Layout::k_contiguous, p.grad, Role::grad, k, AttnOp::dctx_dz,
                   stats_slot(k, StatTensor::grad_attn_out)),
          ops.make(Wo, Layout::k_strided, w_bwd, Role::weight, k, AttnOp::dctx_w), ws.d_ln, 0.0f, R);
  be.heads_split(ws.d_ln, ws.ctx_h, a.nb, a.S, a.h, a.dh, a.d, 0);  // dO in the heads layout
  MXLAB_ASSERT(static_cast<bool>(ws.attn_flash[static_cast<size_t>(k)]) == p.flash(),
               "the attention backward runs under another attention implementation than its forward");
  if (p.flash()) {
    // The flash kernel's backward (lab/model/flash_attention.h): dQ, dK, dV from Q, K, V, O_lp, O_hp,
    // dO and lse; the delta it used (and delta_hp) kept for the instruments.
    be.flash_attn_bwd(ws.qh[k], ws.kh[k], ws.vh[k], ws.fa_o[k], ws.fa_o_hp[k], ws.ctx_h, ws.fa_lse[k], ws.d_qh,
                      ws.d_kh, ws.d_vh, ws.fa_delta[k], ws.fa_delta_hp[k], a.bh, a.S, a.dh, a.scale, flash_spec(p, s));
  } else {
    exact_attention_backward(be, k, ws, ops, a, p.grad, p.attn_logits_fmt(), p.attn_probs_fmt(), R);
  }
  be.heads_merge(ws.d_qh, ws.d_qkv, a.nb, a.S, a.h, a.dh, 3 * a.d, 0);
  be.heads_merge(ws.d_kh, ws.d_qkv, a.nb, a.S, a.h, a.dh, 3 * a.d, a.d);
  be.heads_merge(ws.d_vh, ws.d_qkv, a.nb, a.S, a.h, a.dh, 3 * a.d, 2 * a.d);
  // dWqkv [3d x d] = dQKV^T y1 (over tokens); dy1 [T x d] = dQKV Wqkv (over 3d).
  be.gemm(3 * a.d, a.d, a.T, ops.make(ws.d_qkv, Layout::k_strided, g_wgrad, Role::grad_wgrad, k, AttnOp::dwqkv_dq),
          ops.make(ws.attn_y[k], Layout::k_strided, x_bwd, Role::activation, k, AttnOp::dwqkv_x), grads + gqkv.offset,
          0.0f, R);
  const float* gq = backward_gain(s, k, attn_norm_site(k), ws);
  if (s.layernorm) norm_scale_wgrad(be, s, gq, grads + gqkv.offset, 3 * a.d, R);
  const OutputRounding dy_round =  // as in the MLP sub-block's backward
      output_rounding(R, norm_rounds_dy_as_read(s) ? OutputReader::one_op : OutputReader::several);
  be.gemm(a.T, a.d, 3 * a.d,
          ops.make(ws.d_qkv, Layout::k_contiguous, p.grad, Role::grad, k, AttnOp::dy1_dq,
                   stats_slot(k, StatTensor::grad_qkv)),
          ops.make(Wqkv, Layout::k_strided, w_bwd, Role::weight, k, AttnOp::dy1_w), ws.d_ln, 0.0f, dy_round.by_gemm);
  norm_backward_into_residual(be, s, k, attn_norm_site(k), gq, ws.d_ln, ws.attn_xhat[k], ws.attn_rstd[k], dZ, grads, ws,
                              R, dy_round.by_reader);
}

}  // namespace mxlab::model_detail
