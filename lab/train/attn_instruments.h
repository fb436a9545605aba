// The attention projections' host instruments of a logged step (lab/train/SCHEMA.md, "Attention
// networks only"): the spectral norm of W_Q, W_K, W_V by power iteration, and the cosine between
// two W_Q gradient error directions. Both run on the host on downloaded buffers, so the CPU and
// the CUDA backend give the same bits from the same weights and gradients.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mxlab {

// Iterations of spectral_norm (each one multiplication by A and one by Aᵀ; at d = 512 about 10 ms
// a matrix on one core).
inline constexpr int kSpectralNormIters = 100;

// The largest singular value of the row-major matrix A [rows x cols] (float entries, double
// arithmetic), by `iters` power iterations on AᵀA: v_0 = (spectral_start(j))_j normalised, v_{k+1}
// = AᵀA v_k / |AᵀA v_k|, and the result |A v_iters|. It never exceeds the exact value (up to
// rounding) and approaches it from below: at 100 iterations within 1e-12 relative of a dense SVD
// where the top singular value stands apart (ratio >= 1.2 to the next), within 2 % on Gaussian
// matrices, whose top values crowd together (tests/cpu/test_attn_instruments.cpp). 0 for a zero
// matrix, NaN if an entry is not finite. A pure function of A's bits and `iters` (fixed order of
// operations, no contraction): the same on either backend.
double spectral_norm(const float* a, int64_t rows, int64_t cols, int iters = kSpectralNormIters);

// spectral_norm of `count` matrices of one shape, out[i] of mats[i], spread over up to `threads`
// host threads (0: as many as the machine has; one for fewer than 2^20 entries in all). Each matrix
// is computed whole by one thread, so the bits do not depend on the number of threads.
void spectral_norms(const float* const* mats, size_t count, int64_t rows, int64_t cols, double* out,
                    unsigned threads = 0, int iters = kSpectralNormIters);

// The fixed start vector of spectral_norm, entry j of n (before normalisation): the top 24 bits of
// splitmix64(j) scaled to [-1/2, 1/2). Deterministic and no random stream of the lab (lab/core/
// philox.h), yet generic: the all-ones vector would not do, since the gradient of a weight behind
// a layernorm has rows orthogonal to it, so what training adds to W_Q, W_K, W_V barely shows in
// W·1.
double spectral_start(int64_t j);

// ⟨a, b⟩ / (|a| |b|) over n entries (products and sums in double, in index order), clamped to
// [-1, 1]; exactly 1 when b = a (or b = 2^k a), exactly -1 when b = -a. NaN when either vector is
// zero or holds a non-finite entry.
double direction_cosine(const float* a, const float* b, size_t n);

}  // namespace mxlab
