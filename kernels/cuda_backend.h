// The CUDA backend: kernels/ + cuBLAS. See lab/model/backend.h. Plain C++ header (no CUDA
// types) so host code can create one.
#pragma once
#include <memory>

#include "lab/model/backend.h"

namespace mxlab {

// Throws mxlab::Error when the device is not usable.
std::unique_ptr<Backend> make_cuda_backend(int device);

}  // namespace mxlab
