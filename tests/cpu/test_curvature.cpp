// The curvature instrument on the CPU backend (lab/model/hvp.h, lab/model/curvature.h), on
// networks small enough for a dense Hessian (L = 2, d = 6, hidden_mult 2, B = 5: 250-420
// parameters), for every activation, layernorm on / off, ln_affine on / off, fc2_bias on / off,
// MSE and KL:
//   - the dense Hessian built column by column from the FP32 Hessian-vector product (H e_i)
//     against an independent one: central differences of the gradient of a double-precision
//     reimplementation of the model written here (plain loops, analytic backward);
//   - the FP32 Hessian's symmetry;
//   - lambda_max of H (Lanczos, 20 steps) against Eigen's SelfAdjointEigenSolver in double on
//     the independent Hessian, within 1e-3 relative (the requirement), and the
//     preconditioned lambda_max(P^-1 H) against the dense eigenvalues of P^-1/2 H P^-1/2;
//   - bit-reproducible measurements, and the errors a caller can provoke.
//
// Tolerances. The reference Hessian's own error: central differences of a double gradient with
// h = 1e-6 have truncation error O(h^2 |grad^3 L|) ~ 1e-12 and cancellation error
// O(eps_double |g| / h) ~ 1e-10, both far below the FP32 product's. The FP32 product: every
// GEMM output is within gamma_K = K u (u = 2^-24) of the exact one relative to sum |a_k b_k|,
// K <= max(B, d, H1); element-wise ops add a few ulps (det_* transcendentals <= 1.5 ulp). A
// column of H v passes through at most 6L + 2 such stages in sequence (per layer: R{h}, R{o}
// forward; R{da}, R{dh}, R{dy}, R{dx} backward; the loss Hessian and the final weight-gradient
// GEMM), and every tangent op sums two terms that may cancel, which we allow for with a
// factor 4: budget = 4 (6L + 2) K u, as a relative Frobenius-norm error of the whole matrix
// (entrywise bounds would need |H| |v| terms the product does not expose). The asymmetry
// H - H^T of the FP32 matrix is the difference of two such errors: 2 x budget.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lab/config/config.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/curvature.h"
#include "lab/model/elementwise.h"
#include "lab/model/hvp.h"
#include "lab/model/mlp.h"
#include "tests/cpu/model_reference.h"

using namespace mxlab;
using namespace mxlab::test;

namespace {

constexpr int64_t kBatch = 5;
constexpr int kIters = 20;          // the default log.curvature_iters
constexpr double kLambdaRel = 1e-3;  // lambda_max within 1e-3 relative
constexpr double kFdStep = 1e-6;

struct Case {
  std::string label;
  Act act = Act::gelu;
  bool ln = true, affine = true, bias = true;
  LossKind loss = LossKind::mse;
};

RunConfig case_config(const Case& c) {
  RunConfig cfg;
  cfg.model.depth = 2;
  cfg.model.width = 6;
  cfg.model.hidden_mult = 2;
  cfg.model.activation = c.act;
  cfg.model.layernorm = c.ln;
  cfg.model.ln_affine = c.affine;
  cfg.model.fc2_bias = c.bias;
  cfg.loss = c.loss;
  cfg.kl_temperature = 1.5f;
  return cfg;
}

// Initial parameters with gamma, beta and b2 moved off 1 / 0 (every path carries a value), and
// the weights scaled up so that the activations' curvature matters.
std::vector<float> case_params(const NetShape& s, uint64_t seed) {
  std::vector<float> p = init_params(s, InitKind::pytorch, 1.0f, seed, Stream::init);
  for (const ParamGroup& g : s.groups) {
    const auto n = noise(static_cast<size_t>(g.size()), seed * 131 + static_cast<uint64_t>(g.offset));
    for (int64_t i = 0; i < g.size(); ++i) {
      float& v = p[static_cast<size_t>(g.offset + i)];
      if (g.kind == ParamGroup::gamma) v = 1.0f + 0.3f * n[i];
      if (g.kind == ParamGroup::beta || g.kind == ParamGroup::b2) v = 0.2f * n[i];
      if (g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2) v *= 2.0f;
    }
  }
  return p;
}

// ---- the independent reference: the model and its gradient in double, plain loops --------

struct RefPass {
  double loss = 0;
  std::vector<double> grad;
};

// Loss and gradient of the student in double (lab/model/README.md's model, exact arithmetic
// up to double rounding).
RefPass ref_pass(const NetShape& s, const RunConfig& cfg, const std::vector<double>& P, const std::vector<double>& X,
                 const std::vector<double>& Y, int64_t B) {
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in, L = s.depth;
  const bool sw = s.act == Act::swiglu;
  auto W = [&](int k, ParamGroup::Kind kind) -> const double* {
    const ParamGroup* g = s.find(k, kind);
    return g ? P.data() + g->offset : nullptr;
  };
  std::vector<std::vector<double>> A(L + 1), xh(L), rs(L), y(L), h(L), a(L);
  A[0] = X;
  for (int k = 0; k < L; ++k) {
    xh[k].assign(B * d, 0);
    rs[k].assign(B, 0);
    y[k] = A[k];
    if (s.layernorm) {
      for (int64_t i = 0; i < B; ++i) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < d; ++j) mean += A[k][i * d + j] / d;
        for (int64_t j = 0; j < d; ++j) var += (A[k][i * d + j] - mean) * (A[k][i * d + j] - mean) / d;
        rs[k][i] = 1 / std::sqrt(var + static_cast<double>(s.ln_eps));
        for (int64_t j = 0; j < d; ++j) {
          xh[k][i * d + j] = (A[k][i * d + j] - mean) * rs[k][i];
          y[k][i * d + j] = s.ln_affine ? xh[k][i * d + j] * W(k, ParamGroup::gamma)[j] + W(k, ParamGroup::beta)[j]
                                        : xh[k][i * d + j];
        }
      }
    }
    h[k].assign(B * H1, 0);
    a[k].assign(B * H, 0);
    const double* W1 = W(k, ParamGroup::w1);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H1; ++j)
        for (int64_t c = 0; c < d; ++c) h[k][i * H1 + j] += y[k][i * d + c] * W1[j * d + c];
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H; ++j)
        a[k][i * H + j] = sw ? h[k][i * H1 + j] * silu_d(h[k][i * H1 + H + j]) : act_d(s.act, h[k][i * H1 + j]);
    A[k + 1] = A[k];
    const double* W2 = W(k, ParamGroup::w2);
    const double* b2 = W(k, ParamGroup::b2);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t c = 0; c < d; ++c) {
        double o = b2 ? b2[c] : 0;
        for (int64_t j = 0; j < H; ++j) o += a[k][i * H + j] * W2[c * H + j];
        A[k + 1][i * d + c] += o;
      }
  }
  RefPass r;
  r.grad.assign(P.size(), 0);
  std::vector<double> gA(B * d);
  const std::vector<double>& out = A[L];
  if (cfg.loss == LossKind::mse) {
    const double n = static_cast<double>(B * d);
    for (int64_t i = 0; i < B * d; ++i) {
      r.loss += (out[i] - Y[i]) * (out[i] - Y[i]) / n;
      gA[i] = 2 * (out[i] - Y[i]) / n;
    }
  } else {
    const double T = cfg.kl_temperature;
    for (int64_t i = 0; i < B; ++i) {
      auto softmax = [&](const std::vector<double>& z) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < d; ++j) m = std::max(m, z[i * d + j] / T);
        for (int64_t j = 0; j < d; ++j) sum += std::exp(z[i * d + j] / T - m);
        std::vector<double> p(d);
        for (int64_t j = 0; j < d; ++j) p[j] = std::exp(z[i * d + j] / T - m) / sum;
        return p;
      };
      const auto p = softmax(Y), q = softmax(out);
      for (int64_t j = 0; j < d; ++j) {
        r.loss += p[j] * (std::log(p[j]) - std::log(q[j])) / B;
        gA[i * d + j] = (q[j] - p[j]) / (T * B);
      }
    }
  }
  auto G = [&](int k, ParamGroup::Kind kind) -> double* {
    const ParamGroup* g = s.find(k, kind);
    return g ? r.grad.data() + g->offset : nullptr;
  };
  for (int k = L - 1; k >= 0; --k) {
    const double* W1 = W(k, ParamGroup::w1);
    const double* W2 = W(k, ParamGroup::w2);
    if (double* gb = G(k, ParamGroup::b2))
      for (int64_t i = 0; i < B; ++i)
        for (int64_t c = 0; c < d; ++c) gb[c] += gA[i * d + c];
    double* gW2 = G(k, ParamGroup::w2);
    std::vector<double> ga(B * H, 0), gh(B * H1, 0), gy(B * d, 0);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t c = 0; c < d; ++c)
        for (int64_t j = 0; j < H; ++j) {
          gW2[c * H + j] += gA[i * d + c] * a[k][i * H + j];
          ga[i * H + j] += gA[i * d + c] * W2[c * H + j];
        }
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H; ++j) {
        if (sw) {
          const double u = h[k][i * H1 + j], g = h[k][i * H1 + H + j];
          gh[i * H1 + j] = ga[i * H + j] * silu_d(g);
          gh[i * H1 + H + j] = ga[i * H + j] * u * silu1_d(g);
        } else {
          gh[i * H1 + j] = ga[i * H + j] * act1_d(s.act, h[k][i * H1 + j]);
        }
      }
    double* gW1 = G(k, ParamGroup::w1);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < H1; ++j)
        for (int64_t c = 0; c < d; ++c) {
          gW1[j * d + c] += gh[i * H1 + j] * y[k][i * d + c];
          gy[i * d + c] += gh[i * H1 + j] * W1[j * d + c];
        }
    if (!s.layernorm) {
      for (int64_t i = 0; i < B * d; ++i) gA[i] += gy[i];
      continue;
    }
    const double* gam = W(k, ParamGroup::gamma);
    if (s.ln_affine)
      for (int64_t i = 0; i < B; ++i)
        for (int64_t c = 0; c < d; ++c) {
          G(k, ParamGroup::gamma)[c] += gy[i * d + c] * xh[k][i * d + c];
          G(k, ParamGroup::beta)[c] += gy[i * d + c];
        }
    for (int64_t i = 0; i < B; ++i) {
      std::vector<double> g(d);
      double mg = 0, mgx = 0;
      for (int64_t c = 0; c < d; ++c) {
        g[c] = gam ? gy[i * d + c] * gam[c] : gy[i * d + c];
        mg += g[c] / d;
        mgx += g[c] * xh[k][i * d + c] / d;
      }
      for (int64_t c = 0; c < d; ++c) gA[i * d + c] += rs[k][i] * (g[c] - mg - xh[k][i * d + c] * mgx);
    }
  }
  return r;
}

// Central differences of the reference gradient: column i = (g(P + h e_i) - g(P - h e_i)) / 2h.
Eigen::MatrixXd reference_hessian(const NetShape& s, const RunConfig& cfg, const std::vector<float>& params,
                                  const std::vector<float>& x, const std::vector<float>& y) {
  const std::vector<double> P(params.begin(), params.end()), X(x.begin(), x.end()), Y(y.begin(), y.end());
  const int64_t n = static_cast<int64_t>(P.size());
  Eigen::MatrixXd H(n, n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> Pp = P, Pm = P;
    Pp[i] += kFdStep;
    Pm[i] -= kFdStep;
    const auto gp = ref_pass(s, cfg, Pp, X, Y, kBatch).grad, gm = ref_pass(s, cfg, Pm, X, Y, kBatch).grad;
    for (int64_t r = 0; r < n; ++r) H(r, i) = (gp[r] - gm[r]) / (2 * kFdStep);
  }
  return H;
}

// The dense FP32 Hessian from the product, column by column.
Eigen::MatrixXd product_hessian(Backend& be, Curvature& c, int64_t n) {
  float* v = be.alloc(static_cast<size_t>(n));
  float* hv = be.alloc(static_cast<size_t>(n));
  Eigen::MatrixXd H(n, n);
  std::vector<float> col(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    be.fill(v, 0.0f, static_cast<size_t>(n));
    be.fill(v + i, 1.0f, 1);
    c.hvp(v, hv);
    be.download(col.data(), hv, col.size());
    for (int64_t r = 0; r < n; ++r) H(r, i) = col[static_cast<size_t>(r)];
  }
  return H;
}

double hvp_budget(const NetShape& s, int64_t B) {
  const double u = std::ldexp(1.0, -24);
  const int64_t K = std::max<int64_t>({B, s.d, s.hidden_in});
  return 4.0 * (6 * s.depth + 2) * static_cast<double>(K) * u;
}

double top_eigenvalue(const Eigen::MatrixXd& M) {
  const Eigen::MatrixXd sym = 0.5 * (M + M.transpose());
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(sym, Eigen::EigenvaluesOnly);
  return es.eigenvalues().maxCoeff();
}

// Adam's second moment for the preconditioned check: positive, spread over four decades.
std::vector<float> adam_v(size_t n) {
  const auto z = noise(n, 77);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 1e-6f * std::pow(10.0f, 2.0f * std::tanh(z[i]));
  return v;
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.label);
  const RunConfig cfg = case_config(c);
  const NetShape s = NetShape::student(cfg.model);
  const int64_t n = s.num_params, d = s.d;
  const auto params = case_params(s, 3);
  const auto x = noise(static_cast<size_t>(kBatch * d), 4), y = noise(static_cast<size_t>(kBatch * d), 5);
  auto be = make_cpu_backend();
  Curvature curv(*be, s, cfg.loss_spec(), cfg.seed, kBatch);
  float* P = put(*be, params);
  float* X = put(*be, x);
  float* Y = put(*be, y);
  curv.prepare(P, X, Y);
  const Eigen::MatrixXd H32 = product_hessian(*be, curv, n);
  const Eigen::MatrixXd Href = reference_hessian(s, cfg, params, x, y);
  ASSERT_TRUE(H32.allFinite());
  ASSERT_GT(Href.norm(), 0.0);
  const double budget = hvp_budget(s, kBatch);
  const double err = (H32 - Href).norm() / Href.norm();
  const double asym = (H32 - H32.transpose()).norm() / H32.norm();
  // Every group's block of columns must be exercised: no parameter with a zero Hessian column.
  for (const ParamGroup& g : s.groups) EXPECT_GT(Href.middleCols(g.offset, g.size()).norm(), 0.0) << g.name;

  const float bc2 = 0.3f, eps = 1e-8f;
  const auto v = adam_v(static_cast<size_t>(n));
  float* V = put(*be, v);
  const CurvatureResult r = curv.measure(P, X, Y, V, bc2, eps, kIters, 9);
  const double lref = top_eigenvalue(Href);
  Eigen::VectorXd D(n);
  for (int64_t i = 0; i < n; ++i)
    D(i) = 1.0 / std::sqrt(std::sqrt(static_cast<double>(v[i]) / bc2) + static_cast<double>(eps));
  const double pref = top_eigenvalue(D.asDiagonal() * (0.5 * (Href + Href.transpose())) * D.asDiagonal());
  std::printf("[curvature %s] P=%lld |H32-Href|/|Href| %.3g (budget %.3g) asym %.3g  lmax %.6g ref %.6g rel %.2g "
              "resid %.2g  precond %.6g ref %.6g rel %.2g resid %.2g\n",
              c.label.c_str(), static_cast<long long>(n), err, budget, asym, r.hessian_lmax, lref,
              std::fabs(r.hessian_lmax - lref) / std::fabs(lref), r.hessian_resid, r.precond_lmax, pref,
              std::fabs(r.precond_lmax - pref) / std::fabs(pref), r.precond_resid);
  EXPECT_LE(err, budget);
  EXPECT_LE(asym, 2 * budget);
  EXPECT_EQ(r.iters, kIters);
  EXPECT_EQ(r.precond_iters, kIters);
  EXPECT_LE(std::fabs(r.hessian_lmax - lref), kLambdaRel * std::fabs(lref));
  EXPECT_LE(std::fabs(r.precond_lmax - pref), kLambdaRel * std::fabs(pref));
  EXPECT_TRUE(std::isfinite(r.hessian_resid) && std::isfinite(r.precond_resid));
  EXPECT_GT(r.loss, 0.0);
}

}  // namespace

TEST(Curvature, DenseHessianGeluLayernormAffineBias) { check_case({"gelu ln affine bias mse", Act::gelu}); }
TEST(Curvature, DenseHessianRelu) { check_case({"relu ln affine bias mse", Act::relu}); }
TEST(Curvature, DenseHessianGeluTanh) { check_case({"gelu_tanh ln affine bias mse", Act::gelu_tanh}); }
TEST(Curvature, DenseHessianSwiglu) { check_case({"swiglu ln affine bias mse", Act::swiglu}); }
TEST(Curvature, DenseHessianLinear) { check_case({"linear ln affine bias mse", Act::linear}); }
TEST(Curvature, DenseHessianLayernormWithoutAffine) {
  check_case({"gelu ln no-affine bias mse", Act::gelu, true, false, true});
}
TEST(Curvature, DenseHessianNoLayernormNoBias) { check_case({"gelu no-ln no-bias mse", Act::gelu, false, false, false}); }
TEST(Curvature, DenseHessianNoLayernormSwiglu) { check_case({"swiglu no-ln bias mse", Act::swiglu, false, false, true}); }
TEST(Curvature, DenseHessianAffineNoBias) { check_case({"gelu_tanh ln affine no-bias mse", Act::gelu_tanh, true, true, false}); }
TEST(Curvature, DenseHessianKlLoss) { check_case({"gelu ln affine bias kl", Act::gelu, true, true, true, LossKind::kl}); }
TEST(Curvature, DenseHessianKlSwigluNoAffine) {
  check_case({"swiglu ln no-affine no-bias kl", Act::swiglu, true, false, false, LossKind::kl});
}

TEST(Curvature, MeasurementsRepeatBitForBitAndWithoutPreconditionerCopyTheHessian) {
  Case c{"repeat", Act::gelu};
  const RunConfig cfg = case_config(c);
  const NetShape s = NetShape::student(cfg.model);
  auto be = make_cpu_backend();
  Curvature curv(*be, s, cfg.loss_spec(), cfg.seed, kBatch);
  float* P = put(*be, case_params(s, 3));
  float* X = put(*be, noise(static_cast<size_t>(kBatch * s.d), 4));
  float* Y = put(*be, noise(static_cast<size_t>(kBatch * s.d), 5));
  float* V = put(*be, adam_v(static_cast<size_t>(s.num_params)));
  const CurvatureResult a = curv.measure(P, X, Y, V, 0.3f, 1e-8f, 8, 1);
  const CurvatureResult b = curv.measure(P, X, Y, V, 0.3f, 1e-8f, 8, 1);
  EXPECT_EQ(a.hessian_lmax, b.hessian_lmax);
  EXPECT_EQ(a.precond_lmax, b.precond_lmax);
  EXPECT_EQ(a.hessian_resid, b.hessian_resid);
  const CurvatureResult other = curv.measure(P, X, Y, V, 0.3f, 1e-8f, 8, 2);  // another start vector
  EXPECT_NE(a.hessian_lmax, other.hessian_lmax);
  const CurvatureResult h = curv.measure(P, X, Y, nullptr, 1.0f, 1e-8f, 8, 1);
  EXPECT_EQ(h.hessian_lmax, a.hessian_lmax);
  EXPECT_EQ(h.precond_lmax, h.hessian_lmax);
  EXPECT_EQ(h.precond_resid, h.hessian_resid);
  EXPECT_EQ(h.precond_iters, 0);
  EXPECT_NE(a.precond_lmax, a.hessian_lmax);
}

TEST(Curvature, ProductCountsItsGemms) {
  // Per layer 12 GEMMs; layer 0 without LN affine skips R{y_0} W1^T, dh^T R{y_0} and R{dy_0}'s two.
  RunConfig cfg = case_config({"", Act::gelu});
  EXPECT_EQ(hvp_gemms(NetShape::student(cfg.model)), 24);
  cfg.model.ln_affine = false;
  EXPECT_EQ(hvp_gemms(NetShape::student(cfg.model)), 20);
  cfg.model.layernorm = false;
  EXPECT_EQ(hvp_gemms(NetShape::student(cfg.model)), 20);
}

TEST(Curvature, RejectsBadArguments) {
  const RunConfig cfg = case_config({"", Act::gelu});
  const NetShape s = NetShape::student(cfg.model);
  auto be = make_cpu_backend();
  EXPECT_THROW(Curvature(*be, s, cfg.loss_spec(), cfg.seed, 0), Error);
  Curvature curv(*be, s, cfg.loss_spec(), cfg.seed, kBatch);
  float* P = put(*be, case_params(s, 3));
  float* X = put(*be, noise(static_cast<size_t>(kBatch * s.d), 4));
  try {
    curv.measure(P, X, X, nullptr, 1.0f, 1e-8f, 1, 0);
    FAIL() << "iters = 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("curvature_iters"), std::string::npos) << e.what();
  }
  float* V = put(*be, adam_v(static_cast<size_t>(s.num_params)));
  EXPECT_THROW(curv.measure(P, X, X, V, 0.0f, 1e-8f, 4, 0), Error);
  // The teacher shape (no residual stream) is not a student.
  EXPECT_THROW(Curvature(*be, NetShape::teacher(cfg.model, cfg.teacher), cfg.loss_spec(), cfg.seed, kBatch), Error);
}
