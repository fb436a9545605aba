// What GeLU's bit contract costs on the GPU (kernels/PERF.md, "What the bit contracts
// cost"). Three versions of the FP32 activation forward and backward on the paper's tensor
// (B x H = 2048 x 2048), timed in one process:
//   contract  the backend's kernels (launch_act_fwd / launch_act_bwd): det_erf and det_exp of
//             lab/core/detmath.h, compiled without FMA contraction, so that every bit equals the
//             CPU backend's;
//   relaxed   the same float4 kernels written with CUDA's erff / expf (libdevice: FMA inside,
//             within 2 ulp, bits not reproducible on the CPU);
//   copy      the same bytes moved with no arithmetic (h -> a; h + da -> dh): the floor.
// Inputs: pre-activations N(0, sigma^2) for sigma = 0.577 (the paper's PyTorch init: variance
// d * 1/(3d)) and sigma = 1.5 (wider, as weights grow), upstream gradients N(0, 0.01^2). Method:
// CUDA events around batches of kLaunches launches rotating over kSets input/output sets (together
// far larger than the L2), warm-up first, median of kReps batches. Also reports how far the
// relaxed results are from the contract's (max ulp, share of differing elements).
// Usage: bench_gelu_gpu [rows cols]   (default 2048 2048)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench/event_timing.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/launch_util.cuh"
#include "lab/model/backend.h"

namespace {

using namespace mxlab;
using namespace mxlab::cuda;

constexpr int kSets = 6;
constexpr int kLaunches = 24;
constexpr int kWarmup = 2;
constexpr int kReps = 15;
constexpr float kErfScale = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__global__ void relaxed_fwd_kernel(const float4* h, float4* a, int64_t nvec) {
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 x = h[v];
    x.x = 0.5f * x.x * (1.0f + erff(x.x * kErfScale));
    x.y = 0.5f * x.y * (1.0f + erff(x.y * kErfScale));
    x.z = 0.5f * x.z * (1.0f + erff(x.z * kErfScale));
    x.w = 0.5f * x.w * (1.0f + erff(x.w * kErfScale));
    a[v] = x;
  }
}

__device__ __forceinline__ float relaxed_deriv(float x) {
  return 0.5f * (1.0f + erff(x * kErfScale)) + x * (kInvSqrt2Pi * expf(-0.5f * x * x));
}

__global__ void relaxed_bwd_kernel(const float4* h, const float4* da, float4* dh, int64_t nvec) {
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = h[v], g = da[v];
    dh[v] = make_float4(g.x * relaxed_deriv(x.x), g.y * relaxed_deriv(x.y), g.z * relaxed_deriv(x.z),
                        g.w * relaxed_deriv(x.w));
  }
}

__global__ void copy_fwd_kernel(const float4* h, float4* a, int64_t nvec) {
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x)
    a[v] = h[v];
}

__global__ void copy_bwd_kernel(const float4* h, const float4* da, float4* dh, int64_t nvec) {
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = h[v], g = da[v];
    dh[v] = make_float4(x.x + g.x, x.y + g.y, x.z + g.z, x.w + g.w);
  }
}

// Median over kReps batches of kLaunches calls f(i) of the time per call, in microseconds.
double median_us(cudaStream_t s, const std::function<void(int)>& f) {
  return 1000.0 * bench::median_event_ms(s, kWarmup * kLaunches, kReps, kLaunches, f);
}

// Distance in ulps between two finite floats of the same sign class (ordered integer mapping).
int64_t ulps(float a, float b) {
  auto ord = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  return std::llabs(ord(a) - ord(b));
}

struct Diff {
  int64_t max_ulp = 0;     // over elements with |contract| >= 2^-10 max |contract|
  double max_abs_rel = 0;  // max |relaxed - contract| / max |contract|, over all elements
  double share = 0.0;      // share of elements whose bits differ
};

// Ulps are only meaningful away from zero: near it (GeLU of very negative x, where 1 + erf
// cancels) a difference of 1e-9 is millions of ulps of a tiny value, so the ulp maximum skips
// outputs below 2^-10 of the largest and the absolute difference covers them.
Diff compare(const std::vector<float>& x, const std::vector<float>& y) {
  Diff d;
  float top = 0.0f;
  for (float v : x) top = std::max(top, std::fabs(v));
  int64_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    ++differ;
    if (std::fabs(x[i]) >= std::ldexp(top, -10)) d.max_ulp = std::max(d.max_ulp, ulps(x[i], y[i]));
    d.max_abs_rel = std::max(d.max_abs_rel, static_cast<double>(std::fabs(x[i] - y[i])) / top);
  }
  d.share = static_cast<double>(differ) / static_cast<double>(x.size());
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 2 ? std::atoll(argv[1]) : 2048;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t n = rows * cols;
  if (n <= 0 || n % 4 != 0) {
    std::fprintf(stderr, "bench_gelu_gpu: rows * cols must be a positive multiple of 4\n");
    return 2;
  }
  cudaDeviceProp prop{};
  MXLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_gelu_gpu: %s, %lld x %lld FP32 elements, %d launches per batch over %d buffer sets, median of "
              "%d batches\n",
              prop.name, static_cast<long long>(rows), static_cast<long long>(cols), kLaunches, kSets, kReps);
  cudaStream_t s;
  MXLAB_CUDA_CHECK(cudaStreamCreate(&s));
  std::vector<float*> h(kSets), da(kSets), out(kSets);
  for (int k = 0; k < kSets; ++k) {
    MXLAB_CUDA_CHECK(cudaMalloc(&h[k], n * sizeof(float)));
    MXLAB_CUDA_CHECK(cudaMalloc(&da[k], n * sizeof(float)));
    MXLAB_CUDA_CHECK(cudaMalloc(&out[k], n * sizeof(float)));
  }
  const int64_t nvec = n / 4;
  const int grid = grid_for(nvec);
  const ElementwiseRound fp32{};
  for (float sigma : {0.577f, 1.5f}) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> hh(n), dd(n);
    int64_t tail = 0;
    for (int64_t i = 0; i < n; ++i) {
      hh[i] = sigma * nd(rng);
      dd[i] = 0.01f * nd(rng);
      tail += std::fabs(hh[i] * kErfScale) >= 1.0f;
    }
    for (int k = 0; k < kSets; ++k) {
      MXLAB_CUDA_CHECK(cudaMemcpy(h[k], hh.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      MXLAB_CUDA_CHECK(cudaMemcpy(da[k], dd.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    auto f4 = [](float* p) { return reinterpret_cast<float4*>(p); };
    auto c4 = [](const float* p) { return reinterpret_cast<const float4*>(p); };
    const double c_fwd = median_us(s, [&](int i) {
      const int k = i % kSets;
      launch_act_fwd(Act::gelu, h[k], out[k], rows, cols, fp32, fp32, s);
    });
    const double c_bwd = median_us(s, [&](int i) {
      const int k = i % kSets;
      launch_act_bwd(Act::gelu, h[k], da[k], out[k], rows, cols, fp32, fp32, fp32, s);
    });
    const double r_fwd = median_us(s, [&](int i) {
      const int k = i % kSets;
      relaxed_fwd_kernel<<<grid, kBlock, 0, s>>>(c4(h[k]), f4(out[k]), nvec);
    });
    const double r_bwd = median_us(s, [&](int i) {
      const int k = i % kSets;
      relaxed_bwd_kernel<<<grid, kBlock, 0, s>>>(c4(h[k]), c4(da[k]), f4(out[k]), nvec);
    });
    const double p_fwd = median_us(s, [&](int i) {
      const int k = i % kSets;
      copy_fwd_kernel<<<grid, kBlock, 0, s>>>(c4(h[k]), f4(out[k]), nvec);
    });
    const double p_bwd = median_us(s, [&](int i) {
      const int k = i % kSets;
      copy_bwd_kernel<<<grid, kBlock, 0, s>>>(c4(h[k]), c4(da[k]), f4(out[k]), nvec);
    });
    MXLAB_CUDA_CHECK(cudaGetLastError());
    // How far the relaxed values are from the contract's.
    std::vector<float> cf(n), rf(n), cb(n), rb(n);
    launch_act_fwd(Act::gelu, h[0], out[0], rows, cols, fp32, fp32, s);
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(cf.data(), out[0], n * sizeof(float), cudaMemcpyDeviceToHost, s));
    relaxed_fwd_kernel<<<grid, kBlock, 0, s>>>(c4(h[0]), f4(out[0]), nvec);
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(rf.data(), out[0], n * sizeof(float), cudaMemcpyDeviceToHost, s));
    launch_act_bwd(Act::gelu, h[0], da[0], out[0], rows, cols, fp32, fp32, fp32, s);
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(cb.data(), out[0], n * sizeof(float), cudaMemcpyDeviceToHost, s));
    relaxed_bwd_kernel<<<grid, kBlock, 0, s>>>(c4(h[0]), c4(da[0]), f4(out[0]), nvec);
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(rb.data(), out[0], n * sizeof(float), cudaMemcpyDeviceToHost, s));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));
    const Diff dfwd = compare(cf, rf), dbwd = compare(cb, rb);
    std::printf("\nsigma %.3f (|x|/sqrt2 >= 1, det_erf's tail branch: %.2f %% of elements)\n", sigma,
                100.0 * static_cast<double>(tail) / static_cast<double>(n));
    std::printf("  %-9s %12s %12s %12s   %s\n", "", "contract us", "relaxed us", "copy us", "contract/copy relaxed/copy");
    std::printf("  %-9s %12.2f %12.2f %12.2f   %8.2f %8.2f\n", "forward", c_fwd, r_fwd, p_fwd, c_fwd / p_fwd,
                r_fwd / p_fwd);
    std::printf("  %-9s %12.2f %12.2f %12.2f   %8.2f %8.2f\n", "backward", c_bwd, r_bwd, p_bwd, c_bwd / p_bwd,
                r_bwd / p_bwd);
    std::printf("  per FP32 trajectory step (4 layers, forward + backward): contract %.1f us, relaxed %.1f us, "
                "copy %.1f us; the contract costs %.1f us over relaxed\n",
                4 * (c_fwd + c_bwd), 4 * (r_fwd + r_bwd), 4 * (p_fwd + p_bwd), 4 * (c_fwd + c_bwd - r_fwd - r_bwd));
    std::printf("  relaxed vs contract values: forward %.2f %% differ (max %lld ulp above 2^-10 of the largest; max "
                "difference %.1e of the largest), backward %.2f %% differ (max %lld ulp; %.1e)\n",
                100.0 * dfwd.share, static_cast<long long>(dfwd.max_ulp), dfwd.max_abs_rel, 100.0 * dbwd.share,
                static_cast<long long>(dbwd.max_ulp), dbwd.max_abs_rel);
  }
  for (int k = 0; k < kSets; ++k) {
    cudaFree(h[k]);
    cudaFree(da[k]);
    cudaFree(out[k]);
  }
  cudaStreamDestroy(s);
  return 0;
}
