// CPU quantize-dequantize throughput, in GB/s of bytes read plus written, next to a plain
// memcpy of the same bytes timed in the same run, reported as a ratio (a benchmark, not a
// test: it asserts nothing). The CPU path is the reference, written for clarity rather than
// speed; this shows how far from memory speed that leaves it.
//   usage: bench_quantize_cpu [rows=4096] [cols=4096] [repeats=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "lab/mx/quantize.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best of `repeats` runs of f(), in seconds.
template <typename F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> x(n), y(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  const double bytes = 2.0 * static_cast<double>(n) * sizeof(float);  // read + write

  const double t_copy = best_seconds(repeats, [&] { std::memcpy(y.data(), x.data(), n * sizeof(float)); });
  const double copy_gbs = bytes / t_copy / 1e9;
  std::printf("tensor %lld x %lld float32 (%.1f MB read + written), best of %d\n", static_cast<long long>(rows),
              static_cast<long long>(cols), bytes / 1e6, repeats);
  std::printf("%-34s %8.2f GB/s\n", "memcpy", copy_gbs);

  struct Row {
    mxlab::NumFmt fmt;
    mxlab::ScaleRule rule;
    mxlab::Rounding rounding;
    mxlab::Axis axis;
  };
  const Row rows_to_run[] = {
      {mxlab::NumFmt::mxfp8_e4m3, mxlab::ScaleRule::floor, mxlab::Rounding::nearest_even, mxlab::Axis::contiguous},
      {mxlab::NumFmt::mxfp8_e4m3, mxlab::ScaleRule::floor, mxlab::Rounding::nearest_even, mxlab::Axis::strided},
      {mxlab::NumFmt::mxfp8_e4m3, mxlab::ScaleRule::rceil, mxlab::Rounding::nearest_even, mxlab::Axis::contiguous},
      {mxlab::NumFmt::mxfp8_e4m3, mxlab::ScaleRule::floor, mxlab::Rounding::stochastic, mxlab::Axis::contiguous},
      {mxlab::NumFmt::mxfp4_e2m1, mxlab::ScaleRule::floor, mxlab::Rounding::nearest_even, mxlab::Axis::contiguous},
      {mxlab::NumFmt::mxint8, mxlab::ScaleRule::floor, mxlab::Rounding::nearest_even, mxlab::Axis::contiguous},
      {mxlab::NumFmt::bf16, mxlab::ScaleRule::floor, mxlab::Rounding::nearest_even, mxlab::Axis::contiguous},
  };
  for (const Row& r : rows_to_run) {
    mxlab::QuantSpec s;
    s.fmt = r.fmt;
    s.rule = r.rule;
    s.rounding = r.rounding;
    const double t = best_seconds(repeats, [&] {
      mxlab::quantize_dequantize(x.data(), y.data(), rows, cols, r.axis, s);
    });
    const double gbs = bytes / t / 1e9;
    char label[96];
    std::snprintf(label, sizeof label, "%s %s %s %s", mxlab::name(r.fmt), mxlab::name(r.rule), mxlab::name(r.rounding),
                  r.axis == mxlab::Axis::contiguous ? "contig" : "strided");
    std::printf("%-34s %8.2f GB/s  (%.3f of memcpy, %.2f ns/element)\n", label, gbs, gbs / copy_gbs,
                t / static_cast<double>(n) * 1e9);
  }
  return 0;
}
