// The backend interface: every numeric operation a training step performs. The model and
// the trainer (lab/model, lab/train) are written once against it; lab/cpu/ implements it
// with plain loops + Eigen (the reference) and kernels/ with CUDA + cuBLAS (the fast one).
//
// Rules every implementation follows (DESIGN.md section 9):
//   - Buffers are float32 arrays in the backend's memory (host or device), row-major.
//     Shapes are validated once, above the dispatch (in the model), not in each backend.
//   - Element-wise ops and quantization evaluate the shared scalar code (lab/mx/scalar.h,
//     lab/model/elementwise.h) and so agree bit for bit across backends.
//   - Reductions have a fixed order (no float atomics): repeated runs are bit-identical.
//     Across backends they agree within a tolerance derived from the reduction length.
//   - Nothing an op does may depend on host-side values that change from step to step,
//     except through StepScalars (set once per step by set_step): this lets the CUDA
//     backend capture a step into a CUDA graph and replay it.
//   - Ops are asynchronous where the backend is (CUDA); only the read_* calls and
//     download() synchronise.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lab/core/philox.h"
#include "lab/mx/quantize.h"

namespace mxlab {

// Step-dependent scalars, set once per step before any op of that step.
struct StepScalars {
  uint32_t step = 0;    // 0-based step index: selects the data batch and stochastic-rounding stream
  float lr = 0.0f;      // learning rate of this step (after schedule)
  float bc1 = 1.0f;     // Adam bias corrections 1 - beta1^(t+1), 1 - beta2^(t+1), computed on the
  float bc2 = 1.0f;     //   host once (so both backends use the identical float)
};

// Element-wise rounding applied to the outputs of vector ops and GEMMs.
struct ElementwiseRound {
  bool bf16 = false;                       // false: leave FP32
  Rounding mode = Rounding::nearest_even;  // nearest_even | nearest_away
};

enum class Act : uint8_t { relu = 0, gelu, gelu_tanh, swiglu, linear, kCount };

// One GEMM operand. Logical shapes: C[M x N] = A[M x K] * B[N x K]^T, both quantized along K.
//   A is stored row-major as [M x K] when k_contiguous, else as [K x M];
//   B is stored row-major as [N x K] when k_contiguous, else as [K x N].
// The operand is quantized per `q` (fp32: untouched; bf16/fp16: rounded; MX: blocks of
// q.block along K). When `round_bf16_first`, it is rounded to bf16 (per `bf16_mode`) before
// the MX quantization, as the reference emulator does with bfloat16 element-wise ops.
// `stats_slot` >= 0 asks the backend to add this operand's last-bin/clamped counts, computed
// under `stats_q` (an MX spec; equal to q when q is MX, the diagnostic format otherwise), to
// that statistics slot (see reset_stats / read_stats). Counts are exact integers.
struct GemmOperand {
  const float* p = nullptr;
  bool k_contiguous = true;
  QuantSpec q;
  bool round_bf16_first = false;
  Rounding bf16_mode = Rounding::nearest_even;
  int stats_slot = -1;
  QuantSpec stats_q;
  uint64_t sr_op = 0;  // stochastic rounding: op id mixed into the seed (see quantize_operand)
};

// A dot-product style reduction over n floats, accumulated in double in a fixed order.
struct Reduction {
  enum Kind : uint8_t { dot = 0, diff_sq };  // sum a*b ; sum (a-b)^2
  Kind kind = dot;
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t n = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;           // "cpu" or "cuda:N (NVIDIA H100 ...)"
  virtual std::string math_mode() const = 0;      // recorded in the output, e.g. "IEEE FP32 SGEMM, TF32 off"
  // Extra facts recorded as HDF5 root attributes (CUDA: cuda_runtime, cuda_driver, cublas, gpu).
  virtual std::vector<std::pair<std::string, std::string>> describe() const { return {}; }

  // ---- memory ----
  // Buffers live until the backend is destroyed; contents are undefined until written.
  virtual float* alloc(size_t n) = 0;
  virtual void upload(float* dst, const float* src, size_t n) = 0;      // host -> backend
  virtual void download(float* dst, const float* src, size_t n) = 0;    // backend -> host (syncs)
  virtual void copy(float* dst, const float* src, size_t n) = 0;        // backend -> backend
  virtual void fill(float* dst, float value, size_t n) = 0;

  // ---- step control ----
  virtual void set_step(const StepScalars& s) = 0;
  // Independent work of a step may run concurrently on `lane`s (CUDA streams); lane 0 is the
  // default. set_lane(i > 0) forks: lane i first waits for everything issued on lane 0 so
  // far, then takes the following ops. set_lane(0) returns to lane 0 without waiting.
  // join() makes lane 0 wait for all lanes. The CPU backend runs everything in order.
  virtual void set_lane(int lane) { (void)lane; }
  virtual void join() {}
  // Optional whole-step capture (CUDA graphs). The trainer runs a step's ops as
  //   if (!be.replay(key)) { bool rec = be.begin_capture(key); <ops>; be.end_capture(key); if (rec) be.replay(key); }
  // replay(key) launches a recording made earlier for `key` and returns true; otherwise false.
  // begin_capture(key) returns true when it records (the ops then do not execute until
  // replay) and false when the ops execute eagerly (a backend may execute a key eagerly the
  // first time it sees it, to warm up, and record it the next time). The ops between must
  // be identical (same buffers, same sequence) every time a key is used. Default: no capture.
  virtual bool replay(int key) { (void)key; return false; }
  virtual bool begin_capture(int key) { (void)key; return false; }
  virtual void end_capture(int key) { (void)key; }
  virtual void synchronize() {}

  // ---- random numbers ----
  // out[i] = scale * N(0,1) sample i of (seed, stream, StepScalars.step), i in [0, n):
  // the integer stream is philox(seed, stream, step, i / 2) and pairs use det_box_muller
  // (lab/core/detmath.h), so both backends produce identical floats.
  virtual void randn(float* out, size_t n, uint64_t seed, Stream stream, float scale) = 0;
  // out += scale * N(0,1) (label noise on targets).
  virtual void add_randn(float* out, size_t n, uint64_t seed, Stream stream, float scale) = 0;

  // ---- quantization ----
  // Quantize-dequantize a [rows x cols] tensor (stochastic stream: seed, salt = StepScalars.step).
  virtual void quantize(const float* in, float* out, int64_t rows, int64_t cols, Axis axis,
                        const QuantSpec& q, int stats_slot = -1) = 0;
  // Element-wise bf16 rounding in place.
  virtual void round_bf16(float* x, size_t n, Rounding mode) = 0;

  // ---- GEMM ----
  // C[M x N] = beta * C + A * B^T, with operands quantized as described above, FP32
  // accumulation, then C rounded per `out` (bf16 or left FP32).
  virtual void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b,
                    float* C, float beta, const ElementwiseRound& out) = 0;

  // ---- vector ops (all round their outputs per `r`) ----
  // Layernorm over the last axis of x[rows x d]: y = xhat * gamma + beta, with xhat =
  // (x - mean) * rstd, rstd = 1/sqrt(var + eps) (biased var). gamma/beta may be null (no
  // affine). Saves xhat [rows x d] and rstd [rows] for the backward pass.
  virtual void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xhat,
                             float* rstd, int64_t rows, int64_t d, float eps, const ElementwiseRound& r) = 0;
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma (or dy);
  // dgamma = sum_rows dy * xhat, dbeta = sum_rows dy (written, not accumulated; may be null).
  virtual void layernorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma,
                             float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t d,
                             const ElementwiseRound& r) = 0;
  // a = act(h). h is [rows x cols]; for swiglu h is [rows x 2*cols] (first half "a", second
  // half "gate") and a is [rows x cols].
  virtual void act_fwd(Act act, const float* h, float* a, int64_t rows, int64_t cols, const ElementwiseRound& r) = 0;
  // dh = da * act'(h) (swiglu: dh is [rows x 2*cols]).
  virtual void act_bwd(Act act, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
                       const ElementwiseRound& r) = 0;
  // x[rows x d] += y (+ bias[d] broadcast over rows, when bias != null): x = R(x + R(y + b)).
  virtual void residual_add(float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                            const ElementwiseRound& r) = 0;
  // out[d] = sum over rows of x[rows x d] (bias gradients), fixed order.
  virtual void col_sum(const float* x, float* out, int64_t rows, int64_t d) = 0;
  // dst = R(a + b) element-wise (gradient accumulation through the residual stream).
  virtual void add(float* dst, const float* a, const float* b, size_t n, const ElementwiseRound& r) = 0;

  // ---- loss ----
  // MSE: loss = mean((out - target)^2) over rows*d; dout = 2 (out - target) / (rows*d).
  // KL (temperature T): p = softmax(target/T), q = softmax(out/T) per row;
  //   loss = mean over rows of sum p log(p/q); dout = (q - p) / (T * rows).
  // The loss value is written to loss_out[0] (backend memory, 1 float; may also be stored at
  // loss_history[StepScalars.step] when loss_history != null). dout rounded per r.
  virtual void loss_mse(const float* out, const float* target, float* dout, float* loss_out,
                        float* loss_history, int64_t rows, int64_t d, const ElementwiseRound& r) = 0;
  virtual void loss_kl(const float* out, const float* target, float* dout, float* loss_out,
                       float* loss_history, int64_t rows, int64_t d, float temperature,
                       const ElementwiseRound& r) = 0;

  // ---- optimizers (FP32 masters and state; lr and bias corrections from StepScalars) ----
  struct AdamHyper {
    float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
    bool decoupled = false;  // adamw
  };
  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * (m/bc1) / (sqrt(v/bc2) + eps)
  // (adam: g += wd * p first; adamw: p -= lr * wd * p first).
  virtual void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) = 0;
  // buf = momentum * buf + g (g += wd * p first); p -= lr * (momentum > 0 ? buf : g).
  virtual void sgd(float* p, const float* g, float* buf, size_t n, float momentum, float weight_decay) = 0;

  // ---- reductions and statistics (these synchronise) ----
  // results[i] = reduction i (double). One call computes many, for the metrics of a log step.
  virtual void reduce(const Reduction* reqs, size_t count, double* results) = 0;
  // Read a float from backend memory.
  virtual float read_scalar(const float* p) = 0;
  // min, max, mean, std (population) of x[0..n): gamma statistics.
  virtual void moments(const float* x, size_t n, double out[4]) = 0;
  // Quantization statistics slots: counts accumulated by quantize()/gemm() since reset.
  virtual void reset_stats(int slots) = 0;
  virtual std::vector<QuantStats> read_stats() = 0;
};

// Backends are created by device string with make_backend (lab/backends/backends.h), which
// lives above this layer.

}  // namespace mxlab
