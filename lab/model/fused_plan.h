// The fused plan of one pass: the work a backend may do for a GEMM outside the GEMM call, and the
// rounding a GEMM may leave to the op that reads its output. The passes (lab/model/mlp.cpp) ask
// it by name at each GEMM, so that they read as the paper's equations; none of it changes a bit
// (lab/model/README.md, "Reading the model"):
//   - Ahead-of-time quantization (Backend::prequantize): the operands nothing writes during the
//     pass (the weights; in the backward also the forward's saved y) are handed over together,
//     first: quantize_ahead().
//   - Producer-side quantization (the q_out of layernorm_fwd, act_fwd, act_bwd, add): the op that
//     writes a GEMM operand's tensor just before that GEMM may quantize it as it writes it:
//     produced_by_writer() gives that op its q_out.
//   - gemm(): the GEMM reads each operand; one handed over ahead or to its writer, and not read
//     since, arrives `prequantized` (taken once); every other one the GEMM quantizes itself.
//   - Deferred output rounding: a GEMM output that one element-wise op reads is left unrounded by
//     the GEMM and rounded by that op as it reads it (output_rounding()).
// The CPU backend ignores the first two and quantizes every operand in its GEMM; the CUDA backend
// takes them (kernels/gemm.cuh, "Producer-side quantization"). Both implement the third.
#pragma once
#include <cstdint>
#include <list>
#include <vector>

#include "lab/model/backend.h"

namespace mxlab::model_detail {

// Who reads a GEMM's output: one element-wise op only (which then rounds it as it reads it), or
// more than one (the GEMM rounds it).
enum class OutputReader : uint8_t { several, one_op };

// The rounding of a GEMM output: by the GEMM, and by its reader as it reads it (one is none).
struct OutputRounding {
  ElementwiseRound by_gemm, by_reader;
};

// Deferred output rounding: a GEMM output with one reader leaves its rounding R to that reader
// (bit-identical: rounding is a function of the value alone; one pass over the tensor fewer).
inline OutputRounding output_rounding(const ElementwiseRound& R, OutputReader reader) {
  if (reader == OutputReader::one_op) return {ElementwiseRound{}, R};
  return {R, ElementwiseRound{}};
}

// Two operands alike in every field a backend compares (the `prequantized` mark aside).
inline bool same_operand(const GemmOperand& a, const GemmOperand& b) {
  const auto same_q = [](const QuantSpec& x, const QuantSpec& y) {
    return x.fmt == y.fmt && x.block == y.block && x.rule == y.rule && x.rounding == y.rounding && x.bump == y.bump &&
           x.seed == y.seed && x.salt == y.salt;
  };
  return a.p == b.p && a.k_contiguous == b.k_contiguous && same_q(a.q, b.q) &&
         a.round_bf16_first == b.round_bf16_first && a.bf16_mode == b.bf16_mode && a.stats_slot == b.stats_slot &&
         same_q(a.stats_q, b.stats_q) && a.sr_op == b.sr_op && a.rot.block == b.rot.block &&
         a.rot.random_signs == b.rot.random_signs && a.rot.seed == b.rot.seed;
}

class FusedPlan {
 public:
  explicit FusedPlan(Backend& be) : be_(be) {}
  FusedPlan(const FusedPlan&) = delete;
  FusedPlan& operator=(const FusedPlan&) = delete;

  // The operands the pass's GEMMs will read that nothing writes before: Backend::prequantize.
  void quantize_ahead(const std::vector<AheadOperand>& ops) {
    be_.prequantize(ops.data(), ops.size());
    for (const AheadOperand& a : ops) handed_.push_back(a.op);
  }

  // The q_out for the op that writes op.p next: that op may quantize it as it writes, and the
  // next GEMM to read `op` takes that quantization. Nothing else may write the tensor in between.
  const GemmOperand* produced_by_writer(const GemmOperand& op) {
    handed_.push_back(op);
    return &handed_.back();
  }

  // C [M x N] = A [M x K] . B [N x K]^T, each operand read as it arrives (above); C rounded per `out`.
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C,
            const ElementwiseRound& out) {
    const GemmOperand qa = arrives(a);
    const GemmOperand qb = arrives(b);
    be_.gemm(M, N, K, qa, qb, C, 0.0f, out);
  }

 private:
  // `op`, marked `prequantized` when it was handed over (ahead or to its writer) and not read since.
  GemmOperand arrives(GemmOperand op) {
    for (auto it = handed_.begin(); it != handed_.end(); ++it)
      if (same_operand(*it, op)) {
        handed_.erase(it);
        op.prequantized = true;
        return op;
      }
    return op;
  }

  Backend& be_;
  std::list<GemmOperand> handed_;  // a list: produced_by_writer's pointers stay valid
};

}  // namespace mxlab::model_detail
