// kernels/warp_erf.cuh: det_erf with its tail branch compacted across the warp must give
// det_erf's bits for every value, whatever the mix of branches in the warp (0 to 128 tail
// values, i.e. zero to four passes of the compacted loop) and whichever lanes are inactive.
// The reference is det_erf evaluated on the host (tests/gpu/test_detmath.cu already checks that
// the device's det_erf equals the host's).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/warp_erf.cuh"
#include "lab/core/detmath.h"
#include "lab/core/philox.h"
#include "tests/gpu/gpu_test_util.h"

using namespace mxlab;

namespace {

constexpr int kThreads = 256;

// x: 4 values per lane, lanes in order; active: one flag per lane. Writes 4 results per lane
// (zeros expected where inactive). Blocks loop over whole warps, as the activation kernels do.
__global__ void warp_erf_kernel(const float* x, const uint8_t* active, float* out, int64_t lanes) {
  __shared__ float slots[kThreads / 32][cuda::kWarpErfSlots];
  float* mine = slots[threadIdx.x / 32];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = (t / 32) * 32; base < lanes; base += stride) {
    const int64_t l = base + (threadIdx.x & 31);
    const bool in = l < lanes;
    const float4 v = in ? reinterpret_cast<const float4*>(x)[l] : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 e = cuda::warp_det_erf4(v, in && active[l] != 0, mine);
    if (in) reinterpret_cast<float4*>(out)[l] = e;
  }
}

struct Result {
  int64_t mismatches = 0;
  int64_t first = -1;
};

// Runs the kernel (with `blocks` blocks) and compares every value with the host's det_erf (0 for
// an inactive lane).
Result run_and_compare(const std::vector<float>& x, const std::vector<uint8_t>& active, int blocks) {
  const int64_t lanes = static_cast<int64_t>(active.size());
  float *dx = nullptr, *dout = nullptr;
  uint8_t* dact = nullptr;
  EXPECT_EQ(cudaMalloc(&dx, x.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dout, x.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dact, active.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dact, active.data(), active.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(dout, 0xFF, x.size() * sizeof(float)), cudaSuccess);
  warp_erf_kernel<<<blocks, kThreads>>>(dx, dact, dout, lanes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(x.size());
  EXPECT_EQ(cudaMemcpy(out.data(), dout, x.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dx);
  cudaFree(dout);
  cudaFree(dact);
  Result r;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = active[i / 4] ? det_erf(x[i]) : 0.0f;
    if (f32_bits(out[i]) != f32_bits(want)) {
      if (r.first < 0) {
        r.first = static_cast<int64_t>(i);
        std::printf("[warp erf] first mismatch at %zu: x %a (0x%08x) got 0x%08x want 0x%08x\n", i, x[i],
                    f32_bits(x[i]), f32_bits(out[i]), f32_bits(want));
      }
      ++r.mismatches;
    }
  }
  return r;
}

}  // namespace

// 2^24 bit patterns over the whole float line (both signs, subnormals, Inf, NaN), once in
// order (neighbouring lanes hold neighbouring patterns: warps mostly in one branch) and once
// scattered by an odd multiplier (warps of mixed branches), on few blocks (grid-stride loop)
// and on many.
TEST(WarpErfGpu, EqualsDetErfOverTheFloatLine) {
  MXLAB_REQUIRE_GPU();
  constexpr uint32_t kN = 1u << 24;
  std::vector<uint8_t> active(kN / 4, 1);
  for (uint32_t mult : {1u, 2654435761u}) {
    std::vector<float> x(kN);
    for (uint32_t i = 0; i < kN; ++i) {
      const uint32_t k = (i * mult) & (kN - 1);
      x[i] = bits_f32((k << 8) | ((k * 2654435761u) >> 24));
    }
    for (int blocks : {7, static_cast<int>(kN / 4 / kThreads)}) {
      const Result r = run_and_compare(x, active, blocks);
      EXPECT_EQ(r.mismatches, 0) << "multiplier " << mult << ", " << blocks << " blocks, first at " << r.first;
    }
  }
}

// Warps built to hold exactly k tail values (k = 0..128, every count of compacted passes and
// every partial last pass), the rest short-branch, saturated, boundary and special values, with
// lanes switched off at random (their values must not enter the tail list) and a lane count
// that ends inside a warp.
TEST(WarpErfGpu, EqualsDetErfForEveryTailCountAndInactiveLanes) {
  MXLAB_REQUIRE_GPU();
  const float kSpecial[] = {0.0f,       -0.0f,          1.0f,           -1.0f,          0.99999994f, 1.00000012f,
                            3.99999976f, 4.0f,          -4.0f,          1e-40f,         -1e-45f,     5.5f,
                            1e30f,       -1e30f,        bits_f32(0x7f800000u), bits_f32(0xff800000u),
                            bits_f32(0x7fc00000u), bits_f32(0xffa00001u)};
  constexpr int kSpecials = sizeof(kSpecial) / sizeof(kSpecial[0]);
  constexpr int kRepeats = 24;  // warps per tail count
  std::vector<float> x;
  std::vector<uint8_t> active;
  uint64_t counter = 0;
  auto uniform = [&](uint32_t salt) {
    const U32x4 w = philox(0xE4F5u, Stream::data, salt, counter++);
    return u32_to_uniform(w.v[0]);
  };
  for (int k = 0; k <= 128; ++k) {
    for (int rep = 0; rep < kRepeats; ++rep) {
      const bool with_inactive = rep % 2 == 1;
      // Exactly k of the warp's 128 values are tail values; choose which by a random permutation.
      std::vector<int> slot(128);
      for (int i = 0; i < 128; ++i) slot[i] = i;
      for (int i = 127; i > 0; --i) std::swap(slot[i], slot[static_cast<int>(uniform(1) * (i + 1)) % (i + 1)]);
      std::vector<float> v(128);
      for (int i = 0; i < 128; ++i) {
        const bool tail = i < k;
        const float u = uniform(2);
        float val;
        if (tail) {
          val = 1.0f + 3.0f * u;  // [1, 4)
          if (val >= 4.0f) val = 3.99999976f;
        } else if (uniform(3) < 0.25f) {
          val = kSpecial[static_cast<int>(uniform(4) * kSpecials) % kSpecials];
          if (detmath::erf_in_tail(detmath::abs_bits(val))) val = 0.5f;  // keep the count exact
        } else {
          val = u * 0.99999994f;  // [0, 1)
        }
        if (uniform(5) < 0.5f) val = -val;
        v[slot[i]] = val;
      }
      for (int l = 0; l < 32; ++l) {
        for (int j = 0; j < 4; ++j) x.push_back(v[4 * l + j]);
        active.push_back(with_inactive && uniform(6) < 0.3f ? 0 : 1);
      }
    }
  }
  // End inside a warp: drop the last 13 lanes.
  x.resize(x.size() - 13 * 4);
  active.resize(active.size() - 13);
  for (int blocks : {3, 1000}) {
    const Result r = run_and_compare(x, active, blocks);
    EXPECT_EQ(r.mismatches, 0) << blocks << " blocks, first at " << r.first;
  }
  std::printf("[warp erf] %zu values in %zu lanes, tail counts 0-128 per warp: compared bit for bit\n", x.size(),
              active.size());
}
