// Exact Hessian-vector products of the student's FP32 loss (the curvature instrument), written once
// against the Backend interface like forward/backward in mlp.h: Pearlmutter's R-operator
// (forward-over-reverse). hvp_prepare runs the primal pass once at the weights (forward, loss,
// and the chain of input gradients, saved per layer); each hvp_apply then runs a tangent
// forward and a tangent backward through those saved activations. Everything is FP32: GEMMs
// are IEEE SGEMM (TF32 off), element-wise ops are never rounded, whatever the trajectory's
// precision policy. The derivation (the tangent of every op) is in lab/model/README.md.
#pragma once
#include <cstdint>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/model/model_config.h"

namespace mxlab {

// Buffers of the primal pass and of the tangent passes at batch B (allocated once).
struct HvpWorkspace {
  int64_t batch = 0;
  Workspace primal;           // forward activations at the weights (mlp.h), out, dout, loss
  // Saved primal backward, per layer k (dL/d of each tensor):
  std::vector<float*> gA;     // [L] gradient of A_{k+1}, the stream leaving block k [B x d] (gA[L-1] = dout)
  std::vector<float*> gy;     // [L] gradient of y_k, the W1 input                [B x d]
  std::vector<float*> ga;     // [L] gradient of a_k                             [B x H]
  std::vector<float*> gh;     // [L] gradient of h_k                             [B x H1]
  // Tangents R{.} of one product:
  std::vector<float*> rA;     // [L+1] R{A_k}, rA[0] = zeros (the input does not move), rA[L] = R{out}
  std::vector<float*> rxhat;  // [L] R{xhat_k} (LN only; rxhat[0] unused: zero)  [B x d]
  std::vector<float*> ry;     // [L] R{y_k} (aliases rxhat / rA without affine / LN) [B x d]
  std::vector<float*> rh;     // [L]                                              [B x H1]
  std::vector<float*> ra;     // [L]                                              [B x H]
  float* rdA = nullptr;       // R{gradient of the stream}                       [B x d]
  float* rdy = nullptr;       //                                                 [B x d]
  float* rdx = nullptr;       //                                                 [B x d]
  float* rda = nullptr;       //                                                 [B x H]
  float* rdh = nullptr;       //                                                 [B x H1]
  float* ro = nullptr;        // R{W2 branch output}                              [B x d]
  float* col = nullptr;       // a second column sum (R{dgamma})                 [d]
  static HvpWorkspace make(Backend& be, const NetShape& s, int64_t batch);
  // Floats the workspace holds (memory planning: 4 bytes each).
  static int64_t floats(const NetShape& s, int64_t batch);
};

// GEMMs of one hvp_apply: 4 per layer forward, 8 per layer backward, less the ones that act on
// a tangent known to be zero (layer 0's input and, without LN affine, its W1 input) and the
// input gradient of layer 0 (not needed). A forward + backward of mlp.h runs 6 per layer.
int hvp_gemms(const NetShape& s);

// The primal pass at `params` on (x [B x d], target [B x d]): forward, loss (into
// ws.primal.loss[0]), dout and the per-layer input gradients. Throws mxlab::Error for a
// configuration the product does not support.
void hvp_prepare(Backend& be, const NetShape& s, const LossSpec& loss, uint64_t seed, const float* params, const float* x,
                 const float* target, HvpWorkspace& ws);

// hv = H v, H the Hessian of the FP32 loss with respect to the flat parameters, at the point of
// the last hvp_prepare (same params). v and hv have the parameter layout; every group of hv is
// written. Asynchronous like the ops it issues (no synchronisation, no allocation).
void hvp_apply(Backend& be, const NetShape& s, const LossSpec& loss, uint64_t seed, const float* params, const float* v, float* hv,
               HvpWorkspace& ws);

}  // namespace mxlab
