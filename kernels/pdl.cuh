// Programmatic dependent launch (issue 16, v18; Hopper and newer): the step's hot kernels
// (element-wise, layernorm, quantizer, column sums, loss, Adam) are launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, so the next one in the stream can be
// scheduled while the one before it is still running, instead of after it has drained.
// Correctness rests on one rule: EVERY kernel launched through launch_pdl() calls pdl_begin()
// before it touches memory. pdl_begin() waits until the kernel before it in the stream has
// completed and its writes are visible (griddepcontrol.wait: transitively, everything before),
// and only then lets the kernel after it be scheduled (griddepcontrol.launch_dependents), so at
// most one kernel waits ahead. Numbers cannot change: the same kernels compute the same values
// in the same order; only when a kernel may start changes. Kernels launched otherwise (cuBLAS,
// memcpy, memset, events) keep full stream order; pdl_begin() in a kernel launched without the
// attribute returns at once. MXLAB_PDL=0 in the environment launches everything without it.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda_check.cuh"

namespace mxlab::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launch_pdl() sets the attribute: the current device is compute capability 9.0 or
// newer, MXLAB_PDL is not "0" (read once per process), and set_pdl(false) was not called.
bool pdl_on();
// Tests and benchmarks: switch the attribute off (or back on, where the device allows it) for
// launches from now on; graphs recorded before keep how they were recorded.
void set_pdl(bool on);

// kernel<<<grid, block, smem, s>>>(args...), with programmatic stream serialization when pdl_on().
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_on() ? 1 : 0;
  MXLAB_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace mxlab::cuda
