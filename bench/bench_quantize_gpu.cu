// Benchmark of the CUDA quantization kernels and the quantized GEMM (kernels/quantize.cuh,
// kernels/gemm.cuh). Quantization is memory bound by design: each variant is reported in GB/s
// (bytes read + bytes written, counted as the fewest the pass must move) and as a ratio to the
// measured device-to-device copy bandwidth (cudaMemcpyAsync, also read + write). Target: >= 0.8.
// Method: CUDA events around each run, warm-up first, median of kReps runs, inputs rotated over
// kBuffers buffers of 256 MiB (far larger than L2) filled with non-zero values of many magnitudes.
// Usage: bench_quantize_gpu [rows cols]   (default 8192 8192)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/event_timing.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/gemm.cuh"
#include "kernels/quantize.cuh"
#include "lab/core/philox.h"

namespace {

using namespace mxlab;
using namespace mxlab::cuda;

constexpr int kWarmup = 3;
constexpr int kReps = 25;
constexpr int kBuffers = 3;

// Deterministic non-zero inputs: uniform in +-[0.5, 1) times 2^e, e in [-12, 3].
__global__ void fill_kernel(float* x, int64_t n, uint32_t salt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const U32x4 r = philox(12345, Stream::data, salt, static_cast<uint64_t>(i));
    const float m = 0.5f + 0.5f * u32_to_uniform(r.v[0]);
    const int e = static_cast<int>(r.v[1] % 16u) - 12;
    x[i] = ((r.v[2] & 1u) ? -m : m) * ldexpf(1.0f, e);
  }
}

// f(i) for i = 0, 1, ...: kWarmup calls, then the median of kReps single timed calls, in ms. Call
// i reads buffer set i % kBuffers (the warm-up calls come first in that count).
double median_ms(cudaStream_t s, const std::function<void(int)>& f) {
  return bench::median_event_ms(s, kWarmup, kReps, 1, f);
}

struct Row {
  std::string name;
  double ms, gbs, ratio;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t rows = argc > 2 ? std::atoll(argv[1]) : 8192;
    const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 8192;
    const int64_t n = rows * cols;
    if (rows <= 0 || cols <= 0 || n < 2 * 2048 * 512)
      throw Error("tensor too small: the GEMM part takes its operands from the inputs (need >= 2^21 elements)");
    cudaDeviceProp prop{};
    MXLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %.0f MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
    std::printf("tensor %lld x %lld fp32 (%.0f MiB), %d input buffers, median of %d runs after %d warm-up\n",
                static_cast<long long>(rows), static_cast<long long>(cols), n * 4 / 1048576.0, kBuffers, kReps, kWarmup);
    cudaStream_t s;
    MXLAB_CUDA_CHECK(cudaStreamCreate(&s));
    std::vector<float*> in(kBuffers);
    for (int i = 0; i < kBuffers; ++i) {
      MXLAB_CUDA_CHECK(cudaMalloc(&in[i], n * sizeof(float)));
      fill_kernel<<<1024, 256, 0, s>>>(in[i], n, static_cast<uint32_t>(i));
      MXLAB_CUDA_LAUNCH_CHECK();
    }
    float* out32 = nullptr;
    __nv_bfloat16* out16 = nullptr;
    unsigned long long* stats = nullptr;
    uint32_t* d_step = nullptr;
    MXLAB_CUDA_CHECK(cudaMalloc(&out32, n * sizeof(float)));
    MXLAB_CUDA_CHECK(cudaMalloc(&out16, n * sizeof(__nv_bfloat16)));
    MXLAB_CUDA_CHECK(cudaMalloc(&stats, kStatWords * sizeof(unsigned long long)));
    MXLAB_CUDA_CHECK(cudaMalloc(&d_step, sizeof(uint32_t)));
    MXLAB_CUDA_CHECK(cudaMemsetAsync(stats, 0, kStatWords * sizeof(unsigned long long), s));
    MXLAB_CUDA_CHECK(cudaMemsetAsync(d_step, 0, sizeof(uint32_t), s));

    // ---- copy bandwidth ----
    const double copy_ms = median_ms(s, [&](int i) {
      MXLAB_CUDA_CHECK(cudaMemcpyAsync(out32, in[i % kBuffers], n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    });
    const double copy_gbs = 2.0 * n * sizeof(float) / (copy_ms * 1e-3) / 1e9;
    std::printf("device-to-device copy: %.3f ms, %.1f GB/s (read + write)\n\n", copy_ms, copy_gbs);

    // ---- quantize variants ----
    std::vector<Row> table;
    auto variant = [&](const std::string& label, NumFmt fmt, Axis axis, bool bf16_out, Rounding rnd, bool with_stats) {
      QuantLaunch L;
      L.rows = rows;
      L.cols = cols;
      L.axis = axis;
      L.q.fmt = fmt;
      L.q.rounding = rnd;
      L.q.seed = 7;
      L.d_step = d_step;
      if (with_stats) {
        L.d_stats = stats;
        L.stats_q = L.q;
      }
      const double ms = median_ms(s, [&](int i) {
        L.in = in[i % kBuffers];
        if (bf16_out) quantize_bf16(L, out16, s);
        else quantize_f32(L, out32, s);
      });
      const double bytes = static_cast<double>(n) * (4.0 + (bf16_out ? 2.0 : 4.0));
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      table.push_back({label, ms, gbs, gbs / copy_gbs});
    };
    for (NumFmt fmt : {NumFmt::mxfp8_e4m3, NumFmt::mxfp4_e2m1})
      for (Axis axis : {Axis::contiguous, Axis::strided})
        for (bool b16 : {false, true})
          variant(std::string(fmt == NumFmt::mxfp8_e4m3 ? "mxfp8_e4m3" : "mxfp4_e2m1") +
                      (axis == Axis::contiguous ? " contiguous" : " strided   ") + (b16 ? " -> bf16" : " -> f32 "),
                  fmt, axis, b16, Rounding::nearest_even, false);
    // Extra variants (not part of the target): statistics fused, stochastic rounding.
    variant("mxfp8_e4m3 contiguous -> bf16 +stats", NumFmt::mxfp8_e4m3, Axis::contiguous, true, Rounding::nearest_even, true);
    variant("mxfp8_e4m3 strided    -> bf16 +stats", NumFmt::mxfp8_e4m3, Axis::strided, true, Rounding::nearest_even, true);
    variant("mxfp8_e4m3 contiguous -> bf16 stochastic", NumFmt::mxfp8_e4m3, Axis::contiguous, true, Rounding::stochastic, false);
    variant("mxfp8_e4m3 strided    -> bf16 stochastic", NumFmt::mxfp8_e4m3, Axis::strided, true, Rounding::stochastic, false);

    // ---- GEMM: quantized (2 quantize passes + bf16 GEMM) vs plain bf16 GEMM on pre-quantized operands ----
    const int64_t M = 2048, N = 2048, K = 512;
    GemmRunner runner(s);
    runner.reserve(std::max(M * K, N * K));
    float* C = nullptr;
    MXLAB_CUDA_CHECK(cudaMalloc(&C, M * N * sizeof(float)));
    GemmOperand a, b;
    a.q.fmt = b.q.fmt = NumFmt::mxfp8_e4m3;
    ElementwiseRound none;
    auto set_ops = [&](int i) {
      a.p = in[i % kBuffers];
      b.p = in[(i + 1) % kBuffers] + M * K;
    };
    const double q_ms = median_ms(s, [&](int i) {
      set_ops(i);
      runner.run(M, N, K, a, b, C, 0.0f, none, d_step, nullptr);
    });
    const double q_ms_bwd = median_ms(s, [&](int i) {  // operands stored [K x M], [K x N]: strided quantization
      set_ops(i);
      a.k_contiguous = b.k_contiguous = false;
      runner.run(M, N, K, a, b, C, 0.0f, none, d_step, nullptr);
      a.k_contiguous = b.k_contiguous = true;
    });
    // Pre-quantized bf16 operands, then the same cuBLAS call alone.
    __nv_bfloat16 *qa = nullptr, *qb = nullptr;
    MXLAB_CUDA_CHECK(cudaMalloc(&qa, M * K * sizeof(__nv_bfloat16)));
    MXLAB_CUDA_CHECK(cudaMalloc(&qb, N * K * sizeof(__nv_bfloat16)));
    {
      set_ops(0);
      QuantLaunch La = operand_launch(a, M, K, d_step, nullptr), Lb = operand_launch(b, N, K, d_step, nullptr);
      quantize_bf16(La, qa, s);
      quantize_bf16(Lb, qb, s);
    }
    cublasHandle_t h;
    MXLAB_CUBLAS_CHECK(cublasCreate(&h));
    MXLAB_CUBLAS_CHECK(cublasSetStream(h, s));
    void* ws = nullptr;
    MXLAB_CUDA_CHECK(cudaMalloc(&ws, size_t{32} << 20));
    MXLAB_CUBLAS_CHECK(cublasSetWorkspace(h, ws, size_t{32} << 20));
    const float one = 1.0f, zero = 0.0f;
    const double bf_ms = median_ms(s, [&](int) {
      MXLAB_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, qb, CUDA_R_16BF, K, qa, CUDA_R_16BF, K,
                                      &zero, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    GemmOperand fa = a, fb = b;
    fa.q.fmt = fb.q.fmt = NumFmt::fp32;
    const double sg_ms = median_ms(s, [&](int i) {
      fa.p = in[i % kBuffers];
      fb.p = in[(i + 1) % kBuffers] + M * K;
      runner.run(M, N, K, fa, fb, C, 0.0f, none, nullptr, nullptr);
    });
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));

    const double flop = 2.0 * M * N * K;
    std::printf("GEMM %lld x %lld x %lld:\n", static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
    std::printf("  MXFP8 E4M3 quantized GEMM (A,B k-contiguous): %8.4f ms  %6.1f TFLOP/s\n", q_ms, flop / q_ms / 1e9);
    std::printf("  MXFP8 E4M3 quantized GEMM (A,B strided)     : %8.4f ms  %6.1f TFLOP/s\n", q_ms_bwd, flop / q_ms_bwd / 1e9);
    std::printf("  bf16 cuBLAS GEMM on pre-quantized operands  : %8.4f ms  %6.1f TFLOP/s  (quantize overhead %.4f ms)\n",
                bf_ms, flop / bf_ms / 1e9, q_ms - bf_ms);
    std::printf("  FP32 SGEMM (pedantic, no TF32)              : %8.4f ms  %6.1f TFLOP/s\n\n", sg_ms, flop / sg_ms / 1e9);

    std::printf("%-44s %9s %9s %8s\n", "quantize variant", "ms", "GB/s", "vs copy");
    for (const Row& r : table)
      std::printf("%-44s %9.4f %9.1f %8.3f\n", r.name.c_str(), r.ms, r.gbs, r.ratio);
    std::printf("(copy: %.1f GB/s; bytes counted: 4 read + 4 (f32) or 2 (bf16) written per element)\n", copy_gbs);

    cublasDestroy(h);
    cudaFree(ws);
    cudaFree(qa);
    cudaFree(qb);
    cudaFree(C);
    for (float* p : in) cudaFree(p);
    cudaFree(out32);
    cudaFree(out16);
    cudaFree(stats);
    cudaFree(d_step);
    cudaStreamDestroy(s);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_quantize_gpu: %s\n", e.what());
    return 1;
  }
}
