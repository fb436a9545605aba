// kernels/bench_support.h: the cuBLAS floors `mxlab bench` prints, and the comparison of the
// FP32 SGEMM's compute modes (pedantic, used; COMPUTE_32F with the default math mode, a
// candidate): both are IEEE FP32, so they agree to FP32 rounding in another summation order,
// far below what TF32 inputs (10-bit mantissas) would give.
#include <gtest/gtest.h>

#include "kernels/bench_support.h"
#include "tests/gpu/gpu_test_util.h"

using mxlab::cuda::FloorKind;
using mxlab::cuda::GemmShape;

TEST(BenchSupportGpu, FloorsAreTimedAndTheDefaultMathSgemmIsIeeeFp32) {
  MXLAB_REQUIRE_GPU();
  const std::vector<GemmShape> shapes = {{1024, 512, 2048, true, true, 1}, {512, 1024, 1024, false, false, 1}};
  for (FloorKind k : {FloorKind::sgemm, FloorKind::sgemm_default, FloorKind::bf16})
    EXPECT_GT(mxlab::cuda::gemm_floor_ms(shapes, k, 0, 1, 3), 0.0) << static_cast<int>(k);
  const double diff = mxlab::cuda::sgemm_default_rel_diff(shapes[0], 0);
  std::printf("[sgemm default vs pedantic] max relative difference %.3g\n", diff);
  EXPECT_LT(diff, 1e-4) << "COMPUTE_32F with the default math mode is not IEEE FP32 here (TF32?)";
}
