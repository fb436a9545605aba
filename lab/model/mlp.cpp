// The proxy model (DESIGN.md section 1) written once against the Backend interface: shapes
// and parameter layout, deterministic initialisation, and the forward / loss / backward
// passes with the precision policy of DESIGN.md sections 3-4. The exact op sequence is
// documented in lab/model/README.md; both backends run it unchanged.
#include "lab/model/mlp.h"

#include <cmath>

#include "lab/core/detmath.h"
#include "lab/core/error.h"
#include "lab/model/elementwise.h"

namespace mxlab {

namespace {

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
uint64_t op_id(int layer, OpId op) {
  return static_cast<uint64_t>(layer) * kOpsPerLayer + static_cast<uint64_t>(op) + 1;
}

// SwiGLU hidden width H' = round(mult * 2/3 * width) in integers (never a tie: the
// fractional part of 2*mult*width/3 is 0, 1/3 or 2/3).
int swiglu_hidden(int mult, int width) { return (2 * mult * width + 1) / 3; }

using Role = PrecisionConfig::Role;

// The QuantSpec of a role with format f under policy p. MX formats round elements with the
// role's rounding mode; scalar formats (bf16/fp16) only round to nearest, so they take the
// element-wise rounding mode.
QuantSpec role_spec(const PrecisionConfig& p, NumFmt f, Role role, uint64_t seed) {
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
QuantSpec stats_spec(const PrecisionConfig& p, NumFmt f, Role role, uint64_t seed) {
  if (is_mx(f)) return role_spec(p, f, role, seed);
  QuantSpec s = role_spec(p, p.diagnostic_format, role, seed);
  if (s.rounding == Rounding::stochastic) s.rounding = Rounding::nearest_even;
  return s;
}

// How the GEMM operands of one pass direction are built from the policy.
struct OperandRules {
  const PrecisionConfig* p;  // configured policy (formats, and the statistics specs)
  bool quantize;             // false: operands stay FP32 (backward with `backward: false`)
  uint64_t seed;
  bool collect;              // fill statistics slots
  int stats_base;            // slot offset of this pass (PassPolicy::stats_base)

  GemmOperand make(const float* data, bool k_contiguous, NumFmt fmt, Role role, int layer, OpId op,
                   int slot = -1) const {
    GemmOperand o;
    o.p = data;
    o.k_contiguous = k_contiguous;
    o.q = role_spec(*p, quantize ? fmt : NumFmt::fp32, role, seed);
    o.round_bf16_first = quantize && p->elementwise_bf16;
    o.bf16_mode = p->elementwise_rounding;
    o.sr_op = op_id(layer, op);
    if (collect && slot >= 0) {
      o.stats_slot = stats_base + slot;
      o.stats_q = stats_spec(*p, fmt, role, seed);
    }
    return o;
  }
};

ElementwiseRound policy_round(const PrecisionConfig& p) { return ElementwiseRound{p.elementwise_bf16, p.elementwise_rounding}; }

const ParamGroup& group(const NetShape& s, int layer, ParamGroup::Kind kind) {
  const ParamGroup* g = s.find(layer, kind);
  MXLAB_ASSERT(g != nullptr, "layer ", layer, " has no parameter group of kind ", static_cast<int>(kind));
  return *g;
}

// Q(gamma), Q(beta) of layer k into ws.gq_gamma / ws.gq_beta (DESIGN.md section 3). The
// statistics are collected even when ln_affine does not quantize (under the diagnostic spec).
void ln_affine_operands(Backend& be, const NetShape& s, const float* params, int k, Workspace& ws,
                        const PassPolicy& pol, bool collect) {
  const PrecisionConfig& p = pol.p;
  struct Item {
    ParamGroup::Kind kind;
    float* dst;
    StatTensor tensor;
    OpId op;
  };
  const Item items[] = {{ParamGroup::gamma, ws.gq_gamma, StatTensor::gamma, OpId::ln_gamma},
                        {ParamGroup::beta, ws.gq_beta, StatTensor::beta, OpId::ln_beta}};
  for (const Item& it : items) {
    const float* src = params + group(s, k, it.kind).offset;
    const uint64_t seed = sr_seed(pol.seed, op_id(k, it.op));
    int slot = collect ? pol.stats_base + stats_slot(k, it.tensor) : -1;
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
  if (pol.p.block_size <= 0)
    throw Error(msg("precision.block_size must be positive (got ", pol.p.block_size, ")"));
}

void check_model(const char* what, int depth, int width, int hidden_mult, Act act) {
  if (depth < 1) throw Error(msg(what, ".depth must be at least 1 (got ", depth, ")"));
  if (width < 1) throw Error(msg(what, ".width must be at least 1 (got ", width, ")"));
  if (hidden_mult < 1) throw Error(msg("model.hidden_mult must be at least 1 (got ", hidden_mult, ")"));
  if (static_cast<int>(act) >= static_cast<int>(Act::kCount))
    throw Error(msg(what, ".activation is not a valid activation (use relu, gelu, gelu_tanh, swiglu or linear)"));
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
  for (int k = 0; k < s.depth; ++k) {
    if (s.layernorm && s.ln_affine) {
      push("gamma", ParamGroup::gamma, k, 1, s.d);
      push("beta", ParamGroup::beta, k, 1, s.d);
    }
    push("W1", ParamGroup::w1, k, s.hidden_in, s.d);
    push("W2", ParamGroup::w2, k, s.d, s.hidden);
    if (s.fc2_bias) push("b2", ParamGroup::b2, k, 1, s.d);
  }
  s.num_params = off;
}

}  // namespace

const char* name(StatTensor t) {
  switch (t) {
    case StatTensor::ln_out: return "ln_out";
    case StatTensor::act_out: return "act_out";
    case StatTensor::grad_out: return "grad_out";
    case StatTensor::grad_hidden: return "grad_hidden";
    case StatTensor::gamma: return "gamma";
    case StatTensor::beta: return "beta";
    default: return "unknown";
  }
}

NetShape NetShape::student(const ModelConfig& m) {
  check_model("model", m.depth, m.width, m.hidden_mult, m.activation);
  if (m.layernorm && !(m.ln_eps > 0.0f)) throw Error(msg("model.ln_eps must be positive (got ", m.ln_eps, ")"));
  NetShape s;
  s.depth = m.depth;
  s.d = m.width;
  s.act = m.activation;
  s.hidden = m.activation == Act::swiglu ? swiglu_hidden(m.hidden_mult, m.width) : m.hidden_mult * m.width;
  s.hidden_in = m.activation == Act::swiglu ? 2 * s.hidden : s.hidden;
  s.layernorm = m.layernorm;
  s.ln_affine = m.layernorm && m.ln_affine;
  s.fc2_bias = m.fc2_bias;
  s.residual = true;
  s.ln_eps = m.ln_eps;
  layout(s);
  return s;
}

NetShape NetShape::teacher(const ModelConfig& m, const TeacherConfig& t) {
  const int depth = t.depth == 0 ? m.depth : t.depth;
  const int width = t.width == 0 ? m.width : t.width;
  const Act act = t.activation.value_or(m.activation);
  if (t.depth < 0) throw Error(msg("teacher.depth must be >= 0 (0 = model.depth; got ", t.depth, ")"));
  if (t.width < 0) throw Error(msg("teacher.width must be >= 0 (0 = model.width; got ", t.width, ")"));
  check_model("teacher", depth, width, m.hidden_mult, act);
  NetShape s;
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
        for (int64_t i = 0; i < g.size(); ++i) dst[i] = 1.0f;
        break;
      case ParamGroup::beta:
        break;  // zeros
      case ParamGroup::w1:
      case ParamGroup::w2:
      case ParamGroup::b2: {
        const bool weight = g.kind != ParamGroup::b2;
        if (init == InitKind::pytorch) {
          // nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weight and the bias.
          const int64_t fan_in = weight ? g.cols : s.hidden;
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
  ws.out = be.alloc(bd);
  ws.dout = be.alloc(bd);
  ws.d_ln = be.alloc(bd);
  ws.d_a = be.alloc(bh);
  ws.d_h = be.alloc(bh1);
  ws.d_x = be.alloc(bd);
  ws.gq_gamma = be.alloc(static_cast<size_t>(s.d));
  ws.gq_beta = be.alloc(static_cast<size_t>(s.d));
  ws.y = be.alloc(bd);
  ws.loss = be.alloc(1);
  return ws;
}

void forward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws,
             const PassPolicy& pol) {
  check_pass(s, params, ws, pol);
  MXLAB_ASSERT(x != nullptr, "forward without input");
  const PrecisionConfig& p = pol.p;
  const ElementwiseRound R = policy_round(p);
  const OperandRules ops{&p, true, pol.seed, pol.collect_stats, pol.stats_base};
  const int64_t B = ws.batch, d = s.d, H = s.hidden, H1 = s.hidden_in;

  // A0 = R(x)
  be.copy(ws.a_in[0], x, static_cast<size_t>(B * d));
  if (R.bf16) be.round_bf16(ws.a_in[0], static_cast<size_t>(B * d), R.mode);
  for (int k = 0; k < s.depth; ++k) {
    const float* A = ws.a_in[k];
    float* next = k + 1 < s.depth ? ws.a_in[k + 1] : ws.out;
    if (s.layernorm) {
      const float *gq = nullptr, *bq = nullptr;
      if (s.ln_affine) {
        ln_affine_operands(be, s, params, k, ws, pol, pol.collect_stats);
        gq = ws.gq_gamma;
        bq = ws.gq_beta;
      }
      be.layernorm_fwd(A, gq, bq, ws.ln_y[k], ws.xhat[k], ws.rstd[k], B, d, s.ln_eps, R);
    }
    const float* W1 = params + group(s, k, ParamGroup::w1).offset;
    const float* W2 = params + group(s, k, ParamGroup::w2).offset;
    // h [B x H1] = y [B x d] . W1 [H1 x d]^T
    be.gemm(B, H1, d, ops.make(ws.ln_y[k], true, p.activation, Role::activation, k, OpId::fc1_x, stats_slot(k, StatTensor::ln_out)),
            ops.make(W1, true, p.weight, Role::weight, k, OpId::fc1_w), ws.h[k], 0.0f, R);
    be.act_fwd(s.act, ws.h[k], ws.a[k], B, H, R);
    // o [B x d] = a [B x H] . W2 [d x H]^T
    float* o = s.residual ? ws.y : next;
    be.gemm(B, d, H, ops.make(ws.a[k], true, p.activation, Role::activation, k, OpId::fc2_x, stats_slot(k, StatTensor::act_out)),
            ops.make(W2, true, p.weight, Role::weight, k, OpId::fc2_w), o, 0.0f, R);
    if (s.residual) {
      const ParamGroup* b2 = s.find(k, ParamGroup::b2);
      be.copy(next, A, static_cast<size_t>(B * d));
      be.residual_add(next, ws.y, b2 ? params + b2->offset : nullptr, B, d, R);
    }
  }
}

void loss_and_grad(Backend& be, const RunConfig& cfg, const float* target, Workspace& ws, const PassPolicy& pol,
                   float* loss_history) {
  MXLAB_ASSERT(target != nullptr && ws.out != nullptr, "loss without output or target");
  // dout starts the backward pass, so `backward: false` leaves it in FP32 too.
  const ElementwiseRound R = pol.p.backward ? policy_round(pol.p) : ElementwiseRound{};
  const int64_t B = ws.batch, d = cfg.model.width;
  switch (cfg.loss) {
    case LossKind::mse:
      be.loss_mse(ws.out, target, ws.dout, ws.loss, loss_history, B, d, R);
      break;
    case LossKind::kl:
      if (!(cfg.kl_temperature > 0.0f))
        throw Error(msg("kl_temperature must be positive (got ", cfg.kl_temperature, ")"));
      be.loss_kl(ws.out, target, ws.dout, ws.loss, loss_history, B, d, cfg.kl_temperature, R);
      break;
  }
}

void backward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws, float* grads,
              const PassPolicy& pol) {
  (void)x;  // the forward pass saved R(x) as ws.a_in[0]
  check_pass(s, params, ws, pol);
  MXLAB_ASSERT(grads != nullptr, "backward without a gradient buffer");
  const PrecisionConfig& p = pol.p;
  // backward: false -> FP32 GEMM operands and no element-wise rounding (statistics are still
  // counted, under the configured specs: what would clamp if the backward were quantized).
  const ElementwiseRound R = p.backward ? policy_round(p) : ElementwiseRound{};
  const OperandRules ops{&p, p.backward, pol.seed, pol.collect_stats, pol.stats_base};
  const NumFmt w_bwd = p.weight_bwd_fmt(), x_bwd = p.activation_bwd_fmt();
  const int64_t B = ws.batch, d = s.d, H = s.hidden, H1 = s.hidden_in;

  float* dA = ws.dout;  // gradient of the residual stream leaving block k (consumed in place)
  for (int k = s.depth - 1; k >= 0; --k) {
    const ParamGroup& g1 = group(s, k, ParamGroup::w1);
    const ParamGroup& g2 = group(s, k, ParamGroup::w2);
    const float* W1 = params + g1.offset;
    const float* W2 = params + g2.offset;
    if (const ParamGroup* b2 = s.find(k, ParamGroup::b2)) be.col_sum(dA, grads + b2->offset, B, d);
    // dW2 [d x H] = dA^T a: reduction over the batch (both operands stored [B x .]).
    be.gemm(d, H, B, ops.make(dA, false, p.grad, Role::grad, k, OpId::dw2_dy), ops.make(ws.a[k], false, x_bwd, Role::activation, k, OpId::dw2_x),
            grads + g2.offset, 0.0f, R);
    // da [B x H] = dA W2: reduction over d (W2 stored [d x H]).
    be.gemm(B, H, d, ops.make(dA, true, p.grad, Role::grad, k, OpId::da_dy, stats_slot(k, StatTensor::grad_out)),
            ops.make(W2, false, w_bwd, Role::weight, k, OpId::da_w), ws.d_a, 0.0f, R);
    be.act_bwd(s.act, ws.h[k], ws.d_a, ws.d_h, B, H, R);
    // dW1 [H1 x d] = dh^T y: reduction over the batch.
    be.gemm(H1, d, B, ops.make(ws.d_h, false, p.grad, Role::grad, k, OpId::dw1_dy),
            ops.make(ws.ln_y[k], false, x_bwd, Role::activation, k, OpId::dw1_x), grads + g1.offset, 0.0f, R);
    // dy [B x d] = dh W1: reduction over H1 (W1 stored [H1 x d]).
    be.gemm(B, d, H1, ops.make(ws.d_h, true, p.grad, Role::grad, k, OpId::dy_dy, stats_slot(k, StatTensor::grad_hidden)),
            ops.make(W1, false, w_bwd, Role::weight, k, OpId::dy_w), ws.d_ln, 0.0f, R);
    const float* dx = ws.d_ln;
    if (s.layernorm) {
      const float* gq = nullptr;
      float *dgamma = nullptr, *dbeta = nullptr;
      if (s.ln_affine) {
        // The forward's Q(gamma) again (deterministic: same seed, op and step); gradients
        // w.r.t. the quantized values go straight through to the FP32 masters.
        ln_affine_operands(be, s, params, k, ws, pol, false);
        gq = ws.gq_gamma;
        dgamma = grads + group(s, k, ParamGroup::gamma).offset;
        dbeta = grads + group(s, k, ParamGroup::beta).offset;
      }
      be.layernorm_bwd(ws.d_ln, ws.xhat[k], ws.rstd[k], gq, ws.d_x, dgamma, dbeta, B, d, R);
      dx = ws.d_x;
    }
    if (s.residual)
      be.add(dA, dA, dx, static_cast<size_t>(B * d), R);
    else
      be.copy(dA, dx, static_cast<size_t>(B * d));
  }
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
      break;  // added in FP32
  }
  return r;
}

}  // namespace mxlab
