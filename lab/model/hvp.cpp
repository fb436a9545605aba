// Exact Hessian-vector products of the student's FP32 loss (see hvp.h): the primal pass with its
// per-layer input gradients, then the R-operator's tangent forward and tangent backward. The
// op sequence and the tangent of every op are written out in lab/model/README.md
// ("Curvature"); the comments here only name which formula each call is.
#include "lab/model/hvp.h"

#include "lab/core/error.h"
#include "lab/model/elementwise.h"

namespace mxlab {

namespace {

const ElementwiseRound kFp32{};  // no rounding anywhere

// An FP32 GEMM operand (no quantization, no statistics): C = A B^T in IEEE SGEMM.
GemmOperand f32(const float* p, bool k_contiguous) {
  GemmOperand o;
  o.p = p;
  o.k_contiguous = k_contiguous;
  return o;
}

const float* at(const NetShape& s, const float* base, int layer, ParamGroup::Kind kind) {
  const ParamGroup* g = s.find(layer, kind);
  return g ? base + g->offset : nullptr;
}
float* at(const NetShape& s, float* base, int layer, ParamGroup::Kind kind) {
  const ParamGroup* g = s.find(layer, kind);
  return g ? base + g->offset : nullptr;
}

void check_supported(const NetShape& s, const LossSpec& loss, const HvpWorkspace& ws) {
  if (!s.residual) throw Error("curvature: Hessian-vector products are implemented for the residual student only");
  if (loss.kind == LossKind::xent)
    throw Error("curvature: Hessian-vector products have no embedding or cross-entropy (data.kind: tokens)");
  if (loss.kind == LossKind::kl && !(loss.kl_temperature > 0.0f))
    throw Error(msg("kl_temperature must be positive (got ", loss.kl_temperature, ")"));
  MXLAB_ASSERT(static_cast<int>(ws.gA.size()) == s.depth && ws.batch > 0,
               "HVP workspace was not made for this network (depth ", s.depth, ", workspace ", ws.gA.size(), ")");
}

// Layer 0's W1 input y_0 has a zero tangent unless the LN affine parameters move it.
bool ry_zero(const NetShape& s, int k) { return k == 0 && !(s.layernorm && s.ln_affine); }
// dL/dy_k is needed for the LN parameters' gradients and for the input gradient (k > 0).
bool need_gy(const NetShape& s, int k) { return k > 0 || (s.layernorm && s.ln_affine); }

}  // namespace

HvpWorkspace HvpWorkspace::make(Backend& be, const NetShape& s, int64_t batch) {
  HvpWorkspace ws;
  ws.batch = batch;
  ws.primal = Workspace::make(be, s, batch);  // validates batch and shape
  const size_t bd = static_cast<size_t>(batch * s.d), bh = static_cast<size_t>(batch * s.hidden),
               bh1 = static_cast<size_t>(batch * s.hidden_in);
  for (int k = 0; k < s.depth; ++k) {
    ws.gA.push_back(k + 1 < s.depth ? be.alloc(bd) : ws.primal.dout);
    ws.gy.push_back(be.alloc(bd));
    ws.ga.push_back(be.alloc(bh));
    ws.gh.push_back(be.alloc(bh1));
  }
  for (int k = 0; k <= s.depth; ++k) ws.rA.push_back(be.alloc(bd));
  be.fill(ws.rA[0], 0.0f, bd);
  for (int k = 0; k < s.depth; ++k) {
    float* rx = s.layernorm ? be.alloc(bd) : nullptr;
    ws.rxhat.push_back(rx);
    ws.ry.push_back(s.layernorm ? (s.ln_affine ? be.alloc(bd) : rx) : ws.rA[k]);
    ws.rh.push_back(be.alloc(bh1));
    ws.ra.push_back(be.alloc(bh));
  }
  ws.rdA = be.alloc(bd);
  ws.rdy = be.alloc(bd);
  ws.rdx = be.alloc(bd);
  ws.rda = be.alloc(bh);
  ws.rdh = be.alloc(bh1);
  ws.ro = be.alloc(bd);
  ws.col = be.alloc(static_cast<size_t>(s.d));
  return ws;
}

int64_t HvpWorkspace::floats(const NetShape& s, int64_t batch) {
  const int64_t L = s.depth, bd = batch * s.d, bh = batch * s.hidden, bh1 = batch * s.hidden_in;
  // mlp.h's Workspace (Workspace::make): per layer a_in, ln_y, xhat (LN), h, a, rstd (LN);
  // then out, dout, d_ln, d_a, d_h, d_x, y, Q(gamma) per layer, Q(beta), loss (MLP blocks).
  const int64_t ln = s.layernorm ? 1 : 0;
  int64_t n = L * (bd * (1 + 2 * ln) + bh1 + bh + ln * batch) + 5 * bd + bh + bh1 + (L + 1) * s.d + 1;
  n += (L - 1) * bd + L * (bd + bh + bh1);                        // gA (last aliases dout), gy, ga, gh
  n += (L + 1) * bd;                                               // rA
  n += L * (ln * bd + (s.layernorm && s.ln_affine ? bd : 0) + bh1 + bh);  // rxhat, ry, rh, ra
  n += 4 * bd + bh + bh1 + s.d;                                    // rdA, rdy, rdx, ro, rda, rdh, col
  return n;
}

int hvp_gemms(const NetShape& s) {
  int n = 0;
  for (int k = 0; k < s.depth; ++k) {
    const int ry_terms = ry_zero(s, k) ? 0 : 1;
    n += (1 + ry_terms) + 2;                              // R{h}, R{o}
    n += 2 + 2 + (1 + ry_terms) + (need_gy(s, k) ? 2 : 0);  // R{dW2}, R{da}, R{dW1}, R{dy}
  }
  return n;
}

void hvp_prepare(Backend& be, const NetShape& s, const LossSpec& loss, uint64_t seed, const float* params, const float* x,
                 const float* target, HvpWorkspace& ws) {
  check_supported(s, loss, ws);
  PassPolicy pol;
  pol.p = PrecisionConfig::fp32();
  pol.seed = seed;
  Workspace& w = ws.primal;
  forward(be, s, params, x, w, pol);
  loss_and_grad(be, loss, target, w, pol, nullptr);  // dout = gA[L-1]
  const int64_t B = ws.batch, d = s.d, H = s.hidden, H1 = s.hidden_in;
  // The chain of input gradients only (the parameter gradients are not needed).
  for (int k = s.depth - 1; k >= 0; --k) {
    const float* W1 = at(s, params, k, ParamGroup::w1);
    const float* W2 = at(s, params, k, ParamGroup::w2);
    be.gemm(B, H, d, f32(ws.gA[k], true), f32(W2, false), ws.ga[k], 0.0f, kFp32);  // da = dA W2
    be.act_bwd(s.act, w.h[k], ws.ga[k], ws.gh[k], B, H, kFp32, w.h_round, kFp32);  // dh = act'(h) da
    if (!need_gy(s, k)) continue;
    be.gemm(B, d, H1, f32(ws.gh[k], true), f32(W1, false), ws.gy[k], 0.0f, kFp32);  // dy = dh W1
    if (k == 0) continue;
    const float* dx = ws.gy[k];
    if (s.layernorm) {
      be.layernorm_bwd(ws.gy[k], w.xhat[k], w.rstd[k], at(s, params, k, ParamGroup::gamma), w.d_x, nullptr, nullptr,
                       B, d, kFp32, kFp32);
      dx = w.d_x;
    }
    be.add(ws.gA[k - 1], ws.gA[k], dx, static_cast<size_t>(B * d), kFp32);  // residual: dA_k = dA_{k+1} + dx
  }
}

void hvp_apply(Backend& be, const NetShape& s, const LossSpec& loss, uint64_t seed, const float* params, const float* v, float* hv,
               HvpWorkspace& ws) {
  check_supported(s, loss, ws);
  MXLAB_ASSERT(v != nullptr && hv != nullptr && v != hv, "hvp_apply needs distinct input and output vectors");
  const Workspace& w = ws.primal;
  const int64_t B = ws.batch, d = s.d, H = s.hidden, H1 = s.hidden_in;
  const size_t bd = static_cast<size_t>(B * d);
  const bool affine = s.layernorm && s.ln_affine;

  // ---- tangent forward: R{A_{k+1}} = R{A_k} + R{a} W2^T + a V2^T + v_b2 ----
  for (int k = 0; k < s.depth; ++k) {
    const float* W1 = at(s, params, k, ParamGroup::w1);
    const float* W2 = at(s, params, k, ParamGroup::w2);
    const float* V1 = at(s, v, k, ParamGroup::w1);
    const float* V2 = at(s, v, k, ParamGroup::w2);
    if (s.layernorm) {
      // R{xhat} = J R{A}: the layernorm Jacobian is symmetric, so layernorm_bwd applies it.
      if (k > 0) be.layernorm_bwd(ws.rA[k], w.xhat[k], w.rstd[k], nullptr, ws.rxhat[k], nullptr, nullptr, B, d, kFp32, kFp32);
      if (affine)
        be.ln_affine_tangent(k > 0 ? ws.rxhat[k] : nullptr, w.xhat[k], at(s, params, k, ParamGroup::gamma),
                             at(s, v, k, ParamGroup::gamma), at(s, v, k, ParamGroup::beta), ws.ry[k], B, d);
    }
    // R{h} = R{y} W1^T + y V1^T
    float beta = 0.0f;
    if (!ry_zero(s, k)) {
      be.gemm(B, H1, d, f32(ws.ry[k], true), f32(W1, true), ws.rh[k], 0.0f, kFp32);
      beta = 1.0f;
    }
    be.gemm(B, H1, d, f32(w.ln_y[k], true), f32(V1, true), ws.rh[k], beta, kFp32);
    be.act_jvp(s.act, w.h[k], ws.rh[k], ws.ra[k], B, H);
    // R{o} = R{a} W2^T + a V2^T
    be.gemm(B, d, H, f32(ws.ra[k], true), f32(W2, true), ws.ro, 0.0f, kFp32);
    be.gemm(B, d, H, f32(w.a[k], true), f32(V2, true), ws.ro, 1.0f, kFp32);
    be.residual_add(ws.rA[k + 1], ws.rA[k], ws.ro, at(s, v, k, ParamGroup::b2), B, d, kFp32, kFp32);
  }

  // ---- the loss Hessian in the output: R{dout} = H_out R{out} ----
  const float* rout = ws.rA[s.depth];
  switch (loss.kind) {
    case LossKind::mse:
      be.axpby(ws.rdA, rout, mse_grad_scale(B * d), 0.0f, bd);  // (2/n) R{out}
      break;
    case LossKind::kl:
      be.loss_kl_tangent(w.out, rout, ws.rdA, B, d, loss.kl_temperature);
      break;
    case LossKind::xent:
      break;  // refused by check_supported
  }

  // ---- tangent backward: the parameter gradients' tangents are H v ----
  for (int k = s.depth - 1; k >= 0; --k) {
    const float* W1 = at(s, params, k, ParamGroup::w1);
    const float* W2 = at(s, params, k, ParamGroup::w2);
    const float* V1 = at(s, v, k, ParamGroup::w1);
    const float* V2 = at(s, v, k, ParamGroup::w2);
    const float* gA = ws.gA[k];
    if (float* hb2 = at(s, hv, k, ParamGroup::b2)) be.col_sum(ws.rdA, hb2, B, d);  // R{db2} = colsum R{dA}
    // R{dW2} = R{dA}^T a + dA^T R{a}
    float* hW2 = at(s, hv, k, ParamGroup::w2);
    be.gemm(d, H, B, f32(ws.rdA, false), f32(w.a[k], false), hW2, 0.0f, kFp32);
    be.gemm(d, H, B, f32(gA, false), f32(ws.ra[k], false), hW2, 1.0f, kFp32);
    // R{da} = R{dA} W2 + dA V2
    be.gemm(B, H, d, f32(ws.rdA, true), f32(W2, false), ws.rda, 0.0f, kFp32);
    be.gemm(B, H, d, f32(gA, true), f32(V2, false), ws.rda, 1.0f, kFp32);
    // R{dh} = act'(h) R{da} + act''(h) da R{h}
    be.act_bwd_tangent(s.act, w.h[k], ws.rh[k], ws.ga[k], ws.rda, ws.rdh, B, H);
    // R{dW1} = R{dh}^T y + dh^T R{y}
    float* hW1 = at(s, hv, k, ParamGroup::w1);
    be.gemm(H1, d, B, f32(ws.rdh, false), f32(w.ln_y[k], false), hW1, 0.0f, kFp32);
    if (!ry_zero(s, k)) be.gemm(H1, d, B, f32(ws.gh[k], false), f32(ws.ry[k], false), hW1, 1.0f, kFp32);
    if (!need_gy(s, k)) continue;
    // R{dy} = R{dh} W1 + dh V1
    be.gemm(B, d, H1, f32(ws.rdh, true), f32(W1, false), ws.rdy, 0.0f, kFp32);
    be.gemm(B, d, H1, f32(ws.gh[k], true), f32(V1, false), ws.rdy, 1.0f, kFp32);
    if (affine) {
      // R{dgamma} = colsum(R{dy} xhat + dy R{xhat}), R{dbeta} = colsum R{dy}
      float* hg = at(s, hv, k, ParamGroup::gamma);
      be.col_dot(ws.rdy, w.xhat[k], hg, B, d);
      if (k > 0) {
        be.col_dot(ws.gy[k], ws.rxhat[k], ws.col, B, d);
        be.add(hg, hg, ws.col, static_cast<size_t>(d), kFp32);
      }
      be.col_sum(ws.rdy, at(s, hv, k, ParamGroup::beta), B, d);
    }
    if (k == 0) continue;  // the input gradient's tangent is not needed
    const float* rdx = ws.rdy;
    if (s.layernorm) {
      be.layernorm_bwd_tangent(ws.gy[k], ws.rdy, w.xhat[k], ws.rxhat[k], ws.rA[k], w.rstd[k],
                               at(s, params, k, ParamGroup::gamma), at(s, v, k, ParamGroup::gamma), ws.rdx, B, d);
      rdx = ws.rdx;
    }
    be.add(ws.rdA, ws.rdA, rdx, bd, kFp32);  // R{dA_k} = R{dA_{k+1}} + R{dx}
  }
}

}  // namespace mxlab
