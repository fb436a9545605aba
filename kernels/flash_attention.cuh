// Launchers of flash attention in bf16 (precision.attention: flash_bf16; Backend::flash_attn_fwd /
// flash_attn_bwd), bit-identical to the CPU reference (lab/model/flash_attention.h).
//
// The launchers run the tiled kernels: a block per (sequence-head item, group of 16 query rows or
// keys), a warp per row or key, K and V (Q and dO in the backward) staged in shared memory as bf16,
// each logit and each (P-bar, dS) computed once; one lane per key (or row) for the sequential dots,
// one lane per column for the sequential sums over keys (or rows). Each lane runs the pieces of
// lab/model/flash_attention_tiled.h, which keep every FP32 operation of every output element in the
// scalar functions' order (that header argues it; tests/cpu/test_flash_tiled.cpp runs the same
// pieces in the kernels' order on the CPU against the scalar functions; the GPU tests compare the
// kernels with the CPU). Where the tiled kernels do not apply (head dim over kFaMaxDh = 128, or a
// key tile needing more shared memory than the device has) the launchers run the reference kernels:
// one thread per query row or key calling the scalar functions themselves, with the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// q, k, v, o, o_hp [items x S x dh]; lse, rowmax [items*S]; row_stats [items*S x kFlashRowStats].
void launch_flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                           float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, cudaStream_t s);

// Scratch of the backward: flash_bwd_scratch_floats(items, S, dh) floats (one key tile's dQ sum per
// row; only the reference kernels use it).
int64_t flash_bwd_scratch_floats(int64_t items, int64_t S, int64_t dh);
// dq, dk, dv [items x S x dh]; delta, delta_hp [items*S]. Three launches on `s`: delta per row, then
// dK / dV per key and dQ per row (both read delta).
void launch_flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                           const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                           float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale,
                           const Backend::FlashSpec& f, float* scratch, cudaStream_t s);

// Whether the launchers above run the tiled kernels for this shape on the current device.
bool flash_fwd_tiled(int64_t items, int64_t S, int64_t dh, const Backend::FlashSpec& f);
bool flash_bwd_tiled(int64_t items, int64_t S, int64_t dh, const Backend::FlashSpec& f);

// The reference kernels, one thread per query row or key (for the comparisons of
// tests/gpu/test_flash_attention_gpu.cu and bench/bench_flash_gpu.cu); same arguments.
void launch_flash_attn_fwd_reference(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                                     float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                                     const Backend::FlashSpec& f, cudaStream_t s);
void launch_flash_attn_bwd_reference(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                                     const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                                     float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale,
                                     const Backend::FlashSpec& f, float* scratch, cudaStream_t s);

}  // namespace mxlab::cuda
