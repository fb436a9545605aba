// The register-resident layernorm backward (kernels/layernorm.cu) against the row-loop kernel
// it replaces for d <= 512: the same bits in dx, dgamma and dbeta, for every rounding, dy read
// through R or as it is, with and without the affine parameters, for row lengths that fill a
// lane's four float4 groups or leave some empty, and for rows holding NaN, Inf and huge offsets.
// (The loop kernel is compared with the CPU backend in test_cuda_backend.cu.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/layernorm.cuh"
#include "lab/model/backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using test::Dev;

constexpr int64_t kRows = 67;

std::vector<float> rows_input(int64_t d, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(kRows * d));
  for (int64_t r = 0; r < kRows; ++r) {
    const float offset = r % 5 == 2 ? 1.0e4f : 0.3f * static_cast<float>(r % 3);  // a large mean now and then
    const float s = r % 7 == 4 ? 1.0e-3f : scale;
    for (int64_t c = 0; c < d; ++c) v[r * d + c] = offset + s * nd(rng);
  }
  v[3 * d + d / 2] = std::numeric_limits<float>::quiet_NaN();
  v[8 * d + 1] = std::numeric_limits<float>::infinity();
  return v;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(LayernormGpu, RegisterBackwardEqualsLoopBackwardBitForBit) {
  MXLAB_REQUIRE_GPU();
  cudaStream_t s;
  MXLAB_CUDA_OK(cudaStreamCreate(&s));
  const ElementwiseRound kFp32{}, kRounds[] = {ElementwiseRound{}, ElementwiseRound{true, Rounding::nearest_even},
                                               ElementwiseRound{true, Rounding::nearest_away}};
  int compared = 0;
  for (int64_t d : {int64_t{4}, int64_t{32}, int64_t{96}, int64_t{132}, int64_t{384}, int64_t{500}, int64_t{512}}) {
    ASSERT_TRUE(cuda::layernorm_register_kernels_cover(d)) << d;
    const size_t n = static_cast<size_t>(kRows * d);
    Dev<float> x(n), gam(d), bet(d), dy(n), y(n), xh(n), rs(kRows);
    x.put(rows_input(d, 100 + static_cast<uint32_t>(d), 2.0f));
    std::mt19937 rng(static_cast<uint32_t>(d));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> g(static_cast<size_t>(d)), b(static_cast<size_t>(d));
    for (int64_t c = 0; c < d; ++c) {
      g[c] = 1.0f + 0.2f * nd(rng);
      b[c] = 0.1f * nd(rng);
    }
    gam.put(g);
    bet.put(b);
    dy.put(rows_input(d, 200 + static_cast<uint32_t>(d), 0.01f));
    Dev<double> scratch(static_cast<size_t>(cuda::layernorm_bwd_scratch_doubles(kRows, d)));
    for (const ElementwiseRound& r : kRounds) {
      for (bool affine : {true, false}) {
        // The forward's xhat and rstd, then the backward both ways, dy read through R and as it is.
        cuda::launch_layernorm_fwd(x.p, affine ? gam.p : nullptr, affine ? bet.p : nullptr, y.p, xh.p, rs.p, kRows, d,
                                   1e-5f, r, s);
        for (const ElementwiseRound& dy_in : {r, kFp32}) {
          const std::string what = "d=" + std::to_string(d) + (r.bf16 ? " bf16" : " fp32") +
                                   (affine ? " affine" : "") + (dy_in.bf16 ? " dy rounded as read" : "");
          SCOPED_TRACE(what);
          Dev<float> dx[2] = {Dev<float>(n), Dev<float>(n)}, dg[2] = {Dev<float>(d), Dev<float>(d)},
                     db[2] = {Dev<float>(d), Dev<float>(d)};
          for (int k = 0; k < 2; ++k) {
            MXLAB_CUDA_OK(cudaMemsetAsync(dx[k].p, 0xFF, n * sizeof(float), s));
            cuda::launch_layernorm_bwd(dy.p, xh.p, rs.p, affine ? gam.p : nullptr, dx[k].p, dg[k].p, db[k].p, kRows,
                                       d, r, dy_in, scratch.p, s,
                                       k == 0 ? cuda::LnKernel::automatic : cuda::LnKernel::loop);
          }
          MXLAB_CUDA_OK(cudaStreamSynchronize(s));
          EXPECT_TRUE(same(dx[0].get(), dx[1].get())) << "dx";
          EXPECT_TRUE(same(dg[0].get(), dg[1].get())) << "dgamma";
          EXPECT_TRUE(same(db[0].get(), db[1].get())) << "dbeta";
          ++compared;
        }
      }
    }
  }
  // Rows longer than the register kernel holds go to the loop kernel.
  EXPECT_FALSE(cuda::layernorm_register_kernels_cover(516));
  EXPECT_FALSE(cuda::layernorm_register_kernels_cover(98));
  std::printf("[layernorm] register vs loop backward: %d configurations, bit for bit\n", compared);
  cudaStreamDestroy(s);
}

}  // namespace mxlab
