// Producer-side MX quantization (lab/model/backend.h, "Producer-side quantization"):
// an element-wise kernel that writes a GEMM operand (layernorm forward's y, act_fwd's a,
// act_bwd's dh) also writes that operand's MX quantization, as bf16 for the tensor-core GEMM,
// in the same pass, so no separate quantize kernel has to read it again.
//
// Covered: blocks of 32 along rows (the k-contiguous operand), the deterministic element
// roundings (nearest_even, nearest_away, toward_zero), no statistics, rows a multiple of 32
// long. Everything else keeps the separate pass (kernels/gemm.cuh decides; nothing changes
// then). The rounding is a runtime value here, and so is the element format except for
// fp8_e4m3 (the paper's), whose constants are folded into its own instances: two kernel
// instances per producer, not one per format x rounding (CI compiles these on 2 cores); both are
// evaluated by
// the same scalar code the quantizer kernels and the CPU reference call
// (block_scale_exp, quantize_element_fast of lab/mx/scalar.h), so the bits are the same as
// quantize_bf16's: tests/gpu/test_producer_quant_gpu.cu checks every format and rounding.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"

namespace mxlab::cuda {

constexpr int kProducedBlock = 32;  // the MX block size producers quantize
constexpr uint32_t kMxQuietNaN = 0x7FC00000u;  // what the CPU reference writes for a NaN block

// The ElemSpec of E with every field a compile-time constant, so the table folds into the
// shared scalar code. Only scalar constexpr values may cross into device code, hence the
// per-field constants (the name is host data and is dropped).
template <Elem E>
struct ElemConst {
  static constexpr int kIndex = static_cast<int>(E);
  static constexpr int kBits = kElemSpecs[kIndex].bits;
  static constexpr int kEbits = kElemSpecs[kIndex].ebits;
  static constexpr int kMbits = kElemSpecs[kIndex].mbits;
  static constexpr int kBias = kElemSpecs[kIndex].bias;
  static constexpr Reserved kReserved = kElemSpecs[kIndex].reserved;
};

template <Elem E>
__device__ __forceinline__ ElemSpec device_elem_spec() {
  using C = ElemConst<E>;
  return ElemSpec{nullptr, C::kBits, C::kEbits, C::kMbits, C::kBias, C::kReserved};
}

// What a producer kernel needs to quantize its output (by value into the kernel's parameters).
struct ProducedQuant {
  uint16_t* out = nullptr;  // bf16 bits, row-major like the producer's output; null: not asked
  Elem elem = Elem::fp8_e4m3;
  ElemSpec es{};            // the element format (name null: device code never reads it)
  ScaleRule rule = ScaleRule::floor;
  Bump bump = Bump::clamp;
  Rounding rounding = Rounding::nearest_even;  // fast_rounding() only
  bool round_first = false;                    // round to bf16 (per bf16_mode) before quantizing
  Rounding bf16_mode = Rounding::nearest_even;
};

// The ProducedQuant that writes an MX operand of spec q (its block must be kProducedBlock and its
// rounding deterministic: the caller checks) as bf16 bits into `out`.
inline ProducedQuant produced_quant(const QuantSpec& q, bool round_first, Rounding bf16_mode, uint16_t* out) {
  const ElemSpec& es = kElemSpecs[static_cast<int>(mx_elem(q.fmt))];
  ProducedQuant pq;
  pq.out = out;
  pq.elem = mx_elem(q.fmt);
  pq.es = ElemSpec{nullptr, es.bits, es.ebits, es.mbits, es.bias, es.reserved};
  pq.rule = q.rule;
  pq.bump = q.bump;
  pq.rounding = q.rounding;
  pq.round_first = round_first;
  pq.bf16_mode = bf16_mode;
  return pq;
}

// max of a and b that returns NaN when either is NaN (PTX max.NaN, sm_80+): a block amax over
// |v| then also says whether the block holds a NaN or an Inf.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// bf16 bits of two values an MX quantizer writes (finite, +-Inf or the quiet NaN), packed (a
// low, b high): round_bf16(v, nearest_even) without its NaN branch. For these inputs that
// branch changes nothing: Inf and the quiet NaN have a zero low half, so the rounding
// increment never carries into the kept bits. The upper halves are picked by one byte permute.
__device__ __forceinline__ uint32_t mx_bf16x2(float a, float b) {
  const uint32_t x = f32_bits(a), y = f32_bits(b);
  const uint32_t xr = x + 0x7FFFu + ((x >> 16) & 1u);
  const uint32_t yr = y + 0x7FFFu + ((y >> 16) & 1u);
  return __byte_perm(xr, yr, 0x7632);
}

// Quantize four consecutive outputs v of this lane, at flat index idx (a multiple of 4), whose
// 32-element block is held by 8 consecutive lanes (lanes 8j..8j+7: element idx of lane 8j is a
// multiple of 32), and store their bf16 bits at pq.out + idx. Every lane of the warp must call
// this (the block amax is a butterfly over the 8 lanes); a group of 8 lanes is either wholly
// `active` or wholly not (inactive groups store nothing).
//
// kElem >= 0: the format is Elem(kElem) (pq.elem), its constants folded in at compile time (the
// paper's fp8_e4m3 has such instances: kProducedFolded); -1: pq.es at run time. Same values.
constexpr int kProducedFolded = static_cast<int>(Elem::fp8_e4m3);

template <int kElem>
__device__ __forceinline__ ElemSpec produced_spec(const ProducedQuant& pq) {
  if constexpr (kElem < 0) {
    return pq.es;
  } else {
    return device_elem_spec<static_cast<Elem>(kElem)>();
  }
}

template <int kElem = -1>
__device__ __forceinline__ void produce_quant4(const ProducedQuant& pq, float4 v, int64_t idx, bool active) {
  constexpr unsigned kFull = 0xFFFFFFFFu;
  const ElemSpec es = produced_spec<kElem>(pq);
  float e[4] = {v.x, v.y, v.z, v.w};
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (pq.round_first) e[j] = round_bf16(e[j], pq.bf16_mode);
    amax = max_nan(amax, fabsf(e[j]));
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = max_nan(amax, __shfl_xor_sync(kFull, amax, o));
  if (!active) return;
  const int s = block_scale_exp(amax, es, pq.rule, pq.bump);
  if (s == kScaleExpNaN) {
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = bits_f32(kMxQuietNaN);
  } else {
    const ElemScale sc = elem_scale(s);
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = quantize_element_fast(e[j], sc, es, pq.rounding).value;
  }
  *reinterpret_cast<uint2*>(pq.out + idx) = make_uint2(mx_bf16x2(e[0], e[1]), mx_bf16x2(e[2], e[3]));
}

}  // namespace mxlab::cuda
