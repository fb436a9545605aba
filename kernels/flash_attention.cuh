// Launchers of flash attention in bf16 (precision.attention: flash_bf16; Backend::flash_attn_fwd /
// flash_attn_bwd), bit-identical to the CPU reference: the kernels run the very functions of
// lab/model/flash_attention.h that the CPU calls in loops, one thread per query row (fa_fwd_row,
// fa_delta_row, fa_bwd_query) or per key (fa_bwd_key) of each (sequence, head) item. A row's or a
// key's result reads no other row's or key's partial result and every sum runs inside one thread
// in the order those functions fix, so the launch shape changes no bit. Not tuned: no tensor cores,
// no shared-memory tiles; the accumulators live in the outputs (o_hp, dk, dv, dq) as on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// q, k, v, o, o_hp [items x S x dh]; lse, rowmax [items*S]; row_stats [items*S x kFlashRowStats].
void launch_flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                           float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, cudaStream_t s);

// Scratch of the backward: flash_bwd_scratch_floats(items, S, dh) floats (one key tile's dQ sum per row).
int64_t flash_bwd_scratch_floats(int64_t items, int64_t S, int64_t dh);
// dq, dk, dv [items x S x dh]; delta, delta_hp [items*S]. Three launches on `s`: delta per row, then
// dK / dV per key and dQ per row (both read delta).
void launch_flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                           const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                           float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, float* scratch, cudaStream_t s);

}  // namespace mxlab::cuda
