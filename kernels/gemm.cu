// GemmRunner: operand quantization + cuBLAS (see gemm.cuh for which path runs when and why).
#include "kernels/gemm.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "kernels/capture_guard.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/hadamard.cuh"
#include "lab/core/error.h"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

// cuBLAS's recommended workspace on Hopper; fixed per handle so kernel selection (and with
// it the summation order) does not depend on what else is allocated.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MXLAB_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

int as_int(int64_t v, const char* what) {
  if (v > INT_MAX) throw Error(msg("gemm: ", what, " = ", v, " exceeds cuBLAS's 32-bit limit (", INT_MAX, ")"));
  return static_cast<int>(v);
}

}  // namespace

uint64_t operand_sr_seed(uint64_t seed, uint64_t sr_op) { return sr_seed(seed, sr_op); }

OperandPath operand_path(const GemmOperand& op) {
  // Noise puts an MX role's values off its grid: float32 values, whatever was rounded first.
  if (is_mx(op.q.fmt) && op.q.rounding == Rounding::noise) return OperandPath::fp32_value;
  if (is_mx(op.q.fmt) || op.q.fmt == NumFmt::bf16) return OperandPath::bf16_exact;
  // Rounded to bf16 first: fp32 keeps that value; fp16 of a bf16 value either keeps it or
  // rounds it to a coarser grid (subnormal fp16) or to Inf, all of which stay bf16-exact. Not
  // when the operand is rotated after that rounding: the rotated values are FP32 values.
  if (op.round_bf16_first && !op.rot.active()) return OperandPath::bf16_exact;
  return op.q.fmt == NumFmt::fp32 ? OperandPath::raw_fp32 : OperandPath::fp32_value;
}

QuantLaunch operand_launch(const GemmOperand& op, int64_t rows, int64_t cols, const uint32_t* d_step,
                           unsigned long long* d_stats_base) {
  QuantLaunch L;
  L.in = op.p;
  L.rows = rows;
  L.cols = cols;
  L.axis = op.k_contiguous ? Axis::contiguous : Axis::strided;
  L.q = op.q;
  L.q.seed = operand_sr_seed(op.q.seed, op.sr_op);
  L.round_bf16_first = op.round_bf16_first;
  L.bf16_mode = op.bf16_mode;
  L.d_step = d_step;
  if (op.stats_slot >= 0) {
    if (!d_stats_base) throw Error("gemm: an operand has a stats_slot but no statistics buffer was given");
    L.d_stats = d_stats_base + static_cast<int64_t>(op.stats_slot) * kStatWords;
    L.stats_q = op.stats_q;
    L.stats_q.seed = operand_sr_seed(op.stats_q.seed, op.sr_op);
  }
  return L;
}

GemmRunner::GemmRunner(cudaStream_t s) : stream_(s) {
  // NVIDIA_TF32_OVERRIDE=1 would let the library use TF32 where it otherwise would not; the
  // FP32 roles must be true FP32, so refuse rather than silently measure something else.
  if (const char* v = std::getenv("NVIDIA_TF32_OVERRIDE"); v && std::strcmp(v, "1") == 0)
    throw Error(
        "NVIDIA_TF32_OVERRIDE=1 is set: it would silently enable TF32 in the FP32 GEMMs; unset it (or set 0)");
  ResourceSection rs;  // no other thread's capture runs through these calls (capture_guard.cuh)
  MXLAB_CUBLAS_CHECK(cublasCreate(&handle_));
  // cublasSetStream resets the workspace to the default pool: set the stream first.
  MXLAB_CUBLAS_CHECK(cublasSetStream(handle_, stream_));
  MXLAB_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  MXLAB_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
  MXLAB_CUBLAS_CHECK(cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED));
  MXLAB_CUBLAS_CHECK(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST));
  MXLAB_CUDA_CHECK(cudaMalloc(&d_inexact_, sizeof(unsigned long long)));
}

GemmRunner::~GemmRunner() {
  // No throwing from a destructor: release what exists, ignore errors (e.g. at driver shutdown).
  ResourceSection rs;
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
  if (scratch_) cudaFree(scratch_);
  if (ahead_buf_) cudaFree(ahead_buf_);
  if (d_inexact_) cudaFree(d_inexact_);
}

std::string GemmRunner::math_mode() const {
  return "FP32 roles: SGEMM, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32); MX/bf16 roles: operands quantized to "
         "bf16-exact values, bf16 tensor cores, FP32 accumulate (CUBLAS_COMPUTE_32F); fp16, MX noise or mixed FP32/MX "
         "roles: operands dequantized to FP32, pedantic SGEMM";
}

void GemmRunner::reserve(int64_t max_operand_elems) {
  if (max_operand_elems < 0) throw Error(msg("GemmRunner::reserve: negative size ", max_operand_elems));
  ensure_scratch(max_operand_elems);
}

void GemmRunner::ensure_scratch(int64_t elems) {
  if (elems <= scratch_elems_) return;
  // A multiple of 128 elements: the second operand of a rotated bf16 GEMM starts scratch_elems_
  // bf16 values into the first region, which stays 256-byte aligned (run_batched).
  elems = (elems + 127) / 128 * 128;
  if (capturing(stream_))
    throw Error(msg("GemmRunner: an operand of ", elems, " elements exceeds the reserved scratch (", scratch_elems_,
                    " elements) while a CUDA graph is being captured; call reserve() before capture"));
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(stream_));  // earlier GEMMs may still read the old scratch
  ResourceSection rs;
  if (scratch_) MXLAB_CUDA_CHECK(cudaFree(scratch_));
  scratch_ = nullptr;
  held_armed_ = false;
  scratch_elems_ = 0;
  // Two FP32-sized operand regions, then the held bf16 buffer (half as many floats, rounded up
  // to 256 bytes so that it stays aligned).
  const size_t held_floats = ((static_cast<size_t>(elems) + 1) / 2 + 63) / 64 * 64;
  MXLAB_CUDA_CHECK(cudaMalloc(&scratch_, (2 * static_cast<size_t>(elems) + held_floats) * sizeof(float)));
  scratch_elems_ = elems;
}

namespace {
// Whether two GEMM operands quantize to the same values (every field operand_launch reads, and
// the statistics slot; not `prequantized`).
bool same_operand(const GemmOperand& a, const GemmOperand& b) {
  return a.p == b.p && a.k_contiguous == b.k_contiguous && same_spec(a.q, b.q) &&
         a.round_bf16_first == b.round_bf16_first && a.bf16_mode == b.bf16_mode && a.stats_slot == b.stats_slot &&
         a.sr_op == b.sr_op && a.rot.block == b.rot.block && a.rot.random_signs == b.rot.random_signs &&
         a.rot.seed == b.rot.seed;
}
}  // namespace

bool GemmRunner::quantizable_before(const GemmOperand& op, int64_t rows, int64_t cols) const {
  // A rotated operand is quantized by its GEMM only, after the rotation (run_batched).
  return !verify_bf16_ && op.p && op.stats_slot < 0 && is_mx(op.q.fmt) && fast_rounding(op.q.rounding) &&
         operand_path(op) == OperandPath::bf16_exact && !op.rot.active() && rows > 0 && cols > 0;
}

bool GemmRunner::produce_target(const GemmOperand& op, int64_t rows, int64_t cols, ProducedQuant* pq) {
  held_armed_ = false;  // the producer overwrites the tensor: whatever was held is stale
  for (Ahead& e : ahead_)
    if (e.op.p == op.p) e.armed = false;
  if (!quantizable_before(op, rows, cols) || !op.k_contiguous || op.q.block != kProducedBlock ||
      cols % kProducedBlock != 0 || rows * cols > scratch_elems_)
    return false;
  *pq = produced_quant(op.q, op.round_bf16_first, op.bf16_mode, reinterpret_cast<uint16_t*>(held()));
  return true;
}

void GemmRunner::hold(const GemmOperand& op, int64_t rows, int64_t cols) {
  held_op_ = op;
  held_rows_ = rows;
  held_cols_ = cols;
  held_armed_ = true;
}

const __nv_bfloat16* GemmRunner::take_produced(const GemmOperand& op, int64_t rows, int64_t cols) {
  if (!op.prequantized || verify_bf16_) return nullptr;
  if (held_armed_ && rows == held_rows_ && cols == held_cols_ && same_operand(op, held_op_)) {
    held_armed_ = false;
    ++produced_hits_;
    return held();
  }
  for (Ahead& e : ahead_) {
    if (e.armed && rows == e.rows && cols == e.cols && same_operand(op, e.op)) {
      e.armed = false;
      ++produced_hits_;
      return e.q;
    }
  }
  return nullptr;
}

int GemmRunner::prequantize(const AheadOperand* ops, int n, const uint32_t* d_step) {
  ahead_.clear();
  // What qualifies, and where each goes in the buffer (256-byte aligned slices).
  std::vector<size_t> offset;
  std::vector<int> which;
  size_t need = 0;
  for (int i = 0; i < n; ++i) {
    if (!quantizable_before(ops[i].op, ops[i].rows, ops[i].cols)) continue;
    which.push_back(i);
    offset.push_back(need);
    need += (static_cast<size_t>(ops[i].rows * ops[i].cols) + 127) / 128 * 128;
  }
  if (which.empty()) return 0;
  if (need > ahead_elems_) {
    if (capturing(stream_)) return 0;  // the GEMMs quantize their operands themselves
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(stream_));  // earlier GEMMs may still read the old buffer
    ResourceSection rs;
    if (ahead_buf_) MXLAB_CUDA_CHECK(cudaFree(ahead_buf_));
    ahead_buf_ = nullptr;
    ahead_elems_ = 0;
    MXLAB_CUDA_CHECK(cudaMalloc(&ahead_buf_, need * sizeof(__nv_bfloat16)));
    ahead_elems_ = need;
  }
  std::vector<QuantLaunch> L;
  std::vector<__nv_bfloat16*> out;
  for (size_t j = 0; j < which.size(); ++j) {
    const AheadOperand& a = ops[which[j]];
    L.push_back(operand_launch(a.op, a.rows, a.cols, d_step, nullptr));
    out.push_back(ahead_buf_ + offset[j]);
    ahead_.push_back(Ahead{a.op, a.rows, a.cols, out.back(), true});
  }
  quantize_bf16_batch(L.data(), out.data(), static_cast<int>(L.size()), stream_);
  return static_cast<int>(ahead_.size());
}

const float* GemmRunner::prepare_f32(const GemmOperand& op, int64_t rows, int64_t cols, int64_t period, float* scratch,
                                     const uint32_t* d_step, unsigned long long* d_stats_base, bool count_stats) {
  QuantLaunch L = operand_launch(op, rows, cols, d_step, d_stats_base);
  if (!count_stats) L.d_stats = nullptr;
  if (op.rot.active()) {  // rotated into the scratch, then counted and quantized there in place
    rotate_into(op, rows, cols, period, scratch, d_step);
    L.in = scratch;
    L.round_bf16_first = false;  // the rotation read the operand rounded
  }
  if (operand_path(op) == OperandPath::raw_fp32) {
    if (L.d_stats) quant_stats(L, stream_);
    return L.in;
  }
  quantize_f32(L, scratch, stream_);
  return scratch;
}

void GemmRunner::rotate_into(const GemmOperand& op, int64_t rows, int64_t cols, int64_t period, float* out,
                             const uint32_t* d_step) {
  RotateLaunch R;
  R.in = op.p;
  R.out = out;
  R.rows = rows;
  R.cols = cols;
  R.axis = op.k_contiguous ? Axis::contiguous : Axis::strided;
  R.period = period;
  R.r = op.rot;
  R.round_bf16_first = op.round_bf16_first;
  R.bf16_mode = op.bf16_mode;
  R.d_step = d_step;
  hadamard_rotate(R, stream_);
}

// Row-major C[M x N] = A * B^T is column-major C^T[N x M] = op(B) * op(A) where, column-major,
//   B k-contiguous ([N x K] row-major) is a K x N matrix (ld K): op = T;  else [K x N] is N x K (ld N): op = N;
//   A k-contiguous ([M x K] row-major) is a K x M matrix (ld K): op = N;  else [K x M] is M x K (ld M): op = T.
// One cuBLAS call of either input type (CUDA_R_32F with the pedantic FP32 compute type, or
// CUDA_R_16BF with FP32 accumulation); batch > 1 is the strided-batched form.
namespace {
void cublas_gemm(cublasHandle_t h, int64_t batch, int64_t M, int64_t N, int64_t K, const void* A, bool a_kc,
                 const void* B, bool b_kc, float* C, float beta, cudaDataType_t in, cublasComputeType_t compute) {
  const float alpha = 1.0f;
  const cublasOperation_t tb = b_kc ? CUBLAS_OP_T : CUBLAS_OP_N, ta = a_kc ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int n = as_int(N, "N"), m = as_int(M, "M"), k = as_int(K, "K");
  const int ldb = as_int(b_kc ? K : N, "ld"), lda = as_int(a_kc ? K : M, "ld");
  if (batch == 1) {
    MXLAB_CUBLAS_CHECK(cublasGemmEx(h, tb, ta, n, m, k, &alpha, B, in, ldb, A, in, lda, &beta, C, CUDA_R_32F, n,
                                    compute, CUBLAS_GEMM_DEFAULT));
  } else {
    MXLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, tb, ta, n, m, k, &alpha, B, in, ldb, N * K, A, in, lda, M * K,
                                                  &beta, C, CUDA_R_32F, n, M * N, as_int(batch, "batch"), compute,
                                                  CUBLAS_GEMM_DEFAULT));
  }
}
}  // namespace

void GemmRunner::sgemm(int64_t batch, int64_t M, int64_t N, int64_t K, const float* A, bool a_kc, const float* B,
                       bool b_kc, float* C, float beta) {
  cublas_gemm(handle_, batch, M, N, K, A, a_kc, B, b_kc, C, beta, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC);
}

void GemmRunner::bf16_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const void* A, bool a_kc, const void* B,
                           bool b_kc, float* C, float beta) {
  cublas_gemm(handle_, batch, M, N, K, A, a_kc, B, b_kc, C, beta, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}

void GemmRunner::run(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C,
                     float beta, const ElementwiseRound& out, const uint32_t* d_step,
                     unsigned long long* d_stats_base) {
  run_batched(1, M, N, K, a, b, C, beta, out, d_step, d_stats_base);
}

void GemmRunner::run_batched(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a,
                             const GemmOperand& b, float* C, float beta, const ElementwiseRound& out,
                             const uint32_t* d_step, unsigned long long* d_stats_base) {
  if (M < 0 || N < 0 || K < 0 || batch < 0)
    throw Error(msg("gemm: negative shape batch=", batch, " M=", M, " N=", N, " K=", K));
  if (M == 0 || N == 0 || batch == 0) return;
  if (!C) throw Error("gemm: null output C");
  if (K > 0 && (!a.p || !b.p)) throw Error("gemm: null operand pointer");
  if (K == 0) {  // A * B^T is the zero matrix: C = beta * C
    if (beta == 0.0f) {
      MXLAB_CUDA_CHECK(cudaMemsetAsync(C, 0, static_cast<size_t>(batch * M * N) * sizeof(float), stream_));
    } else if (beta != 1.0f) {
      MXLAB_CUBLAS_CHECK(cublasSscal(handle_, as_int(batch * M * N, "M*N"), &beta, C, 1));
    }
  } else {
    // Stored shapes (row-major) of the stacked operands: blocks run along K.
    const int64_t a_rows = a.k_contiguous ? batch * M : batch * K, a_cols = a.k_contiguous ? K : M;
    const int64_t b_rows = b.k_contiguous ? batch * N : batch * K, b_cols = b.k_contiguous ? K : N;
    const OperandPath pa = operand_path(a), pb = operand_path(b);
    bool done = false;
    // Rotated operands (precision.rotation) are rotated into the second scratch region first and
    // quantized from there; their bf16 copies then share the first region (each takes at most half).
    const bool rotating = a.rot.active() || b.rot.active();
    if (pa == OperandPath::bf16_exact && pb == OperandPath::bf16_exact) {
      ensure_scratch(batch * std::max(M * K, N * K));
      auto* sa = reinterpret_cast<__nv_bfloat16*>(scratch_);
      auto* sb = rotating ? reinterpret_cast<__nv_bfloat16*>(scratch_) + scratch_elems_
                          : reinterpret_cast<__nv_bfloat16*>(scratch_ + scratch_elems_);
      float* rotated = scratch_ + scratch_elems_;
      QuantLaunch La = operand_launch(a, a_rows, a_cols, d_step, d_stats_base);
      QuantLaunch Lb = operand_launch(b, b_rows, b_cols, d_step, d_stats_base);
      // Each rotation runs right before its own quantization: the two share `rotated`.
      auto rotate = [&](const GemmOperand& op, int64_t rows, int64_t cols, QuantLaunch& L) {
        if (!op.rot.active()) return;
        rotate_into(op, rows, cols, K, rotated, d_step);
        L.in = rotated;
        L.round_bf16_first = false;
      };
      if (verify_bf16_) {
        if (capturing(stream_)) throw Error("GemmRunner: the bf16-exactness check cannot run inside graph capture");
        MXLAB_CUDA_CHECK(cudaMemsetAsync(d_inexact_, 0, sizeof(unsigned long long), stream_));
        La.d_inexact = Lb.d_inexact = d_inexact_;
      }
      // Operands a producer already quantized into the held buffer, or prequantize() into the
      // ahead buffer (batch 1 only; each is taken once, so a and b never get the same one).
      const __nv_bfloat16* qa = batch == 1 ? take_produced(a, a_rows, a_cols) : nullptr;
      const __nv_bfloat16* qb = batch == 1 ? take_produced(b, b_rows, b_cols) : nullptr;
      if (!qa) {
        rotate(a, a_rows, a_cols, La);
        quantize_bf16(La, sa, stream_);
      }
      if (!qb) {
        rotate(b, b_rows, b_cols, Lb);
        quantize_bf16(Lb, sb, stream_);
      }
      unsigned long long inexact = 0;
      if (verify_bf16_) {
        MXLAB_CUDA_CHECK(cudaMemcpyAsync(&inexact, d_inexact_, sizeof inexact, cudaMemcpyDeviceToHost, stream_));
        MXLAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
      if (inexact == 0) {
        // Relied on here: every value in sa/sb equals the dequantized FP32 value (see gemm.cuh).
        bf16_gemm(batch, M, N, K, qa ? qa : sa, a.k_contiguous, qb ? qb : sb, b.k_contiguous, C, beta);
        done = true;
      } else {
        ++bf16_fallbacks_;
      }
    }
    if (!done) {
      // After a bf16 fallback the statistics were already counted by the bf16 pass.
      const bool count = !(pa == OperandPath::bf16_exact && pb == OperandPath::bf16_exact);
      if (pa != OperandPath::raw_fp32 || pb != OperandPath::raw_fp32 || rotating)
        ensure_scratch(batch * std::max(M * K, N * K));
      const float* A = prepare_f32(a, a_rows, a_cols, K, scratch_, d_step, d_stats_base, count);
      const float* B = prepare_f32(b, b_rows, b_cols, K, scratch_ + scratch_elems_, d_step, d_stats_base, count);
      sgemm(batch, M, N, K, A, a.k_contiguous, B, b.k_contiguous, C, beta);
    }
  }
  if (out.bf16) round_bf16_inplace(C, batch * M * N, out.mode, stream_);
  if (held_armed_ && C == held_op_.p) held_armed_ = false;  // the held operand's tensor was overwritten
  for (Ahead& e : ahead_)
    if (e.armed && C == e.op.p) e.armed = false;
}

}  // namespace mxlab::cuda
