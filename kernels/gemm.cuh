// The CUDA backend's GEMM with operand quantization (lab/model/backend.h, Backend::gemm):
// C[M x N] = beta * C + A * B^T, operands quantized along K, FP32 accumulation, then C rounded
// per ElementwiseRound. Which cuBLAS call runs depends on the operands' roles:
//   - both FP32 roles with no rounding at all: a true SGEMM (cublasGemmEx, CUDA_R_32F,
//     CUBLAS_COMPUTE_32F_PEDANTIC: no TF32, no reduced-precision tricks);
//   - both operands bf16-exact after quantization (MX formats, bf16, or anything rounded to bf16
//     first and not rotated after): each is quantized into a bf16 scratch (quantize_bf16, one read + one half-size
//     write) and cuBLAS runs a bf16 tensor-core GEMM with FP32 accumulation (CUBLAS_COMPUTE_32F).
//     The products of two bf16-exact values (<= 8 significant bits each) are exact, so this
//     computes the same products as an FP32 GEMM on the dequantized operands; only the
//     accumulation order/rounding differs (covered by the derived tolerance in the tests).
//     Dequantized MX values are bf16-exact except for the tiny-scale corner documented in
//     kernels/quantize.cuh (fp8 elements in blocks with amax below ~2^-116 / 2^-102);
//     set_verify_bf16_exact(true) detects those and reruns on the FP32 path;
//   - otherwise (fp16 roles, MX roles under `rounding: noise`, whose values are off the MX grid,
//     FP32 mixed with a quantized role): the quantized operands are dequantized into FP32 scratch
//     and the pedantic SGEMM runs (an FP32 role is read in place).
// A rotated operand (GemmOperand::rot, precision.rotation) is first rotated along K by
// kernels/hadamard.cuh into FP32 scratch, then counted and quantized from there on whichever path
// it takes; it is never taken from a producer or from prequantize() (those hold the unrotated
// tensor's quantization).
// Producer-side quantization (Backend::layernorm_fwd / act_fwd / act_bwd's q_out): an
// element-wise op that writes a GEMM operand may write its bf16 quantization too, into this
// runner's held buffer (produce_target() says whether and where; kernels/mx_produce.cuh says
// which operands qualify). hold() then records which operand the buffer holds, and the next
// run() whose operand equals it (pointer, layout, shape, spec, seeds, flags, statistics slot)
// and is marked `prequantized` takes the buffer instead of quantizing, once. One buffer per
// runner (per lane): a producer's GEMM follows it on the same lane before the next producer.
// Bits are the same either way (tests/gpu/test_producer_quant_gpu.cu).
// Row-major C[M x N] is column-major C^T [N x M] = B' * A'^T, so cuBLAS computes with B as its
// first operand; see run() for the transposes and leading dimensions of the four layouts.
// Determinism: the cuBLAS handle is bound to this runner's stream with a fixed workspace
// (cublasSetWorkspace), atomics mode stays off; repeated runs are bit-identical.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mx_produce.cuh"
#include "kernels/quantize.cuh"
#include "lab/model/backend.h"

namespace mxlab::cuda {

// Stochastic-rounding seed of a GEMM operand: lab/model/elementwise.h's sr_seed.
uint64_t operand_sr_seed(uint64_t seed, uint64_t sr_op);

// How an operand enters the GEMM.
enum class OperandPath : uint8_t {
  raw_fp32,   // FP32 role, no rounding: read in place
  bf16_exact, // quantized values are bf16-exact: may feed the bf16 tensor-core GEMM
  fp32_value, // quantized values need FP32 (fp16 roles, MX roles under rounding: noise)
};
OperandPath operand_path(const GemmOperand& op);

// The QuantLaunch that quantizes operand `op` stored row-major as [rows x cols] (blocks along K:
// contiguous when op.k_contiguous, strided otherwise), with the GEMM's stochastic seed
// (operand_sr_seed) for both q and stats_q, and its statistics slot.
QuantLaunch operand_launch(const GemmOperand& op, int64_t rows, int64_t cols, const uint32_t* d_step,
                           unsigned long long* d_stats_base);

class GemmRunner {  // one per stream; owns a cuBLAS handle and scratch
 public:
  explicit GemmRunner(cudaStream_t s);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // C[M x N] = beta*C + A*B^T per lab/model/backend.h (GemmOperand layouts), operands quantized
  // along K. d_step: device step (stochastic salt); d_stats_base: device counters
  // [slots x kStatWords] (slot = operand.stats_slot), may be null when no operand has a slot.
  // beta == 0: C is not read (it may hold NaN).
  void run(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
           const ElementwiseRound& out, const uint32_t* d_step, unsigned long long* d_stats_base);
  // `batch` GEMMs of that shape over consecutive items (Backend::gemm_batched): each operand is
  // quantized as its stacked tensor, then one strided-batched cuBLAS call (the same path
  // choice as run()). batch == 1 is run().
  void run_batched(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b,
                   float* C, float beta, const ElementwiseRound& out, const uint32_t* d_step,
                   unsigned long long* d_stats_base);
  std::string math_mode() const;
  // Producer-side quantization (above). Whether a producer may write operand `op`, stored
  // [rows x cols], quantized: k-contiguous MX with blocks of 32, a deterministic rounding, no
  // statistics slot, cols % 32 == 0, the bf16 path, the bytes check off, and the held buffer
  // large enough (it grows with reserve(), never here). If so, fills *pq to write it into the
  // held buffer. Either way, what the buffer held before is dropped.
  bool produce_target(const GemmOperand& op, int64_t rows, int64_t cols, ProducedQuant* pq);
  // The producer has been launched with produce_target's *pq: the buffer now holds `op`.
  void hold(const GemmOperand& op, int64_t rows, int64_t cols);
  // Operands quantized ahead (Backend::prequantize): every ops[i] that takes the
  // bf16 path with a deterministic rounding and no
  // statistics slot is quantized now, all of them in as few launches as quantize_bf16_batch
  // allows, into the runner's ahead buffer, and taken once by the next run() whose operand
  // equals it and carries `prequantized`. Replaces what was kept ahead before. The buffer grows
  // here outside graph capture only; inside, operands that do not fit are left to their GEMMs.
  // Returns how many are kept.
  int prequantize(const AheadOperand* ops, int n, const uint32_t* d_step);
  // GEMM operands taken from the held buffer or the ahead buffer so far (tests and benchmarks).
  int64_t produced_hits() const { return produced_hits_; }
  // Reserve scratch for operands of up to max_operand_elems elements each, up front: no
  // cudaMalloc may happen while a CUDA graph is captured (run() throws then instead).
  void reserve(int64_t max_operand_elems);
  // Check, after quantizing to bf16, that every value was bf16-exact; if not, rerun on the FP32
  // path. Synchronises the stream on every bf16 GEMM (not capturable): for tests and audits.
  void set_verify_bf16_exact(bool on) { verify_bf16_ = on; }
  // How many bf16 GEMMs were rerun on the FP32 path by the check above.
  int64_t bf16_fallbacks() const { return bf16_fallbacks_; }
  cudaStream_t stream() const { return stream_; }

 private:
  void ensure_scratch(int64_t elems_per_operand);
  // What a producer and prequantize() both require of an operand stored [rows x cols] that is
  // quantized before its GEMM: the bf16 path, MX with a deterministic rounding, no statistics
  // slot, the bytes check off.
  bool quantizable_before(const GemmOperand& op, int64_t rows, int64_t cols) const;
  // The held buffer (producer-side quantization): scratch_elems_ bf16 values after the two
  // operand regions of scratch_.
  __nv_bfloat16* held() const { return reinterpret_cast<__nv_bfloat16*>(scratch_ + 2 * scratch_elems_); }
  // The held buffer, or an ahead entry, if it holds exactly `op` (stored [rows x cols]) and op
  // is marked prequantized; it is then released (taken once). Null otherwise.
  const __nv_bfloat16* take_produced(const GemmOperand& op, int64_t rows, int64_t cols);
  // The operand stored [rows x cols] on the FP32 path: read in place (an FP32 role), or quantized
  // into `scratch`; a rotated one (op.rot, along K with signs of period `period`) is rotated into
  // `scratch` first.
  const float* prepare_f32(const GemmOperand& op, int64_t rows, int64_t cols, int64_t period, float* scratch,
                           const uint32_t* d_step, unsigned long long* d_stats_base, bool count_stats);
  // op's tensor (bf16-rounded first when op.round_bf16_first) rotated per op.rot into `out`.
  void rotate_into(const GemmOperand& op, int64_t rows, int64_t cols, int64_t period, float* out,
                   const uint32_t* d_step);
  // batch > 1: strided-batched over items of M*K, N*K and M*N elements.
  void sgemm(int64_t batch, int64_t M, int64_t N, int64_t K, const float* A, bool a_kc, const float* B, bool b_kc,
             float* C, float beta);
  void bf16_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const void* A, bool a_kc, const void* B, bool b_kc,
                 float* C, float beta);

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  float* scratch_ = nullptr;            // two operand regions of scratch_elems_ floats each, then
                                        // the held buffer (scratch_elems_ bf16 values)
  bool held_armed_ = false;
  GemmOperand held_op_;
  struct Ahead {  // an operand quantized by prequantize(), until taken or its tensor is written
    GemmOperand op;
    int64_t rows = 0, cols = 0;
    __nv_bfloat16* q = nullptr;
    bool armed = false;
  };
  std::vector<Ahead> ahead_;
  __nv_bfloat16* ahead_buf_ = nullptr;
  size_t ahead_elems_ = 0;
  int64_t held_rows_ = 0, held_cols_ = 0;
  int64_t produced_hits_ = 0;
  int64_t scratch_elems_ = 0;
  unsigned long long* d_inexact_ = nullptr;  // bf16-inexact counter for the verify mode
  bool verify_bf16_ = false;
  int64_t bf16_fallbacks_ = 0;
};

}  // namespace mxlab::cuda
