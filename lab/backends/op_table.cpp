// The op table (op_table.h): one descriptor per Backend method, with its generator, call,
// comparison rule and sizes. To add an op: write make_<op> (the tensors, in a fixed order) and
// run_<op> (the call, reading b.p[i] in that order), add a row to op_table() below, and say in
// its rule whether the two backends agree bit for bit or within what, and why.
#include "lab/backends/op_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "lab/core/detmath.h"
#include "lab/core/error.h"
#include "lab/core/philox.h"

namespace mxlab {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- sizes of the paper configuration (experiments/paper/fig4_baseline.yaml) ----
constexpr int64_t kB = 2048;  // tokens of a batch
constexpr int64_t kD = 512;   // width
constexpr int64_t kH = 2048;  // hidden (4 d)
// The student's parameters at L = 4: per layer gamma, beta (d), W1 [H x d], W2 [d x H], b2 (d).
constexpr int64_t kP = 4 * (3 * kD + 2 * kH * kD);
// The attention configuration (experiments/paper/attn_vs_mlp_lr5e-4.yaml): 64 sequences of 32
// tokens, 8 heads of 64.
constexpr int64_t kSeqs = 64, kSeq = 32, kHeads = 8, kHeadDim = kD / kHeads;

const ElementwiseRound kFp32{};
const ElementwiseRound kBf16Away{true, Rounding::nearest_away};  // the paper's element-wise ops

// ---- comparison rules ----
const OpRule kExactElem{OpMatch::exact, 0.0,
                        "a per-element function of its inputs: both backends evaluate the same scalar code "
                        "(lab/model/elementwise.h, lab/mx/scalar.h)"};
const OpRule kExactCopy{OpMatch::exact, 0.0, "copies or writes values, nothing to round"};
const OpRule kExactRng{OpMatch::exact, 0.0, "the same Philox words and det_box_muller float code on both"};
const OpRule kExactQuant{OpMatch::exact, 0.0,
                         "quantize_dequantize element by element (lab/mx/scalar.h) and exact integer counts"};
const OpRule kExactOrdered{OpMatch::exact, 0.0,
                           "element values from the shared scalar code, sums in the same specified order"};
const OpRule kGemm{OpMatch::close, std::ldexp(1.0, -12),
                   "FP32 accumulation in another order (cuBLAS vs Eigen) on bit-identical quantized operands: "
                   "2 K 2^-24 sum|a b| < 2^-12 rms(C) for K <= 128 and unit-normal inputs"};
const OpRule kDoubleSum{OpMatch::close, std::ldexp(1.0, -22),
                        "double sums in another order, cast to float: at most one float ulp (2^-23 |ref|) apart"};
const OpRule kRowStats{OpMatch::close, std::ldexp(1.0, -19),
                       "row statistics are double sums cast to float; a cast on the other side of a float "
                       "boundary moves that row's elements by a few float ulps (FP32 outputs here)"};
const OpRule kRowTangent{OpMatch::close, std::ldexp(1.0, -16),
                         "row means are double sums cast to float: a one-ulp move of a mean changes the "
                         "element by a few ulps of its largest term (4 u sum|terms|)"};
const OpRule kHostSums{OpMatch::close, 1e-9,
                       "double sums of n <= 10^7 terms in another order: 2 n 2^-53 sum|terms|, far below 1e-9 "
                       "of the result's scale"};

// ---- generated tensors (deterministic: Philox stream `validation`, counter word = tag) ----
std::vector<float> gauss(int64_t n, uint64_t seed, uint32_t tag, float scale = 1.0f, float shift = 0.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {
    const U32x4 w = philox(seed, Stream::validation, tag, static_cast<uint64_t>(i / 2));
    float z0, z1;
    det_box_muller(w.v[0], w.v[1], z0, z1);
    v[static_cast<size_t>(i)] = shift + scale * z0;
    if (i + 1 < n) v[static_cast<size_t>(i + 1)] = shift + scale * z1;
  }
  return v;
}

// Uniform in [lo, hi).
std::vector<float> uniform(int64_t n, uint64_t seed, uint32_t tag, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = lo + (hi - lo) * u32_to_uniform(philox(seed, Stream::validation, tag,
                                                                       static_cast<uint64_t>(i)).v[0]);
  return v;
}

// Builds a case: tensors in the order the op's run function reads them.
struct Builder {
  OpCase c;
  explicit Builder(const OpSize& s) { c.size = s; }
  void in(std::vector<float> v) { c.tensors.push_back(std::move(v)); }
  void out(int64_t n) {  // written by the op: poisoned, compared
    c.tensors.push_back(std::vector<float>(static_cast<size_t>(n), kNaN));
    c.outputs.push_back(static_cast<int>(c.tensors.size()) - 1);
  }
  void inout(std::vector<float> v) {  // read and updated by the op: compared
    in(std::move(v));
    c.outputs.push_back(static_cast<int>(c.tensors.size()) - 1);
  }
};

QuantSpec mx_spec() {  // MXFP8 E4M3, the paper's floor scale and ties-away element rounding
  QuantSpec q;
  q.fmt = NumFmt::mxfp8_e4m3;
  q.block = 32;
  q.rule = ScaleRule::floor;
  q.rounding = Rounding::nearest_away;
  q.seed = 11;
  return q;
}

GemmOperand mx_operand(const float* p, bool k_contiguous, uint64_t sr_op) {
  GemmOperand o;
  o.p = p;
  o.k_contiguous = k_contiguous;
  o.q = mx_spec();
  o.round_bf16_first = true;  // the paper's bf16 element-wise ops before the MX cast
  o.bf16_mode = Rounding::nearest_away;
  o.sr_op = sr_op;
  return o;
}

#define SZ const OpSize& s, uint64_t seed
#define RUN Backend& be, const OpBufs& b, std::vector<double>& host
#define V0 s.v[0]
#define V1 s.v[1]
#define V2 s.v[2]
#define V3 s.v[3]
#define B0 b.size.v[0]
#define B1 b.size.v[1]
#define B2 b.size.v[2]
#define B3 b.size.v[3]
#define P(i) b.p[i]
#define UNUSED_HOST (void)host
#define N0 static_cast<size_t>(B0)

// ---- memory ----
OpCase make_copy(SZ) { Builder k(s); k.in(gauss(V0, seed, 1)); k.out(V0); return k.c; }
void run_copy(RUN) { UNUSED_HOST; be.copy(P(1), P(0), N0); }
OpCase make_fill(SZ) { (void)seed; Builder k(s); k.out(V0); return k.c; }
void run_fill(RUN) { UNUSED_HOST; be.fill(P(0), 0.25f, N0); }

// ---- capture: the trainer's protocol, three times (eager or recording, then replays) ----
OpCase make_capture(SZ) { Builder k(s); k.inout(gauss(V0, seed, 1)); k.in(gauss(V0, seed, 2)); return k.c; }
void run_capture(RUN) {
  UNUSED_HOST;
  constexpr int kKey = 7;
  for (int i = 0; i < 3; ++i) {
    if (be.replay(kKey)) continue;
    const bool rec = be.begin_capture(kKey);
    be.add(P(0), P(0), P(1), N0, kBf16Away);  // dst += b: each execution shows in the result
    be.end_capture(kKey);
    if (rec) be.replay(kKey);
  }
}

// ---- random numbers ----
OpCase make_randn(SZ) { (void)seed; Builder k(s); k.out(V0); return k.c; }
void run_randn(RUN) { UNUSED_HOST; be.randn(P(0), N0, 1234, Stream::data, 1.0f); }
OpCase make_add_randn(SZ) { Builder k(s); k.inout(gauss(V0, seed, 1)); return k.c; }
void run_add_randn(RUN) { UNUSED_HOST; be.add_randn(P(0), N0, 1234, Stream::label_noise, 0.005f); }

// ---- quantization ----
OpCase make_quantize(SZ) { Builder k(s); k.in(gauss(V0 * V1, seed, 1, 3.0f)); k.out(V0 * V1); return k.c; }
void prep_stats(Backend& be, const OpBufs&) { be.reset_stats(1); }
void run_quantize(RUN) { UNUSED_HOST; be.quantize(P(0), P(1), B0, B1, Axis::contiguous, mx_spec(), 0); }
void collect_stats(Backend& be, const OpBufs&, std::vector<double>& host) {
  for (const QuantStats& q : be.read_stats())
    for (uint64_t c : {q.n, q.lastbin, q.clamped, q.nan_blocks, q.blocks}) host.push_back(static_cast<double>(c));
}
OpCase make_round_bf16(SZ) { Builder k(s); k.inout(gauss(V0, seed, 1, 3.0f)); return k.c; }
void run_round_bf16(RUN) { UNUSED_HOST; be.round_bf16(P(0), N0, Rounding::nearest_away); }

// ---- GEMM: C[M x N] = A[M x K] B[N x K]^T, MXFP8 operands (bf16 first), FP32 output ----
OpCase make_gemm(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V2, seed, 1));
  k.in(gauss(V1 * V2, seed, 2));
  k.out(V0 * V1);
  return k.c;
}
void run_gemm(RUN) {
  UNUSED_HOST;
  be.gemm(B0, B1, B2, mx_operand(P(0), true, 1), mx_operand(P(1), true, 2), P(2), 0.0f, kFp32);
}
void run_prequantize(RUN) {  // B quantized ahead, then taken by the gemm
  UNUSED_HOST;
  GemmOperand bop = mx_operand(P(1), true, 2);
  const AheadOperand ahead{bop, B1, B2};
  be.prequantize(&ahead, 1);
  bop.prequantized = true;
  be.gemm(B0, B1, B2, mx_operand(P(0), true, 1), bop, P(2), 0.0f, kFp32);
}
// batch x (C_i[M x N] = A_i[M x K] B_i[N x K]^T): the per-head logits Q K^T.
OpCase make_gemm_batched(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1 * V3, seed, 1));
  k.in(gauss(V0 * V2 * V3, seed, 2));
  k.out(V0 * V1 * V2);
  return k.c;
}
void run_gemm_batched(RUN) {
  UNUSED_HOST;
  be.gemm_batched(B0, B1, B2, B3, mx_operand(P(0), true, 1), mx_operand(P(1), true, 2), P(2), 0.0f, kFp32);
}

// ---- norms ([rows x d]) ----
OpCase make_layernorm_fwd(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 1.5f, 0.3f));
  k.in(gauss(V1, seed, 2, 0.2f, 1.0f));
  k.in(gauss(V1, seed, 3, 0.1f));
  k.out(V0 * V1);
  k.out(V0 * V1);
  k.out(V0);
  return k.c;
}
void run_layernorm_fwd(RUN) {
  UNUSED_HOST;
  be.layernorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), B0, B1, 1e-5f, kFp32);
}
// The inputs of a norm's backward: dy, the normalised input, the per-row scale (rstd, or
// var + eps for the emulator's layernorm) uniform in [lo, hi], gamma; outputs dx and `param_grads`
// vectors of d (dgamma, and dbeta for layernorms).
OpCase norm_bwd_case(const OpSize& s, uint64_t seed, float lo, float hi, int param_grads) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 0.01f));  // dy
  k.in(gauss(V0 * V1, seed, 2));         // xhat / xn
  k.in(uniform(V0, seed, 3, lo, hi));    // rstd / vare
  k.in(gauss(V1, seed, 4, 0.2f, 1.0f));  // gamma
  k.out(V0 * V1);
  for (int i = 0; i < param_grads; ++i) k.out(V1);
  return k.c;
}
OpCase make_layernorm_bwd(SZ) { return norm_bwd_case(s, seed, 0.5f, 2.0f, 2); }
void run_layernorm_bwd(RUN) {
  UNUSED_HOST;
  be.layernorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), B0, B1, kFp32, kFp32);
}
OpCase make_rmsnorm_fwd(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 2.0f, 0.5f));
  k.in(gauss(V1, seed, 2, 0.2f, 1.0f));
  k.out(V0 * V1);
  k.out(V0 * V1);
  k.out(V0);
  return k.c;
}
void run_rmsnorm_fwd(RUN) {
  UNUSED_HOST;
  be.rmsnorm_fwd(P(0), P(1), P(2), P(3), P(4), B0, B1, 1e-5f, Backend::RmsEstimate{}, kFp32);
}
OpCase make_rmsnorm_bwd(SZ) { return norm_bwd_case(s, seed, 0.5f, 2.0f, 1); }
void run_rmsnorm_bwd(RUN) { UNUSED_HOST; be.rmsnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), B0, B1, kFp32); }
OpCase make_layernorm_vec_fwd(SZ) { return make_layernorm_fwd(s, seed); }
void run_layernorm_vec_fwd(RUN) {
  UNUSED_HOST;
  be.layernorm_vec_fwd(P(0), P(1), P(2), P(3), P(4), P(5), B0, B1, 1e-5f, kBf16Away);
}
OpCase make_layernorm_vec_bwd(SZ) { return norm_bwd_case(s, seed, 0.25f, 4.0f, 2); }
void run_layernorm_vec_bwd(RUN) {
  UNUSED_HOST;
  be.layernorm_vec_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), B0, B1, kBf16Away, kBf16Away);
}

// ---- activations ([rows x cols], GeLU; h is a GEMM output rounded as read) ----
OpCase make_act_fwd(SZ) { Builder k(s); k.in(gauss(V0 * V1, seed, 1, 2.0f)); k.out(V0 * V1); return k.c; }
void run_act_fwd(RUN) { UNUSED_HOST; be.act_fwd(Act::gelu, P(0), P(1), B0, B1, kBf16Away, kBf16Away); }
OpCase make_act_bwd(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 2.0f));
  k.in(gauss(V0 * V1, seed, 2, 0.01f));
  k.out(V0 * V1);
  return k.c;
}
void run_act_bwd(RUN) {
  UNUSED_HOST;
  be.act_bwd(Act::gelu, P(0), P(1), P(2), B0, B1, kBf16Away, kBf16Away, kBf16Away);
}

// ---- element-wise ----
OpCase make_residual_add(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1));
  k.in(gauss(V0 * V1, seed, 2));
  k.in(gauss(V1, seed, 3, 0.1f));
  k.out(V0 * V1);
  return k.c;
}
void run_residual_add(RUN) { UNUSED_HOST; be.residual_add(P(3), P(0), P(1), P(2), B0, B1, kBf16Away, kBf16Away); }
void run_residual_add_r(RUN) {
  UNUSED_HOST;
  const Backend::ResidualRound rr{kBf16Away, kBf16Away, kBf16Away, kBf16Away};
  be.residual_add_r(P(3), P(0), P(1), P(2), B0, B1, rr);
}
OpCase make_two_in_one_out(SZ) {  // a, b, dst: [n]
  Builder k(s);
  k.in(gauss(V0, seed, 1));
  k.in(gauss(V0, seed, 2));
  k.out(V0);
  return k.c;
}
void run_add(RUN) { UNUSED_HOST; be.add(P(2), P(0), P(1), N0, kBf16Away); }
void run_mul(RUN) { UNUSED_HOST; be.mul(P(2), P(0), P(1), N0); }
OpCase make_axpby(SZ) { Builder k(s); k.inout(gauss(V0, seed, 1)); k.in(gauss(V0, seed, 2)); return k.c; }
void run_axpby(RUN) { UNUSED_HOST; be.axpby(P(0), P(1), 0.5f, -1.25f, N0); }
OpCase make_precond_isqrt(SZ) { Builder k(s); k.in(uniform(V0, seed, 1, 0.0f, 1e-4f)); k.out(V0); return k.c; }
void run_precond_isqrt(RUN) { UNUSED_HOST; be.precond_isqrt(P(0), P(1), N0, 0.25f, 1e-8f); }
OpCase make_scale_cols(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1));
  k.in(gauss(V1, seed, 2, 0.5f, 1.0f));
  k.out(V0 * V1);
  return k.c;
}
void run_scale_cols(RUN) { UNUSED_HOST; be.scale_cols(P(0), P(1), P(2), B0, B1, kBf16Away); }

// ---- column reductions ([rows x d] -> [d]) ----
OpCase make_col_sum(SZ) { Builder k(s); k.in(gauss(V0 * V1, seed, 1)); k.out(V1); return k.c; }
void run_col_sum(RUN) { UNUSED_HOST; be.col_sum(P(0), P(1), B0, B1); }
OpCase make_col_dot(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1));
  k.in(gauss(V0 * V1, seed, 2));
  k.out(V1);
  return k.c;
}
void run_col_dot(RUN) { UNUSED_HOST; be.col_dot(P(0), P(1), P(2), B0, B1); }

// ---- losses ([rows x d]; loss value and its history entry at the step) ----
OpCase make_loss(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1));
  k.in(gauss(V0 * V1, seed, 2));
  k.out(V0 * V1);                                   // dout
  k.out(1);                                         // loss
  k.inout(std::vector<float>(8, 0.0f));             // loss history (entry op_step().step written)
  return k.c;
}
void run_loss_mse(RUN) { UNUSED_HOST; be.loss_mse(P(0), P(1), P(2), P(3), P(4), B0, B1, kBf16Away); }
void run_loss_kl(RUN) { UNUSED_HOST; be.loss_kl(P(0), P(1), P(2), P(3), P(4), B0, B1, 2.0f, kFp32); }
OpCase make_loss_kl_tangent(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1));  // out
  k.in(gauss(V0 * V1, seed, 2));  // rout
  k.out(V0 * V1);
  return k.c;
}
void run_loss_kl_tangent(RUN) { UNUSED_HOST; be.loss_kl_tangent(P(0), P(1), P(2), B0, B1, 2.0f); }

// ---- optimizers ([n]; lr and bias corrections from op_step()) ----
OpCase make_adam(SZ) {
  Builder k(s);
  k.inout(gauss(V0, seed, 1, 0.05f));            // p
  k.in(gauss(V0, seed, 2, 0.01f));               // g
  k.inout(gauss(V0, seed, 3, 0.001f));           // m
  k.inout(uniform(V0, seed, 4, 0.0f, 1e-4f));    // v
  return k.c;
}
void run_adam(RUN) { UNUSED_HOST; be.adam(P(0), P(1), P(2), P(3), N0, Backend::AdamHyper{}); }
OpCase make_sgd(SZ) {
  Builder k(s);
  k.inout(gauss(V0, seed, 1, 0.05f));
  k.in(gauss(V0, seed, 2, 0.01f));
  k.inout(gauss(V0, seed, 3, 0.01f));
  return k.c;
}
void run_sgd(RUN) { UNUSED_HOST; be.sgd(P(0), P(1), P(2), N0, 0.9f, 1e-4f); }

// ---- reductions and statistics (host results) ----
OpCase make_two_in(SZ) { Builder k(s); k.in(gauss(V0, seed, 1, 1.0f, 0.1f)); k.in(gauss(V0, seed, 2, 2.0f)); return k.c; }
void run_reduce(RUN) {
  const Reduction r[2] = {{Reduction::dot, P(0), P(1), B0}, {Reduction::diff_sq, P(0), P(1), B0}};
  double out[2];
  be.reduce(r, 2, out);
  host.insert(host.end(), out, out + 2);
}
void run_reduce_deferred(RUN) {
  const Reduction r[2] = {{Reduction::dot, P(0), P(1), B0}, {Reduction::diff_sq, P(0), P(1), B0}};
  be.reduce_deferred(r, 2);
  be.defer_scalar(P(0) + B0 - 1);
  const std::vector<double> out = be.take_deferred();
  host.insert(host.end(), out.begin(), out.end());
}
OpCase make_one_in(SZ) { Builder k(s); k.in(gauss(V0, seed, 1, 1.0f, 0.1f)); return k.c; }
void run_read_scalar(RUN) { host.push_back(be.read_scalar(P(0) + B0 - 1)); }
void run_moments(RUN) {
  double m[4];
  be.moments(P(0), N0, m);
  host.insert(host.end(), m, m + 4);
}
OpCase make_moments_batch(SZ) { Builder k(s); k.in(gauss(V0 * V1, seed, 1, 0.2f, 1.0f)); return k.c; }
void run_moments_batch(RUN) {
  std::vector<const float*> x;
  std::vector<size_t> n;
  for (int64_t i = 0; i < B0; ++i) {
    x.push_back(P(0) + i * B1);
    n.push_back(static_cast<size_t>(B1 - i));  // different lengths
  }
  std::vector<double> out(4 * x.size());
  be.moments_batch(x.data(), n.data(), x.size(), out.data());
  host.insert(host.end(), out.begin(), out.end());
}
void push_gap(const Backend::QuantGap& g, std::vector<double>& host) {
  for (double v : {g.sum_rel, g.max_rel, static_cast<double>(g.above), static_cast<double>(g.n),
                   static_cast<double>(g.nonfinite)})
    host.push_back(v);
}
OpCase make_quant_gap(SZ) { Builder k(s); k.in(gauss(V0 * V1, seed, 1, 3.0f)); return k.c; }
void run_quant_gap(RUN) {
  push_gap(be.quant_gap(P(0), B0, B1, Axis::contiguous, mx_spec(), true, Rounding::nearest_away), host);
}
OpCase make_quant_gaps(SZ) { Builder k(s); k.in(gauss(V0 * V1 * V2, seed, 1, 3.0f)); return k.c; }
void run_quant_gaps(RUN) {
  std::vector<Backend::QuantGapRequest> reqs;
  for (int64_t i = 0; i < B0; ++i)
    reqs.emplace_back(P(0) + i * B1 * B2, B1, B2, i % 2 ? Axis::strided : Axis::contiguous, mx_spec(), true,
                      Rounding::nearest_away);
  std::vector<Backend::QuantGap> out(reqs.size());
  be.quant_gaps(reqs.data(), reqs.size(), out.data());
  for (const auto& g : out) push_gap(g, host);
}

// ---- curvature tangents ----
OpCase make_act_jvp(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 2.0f));
  k.in(gauss(V0 * V1, seed, 2));
  k.out(V0 * V1);
  return k.c;
}
void run_act_jvp(RUN) { UNUSED_HOST; be.act_jvp(Act::gelu, P(0), P(1), P(2), B0, B1); }
OpCase make_act_bwd_tangent(SZ) {
  Builder k(s);
  for (uint32_t t = 1; t <= 4; ++t) k.in(gauss(V0 * V1, seed, t, t == 1 ? 2.0f : 1.0f));  // h, rh, da, rda
  k.out(V0 * V1);
  return k.c;
}
void run_act_bwd_tangent(RUN) { UNUSED_HOST; be.act_bwd_tangent(Act::gelu, P(0), P(1), P(2), P(3), P(4), B0, B1); }
OpCase make_ln_affine_tangent(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1));  // rxhat
  k.in(gauss(V0 * V1, seed, 2));  // xhat
  for (uint32_t t = 3; t <= 5; ++t) k.in(gauss(V1, seed, t, 0.2f, t == 3 ? 1.0f : 0.0f));  // gamma, vgamma, vbeta
  k.out(V0 * V1);
  return k.c;
}
void run_ln_affine_tangent(RUN) { UNUSED_HOST; be.ln_affine_tangent(P(0), P(1), P(2), P(3), P(4), P(5), B0, B1); }
OpCase make_layernorm_bwd_tangent(SZ) {
  Builder k(s);
  for (uint32_t t = 1; t <= 5; ++t) k.in(gauss(V0 * V1, seed, t));  // dy, rdy, xhat, rxhat, rx
  k.in(uniform(V0, seed, 6, 0.5f, 2.0f));                           // rstd
  k.in(gauss(V1, seed, 7, 0.2f, 1.0f));                             // gamma
  k.in(gauss(V1, seed, 8));                                         // vgamma
  k.out(V0 * V1);
  return k.c;
}
void run_layernorm_bwd_tangent(RUN) {
  UNUSED_HOST;
  be.layernorm_bwd_tangent(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), B0, B1);
}

// ---- attention ----
OpCase make_softmax_fwd(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 3.0f));
  k.out(V0 * V1);
  k.out(V0);
  return k.c;
}
void run_softmax_fwd(RUN) { UNUSED_HOST; be.softmax_fwd(P(0), P(1), P(2), B0, B1, 0.125f, kFp32); }
OpCase make_softmax_bwd(SZ) {
  Builder k(s);
  k.in(uniform(V0 * V1, seed, 1, 0.0f, 2.0f / static_cast<float>(V1)));  // probs
  k.in(gauss(V0 * V1, seed, 2, 0.1f));                                   // dprobs
  k.out(V0 * V1);
  return k.c;
}
void run_softmax_bwd(RUN) { UNUSED_HOST; be.softmax_bwd(P(0), P(1), P(2), B0, B1, 0.125f, kFp32); }
// nb sequences of S tokens, h heads of dh in the K columns of a [nb*S x 3 h dh] qkv tensor.
OpCase make_heads_split(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1 * 3 * V2 * V3, seed, 1));
  k.out(V0 * V2 * V1 * V3);
  return k.c;
}
void run_heads_split(RUN) { UNUSED_HOST; be.heads_split(P(0), P(1), B0, B1, B2, B3, 3 * B2 * B3, B2 * B3); }
OpCase make_heads_merge(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V2 * V1 * V3, seed, 1));
  k.inout(gauss(V0 * V1 * 3 * V2 * V3, seed, 2));  // the other columns stay as they are
  return k.c;
}
void run_heads_merge(RUN) { UNUSED_HOST; be.heads_merge(P(0), P(1), B0, B1, B2, B3, 3 * B2 * B3, B2 * B3); }

// ---- token networks: rows, d (or vocab) ----
std::vector<float> token_ids(int64_t n, int64_t vocab, uint64_t seed, uint32_t tag) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        static_cast<float>(philox(seed, Stream::validation, tag, static_cast<uint64_t>(i)).v[0] % vocab);
  return v;
}
constexpr int64_t kOpVocab = 50;  // the vocabulary of the embedding cases
OpCase make_token_batch(SZ) {
  (void)seed;
  Builder k(s);
  k.out(V0 * V1);  // ids
  k.out(V0 * V1);  // targets
  return k.c;
}
void run_token_batch(RUN) { UNUSED_HOST; be.token_batch(P(0), P(1), B0, B1, kOpVocab, 17, Stream::data); }
OpCase make_embed_fwd(SZ) {
  Builder k(s);
  k.in(token_ids(V0, kOpVocab, seed, 1));
  k.in(gauss(kOpVocab * V1, seed, 2));
  k.out(V0 * V1);
  return k.c;
}
void run_embed_fwd(RUN) { UNUSED_HOST; be.embed_fwd(P(0), P(1), P(2), B0, B1, kOpVocab, kBf16Away); }
OpCase make_embed_bwd(SZ) {
  Builder k(s);
  k.in(token_ids(V0, kOpVocab, seed, 1));
  k.in(gauss(V0 * V1, seed, 2));
  k.out(kOpVocab * V1);
  return k.c;
}
void run_embed_bwd(RUN) { UNUSED_HOST; be.embed_bwd(P(0), P(1), P(2), B0, B1, kOpVocab); }
OpCase make_loss_xent(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1, seed, 1, 2.0f));
  k.in(token_ids(V0, V1, seed, 2));
  k.out(V0 * V1);
  k.out(1);
  return k.c;
}
void run_loss_xent(RUN) { UNUSED_HOST; be.loss_xent(P(0), P(1), P(2), P(3), nullptr, B0, B1, kFp32); }

// The mask and the softmax after it (as the model runs them): every output finite, P = 0 above
// the diagonal.
OpCase make_mask_causal(SZ) {
  Builder k(s);
  k.in(gauss(V0 * V1 * V1, seed, 1, 3.0f));
  k.out(V0 * V1 * V1);  // P
  k.out(V0 * V1);       // row maxima
  return k.c;
}
void run_mask_causal(RUN) {
  UNUSED_HOST;
  be.copy(P(1), P(0), static_cast<size_t>(B0 * B1 * B1));
  be.mask_causal(P(1), B0, B1);
  be.softmax_fwd(P(1), P(1), P(2), B0 * B1, B1, 0.125f, kFp32);
}

// ---- flash attention in bf16: items (sequence, head) pairs of S tokens, head dim dh; tiles of
// 16 keys, causal, stabilized softmax (every branch of lab/model/flash_attention.h at once) ----
Backend::FlashSpec flash_case_spec() {
  Backend::FlashSpec f;
  f.br = 16;
  f.bc = 16;
  f.causal = true;
  f.stabilized = true;
  return f;
}
OpCase make_flash_attn_fwd(SZ) {
  Builder k(s);
  for (uint32_t t = 1; t <= 3; ++t) k.in(gauss(V0 * V1 * V2, seed, t));  // q, k, v
  k.out(V0 * V1 * V2);                                                    // o
  k.out(V0 * V1 * V2);                                                    // o_hp
  k.out(V0 * V1);                                                         // lse
  k.out(V0 * V1);                                                         // rowmax
  k.out(V0 * V1 * Backend::kFlashRowStats);                               // row_stats
  return k.c;
}
void run_flash_attn_fwd(RUN) {
  UNUSED_HOST;
  be.flash_attn_fwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), B0, B1, B2, 0.125f, flash_case_spec());
}
OpCase make_flash_attn_bwd(SZ) {
  Builder k(s);
  for (uint32_t t = 1; t <= 4; ++t) k.in(gauss(V0 * V1 * V2, seed, t));  // q, k, v, dout
  // The forward's o, o_hp, lse, rowmax, row_stats (prep_flash_attn_bwd writes them).
  for (int64_t n : {V0 * V1 * V2, V0 * V1 * V2, V0 * V1, V0 * V1, V0 * V1 * Backend::kFlashRowStats})
    k.in(std::vector<float>(static_cast<size_t>(n), 0.0f));
  for (int i = 0; i < 3; ++i) k.out(V0 * V1 * V2);  // dq, dk, dv
  k.out(V0 * V1);                                   // delta
  k.out(V0 * V1);                                   // delta_hp
  return k.c;
}
void prep_flash_attn_bwd(Backend& be, const OpBufs& b) {
  be.flash_attn_fwd(P(0), P(1), P(2), P(4), P(5), P(6), P(7), P(8), B0, B1, B2, 0.125f, flash_case_spec());
}
void run_flash_attn_bwd(RUN) {
  UNUSED_HOST;
  be.flash_attn_bwd(P(0), P(1), P(2), P(4), P(5), P(3), P(6), P(9), P(10), P(11), P(12), P(13), B0, B1, B2, 0.125f,
                    flash_case_spec());
}

#undef SZ
#undef RUN
#undef V0
#undef V1
#undef V2
#undef V3
#undef B0
#undef B1
#undef B2
#undef B3
#undef P
#undef UNUSED_HOST
#undef N0

OpSize sz(int64_t a, int64_t b = 0, int64_t c = 0, int64_t d = 0) { return OpSize{{a, b, c, d}}; }

std::vector<OpDesc> build_table() {
  // Test sizes: odd, larger than a warp, MX rows a few blocks long; cheap on the CPU.
  const OpSize n_test = sz(10007), rc_test = sz(67, 200), mx_test = sz(67, 160);
  const OpSize act_bench = sz(kB, kH), ln_bench = sz(kB, kD);
  const OpSize attn_heads = sz(kSeqs, kSeq, kHeads, kHeadDim);
  return {
      // name, also, dims, test, bench, rule, make, prepare, run, collect
      {"copy", "", "n", n_test, sz(kB * kD), kExactCopy, make_copy, nullptr, run_copy, nullptr},
      {"fill", "", "n", n_test, sz(kP), kExactCopy, make_fill, nullptr, run_fill, nullptr},
      {"begin_capture", "replay end_capture", "n", n_test, sz(kB * kD), kExactElem, make_capture, nullptr,
       run_capture, nullptr},
      {"randn", "", "n", n_test, sz(kB * kD), kExactRng, make_randn, nullptr, run_randn, nullptr},
      {"add_randn", "", "n", n_test, sz(kB * kD), kExactRng, make_add_randn, nullptr, run_add_randn, nullptr},
      {"quantize", "reset_stats read_stats", "rows,cols", mx_test, ln_bench, kExactQuant, make_quantize, prep_stats,
       run_quantize, collect_stats},
      {"round_bf16", "", "n", n_test, sz(kB * kH), kExactElem, make_round_bf16, nullptr, run_round_bf16, nullptr},
      {"gemm", "", "M,N,K", sz(67, 45, 96), sz(kB, kH, kD), kGemm, make_gemm, nullptr, run_gemm, nullptr},
      {"prequantize", "gemm", "M,N,K", sz(67, 45, 96), sz(kB, kH, kD), kGemm, make_gemm, nullptr, run_prequantize,
       nullptr},
      {"layernorm_fwd", "", "rows,d", rc_test, ln_bench, kRowStats, make_layernorm_fwd, nullptr, run_layernorm_fwd,
       nullptr},
      {"layernorm_bwd", "", "rows,d", rc_test, ln_bench, kRowStats, make_layernorm_bwd, nullptr, run_layernorm_bwd,
       nullptr},
      {"act_fwd", "", "rows,cols", rc_test, act_bench, kExactElem, make_act_fwd, nullptr, run_act_fwd, nullptr},
      {"act_bwd", "", "rows,cols", rc_test, act_bench, kExactElem, make_act_bwd, nullptr, run_act_bwd, nullptr},
      {"residual_add", "", "rows,d", rc_test, ln_bench, kExactElem, make_residual_add, nullptr, run_residual_add,
       nullptr},
      {"col_sum", "", "rows,d", rc_test, ln_bench, kDoubleSum, make_col_sum, nullptr, run_col_sum, nullptr},
      {"add", "", "n", n_test, sz(kB * kD), kExactElem, make_two_in_one_out, nullptr, run_add, nullptr},
      {"loss_mse", "", "rows,d", rc_test, ln_bench, kDoubleSum, make_loss, nullptr, run_loss_mse, nullptr},
      {"loss_kl", "", "rows,d", rc_test, ln_bench, kRowStats, make_loss, nullptr, run_loss_kl, nullptr},
      {"adam", "", "n", n_test, sz(kP), kExactElem, make_adam, nullptr, run_adam, nullptr},
      {"sgd", "", "n", n_test, sz(kP), kExactElem, make_sgd, nullptr, run_sgd, nullptr},
      {"reduce", "", "n", n_test, sz(kP), kHostSums, make_two_in, nullptr, run_reduce, nullptr},
      {"read_scalar", "", "n", sz(33), sz(1), kExactCopy, make_one_in, nullptr, run_read_scalar, nullptr},
      {"reduce_deferred", "defer_scalar take_deferred", "n", n_test, sz(kP), kHostSums, make_two_in, nullptr,
       run_reduce_deferred, nullptr},
      {"moments", "", "n", n_test, sz(kD), kHostSums, make_one_in, nullptr, run_moments, nullptr},
      {"moments_batch", "", "count,n", sz(5, 1001), sz(4, kD), kHostSums, make_moments_batch, nullptr,
       run_moments_batch, nullptr},
      {"act_jvp", "", "rows,cols", rc_test, act_bench, kExactElem, make_act_jvp, nullptr, run_act_jvp, nullptr},
      {"act_bwd_tangent", "", "rows,cols", rc_test, act_bench, kExactElem, make_act_bwd_tangent, nullptr,
       run_act_bwd_tangent, nullptr},
      {"ln_affine_tangent", "", "rows,d", rc_test, ln_bench, kExactElem, make_ln_affine_tangent, nullptr,
       run_ln_affine_tangent, nullptr},
      {"layernorm_bwd_tangent", "", "rows,d", rc_test, ln_bench, kRowTangent, make_layernorm_bwd_tangent, nullptr,
       run_layernorm_bwd_tangent, nullptr},
      {"col_dot", "", "rows,d", rc_test, ln_bench, kDoubleSum, make_col_dot, nullptr, run_col_dot, nullptr},
      {"axpby", "", "n", n_test, sz(kP), kExactElem, make_axpby, nullptr, run_axpby, nullptr},
      {"mul", "", "n", n_test, sz(kP), kExactElem, make_two_in_one_out, nullptr, run_mul, nullptr},
      {"precond_isqrt", "", "n", n_test, sz(kP), kExactElem, make_precond_isqrt, nullptr, run_precond_isqrt, nullptr},
      {"loss_kl_tangent", "", "rows,d", rc_test, ln_bench, kRowTangent, make_loss_kl_tangent, nullptr,
       run_loss_kl_tangent, nullptr},
      {"quant_gap", "", "rows,cols", mx_test, ln_bench, kExactOrdered, make_quant_gap, nullptr, run_quant_gap,
       nullptr},
      {"quant_gaps", "", "count,rows,cols", sz(3, 67, 96), sz(8, kH, kD), kExactOrdered, make_quant_gaps, nullptr,
       run_quant_gaps, nullptr},
      {"gemm_batched", "", "batch,M,N,K", sz(5, 33, 19, 64), sz(kSeqs * kHeads, kSeq, kSeq, kHeadDim), kGemm,
       make_gemm_batched, nullptr, run_gemm_batched, nullptr},
      {"rmsnorm_fwd", "", "rows,d", rc_test, ln_bench, kRowStats, make_rmsnorm_fwd, nullptr, run_rmsnorm_fwd, nullptr},
      {"rmsnorm_bwd", "", "rows,d", rc_test, ln_bench, kRowStats, make_rmsnorm_bwd, nullptr, run_rmsnorm_bwd, nullptr},
      {"scale_cols", "", "rows,cols", rc_test, ln_bench, kExactElem, make_scale_cols, nullptr, run_scale_cols, nullptr},
      {"softmax_fwd", "", "rows,n", sz(67, 37), sz(kSeqs * kHeads * kSeq, kSeq), kRowStats, make_softmax_fwd, nullptr,
       run_softmax_fwd, nullptr},
      {"softmax_bwd", "", "rows,n", sz(67, 37), sz(kSeqs * kHeads * kSeq, kSeq), kRowStats, make_softmax_bwd, nullptr,
       run_softmax_bwd, nullptr},
      {"heads_split", "", "nb,S,h,dh", sz(5, 13, 3, 24), attn_heads, kExactCopy, make_heads_split, nullptr,
       run_heads_split, nullptr},
      {"heads_merge", "", "nb,S,h,dh", sz(5, 13, 3, 24), attn_heads, kExactCopy, make_heads_merge, nullptr,
       run_heads_merge, nullptr},
      {"layernorm_vec_fwd", "", "rows,d", rc_test, ln_bench, kExactOrdered, make_layernorm_vec_fwd, nullptr,
       run_layernorm_vec_fwd, nullptr},
      {"layernorm_vec_bwd", "", "rows,d", rc_test, ln_bench, kExactOrdered, make_layernorm_vec_bwd, nullptr,
       run_layernorm_vec_bwd, nullptr},
      {"residual_add_r", "", "rows,d", rc_test, ln_bench, kExactElem, make_residual_add, nullptr, run_residual_add_r,
       nullptr},
      {"token_batch", "", "sequences,S", sz(5, 37), sz(kSeqs, kSeq), kExactRng, make_token_batch, nullptr,
       run_token_batch, nullptr},
      {"embed_fwd", "", "rows,d", rc_test, ln_bench, kExactElem, make_embed_fwd, nullptr, run_embed_fwd, nullptr},
      {"embed_bwd", "", "rows,d", rc_test, ln_bench, kExactOrdered, make_embed_bwd, nullptr, run_embed_bwd, nullptr},
      {"loss_xent", "", "rows,vocab", rc_test, sz(kB, 512), kExactOrdered, make_loss_xent, nullptr, run_loss_xent,
       nullptr},
      {"mask_causal", "copy softmax_fwd", "items,S", sz(5, 37), sz(kSeqs * kHeads, kSeq), kRowStats, make_mask_causal,
       nullptr,
       run_mask_causal, nullptr},
      {"flash_attn_fwd", "", "items,S,dh", sz(5, 37, 24), sz(kSeqs * kHeads, kSeq, kHeadDim), kExactOrdered,
       make_flash_attn_fwd, nullptr, run_flash_attn_fwd, nullptr},
      {"flash_attn_bwd", "", "items,S,dh", sz(5, 37, 24), sz(kSeqs * kHeads, kSeq, kHeadDim), kExactOrdered,
       make_flash_attn_bwd, prep_flash_attn_bwd, run_flash_attn_bwd, nullptr},
  };
}

}  // namespace

const std::vector<OpDesc>& op_table() {
  static const std::vector<OpDesc> table = build_table();
  return table;
}

// Kept short: every entry is plumbing with no numerics of its own.
const std::vector<OpExemption>& op_exemptions() {
  static const std::vector<OpExemption> list = {
      {"name", "identity string recorded in run files, no numerics"},
      {"math_mode", "identity string recorded in run files, no numerics"},
      {"describe", "identity strings (device facts) recorded in run files, no numerics"},
      {"alloc", "memory plumbing: every case is allocated through it (op_place)"},
      {"upload", "memory plumbing: every case's tensors are uploaded through it (op_place)"},
      {"download", "memory plumbing: every case's outputs are read back through it (op_run)"},
      {"set_step", "sets the StepScalars every case runs under (op_place: op_step())"},
      {"set_lane", "stream scheduling, no numerics (the CPU runs in order); the model parity tests use lanes"},
      {"lanes", "stream scheduling: how many lanes exist"},
      {"join", "stream scheduling: lane 0 waits for the others"},
      {"synchronize", "waits for the device, no numerics"},
  };
  return list;
}

const std::vector<OpExemption>& op_cuda_pending() {
  static const std::vector<OpExemption> list = {};  // none: the CUDA backend has every op of the table
  return list;
}

const OpExemption* find_cuda_pending(const std::string& name) {
  for (const OpExemption& e : op_cuda_pending())
    if (name == e.name) return &e;
  return nullptr;
}

const OpDesc* find_op(const std::string& name) {
  for (const OpDesc& d : op_table())
    if (name == d.name) return &d;
  return nullptr;
}

std::string op_size_text(const OpDesc& d, const OpSize& s) {
  std::string out, dims = d.dims;
  size_t start = 0;
  for (int i = 0; i < 4 && start <= dims.size(); ++i) {
    const size_t comma = dims.find(',', start);
    const std::string n = dims.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (n.empty()) break;
    out += msg(out.empty() ? "" : " ", n, "=", s.v[i]);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Step 3 of Adam(0.9, 0.999): bias corrections 1 - beta^(t+1).
StepScalars op_step() {
  return StepScalars{3, 1e-3f, 1.0f - 0.9f * 0.9f * 0.9f * 0.9f, 1.0f - 0.999f * 0.999f * 0.999f * 0.999f};
}

OpBufs op_place(Backend& be, const OpDesc& d, const OpCase& c) {
  OpBufs b;
  b.size = c.size;
  be.set_step(op_step());
  for (const std::vector<float>& t : c.tensors) {
    float* p = be.alloc(std::max<size_t>(t.size(), 1));
    if (!t.empty()) be.upload(p, t.data(), t.size());
    b.p.push_back(p);
  }
  if (d.prepare) d.prepare(be, b);
  return b;
}

OpResult op_run(Backend& be, const OpDesc& d, const OpCase& c, const OpBufs& b) {
  OpResult r;
  d.run(be, b, r.host);
  if (d.collect) d.collect(be, b, r.host);
  for (int i : c.outputs) {
    const std::vector<float>& t = c.tensors[static_cast<size_t>(i)];
    std::vector<float> v(t.size());
    be.download(v.data(), b.p[static_cast<size_t>(i)], v.size());
    r.outputs.push_back(std::move(v));
  }
  return r;
}

namespace {

uint64_t bits_of(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Compares one output (floats widened to double exactly); appends what differs to `report`.
template <class T>
void compare_one(const OpRule& rule, const std::vector<T>& ref, const std::vector<T>& got, const std::string& what,
                 std::string& report) {
  if (ref.size() != got.size()) {
    report += msg("\n  ", what, ": size ", got.size(), " vs ", ref.size());
    return;
  }
  double rms = 0.0;
  if (rule.match == OpMatch::close) {
    size_t n = 0;
    for (const T& x : ref)
      if (std::isfinite(x)) rms += static_cast<double>(x) * static_cast<double>(x), ++n;
    rms = n ? std::sqrt(rms / static_cast<double>(n)) : 0.0;
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = static_cast<double>(ref[i]), g = static_cast<double>(got[i]);
    bool ok;
    if (std::isnan(r) || std::isnan(g)) ok = std::isnan(r) && std::isnan(g);
    else if (rule.match == OpMatch::exact) ok = bits_of(r) == bits_of(g);
    else if (!std::isfinite(r) || !std::isfinite(g)) ok = r == g;
    else ok = std::fabs(g - r) <= rule.rel * std::max(std::fabs(r), rms);
    if (!ok && bad++ < 5) {
      char line[160];
      std::snprintf(line, sizeof line, "\n    [%zu] ref %.9g got %.9g", i, r, g);
      first += line;
    }
  }
  if (bad) report += msg("\n  ", what, ": ", bad, " of ", ref.size(), " differ", first);
}

}  // namespace

std::string op_compare(const OpRule& rule, const OpResult& ref, const OpResult& got) {
  std::string report;
  if (ref.outputs.size() != got.outputs.size())
    return msg("outputs: ", got.outputs.size(), " vs ", ref.outputs.size());
  for (size_t i = 0; i < ref.outputs.size(); ++i)
    compare_one(rule, ref.outputs[i], got.outputs[i], msg("output ", i), report);
  compare_one(rule, ref.host, got.host, "host results", report);
  if (report.empty()) return report;
  if (rule.match == OpMatch::exact) return "not bit-exact:" + report;
  return msg("beyond rel ", rule.rel, " of max(|ref|, rms):", report);
}

}  // namespace mxlab
