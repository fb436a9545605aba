// Every op of the op table (lab/backends/op_table.h) on the CUDA backend against the CPU
// reference, from the same generated inputs (outputs poisoned with NaN first), under the
// descriptor's comparison rule. This is the floor every Backend op clears; the per-op tests
// (test_cuda_backend.cu, test_curvature_gpu.cu, ...) check more cases and tighter rules.
// tests/cpu/test_op_table.cpp makes sure no Backend method is left out of the table.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kernels/cuda_backend.h"
#include "lab/backends/op_table.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

class OpTableTwin : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTableTwin, CudaMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  const OpDesc& d = op_table()[GetParam()];
  const OpCase c = d.make(d.test, 2024);
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu = make_cuda_backend(0);
  if (const OpExemption* pending = find_cuda_pending(d.name)) {
    // Not on CUDA yet: the backend must say so (mxlab::Error), never return wrong numbers.
    EXPECT_THROW(op_run(*gpu, d, c, op_place(*gpu, d, c)), Error) << d.name << ": " << pending->why;
    return;
  }
  const OpResult ref = op_run(*cpu, d, c, op_place(*cpu, d, c));
  const OpResult got = op_run(*gpu, d, c, op_place(*gpu, d, c));
  EXPECT_EQ(op_compare(d.rule, ref, got), "")
      << d.name << " at " << op_size_text(d, d.test) << ", rule: " << d.rule.why;
}

std::string param_name(const ::testing::TestParamInfo<size_t>& info) { return op_table()[info.param].name; }

INSTANTIATE_TEST_SUITE_P(Ops, OpTableTwin, ::testing::Range(size_t{0}, op_table().size()), param_name);

}  // namespace
}  // namespace mxlab
