// Device and library versions for the run records.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda_check.cuh"
#include "kernels/device_info.h"

namespace mxlab::cuda {

namespace {
std::string version_string(int v) { return msg(v / 1000, ".", (v % 1000) / 10); }
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

DeviceInfo device_info(int index) {
  const int n = device_count();
  if (index < 0 || index >= n)
    throw Error(msg("CUDA device ", index, " not available (", n, " device(s) found); use --device cpu"));
  DeviceInfo d;
  d.index = index;
  cudaDeviceProp p{};
  MXLAB_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  int rt = 0, drv = 0;
  MXLAB_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  MXLAB_CUDA_CHECK(cudaDriverGetVersion(&drv));
  d.cuda_runtime = version_string(rt);
  d.cuda_driver = version_string(drv);
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  d.cublas = msg(major, ".", minor, ".", patch);
  return d;
}

}  // namespace mxlab::cuda
