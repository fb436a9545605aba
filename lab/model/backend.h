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
#include "lab/mx/hadamard.h"
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

// kCount ends the activations a configuration names (model.activation); gelu_vector after it is
// the pass's substitute for gelu / gelu_tanh under precision.gelu: vector (the MX emulation
// library's GeLU in vector ops, lab/model/elementwise.h gelu_vector_fwd), never configured.
enum class Act : uint8_t { relu = 0, gelu, gelu_tanh, swiglu, linear, kCount, gelu_vector };

// One GEMM operand. Logical shapes: C[M x N] = A[M x K] * B[N x K]^T, both quantized along K.
//   A is stored row-major as [M x K] when k_contiguous, else as [K x M];
//   B is stored row-major as [N x K] when k_contiguous, else as [K x N].
// The operand is quantized per `q` (fp32: untouched; bf16/fp16: rounded; MX: blocks of
// q.block along K). When `round_bf16_first`, it is rounded to bf16 (per `bf16_mode`) before
// the MX quantization, as the reference emulator does with bfloat16 element-wise ops.
// `stats_slot` >= 0 asks the backend to add this operand's last-bin/clamped counts, computed
// under `stats_q` (an MX spec; equal to q when q is MX, the diagnostic format otherwise), to
// that statistics slot (see reset_stats / read_stats). Counts are exact integers.
// `rot` (active: rot.block > 0) rotates the operand along K before all that is counted and
// quantized, after the bf16 rounding: v -> H D v / sqrt(n) per block of n along K
// (lab/mx/hadamard.h; random signs with salt = StepScalars.step). The model gives both operands
// of a GEMM the same `rot`, so the product is A B^T up to rounding (precision.rotation).
struct GemmOperand {
  const float* p = nullptr;
  bool k_contiguous = true;
  QuantSpec q;
  bool round_bf16_first = false;
  Rounding bf16_mode = Rounding::nearest_even;
  int stats_slot = -1;
  QuantSpec stats_q;
  uint64_t sr_op = 0;  // stochastic rounding: op id mixed into the seed (see quantize_operand)
  // The op that wrote this tensor was passed this very operand as its `q_out` (producer-side
  // quantization, below), and nothing has written the tensor since: the backend may take the
  // quantized operand that op left instead of quantizing again. Bits are the same either way.
  bool prequantized = false;
  RotationSpec rot;  // block Hadamard rotation along K (above); rot.salt is ignored: the backend uses the step
};

// A GEMM operand and its stored shape [rows x cols], handed to Backend::prequantize.
struct AheadOperand {
  GemmOperand op;
  int64_t rows = 0, cols = 0;
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
  // Number of lanes (set_lane takes 0 .. lanes()-1). 1: everything runs in order on lane 0.
  virtual int lanes() const { return 1; }
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

  // Producer-side quantization (an optimisation a backend may ignore, the CPU does).
  // Most GEMM operands of an MX step are written by one element-wise op just before the GEMM
  // reads them (y by layernorm_fwd, a by act_fwd, dh by act_bwd). Such an op may be given the
  // operand as `q_out` (q_out->p = its output, shape = its output's [rows x cols]; add's dA, too):
  // the backend
  // may then quantize the output in the same pass, as it writes it, and keep the result for the
  // next gemm() on the same lane whose operand equals q_out (same pointer, layout, spec, seeds,
  // flags and statistics slot) and carries `prequantized`. That gemm takes it, once. Nothing
  // may write the tensor in between. Results are bit-identical with and without
  // (kernels/gemm.cuh, "Producer-side quantization").
  //
  // Operands quantized ahead: prequantize(ops, n) says that the next gemm()
  // calls on this lane will read ops[i].op (stored [ops[i].rows x ops[i].cols]; a pass's weights,
  // which nothing writes during the pass): the backend may quantize them all now, in one pass
  // where it can, and let each such gemm() whose operand equals ops[i].op and carries
  // `prequantized` take its copy, once. Nothing may write those tensors before their gemm().
  // Replaces the previous call's operands. Bit-identical with and without; the CPU ignores it.
  virtual void prequantize(const AheadOperand* ops, size_t n) { (void)ops, (void)n; }

  // ---- vector ops (all round their outputs per `r`) ----
  // Layernorm over the last axis of x[rows x d]: y = xhat * gamma + beta, with xhat =
  // (x - mean) * rstd, rstd = 1/sqrt(var + eps) (biased var). gamma/beta may be null (no
  // affine). Saves xhat [rows x d] and rstd [rows] for the backward pass.
  // q_out (optional, here and in act_fwd / act_bwd): the GEMM operand that will read the output
  // next (see "Producer-side quantization" above).
  virtual void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xhat,
                             float* rstd, int64_t rows, int64_t d, float eps, const ElementwiseRound& r,
                             const GemmOperand* q_out = nullptr) = 0;
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma (or dy);
  // dgamma = sum_rows dy * xhat, dbeta = sum_rows dy (written, not accumulated; may be null).
  // dy is read through R_dy (dy_in), as act_fwd's h_in: a GEMM output left unrounded.
  virtual void layernorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma,
                             float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t d,
                             const ElementwiseRound& r, const ElementwiseRound& dy_in) = 0;
  // a = R(act(H)) with H = R_h(h): the input is rounded as it is read. h is [rows x cols]; for
  // swiglu h is [rows x 2*cols] (first half "a", second half "gate") and a is [rows x cols].
  // R_h (`h_in`) lets the model leave a GEMM output unrounded (gemm's `out` = no rounding) and
  // round it in its consumers instead: bit-identical to rounding it in gemm, one pass over the
  // tensor fewer (kernels/PERF.md).
  virtual void act_fwd(Act act, const float* h, float* a, int64_t rows, int64_t cols, const ElementwiseRound& r,
                       const ElementwiseRound& h_in, const GemmOperand* q_out = nullptr) = 0;
  // dh = R(R_da(da) * act'(R_h(h))) (swiglu: dh is [rows x 2*cols]); h_in and da_in as act_fwd's.
  virtual void act_bwd(Act act, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
                       const ElementwiseRound& r, const ElementwiseRound& h_in, const ElementwiseRound& da_in,
                       const GemmOperand* q_out = nullptr) = 0;
  // out[rows x d] = x + y (+ bias[d] broadcast over rows, when bias != null):
  // out = R(x + R(R_y(y) + b)), where R_y (y_in) rounds y as it is read (a GEMM output left
  // unrounded, as act_fwd's h_in). out may be x (in place).
  virtual void residual_add(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                            const ElementwiseRound& r, const ElementwiseRound& y_in) = 0;
  // out[d] = sum over rows of x[rows x d] (bias gradients), fixed order.
  virtual void col_sum(const float* x, float* out, int64_t rows, int64_t d) = 0;
  // dst = R(a + b) element-wise (gradient accumulation through the residual stream).
  // q_out (optional; see "Producer-side quantization"): the GEMM operand that reads dst next, dst
  // seen as [n / q_cols x q_cols] (the backward's residual gradient dA, [B x d]).
  virtual void add(float* dst, const float* a, const float* b, size_t n, const ElementwiseRound& r,
                   const GemmOperand* q_out = nullptr, int64_t q_cols = 0) = 0;

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
  // Deferred results (no synchronisation until take_deferred): reduce_deferred queues the
  // reductions' results and defer_scalar a float's value (as a double), both in call order;
  // take_deferred returns everything queued since the last take, in that order, with one
  // synchronisation, and empties the queue. The values equal reduce()'s and read_scalar()'s at
  // the time of the call (later writes to the inputs do not change them). Not in a capture.
  // The default (host backends) computes them at once.
  virtual void reduce_deferred(const Reduction* reqs, size_t count);
  virtual void defer_scalar(const float* p);
  virtual std::vector<double> take_deferred();
  // min, max, mean, std (population) of x[0..n): gamma statistics.
  virtual void moments(const float* x, size_t n, double out[4]) = 0;
  // moments() of several tensors, out[4 i .. 4 i + 4) those of x[i][0..n[i]), with one
  // synchronisation where the backend can (CUDA; a log step's gains: 4 per trajectory at L = 4).
  // The default calls moments() for each.
  virtual void moments_batch(const float* const* x, const size_t* n, size_t count, double* out);
  // Quantization statistics slots: counts accumulated by quantize()/gemm() since reset.
  virtual void reset_stats(int slots) = 0;
  virtual std::vector<QuantStats> read_stats() = 0;

  // ==== stability instruments: curvature tangents and the quantization gap ====
  // The exact Hessian-vector product (lab/model/hvp.h) and its eigensolver
  // (lab/model/curvature.h) run on the FP32 loss, so these ops are FP32 and never round their
  // outputs. Element formulas: lab/model/instrument_elementwise.h; derivations and exact
  // semantics: lab/model/README.md ("Curvature"). The defaults throw: a backend that lacks
  // them cannot measure curvature. They take host scalars by value, so a captured region that
  // uses them replays those values.

  // Forward tangent of act_fwd: ra = act'(h) rh (bit-identical to an FP32 act_bwd(h, rh));
  // swiglu (h, rh [rows x 2*cols] = [u | gate]): ra = ru silu(g) + (u silu'(g)) rg.
  virtual void act_jvp(Act act, const float* h, const float* rh, float* ra, int64_t rows, int64_t cols);
  // Tangent of act_bwd: rdh = act'(h) rda + (da act''(h)) rh (swiglu: both halves, see
  // swiglu_bwd_tangent_elem). h, rh, rdh: [rows x H1]; da, rda: [rows x cols].
  virtual void act_bwd_tangent(Act act, const float* h, const float* rh, const float* da, const float* rda,
                               float* rdh, int64_t rows, int64_t cols);
  // Tangent of the layernorm affine: ry = (rxhat gamma + xhat vgamma) + vbeta (vectors [d]
  // broadcast over rows; rxhat == null stands for zeros).
  virtual void ln_affine_tangent(const float* rxhat, const float* xhat, const float* gamma, const float* vgamma,
                                 const float* vbeta, float* ry, int64_t rows, int64_t d);
  // Tangent of layernorm_bwd's dx (per row, double row sums; see ln_bwd_tangent_dx): dy, rdy
  // the upstream gradient and its tangent, xhat, rstd saved by layernorm_fwd, rxhat the tangent
  // of xhat, rx the tangent of the layernorm's input; gamma and vgamma both set or both null.
  // (The tangent of the forward itself needs no op: the layernorm Jacobian is symmetric, so
  // rxhat = layernorm_bwd(rx, xhat, rstd, gamma = null).)
  virtual void layernorm_bwd_tangent(const float* dy, const float* rdy, const float* xhat, const float* rxhat,
                                     const float* rx, const float* rstd, const float* gamma, const float* vgamma,
                                     float* rdx, int64_t rows, int64_t d);
  // out[j] = (float) double sum over rows (in row order) of a[i,j] * b[i,j]: layernorm_bwd's
  // dgamma sum as an op of its own.
  virtual void col_dot(const float* a, const float* b, float* out, int64_t rows, int64_t d);
  // y = a x + b y (b == 0: y = a x, old y ignored); x may alias y.
  virtual void axpby(float* y, const float* x, float a, float b, size_t n);
  // dst = a * b element-wise (dst may alias a or b).
  virtual void mul(float* dst, const float* a, const float* b, size_t n);
  // out = 1 / sqrt(sqrt(v / bc2) + eps): P^{-1/2} of Adam's preconditioner (precond_isqrt_elem).
  virtual void precond_isqrt(const float* v, float* out, size_t n, float bc2, float eps);
  // Tangent of loss_kl's dout: rdout = the KL Hessian in `out` applied to rout (per row,
  // kl_tangent_elem; the softmax q recomputed exactly as loss_kl computes it).
  virtual void loss_kl_tangent(const float* out, const float* rout, float* rdout, int64_t rows, int64_t d,
                               float temperature);

  // The quantization gap of a stored tensor x [rows x cols] against what the quantizer makes
  // of it, Q = quantize_dequantize(v) with v = round_bf16(x, bf16_mode) when round_bf16_first
  // (as GEMM operands do), else v = x; blocks along `axis` as in quantize(), stochastic salt =
  // StepScalars.step, q.seed as given. Per element rel = |x - Q| / |x| (quant_gap_rel; 0 where
  // x == 0). Synchronises. Elements where x or Q is not finite (quant_gap_counts: every element
  // of a block the quantizer makes NaN, i.e. one holding NaN or Inf or whose scale exponent is
  // beyond E8M0; an element that dequantizes to +-Inf at the top of the float32 range) are
  // counted in `nonfinite` only.
  struct QuantGap {
    double sum_rel = 0.0;    // sum of rel: double sums over chunks of kQuantGapChunk flat
                             //   indices in index order, then over chunk sums in order
    double max_rel = 0.0;
    uint64_t above = 0;      // elements the quantizer clamps: |v| > max_normal * 2^s of its
                             //   block (MX only: bf16/fp16/fp32 never clamp)
    uint64_t n = 0;          // elements evaluated (x and Q finite)
    uint64_t nonfinite = 0;  // elements where x or Q is not finite
    double mean_rel() const { return n ? sum_rel / static_cast<double>(n) : 0.0; }
    double above_frac() const { return n ? static_cast<double>(above) / static_cast<double>(n) : 0.0; }
  };
  virtual QuantGap quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q,
                             bool round_bf16_first, Rounding bf16_mode);
  // Several quant_gap()s at once (a log step's clamp debt: every norm gain and weight of a
  // trajectory), out[i] = quant_gap(reqs[i]...) exactly; one synchronisation for the batch where
  // the backend can (CUDA). The default calls quant_gap() for each.
  struct QuantGapRequest {
    QuantGapRequest() = default;
    QuantGapRequest(const float* x_, int64_t rows_, int64_t cols_, Axis axis_, const QuantSpec& q_,
                    bool round_bf16_first_, Rounding bf16_mode_)
        : x(x_), rows(rows_), cols(cols_), axis(axis_), q(q_), round_bf16_first(round_bf16_first_),
          bf16_mode(bf16_mode_) {}
    const float* x = nullptr;
    int64_t rows = 0, cols = 0;
    Axis axis = Axis::contiguous;
    QuantSpec q;
    bool round_bf16_first = false;
    Rounding bf16_mode = Rounding::nearest_even;
  };
  virtual void quant_gaps(const QuantGapRequest* reqs, size_t count, QuantGap* out);
  // ==== end of the stability instruments ====

  // ==== attention blocks and RMS/MX norms (lab/model/README.md "Norms", "Attention") ====
  // Both backends implement every op of this section; the defaults only let test doubles that
  // never run an attention or RMS-norm network leave them out (they throw mxlab::Error).

  // `batch` independent GEMMs C_i[M x N] = beta * C_i + A_i * B_i^T (i < batch) with operands as
  // in gemm(): item i of A at a.p + i*M*K, of B at b.p + i*N*K, of C at C + i*M*N. Each operand
  // is quantized as the one stacked tensor it is in memory ([batch*rows x K] when k_contiguous,
  // else [batch*K x rows]) along K, so the statistics and the stochastic-rounding words are
  // those of gemm() on the stacked tensor; a K-strided operand's blocks stay inside one item
  // when K is a multiple of the block size (the model makes sure of that).
  virtual void gemm_batched(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a,
                            const GemmOperand& b, float* C, float beta, const ElementwiseRound& out);
  // How rmsnorm_fwd estimates the mean square of a row: exactly (mean of x^2), or MXNorm's
  // estimate from the absolute maxima of the row's blocks of `block` elements (block > 0):
  // ms = (c * G_p)^2, G_p = the p-mean (p = 1 or 2) of the block absmaxes.
  struct RmsEstimate {
    int block = 0;     // 0: exact RMSNorm; > 0: MXNorm blocks
    int p = 2;
    float c = 1.0f;
  };
  // RMSNorm / MXNorm over the last axis of x[rows x d]: rstd = 1/sqrt(ms + eps), xhat = x * rstd,
  // y = xhat * gamma (gamma may be null: y = xhat). Saves xhat [rows x d] and rstd [rows].
  virtual void rmsnorm_fwd(const float* x, const float* gamma, float* y, float* xhat, float* rstd, int64_t rows,
                           int64_t d, float eps, const RmsEstimate& est, const ElementwiseRound& r);
  // dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * gamma (or dy): RMSNorm's gradient,
  // and MXNorm's straight-through one (its rstd is the estimate); dgamma = sum_rows dy * xhat
  // (written, may be null).
  virtual void rmsnorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                           float* dgamma, int64_t rows, int64_t d, const ElementwiseRound& r);
  // out[i, j] = R(x[i, j] * g[j]) for x[rows x cols], g[cols] (out may alias x): the MXNorm gain
  // folded into the next weight, and that weight's gradient scaled back.
  virtual void scale_cols(const float* x, const float* g, float* out, int64_t rows, int64_t cols,
                          const ElementwiseRound& r);
  // Row softmax of scaled logits, in place allowed (probs == logits): z = R(scale * l),
  // m = max z (written to rowmax[row]), p = R(exp(z - m) / sum exp(z - m)). [rows x n].
  virtual void softmax_fwd(const float* logits, float* probs, float* rowmax, int64_t rows, int64_t n, float scale,
                           const ElementwiseRound& r);
  // dl = R(p * (dp - sum_j p_j dp_j) * scale) per row (dl may alias dp).
  virtual void softmax_bwd(const float* probs, const float* dprobs, float* dlogits, int64_t rows, int64_t n,
                           float scale, const ElementwiseRound& r);
  // Heads layout <-> token layout (exact copies). x is [nb*S x ld], its columns [col0, col0 + h*dh)
  // hold h heads of dh features; heads is [nb*h x S x dh]:
  //   heads[((b*h + j)*S + s)*dh + c] = x[(b*S + s)*ld + col0 + j*dh + c].
  // heads_split reads x and writes heads; heads_merge writes those columns of x from heads.
  virtual void heads_split(const float* x, float* heads, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                           int64_t col0);
  virtual void heads_merge(const float* heads, float* x, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                           int64_t col0);

  // ==== the paper's emulator (microxcaling) op by op (lab/model/README.md, "The paper's emulator") ====
  // Both backends implement these, bit-identical: element steps of lab/model/elementwise.h (every
  // rounding R the library's lib_round: a zero comes out +0), and every sum a double sum in index
  // order (over j in a row, over rows for a column), as the CPU's.
  // The defaults throw (test doubles that never run precision.layernorm: vector / residual: fp32).

  // microxcaling's LayerNorm forward over the last axis of x[rows x d], R = r: xq = R(x) (the
  // input rounded as read), mean = R(R(sum xq) / d), xs = R(xq - mean), var = R(R(sum R(xs xs)) / d),
  // vare = R(var + eps), std = R(sqrt(vare)), rinv = R(1 / std), xn = R(xs rinv),
  // y = R(R(gamma xn) + beta) (y = xn without gamma; gamma and beta both set or both null).
  // Saves xn [rows x d] and vare [rows]. Element steps: ln_vec_* of lab/model/elementwise.h.
  virtual void layernorm_vec_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xn,
                                 float* vare, int64_t rows, int64_t d, float eps, const ElementwiseRound& r);
  // Its backward (microxcaling's _norm_backward_LN, DeepSpeed's formula), per row, with
  // g = R(R_dy(dy)): dxn = R(g gamma) (g without gamma), std = R(sqrt(vare)), rinv = R(1 / std),
  // dxs = R(dxn rinv), t = R(R(dxn xn) std), m = R(R(sum t) / d), vinv = R(1 / vare),
  // s = R(m vinv), dx1 = R(dxs + R(-s xn)), dm = R(R(sum dx1) / d), dx = R(dx1 - dm).
  // Per column: dgamma = R(sum_rows R(g xn)), dbeta = R(sum_rows g) (each written when non-null).
  virtual void layernorm_vec_bwd(const float* dy, const float* xn, const float* vare, const float* gamma, float* dx,
                                 float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                                 const ElementwiseRound& dy_in);
  // The residual update with its roundings spelt out: out = R_out(x + R_in(R_y(y) + R_b(b_j))), or
  // out = R_out(x + R_y(y)) without a bias; every rounding the library's (lib_round: a zero comes
  // out +0; otherwise residual_add is {y_in, none, r, r}). out may be x.
  struct ResidualRound {
    ElementwiseRound y_in, bias_in, inner, out;
  };
  virtual void residual_add_r(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                              const ResidualRound& rr);

  // ==== token networks (data.kind: tokens; lab/model/README.md "Token networks") ====
  // ids [rows] hold token ids as floats (integers in [0, vocab)); an id outside is an mxlab::Error.
  // The defaults throw. The CUDA backend runs them bit-identically to the CPU, except that an invalid id
  // (which the CPU refuses with mxlab::Error) gives NaN where it is used: a kernel cannot throw.
  // The token batch of the step (StepScalars.step): `sequences` sequences of S tokens of the fixed
  // chain (token_successor, lab/model/elementwise.h). Sequence b: x = 0 (the BOS); for i in 0 .. S-1:
  // ids[b*S + i] = x, x = token_successor(seed, vocab, x, u32_to_uniform(philox(seed, stream, step,
  // b*S + i).v[0])), targets[b*S + i] = x (the next token).
  virtual void token_batch(float* ids, float* targets, int64_t sequences, int64_t S, int64_t vocab, uint64_t seed,
                           Stream stream);
  // out[r, c] = R(E[ids[r], c]): the embedding lookup (E [vocab x d]).
  virtual void embed_fwd(const float* ids, const float* E, float* out, int64_t rows, int64_t d, int64_t vocab,
                         const ElementwiseRound& r);
  // dE[v, c] = (float) double sum over the rows r with ids[r] = v, in row order, of dout[r, c] (0 for a
  // token no row holds); written, not accumulated.
  virtual void embed_bwd(const float* ids, const float* dout, float* dE, int64_t rows, int64_t d, int64_t vocab);
  // Next-token cross-entropy of logits [rows x vocab] against target ids [rows]: per row m = max l,
  // e_j = det_exp(l_j - m), S = double sum e_j, log p_t = (l_t - m) - det_log((float)S); loss = mean
  // over rows of -log p_t (double sums); dlogits_j = R((e_j / S - [j == t]) / rows) (xent_grad_elem).
  // The loss value as loss_kl writes it.
  virtual void loss_xent(const float* logits, const float* target, float* dlogits, float* loss_out,
                         float* loss_history, int64_t rows, int64_t vocab, const ElementwiseRound& r);

  // ==== flash attention in bf16 (precision.attention: flash_bf16; lab/model/README.md "Flash attention in bf16") ====
  // FlashAttention-2's forward and backward with bf16 tensors, as lab/model/flash_attention.h defines
  // them element by element (every rounding point is listed there); the CPU reference runs those
  // functions in loops, the CUDA backend one thread per query row or key (bit-identical). The
  // defaults throw (a backend that does not have them cannot run flash_bf16).
  struct FlashSpec {
    int64_t br = 128;         // query rows per tile (Br); changes no bit (flash_attention.h)
    int64_t bc = 64;          // keys per tile (Bc): the online softmax's blocks
    bool causal = false;      // query r sees keys t <= r
    bool stabilized = false;  // the paper's Algorithm 3 (beta, eps)
    float beta = 2.0f, eps = 1e-3f;
    bool delta_hp = false;    // backward: delta from the FP32 O (O_hp) instead of the bf16 one
    static FlashSpec make(int64_t br, int64_t bc, bool causal, bool stabilized, bool delta_hp, float eps = 1e-3f) {
      FlashSpec f;
      f.br = br;
      f.bc = bc;
      f.causal = causal;
      f.stabilized = stabilized;
      f.delta_hp = delta_hp;
      f.eps = eps;
      return f;
    }
  };
  static constexpr int kFlashRowStats = 2;
  // model.causal on the exact path: x [items x S x S] (attention logits) gets -inf where key t > query
  // r (x[(i*S + r)*S + t]), the rest untouched; softmax_fwd then gives those entries P = 0 exactly.
  // The default throws.
  virtual void mask_causal(float* x, int64_t items, int64_t S);  // per row: keys attaining the row max, bf16 P-bar entries equal to 1
  // `items` independent (sequence, head) attentions over q, k, v [items x S x dh] (the heads layout):
  // o [items x S x dh] the bf16 output O_lp, o_hp the FP32 O before that rounding, lse [items*S]
  // (m + log l), rowmax [items*S] (the largest scaled logit of each row), row_stats
  // [items*S x kFlashRowStats]. scale: the logit scale (1/sqrt(dh) as a float).
  virtual void flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                              float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                              const FlashSpec& f);
  // The backward from the forward's o, o_hp, lse and the output gradient dout [items x S x dh]:
  // dq, dk, dv [items x S x dh] (bf16 values), delta [items*S] the delta it used (delta_lp, or
  // delta_hp under f.delta_hp) and delta_hp [items*S].
  virtual void flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                              const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                              float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale, const FlashSpec& f);

 private:
  std::vector<double> deferred_host_;  // the default deferred results (reduce_deferred)
};

// Backends are created by device string with make_backend (lab/backends/backends.h), which
// lives above this layer.

}  // namespace mxlab
