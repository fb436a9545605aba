// Optimizer kernels (see optim.cuh): one thread per four parameters (float4 when aligned),
// each element updated by the same adam_scalar / sgd_scalar the CPU backend calls.
#include "kernels/optim.cuh"

#include "kernels/launch_util.cuh"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

struct AdamArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  float beta1, beta2, eps, wd;
  bool decoupled;
};

__global__ void __launch_bounds__(kBlock) adam_kernel(AdamArgs a, bool vec, const StepScalars* d_step) {
  const float lr = d_step->lr, bc1 = d_step->bc1, bc2 = d_step->bc2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = vec ? a.n / 4 : 0;
  for (int64_t i = t; i < nvec; i += stride) {
    float4 p = reinterpret_cast<const float4*>(a.p)[i];
    const float4 g = reinterpret_cast<const float4*>(a.g)[i];
    float4 m = reinterpret_cast<const float4*>(a.m)[i];
    float4 v = reinterpret_cast<const float4*>(a.v)[i];
    adam_scalar(p.x, g.x, m.x, v.x, lr, bc1, bc2, a.beta1, a.beta2, a.eps, a.wd, a.decoupled);
    adam_scalar(p.y, g.y, m.y, v.y, lr, bc1, bc2, a.beta1, a.beta2, a.eps, a.wd, a.decoupled);
    adam_scalar(p.z, g.z, m.z, v.z, lr, bc1, bc2, a.beta1, a.beta2, a.eps, a.wd, a.decoupled);
    adam_scalar(p.w, g.w, m.w, v.w, lr, bc1, bc2, a.beta1, a.beta2, a.eps, a.wd, a.decoupled);
    reinterpret_cast<float4*>(a.p)[i] = p;
    reinterpret_cast<float4*>(a.m)[i] = m;
    reinterpret_cast<float4*>(a.v)[i] = v;
  }
  for (int64_t i = nvec * 4 + t; i < a.n; i += stride)
    adam_scalar(a.p[i], a.g[i], a.m[i], a.v[i], lr, bc1, bc2, a.beta1, a.beta2, a.eps, a.wd, a.decoupled);
}

__global__ void __launch_bounds__(kBlock) sgd_kernel(float* p, const float* g, float* buf, int64_t n, float momentum,
                                                     float wd, const StepScalars* d_step) {
  const float lr = d_step->lr;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float unused = 0.0f;
    sgd_scalar(p[i], g[i], buf ? buf[i] : unused, lr, momentum, wd);
  }
}

}  // namespace

void launch_adam(float* p, const float* g, float* m, float* v, int64_t n, const Backend::AdamHyper& h,
                 const StepScalars* d_step, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
  const AdamArgs a{p, g, m, v, n, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled};
  const int64_t items = vec ? std::max<int64_t>(n / 4, n % 4) : n;
  adam_kernel<<<grid_for(items), kBlock, 0, s>>>(a, vec, d_step);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_sgd(float* p, const float* g, float* buf, int64_t n, float momentum, float weight_decay,
                const StepScalars* d_step, cudaStream_t s) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kBlock, 0, s>>>(p, g, buf, n, momentum, weight_decay, d_step);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
