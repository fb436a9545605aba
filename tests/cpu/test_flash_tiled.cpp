// The CUDA flash kernels' decomposition on the CPU (lab/model/flash_attention_tiled.h): the tiled
// kernels of kernels/flash_attention.cu emulated here block by block with their plan (fa_plan), their
// shared-memory staging (bf16 rows at their strides, the unstaged rest poisoned with NaN), their
// warps' rows and keys, and their lanes in loops between the kernels' synchronisations (in
// descending lane order, so a lane reading another lane's result before the synchronisation that
// publishes it would read a poisoned or stale value); the warp reductions are the kernels' xor
// butterflies. The outputs must equal the CPU backend's (fa_fwd_row, fa_delta_row, fa_bwd_key,
// fa_bwd_query in loops) bit for bit on the shapes of tests/cpu/flash_cases.h, at the kernels'
// staging sizes and at others (which change no bit). The GPU side: tests/gpu/test_flash_attention_gpu.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lab/cpu/cpu_backend.h"
#include "lab/model/flash_attention.h"
#include "lab/model/flash_attention_tiled.h"
#include "tests/cpu/flash_cases.h"

using namespace mxlab;

namespace {

using flashcases::Case;
using flashcases::Tensors;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class F>
void each_lane(F&& f) {
  for (int lane = kFaLanes - 1; lane >= 0; --lane) f(lane);
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_max(const FaTileMax& a, const FaTileMax& b) {
  return same_float(a.v, b.v) && a.idx == b.idx && a.count == b.count;
}

// The kernels' xor butterflies (fa_warp_max, fa_warp_count): every lane must end with the same value.
FaTileMax butterfly(std::array<FaTileMax, kFaLanes> v) {
  for (int o = kFaLanes / 2; o > 0; o >>= 1) {
    std::array<FaTileMax, kFaLanes> n;
    for (int l = 0; l < kFaLanes; ++l) n[l] = fa_max_combine(v[l], v[l ^ o]);
    v = n;
  }
  for (int l = 1; l < kFaLanes; ++l) EXPECT_TRUE(same_max(v[l], v[0])) << "lane " << l;
  return v[0];
}
int butterfly(std::array<int, kFaLanes> v) {
  for (int o = kFaLanes / 2; o > 0; o >>= 1) {
    std::array<int, kFaLanes> n;
    for (int l = 0; l < kFaLanes; ++l) n[l] = v[l] + v[l ^ o];
    v = n;
  }
  return v[0];
}

// fa_stage: rows [r0, r1) of an item's [S x dh] tensor as bf16 at stride ld, the rest poisoned.
void stage(std::vector<float>& dst, int ld, const float* src, int r0, int r1, int dh) {
  std::fill(dst.begin(), dst.end(), kNaN);
  for (int r = r0; r < r1; ++r)
    for (int c = 0; c < dh; ++c) dst[static_cast<size_t>((r - r0) * ld + c)] = fa_bf16(src[static_cast<int64_t>(r) * dh + c]);
}

using Cols = std::array<float, kFaMaxCols>;

struct FwdOut {
  std::vector<float> o, o_hp, lse, rowmax, stats;
};
struct BwdOut {
  std::vector<float> dq, dk, dv, delta, delta_hp;
};

// flash_fwd_tiled_kernel. The plan may differ from fa_plan's (chunk, per_block): they change no bit.
FwdOut emulate_fwd(const Case& c, const Tensors& in, float scale, const FaPlan& plan) {
  const int S = static_cast<int>(c.S), dh = static_cast<int>(c.dh);
  const Backend::FlashSpec& f = c.f;
  const int bc = plan.bc, chunk = plan.chunk, ld = plan.ld, per = plan.per_block;
  const size_t n = static_cast<size_t>(c.items * S * dh), rows = static_cast<size_t>(c.items * S);
  FwdOut out{std::vector<float>(n, kNaN), std::vector<float>(n, kNaN), std::vector<float>(rows, kNaN),
             std::vector<float>(rows, kNaN), std::vector<float>(rows * Backend::kFlashRowStats, kNaN)};
  const int groups = (S + per - 1) / per;
  for (int64_t item = 0; item < c.items; ++item) {
    const int64_t off = item * S * dh;
    const float *q = in.q.data() + off, *k = in.k.data() + off, *v = in.v.data() + off;
    for (int g = groups - 1; g >= 0; --g) {  // blocks share nothing: any order
      const int row0 = g * per, row1 = std::min(row0 + per, S);
      std::vector<FaPair> P(static_cast<size_t>(per * bc));
      std::vector<float> Ks(static_cast<size_t>(chunk * ld)), Vs(static_cast<size_t>(chunk * dh)),
          Qs(static_cast<size_t>(per * dh));
      stage(Qs, dh, q, row0, row1, dh);
      struct Row {
        int keys;
        std::array<FaRowState, kFaLanes> st;
        std::array<Cols, kFaLanes> acc;
        std::array<int, kFaLanes> ones;
      };
      std::vector<Row> R(static_cast<size_t>(per));
      for (int lr = 0; lr < per; ++lr) {
        const int r = row0 + lr;
        Row& w = R[static_cast<size_t>(lr)];
        w.keys = r < S ? static_cast<int>(fa_keys(r, S, f.causal)) : 0;
        each_lane([&](int lane) {
          w.st[lane] = fa_row_start();
          fa_cols_zero(w.acc[lane].data());
          w.ones[lane] = 0;
        });
      }
      const int kend = f.causal ? row1 : S;
      for (int c0 = 0; c0 < kend; c0 += bc) {
        const int tend = std::min(c0 + bc, kend);
        const bool one = tend - c0 <= chunk;
        std::fill(P.begin(), P.end(), FaPair{kNaN, kNaN});
        for (int k0 = c0; k0 < tend; k0 += chunk) {
          const int k1 = std::min(k0 + chunk, tend);
          stage(Ks, ld, k, k0, k1, dh);
          if (one) stage(Vs, dh, v, k0, k1, dh);
          for (int lr = 0; lr < per; ++lr) {
            const Row& w = R[static_cast<size_t>(lr)];
            if (c0 < w.keys)
              each_lane([&](int lane) {
                fa_fwd_logits_lane(lane, Qs.data() + lr * dh, Ks.data(), ld, k0, std::min(k1, w.keys), c0, dh, scale,
                                   P.data() + lr * bc);
              });
          }
        }
        for (int lr = 0; lr < per; ++lr) {
          Row& w = R[static_cast<size_t>(lr)];
          if (c0 >= w.keys) continue;
          FaPair* pr = P.data() + lr * bc;
          const int nk = std::min(c0 + bc, w.keys) - c0;
          std::array<FaTileMax, kFaLanes> part;
          each_lane([&](int lane) { part[lane] = fa_tile_max_lane(lane, pr, nk); });
          const FaTileMax tm = butterfly(part);
          int rs = 0;
          if (f.stabilized) {
            std::array<int, kFaLanes> cnt;
            each_lane([&](int lane) { cnt[lane] = fa_tile_ties_lane(lane, pr, nk, tm.v, f.eps); });
            rs = butterfly(cnt);
          }
          each_lane([&](int lane) {
            const float alpha = fa_row_enter_tile(w.st[lane], tm, rs, f);
            fa_fwd_rescale_lane(lane, dh, w.acc[lane].data(), alpha);
          });
          each_lane([&](int lane) { w.ones[lane] += fa_tile_probs_lane(lane, pr, nk, w.st[lane].m); });
        }
        for (int k0 = c0; k0 < tend; k0 += chunk) {
          const int k1 = std::min(k0 + chunk, tend);
          if (!one) stage(Vs, dh, v, k0, k1, dh);
          for (int lr = 0; lr < per; ++lr) {
            Row& w = R[static_cast<size_t>(lr)];
            if (c0 < w.keys)
              each_lane([&](int lane) {
                fa_fwd_accumulate_lane(lane, dh, P.data() + lr * bc, Vs.data(), dh, k0, std::min(k1, w.keys), c0,
                                       w.acc[lane].data(), &w.st[lane].l);
              });
          }
        }
      }
      for (int lr = 0; lr < per; ++lr) {
        Row& w = R[static_cast<size_t>(lr)];
        if (w.keys == 0) continue;
        const int64_t i = item * S + row0 + lr;
        const int nones = butterfly(w.ones);
        each_lane([&](int lane) {
          w.st[lane].nones = nones;
          // Every lane holds the same row state (the same operations on the same values).
          EXPECT_TRUE(same_float(w.st[lane].m, w.st[0].m) && same_float(w.st[lane].l, w.st[0].l) &&
                      same_float(w.st[lane].zmax, w.st[0].zmax) && w.st[lane].nmax == w.st[0].nmax)
              << "lane " << lane;
          fa_fwd_finish_lane(lane, dh, w.acc[lane].data(), w.st[lane].l, out.o.data() + i * dh,
                             out.o_hp.data() + i * dh);
        });
        fa_row_finish(w.st[0], &out.lse[static_cast<size_t>(i)], &out.rowmax[static_cast<size_t>(i)],
                      out.stats.data() + i * Backend::kFlashRowStats);
      }
    }
  }
  return out;
}

// flash_delta_kernel, flash_bwd_key_tiled_kernel, flash_bwd_query_tiled_kernel, from the forward's
// o, o_hp and lse.
BwdOut emulate_bwd(const Case& c, const Tensors& in, const FwdOut& fw, float scale, const FaPlan& plan) {
  const int S = static_cast<int>(c.S), dh = static_cast<int>(c.dh);
  const Backend::FlashSpec& f = c.f;
  const int per = plan.per_block, ld = plan.ld;
  const size_t n = static_cast<size_t>(c.items * S * dh), rows = static_cast<size_t>(c.items * S);
  BwdOut out{std::vector<float>(n, kNaN), std::vector<float>(n, kNaN), std::vector<float>(n, kNaN),
             std::vector<float>(rows, kNaN), std::vector<float>(rows, kNaN)};
  for (size_t i = 0; i < rows; ++i) {
    float lp, hp;
    fa_delta_row(in.dout.data() + i * dh, fw.o.data() + i * dh, fw.o_hp.data() + i * dh, dh, &lp, &hp);
    out.delta[i] = f.delta_hp ? hp : lp;
    out.delta_hp[i] = hp;
  }
  const int groups = (S + per - 1) / per;
  for (int64_t item = 0; item < c.items; ++item) {
    const int64_t off = item * S * dh;
    const float *q = in.q.data() + off, *k = in.k.data() + off, *v = in.v.data() + off, *dout = in.dout.data() + off;
    const float *lse = fw.lse.data() + item * S, *delta = out.delta.data() + item * S;
    // dK, dV: a group of keys per block.
    for (int g = 0; g < groups; ++g) {
      const int rc = plan.rchunk;
      const int t0 = g * per, t1 = std::min(t0 + per, S);
      std::vector<FaPair> PD(static_cast<size_t>(per * rc));
      std::vector<float> Kt(static_cast<size_t>(per * dh)), Vt(static_cast<size_t>(per * dh)),
          Qs(static_cast<size_t>(rc * ld)), Ds(static_cast<size_t>(rc * ld)), Ls(static_cast<size_t>(rc)),
          Es(static_cast<size_t>(rc));
      stage(Kt, dh, k, t0, t1, dh);
      stage(Vt, dh, v, t0, t1, dh);
      std::vector<std::array<Cols, kFaLanes>> dka(static_cast<size_t>(per)), dva(static_cast<size_t>(per));
      for (int lt = 0; lt < per; ++lt)
        each_lane([&](int lane) {
          fa_cols_zero(dka[static_cast<size_t>(lt)][lane].data());
          fa_cols_zero(dva[static_cast<size_t>(lt)][lane].data());
        });
      for (int r0 = f.causal ? t0 : 0; r0 < S; r0 += rc) {
        const int r1 = std::min(r0 + rc, S);
        stage(Qs, ld, q, r0, r1, dh);
        stage(Ds, ld, dout, r0, r1, dh);
        std::fill(Ls.begin(), Ls.end(), kNaN);
        std::fill(Es.begin(), Es.end(), kNaN);
        for (int r = r0; r < r1; ++r) {
          Ls[static_cast<size_t>(r - r0)] = lse[r];
          Es[static_cast<size_t>(r - r0)] = delta[r];
        }
        std::fill(PD.begin(), PD.end(), FaPair{kNaN, kNaN});
        for (int lt = 0; lt < per; ++lt) {
          const int t = t0 + lt, rb = f.causal ? std::max(r0, t) : r0;
          if (t < t1 && rb < r1)
            each_lane([&](int lane) {
              fa_bwd_key_pds_lane(lane, Kt.data() + lt * dh, Vt.data() + lt * dh, Qs.data(), Ds.data(), ld, Ls.data(),
                                  Es.data(), r0, rb, r1, dh, scale, PD.data() + lt * rc);
            });
        }
        for (int lt = 0; lt < per; ++lt) {
          const int t = t0 + lt, rb = f.causal ? std::max(r0, t) : r0;
          if (t < t1 && rb < r1)
            each_lane([&](int lane) {
              fa_bwd_key_accumulate_lane(lane, dh, PD.data() + lt * rc, Qs.data(), Ds.data(), ld, r0, rb, r1,
                                         dka[static_cast<size_t>(lt)][lane].data(),
                                         dva[static_cast<size_t>(lt)][lane].data());
            });
        }
      }
      for (int lt = 0; lt < per && t0 + lt < t1; ++lt) {
        const int64_t i = item * S + t0 + lt;
        each_lane([&](int lane) {
          fa_bwd_key_finish_lane(lane, dh, dka[static_cast<size_t>(lt)][lane].data(),
                                 dva[static_cast<size_t>(lt)][lane].data(), scale, out.dk.data() + i * dh,
                                 out.dv.data() + i * dh);
        });
      }
    }
    // dQ: a group of rows per block.
    for (int g = groups - 1; g >= 0; --g) {
      const int chunk = plan.chunk;
      const int row0 = g * per, row1 = std::min(row0 + per, S);
      std::vector<float> DS(static_cast<size_t>(per * chunk)), Ks(static_cast<size_t>(chunk * ld)),
          Vs(static_cast<size_t>(chunk * ld)), Qr(static_cast<size_t>(per * dh)), Dr(static_cast<size_t>(per * dh));
      stage(Qr, dh, q, row0, row1, dh);
      stage(Dr, dh, dout, row0, row1, dh);
      std::vector<int> keys(static_cast<size_t>(per));
      std::vector<std::array<Cols, kFaLanes>> part(static_cast<size_t>(per)), dqa(static_cast<size_t>(per));
      for (int lr = 0; lr < per; ++lr) {
        const int r = row0 + lr;
        keys[static_cast<size_t>(lr)] = r < S ? static_cast<int>(fa_keys(r, S, f.causal)) : 0;
        each_lane([&](int lane) {
          fa_cols_zero(part[static_cast<size_t>(lr)][lane].data());
          fa_cols_zero(dqa[static_cast<size_t>(lr)][lane].data());
        });
      }
      const int kend = f.causal ? row1 : S;
      for (int k0 = 0; k0 < kend; k0 += chunk) {
        const int k1 = std::min(k0 + chunk, kend);
        stage(Ks, ld, k, k0, k1, dh);
        stage(Vs, ld, v, k0, k1, dh);
        std::fill(DS.begin(), DS.end(), kNaN);
        for (int lr = 0; lr < per; ++lr) {
          const int r = row0 + lr, e = std::min(k1, keys[static_cast<size_t>(lr)]);
          if (k0 < e)
            each_lane([&](int lane) {
              fa_bwd_query_ds_lane(lane, Qr.data() + lr * dh, Dr.data() + lr * dh, lse[r], delta[r], Ks.data(),
                                   Vs.data(), ld, k0, e, dh, scale, DS.data() + lr * chunk);
            });
        }
        for (int lr = 0; lr < per; ++lr) {
          const int e = std::min(k1, keys[static_cast<size_t>(lr)]);
          if (k0 < e)
            each_lane([&](int lane) {
              fa_bwd_query_accumulate_lane(lane, dh, DS.data() + lr * chunk, Ks.data(), ld, k0, e,
                                           keys[static_cast<size_t>(lr)], plan.bc,
                                           part[static_cast<size_t>(lr)][lane].data(),
                                           dqa[static_cast<size_t>(lr)][lane].data());
            });
        }
      }
      for (int lr = 0; lr < per && row0 + lr < row1; ++lr) {
        const int64_t i = item * S + row0 + lr;
        each_lane([&](int lane) {
          fa_bwd_query_finish_lane(lane, dh, dqa[static_cast<size_t>(lr)][lane].data(), scale, out.dq.data() + i * dh);
        });
      }
    }
  }
  return out;
}

// The CPU backend's forward and backward (the scalar functions in loops).
struct Reference {
  FwdOut fw;
  BwdOut bw;
};
Reference reference(const Case& c, const Tensors& in, float scale) {
  const size_t n = static_cast<size_t>(c.items * c.S * c.dh), rows = static_cast<size_t>(c.items * c.S);
  Reference r{{std::vector<float>(n), std::vector<float>(n), std::vector<float>(rows), std::vector<float>(rows),
               std::vector<float>(rows * Backend::kFlashRowStats)},
              {std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(rows),
               std::vector<float>(rows)}};
  auto be = make_cpu_backend();
  be->flash_attn_fwd(in.q.data(), in.k.data(), in.v.data(), r.fw.o.data(), r.fw.o_hp.data(), r.fw.lse.data(),
                     r.fw.rowmax.data(), r.fw.stats.data(), c.items, c.S, c.dh, scale, c.f);
  be->flash_attn_bwd(in.q.data(), in.k.data(), in.v.data(), r.fw.o.data(), r.fw.o_hp.data(), in.dout.data(),
                     r.fw.lse.data(), r.bw.dq.data(), r.bw.dk.data(), r.bw.dv.data(), r.bw.delta.data(),
                     r.bw.delta_hp.data(), c.items, c.S, c.dh, scale, c.f);
  return r;
}

// Bit for bit (nan_alike: any two NaNs count as equal, for the non-finite inputs, where x86's NaN
// payloads depend on which operand the compiler puts first).
::testing::AssertionResult same_bits(const char* what, const std::vector<float>& ref, const std::vector<float>& got,
                                     bool nan_alike = false) {
  if (ref.size() != got.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < ref.size(); ++i) {
    if (same_float(ref[i], got[i])) continue;
    if (nan_alike && std::isnan(ref[i]) && std::isnan(got[i])) continue;
    return ::testing::AssertionFailure() << what << "[" << i << "]: scalar " << ref[i] << " tiled " << got[i];
  }
  return ::testing::AssertionSuccess();
}

void expect_same(const Reference& r, const FwdOut& fw, const BwdOut& bw, const std::string& where,
                 bool nan_alike = false) {
  EXPECT_TRUE(same_bits("o", r.fw.o, fw.o, nan_alike)) << where;
  EXPECT_TRUE(same_bits("o_hp", r.fw.o_hp, fw.o_hp, nan_alike)) << where;
  EXPECT_TRUE(same_bits("lse", r.fw.lse, fw.lse, nan_alike)) << where;
  EXPECT_TRUE(same_bits("rowmax", r.fw.rowmax, fw.rowmax, nan_alike)) << where;
  EXPECT_TRUE(same_bits("row_stats", r.fw.stats, fw.stats, nan_alike)) << where;
  EXPECT_TRUE(same_bits("dq", r.bw.dq, bw.dq, nan_alike)) << where;
  EXPECT_TRUE(same_bits("dk", r.bw.dk, bw.dk, nan_alike)) << where;
  EXPECT_TRUE(same_bits("dv", r.bw.dv, bw.dv, nan_alike)) << where;
  EXPECT_TRUE(same_bits("delta", r.bw.delta, bw.delta, nan_alike)) << where;
  EXPECT_TRUE(same_bits("delta_hp", r.bw.delta_hp, bw.delta_hp, nan_alike)) << where;
}

float scale_of(const Case& c) { return 1.0f / std::sqrt(static_cast<float>(c.dh)); }

bool all_finite(const Reference& r) {
  for (const std::vector<float>* x : {&r.fw.o, &r.fw.o_hp, &r.fw.lse, &r.fw.rowmax, &r.bw.dq, &r.bw.dk, &r.bw.dv,
                                      &r.bw.delta, &r.bw.delta_hp})
    for (float e : *x)
      if (!std::isfinite(e)) return false;
  return true;
}

TEST(FlashTiled, KernelOrderEqualsTheScalarFunctions) {
  // The kernels' plan on every shape of the list the tiled kernels take; the list's inputs do what
  // they are for (rows with a repeated maximum, several bf16 P-bar = 1) and keep every output finite
  // (the GPU test compares NaN payloads, which differ between x86 and CUDA).
  size_t tied = 0, ones = 0, cases = 0;
  for (const Case& c : flashcases::cases()) {
    if (c.gpu_only) continue;
    ASSERT_LE(c.dh, kFaMaxDh) << c.name();
    const Tensors in = flashcases::inputs(c);
    const float scale = scale_of(c);
    const Reference r = reference(c, in, scale);
    const FaPlan plan = fa_plan(c.S, c.dh, c.f.bc);
    const FwdOut fw = emulate_fwd(c, in, scale, plan);
    expect_same(r, fw, emulate_bwd(c, in, r.fw, scale, plan), c.name());
    EXPECT_TRUE(all_finite(r)) << c.name();
    if (c.in == flashcases::Inputs::tie_heavy)
      for (size_t i = 0; i < r.fw.lse.size(); ++i) {
        tied += r.fw.stats[2 * i] > 1.0f;
        ones += r.fw.stats[2 * i + 1] > 1.0f;
      }
    ++cases;
  }
  EXPECT_GE(cases, 55u);
  EXPECT_GT(tied, 1000u);
  EXPECT_GT(ones, 500u);
  std::printf("tie-heavy rows: %zu with a repeated maximum, %zu with several bf16 P-bar = 1\n", tied, ones);
}

TEST(FlashTiled, GpuOnlyCasesHaveFiniteOutputs) {
  // The shapes only the GPU test runs (tests/gpu/test_flash_attention_gpu.cu): finite on the CPU.
  for (const Case& c : flashcases::cases()) {
    if (!c.gpu_only) continue;
    const Tensors in = flashcases::inputs(c);
    EXPECT_TRUE(all_finite(reference(c, in, scale_of(c)))) << c.name();
  }
}

TEST(FlashTiled, StagingSizesAndBlockGroupsChangeNoBit) {
  // Chunks of 1, 7, 33 and 200 keys or rows, groups of 1, 5 and 16 rows or keys: tiles then span
  // chunks at every offset, and the sums run on across chunk boundaries.
  const std::vector<Case> all = flashcases::cases();
  for (size_t ci = 0; ci < all.size(); ci += 5) {
    const Case& c = all[ci];
    if (c.gpu_only) continue;
    const Tensors in = flashcases::inputs(c);
    const float scale = scale_of(c);
    const Reference r = reference(c, in, scale);
    for (const int chunk : {1, 7, 33, 200})
      for (const int per : {1, 5, 16}) {
        FaPlan plan = fa_plan(c.S, c.dh, c.f.bc);
        plan.chunk = chunk;
        plan.rchunk = chunk == 7 ? 33 : chunk;
        plan.per_block = per;
        const std::string where = c.name() + " chunk " + std::to_string(chunk) + " per_block " + std::to_string(per);
        const FwdOut fw = emulate_fwd(c, in, scale, plan);
        expect_same(r, fw, emulate_bwd(c, in, r.fw, scale, plan), where);
      }
  }
}

TEST(FlashTiled, NonFiniteInputsGiveTheScalarBits) {
  // Inf and NaN in Q, K, V (logits of +-Inf and NaN: NaN keys never the maximum, -Inf maxima, NaN
  // alpha): the same values as the scalar loops, NaN where they have NaN.
  for (const bool causal : {false, true})
    for (const bool stabilized : {false, true}) {
      Case c{2, 45, 16, flashcases::spec(16, causal, stabilized, false), flashcases::Inputs::gaussian, 77};
      Tensors in = flashcases::inputs(c);
      const float inf = std::numeric_limits<float>::infinity();
      for (int64_t c2 = 0; c2 < c.dh; ++c2) {
        in.k[static_cast<size_t>(3 * c.dh + c2)] = c2 == 0 ? inf : 0.0f;   // key 3: +inf or NaN logits
        in.k[static_cast<size_t>(20 * c.dh + c2)] = c2 == 1 ? -inf : 0.0f;  // key 20: -inf or NaN
        in.q[static_cast<size_t>(30 * c.dh + c2)] = kNaN;                   // row 30: NaN logits only
        in.v[static_cast<size_t>(50 * c.dh + c2)] = inf;                    // item 1, key 5: Inf values
      }
      for (int64_t c2 = 0; c2 < c.dh; ++c2) in.q[static_cast<size_t>((45 + 10) * c.dh + c2)] = -inf;  // item 1 row 10
      const float scale = scale_of(c);
      const Reference r = reference(c, in, scale);
      const FaPlan plan = fa_plan(c.S, c.dh, c.f.bc);
      const FwdOut fw = emulate_fwd(c, in, scale, plan);
      expect_same(r, fw, emulate_bwd(c, in, r.fw, scale, plan), c.name() + " non-finite", true);
      size_t nan_rows = 0;
      for (float x : r.fw.lse) nan_rows += std::isnan(x);
      EXPECT_GT(nan_rows, 0u);
    }
}

// The scalar loops of fa_fwd_row over one tile: r_m and the row maximum with its count.
FaTileMax scalar_max(const std::vector<float>& z) {
  float rm = -std::numeric_limits<float>::infinity(), zmax = rm;
  int nmax = 0;
  for (float x : z) {
    if (x > rm) rm = x;
    if (x > zmax) {
      zmax = x;
      nmax = 1;
    } else if (x == zmax) {
      ++nmax;
    }
  }
  EXPECT_TRUE(same_float(rm, zmax));
  return {rm, 0, nmax};
}

// fa_max_push over [lo, hi), combined in a random tree (random split, random operand order).
FaTileMax random_tree(const std::vector<float>& z, int lo, int hi, std::mt19937& rng) {
  if (hi - lo == 1) return fa_max_push(fa_max_none(), z[static_cast<size_t>(lo)], lo);
  const int mid = std::uniform_int_distribution<int>(lo + 1, hi - 1)(rng);
  const FaTileMax a = random_tree(z, lo, mid, rng), b = random_tree(z, mid, hi, rng);
  return rng() % 2 ? fa_max_combine(a, b) : fa_max_combine(b, a);
}

TEST(FlashTiled, TileMaximumIsTheScalarLoopsWhateverTheReductionTree) {
  // Values with -0 and +0 (equal, but the first one's bits are the scalar loop's), -Inf (counted
  // when it is the maximum), NaN (never), exact ties.
  const float inf = std::numeric_limits<float>::infinity();
  const float pool[] = {-0.0f, 0.0f, 1.5f, 1.5f, -2.0f, -inf, kNaN, 0.25f, -0.0f, 0.0f};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 70);
    std::vector<float> z(static_cast<size_t>(n));
    const int span = trial % 3 == 0 ? 2 : 10;  // some sets of only -0 and +0
    for (float& x : z) x = pool[rng() % span];
    if (trial % 7 == 0)
      for (float& x : z) x = rng() % 2 ? -inf : kNaN;
    const FaTileMax want = scalar_max(z);
    const FaTileMax tree = random_tree(z, 0, n, rng);
    ASSERT_TRUE(same_float(tree.v, want.v) && tree.count == want.count) << "trial " << trial << " n " << n;
    // And the lanes' strided parts combined by the butterfly, as the kernel does.
    std::vector<FaPair> p(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) p[static_cast<size_t>(t)].a = z[static_cast<size_t>(t)];
    std::array<FaTileMax, kFaLanes> part;
    each_lane([&](int lane) { part[lane] = fa_tile_max_lane(lane, p.data(), n); });
    const FaTileMax warp = butterfly(part);
    ASSERT_TRUE(same_float(warp.v, want.v) && warp.count == want.count) << "trial " << trial;
  }
}

TEST(FlashTiled, CommonShapesStayUnderDefaultSharedMemory) {
  // The kernels need no opt-in shared memory for dh <= 64 with tiles up to 64 keys (the pilot's
  // dh 32, Bc 64): their launches then make no cudaFuncSetAttribute call.
  for (const int64_t dh : {16, 24, 32, 48, 64})
    for (const int64_t bc : {1, 16, 64}) {
      const FaPlan p = fa_plan(4096, dh, bc);
      EXPECT_LE(4 * fa_fwd_smem_floats(p, dh), 48 * 1024) << dh << " " << bc;
      EXPECT_LE(4 * fa_bwd_key_smem_floats(p, dh), 48 * 1024) << dh << " " << bc;
      EXPECT_LE(4 * fa_bwd_query_smem_floats(p, dh), 48 * 1024) << dh << " " << bc;
    }
  const FaPlan big = fa_plan(128, 32, 1 << 20);  // a tile longer than the sequence is the sequence
  EXPECT_EQ(big.bc, 128);
}

}  // namespace
