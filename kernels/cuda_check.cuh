// CUDA error checking for launchers: every runtime/cuBLAS call and every launch is checked;
// a failure throws mxlab::Error naming the call, file and line.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "lab/core/error.h"

#define MXLAB_CUDA_CHECK(expr)                                                                      \
  do {                                                                                              \
    cudaError_t err_ = (expr);                                                                      \
    if (err_ != cudaSuccess)                                                                        \
      throw ::mxlab::Error(::mxlab::msg("CUDA error in ", #expr, " at ", __FILE__, ":", __LINE__, ": ", \
                                        cudaGetErrorString(err_)));                                 \
  } while (0)

#define MXLAB_CUDA_LAUNCH_CHECK() MXLAB_CUDA_CHECK(cudaGetLastError())

#define MXLAB_CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                             \
    cublasStatus_t st_ = (expr);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
      throw ::mxlab::Error(::mxlab::msg("cuBLAS error ", static_cast<int>(st_), " in ", #expr, " at ", \
                                        __FILE__, ":", __LINE__));                                 \
  } while (0)
