// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011; the same generator as
// cuRAND's and Random123's philox4x32). Every random number in mxlab is a pure function of
// (seed, stream, step, index), so batch t can be produced at any time on any backend with
// the same integer stream, and nothing is stored or replayed.
#pragma once
#include <cstdint>

#include "lab/core/hd.h"

namespace mxlab {

// Random streams (the last counter word). Values are part of the reproducibility contract.
enum class Stream : uint32_t {
  init = 1,         // weight initialisation (student and teacher)
  data = 2,         // inputs x
  label_noise = 3,  // target noise n
  stochastic_round = 4,
  validation = 5,
  teacher_init = 6,
  probe = 7,        // the fixed probe batch of the curvature instrument and snapshots (x, then noise)
  curvature = 8,    // start vectors of the curvature eigensolver (lab/model/curvature.h)
  mx_label_noise = 9,  // the fresh label noise of the MX targets (data.mx_teacher_targets)
  mx_noise = 10,       // the u of precision.rounding: noise (lab/mx/README.md, "Noise instead of rounding")
  rotation_sign = 11,  // the random signs of precision.rotation: random_hadamard (lab/mx/hadamard.h)
  token_chain = 12,    // the fixed Markov chain of data.kind: tokens (lab/train/batch.h)
};

struct U32x4 {
  uint32_t v[4];
};

MXLAB_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

MXLAB_HD U32x4 philox4x32_10(U32x4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(M0, ctr.v[0], hi0, lo0);
    mulhilo32(M1, ctr.v[2], hi1, lo1);
    U32x4 next;
    next.v[0] = hi1 ^ ctr.v[1] ^ k0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ ctr.v[3] ^ k1;
    next.v[3] = lo0;
    ctr = next;
    k0 += W0;
    k1 += W1;
  }
  return ctr;
}

// Four random words for (seed, stream, step, index).
MXLAB_HD U32x4 philox(uint64_t seed, Stream stream, uint32_t step, uint64_t index) {
  U32x4 c;
  c.v[0] = static_cast<uint32_t>(index);
  c.v[1] = static_cast<uint32_t>(index >> 32);
  c.v[2] = step;
  c.v[3] = static_cast<uint32_t>(stream);
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform float in (0, 1]: 24 random bits, never 0 (safe for log).
MXLAB_HD float u32_to_uniform_open0(uint32_t u) {
  return static_cast<float>((u >> 8) + 1u) * (1.0f / 16777216.0f);
}

// Uniform float in [0, 1).
MXLAB_HD float u32_to_uniform(uint32_t u) { return static_cast<float>(u >> 8) * (1.0f / 16777216.0f); }

}  // namespace mxlab
