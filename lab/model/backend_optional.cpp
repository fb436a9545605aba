// Default bodies of the Backend ops added for attention blocks and RMS/MX norms (backend.h,
// "attention blocks and RMS/MX norms"): both real backends override every one of them; these
// only let test doubles that never run such a network omit them. Likewise the emulator's ops and
// flash attention (which the CUDA backend does not have yet: it overrides them with its own error).
#include "lab/core/error.h"
#include "lab/model/backend.h"

namespace mxlab {

namespace {
[[noreturn]] void missing(const Backend& be, const char* op) {
  throw Error(msg("backend '", be.name(), "' does not implement ", op,
                  " (needed by model.block: attention and model.norm: rmsnorm | mxnorm)"));
}
}  // namespace

void Backend::gemm_batched(int64_t, int64_t, int64_t, int64_t, const GemmOperand&, const GemmOperand&, float*, float,
                           const ElementwiseRound&) {
  missing(*this, "gemm_batched");
}
void Backend::rmsnorm_fwd(const float*, const float*, float*, float*, float*, int64_t, int64_t, float,
                          const RmsEstimate&, const ElementwiseRound&) {
  missing(*this, "rmsnorm_fwd");
}
void Backend::rmsnorm_bwd(const float*, const float*, const float*, const float*, float*, float*, int64_t, int64_t,
                          const ElementwiseRound&) {
  missing(*this, "rmsnorm_bwd");
}
void Backend::scale_cols(const float*, const float*, float*, int64_t, int64_t, const ElementwiseRound&) {
  missing(*this, "scale_cols");
}
void Backend::softmax_fwd(const float*, float*, float*, int64_t, int64_t, float, const ElementwiseRound&) {
  missing(*this, "softmax_fwd");
}
void Backend::softmax_bwd(const float*, const float*, float*, int64_t, int64_t, float, const ElementwiseRound&) {
  missing(*this, "softmax_bwd");
}
void Backend::heads_split(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
  missing(*this, "heads_split");
}
void Backend::heads_merge(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
  missing(*this, "heads_merge");
}

void Backend::layernorm_vec_fwd(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t,
                                float, const ElementwiseRound&) {
  throw Error(msg("backend '", name(), "' does not implement layernorm_vec_fwd (needed by precision.layernorm: vector)"));
}
void Backend::layernorm_vec_bwd(const float*, const float*, const float*, const float*, float*, float*, float*, int64_t,
                                int64_t, const ElementwiseRound&, const ElementwiseRound&) {
  throw Error(msg("backend '", name(), "' does not implement layernorm_vec_bwd (needed by precision.layernorm: vector)"));
}
void Backend::residual_add_r(float*, const float*, const float*, const float*, int64_t, int64_t, const ResidualRound&) {
  throw Error(msg("backend '", name(), "' does not implement residual_add_r (needed by precision.residual: fp32 and "
                  "precision.bias: elementwise)"));
}

void Backend::token_batch(float*, float*, int64_t, int64_t, int64_t, uint64_t, Stream) {
  throw Error(msg("backend '", name(), "' does not implement token_batch (needed by data.kind: tokens)"));
}
void Backend::embed_fwd(const float*, const float*, float*, int64_t, int64_t, int64_t, const ElementwiseRound&) {
  throw Error(msg("backend '", name(), "' does not implement embed_fwd (needed by data.kind: tokens)"));
}
void Backend::embed_bwd(const float*, const float*, float*, int64_t, int64_t, int64_t) {
  throw Error(msg("backend '", name(), "' does not implement embed_bwd (needed by data.kind: tokens)"));
}
void Backend::loss_xent(const float*, const float*, float*, float*, float*, int64_t, int64_t, const ElementwiseRound&) {
  throw Error(msg("backend '", name(), "' does not implement loss_xent (needed by loss: xent)"));
}
void Backend::mask_causal(float*, int64_t, int64_t) {
  throw Error(msg("backend '", name(), "' does not implement mask_causal (needed by model.causal: true)"));
}
void Backend::flash_attn_fwd(const float*, const float*, const float*, float*, float*, float*, float*, float*, int64_t,
                             int64_t, int64_t, float, const FlashSpec&) {
  throw Error(msg("backend '", name(), "' does not implement flash_attn_fwd (needed by precision.attention: flash_bf16)"));
}
void Backend::flash_attn_bwd(const float*, const float*, const float*, const float*, const float*, const float*,
                             const float*, float*, float*, float*, float*, float*, int64_t, int64_t, int64_t, float,
                             const FlashSpec&) {
  throw Error(msg("backend '", name(), "' does not implement flash_attn_bwd (needed by precision.attention: flash_bf16)"));
}

}  // namespace mxlab
