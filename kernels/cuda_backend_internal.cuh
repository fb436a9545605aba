// What the CUDA-side benchmark helpers (bench_support.cu) need from a CUDA backend beyond the
// Backend interface: the stream of a lane, to record timing events in stream order.
#pragma once
#include <cuda_runtime.h>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// The stream of `lane` of a backend made by make_cuda_backend; throws mxlab::Error for any
// other backend.
cudaStream_t lane_stream(Backend& be, int lane);

}  // namespace mxlab::cuda
