// The CPU (reference) backend: plain loops and Eigen, never clever. See lab/model/backend.h.
#pragma once
#include <memory>

#include "lab/model/backend.h"

namespace mxlab {

// How the GEMM's FP32 product is accumulated: Eigen's blocked FP32 order (the reference), or
// each element's products summed in double and rounded to float once (double_sum: independent
// of the summation order, for comparisons with outside implementations; `mxlab dump-step --gemm
// double`).
enum class CpuGemm { eigen, double_sum };

std::unique_ptr<Backend> make_cpu_backend(CpuGemm gemm = CpuGemm::eigen);

}  // namespace mxlab
