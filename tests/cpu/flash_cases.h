// The shapes and inputs on which the flash kernels' tiled decomposition (lab/model/flash_attention_tiled.h)
// is checked bit for bit: on the CPU by tests/cpu/test_flash_tiled.cpp (the kernels' order emulated
// with loops, against the scalar functions) and on the GPU by tests/gpu/test_flash_attention_gpu.cu
// (FlashGpu.ExtendedShapesMatchCpu: the CUDA kernels against the CPU backend).
//
// The list crosses head dims 16, 32, 64, 128 with key tiles Bc 16, 32, 64 and 100 (a tile longer than
// the kernels' 64-key chunk), sequences of 37, 70 and 129 tokens (never a multiple of the tile),
// causal and not, each softmax, each delta, on three kinds of inputs:
//   gaussian   Q, K, V, dO ~ N(0, 1);
//   tie_heavy  K rows drawn from 5 distinct bf16 vectors per item (rows whose maximum is attained at
//              several keys, bf16 P-bar entries equal to 1, the stabilized softmax's shifts), every
//              7th Q row zero (all its logits 0: a maximum of 0 attained by every key);
//   extreme    rows of Q scaled by 24 (4 under the stabilized softmax; logits in the hundreds or
//              thousands: P-bar underflows to 0, alpha to 0),
//              by 1e-20 or zero; keys scaled by 24, by 1e-20 (subnormal products against the 1e-20
//              rows) or repeating the previous key; V scaled by 100, dO by 1e-3; all inputs and all
//              outputs finite (the CPU test checks it: the CPU's and the GPU's NaN payloads differ).
// Then single cases for the edges: S = 1, Bc = 1, Bc >= S, odd and non-power-of-two head dims,
// tiles of 200 keys (several chunks), a long sequence with tiles across chunk boundaries.
// gpu_only marks shapes the CPU emulation leaves out (dh over the tiled kernels' 128: the
// reference kernels run; key tiles that need opt-in shared memory: the same code as the others).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/mx/scalar.h"

namespace mxlab::flashcases {

enum class Inputs { gaussian, tie_heavy, extreme };

struct Case {
  int64_t items, S, dh;
  Backend::FlashSpec f;
  Inputs in;
  uint64_t seed;
  bool gpu_only = false;
  std::string name() const {
    const char* kind = in == Inputs::gaussian ? "gaussian" : in == Inputs::tie_heavy ? "tie_heavy" : "extreme";
    return std::string(kind) + " " + std::to_string(items) + "x" + std::to_string(S) + "x" + std::to_string(dh) +
           " Bc " + std::to_string(f.bc) + (f.causal ? " causal" : "") + (f.stabilized ? " stabilized" : "") +
           (f.delta_hp ? " delta_hp" : "") + " eps " + std::to_string(f.eps);
  }
};

inline Backend::FlashSpec spec(int64_t bc, bool causal, bool stabilized, bool delta_hp, float eps = 1e-3f) {
  return Backend::FlashSpec::make(128, bc, causal, stabilized, delta_hp, eps);
}

inline std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t dhs[] = {16, 32, 64, 128};
  const int64_t bcs[] = {16, 32, 64, 100};
  const int64_t lens[] = {37, 70, 129};
  const Inputs kinds[] = {Inputs::gaussian, Inputs::tie_heavy, Inputs::extreme};
  uint64_t i = 0;
  for (int64_t dh : dhs)
    for (int64_t bc : bcs)
      for (Inputs in : kinds) {
        // i mod 12 runs through every (causal, stabilized, S) for each head dim.
        const bool causal = i % 2 == 0, stabilized = (i / 2) % 2 == 0;
        const float eps = (stabilized && in == Inputs::tie_heavy && i % 3 == 1) ? std::ldexp(1.0f, -9) : 1e-3f;
        out.push_back({2, lens[i % 3], dh, spec(bc, causal, stabilized, i % 5 == 0, eps), in, 1000 + 17 * i});
        ++i;
      }
  out.push_back({3, 1, 32, spec(64, true, false, false), Inputs::gaussian, 7});
  out.push_back({2, 37, 24, spec(1, true, true, false), Inputs::tie_heavy, 8});
  out.push_back({2, 37, 24, spec(1, false, false, true), Inputs::gaussian, 9});
  out.push_back({2, 70, 32, spec(128, false, true, false), Inputs::tie_heavy, 10});
  out.push_back({2, 45, 7, spec(16, true, false, false), Inputs::extreme, 11});
  out.push_back({2, 50, 96, spec(32, false, true, true), Inputs::tie_heavy, 12});
  out.push_back({2, 33, 100, spec(64, true, false, false), Inputs::gaussian, 13});
  out.push_back({1, 150, 32, spec(200, true, true, false), Inputs::tie_heavy, 14});
  out.push_back({1, 150, 128, spec(200, false, false, false), Inputs::gaussian, 15});
  out.push_back({1, 200, 64, spec(40, true, false, true), Inputs::extreme, 16});
  out.push_back({1, 200, 16, spec(40, false, true, false), Inputs::tie_heavy, 17});
  // GPU only: the reference kernels (dh 160), and key tiles whose shared memory needs the opt-in.
  out.push_back({2, 40, 160, spec(16, true, true, false), Inputs::tie_heavy, 18, true});
  out.push_back({1, 600, 128, spec(512, true, false, false), Inputs::gaussian, 19, true});
  out.push_back({1, 300, 64, spec(300, false, true, true), Inputs::tie_heavy, 20, true});
  return out;
}

struct Tensors {
  std::vector<float> q, k, v, dout;
};

inline float bf16(float x) { return round_bf16(x, Rounding::nearest_even); }

inline Tensors inputs(const Case& c) {
  const int64_t items = c.items, S = c.S, dh = c.dh;
  const size_t n = static_cast<size_t>(items * S * dh);
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto normal = [&](float scale) {
    std::vector<float> x(n);
    for (float& e : x) e = scale * nd(rng);
    return x;
  };
  Tensors t{normal(1.0f), normal(1.0f), normal(1.0f), normal(1.0f)};
  auto row = [&](std::vector<float>& x, int64_t b, int64_t r) { return x.data() + (b * S + r) * dh; };
  if (c.in == Inputs::tie_heavy) {
    constexpr int64_t kVocab = 5;
    std::vector<float> table(static_cast<size_t>(items * kVocab * dh));
    for (float& e : table) e = bf16(1.5f * nd(rng));
    std::uniform_int_distribution<int64_t> pick(0, kVocab - 1);
    for (int64_t b = 0; b < items; ++b)
      for (int64_t r = 0; r < S; ++r) {
        const int64_t tok = pick(rng);
        float* kr = row(t.k, b, r);
        float* qr = row(t.q, b, r);
        for (int64_t c2 = 0; c2 < dh; ++c2) {
          kr[c2] = table[static_cast<size_t>((b * kVocab + tok) * dh + c2)];
          qr[c2] = r % 7 == 3 ? 0.0f : bf16(1.5f * qr[c2]);
        }
      }
    for (float& x : t.v) x = bf16(-std::fabs(x) * 2.0f + 0.3f);
  } else if (c.in == Inputs::extreme) {
    // Under the stabilized softmax a repeated maximum r_m is shifted to beta r_m, and a row whose
    // P-bar all underflow (r_m over ~50) has l = 0 and NaN outputs, whose NaN payloads differ
    // between x86 and CUDA: scale 4 keeps those rows finite.
    const float big = c.f.stabilized ? 4.0f : 24.0f;
    for (int64_t b = 0; b < items; ++b)
      for (int64_t r = 0; r < S; ++r) {
        float* qr = row(t.q, b, r);
        float* kr = row(t.k, b, r);
        const float qs = r % 4 == 0 ? big : r % 4 == 1 ? 1e-20f : r % 4 == 2 ? 0.0f : 1.0f;
        for (int64_t c2 = 0; c2 < dh; ++c2) {
          qr[c2] *= qs;
          if (r % 5 == 0) kr[c2] *= big;
          if (r % 5 == 2) kr[c2] *= 1e-20f;  // against a 1e-20 row: subnormal products
          if (r % 5 == 1 && r > 0) kr[c2] = kr[c2 - dh];  // the previous key again
        }
      }
    for (float& x : t.v) x *= 100.0f;
    for (float& x : t.dout) x *= 1e-3f;
  }
  return t;
}

}  // namespace mxlab::flashcases
