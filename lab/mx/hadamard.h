// Block Hadamard rotation of a tensor along one axis: what a GEMM applies to both of its operands
// along the reduction axis K before quantizing them (precision.rotation; lab/mx/README.md, "Block
// Hadamard rotation"). The scalar pieces are MXLAB_HD and shared by the CPU reference
// (hadamard.cpp) and the CUDA kernel (kernels/hadamard.cu): every output is the same sequence of
// float operations on both (a sign flip, the butterflies of a fixed network, one scaling), so the
// two agree bit for bit.
//
// Per block of n consecutive positions along the axis (n a power of two), v -> H_n D v / sqrt(n):
// D = diag(s_k) with s_k = -1 where the random sign of position k is set (random_signs), else
// D = I; H_n the Sylvester Hadamard matrix (symmetric, H_n H_n = n I). So the rotation R is
// orthogonal and symmetric up to D: R^T R = I, and a GEMM that rotates both operands with the
// same R computes (A R^T)(B R^T)^T = A B^T in exact arithmetic.
#pragma once
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/core/hd.h"
#include "lab/core/philox.h"
#include "lab/mx/quantize.h"

namespace mxlab {

// Hadamard block sizes: powers of two in [kMinRotationBlock, kMaxRotationBlock] (the CUDA kernel
// keeps a block in shared memory).
constexpr int kMinRotationBlock = 2;
constexpr int kMaxRotationBlock = 4096;

// How one GEMM operand is rotated (GemmOperand::rot).
struct RotationSpec {
  int block = 0;              // 0: not rotated; else the Hadamard block n along K
  bool random_signs = false;  // multiply by the random diagonal D first (random_hadamard)
  // Random signs: the sign of position k along K is bit (k mod 128) of
  // philox(seed, Stream::rotation_sign, salt, k / 128) (words v[0..3] = bits 0..127).
  uint64_t seed = 0;
  uint32_t salt = 0;  // a GEMM's: StepScalars.step (set by the backend, as QuantSpec::salt)
  bool active() const { return block > 0; }
};

MXLAB_HD bool is_rotation_block(int n) {
  return n >= kMinRotationBlock && n <= kMaxRotationBlock && (n & (n - 1)) == 0;
}

// l with 2^l = n (n a power of two).
MXLAB_HD int rotation_log2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

// fl(1/sqrt(n)), correctly rounded, for n = 2^l: 2^(-l/2) for even l; for odd l the float nearest
// to 1/sqrt(2) times 2^(-(l-1)/2), an exact power-of-two scaling of a correctly rounded value.
MXLAB_HD float hadamard_scale(int n) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  const int l = rotation_log2(n);
  const float p = bits_f32(static_cast<uint32_t>(127 - l / 2) << 23);  // 2^(-floor(l/2)), normal for l <= 12
  return (l & 1) ? p * kInvSqrt2 : p;
}

// Whether position k along K takes the sign -1 (random signs only).
MXLAB_HD bool rotation_sign_negative(uint64_t seed, uint32_t salt, int64_t k) {
  const U32x4 w = philox(seed, Stream::rotation_sign, salt, static_cast<uint64_t>(k) >> 7);
  return ((w.v[(k >> 5) & 3] >> (k & 31)) & 1u) != 0u;
}

// D v for the element v at position k along K (a sign flip: exact).
MXLAB_HD float rotation_signed(float v, bool random_signs, uint64_t seed, uint32_t salt, int64_t k) {
  return random_signs && rotation_sign_negative(seed, salt, k) ? -v : v;
}

// One butterfly of the network: (a, b) -> (a + b, a - b).
MXLAB_HD void hadamard_butterfly(float& a, float& b) {
  const float s = a + b;
  const float d = a - b;
  a = s;
  b = d;
}

// The butterflies of stage h (h = 1, 2, 4, ..., n/2, in this order) pair position i with i + h for
// every i whose bit h is clear; butterfly t (t in [0, n/2)) of a stage is the pair starting at:
MXLAB_HD int hadamard_pair_first(int t, int h) { return (t / h) * 2 * h + t % h; }

// The output of a position after the last stage: times the scale; a NaN becomes the canonical
// quiet NaN (x86 and CUDA propagate different NaN payloads through + and -).
MXLAB_HD float hadamard_output(float v, float scale) {
  return detmath::is_nan(v) ? detmath::canonical_nan() : v * scale;
}

// The unnormalised transform H_n v in place, stages h = 1, 2, ..., n/2 (the order both backends
// use). The CPU reference calls this; the CUDA kernel runs the butterflies of a stage in parallel,
// each the same hadamard_butterfly of the same two values.
MXLAB_HD void hadamard_transform(float* v, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int t = 0; t < n / 2; ++t) {
      const int i = hadamard_pair_first(t, h);
      hadamard_butterfly(v[i], v[i + h]);
    }
}

// Rotate `in` [rows x cols] into `out` (may alias `in`): blocks of r.block consecutive positions
// along `axis` (contiguous: along each row; strided: down each column), the sign of a position p
// along the axis that of k = p mod `period` (the reduction length K of the GEMM: a stacked
// operand of a batched GEMM repeats its signs per item). The length along the axis must be a
// multiple of `period`, and `period` of r.block. Throws mxlab::Error otherwise.
void hadamard_rotate(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, int64_t period,
                     const RotationSpec& r);

// Why a rotation of `r.block` cannot run along an axis of `length` positions with `period`, or
// "" (the checks of hadamard_rotate, shared with the CUDA launcher).
const char* rotation_shape_problem(int64_t length, int64_t period, const RotationSpec& r);

}  // namespace mxlab
