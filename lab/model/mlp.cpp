// The proxy model (DESIGN.md section 1) written once against the Backend interface: shapes
// and parameter layout, deterministic initialisation, and the forward / loss / backward
// passes with the precision policy of DESIGN.md sections 3-4. The exact op sequence is
// documented in lab/model/README.md; both backends run it unchanged.
#include "lab/model/mlp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lab/core/detmath.h"
#include "lab/core/error.h"
#include "lab/model/elementwise.h"
#include "lab/model/model_internal.h"

namespace mxlab {

using namespace model_detail;

namespace {

// SwiGLU hidden width H' = round(mult * 2/3 * width) in integers (never a tie: the
// fractional part of 2*mult*width/3 is 0, 1/3 or 2/3).
int swiglu_hidden(int mult, int width) { return (2 * mult * width + 1) / 3; }

// Layer k's Q(gamma) of `site` in the workspace: the forward writes it, the backward reads it.
float* gain_slot(const NetShape& s, const Workspace& ws, int k, const NormSite& site) {
  const int sites = s.attention() ? 2 : 1;
  const int i = site.gamma == ParamGroup::attn_gamma ? 1 : 0;
  return ws.gq_gamma + (static_cast<int64_t>(k) * sites + i) * s.d;
}

// Q(gamma), Q(beta) of `site` into its gain slot / ws.gq_beta (DESIGN.md section 3). The
// statistics (pol.collect_stats) are collected even when ln_affine does not quantize (under the
// diagnostic spec). RMSNorm and MXNorm have no beta.
void ln_affine_operands(Backend& be, const NetShape& s, const float* params, int k, const NormSite& site,
                        Workspace& ws, const PassPolicy& pol) {
  const PrecisionConfig& p = pol.p;
  struct Item {
    ParamGroup::Kind kind;
    float* dst;
    StatTensor tensor;
    uint64_t op;
  };
  const Item items[] = {{site.gamma, gain_slot(s, ws, k, site), site.gamma_stat, site.gamma_op},
                        {site.beta, ws.gq_beta, site.beta_stat, site.beta_op}};
  for (const Item& it : items) {
    if (it.kind == site.beta && s.norm != NormKind::layernorm) continue;
    const float* src = params + group(s, k, it.kind).offset;
    const uint64_t seed = sr_seed(pol.seed, it.op);
    int slot = pol.collect_stats ? pol.stats_base + stats_slot(k, it.tensor) : -1;
    if (slot >= 0 && !is_mx(p.ln_affine)) {
      // Diagnostic only: `dst` serves as scratch and is overwritten just below.
      be.quantize(src, it.dst, 1, s.d, Axis::contiguous, stats_spec(p, p.ln_affine, Role::ln_affine, seed), slot);
      slot = -1;
    }
    if (p.ln_affine == NumFmt::fp32)
      be.copy(it.dst, src, static_cast<size_t>(s.d));
    else
      be.quantize(src, it.dst, 1, s.d, Axis::contiguous, role_spec(p, p.ln_affine, Role::ln_affine, seed), slot);
  }
}

void check_pass(const NetShape& s, const float* params, const Workspace& ws, const PassPolicy& pol) {
  MXLAB_ASSERT(params != nullptr && !s.groups.empty(), "pass on an empty network");
  MXLAB_ASSERT(ws.batch > 0 && static_cast<int>(ws.a_in.size()) == s.depth && ws.out != nullptr,
               "workspace was not made for this network (depth ", s.depth, ", workspace ", ws.a_in.size(), ")");
  MXLAB_ASSERT(pol.p.block_size > 0, "precision.block_size ", pol.p.block_size,
               " (configuration validation admits only positive sizes)");
  const PrecisionConfig& p = pol.p;
  const bool emulator_ops = p.layernorm != LnOps::fused || p.gelu != GeluOps::fused ||
                            p.residual != ResidualPrec::elementwise || p.bias != BiasPrec::fp32 || !p.ln_beta_grad;
  if (p.flash() && !s.attention())
    throw Error("precision.attention: flash_bf16 computes the attention sub-block: it needs model.block: attention");
  if (p.flash() && (p.attention_tile_r < 1 || p.attention_tile_c < 1))
    throw Error(msg("precision.attention_tile [", p.attention_tile_r, ", ", p.attention_tile_c,
                    "] must hold two sizes >= 1"));
  if (emulator_ops && (s.attention() || s.norm == NormKind::rmsnorm || s.norm == NormKind::mxnorm))
    throw Error("precision.layernorm / gelu / residual / bias / ln_beta_grad (the paper's emulator's ops) are "
                "implemented for MLP blocks with layernorm or no norm: leave them at their defaults for this model");
}

// The pass's rotated GEMMs can run on this network and batch (rotation_problem).
void check_rotation(const NetShape& s, int64_t tokens, const PrecisionConfig& p, bool backward) {
  const std::string problem = rotation_problem(s, tokens, p, backward);
  if (!problem.empty()) throw Error(problem);
}

void check_model(const char* what, int depth, int width, int hidden_mult, Act act) {
  if (depth < 1) throw Error(msg(what, ".depth must be at least 1 (got ", depth, ")"));
  if (width < 1) throw Error(msg(what, ".width must be at least 1 (got ", width, ")"));
  if (hidden_mult < 1) throw Error(msg("model.hidden_mult must be at least 1 (got ", hidden_mult, ")"));
  if (static_cast<int>(act) >= static_cast<int>(Act::kCount))
    throw Error(msg(what, ".activation is not a valid activation (use relu, gelu, gelu_tanh, swiglu or linear)"));
}

void check_attention(const char* what, int width, BlockKind block, int heads, int seq_len) {
  if (seq_len < 1) throw Error(msg("data.seq_len must be at least 1 (got ", seq_len, ")"));
  if (block != BlockKind::attention) return;
  if (heads < 1 || width % heads != 0)
    throw Error(msg("model.heads = ", heads, " must divide ", what, " width ", width, " (head dim = width / heads)"));
}

// Lay out the groups of `s` (fields other than groups/num_params already set).
void layout(NetShape& s) {
  s.groups.clear();
  int64_t off = 0;
  auto push = [&](const char* suffix, ParamGroup::Kind kind, int layer, int64_t rows, int64_t cols) {
    ParamGroup g;
    g.name = msg("layer", layer, ".", suffix);
    g.kind = kind;
    g.layer = layer;
    g.offset = off;
    g.rows = rows;
    g.cols = cols;
    off += g.size();
    s.groups.push_back(g);
  };
  // Gains for every norm with ln_affine; a bias (beta) for layernorm only.
  const bool gain = s.layernorm && s.ln_affine, bias = gain && s.norm == NormKind::layernorm;
  if (s.tokens()) {
    push("embed", ParamGroup::embed, 0, s.vocab, s.d);
    s.groups.back().name = "embed";
  }
  for (int k = 0; k < s.depth; ++k) {
    if (s.attention()) {
      if (gain) push("attn_gamma", ParamGroup::attn_gamma, k, 1, s.d);
      if (bias) push("attn_beta", ParamGroup::attn_beta, k, 1, s.d);
      push("Wqkv", ParamGroup::wqkv, k, 3 * static_cast<int64_t>(s.d), s.d);
      push("Wo", ParamGroup::wo, k, s.d, s.d);
      if (s.fc2_bias) push("bo", ParamGroup::bo, k, 1, s.d);
    }
    if (gain) push("gamma", ParamGroup::gamma, k, 1, s.d);
    if (bias) push("beta", ParamGroup::beta, k, 1, s.d);
    push("W1", ParamGroup::w1, k, s.hidden_in, s.d);
    push("W2", ParamGroup::w2, k, s.d, s.hidden);
    if (s.fc2_bias) push("b2", ParamGroup::b2, k, 1, s.d);
  }
  if (s.tokens()) {
    push("unembed", ParamGroup::unembed, s.depth - 1, s.vocab, s.d);
    s.groups.back().name = "unembed";
  }
  s.num_params = off;
}

}  // namespace

// ---- norms (lab/model/README.md "Norms") --------------------------------------------------
namespace model_detail {

NormSite mlp_norm_site(int k) {
  return {ParamGroup::gamma,        ParamGroup::beta,         StatTensor::gamma,
          StatTensor::beta,         op_id(k, OpId::ln_gamma), op_id(k, OpId::ln_beta)};
}

NormSite attn_norm_site(int k) {
  return {ParamGroup::attn_gamma,     ParamGroup::attn_beta,      StatTensor::attn_gamma,
          StatTensor::attn_beta,      op_id(k, AttnOp::ln_gamma), op_id(k, AttnOp::ln_beta)};
}

const float* norm_gains(Backend& be, const NetShape& s, const float* params, int k, const NormSite& site,
                        Workspace& ws, const PassPolicy& pol) {
  if (!s.ln_affine) return nullptr;
  ln_affine_operands(be, s, params, k, site, ws, pol);
  return gain_slot(s, ws, k, site);
}

const float* backward_gain(const NetShape& s, int k, const NormSite& site, const Workspace& ws) {
  if (!s.ln_affine) return nullptr;
  return gain_slot(s, ws, k, site);
}

const float* norm_forward(Backend& be, const NetShape& s, const float* params, int k, const NormSite& site,
                          const float* x, float* y, float* xhat, float* rstd, const float* W, int64_t w_rows,
                          Workspace& ws, const PassPolicy& pol, const ElementwiseRound& R, FusedPlan* plan,
                          const GemmOperand* y_op) {
  const int64_t B = ws.batch, d = s.d;
  const float* gq = norm_gains(be, s, params, k, site, ws, pol);
  switch (s.norm) {
    case NormKind::layernorm:
      if (pol.p.layernorm == LnOps::vector) {  // the emulator's layernorm: no producer-side quantization
        be.layernorm_vec_fwd(x, gq, gq ? ws.gq_beta : nullptr, y, xhat, rstd, B, d, s.ln_eps, R);
        return W;
      }
      MXLAB_ASSERT(!y_op || (plan && y_op->p == y), "the operand quantized by the norm must be its output");
      be.layernorm_fwd(x, gq, gq ? ws.gq_beta : nullptr, y, xhat, rstd, B, d, s.ln_eps, R,
                       y_op ? plan->produced_by_writer(*y_op) : nullptr);
      return W;
    case NormKind::rmsnorm:
      be.rmsnorm_fwd(x, gq, y, xhat, rstd, B, d, s.ln_eps, Backend::RmsEstimate{}, R);
      return W;
    case NormKind::mxnorm:
      // The normalised x feeds the GEMM as it is; the gain goes onto the weight (MXNormLinear).
      be.rmsnorm_fwd(x, nullptr, y, xhat, rstd, B, d, s.ln_eps,
                     Backend::RmsEstimate{s.mxnorm_block, s.mxnorm_p, s.mxnorm_c}, R);
      if (!gq) return W;
      be.scale_cols(W, gq, ws.w_fused, w_rows, d, R);
      return ws.w_fused;
    case NormKind::none:
      break;
  }
  MXLAB_ASSERT(false, "norm_forward on a network without a norm");
  return W;
}

void norm_scale_wgrad(Backend& be, const NetShape& s, const float* gq, float* dW, int64_t w_rows,
                      const ElementwiseRound& R) {
  if (s.norm == NormKind::mxnorm && gq) be.scale_cols(dW, gq, dW, w_rows, s.d, R);
}

void norm_backward(Backend& be, const NetShape& s, int k, const NormSite& site, const float* gq, const float* dy,
                   const float* xhat, const float* rstd, float* dx, float* grads, Workspace& ws,
                   const ElementwiseRound& R, const ElementwiseRound& dy_in, const PassOps& po) {
  const int64_t B = ws.batch, d = s.d;
  float* dgamma = gq ? grads + group(s, k, site.gamma).offset : nullptr;
  MXLAB_ASSERT(!dy_in.bf16 || norm_rounds_dy_as_read(s), "only the layernorm backward rounds dy as it reads it");
  if (s.norm == NormKind::layernorm) {
    float* dbeta = gq ? grads + group(s, k, site.beta).offset : nullptr;
    // precision.ln_beta_grad: false (the paper's copy of the library): beta's gradient is 0.
    float* dbeta_out = po.beta_grad ? dbeta : nullptr;
    if (dbeta && !dbeta_out) be.fill(dbeta, 0.0f, static_cast<size_t>(d));
    if (po.ln_vector)
      be.layernorm_vec_bwd(dy, xhat, rstd, gq, dx, dgamma, dbeta_out, B, d, R, dy_in);
    else
      be.layernorm_bwd(dy, xhat, rstd, gq, dx, dgamma, dbeta_out, B, d, R, dy_in);
  } else {
    // RMSNorm's gradient; for MXNorm the straight-through estimator of papers/mxnorm.md App. E.
    be.rmsnorm_bwd(dy, xhat, rstd, gq, dx, dgamma, B, d, R);
  }
}

void norm_backward_into_residual(Backend& be, const NetShape& s, int k, const NormSite& site, const float* gq,
                                 const float* dy, const float* xhat, const float* rstd, float* dA, float* grads,
                                 Workspace& ws, const ElementwiseRound& R, const ElementwiseRound& dy_in,
                                 const GemmOperand* dA_q, const PassOps& po) {
  const size_t n = static_cast<size_t>(ws.batch * s.d);
  const float* dx = dy;
  if (s.layernorm) {
    norm_backward(be, s, k, site, gq, dy, xhat, rstd, ws.d_x, grads, ws, R, dy_in, po);
    dx = ws.d_x;
  }
  if (s.residual)
    be.add(dA, dA, dx, n, residual_round(po, R), dA_q, dA_q ? s.d : 0);
  else
    be.copy(dA, dx, n);
}

}  // namespace model_detail

double attention_logit_max(Backend& be, const NetShape& s, const Workspace& ws, int layer) {
  MXLAB_ASSERT(s.attention() && layer >= 0 && layer < static_cast<int>(ws.rowmax.size()),
               "attention_logit_max on a network or layer without attention");
  const size_t n = static_cast<size_t>(ws.batch * s.heads);  // rows of probs: nb * h * S = B * h
  double m4[4];
  be.moments(ws.rowmax[layer], n, m4);
  return std::isfinite(m4[2]) ? m4[1] : std::numeric_limits<double>::quiet_NaN();
}

Backend::FlashSpec flash_spec(const PrecisionConfig& p, const NetShape& s) {
  Backend::FlashSpec f;
  f.causal = s.causal;
  f.br = p.attention_tile_r;
  f.bc = p.attention_tile_c;
  f.stabilized = p.attention_softmax == AttnSoftmax::stabilized;
  f.beta = p.attention_beta;
  f.eps = p.attention_eps;
  f.delta_hp = p.attention_delta == AttnDelta::hp;
  return f;
}

FlashInstruments flash_instruments(Backend& be, const NetShape& s, const Workspace& ws, int layer) {
  MXLAB_ASSERT(s.attention() && layer >= 0 && layer < static_cast<int>(ws.fa_stats.size()) &&
                   ws.attn_flash[static_cast<size_t>(layer)],
               "flash_instruments on a layer whose last forward did not run the flash kernel");
  const size_t rows = static_cast<size_t>(ws.batch * s.heads);
  std::vector<float> stats(rows * Backend::kFlashRowStats), delta(rows), delta_hp(rows);
  be.download(stats.data(), ws.fa_stats[layer], stats.size());
  be.download(delta.data(), ws.fa_delta[layer], rows);
  be.download(delta_hp.data(), ws.fa_delta_hp[layer], rows);
  FlashInstruments out;
  size_t multi_max = 0, multi_one = 0;
  double bias = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    if (stats[r * Backend::kFlashRowStats] > 1.0f) ++multi_max;
    if (stats[r * Backend::kFlashRowStats + 1] > 1.0f) ++multi_one;
    bias += static_cast<double>(delta[r]) - static_cast<double>(delta_hp[r]);
  }
  out.multi_max_frac = static_cast<double>(multi_max) / static_cast<double>(rows);
  out.multi_one_frac = static_cast<double>(multi_one) / static_cast<double>(rows);
  out.delta_bias = bias;
  return out;
}

const char* name(StatTensor t) {
  switch (t) {
    case StatTensor::ln_out: return "ln_out";
    case StatTensor::act_out: return "act_out";
    case StatTensor::grad_out: return "grad_out";
    case StatTensor::grad_hidden: return "grad_hidden";
    case StatTensor::gamma: return "gamma";
    case StatTensor::beta: return "beta";
    case StatTensor::attn_ln_out: return "attn_ln_out";
    case StatTensor::attn_q: return "attn_q";
    case StatTensor::attn_k: return "attn_k";
    case StatTensor::attn_p: return "attn_p";
    case StatTensor::attn_v: return "attn_v";
    case StatTensor::attn_ctx: return "attn_ctx";
    case StatTensor::grad_attn_out: return "grad_attn_out";
    case StatTensor::grad_ctx: return "grad_ctx";
    case StatTensor::grad_logits: return "grad_logits";
    case StatTensor::grad_qkv: return "grad_qkv";
    case StatTensor::attn_gamma: return "attn_gamma";
    case StatTensor::attn_beta: return "attn_beta";
    default: return "unknown";
  }
}

std::vector<StatTensor> stat_tensors(const NetShape& s) {
  const int n = s.attention() ? kStatTensors : static_cast<int>(StatTensor::attn_ln_out);
  std::vector<StatTensor> v;
  for (int t = 0; t < n; ++t) v.push_back(static_cast<StatTensor>(t));
  return v;
}

NumFmt stat_role_format(const PrecisionConfig& p, StatTensor t) {
  switch (t) {
    case StatTensor::gamma:
    case StatTensor::beta:
    case StatTensor::attn_gamma:
    case StatTensor::attn_beta: return p.ln_affine;
    case StatTensor::grad_out:
    case StatTensor::grad_hidden:
    case StatTensor::grad_attn_out:
    case StatTensor::grad_ctx:
    case StatTensor::grad_logits:
    case StatTensor::grad_qkv: return p.grad;
    case StatTensor::attn_q:
    case StatTensor::attn_k: return p.attn_logits_fmt();
    case StatTensor::attn_p:
    case StatTensor::attn_v: return p.attn_probs_fmt();
    default: return p.activation;  // ln_out, act_out, attn_ln_out, attn_ctx
  }
}

bool stat_quantized(const PrecisionConfig& p, StatTensor t) {
  // Under the flash kernel the attention GEMMs' operands are its bf16 tensors (never counted).
  if (p.flash() && (t == StatTensor::attn_q || t == StatTensor::attn_k || t == StatTensor::attn_p ||
                    t == StatTensor::attn_v || t == StatTensor::grad_ctx || t == StatTensor::grad_logits))
    return false;
  // Gradient operands are quantized only with `backward: true`.
  const bool grad = t == StatTensor::grad_out || t == StatTensor::grad_hidden || t == StatTensor::grad_attn_out ||
                    t == StatTensor::grad_ctx || t == StatTensor::grad_logits || t == StatTensor::grad_qkv;
  return is_mx(stat_role_format(p, t)) && (!grad || p.backward);
}

std::string rotation_problem(const NetShape& s, int64_t tokens, const PrecisionConfig& p, bool backward) {
  struct Reduction {
    Gemm g;
    int64_t K;
    const char* what;
  };
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in;
  std::vector<Reduction> gemms = {{Gemm::fprop, d, "Fprop of fc1 (h = y W1^T, K = the width d)"},
                                  {Gemm::fprop, H, "Fprop of fc2 (o = a W2^T, K = the hidden width H)"}};
  if (s.attention()) gemms.push_back({Gemm::fprop, d, "Fprop of the attention projections (K = the width d)"});
  if (backward) {
    gemms.push_back({Gemm::dgrad, d, "Dgrad of fc2 (da = dA W2, K = the width d)"});
    gemms.push_back({Gemm::dgrad, H1, "Dgrad of fc1 (dy = dh W1, K = W1's rows H1)"});
    gemms.push_back({Gemm::wgrad, tokens, "Wgrad GEMMs (dW = dY^T X, K = the tokens of a step, data.batch * data.seq_len)"});
    if (s.attention()) gemms.push_back({Gemm::dgrad, 3 * d, "Dgrad of the QKV projection (K = 3 d)"});
  }
  const char* const gemm_name[] = {"fprop", "dgrad", "wgrad"};
  const bool any = p.rotates(Gemm::fprop) || p.rotates(Gemm::dgrad) || p.rotates(Gemm::wgrad);
  if (any && !is_rotation_block(p.rotation_block))
    return msg("precision.rotation_block = ", p.rotation_block, " is not a power of two from ", kMinRotationBlock,
               " to ", kMaxRotationBlock, ": use e.g. 32");
  for (const Reduction& r : gemms) {
    if (!p.rotates(r.g) || r.K % p.rotation_block == 0) continue;
    const char* name = gemm_name[static_cast<int>(r.g)];
    return msg("precision.rotation_block = ", p.rotation_block, r.K < p.rotation_block ? " is larger than" : " does not divide",
               " the reduction length K = ", r.K, " of the ", r.what, ", which precision.rotation rotates",
               s.is_teacher ? " (in the teacher, under data.mx_teacher_targets)" : "",
               ": use a power-of-two rotation_block that divides ", r.K, ", or leave ", name,
               " unrotated (precision.rotation: {", name, ": none})");
  }
  return "";
}

float mxnorm_coefficient(int p, int block) {
  // papers/mxnorm.md appendix F, absmax_scale_factor: RMS(X) / G_p(block absmaxes), Gaussian X.
  struct Entry {
    int block, p;
    float c;
  };
  static const Entry kTable[] = {{16, 1, 0.4814f}, {16, 2, 0.4688f}, {32, 1, 0.4261f},
                                 {32, 2, 0.4185f}, {64, 1, 0.3852f}, {64, 2, 0.3803f}};
  for (const Entry& e : kTable)
    if (e.block == block && e.p == p) return e.c;
  throw Error(msg("MXNorm has no coefficient for mxnorm_p = ", p, ", mxnorm_block = ", block,
                  " (the paper tabulates p in {1, 2} and block in {16, 32, 64})"));
}

NetShape NetShape::student(const ModelConfig& m, int seq_len, int vocab) {
  if (vocab < 0 || vocab == 1) throw Error(msg("data.vocab must be at least 2 (got ", vocab, ")"));
  check_model("model", m.depth, m.width, m.hidden_mult, m.activation);
  if (m.layernorm && !(m.ln_eps > 0.0f)) throw Error(msg("model.ln_eps must be positive (got ", m.ln_eps, ")"));
  if (!m.layernorm && (m.norm == NormKind::rmsnorm || m.norm == NormKind::mxnorm))
    throw Error("model.norm names a norm but model.layernorm: false removes it: drop one of them");
  NetShape s;
  check_attention("model", m.width, m.block, m.heads, seq_len);
  s.block = m.block;
  s.heads = m.heads;
  s.seq_len = seq_len;
  s.causal = m.block == BlockKind::attention && m.causal;
  s.vocab = vocab;
  s.norm = m.effective_norm();
  if (s.norm == NormKind::mxnorm) {
    s.mxnorm_p = m.mxnorm_p;
    s.mxnorm_block = m.mxnorm_block;
    s.mxnorm_c = mxnorm_coefficient(m.mxnorm_p, m.mxnorm_block);
  }
  s.depth = m.depth;
  s.d = m.width;
  s.act = m.activation;
  s.hidden = m.activation == Act::swiglu ? swiglu_hidden(m.hidden_mult, m.width) : m.hidden_mult * m.width;
  s.hidden_in = m.activation == Act::swiglu ? 2 * s.hidden : s.hidden;
  s.layernorm = s.norm != NormKind::none;
  s.ln_affine = s.layernorm && m.ln_affine;
  s.fc2_bias = m.fc2_bias;
  s.residual = true;
  s.ln_eps = m.ln_eps;
  layout(s);
  return s;
}

NetShape NetShape::teacher(const ModelConfig& m, const TeacherConfig& t, int seq_len) {
  const int depth = t.depth == 0 ? m.depth : t.depth;
  const int width = t.width == 0 ? m.width : t.width;
  const Act act = t.activation.value_or(m.activation);
  if (t.depth < 0) throw Error(msg("teacher.depth must be >= 0 (0 = model.depth; got ", t.depth, ")"));
  if (t.width < 0) throw Error(msg("teacher.width must be >= 0 (0 = model.width; got ", t.width, ")"));
  check_model("teacher", depth, width, m.hidden_mult, act);
  NetShape s;
  check_attention("teacher", m.width, t.block, m.heads, seq_len);
  s.block = t.block;
  s.heads = m.heads;
  s.seq_len = seq_len;
  s.causal = t.block == BlockKind::attention && m.causal;  // the teacher's attention is masked alike
  s.norm = NormKind::none;
  s.depth = depth;
  s.d = m.width;
  s.act = act;
  if (t.residual) {
    // The text's teacher: the student's architecture without LN (and without biases).
    s.hidden = act == Act::swiglu ? swiglu_hidden(m.hidden_mult, width) : m.hidden_mult * width;
  } else {
    // The released code's teacher: Linear(d -> w) . phi . Linear(w -> d) per block.
    s.hidden = width;
  }
  s.hidden_in = act == Act::swiglu ? 2 * s.hidden : s.hidden;
  s.layernorm = false;
  s.ln_affine = false;
  s.fc2_bias = false;
  s.residual = t.residual;
  s.is_teacher = true;
  s.ln_eps = m.ln_eps;
  layout(s);
  return s;
}

const ParamGroup* NetShape::find(int layer, ParamGroup::Kind kind) const {
  for (const ParamGroup& g : groups)
    if (g.layer == layer && g.kind == kind) return &g;
  return nullptr;
}

std::vector<float> init_params(const NetShape& s, InitKind init, float gain, uint64_t seed, Stream stream) {
  std::vector<float> out(static_cast<size_t>(s.num_params), 0.0f);
  for (size_t gi = 0; gi < s.groups.size(); ++gi) {
    const ParamGroup& g = s.groups[gi];
    float* dst = out.data() + g.offset;
    const uint32_t step = static_cast<uint32_t>(gi);  // the group index is the Philox step word
    switch (g.kind) {
      case ParamGroup::gamma:
      case ParamGroup::attn_gamma:
        for (int64_t i = 0; i < g.size(); ++i) dst[i] = 1.0f;
        break;
      case ParamGroup::beta:
      case ParamGroup::attn_beta:
        break;  // zeros
      case ParamGroup::embed:
        // nn.Embedding: N(0, 1); xavier_normal: gain * sqrt(2 / (V + d)).
        for (int64_t i = 0; i < g.size(); ++i) {
          const float sd = init == InitKind::pytorch ? 1.0f : gain * sqrtf_ieee(2.0f / static_cast<float>(g.rows + g.cols));
          dst[i] = sd * randn_elem(seed, stream, step, static_cast<uint64_t>(i));
        }
        break;
      case ParamGroup::w1:
      case ParamGroup::w2:
      case ParamGroup::b2:
      case ParamGroup::wqkv:
      case ParamGroup::wo:
      case ParamGroup::unembed:
      case ParamGroup::bo: {
        const bool weight = g.kind != ParamGroup::b2 && g.kind != ParamGroup::bo;
        if (init == InitKind::pytorch) {
          // nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weight and the bias.
          const int64_t fan_in = weight ? g.cols : (g.kind == ParamGroup::bo ? s.d : s.hidden);
          const float bound = 1.0f / sqrtf_ieee(static_cast<float>(fan_in));
          for (int64_t i = 0; i < g.size(); ++i) {
            const float u = u32_to_uniform(philox(seed, stream, step, static_cast<uint64_t>(i)).v[0]);
            dst[i] = (2.0f * u - 1.0f) * bound;
          }
        } else if (weight) {
          // xavier_normal: std = gain * sqrt(2 / (fan_in + fan_out)); biases stay 0.
          const float std_dev = gain * sqrtf_ieee(2.0f / static_cast<float>(g.rows + g.cols));
          for (int64_t i = 0; i < g.size(); ++i)
            dst[i] = std_dev * randn_elem(seed, stream, step, static_cast<uint64_t>(i));
        }
        break;
      }
    }
  }
  return out;
}

Workspace Workspace::make(Backend& be, const NetShape& s, int64_t batch) {
  if (batch <= 0) throw Error(msg("data.batch must be positive (got ", batch, ")"));
  MXLAB_ASSERT(s.depth > 0 && s.d > 0 && s.hidden > 0, "workspace for an unbuilt NetShape");
  if (batch % s.seq_len != 0)
    throw Error(msg("a pass of ", batch, " tokens is not a whole number of sequences of data.seq_len = ", s.seq_len));
  const size_t bd = static_cast<size_t>(batch * s.d);
  const size_t bh = static_cast<size_t>(batch * s.hidden);
  const size_t bh1 = static_cast<size_t>(batch * s.hidden_in);
  Workspace ws;
  ws.batch = batch;
  for (int k = 0; k < s.depth; ++k) {
    ws.a_in.push_back(be.alloc(bd));
    // Without LN the W1 input is the residual stream itself: alias it, keep no xhat/rstd.
    ws.ln_y.push_back(s.layernorm ? be.alloc(bd) : ws.a_in.back());
    ws.xhat.push_back(s.layernorm ? be.alloc(bd) : nullptr);
    ws.rstd.push_back(s.layernorm ? be.alloc(static_cast<size_t>(batch)) : nullptr);
    ws.h.push_back(be.alloc(bh1));
    ws.a.push_back(be.alloc(bh));
  }
  const size_t bo_n = static_cast<size_t>(batch * s.out_width());
  ws.width = s.out_width();
  ws.out = be.alloc(bo_n);
  ws.dout = be.alloc(bo_n);
  if (s.tokens()) {
    ws.a_final = be.alloc(bd);
    ws.d_final = be.alloc(bd);
  }
  ws.d_ln = be.alloc(bd);
  ws.d_a = be.alloc(bh);
  ws.d_h = be.alloc(bh1);
  ws.d_x = be.alloc(bd);
  ws.gq_gamma = be.alloc(static_cast<size_t>(s.depth) * (s.attention() ? 2 : 1) * s.d);
  ws.gq_beta = be.alloc(static_cast<size_t>(s.d));
  ws.y = be.alloc(bd);
  ws.loss = be.alloc(1);
  if (s.norm == NormKind::mxnorm && s.ln_affine) {
    const int64_t w_rows = std::max<int64_t>(s.hidden_in, s.attention() ? 3 * int64_t{s.d} : 0);
    ws.w_fused = be.alloc(static_cast<size_t>(w_rows * s.d));
  }
  if (s.attention()) {
    const size_t heads_n = bd;  // nb*h*S*dh = B*d
    const size_t probs_n = static_cast<size_t>(batch / s.seq_len * s.heads) * static_cast<size_t>(s.seq_len) *
                           static_cast<size_t>(s.seq_len);
    const size_t rows_n = static_cast<size_t>(batch / s.seq_len * s.heads * s.seq_len);
    for (int k = 0; k < s.depth; ++k) {
      ws.z.push_back(be.alloc(bd));
      ws.attn_y.push_back(s.layernorm ? be.alloc(bd) : ws.a_in[k]);
      ws.attn_xhat.push_back(s.layernorm ? be.alloc(bd) : nullptr);
      ws.attn_rstd.push_back(s.layernorm ? be.alloc(static_cast<size_t>(batch)) : nullptr);
      ws.qkv.push_back(be.alloc(3 * bd));
      ws.qh.push_back(be.alloc(heads_n));
      ws.kh.push_back(be.alloc(heads_n));
      ws.vh.push_back(be.alloc(heads_n));
      ws.probs.push_back(be.alloc(probs_n));
      ws.rowmax.push_back(be.alloc(rows_n));
      ws.ctx.push_back(be.alloc(bd));
    }
    ws.ctx_h = be.alloc(heads_n);
    ws.d_qkv = be.alloc(3 * bd);
    ws.d_qh = be.alloc(heads_n);
    ws.d_kh = be.alloc(heads_n);
    ws.d_vh = be.alloc(heads_n);
    ws.d_probs = be.alloc(probs_n);
    for (int k = 0; k < s.depth; ++k) {
      ws.fa_o.push_back(be.alloc(heads_n));
      ws.fa_o_hp.push_back(be.alloc(heads_n));
      ws.fa_lse.push_back(be.alloc(rows_n));
      ws.fa_stats.push_back(be.alloc(rows_n * Backend::kFlashRowStats));
      ws.fa_delta.push_back(be.alloc(rows_n));
      ws.fa_delta_hp.push_back(be.alloc(rows_n));
    }
    ws.attn_flash.assign(static_cast<size_t>(s.depth), 0);
    // The MLP sub-block reads z_k, not A_{k-1}: without a norm its W1 input is z_k itself.
    if (!s.layernorm)
      for (int k = 0; k < s.depth; ++k) ws.ln_y[k] = ws.z[k];
  }
  return ws;
}

// The forward pass, block by block as Eq. 1 writes it (Eq. 11 with attention):
//   y = LN(A);  h = y W1^T;  a = act(h);  o = a W2^T;  A' = A + o (+ b2).
// How each GEMM's operands arrive and who rounds its output is the pass's fused plan
// (lab/model/fused_plan.h); the exact op sequence is lab/model/README.md's.
void forward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws,
             const PassPolicy& pol) {
  check_pass(s, params, ws, pol);
  check_rotation(s, ws.batch, pol.p, false);
  MXLAB_ASSERT(x != nullptr, "forward without input");
  const PrecisionConfig& p = pol.p;
  const ElementwiseRound R = policy_round(p);
  const PassOps po = pass_ops(p);
  const ElementwiseRound Rres = residual_round(po, R);  // the residual stream's rounding
  const Act act = pass_act(s, p);
  const OperandRules ops = OperandRules::forward(pol);
  const int64_t B = ws.batch, d = s.d, H = s.hidden, H1 = s.hidden_in;
  auto weight = [&](int k, ParamGroup::Kind kind) { return params + group(s, k, kind).offset; };

  // The block's GEMM operands: fc1 reads y and W1 (or the norm's fused copy of W1), fc2 a and W2.
  auto fc1_x = [&](int k) {
    return ops.make(ws.ln_y[k], Layout::k_contiguous, p.activation, Role::activation, k, OpId::fc1_x,
                    stats_slot(k, StatTensor::ln_out));
  };
  auto fc1_w = [&](int k, const float* W1) {
    return ops.make(W1, Layout::k_contiguous, p.weight, Role::weight, k, OpId::fc1_w);
  };
  auto fc2_x = [&](int k) {
    return ops.make(ws.a[k], Layout::k_contiguous, p.activation, Role::activation, k, OpId::fc2_x,
                    stats_slot(k, StatTensor::act_out));
  };
  auto fc2_w = [&](int k) {
    return ops.make(weight(k, ParamGroup::w2), Layout::k_contiguous, p.weight, Role::weight, k, OpId::fc2_w);
  };

  FusedPlan plan(be);
  // The weights, quantized ahead; not fc1's under MXNorm, which reads a copy of W1 the pass writes.
  {
    std::vector<AheadOperand> ahead;
    for (int k = 0; k < s.depth; ++k) {
      if (s.norm != NormKind::mxnorm) ahead.push_back({fc1_w(k, weight(k, ParamGroup::w1)), H1, d});
      ahead.push_back({fc2_w(k), d, H});
    }
    plan.quantize_ahead(ahead);
  }
  // h is read by act_fwd here and act_bwd in the backward only: they round it as they read it.
  const OutputRounding h_round = output_rounding(R, OutputReader::one_op);
  ws.h_round = h_round.by_reader;

  // A_0 = R(x) (x itself under residual: fp32); a token network: A_0 = R(E[x]), x the token ids
  if (s.tokens()) {
    be.embed_fwd(x, weight(0, ParamGroup::embed), ws.a_in[0], B, d, s.vocab, Rres);
  } else {
    be.copy(ws.a_in[0], x, static_cast<size_t>(B * d));
    if (Rres.bf16) be.round_bf16(ws.a_in[0], static_cast<size_t>(B * d), Rres.mode);
  }
  for (int k = 0; k < s.depth; ++k) {
    const float* A = ws.a_in[k];
    float* next = k + 1 < s.depth ? ws.a_in[k + 1] : (s.tokens() ? ws.a_final : ws.out);
    if (s.attention()) {  // Eq. 11: z_k = A_{k-1} + SelfAttn(LN_1(A_{k-1})); the MLP sub-block reads z_k
      attention_forward(be, s, params, k, A, ws, pol);
      A = ws.z[k];
    }
    // y = LN(A) (without a norm y is A itself); under MXNorm the gain moves onto W1
    const float* W1 = weight(k, ParamGroup::w1);
    if (s.layernorm) {
      const GemmOperand y_next = fc1_x(k);
      W1 = norm_forward(be, s, params, k, mlp_norm_site(k), A, ws.ln_y[k], ws.xhat[k], ws.rstd[k], W1, H1, ws, pol,
                        R, &plan, &y_next);
    }
    // h [B x H1] = y [B x d] . W1 [H1 x d]^T
    plan.gemm(B, H1, d, fc1_x(k), fc1_w(k, W1), ws.h[k], h_round.by_gemm);
    // a [B x H] = act(h)
    be.act_fwd(act, ws.h[k], ws.a[k], B, H, R, ws.h_round, plan.produced_by_writer(fc2_x(k)));
    // o [B x d] = a [B x H] . W2 [d x H]^T; with the residual, o's one reader is the add below
    const OutputRounding o_round = output_rounding(R, s.residual ? OutputReader::one_op : OutputReader::several);
    float* o = s.residual ? ws.y : next;
    plan.gemm(B, d, H, fc2_x(k), fc2_w(k), o, o_round.by_gemm);
    // A_{k+1} = A_k + o (+ b2), written from A_k and o in one pass (the plain teacher: A_{k+1} = o)
    if (s.residual) {
      const ParamGroup* b2 = s.find(k, ParamGroup::b2);
      const float* bias = b2 ? params + b2->offset : nullptr;
      if (po.residual_fp32 || po.bias_rounded)  // the emulator's Linear bias and residual add
        be.residual_add_r(next, A, ws.y, bias, B, d,
                          Backend::ResidualRound{o_round.by_reader, po.bias_rounded ? R : ElementwiseRound{}, R, Rres});
      else
        be.residual_add(next, A, ws.y, bias, B, d, R, o_round.by_reader);
    }
  }
  // A token network's logits [B x V] = A_L [B x d] . U [V x d]^T (a linear layer under the roles).
  if (s.tokens())
    be.gemm(B, s.vocab, d,
            ops.make(ws.a_final, Layout::k_contiguous, p.activation, Role::activation, 0, UnembedOp::x),
            ops.make(weight(s.depth - 1, ParamGroup::unembed), Layout::k_contiguous, p.weight, Role::weight, 0,
                     UnembedOp::w),
            ws.out, 0.0f, R);
}

void loss_and_grad(Backend& be, const LossSpec& loss, const float* target, Workspace& ws, const PassPolicy& pol,
                   float* loss_history) {
  MXLAB_ASSERT(target != nullptr && ws.out != nullptr && ws.width > 0, "loss without output or target");
  // dout starts the backward pass, so `backward: false` leaves it in FP32 too; so does
  // precision.residual: fp32 (dout is the residual stream's gradient).
  const ElementwiseRound R =
      pol.p.backward ? residual_round(pass_ops(pol.p), policy_round(pol.p)) : ElementwiseRound{};
  const int64_t B = ws.batch, d = ws.width;
  if ((loss.kind == LossKind::xent) != (ws.a_final != nullptr))
    throw Error(ws.a_final ? "a token network (data.kind: tokens) trains with loss: xent"
                           : "loss: xent needs a token network (data.kind: tokens)");
  switch (loss.kind) {
    case LossKind::xent:
      be.loss_xent(ws.out, target, ws.dout, ws.loss, loss_history, B, d, R);
      break;
    case LossKind::mse:
      be.loss_mse(ws.out, target, ws.dout, ws.loss, loss_history, B, d, R);
      break;
    case LossKind::kl:
      if (!(loss.kl_temperature > 0.0f))
        throw Error(msg("kl_temperature must be positive (got ", loss.kl_temperature, ")"));
      be.loss_kl(ws.out, target, ws.dout, ws.loss, loss_history, B, d, loss.kl_temperature, R);
      break;
  }
}

// The backward pass, block by block from the last (Eq. 1's gradients):
//   db2 = sum dA;  dW2 = dA^T a;  da = dA W2;  dh = da * act'(h);  dW1 = dh^T y;  dy = dh W1;
//   dA = dA + LN'(dy)
// then the attention sub-block's backward under Eq. 11. The fused plan as in forward().
void backward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws, float* grads,
              const PassPolicy& pol) {
  check_pass(s, params, ws, pol);
  check_rotation(s, ws.batch, pol.p, true);
  MXLAB_ASSERT(grads != nullptr, "backward without a gradient buffer");
  const PrecisionConfig& p = pol.p;
  // backward: false -> FP32 GEMM operands and no element-wise rounding (statistics are still
  // counted, under the configured specs: what would clamp if the backward were quantized).
  const ElementwiseRound R = p.backward ? policy_round(p) : ElementwiseRound{};
  const PassOps po = pass_ops(p);
  const Act act = pass_act(s, p);
  const OperandRules ops = OperandRules::backward(pol);
  // The wgrad GEMMs' gradient operand has a role of its own (grad_wgrad): each GEMM quantizes its
  // dY along its own reduction axis anyway, so the dgrad and wgrad operands of one tensor are two
  // quantizations already, whatever the formats.
  const NumFmt w_bwd = p.weight_bwd_fmt(), x_bwd = p.activation_bwd_fmt(), g_wgrad = p.grad_wgrad_fmt();
  const int64_t B = ws.batch, d = s.d, H = s.hidden, H1 = s.hidden_in;
  auto weight = [&](int k, ParamGroup::Kind kind) { return params + group(s, k, kind).offset; };

  float* dA = ws.dout;  // gradient of the residual stream leaving block k (consumed in place)
  if (s.tokens()) {
    // The unembedding: dU [V x d] = dlogits^T A_L (over the batch), dA_L [B x d] = dlogits U (over V).
    const ParamGroup& gu = group(s, s.depth - 1, ParamGroup::unembed);
    be.gemm(s.vocab, d, B, ops.make(ws.dout, Layout::k_strided, g_wgrad, Role::grad_wgrad, 0, UnembedOp::dw_dy),
            ops.make(ws.a_final, Layout::k_strided, x_bwd, Role::activation, 0, UnembedOp::dw_x), grads + gu.offset,
            0.0f, R);
    be.gemm(B, d, s.vocab, ops.make(ws.dout, Layout::k_contiguous, p.grad, Role::grad, 0, UnembedOp::dx_dy),
            ops.make(params + gu.offset, Layout::k_strided, w_bwd, Role::weight, 0, UnembedOp::dx_w), ws.d_final, 0.0f,
            residual_round(po, R));
    dA = ws.d_final;
  }
  // The block's GEMM operands, named by their GEMM (wgrad GEMMs reduce over the batch, dgrad GEMMs
  // over the output axis of the forward GEMM).
  auto dw2_dy = [&](int k) { return ops.make(dA, Layout::k_strided, g_wgrad, Role::grad_wgrad, k, OpId::dw2_dy); };
  auto dw2_x = [&](int k) { return ops.make(ws.a[k], Layout::k_strided, x_bwd, Role::activation, k, OpId::dw2_x); };
  auto da_dy = [&](int k) {
    return ops.make(dA, Layout::k_contiguous, p.grad, Role::grad, k, OpId::da_dy, stats_slot(k, StatTensor::grad_out));
  };
  auto da_w = [&](int k) {
    return ops.make(weight(k, ParamGroup::w2), Layout::k_strided, w_bwd, Role::weight, k, OpId::da_w);
  };
  auto dw1_dy = [&](int k) {
    return ops.make(ws.d_h, Layout::k_strided, g_wgrad, Role::grad_wgrad, k, OpId::dw1_dy);
  };
  auto dw1_x = [&](int k) { return ops.make(ws.ln_y[k], Layout::k_strided, x_bwd, Role::activation, k, OpId::dw1_x); };
  auto dy_dy = [&](int k) {
    return ops.make(ws.d_h, Layout::k_contiguous, p.grad, Role::grad, k, OpId::dy_dy,
                    stats_slot(k, StatTensor::grad_hidden));
  };
  auto dy_w = [&](int k) {
    return ops.make(weight(k, ParamGroup::w1), Layout::k_strided, w_bwd, Role::weight, k, OpId::dy_w);
  };

  FusedPlan plan(be);
  // Quantized ahead: what nothing writes during the backward, the dgrad GEMMs' weights and the
  // forward's saved y as the dW1 GEMM reads it (strided: blocks down the batch; 1 M elements each,
  // like the weights). Not a (4 M elements): one launch over tensors of two sizes was slower than
  // their own launches (kernels/PERF.md, "the weight-gradient GEMMs' saved activations quantized
  // ahead too").
  {
    std::vector<AheadOperand> ahead;
    for (int k = s.depth - 1; k >= 0; --k) {
      ahead.push_back({da_w(k), d, H});
      ahead.push_back({dy_w(k), H1, d});
    }
    for (int k = s.depth - 1; k >= 0; --k) ahead.push_back({dw1_x(k), B, d});
    plan.quantize_ahead(ahead);
  }
  for (int k = s.depth - 1; k >= 0; --k) {
    const ParamGroup& g1 = group(s, k, ParamGroup::w1);
    const ParamGroup& g2 = group(s, k, ParamGroup::w2);
    // db2 [d] = sum over the batch of dA
    if (const ParamGroup* b2 = s.find(k, ParamGroup::b2)) {
      float* db2 = grads + b2->offset;
      if (po.bias_rounded && R.bf16) {
        // The emulator's Linear: db2 = R(sum over rows of R(dA)) (ws.y is free in the backward).
        be.copy(ws.y, dA, static_cast<size_t>(B * d));
        be.round_bf16(ws.y, static_cast<size_t>(B * d), R.mode);
        be.col_sum(ws.y, db2, B, d);
        be.round_bf16(db2, static_cast<size_t>(d), R.mode);
      } else {
        be.col_sum(dA, db2, B, d);
      }
    }
    // dW2 [d x H] = dA^T a
    plan.gemm(d, H, B, dw2_dy(k), dw2_x(k), grads + g2.offset, R);
    // da [B x H] = dA W2; its one reader is act_bwd
    const OutputRounding da_round = output_rounding(R, OutputReader::one_op);
    plan.gemm(B, H, d, da_dy(k), da_w(k), ws.d_a, da_round.by_gemm);
    // dh [B x H1] = da * act'(h)
    be.act_bwd(act, ws.h[k], ws.d_a, ws.d_h, B, H, R, ws.h_round, da_round.by_reader,
               plan.produced_by_writer(dy_dy(k)));
    // dW1 [H1 x d] = dh^T y; MXNorm: times the forward's Q(gamma), kept per layer (gradients
    // w.r.t. the quantized values go straight through to the FP32 masters)
    plan.gemm(H1, d, B, dw1_dy(k), dw1_x(k), grads + g1.offset, R);
    const float* gq = backward_gain(s, k, mlp_norm_site(k), ws);
    norm_scale_wgrad(be, s, gq, grads + g1.offset, H1, R);
    // dy [B x d] = dh W1; under layernorm its one reader is the norm's backward
    const OutputRounding dy_round =
        output_rounding(R, norm_rounds_dy_as_read(s) ? OutputReader::one_op : OutputReader::several);
    plan.gemm(B, d, H1, dy_dy(k), dy_w(k), ws.d_ln, dy_round.by_gemm);
    // dA = dA + LN'(dy). This add writes block k - 1's dA, which that block's da GEMM reads next
    // (not after an attention sub-block, which adds into dA after it; block 0's dA no GEMM reads).
    const bool add_writes_next_da = k > 0 && s.residual && !s.attention();
    const GemmOperand* dA_q = add_writes_next_da ? plan.produced_by_writer(da_dy(k - 1)) : nullptr;
    norm_backward_into_residual(be, s, k, mlp_norm_site(k), gq, ws.d_ln, ws.xhat[k], ws.rstd[k], dA, grads, ws, R,
                                dy_round.by_reader, dA_q, po);
    if (s.attention()) attention_backward(be, s, params, k, dA, ws, grads, pol);
  }
  // A token network's embedding: dE[v] = sum over the rows r with x_r = v of dA_0[r] (dA is A_0's gradient now).
  if (s.tokens()) be.embed_bwd(x, dA, grads + group(s, 0, ParamGroup::embed).offset, B, d, s.vocab);
}

ParamQuant forward_param_quant(const ParamGroup& g, const PassPolicy& pol) {
  const PrecisionConfig& p = pol.p;
  ParamQuant r;
  r.rows = g.rows;
  r.cols = g.cols;
  switch (g.kind) {
    case ParamGroup::gamma:
    case ParamGroup::beta:
      r.q = role_spec(p, p.ln_affine, Role::ln_affine,
                      sr_seed(pol.seed, op_id(g.layer, g.kind == ParamGroup::gamma ? OpId::ln_gamma : OpId::ln_beta)));
      break;
    case ParamGroup::w1:
    case ParamGroup::w2:
      r.q = role_spec(p, p.weight, Role::weight,
                      sr_seed(pol.seed, op_id(g.layer, g.kind == ParamGroup::w1 ? OpId::fc1_w : OpId::fc2_w)));
      r.round_bf16_first = p.elementwise_bf16;
      r.bf16_mode = p.elementwise_rounding;
      break;
    case ParamGroup::b2:
      break;  // never quantized (precision.bias: elementwise rounds it to bf16 where it is added)
    default:
      break;  // the attention and token groups: not read by the clamp debt or the norm snap (FP32 here)
  }
  return r;
}

void snap_norm_affine(Backend& be, const NetShape& S, float* params, const PassPolicy& pol, float* scratch) {
  for (const ParamGroup& g : S.groups) {
    if (g.kind != ParamGroup::gamma && g.kind != ParamGroup::beta) continue;
    const ParamQuant pq = forward_param_quant(g, pol);
    be.copy(scratch, params + g.offset, static_cast<size_t>(g.size()));
    if (pq.round_bf16_first) be.round_bf16(scratch, static_cast<size_t>(g.size()), pq.bf16_mode);
    be.quantize(scratch, params + g.offset, pq.rows, pq.cols, pq.axis, pq.q);
  }
}

}  // namespace mxlab
