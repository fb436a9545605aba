// The model (lab/model/mlp.cpp) on the CPU backend: shapes and init; FP32 forward and
// gradients against an independent double-precision model and its finite differences; the MX
// path bit for bit against an explicit composition of quantize_dequantize + naive loops +
// round_bf16 (which proves each GEMM quantizes along its own reduction axis); backward: false;
// layernorm-affine quantization and the statistics slots.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lab/config/config.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/elementwise.h"
#include "lab/model/mlp.h"
#include "lab/mx/quantize.h"

using namespace mxlab;

namespace {

std::vector<float> noise(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * randn_elem(seed, Stream::validation, 0, i);
  return v;
}
float* put(Backend& be, const std::vector<float>& v) {
  float* p = be.alloc(v.size());
  be.upload(p, v.data(), v.size());
  return p;
}
std::vector<float> get(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.download(v.data(), p, n);
  return v;
}

// Everything FP32 (what PrecisionConfig::fp32() resolves to for the passes).
PrecisionConfig fp32_policy() {
  PrecisionConfig p;
  p.weight = p.activation = p.grad = NumFmt::fp32;
  p.ln_affine = NumFmt::fp32;
  p.elementwise_bf16 = false;
  return p;
}

ModelConfig small_model(int depth, int d, Act act, bool ln = true, bool affine = true, bool bias = true) {
  ModelConfig m;
  m.depth = depth;
  m.width = d;
  m.activation = act;
  m.layernorm = ln;
  m.ln_affine = affine;
  m.fc2_bias = bias;
  return m;
}

// Initial parameters with LN gains, LN biases and b2 moved off 1 / 0, so that every path of the
// gradient carries a distinct, non-trivial value.
std::vector<float> test_params(const NetShape& s, uint64_t seed) {
  std::vector<float> p = init_params(s, InitKind::pytorch, 1.0f, seed, Stream::init);
  for (const ParamGroup& g : s.groups) {
    const auto n = noise(static_cast<size_t>(g.size()), seed * 131 + g.offset);
    for (int64_t i = 0; i < g.size(); ++i) {
      if (g.kind == ParamGroup::gamma) p[g.offset + i] = 1.0f + 0.2f * n[i];
      if (g.kind == ParamGroup::beta || g.kind == ParamGroup::b2) p[g.offset + i] = 0.1f * n[i];
    }
  }
  return p;
}

struct PassResult {
  float loss = 0;
  std::vector<float> out, grads;
};

// forward + loss_and_grad + backward on `be`.
PassResult run_pass(Backend& be, const NetShape& s, const RunConfig& cfg, const std::vector<float>& params,
                    const std::vector<float>& x, const std::vector<float>& t, int64_t B, const PassPolicy& pol) {
  float* P = put(be, params);
  float* X = put(be, x);
  float* T = put(be, t);
  float* G = be.alloc(params.size());
  Workspace ws = Workspace::make(be, s, B);
  forward(be, s, P, X, ws, pol);
  PassResult r;
  r.out = get(be, ws.out, static_cast<size_t>(B * s.d));
  loss_and_grad(be, cfg.loss_spec(), T, ws, pol, nullptr);
  r.loss = be.read_scalar(ws.loss);
  backward(be, s, P, X, ws, G, pol);
  r.grads = get(be, G, params.size());
  return r;
}

// ---- the double-precision FP32 model (plain loops, independent of the backend) ----------

constexpr double kPi = 3.14159265358979323846;

double act_d(Act a, double x) {
  switch (a) {
    case Act::relu: return x > 0 ? x : 0;
    case Act::gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Act::gelu_tanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
    default: return x;
  }
}
double silu_d(double x) { return x / (1 + std::exp(-x)); }

std::vector<double> forward_d(const NetShape& s, const std::vector<double>& P, const std::vector<double>& x,
                              int64_t B) {
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in;
  std::vector<double> A = x, y(B * d), h(B * H1), a(B * H), o(B * d);
  for (int k = 0; k < s.depth; ++k) {
    const double* W1 = P.data() + s.find(k, ParamGroup::w1)->offset;
    const double* W2 = P.data() + s.find(k, ParamGroup::w2)->offset;
    for (int64_t i = 0; i < B; ++i) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < d; ++j) mean += A[i * d + j] / d;
      for (int64_t j = 0; j < d; ++j) var += (A[i * d + j] - mean) * (A[i * d + j] - mean) / d;
      for (int64_t j = 0; j < d; ++j) {
        double v = A[i * d + j];
        if (s.layernorm) {
          v = (v - mean) / std::sqrt(var + s.ln_eps);
          if (s.ln_affine)
            v = v * P[s.find(k, ParamGroup::gamma)->offset + j] + P[s.find(k, ParamGroup::beta)->offset + j];
        }
        y[i * d + j] = v;
      }
    }
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H1; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += y[i * d + c] * W1[j * d + c];
        h[i * H1 + j] = acc;
      }
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H; ++j)
        a[i * H + j] = s.act == Act::swiglu ? h[i * H1 + j] * silu_d(h[i * H1 + H + j]) : act_d(s.act, h[i * H1 + j]);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < H; ++j) acc += a[i * H + j] * W2[c * H + j];
        o[i * d + c] = acc;
      }
    const ParamGroup* b2 = s.find(k, ParamGroup::b2);
    for (int64_t i = 0; i < B * d; ++i)
      A[i] = s.residual ? A[i] + o[i] + (b2 ? P[b2->offset + i % d] : 0.0) : o[i];
  }
  return A;
}

double loss_d(const std::vector<double>& out, const std::vector<double>& t, int64_t B, int64_t d, LossKind kind,
              double T) {
  double total = 0;
  if (kind == LossKind::mse) {
    for (size_t i = 0; i < out.size(); ++i) total += (out[i] - t[i]) * (out[i] - t[i]);
    return total / static_cast<double>(out.size());
  }
  for (int64_t i = 0; i < B; ++i) {
    auto logsoftmax = [&](const std::vector<double>& z) {
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < d; ++j) m = std::max(m, z[i * d + j] / T);
      for (int64_t j = 0; j < d; ++j) s += std::exp(z[i * d + j] / T - m);
      std::vector<double> l(d);
      for (int64_t j = 0; j < d; ++j) l[j] = z[i * d + j] / T - m - std::log(s);
      return l;
    };
    const auto lp = logsoftmax(t), lq = logsoftmax(out);
    for (int64_t j = 0; j < d; ++j) total += std::exp(lp[j]) * (lp[j] - lq[j]);
  }
  return total / B;
}

double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

struct GradCase {
  std::string label;
  NetShape s;
  LossKind loss = LossKind::mse;
};

// Forward against the double model, analytic gradients against its central differences.
void gradient_check(const GradCase& c) {
  SCOPED_TRACE(c.label);
  const NetShape& s = c.s;
  const int64_t B = 5, d = s.d;
  RunConfig cfg;
  cfg.model.width = s.d;
  cfg.loss = c.loss;
  cfg.kl_temperature = 1.5f;
  const auto params = test_params(s, 3);
  const auto x = noise(B * d, 4), t = noise(B * d, 5);
  auto be = make_cpu_backend();
  PassPolicy pol;
  pol.p = fp32_policy();
  const PassResult r = run_pass(*be, s, cfg, params, x, t, B, pol);

  const std::vector<double> P(params.begin(), params.end()), X(x.begin(), x.end()), Tt(t.begin(), t.end());
  const auto out = forward_d(s, P, X, B);
  // FP32 vs double through two blocks of length <= 32 dot products: errors ~1e-6 relative.
  EXPECT_LT(rel_err(std::vector<double>(r.out.begin(), r.out.end()), out), 1e-5);
  const double L0 = loss_d(out, Tt, B, d, c.loss, cfg.kl_temperature);
  EXPECT_NEAR(r.loss, L0, 1e-5 * std::fabs(L0));

  // Central differences of the double model: truncation O(h^2) and cancellation O(eps/h)
  // are both ~1e-10 relative at h = 1e-5, far below the 1e-3 the FP32 gradients must meet.
  const double h = 1e-5;
  for (const ParamGroup& g : s.groups) {
    std::vector<double> fd(g.size()), an(g.size());
    for (int64_t i = 0; i < g.size(); ++i) {
      std::vector<double> Pp = P, Pm = P;
      Pp[g.offset + i] += h;
      Pm[g.offset + i] -= h;
      fd[i] = (loss_d(forward_d(s, Pp, X, B), Tt, B, d, c.loss, cfg.kl_temperature) -
               loss_d(forward_d(s, Pm, X, B), Tt, B, d, c.loss, cfg.kl_temperature)) / (2 * h);
      an[i] = r.grads[g.offset + i];
      ASSERT_TRUE(std::isfinite(an[i])) << g.name << "[" << i << "]";
    }
    double norm = 0;
    for (double v : fd) norm += v * v;
    ASSERT_GT(norm, 0.0) << g.name << ": zero finite-difference gradient (test would be vacuous)";
    EXPECT_LT(rel_err(an, fd), 1e-3) << g.name;
  }
}

}  // namespace

// ---- shapes and init ----------------------------------------------------------------------

TEST(Model, StudentLayoutAndSwigluWidth) {
  const NetShape s = NetShape::student(small_model(2, 8, Act::gelu));
  ASSERT_EQ(s.groups.size(), 10u);
  const char* names[] = {"layer0.gamma", "layer0.beta", "layer0.W1", "layer0.W2", "layer0.b2",
                         "layer1.gamma", "layer1.beta", "layer1.W1", "layer1.W2", "layer1.b2"};
  int64_t off = 0;
  for (size_t i = 0; i < s.groups.size(); ++i) {
    EXPECT_EQ(s.groups[i].name, names[i]);
    EXPECT_EQ(s.groups[i].offset, off);
    off += s.groups[i].size();
  }
  EXPECT_EQ(s.num_params, off);
  EXPECT_EQ(s.find(1, ParamGroup::w1)->rows, 32);
  EXPECT_EQ(s.find(1, ParamGroup::w2)->cols, 32);
  EXPECT_EQ(s.num_params, 2 * (8 + 8 + 32 * 8 + 8 * 32 + 8));
  // swiglu: H = round(8d/3) = 1365 for d = 512, W1 is [2H x d].
  const NetShape w = NetShape::student(small_model(1, 512, Act::swiglu, true, false, false));
  EXPECT_EQ(w.hidden, 1365);
  EXPECT_EQ(w.hidden_in, 2730);
  EXPECT_EQ(w.groups.size(), 2u);
  EXPECT_EQ(NetShape::student(small_model(1, 32, Act::swiglu)).hidden, 85);  // 85.33
  EXPECT_EQ(NetShape::student(small_model(1, 4, Act::swiglu)).hidden, 11);   // 10.67
}

TEST(Model, TeacherShapes) {
  ModelConfig m = small_model(3, 16, Act::relu);
  TeacherConfig t;
  NetShape plain = NetShape::teacher(m, t);
  EXPECT_EQ(plain.depth, 3);
  EXPECT_FALSE(plain.residual);
  EXPECT_FALSE(plain.layernorm);
  EXPECT_EQ(plain.hidden, 16);
  EXPECT_EQ(plain.groups.size(), 6u);  // W1, W2 per block
  EXPECT_EQ(plain.find(0, ParamGroup::b2), nullptr);
  t.depth = 2;
  t.width = 8;
  t.residual = true;
  t.activation = Act::gelu;
  NetShape res = NetShape::teacher(m, t);
  EXPECT_EQ(res.depth, 2);
  EXPECT_TRUE(res.residual);
  EXPECT_EQ(res.hidden, 32);  // hidden_mult * width
  EXPECT_EQ(res.d, 16);
  EXPECT_EQ(res.act, Act::gelu);
  EXPECT_EQ(res.find(1, ParamGroup::w1)->cols, 16);
}

TEST(Model, InitIsDeterministicAndFollowsTheRecipe) {
  const NetShape s = NetShape::student(small_model(1, 64, Act::gelu));
  const auto a = init_params(s, InitKind::pytorch, 1.0f, 7, Stream::init);
  EXPECT_EQ(a, init_params(s, InitKind::pytorch, 1.0f, 7, Stream::init));
  EXPECT_NE(a, init_params(s, InitKind::pytorch, 1.0f, 8, Stream::init));
  const ParamGroup* w1 = s.find(0, ParamGroup::w1);
  const ParamGroup* b2 = s.find(0, ParamGroup::b2);
  const float bw = 1.0f / 8.0f, bb = 1.0f / 16.0f;  // 1/sqrt(64), 1/sqrt(256)
  double mx = 0;
  for (int64_t i = 0; i < w1->size(); ++i) mx = std::max(mx, double(std::fabs(a[w1->offset + i])));
  EXPECT_LE(mx, bw);
  EXPECT_GT(mx, 0.9 * bw);
  for (int64_t i = 0; i < b2->size(); ++i) EXPECT_LE(std::fabs(a[b2->offset + i]), bb);
  // Element 3 of W1 (group index 2: after gamma and beta).
  const float u = u32_to_uniform(philox(7, Stream::init, 2, 3).v[0]);
  EXPECT_EQ(a[w1->offset + 3], (2.0f * u - 1.0f) * bw);
  EXPECT_EQ(a[s.find(0, ParamGroup::gamma)->offset + 5], 1.0f);
  EXPECT_EQ(a[s.find(0, ParamGroup::beta)->offset + 5], 0.0f);
  // xavier_normal(gain 0.5): std 0.5 sqrt(2 / (256 + 64)) = 0.0395; biases zero.
  const auto x = init_params(s, InitKind::xavier_normal, 0.5f, 7, Stream::init);
  double sq = 0;
  for (int64_t i = 0; i < w1->size(); ++i) sq += double(x[w1->offset + i]) * x[w1->offset + i];
  const double want = 0.5 * std::sqrt(2.0 / 320.0);
  // 16384 samples: the sample std is within 5 * want / sqrt(2n) of the true one.
  EXPECT_NEAR(std::sqrt(sq / w1->size()), want, 5 * want / std::sqrt(2.0 * w1->size()));
  for (int64_t i = 0; i < b2->size(); ++i) EXPECT_EQ(x[b2->offset + i], 0.0f);
}

TEST(Model, BadShapesAreUserErrors) {
  EXPECT_THROW(NetShape::student(small_model(0, 8, Act::gelu)), Error);
  EXPECT_THROW(NetShape::student(small_model(1, 0, Act::gelu)), Error);
  ModelConfig m = small_model(1, 8, Act::gelu);
  m.hidden_mult = 0;
  EXPECT_THROW(NetShape::student(m), Error);
  TeacherConfig t;
  t.width = -1;
  EXPECT_THROW(NetShape::teacher(small_model(1, 8, Act::gelu), t), Error);
  auto be = make_cpu_backend();
  EXPECT_THROW(Workspace::make(*be, NetShape::student(small_model(1, 8, Act::gelu)), 0), Error);
}

// ---- FP32 gradients against finite differences ------------------------------------------

TEST(ModelGradients, EveryActivationWithLayernorm) {
  for (Act a : {Act::relu, Act::gelu, Act::gelu_tanh, Act::swiglu, Act::linear})
    gradient_check({std::string("act ") + std::to_string(int(a)), NetShape::student(small_model(2, 8, a))});
}

TEST(ModelGradients, ArchitectureVariants) {
  gradient_check({"no LN", NetShape::student(small_model(2, 8, Act::gelu, false, false, true))});
  gradient_check({"LN without affine", NetShape::student(small_model(2, 8, Act::gelu, true, false, true))});
  gradient_check({"no fc2 bias", NetShape::student(small_model(2, 8, Act::gelu, true, true, false))});
  gradient_check({"swiglu, bare", NetShape::student(small_model(2, 8, Act::swiglu, false, false, false))});
  TeacherConfig t;
  gradient_check({"plain teacher", NetShape::teacher(small_model(2, 8, Act::gelu), t)});
  t.residual = true;
  t.width = 4;
  gradient_check({"residual teacher", NetShape::teacher(small_model(2, 8, Act::gelu_tanh), t)});
}

TEST(ModelGradients, KlLoss) {
  gradient_check({"kl", NetShape::student(small_model(2, 8, Act::gelu)), LossKind::kl});
  gradient_check({"kl swiglu", NetShape::student(small_model(1, 8, Act::swiglu, true, false, false)), LossKind::kl});
}

// ---- the MX path, bit for bit against an explicit composition ------------------------------

namespace {

// C[i][j] = R(sum_k a(i, k) * b(j, k)), accumulated in float in increasing k.
using Elem2 = std::function<float(int64_t, int64_t)>;
void naive_gemm(int64_t M, int64_t N, int64_t K, const Elem2& a, const Elem2& b, float* C, float beta,
                const ElementwiseRound& r) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = acc + a(i, k) * b(j, k);
      const float v = beta == 0.0f ? acc : beta * C[i * N + j] + acc;
      C[i * N + j] = ew_round(v, r.bf16, r.mode);
    }
}

// The CPU backend with its Eigen product replaced by naive_gemm (operands prepared as
// backend.h specifies). Its only difference from the CPU backend is the FP32 summation order,
// which the reference below shares: the comparison can then be exact. (An end-to-end
// tolerance cannot be derived: one accumulation-order difference can flip a bf16 rounding and
// then an MX rounding downstream. The Eigen GEMM itself is checked against naive loops with
// the gamma_K bound in test_cpu_backend.cpp.)
class NaiveGemmBackend final : public Backend {
 public:
  std::unique_ptr<Backend> in = make_cpu_backend();
  StepScalars step;
  std::string name() const override { return "naive-gemm"; }
  std::string math_mode() const override { return in->math_mode(); }
  float* alloc(size_t n) override { return in->alloc(n); }
  void upload(float* d, const float* s, size_t n) override { in->upload(d, s, n); }
  void download(float* d, const float* s, size_t n) override { in->download(d, s, n); }
  void copy(float* d, const float* s, size_t n) override {
    ++copies;
    wrote(d);
    in->copy(d, s, n);
  }
  void fill(float* d, float v, size_t n) override {
    wrote(d);
    in->fill(d, v, n);
  }
  void set_step(const StepScalars& s) override {
    step = s;
    in->set_step(s);
  }
  void randn(float* o, size_t n, uint64_t s, Stream st, float sc) override { in->randn(o, n, s, st, sc); }
  void add_randn(float* o, size_t n, uint64_t s, Stream st, float sc) override { in->add_randn(o, n, s, st, sc); }
  std::vector<std::pair<int64_t, int64_t>> quantized;  // the shape of every quantize call, in order
  void quantize(const float* i, float* o, int64_t r, int64_t c, Axis ax, const QuantSpec& q, int slot) override {
    quantized.push_back({r, c});
    wrote(o);
    in->quantize(i, o, r, c, ax, q, slot);
  }
  void round_bf16(float* x, size_t n, Rounding m) override {
    wrote(x);
    in->round_bf16(x, n, m);
  }
  int gemm_outputs_rounded = 0;  // gemm calls whose output the GEMM itself rounds
  int copies = 0;
  struct GemmCall {
    int64_t M, N, K;
    GemmOperand a, b;
    const float* C;
  };
  std::vector<GemmCall> gemms;  // every gemm call, in order
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
            const ElementwiseRound& out) override {
    gemms.push_back({M, N, K, a, b, C});
    gemm_outputs_rounded += out.bf16 ? 1 : 0;
    take(a, a.k_contiguous ? M : K, a.k_contiguous ? K : M);
    take(b, b.k_contiguous ? N : K, b.k_contiguous ? K : N);
    wrote(C);
    const auto qa = prepare(a, M, K), qb = prepare(b, N, K);
    auto at = [&](const std::vector<float>& q, bool kc, int64_t rows) {
      return Elem2([&q, kc, rows, K](int64_t r, int64_t k) { return kc ? q[r * K + k] : q[k * rows + r]; });
    };
    naive_gemm(M, N, K, at(qa, a.k_contiguous, M), at(qb, b.k_contiguous, N), C, beta, out);
  }
  void layernorm_fwd(const float* x, const float* g, const float* b, float* y, float* xh, float* rs, int64_t r,
                     int64_t d, float eps, const ElementwiseRound& R, const GemmOperand* q) override {
    wrote(xh);
    produced(y, r, d, q);
    in->layernorm_fwd(x, g, b, y, xh, rs, r, d, eps, R);
  }
  void layernorm_bwd(const float* dy, const float* xh, const float* rs, const float* g, float* dx, float* dg,
                     float* db, int64_t r, int64_t d, const ElementwiseRound& R, const ElementwiseRound& Rdy) override {
    wrote(dx);
    in->layernorm_bwd(dy, xh, rs, g, dx, dg, db, r, d, R, Rdy);
  }
  void act_fwd(Act a, const float* h, float* o, int64_t r, int64_t c, const ElementwiseRound& R,
               const ElementwiseRound& Rh, const GemmOperand* q) override {
    produced(o, r, c, q);
    in->act_fwd(a, h, o, r, c, R, Rh);
  }
  void act_bwd(Act a, const float* h, const float* da, float* dh, int64_t r, int64_t c, const ElementwiseRound& R,
               const ElementwiseRound& Rh, const ElementwiseRound& Rda, const GemmOperand* q) override {
    produced(dh, r, a == Act::swiglu ? 2 * c : c, q);
    in->act_bwd(a, h, da, dh, r, c, R, Rh, Rda);
  }
  void residual_add(float* o, const float* x, const float* y, const float* b, int64_t r, int64_t d,
                    const ElementwiseRound& R, const ElementwiseRound& Ry) override {
    wrote(o);
    in->residual_add(o, x, y, b, r, d, R, Ry);
  }
  void col_sum(const float* x, float* o, int64_t r, int64_t d) override { in->col_sum(x, o, r, d); }
  int prequantize_calls = 0;
  void prequantize(const AheadOperand* ops, size_t n) override {
    ++prequantize_calls;
    for (size_t i = 0; i < n; ++i) produced(ops[i].op.p, ops[i].rows, ops[i].cols, &ops[i].op);
  }
  void add(float* d, const float* a, const float* b, size_t n, const ElementwiseRound& R, const GemmOperand* q,
           int64_t qc) override {
    if (q && (qc <= 0 || static_cast<int64_t>(n) % qc != 0)) breaches.push_back("an add q_out with a bad row length");
    produced(d, q ? static_cast<int64_t>(n) / qc : 0, qc, q);
    in->add(d, a, b, n, R);
  }
  void loss_mse(const float* o, const float* t, float* d, float* l, float* h, int64_t r, int64_t c,
                const ElementwiseRound& R) override {
    in->loss_mse(o, t, d, l, h, r, c, R);
  }
  void loss_kl(const float* o, const float* t, float* d, float* l, float* h, int64_t r, int64_t c, float T,
               const ElementwiseRound& R) override {
    in->loss_kl(o, t, d, l, h, r, c, T, R);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) override {
    in->adam(p, g, m, v, n, h);
  }
  void sgd(float* p, const float* g, float* b, size_t n, float m, float wd) override { in->sgd(p, g, b, n, m, wd); }
  void reduce(const Reduction* r, size_t c, double* o) override { in->reduce(r, c, o); }
  float read_scalar(const float* p) override { return in->read_scalar(p); }
  void moments(const float* x, size_t n, double o[4]) override { in->moments(x, n, o); }
  void reset_stats(int s) override { in->reset_stats(s); }
  std::vector<QuantStats> read_stats() override { return in->read_stats(); }

  // Producer-side quantization (lab/model/backend.h): the operands handed to producers as
  // q_out and still valid (no write to the tensor since), how many gemm operands marked
  // `prequantized` found theirs, and every breach of the contract.
  struct Produced {
    GemmOperand op;
    int64_t rows, cols;
  };
  std::map<const float*, Produced> pending;
  int q_out_given = 0, prequantized_found = 0;
  std::vector<std::string> breaches;

 private:
  void wrote(const float* p) { pending.erase(p); }
  void produced(const float* out, int64_t rows, int64_t cols, const GemmOperand* q) {
    wrote(out);
    if (!q) return;
    ++q_out_given;
    if (q->p != out) breaches.push_back("a q_out whose pointer is not the producer's output");
    pending[out] = Produced{*q, rows, cols};
  }
  void take(const GemmOperand& op, int64_t rows, int64_t cols) {
    if (!op.prequantized) return;
    const auto it = pending.find(op.p);
    if (it == pending.end()) {
      breaches.push_back("a prequantized operand whose tensor no producer handed over (or was written since)");
      return;
    }
    const GemmOperand& q = it->second.op;
    const bool same = q.k_contiguous == op.k_contiguous && q.q.fmt == op.q.fmt && q.q.block == op.q.block &&
                      q.q.rule == op.q.rule && q.q.rounding == op.q.rounding && q.q.bump == op.q.bump &&
                      q.q.seed == op.q.seed && q.round_bf16_first == op.round_bf16_first &&
                      q.bf16_mode == op.bf16_mode && q.stats_slot == op.stats_slot && q.sr_op == op.sr_op &&
                      it->second.rows == rows && it->second.cols == cols;
    if (!same) breaches.push_back("a prequantized operand that differs from its producer's q_out");
    ++prequantized_found;
    pending.erase(it);  // taken once
  }
  std::vector<float> prepare(const GemmOperand& op, int64_t rows, int64_t K) const {
    std::vector<float> v(op.p, op.p + rows * K);
    if (op.round_bf16_first)
      for (float& x : v) x = mxlab::round_bf16(x, op.bf16_mode);
    QuantSpec q = op.q;
    q.seed = sr_seed(q.seed, op.sr_op);
    q.salt = step.step;
    quantize_dequantize(v.data(), v.data(), op.k_contiguous ? rows : K, op.k_contiguous ? K : rows,
                        op.k_contiguous ? Axis::contiguous : Axis::strided, q);
    return v;
  }
};

// The rounding role and the format of GEMM operand `id` (the op ids of lab/model/README.md:
// fc1_x, fc1_w, fc2_x, fc2_w, dw2_dy, dw2_x, da_dy, da_w, dw1_dy, dw1_x, dy_dy, dy_w; 12, 13 are
// Q(gamma), Q(beta)), written out here independently of the model's OperandRules.
PrecisionConfig::Role operand_role(int id) {
  using R = PrecisionConfig::Role;
  switch (id) {
    case 0: case 2: case 5: case 9: return R::activation;
    case 1: case 3: case 7: case 11: return R::weight;
    case 4: case 8: return R::grad_wgrad;
    case 6: case 10: return R::grad;
    default: return R::ln_affine;
  }
}
NumFmt operand_fmt(const PrecisionConfig& p, int id) {
  switch (id) {
    case 0: case 2: return p.activation;
    case 1: case 3: return p.weight;
    case 5: case 9: return p.activation_bwd_fmt();
    case 7: case 11: return p.weight_bwd_fmt();
    case 4: case 8: return p.grad_wgrad_fmt();
    case 6: case 10: return p.grad;
    default: return p.ln_affine;
  }
}

// One training step's forward, MSE loss and backward written out as the paper's emulation
// does it: every GEMM operand rounded to bf16, then quantize_dequantize'd along that GEMM's
// reduction axis as it is stored; FP32 accumulation; every output and vector op rounded to
// bf16. `flip` (0..11) swaps the quantization axis of one GEMM operand, in the order of the
// op ids of lab/model/README.md (a negative control: the model must then disagree). The wgrad
// GEMMs' gradient operands (ids 4, 8) take grad_wgrad, the dgrad GEMMs' (6, 10) grad.
PassResult reference_mx(const NetShape& s, const std::vector<float>& P, const std::vector<float>& x,
                        const std::vector<float>& t, int64_t B, const PrecisionConfig& p, uint64_t seed,
                        uint32_t step, int flip = -1) {
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in, L = s.depth;
  const ElementwiseRound Rw{p.elementwise_bf16, p.elementwise_rounding};
  auto R = [&](float v) { return ew_round(v, Rw.bf16, Rw.mode); };
  auto spec = [&](NumFmt f, int layer, int id) {
    QuantSpec q;
    q.fmt = f;
    q.block = p.block_size;
    q.rule = p.scale_rule;
    q.bump = p.bump;
    q.rounding = is_mx(f) ? p.rounding_of(operand_role(id)) : p.elementwise_rounding;
    q.seed = sr_seed(seed, uint64_t(16 * layer + id + 1));
    q.salt = step;
    return q;
  };
  // Q(tensor stored [rows x cols]) with blocks along `axis`.
  auto Q = [&](const float* src, int64_t rows, int64_t cols, Axis axis, NumFmt f, int layer, int id) {
    std::vector<float> v(src, src + rows * cols);
    if (p.elementwise_bf16)
      for (float& e : v) e = round_bf16(e, p.elementwise_rounding);
    if (id == flip) axis = axis == Axis::contiguous ? Axis::strided : Axis::contiguous;
    quantize_dequantize(v.data(), v.data(), rows, cols, axis, spec(f, layer, id));
    return v;
  };
  auto off = [&](int k, ParamGroup::Kind kind) { return s.find(k, kind) ? s.find(k, kind)->offset : -1; };
  const Axis kC = Axis::contiguous, kS = Axis::strided;

  // Saved per layer for the backward pass.
  std::vector<std::vector<float>> A(L + 1), Y(L), Xh(L), Rs(L), Hh(L), Aa(L), Gq(L);
  A[0] = x;
  for (float& v : A[0]) v = R(v);
  for (int k = 0; k < L; ++k) {
    const float* W1 = P.data() + off(k, ParamGroup::w1);
    const float* W2 = P.data() + off(k, ParamGroup::w2);
    Y[k] = A[k];
    if (s.layernorm) {
      std::vector<float> gq(d, 1.0f), bq(d, 0.0f);
      if (s.ln_affine) {
        const float* g = P.data() + off(k, ParamGroup::gamma);
        const float* b = P.data() + off(k, ParamGroup::beta);
        gq.assign(g, g + d);
        bq.assign(b, b + d);
        if (p.ln_affine != NumFmt::fp32) {  // no bf16-first for the LN affine role
          quantize_dequantize(gq.data(), gq.data(), 1, d, kC, spec(p.ln_affine, k, 12));
          quantize_dequantize(bq.data(), bq.data(), 1, d, kC, spec(p.ln_affine, k, 13));
        }
      }
      Gq[k] = gq;
      Xh[k].resize(B * d);
      Rs[k].resize(B);
      for (int64_t i = 0; i < B; ++i) {
        const float* a = A[k].data() + i * d;
        double sum = 0;
        for (int64_t j = 0; j < d; ++j) sum += a[j];
        const float mean = R(float(sum / d));
        std::vector<float> xc(d);
        double sq = 0;
        for (int64_t j = 0; j < d; ++j) {
          xc[j] = R(a[j] - mean);
          sq += double(xc[j]) * xc[j];
        }
        const float var = R(float(sq / d));
        const float rstd = R(1.0f / sqrtf_ieee(var + s.ln_eps));
        Rs[k][i] = rstd;
        for (int64_t j = 0; j < d; ++j) {
          const float xh = R(xc[j] * rstd);
          Xh[k][i * d + j] = xh;
          Y[k][i * d + j] = s.ln_affine ? R(R(xh * gq[j]) + bq[j]) : xh;
        }
      }
    }
    // h = y W1^T: y [B x d] and W1 [H1 x d] both along d (their rows).
    const auto yq = Q(Y[k].data(), B, d, kC, p.activation, k, 0), w1q = Q(W1, H1, d, kC, p.weight, k, 1);
    Hh[k].resize(B * H1);
    naive_gemm(B, H1, d, [&](int64_t i, int64_t c) { return yq[i * d + c]; },
               [&](int64_t j, int64_t c) { return w1q[j * d + c]; }, Hh[k].data(), 0, Rw);
    Aa[k].resize(B * H);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H; ++j)
        Aa[k][i * H + j] = s.act == Act::swiglu ? R(Hh[k][i * H1 + j] * silu(Hh[k][i * H1 + H + j]))
                                                : R(act_value(s.act, Hh[k][i * H1 + j]));
    // o = a W2^T: a [B x H] and W2 [d x H] along H.
    const auto aq = Q(Aa[k].data(), B, H, kC, p.activation, k, 2), w2q = Q(W2, d, H, kC, p.weight, k, 3);
    std::vector<float> o(B * d);
    naive_gemm(B, d, H, [&](int64_t i, int64_t j) { return aq[i * H + j]; },
               [&](int64_t c, int64_t j) { return w2q[c * H + j]; }, o.data(), 0, Rw);
    A[k + 1].resize(B * d);
    const int64_t ob = off(k, ParamGroup::b2);
    for (int64_t i = 0; i < B * d; ++i)
      A[k + 1][i] = ob >= 0 ? R(A[k][i] + R(o[i] + P[ob + i % d])) : R(A[k][i] + o[i]);
  }
  PassResult r;
  r.out = A[L];
  double sum = 0;
  std::vector<float> dA(B * d);
  const float scale = 2.0f / float(B * d);
  for (int64_t i = 0; i < B * d; ++i) {
    sum += (double(r.out[i]) - t[i]) * (double(r.out[i]) - t[i]);
    dA[i] = R((r.out[i] - t[i]) * scale);
  }
  r.loss = float(sum / double(B * d));

  r.grads.assign(P.size(), 0.0f);
  const NumFmt wb = p.weight_bwd_fmt(), xb = p.activation_bwd_fmt();
  for (int k = int(L) - 1; k >= 0; --k) {
    const float* W1 = P.data() + off(k, ParamGroup::w1);
    const float* W2 = P.data() + off(k, ParamGroup::w2);
    if (off(k, ParamGroup::b2) >= 0)
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < B; ++i) acc += dA[i * d + c];
        r.grads[off(k, ParamGroup::b2) + c] = float(acc);
      }
    // dW2 [d x H] = dA^T a: both reduce over the batch, i.e. down the columns of [B x .].
    {
      const auto g = Q(dA.data(), B, d, kS, p.grad_wgrad_fmt(), k, 4), a = Q(Aa[k].data(), B, H, kS, xb, k, 5);
      naive_gemm(d, H, B, [&](int64_t c, int64_t i) { return g[i * d + c]; },
                 [&](int64_t j, int64_t i) { return a[i * H + j]; }, r.grads.data() + off(k, ParamGroup::w2), 0, Rw);
    }
    // da [B x H] = dA W2: reduce over d: rows of dA, columns of W2 [d x H].
    std::vector<float> da(B * H);
    {
      const auto g = Q(dA.data(), B, d, kC, p.grad, k, 6), w = Q(W2, d, H, kS, wb, k, 7);
      naive_gemm(B, H, d, [&](int64_t i, int64_t c) { return g[i * d + c]; },
                 [&](int64_t j, int64_t c) { return w[c * H + j]; }, da.data(), 0, Rw);
    }
    std::vector<float> dh(B * H1);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H; ++j) {
        const float g = da[i * H + j];
        if (s.act == Act::swiglu) {
          const float u = Hh[k][i * H1 + j], v = Hh[k][i * H1 + H + j];
          dh[i * H1 + j] = R(g * silu(v));
          dh[i * H1 + H + j] = R((g * u) * silu_deriv(v));
        } else {
          dh[i * H1 + j] = R(g * act_deriv(s.act, Hh[k][i * H1 + j]));
        }
      }
    // dW1 [H1 x d] = dh^T y: reduce over the batch.
    {
      const auto g = Q(dh.data(), B, H1, kS, p.grad_wgrad_fmt(), k, 8), y = Q(Y[k].data(), B, d, kS, xb, k, 9);
      naive_gemm(H1, d, B, [&](int64_t j, int64_t i) { return g[i * H1 + j]; },
                 [&](int64_t c, int64_t i) { return y[i * d + c]; }, r.grads.data() + off(k, ParamGroup::w1), 0, Rw);
    }
    // dy [B x d] = dh W1: reduce over H1: rows of dh, columns of W1 [H1 x d].
    std::vector<float> dy(B * d);
    {
      const auto g = Q(dh.data(), B, H1, kC, p.grad, k, 10), w = Q(W1, H1, d, kS, wb, k, 11);
      naive_gemm(B, d, H1, [&](int64_t i, int64_t j) { return g[i * H1 + j]; },
                 [&](int64_t c, int64_t j) { return w[j * d + c]; }, dy.data(), 0, Rw);
    }
    std::vector<float> dx = dy;
    if (s.layernorm) {
      for (int64_t i = 0; i < B; ++i) {
        std::vector<float> g(d);
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < d; ++j) {
          g[j] = s.ln_affine ? R(dy[i * d + j] * Gq[k][j]) : dy[i * d + j];
          sg += g[j];
          sgx += double(g[j]) * Xh[k][i * d + j];
        }
        const float mg = float(sg / d), mgx = float(sgx / d);
        for (int64_t j = 0; j < d; ++j)
          dx[i * d + j] = R(Rs[k][i] * ((g[j] - mg) - Xh[k][i * d + j] * mgx));
      }
      if (s.ln_affine)
        for (int64_t j = 0; j < d; ++j) {
          double sgam = 0, sbet = 0;
          for (int64_t i = 0; i < B; ++i) {
            sgam += double(dy[i * d + j]) * Xh[k][i * d + j];
            sbet += dy[i * d + j];
          }
          r.grads[off(k, ParamGroup::gamma) + j] = float(sgam);
          r.grads[off(k, ParamGroup::beta) + j] = float(sbet);
        }
    }
    for (int64_t i = 0; i < B * d; ++i) dA[i] = R(dA[i] + dx[i]);
  }
  return r;
}

struct MxCase {
  std::string label;
  ModelConfig m;
  PrecisionConfig p;
  // Whether quantizing along the wrong axis must change the result. FP element quantization
  // depends on the block scale only through clamping and subnormals, so with rceil (no
  // clamping) and FP8 (14+ binades of range) a wrong axis is invisible on any sane data.
  bool axis_sensitive = true;
};

std::vector<MxCase> mx_cases() {
  std::vector<MxCase> cs;
  {
    MxCase c{"L1 gelu MXFP8 E4M3, ln_affine E4M3", small_model(1, 32, Act::gelu), PrecisionConfig{}};
    c.p.elementwise_rounding = Rounding::nearest_away;
    cs.push_back(c);
  }
  {
    MxCase c{"L2 swiglu MXFP4 (H = 85: partial blocks), stochastic, ln_affine bf16",
             small_model(2, 32, Act::swiglu), PrecisionConfig{}};
    c.p.weight = c.p.activation = c.p.grad = NumFmt::mxfp4_e2m1;
    c.p.ln_affine = NumFmt::bf16;
    c.p.rounding = Rounding::stochastic;
    c.p.elementwise_rounding = Rounding::nearest_away;
    cs.push_back(c);
  }
  {
    MxCase c{"L2 relu, E4M3 fwd / E5M2 bwd roles, rceil, ln_affine fp32, no bias",
             small_model(2, 32, Act::relu, true, true, false), PrecisionConfig{}};
    c.p.grad = NumFmt::mxfp8_e5m2;
    c.p.weight_bwd = NumFmt::mxfp8_e5m2;
    c.p.activation_bwd = NumFmt::mxfp6_e3m2;
    c.p.ln_affine = NumFmt::fp32;
    c.p.scale_rule = ScaleRule::rceil;
    c.p.elementwise_rounding = Rounding::nearest_away;
    c.axis_sensitive = false;
    cs.push_back(c);
  }
  {  // Per-GEMM precision: Dgrad's dY in MX, Wgrad's dY in bf16 (precision.grad_wgrad).
    MxCase c{"L2 gelu, grad MXFP8 E4M3 (dgrad), grad_wgrad bf16 (wgrad)", small_model(2, 32, Act::gelu),
             PrecisionConfig{}};
    c.p.grad_wgrad = NumFmt::bf16;
    c.p.rounding = Rounding::nearest_away;
    c.p.elementwise_rounding = Rounding::nearest_away;
    cs.push_back(c);
  }
  {  // ... and in another MX format with a rounding mode of its own (stochastic, its own streams).
    MxCase c{"L2 swiglu, grad MXFP8 E4M3, grad_wgrad MXFP6 E3M2 stochastic", small_model(2, 32, Act::swiglu),
             PrecisionConfig{}};
    c.p.grad_wgrad = NumFmt::mxfp6_e3m2;
    c.p.rounding_grad_wgrad = Rounding::stochastic;
    c.p.elementwise_rounding = Rounding::nearest_away;
    cs.push_back(c);
  }
  return cs;
}

// Magnitudes that vary by row and by column (powers of two), so that blocks along one axis
// and blocks along the other get different shared scales. With i.i.d. data of one scale
// nearly every block has the same exponent and the quantization axis would not matter.
void make_heterogeneous(const NetShape& s, std::vector<float>& params, std::vector<float>& t, int64_t B) {
  for (const ParamGroup& g : s.groups)
    for (int64_t r = 0; r < g.rows; ++r)
      for (int64_t c = 0; c < g.cols; ++c) {
        float& v = params[g.offset + r * g.cols + c];
        if (g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2) v = std::ldexp(v, int(r % 3) - int(c % 4));
        if (g.kind == ParamGroup::gamma) v = std::ldexp(v, int(c % 4) - 1);
      }
  for (int64_t i = 0; i < B; ++i)
    for (int64_t c = 0; c < s.d; ++c) t[i * s.d + c] = std::ldexp(t[i * s.d + c], int(i % 5) - 2 + int(c % 3));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::string* where) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (f32_bits(a[i]) != f32_bits(b[i])) {
      *where = msg("[", i, "] ", a[i], " vs ", b[i]);
      return false;
    }
  return true;
}

}  // namespace

TEST(ModelMx, MatchesExplicitCompositionBitForBit) {
  const int64_t B = 32;
  const uint64_t seed = 1234;
  const uint32_t step = 9;
  for (const MxCase& c : mx_cases()) {
    SCOPED_TRACE(c.label);
    const NetShape s = NetShape::student(c.m);
    auto params = test_params(s, 17);
    auto t = noise(B * s.d, 19);
    const auto x = noise(B * s.d, 18);
    make_heterogeneous(s, params, t, B);
    NaiveGemmBackend be;
    StepScalars st;
    st.step = step;
    be.set_step(st);
    RunConfig cfg;
    cfg.model = c.m;
    PassPolicy pol;
    pol.p = c.p;
    pol.seed = seed;
    const PassResult got = run_pass(be, s, cfg, params, x, t, B, pol);
    const PassResult want = reference_mx(s, params, x, t, B, c.p, seed, step);
    std::string where;
    EXPECT_EQ(f32_bits(got.loss), f32_bits(want.loss)) << got.loss << " vs " << want.loss;
    EXPECT_TRUE(same_bits(got.out, want.out, &where)) << "output " << where;
    for (const ParamGroup& g : s.groups) {
      const std::vector<float> a(got.grads.begin() + g.offset, got.grads.begin() + g.offset + g.size());
      const std::vector<float> b(want.grads.begin() + g.offset, want.grads.begin() + g.offset + g.size());
      EXPECT_TRUE(same_bits(a, b, &where)) << g.name << " " << where;
      double n = 0;
      for (float v : a) n += double(v) * v;
      EXPECT_GT(n, 0.0) << g.name;
    }
    // Negative control: quantizing any one operand along the other axis changes the result.
    for (int flip = 0; c.axis_sensitive && flip < 12; ++flip) {
      if (!is_mx(operand_fmt(c.p, flip))) continue;  // an element-wise format has no axis
      const PassResult wrong = reference_mx(s, params, x, t, B, c.p, seed, step, flip);
      EXPECT_FALSE(same_bits(got.grads, wrong.grads, &where) && same_bits(got.out, wrong.out, &where))
          << "flipping the axis of operand " << flip << " went unnoticed";
    }
  }
}

// GEMM outputs that one element-wise op reads are left unrounded and rounded by that op as it
// reads them (lab/model/README.md, "Deferred output rounding"): in the forward h (act_fwd) and,
// with the residual, o (residual_add, which also writes A_{k+1} without a copy of A_k); in the
// backward da (act_bwd) and, under layernorm, dy (layernorm_bwd). The GEMMs still round dW2, dW1. The plain (non-residual) teacher
// keeps o's rounding in its GEMM. That the bits are unchanged is MatchesExplicitCompositionBitForBit's.
// A small MX student (L = 2, d = 32, B = 32, GeLU, nearest_away) on the naive-order backend,
// which the tests below count the calls of: parameters, batch and workspace made, nothing run.
struct NaiveMxPass {
  static constexpr int64_t B = 32, d = 32;
  NaiveGemmBackend be;
  ModelConfig m;
  RunConfig cfg;
  PassPolicy pol;
  NetShape s;
  float *P, *X, *T, *G;
  Workspace ws;
  explicit NaiveMxPass(bool layernorm = true)
      : m(small_model(2, d, Act::gelu, layernorm, true, false)), s(NetShape::student(m)) {
    cfg.model = m;
    pol.p.rounding = Rounding::nearest_away;
    const auto params = test_params(s, 21);
    P = put(be, params);
    X = put(be, noise(B * d, 22));
    T = put(be, noise(B * d, 23));
    G = be.alloc(params.size());
    ws = Workspace::make(be, s, B);
  }
  void forward_pass() { forward(be, s, P, X, ws, pol); }
  void loss_and_backward() {
    loss_and_grad(be, cfg.loss_spec(), T, ws, pol, nullptr);
    backward(be, s, P, X, ws, G, pol);
  }
};

TEST(ModelMx, GemmOutputsReadByOneOpAreRoundedByThatOp) {
  NaiveMxPass t;
  ASSERT_TRUE(t.pol.p.elementwise_bf16) << "the test needs element-wise bf16 rounding";
  NaiveGemmBackend& be = t.be;
  be.copies = 0;
  t.forward_pass();
  EXPECT_EQ(be.gemm_outputs_rounded, 0);
  EXPECT_EQ(be.copies, 1);  // A_0 = R(x) only: no copy of A_k per layer
  t.loss_and_backward();
  EXPECT_EQ(be.gemm_outputs_rounded, 2 * t.s.depth);  // dW2, dW1 (dy: the layernorm backward rounds it)
  // The plain teacher: o = A_{k+1} is read by the next layer's norm and GEMM, so its GEMM rounds it.
  TeacherConfig tc;
  tc.residual = false;
  const NetShape plain = NetShape::teacher(t.m, tc);
  ASSERT_FALSE(plain.residual);
  const auto tp = test_params(plain, 24);
  float* TP = put(be, tp);
  Workspace tws = Workspace::make(be, plain, NaiveMxPass::B);
  be.gemm_outputs_rounded = 0;
  forward(be, plain, TP, t.X, tws, t.pol);
  EXPECT_EQ(be.gemm_outputs_rounded, plain.depth);
}

// Producer-side quantization (lab/model/backend.h): in an MX step the model hands y (layernorm
// forward), a (act_fwd) and dh (act_bwd) to their producers as q_out and marks the GEMM
// operand that reads each next `prequantized`. Every marked operand must equal what its
// producer was given, with nothing written to the tensor in between (a backend relies on this
// to take the producer's quantization); the CPU backend ignores it, the GPU backend uses it
// (tests/gpu/test_model_parity.cu checks the bits with and without).
TEST(ModelMx, ProducersAreHandedTheOperandTheirGemmReads) {
  for (bool layernorm : {true, false}) {
    SCOPED_TRACE(layernorm ? "layernorm" : "no norm");
    NaiveMxPass t(layernorm);
    NaiveGemmBackend& be = t.be;
    t.forward_pass();
    // y (only when a norm writes it) and a, and the weights W1 and W2 handed to prequantize
    const int per_fwd = (layernorm ? 2 : 1) + 2;
    EXPECT_EQ(be.q_out_given, per_fwd * t.s.depth);
    EXPECT_EQ(be.prequantized_found, per_fwd * t.s.depth);
    t.loss_and_backward();
    // + dh, the dgrad GEMMs' W1 and W2 and the dW1 GEMM's y per layer, + dA from every block's add
    // but the first's (block 0's dA feeds no GEMM)
    const int handed = (per_fwd + 4) * t.s.depth + (t.s.depth - 1);
    EXPECT_EQ(be.q_out_given, handed);
    EXPECT_EQ(be.prequantized_found, handed);
    EXPECT_TRUE(be.pending.empty()) << be.pending.size() << " handed-over operands were never read";
    EXPECT_EQ(be.prequantize_calls, 2);  // one in the forward, one in the backward
    for (const std::string& b : be.breaches) ADD_FAILURE() << b;
  }
}

namespace {
// Two runs' operands alike in everything but the tensor's address (each run allocates its own).
bool same_gemm_operand(const GemmOperand& a, const GemmOperand& b) {
  return a.k_contiguous == b.k_contiguous && a.q.fmt == b.q.fmt && a.q.block == b.q.block &&
         a.q.rule == b.q.rule && a.q.rounding == b.q.rounding && a.q.bump == b.q.bump && a.q.seed == b.q.seed &&
         a.round_bf16_first == b.round_bf16_first && a.bf16_mode == b.bf16_mode && a.stats_slot == b.stats_slot &&
         a.sr_op == b.sr_op && a.prequantized == b.prequantized;
}
}  // namespace

// Per-GEMM precision (precision.grad_wgrad): the wgrad GEMMs (dW2 = dA^T a, dW1 = dh^T y) read
// the gradient under grad_wgrad, the dgrad GEMMs (da = dA W2, dy = dh W1) under grad. With
// grad MXFP8 and grad_wgrad bf16, the weight gradients come from bf16 dY and every other
// gradient (which flows through the dgrad GEMMs only) is exactly the grad-only run's; the bits
// against the dense composition are MatchesExplicitCompositionBitForBit's (its grad_wgrad cases).
// An explicit grad_wgrad equal to grad is the same step: the same GEMM calls, the same bits.
TEST(ModelMx, WgradGradientOperandHasARoleOfItsOwn) {
  const int64_t B = 32;
  const uint64_t seed = 1234;
  const NetShape s = NetShape::student(small_model(2, 32, Act::gelu));
  auto params = test_params(s, 17);
  auto t = noise(B * s.d, 19);
  const auto x = noise(B * s.d, 18);
  make_heterogeneous(s, params, t, B);
  RunConfig cfg;
  cfg.model = small_model(2, 32, Act::gelu);
  PrecisionConfig base;  // MXFP8 E4M3 everywhere, grad_wgrad `same`
  base.rounding = Rounding::nearest_away;
  base.elementwise_rounding = Rounding::nearest_away;
  auto pass = [&](const PrecisionConfig& p, std::vector<NaiveGemmBackend::GemmCall>* calls = nullptr,
                  std::vector<std::string>* breaches = nullptr) {
    NaiveGemmBackend be;
    StepScalars st;
    st.step = 9;
    be.set_step(st);
    PassPolicy pol;
    pol.p = p;
    pol.seed = seed;
    const PassResult r = run_pass(be, s, cfg, params, x, t, B, pol);
    if (calls) *calls = be.gemms;
    if (breaches) *breaches = be.breaches;
    return r;
  };
  std::vector<NaiveGemmBackend::GemmCall> calls_base, calls_split;
  std::vector<std::string> breaches;
  const PassResult r_base = pass(base, &calls_base);
  PrecisionConfig split = base;
  split.grad_wgrad = NumFmt::bf16;
  const PassResult r_split = pass(split, &calls_split, &breaches);
  for (const std::string& b : breaches) ADD_FAILURE() << b;  // producers still hand over the dgrad operands

  // The calls: per layer dW2, da, dW1, dy after the 2 * L forward GEMMs; only the gradient
  // operand of dW2 and dW1 changes (fmt bf16, the grad_wgrad role's element rounding).
  ASSERT_EQ(calls_base.size(), calls_split.size());
  ASSERT_EQ(calls_base.size(), static_cast<size_t>(6 * s.depth));
  for (size_t i = 0; i < calls_base.size(); ++i) {
    const bool wgrad = i >= static_cast<size_t>(2 * s.depth) && (i - 2 * s.depth) % 2 == 0;
    SCOPED_TRACE(msg("gemm ", i, wgrad ? " (wgrad)" : ""));
    EXPECT_TRUE(same_gemm_operand(calls_base[i].b, calls_split[i].b));
    if (!wgrad) {
      EXPECT_TRUE(same_gemm_operand(calls_base[i].a, calls_split[i].a));
      continue;
    }
    EXPECT_FALSE(calls_split[i].a.k_contiguous);  // dY^T: blocks would run down the batch
    EXPECT_EQ(calls_base[i].a.q.fmt, NumFmt::mxfp8_e4m3);
    EXPECT_EQ(calls_split[i].a.q.fmt, NumFmt::bf16);
    EXPECT_EQ(calls_split[i].a.q.rounding, Rounding::nearest_away);  // bf16 rounds per elementwise_rounding
    EXPECT_EQ(calls_split[i].a.sr_op, calls_base[i].a.sr_op);
    // One tensor (dA, dh) feeds the wgrad GEMM and the dgrad GEMM after it, each quantizing it
    // its own way.
    EXPECT_EQ(calls_split[i].a.p, calls_split[i + 1].a.p);
    EXPECT_TRUE(calls_split[i + 1].a.k_contiguous);
    EXPECT_EQ(calls_split[i + 1].a.q.fmt, NumFmt::mxfp8_e4m3);
  }
  // The loss and everything that does not pass through a wgrad GEMM are the grad-only run's bits;
  // the weight gradients are not.
  std::string where;
  EXPECT_EQ(f32_bits(r_split.loss), f32_bits(r_base.loss));
  EXPECT_TRUE(same_bits(r_split.out, r_base.out, &where)) << where;
  for (const ParamGroup& g : s.groups) {
    const std::vector<float> a(r_split.grads.begin() + g.offset, r_split.grads.begin() + g.offset + g.size());
    const std::vector<float> b(r_base.grads.begin() + g.offset, r_base.grads.begin() + g.offset + g.size());
    const bool weight = g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2;
    EXPECT_EQ(same_bits(a, b, &where), !weight) << g.name;
  }
  // dW2 of the last layer by hand: dA = dout (the same in both runs) rounded to bf16 (as the
  // bf16 role and the bf16-first rounding both do, ties away), a quantized along the batch
  // (MXFP8 E4M3, activation_bwd), a plain double sum rounded to bf16 - and the MX dgrad of the
  // same dA gives a different dW2.
  {
    NaiveGemmBackend be;
    StepScalars st;
    st.step = 9;
    be.set_step(st);
    PassPolicy pol;
    pol.p = split;
    pol.seed = seed;
    float* P = put(be, params);
    float* X = put(be, x);
    float* T = put(be, t);
    Workspace ws = Workspace::make(be, s, B);
    forward(be, s, P, X, ws, pol);
    loss_and_grad(be, cfg.loss_spec(), T, ws, pol, nullptr);
    const int k = s.depth - 1;
    const int64_t d = s.d, H = s.hidden;
    const std::vector<float> dA = get(be, ws.dout, static_cast<size_t>(B * d));
    std::vector<float> a = get(be, ws.a[k], static_cast<size_t>(B * H));
    for (float& v : a) v = round_bf16(v, Rounding::nearest_away);
    QuantSpec q;
    q.fmt = NumFmt::mxfp8_e4m3;
    q.block = base.block_size;
    q.rule = base.scale_rule;
    q.bump = base.bump;
    q.rounding = Rounding::nearest_away;
    q.seed = sr_seed(seed, uint64_t(16 * k + 5 + 1));  // dw2_x
    q.salt = 9;
    quantize_dequantize(a.data(), a.data(), B, H, Axis::strided, q);
    const ParamGroup& g2 = *s.find(k, ParamGroup::w2);
    int64_t differs = 0;
    for (int64_t c = 0; c < d; ++c)
      for (int64_t j = 0; j < H; ++j) {
        double acc = 0, mag = 0;
        for (int64_t i = 0; i < B; ++i) {
          const double prod = double(round_bf16(dA[i * d + c], Rounding::nearest_away)) * double(a[i * H + j]);
          acc += prod;
          mag += std::fabs(prod);
        }
        // The GEMM sums in FP32 (within B 2^-24 sum |prod| of the exact sum), then rounds to
        // bf16 (one bf16 ulp, 2^-7 relative, covers either side of a rounding boundary).
        const double fp32_err = std::ldexp(double(B), -24) * mag;
        const double tol = fp32_err + std::ldexp(std::fabs(acc) + fp32_err, -7);
        const float got = r_split.grads[g2.offset + c * H + j];
        EXPECT_LE(std::fabs(double(got) - acc), tol) << "dW2[" << c << "," << j << "]";
        differs += got != r_base.grads[g2.offset + c * H + j];
      }
    EXPECT_GT(differs, d * H / 10) << "bf16 and MXFP8 dY should give visibly different dW2";
  }

  // An explicit grad_wgrad equal to grad: identical GEMM calls and identical bits.
  PrecisionConfig same = base;
  same.grad_wgrad = base.grad;
  std::vector<NaiveGemmBackend::GemmCall> calls_same;
  const PassResult r_same = pass(same, &calls_same);
  ASSERT_EQ(calls_same.size(), calls_base.size());
  for (size_t i = 0; i < calls_same.size(); ++i) {
    EXPECT_TRUE(same_gemm_operand(calls_same[i].a, calls_base[i].a)) << i;
    EXPECT_TRUE(same_gemm_operand(calls_same[i].b, calls_base[i].b)) << i;
  }
  EXPECT_TRUE(same_bits(r_same.grads, r_base.grads, &where)) << where;
  EXPECT_EQ(f32_bits(r_same.loss), f32_bits(r_base.loss));
}

// Attention blocks: the Q/K/V and O projections' wgrad GEMMs read dY under grad_wgrad too, so
// with grad_wgrad bf16 every weight gradient (Wqkv, Wo, W1, W2) changes and every other
// gradient (gains, biases: through the dgrad and attention-internal GEMMs only, under grad) keeps
// the grad-only run's bits.
TEST(ModelMx, AttentionProjectionsWgradReadGradWgrad) {
  ModelConfig m = small_model(1, 32, Act::gelu);
  m.block = BlockKind::attention;
  m.heads = 2;
  const int seq_len = 32;  // a multiple of the block: attention GEMMs quantize along the sequence
  const int64_t B = 2 * seq_len;
  const NetShape s = NetShape::student(m, seq_len);
  RunConfig cfg;
  cfg.model = m;
  cfg.data.seq_len = seq_len;
  auto params = test_params(s, 31);
  const auto x = noise(B * s.d, 32), t = noise(B * s.d, 33);
  auto pass = [&](const PrecisionConfig& p) {
    auto be = make_cpu_backend();
    StepScalars st;
    st.step = 4;
    be->set_step(st);
    PassPolicy pol;
    pol.p = p;
    pol.seed = 77;
    return run_pass(*be, s, cfg, params, x, t, B, pol);
  };
  PrecisionConfig base;
  base.rounding = Rounding::nearest_away;
  PrecisionConfig split = base;
  split.grad_wgrad = NumFmt::bf16;
  const PassResult a = pass(base), b = pass(split);
  std::string where;
  EXPECT_EQ(f32_bits(a.loss), f32_bits(b.loss));
  int weights = 0;
  for (const ParamGroup& g : s.groups) {
    const std::vector<float> ga(a.grads.begin() + g.offset, a.grads.begin() + g.offset + g.size());
    const std::vector<float> gb(b.grads.begin() + g.offset, b.grads.begin() + g.offset + g.size());
    const bool weight = g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2 || g.kind == ParamGroup::wqkv ||
                        g.kind == ParamGroup::wo;
    weights += weight;
    EXPECT_EQ(same_bits(ga, gb, &where), !weight) << g.name;
  }
  EXPECT_EQ(weights, 4);
}

// The layernorm's affine operands: the forward quantizes gamma and beta of every layer and keeps
// each layer's Q(gamma); the backward (whose layernorm backward reads Q(gamma), and nothing
// Q(beta)) quantizes nothing. That it reads the right layer's Q(gamma) is
// MatchesExplicitCompositionBitForBit's (layers with different gammas, make_heterogeneous).
TEST(ModelMx, BackwardReusesTheForwardsQuantizedGains) {
  const int64_t B = 32, d = 32;
  const ModelConfig m = small_model(2, d, Act::gelu, true, true, false);
  const NetShape s = NetShape::student(m);
  const auto params = test_params(s, 21);
  const auto x = noise(B * d, 22), t = noise(B * d, 23);
  NaiveGemmBackend be;
  RunConfig cfg;
  cfg.model = m;
  PassPolicy pol;
  pol.p.rounding = Rounding::nearest_away;
  float* P = put(be, params);
  float* X = put(be, x);
  float* T = put(be, t);
  float* G = be.alloc(params.size());
  Workspace ws = Workspace::make(be, s, B);
  auto gains = [&] { return std::count(be.quantized.begin(), be.quantized.end(), std::make_pair(int64_t{1}, d)); };
  forward(be, s, P, X, ws, pol);
  EXPECT_EQ(gains(), 2 * s.depth);  // gamma and beta per layer
  loss_and_grad(be, cfg.loss_spec(), T, ws, pol, nullptr);
  be.quantized.clear();
  backward(be, s, P, X, ws, G, pol);
  EXPECT_EQ(gains(), 0);
}

// The real CPU backend (Eigen GEMM) on the same MX step: agreement with the naive-order
// backend is only approximate, but the step must be finite and the loss close (rounding flips
// move single elements by one bf16 or MX ulp, never the mean over B * d terms by 1 %).
TEST(ModelMx, CpuBackendCloseToNaiveOrder) {
  const int64_t B = 32;
  const MxCase c = mx_cases()[0];
  const NetShape s = NetShape::student(c.m);
  const auto params = test_params(s, 17);
  const auto x = noise(B * s.d, 18), t = noise(B * s.d, 19);
  RunConfig cfg;
  cfg.model = c.m;
  PassPolicy pol;
  pol.p = c.p;
  NaiveGemmBackend nb;
  auto cb = make_cpu_backend();
  const PassResult a = run_pass(nb, s, cfg, params, x, t, B, pol);
  const PassResult b = run_pass(*cb, s, cfg, params, x, t, B, pol);
  EXPECT_NEAR(a.loss, b.loss, 0.01 * a.loss);
  for (float v : b.grads) ASSERT_TRUE(std::isfinite(v));
}

// backward: false runs the backward in FP32 on the forward's (quantized) saved tensors: the
// same as an all-FP32 backward after the same MX forward.
TEST(ModelMx, ForwardOnlyQuantizationHasFp32Backward) {
  const int64_t B = 32;
  const ModelConfig m = small_model(2, 32, Act::gelu);
  const NetShape s = NetShape::student(m);
  const auto params = test_params(s, 5);
  const auto x = noise(B * s.d, 6), t = noise(B * s.d, 7);
  RunConfig cfg;
  cfg.model = m;
  PrecisionConfig mx;  // MXFP8 E4M3 everywhere, bf16 element-wise
  mx.backward = false;
  auto be = make_cpu_backend();
  float* P = put(*be, params);
  float* X = put(*be, x);
  float* T = put(*be, t);
  float* G1 = be->alloc(params.size());
  float* G2 = be->alloc(params.size());
  Workspace ws = Workspace::make(*be, s, B);
  PassPolicy pmx;
  pmx.p = mx;
  forward(*be, s, P, X, ws, pmx);
  loss_and_grad(*be, cfg.loss_spec(), T, ws, pmx, nullptr);
  backward(*be, s, P, X, ws, G1, pmx);
  // Same MX forward; loss and backward under an FP32 policy that keeps Q(gamma), Q(beta).
  PassPolicy pfp;
  pfp.p = fp32_policy();
  pfp.p.ln_affine = mx.ln_affine;
  forward(*be, s, P, X, ws, pmx);
  loss_and_grad(*be, cfg.loss_spec(), T, ws, pfp, nullptr);
  backward(*be, s, P, X, ws, G2, pfp);
  const auto g1 = get(*be, G1, params.size()), g2 = get(*be, G2, params.size());
  std::string where;
  EXPECT_TRUE(same_bits(g1, g2, &where)) << where;
  // ... and differs from the quantized backward.
  PassPolicy pq = pmx;
  pq.p.backward = true;
  const PassResult q = run_pass(*be, s, cfg, params, x, t, B, pq);
  EXPECT_FALSE(same_bits(q.grads, g1, &where));
}

// ---- layernorm affine quantization and statistics slots ------------------------------------

// Gains of 0.89 all clamp to 0.875 under E4M3 with the floor rule (the paper's section 5.1).
TEST(ModelMx, LnAffineVariantsAndStatisticsSlots) {
  const int64_t B = 32, d = 32;
  const ModelConfig m = small_model(1, d, Act::gelu);
  const NetShape s = NetShape::student(m);
  auto params = test_params(s, 9);
  const ParamGroup* gg = s.find(0, ParamGroup::gamma);
  const ParamGroup* bg = s.find(0, ParamGroup::beta);
  for (int64_t j = 0; j < d; ++j) params[gg->offset + j] = 0.89f + 0.001f * float(j % 5);
  const auto x = noise(B * d, 10), t = noise(B * d, 11);
  RunConfig cfg;
  cfg.model = m;
  const int base = kStatTensors;  // this pass's slots start after one other pass's
  for (NumFmt f : {NumFmt::fp32, NumFmt::bf16, NumFmt::mxfp8_e4m3}) {
    SCOPED_TRACE(name(f));
    auto be = make_cpu_backend();
    float* P = put(*be, params);
    float* X = put(*be, x);
    float* T = put(*be, t);
    float* G = be->alloc(params.size());
    Workspace ws = Workspace::make(*be, s, B);
    PassPolicy pol;
    pol.p.ln_affine = f;
    pol.collect_stats = true;
    pol.stats_base = base;
    be->reset_stats(base + kStatTensors * s.depth);
    forward(*be, s, P, X, ws, pol);
    loss_and_grad(*be, cfg.loss_spec(), T, ws, pol, nullptr);
    backward(*be, s, P, X, ws, G, pol);
    const auto gq = get(*be, ws.gq_gamma, d), bq = get(*be, ws.gq_beta, d);
    for (int64_t j = 0; j < d; ++j) {
      const float g = params[gg->offset + j], b = params[bg->offset + j];
      if (f == NumFmt::fp32) {
        EXPECT_EQ(gq[j], g);
        EXPECT_EQ(bq[j], b);
      } else if (f == NumFmt::bf16) {
        EXPECT_EQ(gq[j], round_bf16(g, pol.p.elementwise_rounding));
        EXPECT_EQ(bq[j], round_bf16(b, pol.p.elementwise_rounding));
      } else {
        EXPECT_EQ(gq[j], 0.875f);
      }
    }
    if (f == NumFmt::mxfp8_e4m3) {
      std::vector<float> want(params.begin() + bg->offset, params.begin() + bg->offset + d);
      QuantSpec q;
      q.fmt = f;
      q.seed = sr_seed(0, 14);  // layer 0, op ln_beta
      quantize_dequantize(want.data(), want.data(), 1, d, Axis::contiguous, q);
      EXPECT_EQ(bq, want);
    }
    const auto st = be->read_stats();
    ASSERT_EQ(st.size(), size_t(base + kStatTensors));
    for (int i = 0; i < base; ++i) EXPECT_EQ(st[i].n, 0u) << "slot " << i << " belongs to another pass";
    auto at = [&](StatTensor tt) { return st[base + stats_slot(0, tt)]; };
    // The gains clamp whether quantized (MX) or only diagnosed (fp32, bf16: diagnostic E4M3).
    EXPECT_EQ(at(StatTensor::gamma).n, uint64_t(d));
    EXPECT_EQ(at(StatTensor::gamma).clamped, uint64_t(d));
    EXPECT_EQ(at(StatTensor::gamma).lastbin, uint64_t(d));
    EXPECT_EQ(at(StatTensor::beta).n, uint64_t(d));
    EXPECT_EQ(at(StatTensor::ln_out).n, uint64_t(B * d));
    EXPECT_EQ(at(StatTensor::ln_out).blocks, uint64_t(B * d / 32));
    EXPECT_EQ(at(StatTensor::act_out).n, uint64_t(B * s.hidden));
    EXPECT_EQ(at(StatTensor::grad_out).n, uint64_t(B * d));
    EXPECT_EQ(at(StatTensor::grad_hidden).n, uint64_t(B * s.hidden_in));
    EXPECT_GT(at(StatTensor::ln_out).lastbin, 0u);  // floor scale: some block maxima round to 448
  }
}

// Without collect_stats no slot is touched (slots need not even exist).
TEST(ModelMx, NoStatisticsUnlessAsked) {
  const ModelConfig m = small_model(1, 32, Act::gelu);
  const NetShape s = NetShape::student(m);
  RunConfig cfg;
  cfg.model = m;
  auto be = make_cpu_backend();
  be->reset_stats(0);
  PassPolicy pol;
  const PassResult r = run_pass(*be, s, cfg, test_params(s, 1), noise(8 * 32, 2), noise(8 * 32, 3), 8, pol);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_TRUE(be->read_stats().empty());
}
