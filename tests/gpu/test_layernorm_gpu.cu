// The register-resident layernorm kernels (kernels/layernorm.cu, v22) against the row-loop
// kernels they replace for d <= 512: the same bits in every output (y, xhat, rstd, y's MX
// operand when a producer quantization is asked for; dx, dgamma, dbeta), for every rounding,
// with and without the affine parameters, for row lengths that fill a lane's four float4 groups
// or leave some empty, and for rows holding NaN, Inf and huge offsets. (The loop kernels are
// compared with the CPU backend in test_cuda_backend.cu.)
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
#include "kernels/mx_produce.cuh"
#include "lab/model/backend.h"
#include "lab/mx/format.h"
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

QuantSpec fp_spec(NumFmt f) {
  QuantSpec q;
  q.fmt = f;
  q.block = 32;
  q.rounding = Rounding::nearest_away;
  return q;
}

}  // namespace

TEST(LayernormGpu, RegisterKernelsEqualLoopKernelsBitForBit) {
  MXLAB_REQUIRE_GPU();
  cudaStream_t s;
  MXLAB_CUDA_OK(cudaStreamCreate(&s));
  const ElementwiseRound kRounds[] = {ElementwiseRound{}, ElementwiseRound{true, Rounding::nearest_even},
                                      ElementwiseRound{true, Rounding::nearest_away}};
  int compared = 0;
  for (int64_t d : {int64_t{4}, int64_t{32}, int64_t{96}, int64_t{132}, int64_t{384}, int64_t{500}, int64_t{512}}) {
    ASSERT_TRUE(cuda::layernorm_register_kernels_cover(d)) << d;
    const size_t n = static_cast<size_t>(kRows * d);
    Dev<float> x(n), gam(d), bet(d), dy(n);
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
    auto dyh = rows_input(d, 200 + static_cast<uint32_t>(d), 0.01f);
    dy.put(dyh);
    for (const ElementwiseRound& r : kRounds) {
      for (bool affine : {true, false}) {
        for (NumFmt fmt : {NumFmt::fp32, NumFmt::mxfp8_e4m3, NumFmt::mxfp6_e3m2}) {
          const bool produce = fmt != NumFmt::fp32;
          if (produce && d % 32 != 0) continue;
          const std::string what = "d=" + std::to_string(d) + (r.bf16 ? " bf16" : " fp32") +
                                   (affine ? " affine" : "") + (produce ? std::string(" ") + name(fmt) : "");
          SCOPED_TRACE(what);
          Dev<float> y[2] = {Dev<float>(n), Dev<float>(n)}, xh[2] = {Dev<float>(n), Dev<float>(n)},
                     rs[2] = {Dev<float>(kRows), Dev<float>(kRows)}, dx[2] = {Dev<float>(n), Dev<float>(n)},
                     dg[2] = {Dev<float>(d), Dev<float>(d)}, db[2] = {Dev<float>(d), Dev<float>(d)};
          Dev<uint16_t> q[2] = {Dev<uint16_t>(n), Dev<uint16_t>(n)};
          Dev<double> scratch(static_cast<size_t>(cuda::layernorm_bwd_scratch_doubles(kRows, d)));
          for (int k = 0; k < 2; ++k) {
            const cuda::LnKernel kernel = k == 0 ? cuda::LnKernel::automatic : cuda::LnKernel::loop;
            MXLAB_CUDA_OK(cudaMemsetAsync(y[k].p, 0xFF, n * sizeof(float), s));
            MXLAB_CUDA_OK(cudaMemsetAsync(dx[k].p, 0xFF, n * sizeof(float), s));
            MXLAB_CUDA_OK(cudaMemsetAsync(q[k].p, 0xFF, n * sizeof(uint16_t), s));
            const cuda::ProducedQuant pq = cuda::produced_quant(fp_spec(produce ? fmt : NumFmt::mxfp8_e4m3), false,
                                                                Rounding::nearest_away, q[k].p);
            const bool produced =
                cuda::launch_layernorm_fwd(x.p, affine ? gam.p : nullptr, affine ? bet.p : nullptr, y[k].p, xh[k].p,
                                           rs[k].p, kRows, d, 1e-5f, r, s, produce ? &pq : nullptr, kernel);
            EXPECT_EQ(produced, produce);
            // The backward from this kernel's own forward, dy read through R and as it is.
            cuda::launch_layernorm_bwd(dy.p, xh[k].p, rs[k].p, affine ? gam.p : nullptr, dx[k].p, dg[k].p, db[k].p,
                                       kRows, d, r, r, scratch.p, s, kernel);
          }
          MXLAB_CUDA_OK(cudaStreamSynchronize(s));
          EXPECT_TRUE(same(y[0].get(), y[1].get())) << "y";
          EXPECT_TRUE(same(xh[0].get(), xh[1].get())) << "xhat";
          EXPECT_TRUE(same(rs[0].get(), rs[1].get())) << "rstd";
          EXPECT_TRUE(same(dx[0].get(), dx[1].get())) << "dx";
          EXPECT_TRUE(same(dg[0].get(), dg[1].get())) << "dgamma";
          EXPECT_TRUE(same(db[0].get(), db[1].get())) << "dbeta";
          if (produce) EXPECT_TRUE(q[0].get() == q[1].get()) << "y's MX operand";
          ++compared;
        }
      }
    }
  }
  // Rows longer than the register kernels hold go to the loop kernels.
  EXPECT_FALSE(cuda::layernorm_register_kernels_cover(516));
  EXPECT_FALSE(cuda::layernorm_register_kernels_cover(98));
  std::printf("[layernorm] register vs loop kernels: %d configurations, bit for bit\n", compared);
  cudaStreamDestroy(s);
}

}  // namespace mxlab
