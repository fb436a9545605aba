// The curvature instrument (see curvature.h): Lanczos on the exact Hessian-vector product of
// hvp.h, for H and for the Adam-preconditioned D H D (D = P^{-1/2}). Vectors stay in backend
// memory; the recurrence's scalars (alpha, beta) come back from Backend::reduce (fixed order,
// double) and the Ritz values are computed on the host in double.
#include "lab/model/curvature.h"

#include <Eigen/Eigenvalues>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "lab/core/error.h"

namespace mxlab {

namespace {

// Lanczos stops early when the residual norm beta falls below this fraction of the largest
// |alpha| or beta so far: the Krylov space is then invariant up to the FP32 noise of the
// product (about 1e-6 relative), and the Ritz value is as exact as the product.
constexpr double kBreakdown = 1.0 / (1 << 20);

// Capture keys of the products: negative (the trainer's are >= 0), two per object.
std::atomic<int> next_key{-1000};

double nan_value() { return std::numeric_limits<double>::quiet_NaN(); }

// Largest eigenvalue of the symmetric tridiagonal matrix (alpha on the diagonal, beta beside).
double top_ritz(const std::vector<double>& alpha, const std::vector<double>& beta) {
  const Eigen::Index k = static_cast<Eigen::Index>(alpha.size());
  Eigen::VectorXd diag(k), sub(std::max<Eigen::Index>(k - 1, 0));
  for (Eigen::Index i = 0; i < k; ++i) diag(i) = alpha[static_cast<size_t>(i)];
  for (Eigen::Index i = 0; i + 1 < k; ++i) sub(i) = beta[static_cast<size_t>(i)];
  if (k == 1) return diag(0);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es;
  es.computeFromTridiagonal(diag, sub, Eigen::EigenvaluesOnly);
  return es.eigenvalues()(k - 1);  // ascending
}

}  // namespace

int64_t Curvature::floats(const NetShape& s, int64_t probe_rows) {
  return HvpWorkspace::floats(s, probe_rows) + 6 * s.num_params + 2 * probe_rows * s.d;
}

Curvature::Curvature(Backend& be, const NetShape& student, const LossSpec& loss, uint64_t seed, int64_t probe_rows)
    : be_(be), s_(student), loss_(loss), seed_(seed), rows_(probe_rows) {
  if (probe_rows <= 0) throw Error(msg("log.probe_batch must be positive (got ", probe_rows, ")"));
  if (!student.residual) throw Error("curvature: Hessian-vector products are implemented for the residual student only");
  n_ = static_cast<size_t>(s_.num_params);
  ws_ = HvpWorkspace::make(be_, s_, rows_);
  for (float** p : {&params_, &dscale_, &vin_, &hout_, &tmp_, &q_prev_}) *p = be_.alloc(n_);
  x_ = be_.alloc(static_cast<size_t>(rows_ * s_.d));
  y_ = be_.alloc(static_cast<size_t>(rows_ * s_.d));
  key_h_ = next_key.fetch_sub(2);
  key_p_ = key_h_ - 1;
}

void Curvature::prepare(const float* params, const float* x, const float* y) {
  MXLAB_ASSERT(params && x && y, "curvature: null parameters or probe batch");
  be_.copy(params_, params, n_);
  be_.copy(x_, x, static_cast<size_t>(rows_ * s_.d));
  be_.copy(y_, y, static_cast<size_t>(rows_ * s_.d));
  hvp_prepare(be_, s_, loss_, seed_, params_, x_, y_, ws_);
}

void Curvature::hvp(const float* v, float* hv) {
  be_.copy(vin_, v, n_);
  run_captured(key_h_, &Curvature::hvp_body);
  be_.copy(hv, hout_, n_);
}

void Curvature::hvp_body() { hvp_apply(be_, s_, loss_, seed_, params_, vin_, hout_, ws_); }

// D H D vin_ with D = P^{-1/2} = dscale_.
void Curvature::precond_body() {
  be_.mul(tmp_, vin_, dscale_, n_);
  hvp_apply(be_, s_, loss_, seed_, params_, tmp_, hout_, ws_);
  be_.mul(hout_, hout_, dscale_, n_);
}

void Curvature::run_captured(int key, void (Curvature::*body)()) {
  if (be_.replay(key)) return;
  const bool recording = be_.begin_capture(key);
  (this->*body)();
  be_.end_capture(key);
  if (recording) be_.replay(key);
}

// Lanczos with one step of local re-orthogonalisation: vin_ holds q_j, hout_ the product and
// then the residual w; beta_j = |w|, q_{j+1} = w / beta_j. No full re-orthogonalisation (it
// would store every q): lost orthogonality only adds copies of converged Ritz values, it does
// not move the largest one, which is all this instrument reads.
template <class Apply>
Curvature::Solve Curvature::lanczos(Apply apply, int iters, uint64_t seed) {
  Solve out;
  out.lmax = out.resid = nan_value();
  be_.randn(vin_, n_, seed, Stream::curvature, 1.0f);
  double nn = 0.0;
  const Reduction norm0{Reduction::dot, vin_, vin_, static_cast<int64_t>(n_)};
  be_.reduce(&norm0, 1, &nn);
  if (!(nn > 0.0) || !std::isfinite(nn)) return out;
  be_.axpby(vin_, vin_, static_cast<float>(1.0 / std::sqrt(nn)), 0.0f, n_);
  std::vector<double> alpha, beta;
  double prev = nan_value(), scale = 0.0;
  for (int j = 0; j < iters; ++j) {
    apply();  // hout_ = A q_j
    if (j > 0) be_.axpby(hout_, q_prev_, static_cast<float>(-beta.back()), 1.0f, n_);
    double a = 0.0;
    const Reduction ra{Reduction::dot, hout_, vin_, static_cast<int64_t>(n_)};
    be_.reduce(&ra, 1, &a);
    be_.axpby(hout_, vin_, static_cast<float>(-a), 1.0f, n_);
    // What FP32 left of w along q_j and q_{j-1}: remove it, and get |w|^2 in the same call.
    const Reduction rr[3] = {{Reduction::dot, hout_, hout_, static_cast<int64_t>(n_)},
                             {Reduction::dot, hout_, vin_, static_cast<int64_t>(n_)},
                             {Reduction::dot, hout_, q_prev_, static_cast<int64_t>(n_)}};
    double r[3] = {0.0, 0.0, 0.0};
    be_.reduce(rr, j > 0 ? 3 : 2, r);
    if (j == 0) r[2] = 0.0;
    be_.axpby(hout_, vin_, static_cast<float>(-r[1]), 1.0f, n_);
    if (j > 0) be_.axpby(hout_, q_prev_, static_cast<float>(-r[2]), 1.0f, n_);
    a += r[1];
    const double b = std::sqrt(std::max(r[0] - r[1] * r[1] - r[2] * r[2], 0.0));
    alpha.push_back(a);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      out.lmax = out.resid = nan_value();
      out.iters = j + 1;
      return out;
    }
    const double l = top_ritz(alpha, beta);
    out.lmax = l;
    out.iters = j + 1;
    out.resid = j > 0 ? std::fabs(l - prev) / std::fabs(l) : nan_value();
    prev = l;
    scale = std::max({scale, std::fabs(a), b});
    if (b <= kBreakdown * scale) {  // invariant subspace: the Ritz values are exact
      out.resid = 0.0;
      break;
    }
    if (j + 1 == iters) break;
    beta.push_back(b);
    be_.copy(q_prev_, vin_, n_);
    be_.axpby(vin_, hout_, static_cast<float>(1.0 / b), 0.0f, n_);
  }
  return out;
}

CurvatureResult Curvature::measure(const float* params, const float* x, const float* y, const float* adam_v, float bc2,
                                   float eps, int iters, uint64_t seed) {
  if (iters < 2) throw Error(msg("log.curvature_iters must be at least 2 (got ", iters, ")"));
  if (adam_v && !(bc2 > 0.0f)) throw Error(msg("curvature: Adam bias correction bc2 must be positive (got ", bc2, ")"));
  prepare(params, x, y);
  CurvatureResult res;
  res.loss = be_.read_scalar(ws_.primal.loss);
  const Solve h = lanczos([this] { run_captured(key_h_, &Curvature::hvp_body); }, iters, seed);
  res.hessian_lmax = h.lmax;
  res.hessian_resid = h.resid;
  res.iters = h.iters;
  if (!adam_v) {
    res.precond_lmax = h.lmax;
    res.precond_resid = h.resid;
    return res;
  }
  be_.precond_isqrt(adam_v, dscale_, n_, bc2, eps);
  const Solve p = lanczos([this] { run_captured(key_p_, &Curvature::precond_body); }, iters, seed);
  res.precond_lmax = p.lmax;
  res.precond_resid = p.resid;
  res.precond_iters = p.iters;
  return res;
}

}  // namespace mxlab
