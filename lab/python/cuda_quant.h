// The CUDA half of mxlab._core: the lab's quantize kernels (kernels/quantize.cuh, the CUDA twin
// of lab/mx/quantize.cpp, bit for bit the CPU reference) on device memory that Python hands over.
// Compiled only when the package is built with CUDA (MXLAB_ENABLE_CUDA=ON under MXLAB_PYTHON:
// lab/python/cuda_quant.cu, which defines MXLAB_PYTHON_CUDA for module.cpp); this header has no
// CUDA types so that module.cpp compiles without the toolkit.
//
// Failures of the CUDA runtime (no device, out of memory, a launch error) are thrown as
// CudaFailure, which the module turns into Python's RuntimeError; bad arguments stay
// mxlab::Error (ValueError), as on the CPU.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "lab/mx/quantize.h"

namespace mxlab::python {

struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Visible CUDA devices; 0 with the reason in *why when none (no driver, no device, ...).
int cuda_device_count(std::string* why);

// Q(x) of the (rows x cols) float32 matrix at device pointer `in` into device pointer `out`
// (may alias) on CUDA device `device`, enqueued on `stream` (a cudaStream_t as an integer, e.g.
// torch.cuda.current_stream().cuda_stream; 0 = the legacy default stream). Without `stats` the
// call only enqueues (asynchronous, like any kernel on that stream). With `stats` the counts
// come from the same kernel pass and the call waits for the stream; with `err` as well, x and
// Q(x) are copied back and quant_error sums them on the host in the CPU's order (its bits).
void quantize_device(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, const QuantSpec& spec,
                     int device, uintptr_t stream, QuantStats* stats, QuantError* err);

// The same for host memory (a NumPy array, a CPU tensor): copied to `device`, quantized there
// by the same kernels, copied back into `out`; synchronous.
void quantize_host_on_device(const float* in, float* out, int64_t rows, int64_t cols, Axis axis,
                             const QuantSpec& spec, int device, QuantStats* stats, QuantError* err);

}  // namespace mxlab::python
