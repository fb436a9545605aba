// Layernorm kernels (see layernorm.cuh): one warp per row. The row is read three times
// (sum, centred square sum, output); the second and third reads hit L1/L2 (a d = 512 row is
// 2 KB), so device memory sees one read of x and one write of y and xhat. With d % 4 == 0 and
// aligned pointers the warp moves float4s; the summation order is the same either way
// (lane l owns the same elements), so the results do not depend on alignment.
//
// The backward's rows of up to kLnRegGroups * 32 float4s (d <= 512) take a register-resident
// kernel: each lane loads all its float4s of dy, xhat and gamma at once and keeps g and
// xhat in registers for both passes, instead of a loop that waits on one load per iteration. With
// B = 2048 rows there are only ~16 warps per SM, too few to hide that latency (ncu: 10.3 -> 8.1 us
// per layer). Same elements per lane, same order of every sum and operation: the same bits
// (tests/gpu/test_layernorm_gpu.cu). The forward's register variant gave nothing (11.5 -> 11.4 us:
// its dependent chain, not its loads, bounds it) and was removed.
#include "kernels/layernorm.cuh"

#include "kernels/launch_util.cuh"
#include "kernels/mx_produce.cuh"
#include "kernels/reduce.cuh"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

// Calls f(j, v) for the elements j of row `xr` owned by this lane. VEC: lane owns the float4
// groups lane, lane + 32, ...; scalar: elements lane, lane + 32, ... (a different order than
// VEC, but which path runs depends only on d and the pointers, fixed for a given call site).
template <bool VEC, class F>
__device__ __forceinline__ void for_row(const float* xr, int64_t d, int lane, F f) {
  if (VEC) {
    for (int64_t v = lane; v < d / 4; v += kWarp) {
      const float4 q = reinterpret_cast<const float4*>(xr)[v];
      f(4 * v, q.x);
      f(4 * v + 1, q.y);
      f(4 * v + 2, q.z);
      f(4 * v + 3, q.w);
    }
  } else {
    for (int64_t j = lane; j < d; j += kWarp) f(j, xr[j]);
  }
}

// pq.out (VEC only; d % 32 == 0): y's MX quantization is written too (kernels/mx_produce.cuh).
template <bool VEC, int kElem>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    ln_fwd_kernel(const float* x, const float* gamma, const float* beta, float* y, float* xhat, float* rstd,
                  int64_t rows, int64_t d, float eps, bool rb, Rounding rm, ProducedQuant pq) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warp
  const float* xr = x + row * d;
  double sum = 0.0;
  for_row<VEC>(xr, d, lane, [&](int64_t, float v) { sum += static_cast<double>(v); });
  sum = warp_sum(sum);
  const float mean = ew_round(mean_from_sum(sum, d), rb, rm);
  double sq = 0.0;
  for_row<VEC>(xr, d, lane, [&](int64_t, float v) {
    const float xc = ln_center(v, mean, rb, rm);
    sq += dot_term(xc, xc);
  });
  sq = warp_sum(sq);
  const float var = ew_round(mean_from_sum(sq, d), rb, rm);
  const float rs = ln_rstd(var, eps, rb, rm);
  if (lane == 0) rstd[row] = rs;
  float* yr = y + row * d;
  float* hr = xhat + row * d;
  if (VEC) {
    // Warp-uniform trip count (lane l still owns the float4 groups l, l + 32, ...), so that every
    // lane reaches produce_quant4's shuffles.
    for (int64_t v0 = 0; v0 < d / 4; v0 += kWarp) {
      const int64_t v = v0 + lane;
      const bool active = v < d / 4;
      float4 h, o = make_float4(0.f, 0.f, 0.f, 0.f);
      if (active) {
        const float4 q = reinterpret_cast<const float4*>(xr)[v];
        h.x = ln_xhat(ln_center(q.x, mean, rb, rm), rs, rb, rm);
        h.y = ln_xhat(ln_center(q.y, mean, rb, rm), rs, rb, rm);
        h.z = ln_xhat(ln_center(q.z, mean, rb, rm), rs, rb, rm);
        h.w = ln_xhat(ln_center(q.w, mean, rb, rm), rs, rb, rm);
        if (gamma) {
          const float4 g = reinterpret_cast<const float4*>(gamma)[v];
          const float4 b = reinterpret_cast<const float4*>(beta)[v];
          o.x = ln_affine(h.x, g.x, b.x, rb, rm);
          o.y = ln_affine(h.y, g.y, b.y, rb, rm);
          o.z = ln_affine(h.z, g.z, b.z, rb, rm);
          o.w = ln_affine(h.w, g.w, b.w, rb, rm);
        } else {
          o = h;
        }
        reinterpret_cast<float4*>(hr)[v] = h;
        reinterpret_cast<float4*>(yr)[v] = o;
      }
      if (pq.out) produce_quant4<kElem>(pq, o, row * d + 4 * v, active);
    }
  } else {
    for (int64_t j = lane; j < d; j += kWarp) {
      const float h = ln_xhat(ln_center(xr[j], mean, rb, rm), rs, rb, rm);
      hr[j] = h;
      yr[j] = gamma ? ln_affine(h, gamma[j], beta[j], rb, rm) : h;
    }
  }
}

template <bool VEC>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    ln_bwd_kernel(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx, int64_t rows,
                  int64_t d, bool rb, Rounding rm, bool yb, Rounding ym) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float* dyr = dy + row * d;
  const float* hr = xhat + row * d;
  double sg = 0.0, sgx = 0.0;
  auto accumulate = [&](float dy_raw, float gm, float h) {
    const float dyv = ew_round(dy_raw, yb, ym);  // R_dy: dy rounded as it is read
    const float g = gamma ? ln_bwd_g(dyv, gm, rb, rm) : dyv;
    sg += static_cast<double>(g);
    sgx += dot_term(g, h);
  };
  if (VEC) {  // float4 loads of dy, xhat and gamma
    for (int64_t v = lane; v < d / 4; v += kWarp) {
      const float4 q = reinterpret_cast<const float4*>(dyr)[v];
      const float4 h = reinterpret_cast<const float4*>(hr)[v];
      const float4 gm = gamma ? reinterpret_cast<const float4*>(gamma)[v] : make_float4(0.f, 0.f, 0.f, 0.f);
      accumulate(q.x, gm.x, h.x);
      accumulate(q.y, gm.y, h.y);
      accumulate(q.z, gm.z, h.z);
      accumulate(q.w, gm.w, h.w);
    }
  } else {
    for (int64_t j = lane; j < d; j += kWarp) accumulate(dyr[j], gamma ? gamma[j] : 0.0f, hr[j]);
  }
  sg = warp_sum(sg);
  sgx = warp_sum(sgx);
  const float mg = mean_from_sum(sg, d), mgx = mean_from_sum(sgx, d);
  const float rs = rstd[row];
  float* dxr = dx + row * d;
  if (VEC) {
    for (int64_t v = lane; v < d / 4; v += kWarp) {
      float4 q = reinterpret_cast<const float4*>(dyr)[v];
      q.x = ew_round(q.x, yb, ym);
      q.y = ew_round(q.y, yb, ym);
      q.z = ew_round(q.z, yb, ym);
      q.w = ew_round(q.w, yb, ym);
      const float4 h = reinterpret_cast<const float4*>(hr)[v];
      float4 g = q, o;
      if (gamma) {
        const float4 gm = reinterpret_cast<const float4*>(gamma)[v];
        g.x = ln_bwd_g(q.x, gm.x, rb, rm);
        g.y = ln_bwd_g(q.y, gm.y, rb, rm);
        g.z = ln_bwd_g(q.z, gm.z, rb, rm);
        g.w = ln_bwd_g(q.w, gm.w, rb, rm);
      }
      o.x = ln_bwd_dx(rs, g.x, mg, h.x, mgx, rb, rm);
      o.y = ln_bwd_dx(rs, g.y, mg, h.y, mgx, rb, rm);
      o.z = ln_bwd_dx(rs, g.z, mg, h.z, mgx, rb, rm);
      o.w = ln_bwd_dx(rs, g.w, mg, h.w, mgx, rb, rm);
      reinterpret_cast<float4*>(dxr)[v] = o;
    }
  } else {
    for (int64_t j = lane; j < d; j += kWarp) {
      const float dyv = ew_round(dyr[j], yb, ym);
      const float g = gamma ? ln_bwd_g(dyv, gamma[j], rb, rm) : dyv;
      dxr[j] = ln_bwd_dx(rs, g, mg, hr[j], mgx, rb, rm);
    }
  }
}

// ---- the register-resident backward (d % 4 == 0, d / 4 <= G * 32, aligned) ----
// Lane l owns the float4 groups l, l + 32, ..., l + 32 (G - 1) that are < d / 4, as ln_bwd_kernel's
// VEC loop visits them, and every sum runs over them in that order, element x, y, z, w within a group.

constexpr int kLnRegGroups = 4;  // float4 groups per lane: d <= 512

template <int G>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    ln_bwd_reg_kernel(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                      int64_t rows, int64_t d, bool rb, Rounding rm, bool yb, Rounding ym) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int64_t nv = d / 4;
  const float4* dyr = reinterpret_cast<const float4*>(dy + row * d);
  const float4* hr = reinterpret_cast<const float4*>(xhat + row * d);
  const float rs = rstd[row];
  float4 g[G], h[G];
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t v = lane + k * kWarp;
    const bool active = v < nv;
    const float4 q = active ? dyr[v] : make_float4(0.f, 0.f, 0.f, 0.f);
    h[k] = active ? hr[v] : make_float4(0.f, 0.f, 0.f, 0.f);
    // g = R(R_dy(dy) * gamma), or R_dy(dy) without gamma: what ln_bwd_kernel's accumulate and
    // output passes both compute.
    g[k] = make_float4(ew_round(q.x, yb, ym), ew_round(q.y, yb, ym), ew_round(q.z, yb, ym), ew_round(q.w, yb, ym));
    if (gamma && active) {
      const float4 gm = reinterpret_cast<const float4*>(gamma)[v];
      g[k].x = ln_bwd_g(g[k].x, gm.x, rb, rm);
      g[k].y = ln_bwd_g(g[k].y, gm.y, rb, rm);
      g[k].z = ln_bwd_g(g[k].z, gm.z, rb, rm);
      g[k].w = ln_bwd_g(g[k].w, gm.w, rb, rm);
    }
  }
  double sg = 0.0, sgx = 0.0;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    if (lane + k * kWarp < nv) {
      sg += static_cast<double>(g[k].x);
      sgx += dot_term(g[k].x, h[k].x);
      sg += static_cast<double>(g[k].y);
      sgx += dot_term(g[k].y, h[k].y);
      sg += static_cast<double>(g[k].z);
      sgx += dot_term(g[k].z, h[k].z);
      sg += static_cast<double>(g[k].w);
      sgx += dot_term(g[k].w, h[k].w);
    }
  }
  sg = warp_sum(sg);
  sgx = warp_sum(sgx);
  const float mg = mean_from_sum(sg, d), mgx = mean_from_sum(sgx, d);
  float4* dxr = reinterpret_cast<float4*>(dx + row * d);
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int64_t v = lane + k * kWarp;
    if (v < nv) {
      float4 o;
      o.x = ln_bwd_dx(rs, g[k].x, mg, h[k].x, mgx, rb, rm);
      o.y = ln_bwd_dx(rs, g[k].y, mg, h[k].y, mgx, rb, rm);
      o.z = ln_bwd_dx(rs, g[k].z, mg, h[k].z, mgx, rb, rm);
      o.w = ln_bwd_dx(rs, g[k].w, mg, h[k].w, mgx, rb, rm);
      dxr[v] = o;
    }
  }
}

int grid_rows(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

bool layernorm_register_kernels_cover(int64_t d) { return d % 4 == 0 && d / 4 <= kLnRegGroups * kWarp; }

bool launch_layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xhat,
                          float* rstd, int64_t rows, int64_t d, float eps, const ElementwiseRound& r, cudaStream_t s,
                          const ProducedQuant* pq) {
  if (rows <= 0 || d <= 0) return false;
  const bool vec = d % 4 == 0 && aligned16(x) && aligned16(gamma) && aligned16(beta) && aligned16(y) &&
                   aligned16(xhat);
  const bool produce = vec && pq && pq->out && d % kProducedBlock == 0 &&
                       (reinterpret_cast<uintptr_t>(pq->out) & 7u) == 0;
  const ProducedQuant none{};
  if (produce && pq->elem == static_cast<Elem>(kProducedFolded))
    ln_fwd_kernel<true, kProducedFolded><<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(
        x, gamma, beta, y, xhat, rstd, rows, d, eps, r.bf16, r.mode, *pq);
  else if (vec)
    ln_fwd_kernel<true, -1><<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, beta, y, xhat, rstd, rows, d,
                                                                               eps, r.bf16, r.mode, produce ? *pq : none);
  else
    ln_fwd_kernel<false, -1><<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, beta, y, xhat, rstd, rows, d,
                                                                                eps, r.bf16, r.mode, none);
  MXLAB_CUDA_LAUNCH_CHECK();
  return produce;
}

int64_t layernorm_bwd_scratch_doubles(int64_t rows, int64_t d) { return col_sum_scratch_doubles(rows, d, 2); }

void launch_layernorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                          float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                          const ElementwiseRound& dy_in, double* scratch, cudaStream_t s, LnKernel kernel) {
  if (d <= 0) return;
  if (rows > 0) {
    const bool vec = d % 4 == 0 && aligned16(dy) && aligned16(xhat) && aligned16(gamma) && aligned16(dx);
    if (vec && kernel == LnKernel::automatic && layernorm_register_kernels_cover(d))
      ln_bwd_reg_kernel<kLnRegGroups><<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(
          dy, xhat, rstd, gamma, dx, rows, d, r.bf16, r.mode, dy_in.bf16, dy_in.mode);
    else if (vec)
      ln_bwd_kernel<true><<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, xhat, rstd, gamma, dx, rows, d,
                                                                             r.bf16, r.mode, dy_in.bf16, dy_in.mode);
    else
      ln_bwd_kernel<false><<<grid_rows(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, xhat, rstd, gamma, dx, rows, d,
                                                                              r.bf16, r.mode, dy_in.bf16, dy_in.mode);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  launch_col_sum_ln(dy, xhat, dgamma, dbeta, rows, d, scratch, s, dy_in);
}

// ---- the MX emulation library's layernorm (precision.layernorm: vector) ----
namespace {

__global__ void ln_vec_fwd_kernel(const float* x, const float* gamma, const float* beta, float* y, float* xn,
                                  float* vare, int64_t rows, int64_t d, float eps, bool rb, Rounding rm) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ln_vec_fwd_row(x + i * d, gamma, beta, y + i * d, xn + i * d, vare + i, d, eps, rb, rm);
}

__global__ void ln_vec_bwd_kernel(const float* dy, const float* xn, const float* vare, const float* gamma, float* dx,
                                  int64_t rows, int64_t d, bool rb, Rounding rm, bool db, Rounding dm) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ln_vec_bwd_row(dy + i * d, xn + i * d, vare[i], gamma, dx + i * d, d, rb, rm, db, dm);
}

__global__ void ln_vec_col_kernel(const float* dy, const float* xn, float* dgamma, float* dbeta, int64_t rows,
                                  int64_t d, bool rb, Rounding rm, bool db, Rounding dm) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ln_vec_bwd_col(dy, xn, dgamma, dbeta, rows, d, j, rb, rm, db, dm);
}

constexpr int kVecThreads = 64;  // one row (column) per thread

}  // namespace

void launch_layernorm_vec_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xn, float* vare,
                              int64_t rows, int64_t d, float eps, const ElementwiseRound& r, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return;
  ln_vec_fwd_kernel<<<grid_for(rows, kVecThreads), kVecThreads, 0, s>>>(x, gamma, beta, y, xn, vare, rows, d, eps,
                                                                         r.bf16, r.mode);
  MXLAB_CUDA_LAUNCH_CHECK();
}

void launch_layernorm_vec_bwd(const float* dy, const float* xn, const float* vare, const float* gamma, float* dx,
                              float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                              const ElementwiseRound& dy_in, cudaStream_t s) {
  if (d <= 0) return;
  if (rows > 0) {
    ln_vec_bwd_kernel<<<grid_for(rows, kVecThreads), kVecThreads, 0, s>>>(dy, xn, vare, gamma, dx, rows, d, r.bf16,
                                                                           r.mode, dy_in.bf16, dy_in.mode);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  if (dgamma || dbeta) {
    ln_vec_col_kernel<<<grid_for(d, kVecThreads), kVecThreads, 0, s>>>(dy, xn, dgamma, dbeta, rows, d, r.bf16, r.mode,
                                                                        dy_in.bf16, dy_in.mode);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace mxlab::cuda
