// Flash attention in bf16 on CUDA against the CPU reference (lab/model/README.md, "Flash attention
// in bf16"), bit for bit: both backends run the functions of lab/model/flash_attention.h, one query
// row or key at a time, so every output (O_lp, O_hp, lse, the row maxima and row statistics, dQ, dK,
// dV, delta, delta_hp) must be identical, on Gaussian inputs and on tie-heavy ones (repeated keys:
// rows whose maximum is attained several times, bf16 P-bar entries equal to 1, the stabilized
// softmax's shifts), tiled and untiled, causal or not, each softmax and each delta, and on the shape
// list of tests/cpu/flash_cases.h (head dims 16-160, key tiles 1-512, sequences of 1-600 tokens,
// extreme values), on which tests/cpu/test_flash_tiled.cpp checks the kernels' decomposition on the
// CPU. The tiled kernels (the launchers' own) also against the reference kernels (one thread per row
// or key) on the flash pilot's shape. Outputs are poisoned (NaN) before each call, so an element the
// kernel does not write fails the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/flash_attention.cuh"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/model/flash_attention_tiled.h"
#include "lab/mx/scalar.h"
#include "tests/cpu/flash_cases.h"
#include "tests/gpu/backend_twin.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using namespace gputest;

struct FlashInputs {
  int64_t items, S, dh;
  std::vector<float> q, k, v, dout;
};

FlashInputs gaussian(int64_t items, int64_t S, int64_t dh, uint64_t seed) {
  const size_t n = static_cast<size_t>(items * S * dh);
  return {items, S, dh, normal(n, seed), normal(n, seed + 1), normal(n, seed + 2), normal(n, seed + 3)};
}

float bf16(float x) { return round_bf16(x, Rounding::nearest_even); }

// Repeated tokens (tests/torch/flash_attention.py's tie_heavy): K rows drawn from `vocab` distinct
// bf16 vectors per item, so many rows of S attain their maximum at several keys; Q bf16 scaled so
// the row maxima are far from 0; V bf16, mostly negative.
FlashInputs tie_heavy(int64_t items, int64_t S, int64_t dh, int64_t vocab, uint64_t seed) {
  const size_t n = static_cast<size_t>(items * S * dh);
  FlashInputs in{items, S, dh, normal(n, seed, 1.5f), std::vector<float>(n), normal(n, seed + 2), normal(n, seed + 3)};
  for (float& x : in.q) x = bf16(x);
  const std::vector<float> table = normal(static_cast<size_t>(items * vocab * dh), seed + 1, 1.5f);
  const std::vector<float> pick = normal(static_cast<size_t>(items * S), seed + 4);
  for (int64_t b = 0; b < items; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t tok = static_cast<int64_t>(std::fabs(pick[static_cast<size_t>(b * S + t)]) * 1000.0f) % vocab;
      for (int64_t c = 0; c < dh; ++c)
        in.k[static_cast<size_t>((b * S + t) * dh + c)] = bf16(table[static_cast<size_t>((b * vocab + tok) * dh + c)]);
    }
  for (float& x : in.v) x = bf16(-std::fabs(x) * 2.0f + 0.3f);
  return in;
}

Backend::FlashSpec spec(int64_t br, int64_t bc, bool causal, bool stabilized, bool delta_hp, float eps = 1e-3f) {
  return Backend::FlashSpec::make(br, bc, causal, stabilized, delta_hp, eps);
}

std::string describe(const Backend::FlashSpec& f) {
  return msg("tiles ", f.br, "x", f.bc, f.causal ? " causal" : "", f.stabilized ? " stabilized" : "",
             f.delta_hp ? " delta_hp" : "", " eps ", f.eps);
}

// Runs forward and backward on both backends; every output bit for bit. Returns the CUDA row
// statistics (for the callers' checks that the case exercises ties).
std::vector<float> expect_flash_matches(const FlashInputs& in, const Backend::FlashSpec& f, const std::string& what) {
  Twin t;
  const int64_t items = in.items, S = in.S, dh = in.dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const size_t n = static_cast<size_t>(items * S * dh), rows = static_cast<size_t>(items * S);
  const Buf q = t.make(in.q), k = t.make(in.k), v = t.make(in.v), dout = t.make(in.dout);
  const Buf o = t.poisoned(n), o_hp = t.poisoned(n), lse = t.poisoned(rows), rowmax = t.poisoned(rows),
            stats = t.poisoned(rows * Backend::kFlashRowStats);
  const Buf dq = t.poisoned(n), dk = t.poisoned(n), dv = t.poisoned(n), delta = t.poisoned(rows),
            delta_hp = t.poisoned(rows);
  t.cpu->flash_attn_fwd(q.c, k.c, v.c, o.c, o_hp.c, lse.c, rowmax.c, stats.c, items, S, dh, scale, f);
  t.gpu->flash_attn_fwd(q.g, k.g, v.g, o.g, o_hp.g, lse.g, rowmax.g, stats.g, items, S, dh, scale, f);
  t.cpu->flash_attn_bwd(q.c, k.c, v.c, o.c, o_hp.c, dout.c, lse.c, dq.c, dk.c, dv.c, delta.c, delta_hp.c, items, S, dh,
                        scale, f);
  t.gpu->flash_attn_bwd(q.g, k.g, v.g, o.g, o_hp.g, dout.g, lse.g, dq.g, dk.g, dv.g, delta.g, delta_hp.g, items, S, dh,
                        scale, f);
  const std::string where = what + ", " + describe(f);
  const std::vector<std::pair<const char*, Buf>> outs = {{"o", o},   {"o_hp", o_hp}, {"lse", lse},     {"rowmax", rowmax},
                                                         {"stats", stats}, {"dq", dq}, {"dk", dk}, {"dv", dv},
                                                         {"delta", delta}, {"delta_hp", delta_hp}};
  for (const auto& [name, b] : outs) EXPECT_TRUE(same_bits(t.host_cpu(b), t.host_gpu(b))) << name << ": " << where;
  return t.host_gpu(stats);
}

TEST(FlashGpu, GaussianInputsMatchCpu) {
  MXLAB_REQUIRE_GPU();
  // dh 24 (not a power of two), S 37 (tiles of 16 leave a partial one), S 64 with dh 64 (the
  // model's head size), a single key per tile (Bc 1) and one tile wider than the sequence.
  const FlashInputs small = gaussian(3, 37, 24, 101), model = gaussian(2, 64, 64, 202);
  for (const Backend::FlashSpec& f :
       {spec(16, 16, false, false, false), spec(37, 37, false, false, false), spec(8, 16, true, false, false),
        spec(16, 1, true, false, false), spec(128, 64, false, true, false), spec(16, 16, true, true, true),
        spec(4, 8, false, false, true)}) {
    expect_flash_matches(small, f, "gaussian 3x37x24");
    expect_flash_matches(model, f, "gaussian 2x64x64");
  }
}

TEST(FlashGpu, TieHeavyInputsMatchCpu) {
  MXLAB_REQUIRE_GPU();
  const FlashInputs ties = tie_heavy(3, 40, 16, 5, 303);
  for (const Backend::FlashSpec& f :
       {spec(40, 40, false, false, false), spec(16, 16, false, false, false), spec(16, 16, true, false, false),
        spec(40, 40, false, true, false), spec(16, 16, true, true, true),
        spec(16, 16, false, true, false, std::ldexp(1.0f, -9))}) {
    const std::vector<float> st = expect_flash_matches(ties, f, "tie-heavy 3x40x16");
    // The case exercises what it is for: rows whose maximum is attained at several keys, and
    // (standard softmax) rows with several bf16 P-bar entries equal to 1.
    size_t tied = 0, ones = 0;
    for (size_t r = 0; r < st.size() / Backend::kFlashRowStats; ++r) {
      tied += st[r * Backend::kFlashRowStats] > 1.0f;
      ones += st[r * Backend::kFlashRowStats + 1] > 1.0f;
    }
    EXPECT_GT(tied, st.size() / Backend::kFlashRowStats / 4) << describe(f);
    if (!f.stabilized) EXPECT_GT(ones, 0u) << describe(f);
  }
}

TEST(FlashGpu, ExtendedShapesMatchCpu) {
  MXLAB_REQUIRE_GPU();
  for (const flashcases::Case& c : flashcases::cases()) {
    const flashcases::Tensors t = flashcases::inputs(c);
    // The launchers take the tiled kernels for every head dim up to kFaMaxDh (dh 160: the reference
    // kernels), key tiles that need opt-in shared memory included.
    EXPECT_EQ(cuda::flash_fwd_tiled(c.items, c.S, c.dh, c.f), c.dh <= kFaMaxDh) << c.name();
    EXPECT_EQ(cuda::flash_bwd_tiled(c.items, c.S, c.dh, c.f), c.dh <= kFaMaxDh) << c.name();
    expect_flash_matches({c.items, c.S, c.dh, t.q, t.k, t.v, t.dout}, c.f, c.name());
  }
}

// The tiled kernels against the reference kernels on the device, every output bit for bit, on the
// flash pilot's shape (32 sequences x 4 heads, S = 128, dh = 32, causal, tile [128, 64]) and on dh 64.
TEST(FlashGpu, TiledKernelsEqualReferenceKernelsOnThePilotShape) {
  MXLAB_REQUIRE_GPU();
  struct Shape {
    int64_t items, S, dh;
    Backend::FlashSpec f;
  };
  const Shape shapes[] = {{128, 128, 32, spec(128, 64, true, false, false)},
                          {128, 128, 32, spec(128, 64, true, true, true)},
                          {64, 128, 64, spec(128, 64, true, false, false)},
                          {16, 200, 32, spec(128, 64, false, false, false)}};
  for (const Shape& sh : shapes) {
    const int64_t items = sh.items, S = sh.S, dh = sh.dh;
    ASSERT_TRUE(cuda::flash_fwd_tiled(items, S, dh, sh.f) && cuda::flash_bwd_tiled(items, S, dh, sh.f));
    const size_t n = static_cast<size_t>(items * S * dh), rows = static_cast<size_t>(items * S);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    const FlashInputs in = tie_heavy(items, S, dh, 9, 505);
    test::Dev<float> q(n), k(n), v(n), dout(n),
        scratch(static_cast<size_t>(cuda::flash_bwd_scratch_floats(items, S, dh)));
    q.put(in.q);
    k.put(in.k);
    v.put(in.v);
    dout.put(in.dout);
    struct Outs {
      test::Dev<float> o, o_hp, lse, rowmax, stats, dq, dk, dv, delta, delta_hp;
      Outs(size_t n, size_t rows)
          : o(n), o_hp(n), lse(rows), rowmax(rows), stats(rows * Backend::kFlashRowStats), dq(n), dk(n), dv(n),
            delta(rows), delta_hp(rows) {
        for (test::Dev<float>* d : {&o, &o_hp, &lse, &rowmax, &stats, &dq, &dk, &dv, &delta, &delta_hp})
          d->put(std::vector<float>(d->n, kNaN));
      }
    };
    Outs tiled(n, rows), ref(n, rows);
    cuda::launch_flash_attn_fwd(q.p, k.p, v.p, tiled.o.p, tiled.o_hp.p, tiled.lse.p, tiled.rowmax.p, tiled.stats.p,
                                items, S, dh, scale, sh.f, nullptr);
    cuda::launch_flash_attn_bwd(q.p, k.p, v.p, tiled.o.p, tiled.o_hp.p, dout.p, tiled.lse.p, tiled.dq.p, tiled.dk.p,
                                tiled.dv.p, tiled.delta.p, tiled.delta_hp.p, items, S, dh, scale, sh.f, scratch.p,
                                nullptr);
    cuda::launch_flash_attn_fwd_reference(q.p, k.p, v.p, ref.o.p, ref.o_hp.p, ref.lse.p, ref.rowmax.p, ref.stats.p,
                                          items, S, dh, scale, sh.f, nullptr);
    cuda::launch_flash_attn_bwd_reference(q.p, k.p, v.p, ref.o.p, ref.o_hp.p, dout.p, ref.lse.p, ref.dq.p, ref.dk.p,
                                          ref.dv.p, ref.delta.p, ref.delta_hp.p, items, S, dh, scale, sh.f, scratch.p,
                                          nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::string where = msg(items, "x", S, "x", dh, " ", describe(sh.f));
    const std::pair<const char*, std::pair<test::Dev<float>*, test::Dev<float>*>> outs[] = {
        {"o", {&ref.o, &tiled.o}},          {"o_hp", {&ref.o_hp, &tiled.o_hp}},
        {"lse", {&ref.lse, &tiled.lse}},    {"rowmax", {&ref.rowmax, &tiled.rowmax}},
        {"stats", {&ref.stats, &tiled.stats}}, {"dq", {&ref.dq, &tiled.dq}},
        {"dk", {&ref.dk, &tiled.dk}},       {"dv", {&ref.dv, &tiled.dv}},
        {"delta", {&ref.delta, &tiled.delta}}, {"delta_hp", {&ref.delta_hp, &tiled.delta_hp}}};
    for (const auto& [name, b] : outs) EXPECT_TRUE(same_bits(b.first->get(), b.second->get())) << name << ": " << where;
  }
}

// A captured region replays the kernels with the same bits (the trainer always captures its steps).
TEST(FlashGpu, GraphReplayEqualsEager) {
  MXLAB_REQUIRE_GPU();
  const FlashInputs in = tie_heavy(2, 33, 16, 4, 404);
  const Backend::FlashSpec f = spec(16, 16, true, true, false);
  auto be = make_cuda_backend(0);
  const int64_t items = in.items, S = in.S, dh = in.dh;
  const size_t n = static_cast<size_t>(items * S * dh), rows = static_cast<size_t>(items * S);
  auto up = [&](const std::vector<float>& h) {
    float* p = be->alloc(h.size());
    be->upload(p, h.data(), h.size());
    return p;
  };
  float *q = up(in.q), *k = up(in.k), *v = up(in.v), *dout = up(in.dout);
  float *o = be->alloc(n), *o_hp = be->alloc(n), *lse = be->alloc(rows), *rowmax = be->alloc(rows),
        *stats = be->alloc(rows * Backend::kFlashRowStats), *dq = be->alloc(n), *dk = be->alloc(n), *dv = be->alloc(n),
        *delta = be->alloc(rows), *delta_hp = be->alloc(rows);
  auto pass = [&] {
    be->flash_attn_fwd(q, k, v, o, o_hp, lse, rowmax, stats, items, S, dh, 0.25f, f);
    be->flash_attn_bwd(q, k, v, o, o_hp, dout, lse, dq, dk, dv, delta, delta_hp, items, S, dh, 0.25f, f);
  };
  auto state = [&] {
    std::vector<float> all;
    const std::vector<std::pair<float*, size_t>> outs = {{o, n},  {o_hp, n}, {lse, rows},   {dq, n},
                                                         {dk, n}, {dv, n},   {delta, rows}, {delta_hp, rows}};
    for (const auto& [p, m] : outs) {
      std::vector<float> h(m);
      be->download(h.data(), p, m);
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  };
  pass();
  const std::vector<float> eager = state();
  constexpr int kKey = 31;
  EXPECT_FALSE(be->begin_capture(kKey));  // the first time runs eagerly (sizing the scratch)
  pass();
  be->end_capture(kKey);
  ASSERT_TRUE(be->begin_capture(kKey));  // the second records
  pass();
  be->end_capture(kKey);
  for (float* p : {o, o_hp, dq, dk, dv}) be->fill(p, 0.0f, n);  // only the replay can write them back
  for (float* p : {lse, delta, delta_hp}) be->fill(p, 0.0f, rows);
  ASSERT_TRUE(be->replay(kKey));
  EXPECT_TRUE(same_bits(eager, state()));
}

}  // namespace
}  // namespace mxlab
