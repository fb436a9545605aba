// Host/device portability for the scalar code shared by the CPU reference and the CUDA
// kernels (lab/core, lab/mx). Code marked MXLAB_HD is compiled by g++ for the CPU backend
// and by nvcc for the kernels, so both evaluate the same expressions. Bit-for-bit agreement
// also needs: no FMA contraction (-ffp-contract=off for g++, --fmad=false for nvcc, both set
// in CMakeLists.txt), IEEE division and sqrt (nvcc's defaults), no fast-math, and only
// functions defined in this project (lab/core/detmath.h) instead of libm's exp/log/erf/tanh,
// whose CPU and GPU implementations round differently.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MXLAB_HD __host__ __device__ __forceinline__
#define MXLAB_DEVICE_CODE 1
#else
#define MXLAB_HD inline
#endif

namespace mxlab {

MXLAB_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MXLAB_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace mxlab
