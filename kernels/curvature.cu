// Curvature kernels of the CUDA backend (see curvature.cuh). Element-wise ops are grid-stride
// loops of one element per thread calling the shared scalar code (no float4 path: these ops
// are a small share of a Hessian-vector product, whose cost is its GEMMs). Row ops (layernorm
// tangent, KL tangent) use one warp per row with the lane order of layernorm.cu's scalar path.
#include "kernels/curvature.cuh"

#include "kernels/launch_util.cuh"
#include "lab/model/instrument_elementwise.h"

namespace mxlab::cuda {

namespace {

constexpr int kRowsPerBlock = 4;  // warps per block of the row kernels, one row each

template <class F>
__global__ void __launch_bounds__(kBlock) each_kernel(F f, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

template <class F>
void launch_each(const F& f, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  each_kernel<<<grid_for(n), kBlock, 0, s>>>(f, n);
  MXLAB_CUDA_LAUNCH_CHECK();
}

// Element i of a swiglu output (rows, cols) reads u = h[r, c] and g = h[r, cols + c].
struct SwigluPair {
  int64_t u, g;
};
__device__ SwigluPair swiglu_pair(int64_t i, int64_t cols) {
  const int64_t r = i / cols, u = r * 2 * cols + (i - r * cols);
  return SwigluPair{u, u + cols};
}

struct ActJvp {
  Act act;
  const float* h;
  const float* rh;
  float* ra;
  int64_t cols;
  __device__ void operator()(int64_t i) const {
    if (act == Act::swiglu) {
      const SwigluPair p = swiglu_pair(i, cols);
      ra[i] = swiglu_jvp_elem(h[p.u], h[p.g], rh[p.u], rh[p.g]);
    } else {
      ra[i] = act_jvp_elem(act, h[i], rh[i]);
    }
  }
};

struct ActBwdTangent {
  Act act;
  const float* h;
  const float* rh;
  const float* da;
  const float* rda;
  float* rdh;
  int64_t cols;
  __device__ void operator()(int64_t i) const {
    if (act == Act::swiglu) {
      const SwigluPair p = swiglu_pair(i, cols);
      swiglu_bwd_tangent_elem(h[p.u], h[p.g], rh[p.u], rh[p.g], da[i], rda[i], rdh[p.u], rdh[p.g]);
    } else {
      rdh[i] = act_bwd_tangent_elem(act, h[i], rh[i], da[i], rda[i]);
    }
  }
};

struct LnAffineTangent {
  const float* rxhat;
  const float* xhat;
  const float* gamma;
  const float* vgamma;
  const float* vbeta;
  float* ry;
  int64_t d;
  __device__ void operator()(int64_t i) const {
    const int64_t j = i % d;
    ry[i] = ln_affine_tangent_elem(rxhat ? rxhat[i] : 0.0f, xhat[i], gamma[j], vgamma[j], vbeta[j]);
  }
};

struct Axpby {
  float* y;
  const float* x;
  float a, b;
  __device__ void operator()(int64_t i) const { y[i] = axpby_elem(x[i], y[i], a, b); }
};

struct Mul {
  float* dst;
  const float* a;
  const float* b;
  __device__ void operator()(int64_t i) const { dst[i] = a[i] * b[i]; }
};

struct PrecondIsqrt {
  const float* v;
  float* out;
  float bc2, eps;
  __device__ void operator()(int64_t i) const { out[i] = precond_isqrt_elem(v[i], bc2, eps); }
};

__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    ln_bwd_tangent_kernel(const float* dy, const float* rdy, const float* xhat, const float* rxhat, const float* rx,
                          const float* rstd, const float* gamma, const float* vgamma, float* rdx, int64_t rows,
                          int64_t d) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warp
  const int64_t o = row * d;
  auto g_at = [&](int64_t j) { return gamma ? ln_bwd_g(dy[o + j], gamma[j], false, Rounding::nearest_even) : dy[o + j]; };
  auto rg_at = [&](int64_t j) {
    return gamma ? ln_bwd_tangent_g(rdy[o + j], dy[o + j], gamma[j], vgamma[j]) : rdy[o + j];
  };
  double sg = 0.0, sgx = 0.0, srg = 0.0, srgx = 0.0, sx = 0.0;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float g = g_at(j), rg = rg_at(j), xh = xhat[o + j];
    sg += static_cast<double>(g);
    sgx += dot_term(g, xh);
    srg += static_cast<double>(rg);
    srgx += ln_tangent_rmgx_term(rg, xh, g, rxhat[o + j]);
    sx += dot_term(xh, rx[o + j]);
  }
  sg = warp_sum(sg);
  sgx = warp_sum(sgx);
  srg = warp_sum(srg);
  srgx = warp_sum(srgx);
  sx = warp_sum(sx);
  const float mg = mean_from_sum(sg, d), mgx = mean_from_sum(sgx, d);
  const float rmg = mean_from_sum(srg, d), rmgx = mean_from_sum(srgx, d);
  const float rs = rstd[row];
  const float rrs = ln_tangent_rrstd(rs, mean_from_sum(sx, d));
  for (int64_t j = lane; j < d; j += kWarp)
    rdx[o + j] = ln_bwd_tangent_dx(rs, rrs, g_at(j), mg, xhat[o + j], mgx, rg_at(j), rmg, rxhat[o + j], rmgx);
}

// The row's softmax q as loss_kl computes it (lab/model/README.md, "Losses"), then
// R{dout} = (q (rout - s)) * scale with s = (float) sum q rout.
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    kl_tangent_kernel(const float* out, const float* rout, float* rdout, int64_t rows, int64_t d, float temperature,
                      float scale) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float* z = out + row * d;
  const float* rz = rout + row * d;
  float m = -INFINITY;
  for (int64_t j = lane; j < d; j += kWarp) m = fmaxf(m, kl_logit(z[j], temperature));
  m = warp_max(m);
  double sum = 0.0;
  for (int64_t j = lane; j < d; j += kWarp) sum += static_cast<double>(kl_exp(kl_logit(z[j], temperature), m));
  sum = warp_sum(sum);
  auto q_at = [&](int64_t j) { return kl_prob(kl_exp(kl_logit(z[j], temperature), m), sum); };
  double sq = 0.0;
  for (int64_t j = lane; j < d; j += kWarp) sq += dot_term(q_at(j), rz[j]);
  const float sf = static_cast<float>(warp_sum(sq));
  for (int64_t j = lane; j < d; j += kWarp) rdout[row * d + j] = kl_tangent_elem(q_at(j), rz[j], sf, scale);
}

int grid_rows(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void launch_act_jvp(Act act, const float* h, const float* rh, float* ra, int64_t rows, int64_t cols, cudaStream_t s) {
  launch_each(ActJvp{act, h, rh, ra, cols}, rows * cols, s);
}

void launch_act_bwd_tangent(Act act, const float* h, const float* rh, const float* da, const float* rda, float* rdh,
                            int64_t rows, int64_t cols, cudaStream_t s) {
  launch_each(ActBwdTangent{act, h, rh, da, rda, rdh, cols}, rows * cols, s);
}

void launch_ln_affine_tangent(const float* rxhat, const float* xhat, const float* gamma, const float* vgamma,
                              const float* vbeta, float* ry, int64_t rows, int64_t d, cudaStream_t s) {
  launch_each(LnAffineTangent{rxhat, xhat, gamma, vgamma, vbeta, ry, d}, rows * d, s);
}

void launch_layernorm_bwd_tangent(const float* dy, const float* rdy, const float* xhat, const float* rxhat,
                                  const float* rx, const float* rstd, const float* gamma, const float* vgamma,
                                  float* rdx, int64_t rows, int64_t d, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  ln_bwd_tangent_kernel<<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, rdy, xhat, rxhat, rx, rstd, gamma,
                                                                         vgamma, rdx, rows, d);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_axpby(float* y, const float* x, float a, float b, int64_t n, cudaStream_t s) {
  launch_each(Axpby{y, x, a, b}, n, s);
}

void launch_mul(float* dst, const float* a, const float* b, int64_t n, cudaStream_t s) {
  launch_each(Mul{dst, a, b}, n, s);
}

void launch_precond_isqrt(const float* v, float* out, int64_t n, float bc2, float eps, cudaStream_t s) {
  launch_each(PrecondIsqrt{v, out, bc2, eps}, n, s);
}

void launch_loss_kl_tangent(const float* out, const float* rout, float* rdout, int64_t rows, int64_t d,
                            float temperature, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  kl_tangent_kernel<<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(out, rout, rdout, rows, d, temperature,
                                                                     kl_tangent_scale(temperature, rows));
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
