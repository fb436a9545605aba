// cuBLAS floors and event timing for `mxlab bench` (see bench_support.h).
#include "kernels/bench_support.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda_backend_internal.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/launch_util.cuh"
#include "lab/core/philox.h"

namespace mxlab::cuda {

namespace {

constexpr size_t kCublasWorkspaceBytes = 32u << 20;

// Uniform values in [-1, 1) scaled by 1/sqrt(K)-ish magnitudes do not matter for timing, but
// zeros would (they can run faster): fill with Philox noise.
template <class T>
__global__ void fill_noise(T* p, int64_t n, uint32_t salt) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const U32x4 w = philox(0x5eedull, Stream::validation, salt, static_cast<uint64_t>(i));
  const float v = u32_to_uniform(w.v[0]) * 2.0f - 1.0f;
  p[i] = static_cast<T>(v);
}

template <class T>
T* noise_buffer(int64_t n, uint32_t salt, cudaStream_t s) {
  T* p = nullptr;
  MXLAB_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
  fill_noise<T><<<grid_for(n), kBlock, 0, s>>>(p, n, salt);
  MXLAB_CUDA_LAUNCH_CHECK();
  return p;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// A non-blocking stream on `device` and a cuBLAS handle bound to it (the caller destroys both).
void stream_and_handle(int device, cudaStream_t* s, cublasHandle_t* h) {
  MXLAB_CUDA_CHECK(cudaSetDevice(device));
  MXLAB_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  MXLAB_CUBLAS_CHECK(cublasCreate(h));
  MXLAB_CUBLAS_CHECK(cublasSetStream(*h, *s));
}

}  // namespace

double gemm_floor_ms(const std::vector<GemmShape>& shapes, FloorKind kind, int device, int warmup, int reps) {
  cudaStream_t s = nullptr;
  cublasHandle_t h = nullptr;
  stream_and_handle(device, &s, &h);
  void* ws = nullptr;
  MXLAB_CUDA_CHECK(cudaMalloc(&ws, kCublasWorkspaceBytes));
  MXLAB_CUBLAS_CHECK(cublasSetWorkspace(h, ws, kCublasWorkspaceBytes));
  const bool bf = kind == FloorKind::bf16, dflt = kind == FloorKind::sgemm_default;
  // Never TF32 in the floor either: pedantic math, or (sgemm_default) the default math mode,
  // which uses TF32 only when asked to (CUBLAS_TF32_TENSOR_OP_MATH or NVIDIA_TF32_OVERRIDE=1).
  MXLAB_CUBLAS_CHECK(cublasSetMathMode(h, dflt ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
  const cudaDataType_t in_t = bf ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t ct = bf || dflt ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
  std::vector<void*> bufs;
  struct Call {
    GemmShape g;
    void *a, *b;
    float* c;
  };
  std::vector<Call> calls;
  uint32_t salt = 0;
  for (const GemmShape& g : shapes) {
    Call c{g, nullptr, nullptr, nullptr};
    if (bf) {
      c.a = noise_buffer<__nv_bfloat16>(g.batch * g.M * g.K, salt++, s);
      c.b = noise_buffer<__nv_bfloat16>(g.batch * g.N * g.K, salt++, s);
    } else {
      c.a = noise_buffer<float>(g.batch * g.M * g.K, salt++, s);
      c.b = noise_buffer<float>(g.batch * g.N * g.K, salt++, s);
    }
    c.c = noise_buffer<float>(g.batch * g.M * g.N, salt++, s);
    bufs.insert(bufs.end(), {c.a, c.b, c.c});
    calls.push_back(c);
  }
  // Row-major C[M x N] = A B^T is column-major C^T [N x M] = B' A'^T: cuBLAS's first operand
  // is B (transposed when stored [N x K]), its second A (transposed when stored [K x M]).
  auto run_all = [&] {
    const float one = 1.0f, zero = 0.0f;
    for (const Call& c : calls) {
      const GemmShape& g = c.g;
      const cublasOperation_t ta = g.b_kc ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t tb = g.a_kc ? CUBLAS_OP_N : CUBLAS_OP_T;
      const int lda = static_cast<int>(g.b_kc ? g.K : g.N);
      const int ldb = static_cast<int>(g.a_kc ? g.K : g.M);
      if (g.batch == 1) {
        MXLAB_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, static_cast<int>(g.N), static_cast<int>(g.M),
                                        static_cast<int>(g.K), &one, c.b, in_t, lda, c.a, in_t, ldb, &zero, c.c,
                                        CUDA_R_32F, static_cast<int>(g.N), ct, CUBLAS_GEMM_DEFAULT));
      } else {
        MXLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            h, ta, tb, static_cast<int>(g.N), static_cast<int>(g.M), static_cast<int>(g.K), &one, c.b, in_t, lda,
            g.N * g.K, c.a, in_t, ldb, g.M * g.K, &zero, c.c, CUDA_R_32F, static_cast<int>(g.N), g.M * g.N,
            static_cast<int>(g.batch), ct, CUBLAS_GEMM_DEFAULT));
      }
    }
  };
  run_all();  // heuristics and lazy initialisation outside the capture
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MXLAB_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  run_all();
  MXLAB_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  MXLAB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(reps));
  for (cudaEvent_t& e : ev) MXLAB_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < warmup; ++i) MXLAB_CUDA_CHECK(cudaGraphLaunch(exec, s));
  for (int i = 0; i < reps; ++i) {
    MXLAB_CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
    MXLAB_CUDA_CHECK(cudaGraphLaunch(exec, s));
    MXLAB_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
  }
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float t = 0.0f;
    MXLAB_CUDA_CHECK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms[i] = t;
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (void* p : bufs) cudaFree(p);
  cudaFree(ws);
  cublasDestroy(h);
  cudaStreamDestroy(s);
  return median(ms);
}

struct LaneTimer::Impl {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> ev;
};

LaneTimer::LaneTimer(Backend& be, int steps) : impl_(std::make_unique<Impl>()) {
  impl_->stream = lane_stream(be, 0);
  impl_->ev.resize(2 * static_cast<size_t>(steps));
  for (cudaEvent_t& e : impl_->ev) MXLAB_CUDA_CHECK(cudaEventCreate(&e));
}

LaneTimer::~LaneTimer() {
  for (cudaEvent_t e : impl_->ev) cudaEventDestroy(e);
}

void LaneTimer::start(int i) { MXLAB_CUDA_CHECK(cudaEventRecord(impl_->ev.at(2 * i), impl_->stream)); }
void LaneTimer::stop(int i) { MXLAB_CUDA_CHECK(cudaEventRecord(impl_->ev.at(2 * i + 1), impl_->stream)); }

std::vector<double> LaneTimer::elapsed_ms() {
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  std::vector<double> ms(impl_->ev.size() / 2);
  for (size_t i = 0; i < ms.size(); ++i) {
    float t = 0.0f;
    MXLAB_CUDA_CHECK(cudaEventElapsedTime(&t, impl_->ev[2 * i], impl_->ev[2 * i + 1]));
    ms[i] = t;
  }
  return ms;
}

double sgemm_default_rel_diff(const GemmShape& g, int device) {
  cudaStream_t s = nullptr;
  cublasHandle_t h = nullptr;
  stream_and_handle(device, &s, &h);
  const int64_t na = g.batch * g.M * g.K, nb = g.batch * g.N * g.K, nc = g.batch * g.M * g.N;
  float* a = noise_buffer<float>(na, 101, s);
  float* b = noise_buffer<float>(nb, 102, s);
  float* c[2] = {noise_buffer<float>(nc, 103, s), noise_buffer<float>(nc, 104, s)};
  const float one = 1.0f, zero = 0.0f;
  const cublasOperation_t ta = g.b_kc ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.a_kc ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int lda = static_cast<int>(g.b_kc ? g.K : g.N), ldb = static_cast<int>(g.a_kc ? g.K : g.M);
  for (int k = 0; k < 2; ++k) {  // 0: pedantic, 1: COMPUTE_32F with the default math mode
    MXLAB_CUBLAS_CHECK(cublasSetMathMode(h, k == 0 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
    MXLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, ta, tb, static_cast<int>(g.N), static_cast<int>(g.M), static_cast<int>(g.K), &one, b, CUDA_R_32F, lda,
        g.N * g.K, a, CUDA_R_32F, ldb, g.M * g.K, &zero, c[k], CUDA_R_32F, static_cast<int>(g.N), g.M * g.N,
        static_cast<int>(g.batch), k == 0 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  std::vector<float> hc[2] = {std::vector<float>(static_cast<size_t>(nc)), std::vector<float>(static_cast<size_t>(nc))};
  for (int k = 0; k < 2; ++k)
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(hc[k].data(), c[k], static_cast<size_t>(nc) * sizeof(float),
                                     cudaMemcpyDeviceToHost, s));
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < hc[0].size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(hc[1][i]) - hc[0][i]));
    scale = std::max(scale, std::fabs(static_cast<double>(hc[0][i])));
  }
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c[0]), static_cast<void*>(c[1])})
    cudaFree(p);
  cublasDestroy(h);
  cudaStreamDestroy(s);
  return scale > 0.0 ? diff / scale : 0.0;
}

}  // namespace mxlab::cuda
