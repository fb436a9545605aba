// The curvature instrument: the largest eigenvalue of the Hessian of the
// FP32 loss on a probe batch, and of the Adam-preconditioned Hessian P^-1 H with
// P = diag(sqrt(v_hat) + eps) (Cohen et al. 2022, "Adaptive gradient methods at the edge of
// stability"), by Lanczos on the exact Hessian-vector products of lab/model/hvp.h. One object
// serves every trajectory of a run: it copies the weights, the probe batch and Adam's v into
// buffers of its own, so it holds no pointer of the caller's between measurements and
// allocates nothing after construction. lab/model/README.md ("Curvature") has the method, the
// convergence measure and the cost.
#pragma once
#include <cstdint>

#include "lab/model/backend.h"
#include "lab/model/hvp.h"
#include "lab/model/mlp.h"
#include "lab/model/model_config.h"

namespace mxlab {

struct CurvatureResult {
  double hessian_lmax = 0.0;   // largest (algebraic) eigenvalue of H
  double hessian_resid = 0.0;  // |l_k - l_{k-1}| / |l_k| of the last two Lanczos estimates (0: exact)
  double precond_lmax = 0.0;   // largest eigenvalue of P^-1 H (= hessian_* without adam_v)
  double precond_resid = 0.0;
  int iters = 0;               // Lanczos steps (= Hessian-vector products) of the Hessian solve
  int precond_iters = 0;       // of the preconditioned solve (0 without adam_v)
  double loss = 0.0;           // FP32 loss on the probe batch at the weights (from the primal pass)
};

class Curvature {
 public:
  // Allocates every buffer (floats() of them): the HVP workspace at probe_rows, 6 parameter-
  // sized vectors and a copy of the probe batch. On a backend with graph capture (CUDA) the
  // two products are recorded once and replayed, under capture keys of its own (negative,
  // unique per object: the trainer's keys are non-negative).
  Curvature(Backend& be, const NetShape& student, const LossSpec& loss, uint64_t seed, int64_t probe_rows);

  // One measurement at `params` (the flat FP32 parameters) on the probe batch x, y
  // ([probe_rows x d], backend memory). adam_v: Adam's second moment (null: no preconditioner,
  // precond_* = hessian_*), v_hat = v / bc2, P = diag(sqrt(v_hat) + eps). `iters` (>= 2)
  // Lanczos steps per eigenvalue, fewer when the Krylov space becomes invariant. The start
  // vector is N(0, 1) sample i of (seed, Stream::curvature, StepScalars.step) for parameter i,
  // the same for both solves, so a measurement is a function of (weights, batch, v, seed,
  // step) and repeats bit for bit on one backend. Synchronises (2 reductions per Lanczos step).
  CurvatureResult measure(const float* params, const float* x, const float* y, const float* adam_v, float bc2,
                          float eps, int iters, uint64_t seed);

  // The primal pass at params on (x, y), then hv = H v (for tests and tools; v, hv: backend
  // memory in the parameter layout).
  void prepare(const float* params, const float* x, const float* y);
  void hvp(const float* v, float* hv);

  const NetShape& shape() const { return s_; }
  int64_t probe_rows() const { return rows_; }
  // Floats this object allocates for a network and probe size (4 bytes each).
  static int64_t floats(const NetShape& s, int64_t probe_rows);

 private:
  struct Solve {
    double lmax = 0.0, resid = 0.0;
    int iters = 0;
  };
  // Lanczos on the operator `apply` (reads vin_, writes hout_), iters steps from the seed's vector.
  template <class Apply>
  Solve lanczos(Apply apply, int iters, uint64_t seed);
  // vin_ -> hout_: H vin_ or D H D vin_, replayed as a captured graph where the backend can.
  void apply_h();
  void apply_precond();
  void run_captured(int key, void (Curvature::*body)());
  void hvp_body();
  void precond_body();

  Backend& be_;
  NetShape s_;
  LossSpec loss_;
  uint64_t seed_;
  int64_t rows_ = 0;
  size_t n_ = 0;  // parameters
  HvpWorkspace ws_;
  float *params_, *x_, *y_;    // copies of the caller's weights and probe batch
  float *dscale_;              // P^{-1/2}
  float *vin_, *hout_, *tmp_;  // the captured product's operands: vin_ is the current Lanczos
                               //   vector, hout_ the product and then the next residual
  float *q_prev_;              // the previous Lanczos vector
  int key_h_ = 0, key_p_ = 0;    // capture keys of the two products
};

}  // namespace mxlab
