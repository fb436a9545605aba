// Helpers of the CPU model tests: seeded test vectors, moving them into a backend, and the
// activations and their first derivatives in double (std:: functions, independent of the
// shared float code they check).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/elementwise.h"

namespace mxlab::test {

constexpr double kPi = 3.14159265358979323846;

// shift + scale * N(0, 1), deterministic (Philox validation stream).
inline std::vector<float> noise(size_t n, uint64_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = shift + scale * randn_elem(seed, Stream::validation, 0, i);
  return v;
}

inline float* put(Backend& be, const std::vector<float>& v) {
  float* p = be.alloc(v.size());
  be.upload(p, v.data(), v.size());
  return p;
}

inline double act_d(Act a, double x) {
  switch (a) {
    case Act::relu: return x > 0 ? x : 0;
    case Act::gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Act::gelu_tanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
    default: return x;
  }
}
inline double act1_d(Act a, double x) {
  switch (a) {
    case Act::relu: return x > 0 ? 1 : 0;
    case Act::gelu: return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * kPi);
    case Act::gelu_tanh: {
      const double c = std::sqrt(2 / kPi), t = std::tanh(c * (x + 0.044715 * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
    default: return 1;
  }
}
inline double sigmoid_d(double x) { return 1 / (1 + std::exp(-x)); }
inline double silu_d(double x) { return x * sigmoid_d(x); }
inline double silu1_d(double x) { return sigmoid_d(x) * (1 + x * (1 - sigmoid_d(x))); }

}  // namespace mxlab::test
