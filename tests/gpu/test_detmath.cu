// lab/core/detmath.h evaluated on the device must give the same bits as on the host, for
// every function, over 2^24 inputs spread over the whole float line (both signs, subnormals,
// Inf, NaN), 2^24 angles in [0, 1) and 2^24 Box-Muller word pairs. Exact equality, NaNs
// included (detmath returns one canonical NaN).
// The host side of this file is compiled by the host compiler under nvcc, without FMA on
// x86-64 baseline code, so it rounds like the CPU backend (built with -ffp-contract=off).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "lab/core/detmath.h"
#include "lab/core/philox.h"
#include "tests/gpu/gpu_test_util.h"

using namespace mxlab;

namespace {

constexpr uint32_t kN = 1u << 24;
constexpr int kThreads = 256;
constexpr uint64_t kSeed = 0x5EED0DE7u;

// The functions of one float argument, in output order.
constexpr int kUnaryFuncs = 6;
const char* const kUnaryNames[kUnaryFuncs] = {"det_exp", "det_expm1", "det_log", "det_erf", "det_tanh", "sqrtf_ieee"};

// Input i: the top 24 bits walk all sign/exponent/high-mantissa patterns (so 1/256 of all
// floats, NaN and Inf included); the low 8 bits are scrambled so they are not always zero.
__host__ __device__ float unary_input(uint32_t i) { return bits_f32((i << 8) | ((i * 2654435761u) >> 24)); }

// Angle input i: bit patterns spread evenly over [0, 1) (0x3f800000 patterns), so tiny angles
// are as well covered as the quadrant boundaries.
__host__ __device__ float angle_input(uint32_t i) {
  return bits_f32(static_cast<uint32_t>((static_cast<uint64_t>(i) * 0x3f800000u) >> 24));
}

__host__ __device__ float eval_unary(int func, float x) {
  switch (func) {
    case 0: return det_exp(x);
    case 1: return det_expm1(x);
    case 2: return det_log(x);
    case 3: return det_erf(x);
    case 4: return det_tanh(x);
    default: return sqrtf_ieee(x);
  }
}

// out: (kUnaryFuncs, n) for the unary functions, then sin, cos, z0, z1: (4, n).
__host__ __device__ void eval_all(uint32_t i, uint32_t n, float* out) {
  const float x = unary_input(i);
  for (int f = 0; f < kUnaryFuncs; ++f) out[f * n + i] = eval_unary(f, x);
  float s, c;
  det_sincos_2pi(angle_input(i), s, c);
  out[(kUnaryFuncs + 0) * n + i] = s;
  out[(kUnaryFuncs + 1) * n + i] = c;
  const U32x4 w = philox(kSeed, Stream::data, 0, i);
  float z0, z1;
  det_box_muller(w.v[0], w.v[1], z0, z1);
  out[(kUnaryFuncs + 2) * n + i] = z0;
  out[(kUnaryFuncs + 3) * n + i] = z1;
}

__global__ void eval_all_kernel(uint32_t n, float* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) eval_all(i, n, out);
}

constexpr int kOutputs = kUnaryFuncs + 4;
const char* output_name(int k) {
  static const char* const extra[4] = {"sincos_2pi.sin", "sincos_2pi.cos", "box_muller.z0", "box_muller.z1"};
  return k < kUnaryFuncs ? kUnaryNames[k] : extra[k - kUnaryFuncs];
}

}  // namespace

TEST(DetMathGpu, DeviceBitsEqualHostBits) {
  MXLAB_REQUIRE_GPU();
  const size_t total = static_cast<size_t>(kOutputs) * kN;
  float* d_out = nullptr;
  MXLAB_CUDA_OK(cudaMalloc(&d_out, total * sizeof(float)));
  eval_all_kernel<<<(kN + kThreads - 1) / kThreads, kThreads>>>(kN, d_out);
  MXLAB_CUDA_OK(cudaGetLastError());
  std::vector<float> dev(total);
  MXLAB_CUDA_OK(cudaMemcpy(dev.data(), d_out, total * sizeof(float), cudaMemcpyDeviceToHost));
  MXLAB_CUDA_OK(cudaFree(d_out));

  std::vector<float> host(total);
  for (uint32_t i = 0; i < kN; ++i) eval_all(i, kN, host.data());

  constexpr int kMaxReports = 5;
  for (int k = 0; k < kOutputs; ++k) {
    uint64_t mismatches = 0;
    for (uint32_t i = 0; i < kN; ++i) {
      const float h = host[static_cast<size_t>(k) * kN + i], d = dev[static_cast<size_t>(k) * kN + i];
      if (f32_bits(h) == f32_bits(d)) continue;
      if (++mismatches <= kMaxReports) {
        // Box-Muller inputs are the philox words of index i; the others are float inputs.
        const float in = k < kUnaryFuncs ? unary_input(i) : angle_input(i);
        std::printf("  %s: i=%u input 0x%08x: host %.9g (0x%08x) device %.9g (0x%08x)\n", output_name(k), i,
                    k < kUnaryFuncs + 2 ? f32_bits(in) : philox(kSeed, Stream::data, 0, i).v[0], h, f32_bits(h), d,
                    f32_bits(d));
      }
    }
    EXPECT_EQ(mismatches, 0u) << output_name(k) << ": device differs from host on " << mismatches << " of " << kN
                              << " inputs";
  }
}
