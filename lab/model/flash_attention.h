// FlashAttention-2 in bf16, the numerics of precision.attention: flash_bf16 (lab/model/README.md,
// "Flash attention in bf16"), as scalar code shared by the CPU reference and the CUDA kernels
// (kernels/flash_attention.cu): the forward one query row at a time, the backward one key (dK, dV)
// or one query row (dQ) at a time. Each function is independent of every other row or key; the CPU
// calls them in loops. The CUDA kernels run their decomposition (lab/model/flash_attention_tiled.h:
// a warp per row or key, lanes over keys for the dots and over columns for the sums, every sum in
// the order below) and get the CPU's bits; where those do not apply, these functions one thread per
// row or key.
//
// Against the flash-attention paper (Qiu & Yao, "Why low-precision transformer training fails",
// Algorithms 1-3; FlashAttention-2's forward and backward) every rounding point is:
//
//   inputs   Q, K, V, dO are read as bf16 (round to nearest even, the kernel's bf16 tensors):
//            fa_bf16. The scale alpha = 1/sqrt(dh) is not absorbed into Q (FlashAttention-2
//            keeps S unscaled and scales in the exponent): z = S * scale in FP32.
//   S        S_rt = sum_c q_rc k_tc in FP32, c increasing (each product of two bf16 is exact in
//            FP32, so only the additions round): fa_dot_bf16. Alg. 1 line 6.
//   m        per key tile of Bc keys j: r_m = rowmax of z over the tile's keys, m_new =
//            max(m_old, r_m) (Alg. 1 line 7), or under the stabilized softmax m_new =
//            max(m_old, m'') with m'' from r_m and r_s = #{t in tile: r_m - z_t <= eps} (Alg. 3
//            lines 7-10: beta r_m for a repeated positive maximum, 0 for a repeated negative one;
//            Alg. 3 line 10 writes m', meaning the m'' of line 9). FP32.
//   P-bar    p_t = exp(z_t - m_new) in FP32 (det_exp: exp(0) = 1 exactly, so a row maximum gives
//            P-bar = 1 exactly, the paper's mechanism); the P-bar V product reads it as bf16,
//            fa_bf16(p_t) (FlashAttention-2 converts P to the input type for its second MMA).
//   l        l = exp(m_old - m_new) l, then + p_t for each key of the tile in increasing order,
//            from the FP32 p_t (not the bf16 one, as FlashAttention-2's row sum). Alg. 1 line 7.
//   O        the accumulator acc_c (FP32) = exp(m_old - m_new) acc_c, then + bf16(p_t) bf16(v_tc)
//            for each key in increasing order (the MMA's accumulator input: FP32 accumulation
//            across tiles; the products are exact). Alg. 1 line 8. After the last tile
//            O_hp = acc * (1 / l) in FP32 (FlashAttention-2 multiplies by the reciprocal; Alg. 1
//            line 10 divides) and O = bf16(O_hp): the bf16 output O_lp.
//   L        lse = m + log(l) in FP32 (det_log). Alg. 1 line 11.
//   delta    delta_lp = sum_c bf16(dO_rc) O_rc (O = O_lp, products exact) and delta_hp = sum_c
//            (bf16(dO_rc) O_hp_rc) (each product rounded to FP32), both FP32 with c increasing.
//            Alg. 2 line 4 uses delta_lp; precision.attention_delta: hp uses delta_hp.
//   P, dS    recomputed per (row, key): p = exp(z - lse) (FP32), dP = sum_c bf16(dO_rc) bf16(v_tc)
//            (FP32, as S), dS = bf16(p (dP - delta)) (FP32 then bf16 for the two MMAs).
//            Alg. 2 lines 8-12.
//   dV, dK   per key t, accumulated in FP32 over the query rows r in increasing order:
//            dV_t += bf16(p) bf16(dO_r), dK_t += dS bf16(q_r) (Alg. 2 lines 10, 14: the key
//            tile j is the outer loop, the row tiles i the inner one, so each key's sums run
//            over the rows in order); then dK = bf16(dK * scale), dV = bf16(dV).
//   dQ       per query row r and key tile j in increasing order: a tile sum part_c = sum over
//            the tile's keys (increasing) of dS bf16(k_tc) from 0, then dQ_c += part_c (Alg. 2
//            line 13; FlashAttention-2 adds each tile's dQ block into an FP32 accumulator);
//            then dQ = bf16(dQ * scale).
//
// The tile loop order is Algorithm 1's (row tiles i outer, key tiles j inner) forward and
// Algorithm 2's (key tiles j outer, row tiles i inner) backward. Only Bc shapes a result: a row's
// forward never reads another row, and the accumulation orders above do not depend on Br, which
// therefore changes no bit (it is kept for the kernel's launch shape; tests check both facts).
// Causal mask (key t visible to query r iff t <= r): masked entries are never added; a tile with
// no visible key for a row is skipped, which is bit-identical to running it (exp(0) = 1 scales
// by exactly 1 and nothing is added).
#pragma once
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/core/hd.h"
#include "lab/model/backend.h"
#include "lab/mx/scalar.h"

namespace mxlab {

// The kernel's bf16 tensors: round to nearest even.
MXLAB_HD float fa_bf16(float x) { return round_bf16(x, Rounding::nearest_even); }

// sum_c bf16(a_c) bf16(b_c) in FP32, c increasing (products exact, additions rounded).
MXLAB_HD float fa_dot_bf16(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t c = 0; c < n; ++c) s = s + fa_bf16(a[c]) * fa_bf16(b[c]);
  return s;
}

// The scaled logit z = S * scale of query row q and key row k.
MXLAB_HD float fa_logit(const float* q, const float* k, int64_t dh, float scale) {
  return fa_dot_bf16(q, k, dh) * scale;
}

// Algorithm 3 lines 8-9: the shift of a tile whose maximum r_m is attained r_s times.
MXLAB_HD float fa_stable_shift(float rm, int64_t rs, float beta) {
  if (rs > 1 && rm > 0.0f) return beta * rm;
  if (rs > 1 && rm < 0.0f) return 0.0f;
  return rm;
}

// Keys visible to query row r: [0, fa_keys).
MXLAB_HD int64_t fa_keys(int64_t r, int64_t S, bool causal) { return causal ? r + 1 : S; }

// dS of one (row, key): bf16(p (dP - delta)).
MXLAB_HD float fa_ds(float p, float dp, float delta) { return fa_bf16(p * (dp - delta)); }

// The forward of query row r of one (sequence, head): Q, K, V [S x dh]. Writes o [dh] (O_lp),
// o_hp [dh] (O_hp; the accumulator until the end), lse, rowmax (the largest z of the row's visible
// keys: the true maximum, not the stabilized shift) and stats[0] = how many visible keys attain it
// exactly, stats[1] = how many bf16 P-bar entries entering the P-bar V product equal 1.
MXLAB_HD void fa_fwd_row(const float* Q, const float* K, const float* V, int64_t S, int64_t dh, float scale,
                         const Backend::FlashSpec& f, int64_t r, float* o, float* o_hp, float* lse, float* rowmax,
                         float* stats) {
  const float* q = Q + r * dh;
  const int64_t keys = fa_keys(r, S, f.causal);
  const float neg_inf = -detmath::pos_inf();
  float* acc = o_hp;
  for (int64_t c = 0; c < dh; ++c) acc[c] = 0.0f;
  float m = neg_inf, l = 0.0f, zmax = neg_inf;
  int64_t nmax = 0, nones = 0;
  for (int64_t c0 = 0; c0 < keys; c0 += f.bc) {
    const int64_t c1 = c0 + f.bc < keys ? c0 + f.bc : keys;
    float rm = neg_inf;
    for (int64_t t = c0; t < c1; ++t) {
      const float z = fa_logit(q, K + t * dh, dh, scale);
      if (z > rm) rm = z;
      if (z > zmax) {
        zmax = z;
        nmax = 1;
      } else if (z == zmax) {
        ++nmax;
      }
    }
    float mt = rm;
    if (f.stabilized) {
      int64_t rs = 0;
      for (int64_t t = c0; t < c1; ++t)
        if (rm - fa_logit(q, K + t * dh, dh, scale) <= f.eps) ++rs;
      mt = fa_stable_shift(rm, rs, f.beta);
    }
    const float m_new = mt > m ? mt : m;
    const float alpha = det_exp(m - m_new);
    l = alpha * l;
    for (int64_t c = 0; c < dh; ++c) acc[c] = alpha * acc[c];
    for (int64_t t = c0; t < c1; ++t) {
      const float p = det_exp(fa_logit(q, K + t * dh, dh, scale) - m_new);
      const float pb = fa_bf16(p);
      if (pb == 1.0f) ++nones;
      l = l + p;
      const float* vt = V + t * dh;
      for (int64_t c = 0; c < dh; ++c) acc[c] = acc[c] + pb * fa_bf16(vt[c]);
    }
    m = m_new;
  }
  const float inv = 1.0f / l;
  for (int64_t c = 0; c < dh; ++c) {
    o_hp[c] = acc[c] * inv;
    o[c] = fa_bf16(o_hp[c]);
  }
  *lse = m + det_log(l);
  *rowmax = zmax;
  stats[0] = static_cast<float>(nmax);
  stats[1] = static_cast<float>(nones);
}

// delta of one row: delta_lp = sum bf16(dO) O_lp, delta_hp = sum bf16(dO) O_hp (FP32, c increasing).
MXLAB_HD void fa_delta_row(const float* dout, const float* o, const float* o_hp, int64_t dh, float* delta_lp,
                           float* delta_hp) {
  float a = 0.0f, b = 0.0f;
  for (int64_t c = 0; c < dh; ++c) {
    const float g = fa_bf16(dout[c]);
    a = a + g * o[c];
    b = b + g * o_hp[c];
  }
  *delta_lp = a;
  *delta_hp = b;
}

// dK, dV of key t (dk, dv [dh]), from the rows' lse and delta (the one the backward uses).
MXLAB_HD void fa_bwd_key(const float* Q, const float* K, const float* V, const float* dO, const float* lse,
                         const float* delta, int64_t S, int64_t dh, float scale, const Backend::FlashSpec& f,
                         int64_t t, float* dk, float* dv) {
  const float* kt = K + t * dh;
  const float* vt = V + t * dh;
  for (int64_t c = 0; c < dh; ++c) dk[c] = dv[c] = 0.0f;
  for (int64_t r = f.causal ? t : 0; r < S; ++r) {
    const float* qr = Q + r * dh;
    const float* dor = dO + r * dh;
    const float p = det_exp(fa_logit(qr, kt, dh, scale) - lse[r]);
    const float pb = fa_bf16(p);
    for (int64_t c = 0; c < dh; ++c) dv[c] = dv[c] + pb * fa_bf16(dor[c]);
    const float ds = fa_ds(p, fa_dot_bf16(dor, vt, dh), delta[r]);
    for (int64_t c = 0; c < dh; ++c) dk[c] = dk[c] + ds * fa_bf16(qr[c]);
  }
  for (int64_t c = 0; c < dh; ++c) {
    dk[c] = fa_bf16(dk[c] * scale);
    dv[c] = fa_bf16(dv[c]);
  }
}

// dQ of query row r (dq [dh]); part [dh] is scratch (one key tile's sum).
MXLAB_HD void fa_bwd_query(const float* Q, const float* K, const float* V, const float* dO, const float* lse,
                           const float* delta, int64_t S, int64_t dh, float scale, const Backend::FlashSpec& f,
                           int64_t r, float* dq, float* part) {
  const float* qr = Q + r * dh;
  const float* dor = dO + r * dh;
  const int64_t keys = fa_keys(r, S, f.causal);
  for (int64_t c = 0; c < dh; ++c) dq[c] = 0.0f;
  for (int64_t c0 = 0; c0 < keys; c0 += f.bc) {
    const int64_t c1 = c0 + f.bc < keys ? c0 + f.bc : keys;
    for (int64_t c = 0; c < dh; ++c) part[c] = 0.0f;
    for (int64_t t = c0; t < c1; ++t) {
      const float* kt = K + t * dh;
      const float p = det_exp(fa_logit(qr, kt, dh, scale) - lse[r]);
      const float ds = fa_ds(p, fa_dot_bf16(dor, V + t * dh, dh), delta[r]);
      for (int64_t c = 0; c < dh; ++c) part[c] = part[c] + ds * fa_bf16(kt[c]);
    }
    for (int64_t c = 0; c < dh; ++c) dq[c] = dq[c] + part[c];
  }
  for (int64_t c = 0; c < dh; ++c) dq[c] = fa_bf16(dq[c] * scale);
}

}  // namespace mxlab
