// The CUDA flash kernels' decomposition of lab/model/flash_attention.h (kernels/flash_attention.cu):
// the pieces one lane of a warp runs between two synchronisations, as MXLAB_HD functions, so that
// the CPU can run them in the kernels' order (tests/cpu/test_flash_tiled.cpp emulates the kernels'
// blocks, warps and lanes with loops) and check the result against fa_fwd_row, fa_bwd_key and
// fa_bwd_query bit for bit. Every FP32 operation per output element is the scalar functions' own,
// in their order; only work that the scalar code does one element after another but that is
// independent (or exact and order-free) is spread over lanes:
//
//   logits   z_t = fa_dot_bf16(q, k_t) * scale: one lane per key t, each the same sequential dot
//            over c (the operands staged once as bf16: fa_bf16 is idempotent, so rounding at the
//            staging gives the bits of rounding at each use). Kept in shared memory, never
//            recomputed (the scalar forward computes each z three times, with the same bits).
//   r_m      the tile's maximum: the scalar loop `if (z > r_m) r_m = z` (from -inf) leaves the
//            first key t* (in increasing t) of the tile's maximal class under == (NaN never
//            enters), so its bits are z_{t*} (-0 and +0 compare equal: the first one wins).
//            FaTileMax carries (value, index of its first key, how many keys equal it); its
//            combine keeps the larger value, and on == the smaller index with the counts added:
//            commutative and associative, so any reduction tree (the warp's xor butterfly) gives
//            the scalar loop's r_m and #{t: z_t == r_m}. The row's zmax / nmax (first occurrence
//            of the row's maximal class, and its size) merge tile by tile the same way.
//   r_s      #{t: r_m - z_t <= eps} and the bf16 P-bar = 1 count: integer counts, order-free.
//   l, O     sequential: l = alpha l, then + p_t for t increasing; acc_c = alpha acc_c, then
//            + bf16(p_t) bf16(v_tc) for t increasing: one lane per column c (c = lane + 32 i,
//            i < kFaMaxCols), each its own sequential sum over the keys.
//   dK, dV   per key t, one lane per column, sequential over the rows r increasing; the per-(r,t)
//            P-bar and dS (two sequential dots each) one lane per row first.
//   dQ       per row, one lane per column: part_c over the tile's keys in order from 0, then
//            dq_c += part_c at each tile's end; the per-key dS one lane per key first.
//
// Key tiles shape the forward (a tile's statistics come before its updates) and dQ (where a part
// ends); the kernels stage keys or rows in chunks of their own size (FaPlan::chunk), which changes
// no bit: a tile longer than a chunk keeps its logits for the whole tile, and the sequential sums
// run on across chunk boundaries in the same registers.
#pragma once
#include <climits>
#include <cstdint>

#include "lab/core/detmath.h"
#include "lab/core/hd.h"
#include "lab/model/backend.h"
#include "lab/model/flash_attention.h"

namespace mxlab {

constexpr int kFaLanes = 32;    // lanes of a warp: the decomposition's parallel width
constexpr int kFaMaxCols = 4;   // columns per lane: the tiled kernels take dh <= kFaMaxDh
constexpr int kFaMaxDh = kFaLanes * kFaMaxCols;
constexpr int kFaWarps = 8;     // warps per block
constexpr int kFaPerWarp = 2;   // query rows (forward, dQ) or keys (dK, dV) per warp

// Row stride of a staged tile whose rows are read one lane per row (an odd stride puts the 32
// lanes' words in 32 different shared-memory banks).
MXLAB_HD int fa_lane_ld(int dh) { return dh % 2 == 0 ? dh + 1 : dh; }

// The launch plan of the tiled kernels for one shape (shared by the kernels and the CPU emulation).
struct FaPlan {
  int per_block;  // query rows (forward, dQ) or keys (dK, dV) per block: kFaWarps * kFaPerWarp
  int chunk;      // keys staged in shared memory at once (forward, dQ)
  int rchunk;     // query rows staged in shared memory at once (dK, dV)
  int bc;         // keys per tile, min(Bc, S) (a tile of S or more keys is the whole row either way)
  int ld;         // fa_lane_ld(dh)
};
MXLAB_HD FaPlan fa_plan(int64_t S, int64_t dh, int64_t bc) {
  FaPlan p;
  p.per_block = kFaWarps * kFaPerWarp;
  p.chunk = dh <= 64 ? 64 : 32;  // the sizes keep dh <= 64 under 48 KB of shared memory per block
  p.rchunk = dh <= 32 ? 64 : 32;
  p.bc = static_cast<int>(bc < S ? bc : S);
  if (p.bc < 1) p.bc = 1;
  p.ld = fa_lane_ld(static_cast<int>(dh));
  return p;
}

// Dynamic shared memory of each tiled kernel, in floats (kernels/flash_attention.cu lays it out).
// Forward: per row of the group its tile's (logit, then p and bf16 p) pairs, a chunk of K (stride
// ld) and of V, the group's Q rows. dK/dV: per key of the group a chunk of rows' (bf16 P-bar, dS)
// pairs, the group's K and V rows, a chunk of Q and dO rows (stride ld), their lse and delta. dQ:
// per row of the group a chunk of keys' dS, a chunk of K and V (stride ld), the group's Q and dO rows.
MXLAB_HD int64_t fa_fwd_smem_floats(const FaPlan& p, int64_t dh) {
  return 2 * static_cast<int64_t>(p.per_block) * p.bc + static_cast<int64_t>(p.chunk) * (p.ld + dh) +
         static_cast<int64_t>(p.per_block) * dh;
}
MXLAB_HD int64_t fa_bwd_key_smem_floats(const FaPlan& p, int64_t dh) {
  return 2 * static_cast<int64_t>(p.per_block) * (p.rchunk + dh) + 2 * static_cast<int64_t>(p.rchunk) * (p.ld + 1);
}
MXLAB_HD int64_t fa_bwd_query_smem_floats(const FaPlan& p, int64_t dh) {
  return static_cast<int64_t>(p.per_block) * p.chunk + 2 * static_cast<int64_t>(p.chunk) * p.ld +
         2 * static_cast<int64_t>(p.per_block) * dh;
}

// Two values side by side (8-byte aligned: one shared-memory load): (p, bf16 p) in the forward,
// (bf16 p, dS) in the backward. The forward first keeps the logit in .a.
struct alignas(8) FaPair {
  float a, b;
};

// sum_c a_c b_c in FP32, c increasing, from 0: fa_dot_bf16 on operands already rounded to bf16.
MXLAB_HD float fa_dot_pre(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int c = 0; c < n; ++c) s = s + a[c] * b[c];
  return s;
}
// Two such dots in one loop (independent sums: the same bits as two calls).
MXLAB_HD void fa_dot_pre2(const float* a0, const float* b0, const float* a1, const float* b1, int n, float* s0,
                          float* s1) {
  float x = 0.0f, y = 0.0f;
  for (int c = 0; c < n; ++c) {
    x = x + a0[c] * b0[c];
    y = y + a1[c] * b1[c];
  }
  *s0 = x;
  *s1 = y;
}

// ---- the tile maximum ----

struct FaTileMax {
  float v;    // the value (-inf: no key yet, or only -inf / NaN keys)
  int idx;    // the first key attaining it (INT_MAX: none)
  int count;  // how many keys equal it (==)
};
MXLAB_HD FaTileMax fa_max_none() { return {-detmath::pos_inf(), INT_MAX, 0}; }
// Commutative and associative (neither value is NaN): the larger value; on == the first key's bits
// and the counts added.
MXLAB_HD FaTileMax fa_max_combine(FaTileMax a, FaTileMax b) {
  if (b.v > a.v) return b;
  if (a.v > b.v) return a;
  FaTileMax r = b.idx < a.idx ? b : a;
  r.count = a.count + b.count;
  return r;
}
// Key t with logit z (a NaN is never the maximum and never counted, as in the scalar loop).
MXLAB_HD FaTileMax fa_max_push(FaTileMax a, float z, int t) {
  if (detmath::is_nan(z)) return a;
  return fa_max_combine(a, FaTileMax{z, t, 1});
}

// ---- the forward ----

// One query row's running statistics (every lane of the row's warp holds the same copy).
struct FaRowState {
  float m, l, zmax;
  int nmax, nones;
};
MXLAB_HD FaRowState fa_row_start() {
  const float neg_inf = -detmath::pos_inf();
  return {neg_inf, 0.0f, neg_inf, 0, 0};
}

// Lane `lane`'s logits of keys [k0, k1) (staged at Ks, key t on row t - k0 of stride ldk) for
// query row qb (bf16): z_t into p[t - c0].a, c0 the tile's first key.
MXLAB_HD void fa_fwd_logits_lane(int lane, const float* qb, const float* Ks, int ldk, int k0, int k1, int c0, int dh,
                                 float scale, FaPair* p) {
  int t = k0 + lane;
  for (; t + kFaLanes < k1; t += 2 * kFaLanes) {
    float s0, s1;
    fa_dot_pre2(qb, Ks + (t - k0) * ldk, qb, Ks + (t + kFaLanes - k0) * ldk, dh, &s0, &s1);
    p[t - c0].a = s0 * scale;
    p[t + kFaLanes - c0].a = s1 * scale;
  }
  if (t < k1) p[t - c0].a = fa_dot_pre(qb, Ks + (t - k0) * ldk, dh) * scale;
}

// Lane `lane`'s part of the tile maximum over the tile's n logits p[0, n).a (keys lane, lane + 32, ...).
MXLAB_HD FaTileMax fa_tile_max_lane(int lane, const FaPair* p, int n) {
  FaTileMax m = fa_max_none();
  for (int t = lane; t < n; t += kFaLanes) m = fa_max_push(m, p[t].a, t);
  return m;
}

// Lane `lane`'s count of the tile's keys within eps of r_m (Algorithm 3's r_s).
MXLAB_HD int fa_tile_ties_lane(int lane, const FaPair* p, int n, float rm, float eps) {
  int c = 0;
  for (int t = lane; t < n; t += kFaLanes)
    if (rm - p[t].a <= eps) ++c;
  return c;
}

// Enters a key tile whose maximum is tm and whose r_s is rs: the row maximum's bookkeeping, m_new,
// l = alpha l; returns alpha (the accumulator's scale). s.m becomes m_new.
MXLAB_HD float fa_row_enter_tile(FaRowState& s, const FaTileMax& tm, int rs, const Backend::FlashSpec& f) {
  const float rm = tm.v;
  if (rm > s.zmax) {
    s.zmax = rm;
    s.nmax = tm.count;
  } else if (rm == s.zmax) {
    s.nmax += tm.count;
  }
  const float mt = f.stabilized ? fa_stable_shift(rm, rs, f.beta) : rm;
  const float m_new = mt > s.m ? mt : s.m;
  const float alpha = det_exp(s.m - m_new);
  s.l = alpha * s.l;
  s.m = m_new;
  return alpha;
}

// Lane `lane`'s P-bar of the tile's keys: p[t] = (p_t, bf16 p_t) from the logit in p[t].a; returns
// how many of its bf16 P-bar are 1.
MXLAB_HD int fa_tile_probs_lane(int lane, FaPair* p, int n, float m_new) {
  int ones = 0;
  for (int t = lane; t < n; t += kFaLanes) {
    const float pt = det_exp(p[t].a - m_new);
    const float pb = fa_bf16(pt);
    if (pb == 1.0f) ++ones;
    p[t] = FaPair{pt, pb};
  }
  return ones;
}

// The lane's columns c = lane + 32 i of the accumulator.
MXLAB_HD void fa_cols_zero(float* x) {
  for (int i = 0; i < kFaMaxCols; ++i) x[i] = 0.0f;
}
MXLAB_HD void fa_fwd_rescale_lane(int lane, int dh, float* acc, float alpha) {
  for (int i = 0; i < kFaMaxCols; ++i)
    if (lane + i * kFaLanes < dh) acc[i] = alpha * acc[i];
}

// Keys [k0, k1) of the tile that starts at c0 (V staged at Vs, key t on row t - k0 of stride ldv):
// l + p_t and acc_c + bf16(p_t) bf16(v_tc) for t increasing. (Each column's sum runs over t in its
// own loop: a column slot the lane does not own is skipped whole, not predicated key by key.)
MXLAB_HD void fa_fwd_accumulate_lane(int lane, int dh, const FaPair* p, const float* Vs, int ldv, int k0, int k1, int c0,
                                     float* acc, float* l) {
  float sum = *l;
  for (int t = k0; t < k1; ++t) sum = sum + p[t - c0].a;
  *l = sum;
  for (int i = 0; i < kFaMaxCols; ++i) {
    const int c = lane + i * kFaLanes;
    if (c >= dh) break;
    float a = acc[i];
    for (int t = k0; t < k1; ++t) a = a + p[t - c0].b * Vs[(t - k0) * ldv + c];
    acc[i] = a;
  }
}

// The row's outputs: the lane's columns of o_hp = acc (1 / l) and o = bf16(o_hp).
MXLAB_HD void fa_fwd_finish_lane(int lane, int dh, const float* acc, float l, float* o, float* o_hp) {
  const float inv = 1.0f / l;
  for (int i = 0; i < kFaMaxCols; ++i) {
    const int c = lane + i * kFaLanes;
    if (c < dh) {
      const float h = acc[i] * inv;
      o_hp[c] = h;
      o[c] = fa_bf16(h);
    }
  }
}
MXLAB_HD void fa_row_finish(const FaRowState& s, float* lse, float* rowmax, float* stats) {
  *lse = s.m + det_log(s.l);
  *rowmax = s.zmax;
  stats[0] = static_cast<float>(s.nmax);
  stats[1] = static_cast<float>(s.nones);
}

// ---- dK, dV ----

// Lane `lane`'s rows [rb + lane, r1) (step 32) of the staged chunk of rows that starts at r0 (Q and dO
// bf16 at Qs, Ds, row r on row r - r0 of stride ld; lse, delta indexed by r - r0) against one key
// (kb, vb bf16): pd[r - r0] = (bf16 P-bar, dS).
MXLAB_HD void fa_bwd_key_pds_lane(int lane, const float* kb, const float* vb, const float* Qs, const float* Ds, int ld,
                                  const float* lse, const float* delta, int r0, int rb, int r1, int dh, float scale,
                                  FaPair* pd) {
  for (int r = rb + lane; r < r1; r += kFaLanes) {
    const int j = r - r0;
    float s, dp;
    fa_dot_pre2(Qs + j * ld, kb, Ds + j * ld, vb, dh, &s, &dp);
    const float p = det_exp(s * scale - lse[j]);
    pd[j] = FaPair{fa_bf16(p), fa_ds(p, dp, delta[j])};
  }
}

// The lane's columns of the key's dV and dK over rows [rb, r1) of the chunk, r increasing.
MXLAB_HD void fa_bwd_key_accumulate_lane(int lane, int dh, const FaPair* pd, const float* Qs, const float* Ds, int ld,
                                         int r0, int rb, int r1, float* dk, float* dv) {
  for (int i = 0; i < kFaMaxCols; ++i) {
    const int c = lane + i * kFaLanes;
    if (c >= dh) break;
    float a = dv[i], b = dk[i];
    for (int r = rb; r < r1; ++r) {
      const int j = r - r0;
      const FaPair x = pd[j];
      a = a + x.a * Ds[j * ld + c];
      b = b + x.b * Qs[j * ld + c];
    }
    dv[i] = a;
    dk[i] = b;
  }
}

MXLAB_HD void fa_bwd_key_finish_lane(int lane, int dh, const float* dk, const float* dv, float scale, float* dk_out,
                                     float* dv_out) {
  for (int i = 0; i < kFaMaxCols; ++i) {
    const int c = lane + i * kFaLanes;
    if (c < dh) {
      dk_out[c] = fa_bf16(dk[i] * scale);
      dv_out[c] = fa_bf16(dv[i]);
    }
  }
}

// ---- dQ ----

// Lane `lane`'s keys [k0 + lane, k1) (step 32) of the staged chunk of keys that starts at k0 (K and
// V bf16 at Ks, Vs, key t on row t - k0 of stride ld) for one query row (qb, db bf16; its lse and
// delta): ds[t - k0].
MXLAB_HD void fa_bwd_query_ds_lane(int lane, const float* qb, const float* db, float lse, float delta, const float* Ks,
                                   const float* Vs, int ld, int k0, int k1, int dh, float scale, float* ds) {
  for (int t = k0 + lane; t < k1; t += kFaLanes) {
    float s, dp;
    fa_dot_pre2(qb, Ks + (t - k0) * ld, db, Vs + (t - k0) * ld, dh, &s, &dp);
    const float p = det_exp(s * scale - lse);
    ds[t - k0] = fa_ds(p, dp, delta);
  }
}

// The lane's columns over keys [k0, k1) of the chunk, t increasing: part_c + dS bf16(k_tc), and at
// the end of each key tile (every bc keys from 0, or the row's last visible key `keys`) dq_c +=
// part_c, part_c = 0.
MXLAB_HD void fa_bwd_query_accumulate_lane(int lane, int dh, const float* ds, const float* Ks, int ld, int k0, int k1,
                                           int keys, int bc, float* part, float* dq) {
  int64_t first_end = (static_cast<int64_t>(k0) / bc + 1) * bc;
  if (first_end > keys) first_end = keys;
  for (int i = 0; i < kFaMaxCols; ++i) {
    const int c = lane + i * kFaLanes;
    if (c >= dh) break;
    float pc = part[i], qc = dq[i];
    int64_t end = first_end;
    for (int t = k0; t < k1; ++t) {
      pc = pc + ds[t - k0] * Ks[(t - k0) * ld + c];
      if (t + 1 == end) {
        qc = qc + pc;
        pc = 0.0f;
        end = end + bc < keys ? end + bc : keys;
      }
    }
    part[i] = pc;
    dq[i] = qc;
  }
}

MXLAB_HD void fa_bwd_query_finish_lane(int lane, int dh, const float* dq, float scale, float* dq_out) {
  for (int i = 0; i < kFaMaxCols; ++i) {
    const int c = lane + i * kFaLanes;
    if (c < dh) dq_out[c] = fa_bf16(dq[i] * scale);
  }
}

}  // namespace mxlab
