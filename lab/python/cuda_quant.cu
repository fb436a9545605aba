// mxlab._core on CUDA (cuda_quant.h): the kernels of kernels/quantize.cuh on memory that Python
// hands over, on the device and stream the caller names. Nothing here computes a value: the
// kernels do, with the scalar code of lab/mx/scalar.h that the CPU reference calls.
#include "lab/python/cuda_quant.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/quantize.cuh"
#include "lab/core/error.h"

namespace mxlab::python {

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky launch error's record where it is not sticky
  throw CudaFailure(msg("mxlab.quantize: CUDA error in ", what, ": ", cudaGetErrorString(e)));
}

// `device` current for the scope (-1: the one already current); the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (device >= 0 && device != prev_) {
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) (void)cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// The statistics counters, stream-ordered: allocated, zeroed and freed on the caller's stream,
// so that no call here synchronises the device (cudaFree would).
class Counters {
 public:
  explicit Counters(cudaStream_t s) : s_(s) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&p_), sizeof(unsigned long long) * cuda::kStatWords, s),
          "cudaMallocAsync");
    check(cudaMemsetAsync(p_, 0, sizeof(unsigned long long) * cuda::kStatWords, s), "cudaMemsetAsync");
  }
  ~Counters() {
    if (p_) (void)cudaFreeAsync(p_, s_);
  }
  Counters(const Counters&) = delete;
  Counters& operator=(const Counters&) = delete;
  unsigned long long* get() const { return p_; }

 private:
  cudaStream_t s_;
  unsigned long long* p_ = nullptr;
};

void launch(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, const QuantSpec& spec,
            unsigned long long* d_stats, cudaStream_t s) {
  cuda::QuantLaunch L;
  L.in = in;
  L.rows = rows;
  L.cols = cols;
  L.axis = axis;
  L.q = spec;  // salt 0 and no device step: the stochastic stream of the CPU reference
  L.d_stats = d_stats;
  L.stats_q = spec;  // the statistics of this very quantization, in the same pass
  try {
    cuda::quantize_f32(L, out, s);
  } catch (const Error& e) {
    // The launchers' CUDA failures (MXLAB_CUDA_CHECK) are runtime errors, not bad input.
    if (std::strncmp(e.what(), "CUDA error", 10) == 0) throw CudaFailure(msg("mxlab.quantize: ", e.what()));
    throw;
  }
}

QuantStats read_counters(const unsigned long long* d, cudaStream_t s) {
  unsigned long long h[cuda::kStatWords] = {};
  check(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  QuantStats st;
  st.n = h[cuda::kStatN];
  st.lastbin = h[cuda::kStatLastbin];
  st.clamped = h[cuda::kStatClamped];
  st.nan_blocks = h[cuda::kStatNanBlocks];
  st.blocks = h[cuda::kStatBlocks];
  return st;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found none";
  return n;
}

void quantize_device(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, const QuantSpec& spec,
                     int device, uintptr_t stream, QuantStats* stats, QuantError* err) {
  DeviceScope scope(device);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const int64_t n = rows * cols;
  if (!stats) {
    launch(in, out, rows, cols, axis, spec, nullptr, s);
    return;
  }
  {
    Counters c(s);
    launch(in, out, rows, cols, axis, spec, c.get(), s);
    *stats = read_counters(c.get(), s);
  }
  if (!err) return;
  // ||Q(x) - x|| / ||x|| as `mxlab quantize --stats` sums it: in double, in element order, on
  // the host (a device reduction would add in another order and could differ in the last bit).
  std::vector<float> hx(static_cast<size_t>(n)), hq(static_cast<size_t>(n));
  if (n > 0) {
    check(cudaMemcpyAsync(hx.data(), in, sizeof(float) * hx.size(), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(hq.data(), out, sizeof(float) * hq.size(), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  *err = quant_error(hx.data(), hq.data(), n);
}

void quantize_host_on_device(const float* in, float* out, int64_t rows, int64_t cols, Axis axis,
                             const QuantSpec& spec, int device, QuantStats* stats, QuantError* err) {
  DeviceScope scope(device);
  const int64_t n = rows * cols;
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  float* d = nullptr;
  if (n > 0) check(cudaMalloc(reinterpret_cast<void**>(&d), bytes), "cudaMalloc");
  struct Free {
    float* p;
    ~Free() {
      if (p) (void)cudaFree(p);
    }
  } guard{d};
  cudaStream_t s = nullptr;  // the legacy default stream: every call below is synchronous anyway
  if (n > 0) check(cudaMemcpy(d, in, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (stats) {
    Counters c(s);
    launch(d, d, rows, cols, axis, spec, c.get(), s);
    *stats = read_counters(c.get(), s);
  } else {
    launch(d, d, rows, cols, axis, spec, nullptr, s);
  }
  if (n > 0) check(cudaMemcpy(out, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  if (err) *err = quant_error(in, out, n);
}

}  // namespace mxlab::python
