// The attention projections' host instruments (attn_instruments.h).
#include "lab/train/attn_instruments.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace mxlab {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Σ_j a[j] x[j] in double, four partial sums (j mod 4) added at the end: a fixed order.
double row_dot(const float* a, const double* x, int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += static_cast<double>(a[j]) * x[j];
    s1 += static_cast<double>(a[j + 1]) * x[j + 1];
    s2 += static_cast<double>(a[j + 2]) * x[j + 2];
    s3 += static_cast<double>(a[j + 3]) * x[j + 3];
  }
  for (; j < n; ++j) s0 += static_cast<double>(a[j]) * x[j];
  return (s0 + s1) + (s2 + s3);
}

double norm2(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

}  // namespace

double spectral_start(int64_t j) {
  return static_cast<double>(splitmix64(static_cast<uint64_t>(j)) >> 40) * 0x1p-24 - 0.5;
}

double spectral_norm(const float* a, int64_t rows, int64_t cols, int iters) {
  const size_t n = static_cast<size_t>(rows * cols);
  bool zero = true;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return kNaN;
    zero = zero && a[i] == 0.0f;
  }
  if (zero || rows <= 0 || cols <= 0) return 0.0;
  std::vector<double> v(static_cast<size_t>(cols)), w(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(j)] = spectral_start(j);
  double nv = norm2(v);
  for (double& x : v) x /= nv;
  for (int k = 0; k < iters; ++k) {
    // w = Aᵀ(A v), one pass over A: u_i = A_i·v, then w += u_i A_i.
    std::fill(w.begin(), w.end(), 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      const float* ai = a + i * cols;
      const double u = row_dot(ai, v.data(), cols);
      for (int64_t j = 0; j < cols; ++j) w[static_cast<size_t>(j)] += u * static_cast<double>(ai[j]);
    }
    nv = norm2(w);
    if (!(nv > 0.0)) break;  // A v = 0: v lies in A's null space (A ≠ 0: a start orthogonal to its row space)
    for (size_t j = 0; j < w.size(); ++j) v[j] = w[j] / nv;
  }
  double s = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const double u = row_dot(a + i * cols, v.data(), cols);
    s += u * u;
  }
  return std::sqrt(s);
}

void spectral_norms(const float* const* mats, size_t count, int64_t rows, int64_t cols, double* out, unsigned threads,
                    int iters) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // Small batches (under 2^20 entries in all: about a millisecond) are not worth starting threads.
  if (static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(count) < 1048576.0) threads = 1;
  threads = static_cast<unsigned>(std::min<size_t>(threads, count));
  if (threads <= 1) {
    for (size_t i = 0; i < count; ++i) out[i] = spectral_norm(mats[i], rows, cols, iters);
    return;
  }
  // Thread t takes matrices t, t + threads, ...: a fixed assignment, one writer per out[i].
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      for (size_t i = t; i < count; i += threads) out[i] = spectral_norm(mats[i], rows, cols, iters);
    });
  for (std::thread& th : pool) th.join();
}

double direction_cosine(const float* a, const float* b, size_t n) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  if (!std::isfinite(ab) || !std::isfinite(aa) || !std::isfinite(bb) || !(aa > 0.0) || !(bb > 0.0)) return kNaN;
  // sqrt(aa * bb) rather than sqrt(aa) sqrt(bb): sqrt(x * x) = x exactly in binary floating point,
  // so a repeated direction gives exactly 1. aa and bb are sums of squares of floats (each within
  // 2^-298 .. 2^256), so their product stays inside a double's normal range.
  return std::clamp(ab / std::sqrt(aa * bb), -1.0, 1.0);
}

}  // namespace mxlab
