// Helpers of the GPU-vs-CPU op tests: one buffer on both backends (Twin), bit-exact and
// derived-tolerance comparisons that print the first few mismatches, and the tolerance of a
// double sum cast to float (the rules are written down in test_cuda_backend.cu's header).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"

namespace mxlab::gputest {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kMaxReport = 5;  // mismatches printed per comparison

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// One buffer on both backends.
struct Buf {
  float* c = nullptr;
  float* g = nullptr;
  size_t n = 0;
};

struct Twin {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);

  Buf make(const std::vector<float>& v) {
    Buf b{cpu->alloc(v.size()), gpu->alloc(v.size()), v.size()};
    cpu->upload(b.c, v.data(), v.size());
    gpu->upload(b.g, v.data(), v.size());
    return b;
  }
  Buf poisoned(size_t n) { return make(std::vector<float>(n, kNaN)); }
  void poison(const Buf& b) {
    const std::vector<float> nan(b.n, kNaN);
    cpu->upload(b.c, nan.data(), b.n);
    gpu->upload(b.g, nan.data(), b.n);
  }
  std::vector<float> host_cpu(const Buf& b, size_t n = 0) {
    std::vector<float> v(n ? n : b.n);
    cpu->download(v.data(), b.c, v.size());
    return v;
  }
  std::vector<float> host_gpu(const Buf& b, size_t n = 0) {
    std::vector<float> v(n ? n : b.n);
    gpu->download(v.data(), b.g, v.size());
    return v;
  }
  void set_step(const StepScalars& s) {
    cpu->set_step(s);
    gpu->set_step(s);
  }
};

inline std::vector<float> normal(size_t n, uint64_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(shift, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element bit-identical (NaNs count as equal to NaNs) and, unless allow_nan, finite.
inline ::testing::AssertionResult same_bits(const std::vector<float>& ref, const std::vector<float>& got,
                                     bool allow_nan = false) {
  if (ref.size() != got.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  size_t bad = 0, unwritten = 0;
  std::string report;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool both_nan = std::isnan(ref[i]) && std::isnan(got[i]);
    if (!allow_nan && !std::isfinite(got[i])) ++unwritten;
    if (!(both_nan || bits(ref[i]) == bits(got[i]))) {
      if (bad++ < kMaxReport) report += msg("\n  [", i, "] cpu ", ref[i], " gpu ", got[i]);
    }
  }
  if (bad == 0 && unwritten == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size() << " differ, " << unwritten
                                       << " not finite (unwritten?)" << report;
}

// |got - ref| <= tol[i] everywhere, all finite.
inline ::testing::AssertionResult within(const std::vector<float>& ref, const std::vector<float>& got,
                                  const std::vector<double>& tol) {
  size_t bad = 0;
  std::string report;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (!std::isfinite(got[i]) || !(e <= tol[i])) {
      if (bad++ < kMaxReport) report += msg("\n  [", i, "] cpu ", ref[i], " gpu ", got[i], " err ", e, " tol ", tol[i]);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size() << " outside tolerance" << report;
}

// Tolerance of a double sum of n terms with absolute sum S, cast to float (see the header).
inline double sum_tol(int64_t n, double abs_sum, double ref) {
  return 2.0 * static_cast<double>(n) * std::ldexp(abs_sum, -53) + std::ldexp(std::fabs(ref), -23) + 1e-300;
}

// ulp of |x| in a format with `mant` fraction bits (float: 23, bf16: 7).
inline double ulp(double x, int mant) {
  const double a = std::fabs(x);
  if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -126 - mant);
  return std::ldexp(1.0, std::ilogb(a) - mant);
}

// Layernorm rule (see the header): >= 99% of rows bit-exact, every element within 4 ulps.
inline void expect_rows_nearly_exact(const std::vector<float>& ref, const std::vector<float>& got, int64_t rows, int64_t d,
                              bool bf16, const char* what) {
  ASSERT_EQ(ref.size(), got.size());
  int64_t rows_diff = 0, bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    bool diff = false;
    for (int64_t j = 0; j < d; ++j) {
      const float r = ref[i * d + j], g = got[i * d + j];
      if (!std::isfinite(g)) {
        ++bad;
        continue;
      }
      if (bits(r) != bits(g)) {
        diff = true;
        if (std::fabs(static_cast<double>(r) - g) > 4.0 * ulp(r, bf16 ? 7 : 23)) {
          if (bad++ < kMaxReport) ADD_FAILURE() << what << " [" << i << "," << j << "] cpu " << r << " gpu " << g;
        }
      }
    }
    rows_diff += diff;
  }
  EXPECT_EQ(bad, 0) << what << ": elements beyond 4 ulps or not written";
  EXPECT_LE(rows_diff * 100, rows) << what << ": " << rows_diff << " of " << rows << " rows not bit-exact";
}

}  // namespace mxlab::gputest
